"""A sweep's results gathered from its root: one row per run (:func:`collect`), every history
(:func:`histories`), and the tables over seeds (:func:`table`, :func:`interval_summary`, the root's CSVs).

A folder whose files cannot be read costs its own row (status ``unreadable``, with a warning naming
it), never the table.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from ..errors import FeddrKitError
from ..rundir import write_text
from .claims import as_list, intervals
from .grid import BOOKKEEPING, field_defaults, plain
from .root import (CONFIG, DONE, ERROR, FAILED, HISTORY, PARTIAL, POINT, RUNS, SUMMARY, SWEEP, TABLE, UNREADABLE,
                   hashable, json_object, read_json, status)


def collect(root: str | Path) -> pd.DataFrame:
    """One row per run folder under ``root`` (any folder holding point.json, config.json,
    checkpoint.pt, summary.json or error.txt).

    Columns: ``name`` (the folder), ``status`` (``done`` / ``partial`` / ``failed``), every config
    field (from point.json — what the sweep asked for — else config.json; lists as tuples), then the
    summary's fields (final_acc, best_acc, last5_acc, sec_per_round, total_seconds, …; NaN until
    done). A summary key that is also a config field is dropped when equal and kept as
    ``summary_<key>`` when not (e.g. the lr a ``lr=None`` run actually used). ``error`` holds a failed
    run's message. A folder whose point.json, config.json or summary.json cannot be read gets status
    ``unreadable`` with the file and the reason in ``error`` (and a warning names it), so the other runs
    still make a table. Returns a DataFrame (empty when ``root`` holds no runs).
    """
    root = Path(root)
    if not root.is_dir():
        raise FeddrKitError(f"root must be an existing folder, got {root}")
    rows, unreadable = [], []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        state = status(folder)
        if state is None:
            continue
        try:
            rows.append(_collect_one(folder, state))
        except FeddrKitError as err:  # one broken file costs its own row, not the table
            unreadable.append(f"{folder.name} ({err})")
            rows.append({"name": folder.name, "status": UNREADABLE, "error": str(err)})
    if unreadable:
        warnings.warn(f"left out {len(unreadable)} run folder(s) whose files cannot be read: {'; '.join(unreadable)}",
                      stacklevel=2)
    return pd.DataFrame(rows)


def _collect_one(folder: Path, state: str) -> dict[str, Any]:
    """:func:`collect`'s row of one folder; :class:`FeddrKitError` naming the file when one cannot be read."""
    row: dict[str, Any] = {"name": folder.name, "status": state}
    if (folder / POINT).exists():
        cfg = json_object(folder / POINT).get("config", {})
    elif (folder / CONFIG).exists():
        cfg = json_object(folder / CONFIG)
    else:
        cfg = {}
    row.update({k: hashable(v) for k, v in cfg.items() if k not in ("out_dir", "progress")})
    if state == DONE:
        for k, v in json_object(folder / SUMMARY).items():
            if k in cfg:
                if plain(v) != plain(cfg[k]):
                    row[f"summary_{k}"] = hashable(v)
            else:
                row[k] = hashable(v)
    if state == FAILED:
        row["error"] = (folder / ERROR).read_text(errors="replace").strip()
    return row


def in_grid_order(df: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """The rows of ``df`` whose ``name`` is one of ``names`` (this grid's runs), in that order; a name with no
    row (its folder held by another run before anything was written there) gets a ``partial`` row."""
    order = {n: i for i, n in enumerate(names)}
    absent = [n for n in names if df.empty or n not in set(df["name"])]
    if absent:
        df = pd.concat([df, pd.DataFrame({"name": absent, "status": PARTIAL})], ignore_index=True)
    df = df[df["name"].isin(order)]
    return df.sort_values("name", key=lambda s: s.map(order)).reset_index(drop=True)


def histories(root: str | Path) -> pd.DataFrame:
    """Every finished run's ``history.csv`` under ``root``, stacked: one row per run and evaluated
    round, with the run's folder in ``name`` (join with :func:`collect` on it). A history that cannot be
    read (not text, not CSV) or does not reach its run's summary (cut short: its last round or final
    accuracy differs from ``summary.json``'s) is left out with a warning naming the file; resuming that
    run (``fk.run(cfg, resume=True)``) writes its whole history again. Returns a DataFrame (empty when no
    run has finished)."""
    root = Path(root)
    if not root.is_dir():
        raise FeddrKitError(f"root must be an existing folder, got {root}")
    frames, broken = [], []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if status(folder) != DONE or not (folder / HISTORY).exists():
            continue
        try:
            frames.append(_whole_history(folder).assign(name=folder.name))
        except FeddrKitError as err:
            broken.append(str(err))
    if broken:
        warnings.warn(f"left out {len(broken)} history file(s): {'; '.join(broken)}", stacklevel=2)
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    return df[["name"] + [c for c in df.columns if c != "name"]]


def _whole_history(folder: Path) -> pd.DataFrame:
    """``folder``'s history.csv, checked against its summary.json; :class:`FeddrKitError` naming the file when
    it cannot be read or is cut short."""
    path = folder / HISTORY
    try:
        df = pd.read_csv(path, encoding="utf-8")
    except (OSError, ValueError) as err:  # UnicodeDecodeError and pandas' parser errors are ValueErrors
        raise FeddrKitError(f"cannot read {path}: {(str(err).splitlines() or [type(err).__name__])[0][:120]}") from None
    summary = json_object(folder / SUMMARY)
    with open(path, "rb") as f:  # the kit writes whole lines: a last line without its newline was cut
        f.seek(max(0, os.path.getsize(path) - 1))
        if f.read(1) != b"\n":
            raise FeddrKitError(f"{path} is cut short: its last line is incomplete")
    if df.empty or "round" not in df or "test_acc" not in df:
        raise FeddrKitError(f"{path} holds no rounds (columns round and test_acc)")
    last, acc = df["round"].iloc[-1], df["test_acc"].iloc[-1]
    final = summary.get("final_acc")
    if last != summary.get("rounds") or not isinstance(final, (int, float)) or not math.isclose(acc, final, rel_tol=1e-9):
        raise FeddrKitError(f"{path} is cut short: it ends at round {last} with test_acc {acc}, but summary.json "
                            f"says round {summary.get('rounds')} with {summary.get('final_acc')}")
    return df


def table(df: pd.DataFrame, rows: str | Sequence[str], cols: str | Sequence[str] | None = None,
          value: str = "final_acc", fmt: str = ".1f", percent: bool | None = None, show_n: bool = True) -> pd.DataFrame:
    """Mean ± sample std over seeds of ``value`` as strings, shaped rows × cols like the paper's tables.

    ``df``: :func:`collect`'s frame (only ``status == "done"`` rows count); ``rows`` / ``cols``: column
    name(s) for the table's index / columns (``cols=None``: one column named ``value``). Cells read
    ``"45.1 ± 1.2 (n=3)"`` (``fmt`` formats both numbers; ``show_n`` appends the number of seeds;
    one seed gives ``"45.1 (n=1)"``; a missing cell ``"—"``). ``percent`` (default: when ``value`` ends
    in ``acc``) multiplies by 100. Rows and columns keep their order of first appearance. Raises
    ``FeddrKitError`` when a cell holds two runs with one seed, i.e. a field outside rows/cols varies.
    """
    rows_, cols_ = as_list(rows), as_list(cols)
    keys = rows_ + cols_
    if not keys:
        raise FeddrKitError("rows must name at least one column of df")
    d = df[df["status"] == DONE] if "status" in df else df
    missing = [c for c in keys + [value] if c not in d.columns]
    if missing:
        raise FeddrKitError(f"df has no column(s) {', '.join(missing)}; it has: {', '.join(map(str, d.columns))}")
    if d.empty:
        raise FeddrKitError("df holds no finished runs to tabulate")
    d = d.copy()
    for k in keys:  # None (an algorithm's default) groups as its own label
        d[k] = d[k].map(lambda v: "None" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
    crowded = _crowded(d, keys)
    if crowded is not None:
        cell, seed, runs = crowded
        raise FeddrKitError(f"cell {cell} holds {len(runs)} runs with seed {seed}: a field "
                            "outside rows/cols varies; filter df or add it to rows/cols")
    scale = 100.0 if (value.endswith("acc") if percent is None else percent) else 1.0
    stats = d.groupby(keys, sort=False)[value].agg(["mean", "std", "count"])

    def cell(r) -> str:
        text = format(r["mean"] * scale, fmt)
        if r["count"] >= 2:
            text += f" ± {format(r['std'] * scale, fmt)}"
        return text + (f" (n={int(r['count'])})" if show_n else "")

    cells = stats.apply(cell, axis=1)
    row_order = list(dict.fromkeys(map(tuple, d[rows_].itertuples(index=False))))
    row_index = pd.Index([r[0] for r in row_order], name=rows_[0]) if len(rows_) == 1 else \
        pd.MultiIndex.from_tuples(row_order, names=rows_)
    if not cols_:
        return cells.rename(value).reindex(row_index).fillna("—").to_frame()
    col_order = list(dict.fromkeys(map(tuple, d[cols_].itertuples(index=False))))
    col_index = pd.Index([c[0] for c in col_order], name=cols_[0]) if len(cols_) == 1 else \
        pd.MultiIndex.from_tuples(col_order, names=cols_)
    wide = cells.unstack(cols_)
    return wide.reindex(index=row_index, columns=col_index).fillna("—")


def _crowded(d: pd.DataFrame, keys: list[str]) -> tuple[dict, Any, pd.DataFrame] | None:
    """The first group of ``keys`` in ``d`` that holds two runs with one seed, as ``(its keys, the seed, those
    runs)``, or None when every group holds one run per seed (or ``d`` has no seed column)."""
    if "seed" not in d.columns:
        return None
    sizes = d.groupby(keys + ["seed"], sort=False, dropna=False).size()
    if not (sizes > 1).any():
        return None
    *cell, seed = sizes[sizes > 1].index[0]
    runs = d[(d[keys + ["seed"]].astype(str) == [str(v) for v in [*cell, seed]]).all(axis=1)]
    return dict(zip(keys, map(plain, cell))), plain(seed), runs


def interval_summary(root: str | Path, value: str = "final_acc", confidence: float = 0.95) -> pd.DataFrame:
    """The sweep in ``root`` as one row per grid point: its grid fields (from ``sweep.json``; else
    ``algorithm``), ``value`` (the summary field), ``mean``, ``low``, ``high``, ``half_width`` (the t
    interval over seeds, :func:`feddr_kit.sweep.claims.intervals`; accuracies as fractions) and ``n`` (seeds
    finished). Raises :class:`FeddrKitError` when no run has finished, or when a grid point holds two
    finished runs with one seed (a root filled with two grids before a root held one), naming the field
    in which they differ."""
    root = Path(root)
    df = collect(root)
    if df.empty or not (df["status"] == DONE).any():
        raise FeddrKitError(f"{root} holds no finished run yet")
    spec = read_json(root / SWEEP) if (root / SWEEP).exists() else {}
    grid = spec.get("grid", {})
    by = [k for k in grid if k in df.columns] or ["algorithm"]
    if grid:  # rows in the grid's order of values, not the folders' alphabetical one
        order = {k: {json.dumps(plain(v)): i for i, v in enumerate(grid[k])} for k in by}
        df = df.sort_values(by, kind="stable", key=lambda col: col.map(
            lambda v: order[col.name].get(json.dumps(plain(v)), len(order[col.name]))))
    crowded = _crowded(df[df["status"] == DONE], by)
    if crowded is not None:  # a root that older sweeps filled with two grids: never pooled as seeds
        point, seed, runs = crowded
        differ = [k for k in field_defaults() if k in runs and k not in BOOKKEEPING and k != "seed"
                  and runs[k].astype(str).nunique() > 1]
        raise FeddrKitError(f"grid point {point} of {root} holds {len(runs)} runs with seed {seed}, which differ in "
                            f"{', '.join(differ) or 'no config field'} ({', '.join(runs['name'])}): the root holds the "
                            "runs of more than one grid; move each grid's folders to a root of its own")
    out = intervals(df, by, value, confidence)
    out.insert(len(by), "value", value)
    return out


def write_tables(root: str | Path) -> None:
    """Write ``root/runs.csv`` (:func:`collect`: one row per run) and, once a run has finished,
    ``root/table.csv`` (:func:`interval_summary` of ``final_acc``), so a sweep's results open without Python."""
    root = Path(root)
    runs = collect(root)
    write_text(root / RUNS, runs.to_csv(index=False))
    if not runs.empty and (runs["status"] == DONE).any():
        write_text(root / TABLE, interval_summary(root).to_csv(index=False))
