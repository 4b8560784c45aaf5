"""Sweeps: a grid over ``Config`` fields × seeds, one resumable folder per run, and the paper's tables.

::

    df = fk.sweep.run({"dataset": "cifar10", "rounds": 20}, {"algorithm": ["fedavg", "feddr+"]},
                      seeds=[0, 1, 2], root="runs/table3")
    fk.sweep.table(df, rows="algorithm")            # "45.1 ± 1.2 (n=3)" per cell

Every run lives in ``root/<name>/``, where ``<name>`` (:func:`run_dir_name`) spells the grid's
fields (and any other that differs from the base), then the seed:
``algorithm=feddr+__shards_per_client=5__seed=1``. A
sweep that is killed and started again finds its folders: finished runs (``summary.json``) are
skipped, interrupted ones (``checkpoint.pt`` without ``summary.json``) continue with the kit's
exact resume, and the rest start fresh. ``root/sweep.json`` records the base, grid and seeds.

Reading results with intervals (the chapters 05-07 way): :func:`read_results` loads a results CSV,
:func:`intervals` / :func:`interval_table` give mean ± 95 % t interval over seeds (``"45.1 ± 3.0 (n=3)"``,
``"—"`` for a missing cell), and :func:`paired_difference` the interval of a difference paired by seed,
ready for ``fk.stats.verdict``.

The same folders-and-skip scheme runs a notebook once per grid point under papermill
(:func:`run_notebook_grid`), collecting each point's ``results.json`` (:func:`collect_notebooks`).

Command line: ``python -m feddr_kit sweep --grid grid.json --root runs/x`` with
``grid.json = {"base": {...}, "grid": {"field": [values, ...]}, "seeds": [0, 1, 2]}``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from . import progress as progress_mod
from . import rundir
from .config import Config, read_mapping
from .data import ImageData
from .errors import BusyError, FeddrKitError
from .clients import load_data
from .federated import run as run_one
from .rundir import CHECKPOINT, write_json, write_text
from .stats import Interval, difference, interval

SUMMARY, CONFIG, HISTORY, ERROR, POINT, SWEEP, RESULTS, TABLE, RUNS = (
    "summary.json", "config.json", "history.csv", "error.txt", "point.json", "sweep.json", "results.json", "table.csv",
    "runs.csv")
# Fields that say where and how visibly a run goes, not what it computes: never part of a name,
# never a mismatch.
BOOKKEEPING = frozenset({"out_dir", "progress", "tensorboard", "overwrite", "device", "checkpoint_every"})
MAX_NAME = 120
DONE, PARTIAL, FAILED, UNREADABLE = "done", "partial", "failed", "unreadable"

# The teaching scale (``Config()``'s defaults: ``cnn_bn``, 120 rounds of 10 of 100 clients, 1 local epoch,
# chosen by the criteria in docs/teaching_scale.md), the scale of the results chapters' sweeps: a
# default run takes 3-4 minutes on 2 CPU cores. Read from ``Config`` so the two never disagree.
TEACHING_SCALE: dict[str, Any] = {k: getattr(Config(), k) for k in
                                  ("dataset", "model", "num_clients", "rounds", "clients_per_round", "local_epochs",
                                   "eval_every")}


# --------------------------------------------------------------------------- grids and names
def _field_defaults() -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(Config):
        out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return out


def _plain(v: Any) -> Any:
    """A JSON-comparable form of a config value (tuples as lists, NumPy scalars as Python ones)."""
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _value_text(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(_value_text(x) for x in v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _name_from(items: Sequence[tuple[str, Any]]) -> str:
    """``k1=v1__k2=v2``: only ``[A-Za-z0-9._,+=-]``; a short SHA-1 of the items is appended when a
    character had to be replaced or the name is longer than ``MAX_NAME`` (so names stay distinct)."""
    raw = "__".join(f"{k}={_value_text(v)}" for k, v in items)
    safe = re.sub(r"[^A-Za-z0-9._,+=-]", "-", raw)
    if safe == raw and len(raw) <= MAX_NAME:
        return raw
    digest = hashlib.sha1(json.dumps([[k, _plain(v)] for k, v in items]).encode()).hexdigest()[:10]
    return f"{safe[:MAX_NAME - 12]}__{digest}"


def _check_grid(grid: Mapping[str, Sequence], seeds: Sequence[int]) -> None:
    if not isinstance(grid, Mapping):
        raise FeddrKitError(f"grid must be a dict field -> list of values, got {type(grid).__name__}")
    for name, values in grid.items():
        if not isinstance(values, (list, tuple)) or len(values) == 0:
            raise FeddrKitError(f"grid[{name!r}] must be a non-empty list of values, got {values!r}")
        texts = [json.dumps(_plain(v), sort_keys=True) for v in values]
        dup = next((v for v, t in zip(values, texts) if texts.count(t) > 1), None)
        if dup is not None:
            raise FeddrKitError(f"grid[{name!r}] lists the value {dup!r} twice")
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or len(seeds) == 0:
        raise FeddrKitError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise FeddrKitError(f"seeds must be integers >= 0, got {s!r}")
    if len(set(int(s) for s in seeds)) != len(seeds):
        raise FeddrKitError(f"seeds must be distinct, got {list(seeds)}")


def _points(grid: Mapping[str, Sequence], seeds: Sequence[int]) -> list[tuple[dict, int]]:
    """Grid points × seeds, seeds outermost: after a third of a 3-seed sweep every cell has one seed."""
    names = list(grid)
    return [(dict(zip(names, combo)), int(s)) for s in seeds for combo in itertools.product(*(grid[n] for n in names))]


def expand(base: Mapping[str, Any] | Config, grid: Mapping[str, Sequence], seeds: Sequence[int]) -> list[Config]:
    """The sweep's configs: ``base`` updated with every combination of ``grid``'s values, for every seed.

    ``base``: Config fields (a dict or a ``Config``); ``grid``: field → non-empty list of values;
    ``seeds``: distinct integers. Order: seeds outermost, then the grid's fields in the order given
    (the first slowest). Every config is built and validated up front; a bad one raises
    ``FeddrKitError`` naming the grid point and the field. ``out_dir`` (set by the sweep) and ``seed``
    (given by ``seeds``) may not appear in ``base`` or ``grid``. Returns a list of ``len(seeds) · Π|values|`` configs.
    """
    base = base.to_dict() if isinstance(base, Config) else dict(base)
    _check_grid(grid, seeds)
    allowed = set(_field_defaults())
    for where, keys in (("base", base), ("grid", grid)):
        unknown = sorted(set(keys) - allowed)
        if unknown:
            raise FeddrKitError(f"{where} names unknown config field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
        if where == "grid" and "seed" in keys:
            raise FeddrKitError("grid may not hold 'seed': give the seeds as the seeds list")
    if base.get("out_dir") is not None:
        raise FeddrKitError("base may not set out_dir: the sweep puts each run in root/<name>/")
    base.pop("seed", None)
    base.pop("out_dir", None)
    configs = []
    for point, seed in _points(grid, seeds):
        try:
            configs.append(Config.from_dict({**base, **point, "seed": seed}))
        except FeddrKitError as err:
            raise FeddrKitError(f"grid point {point} with seed {seed}: {err}") from None
    return configs


def run_dir_name(cfg: Config, base: Mapping[str, Any] | Config, grid: Iterable[str] = ()) -> str:
    """A readable, stable folder name for ``cfg`` within a sweep over ``base``.

    The fields named in ``grid`` (always, so ``algorithm=feddr+`` shows even when feddr+ is the
    default) and every other field whose value differs from ``base`` (fields missing from ``base``
    count at their ``Config`` default), in alphabetical order, then the seed:
    ``algorithm=feddr+__shards_per_client=5__seed=1``. Bookkeeping fields (out_dir, progress,
    device, checkpoint_every) never appear. Only ``[A-Za-z0-9._,+=-]`` are used; when other
    characters had to be replaced, or the name would pass 120 characters, a 10-hex-digit SHA-1 of
    the named fields is appended. A pure function of the values: the same in every process.
    Returns the name (a string).
    """
    ref = {**_field_defaults(), **(base.to_dict() if isinstance(base, Config) else dict(base))}
    values, always = cfg.to_dict(), set(grid)
    named = [(k, values[k]) for k in sorted(values)
             if k not in BOOKKEEPING and k != "seed" and (k in always or _plain(values[k]) != _plain(ref.get(k)))]
    return _name_from(named + [("seed", cfg.seed)])


# --------------------------------------------------------------------------- folder states
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:  # ValueError: bad JSON, and bytes that are not UTF-8
        raise FeddrKitError(f"cannot read {path}: {(str(err).splitlines() or [type(err).__name__])[0][:160]}") from None


def _readable_json(path: Path) -> Any:
    """``path``'s JSON, or None when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _status(folder: Path) -> str | None:
    """``done`` (summary.json), ``failed`` (error.txt), ``partial`` (started: checkpoint or config), or None."""
    if (folder / SUMMARY).exists():
        return DONE
    if (folder / ERROR).exists():
        return FAILED
    if (folder / CHECKPOINT).exists() or (folder / CONFIG).exists() or (folder / POINT).exists():
        return PARTIAL
    return None


def _mismatch(folder: Path, cfg: Config) -> str | None:
    """Why ``folder`` holds a different run than ``cfg`` (one field), or None when it is the same run.

    Compared against ``point.json`` (what the sweep asked for) when present, else ``config.json``
    (what the run saved; there a ``None`` in ``cfg`` — "the algorithm's default" — matches anything).
    """
    want = cfg.to_dict()
    saved, lenient = None, False
    if (folder / POINT).exists():
        saved = _readable_json(folder / POINT)
        saved = saved.get("config") if isinstance(saved, dict) else None
    if not isinstance(saved, dict) and (folder / CONFIG).exists():
        saved, lenient = _readable_json(folder / CONFIG), True
    if not isinstance(saved, dict):  # nothing readable says what the folder holds: the sweep's run rewrites it
        return None
    defaults = _field_defaults()
    for k, v in want.items():
        if k in BOOKKEEPING or (lenient and v is None):
            continue
        have = saved.get(k, defaults[k])
        if _plain(have) != _plain(v):
            return f"{k}={have!r} there but the sweep asks {k}={v!r}"
    return None


# --------------------------------------------------------------------------- running
def run_sweep(base: Mapping[str, Any] | Config, grid: Mapping[str, Sequence], seeds: Sequence[int],
              root: str | Path, *, data: ImageData | None = None, progress: bool = True,
              retry_failed: bool = False, callback=None) -> pd.DataFrame:
    """Run every config of :func:`expand` (``base``, ``grid``, ``seeds``) into ``root/<name>/``.

    Finished runs are skipped, interrupted ones resumed (``fk.run(cfg, resume=True)``), missing ones
    run; a folder that holds a different config is an error, raised before anything trains. A run
    that fails with ``FeddrKitError`` or ``FloatingPointError`` leaves ``error.txt`` and the sweep goes
    on; it is skipped next time unless ``retry_failed``. The dataset is loaded once per distinct
    ``(dataset, data_path)``, or ``data`` is used for every run. ``progress``: one bar over the runs
    and a line per run (the runs' own bars are off). ``callback`` goes to every ``fk.run``.
    Writes ``root/sweep.json``. Returns :func:`collect` of this sweep's folders, in sweep order.
    Safe to kill and call again. Each folder is prepared and run under its lock
    (:func:`feddr_kit.rundir.claim`), so two sweeps at once on one root (or a sweep meeting a folder that a
    run holds) never touch each other's folders: a held folder is skipped with a line saying so and is
    ``partial`` in the frame until its owner finishes it.
    """
    configs = expand(base, grid, seeds)
    base_d = base.to_dict() if isinstance(base, Config) else dict(base)
    names = [run_dir_name(c, base_d, grid) for c in configs]
    if len(set(names)) != len(names):  # e.g. grid values 1 and 1.0: equal as configs, so one folder
        dup = next(n for n in names if names.count(n) > 1)
        raise FeddrKitError(f"two grid points map to the same folder {dup}; make the grid values distinct")
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise FeddrKitError(f"root must be a folder, but {root} is a file")
    if data is not None and len({(c.dataset, c.data_path) for c in configs}) > 1:
        raise FeddrKitError("data= serves one dataset, but the grid spans several; leave data=None")

    plan = []
    for cfg, name in zip(configs, names):
        folder = root / name
        status = _status(folder)
        if status is not None:
            why = _mismatch(folder, cfg)
            if why is not None:
                raise FeddrKitError(f"{folder} holds another run ({why}); use a new root or delete that folder")
        plan.append((cfg, name, folder, status))

    write_json(root / SWEEP, {"base": {k: _plain(v) for k, v in base_d.items()},
                              "grid": {k: [_plain(v) for v in vs] for k, vs in grid.items()},
                              "seeds": [int(s) for s in seeds]})
    todo = [p for p in plan if p[3] != DONE and (p[3] != FAILED or retry_failed)]
    bar = progress_mod.bar(len(plan), "sweep", unit="runs", initial=len(plan) - len(todo), disable=not progress)
    if progress and len(todo) < len(plan):
        progress_mod.write(f"{len(plan) - len(todo)} of {len(plan)} runs already in {root} (done or failed): skipped")
    cache: dict[tuple, ImageData] = {}
    for cfg, name, folder, status in todo:
        try:
            with rundir.claim(folder, resume=True, overwrite=False):  # nothing in the folder is touched before
                line = _run_point(cfg, name, folder, retry_failed, data, cache, callback)
        except BusyError as err:  # another sweep or run holds it: left to that one, untouched
            line = f"{name}: skipped, {err}"
        if progress:
            progress_mod.write(line)
        bar.update(1)
    bar.close()
    write_tables(root)
    return _in_grid_order(collect(root), names)


def write_tables(root: str | Path) -> None:
    """Write ``root/runs.csv`` (:func:`collect`: one row per run) and, once a run has finished,
    ``root/table.csv`` (:func:`interval_summary` of ``final_acc``), so a sweep's results open without Python."""
    root = Path(root)
    runs = collect(root)
    write_text(root / RUNS, runs.to_csv(index=False))
    if not runs.empty and (runs["status"] == DONE).any():
        write_text(root / TABLE, interval_summary(root).to_csv(index=False))


def interval_summary(root: str | Path, value: str = "final_acc", confidence: float = 0.95) -> pd.DataFrame:
    """The sweep in ``root`` as one row per grid point: its grid fields (from ``sweep.json``; else
    ``algorithm``), ``value`` (the summary field), ``mean``, ``low``, ``high``, ``half_width`` (the t
    interval over seeds, :func:`intervals`; accuracies as fractions) and ``n`` (seeds finished). Raises
    :class:`FeddrKitError` when no run has finished."""
    root = Path(root)
    df = collect(root)
    if df.empty or not (df["status"] == DONE).any():
        raise FeddrKitError(f"{root} holds no finished run yet")
    spec = _read_json(root / SWEEP) if (root / SWEEP).exists() else {}
    grid = spec.get("grid", {})
    by = [k for k in grid if k in df.columns] or ["algorithm"]
    if grid:  # rows in the grid's order of values, not the folders' alphabetical one
        order = {k: {json.dumps(_plain(v)): i for i, v in enumerate(grid[k])} for k in by}
        df = df.sort_values(by, kind="stable", key=lambda col: col.map(
            lambda v: order[col.name].get(json.dumps(_plain(v)), len(order[col.name]))))
    table = intervals(df, by, value, confidence)
    table.insert(len(by), "value", value)
    return table


def _run_point(cfg: Config, name: str, folder: Path, retry_failed: bool, data: ImageData | None,
               cache: dict[tuple, ImageData], callback) -> str:
    """Run (or resume) one grid point in ``folder``, which the caller holds; returns the line to show.

    The folder's state is read again under the lock: another sweep may have finished it meanwhile.
    """
    status = _status(folder)
    if status == DONE or (status == FAILED and not retry_failed):
        return f"{name}: {status} meanwhile (by another sweep): skipped"
    resume = (folder / CHECKPOINT).exists()
    (folder / ERROR).unlink(missing_ok=True)
    if not resume:  # a run killed before its first checkpoint leaves these; start clean
        for leftover in (CONFIG, HISTORY):
            (folder / leftover).unlink(missing_ok=True)
    write_json(folder / POINT, {"name": name, "config": cfg.to_dict()})
    key = (cfg.dataset, cfg.data_path)
    try:
        if data is None and key not in cache:
            cache[key] = load_data(cfg)
        result = run_one(cfg.replace(out_dir=str(folder), progress=False), resume=resume, claim=False,
                         data=data if data is not None else cache[key], callback=callback)
    except (FeddrKitError, FloatingPointError) as err:
        write_text(folder / ERROR, f"{type(err).__name__}: {err}\n")
        return f"{name}: failed ({type(err).__name__}: {err})"
    return f"{name}: {'resumed, ' if resume else ''}final accuracy {result.summary['final_acc']:.2%}"


def _in_grid_order(df: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """The rows of ``df`` whose ``name`` is one of ``names`` (this grid's runs), in that order; a name with no
    row (its folder held by another run before anything was written there) gets a ``partial`` row."""
    order = {n: i for i, n in enumerate(names)}
    absent = [n for n in names if df.empty or n not in set(df["name"])]
    if absent:
        df = pd.concat([df, pd.DataFrame({"name": absent, "status": PARTIAL})], ignore_index=True)
    df = df[df["name"].isin(order)]
    return df.sort_values("name", key=lambda s: s.map(order)).reset_index(drop=True)


run = run_sweep  # fk.sweep.run; inside this module fk.run is `run_one`


# --------------------------------------------------------------------------- collecting
def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


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
        status = _status(folder)
        if status is None:
            continue
        try:
            rows.append(_collect_one(folder, status))
        except FeddrKitError as err:  # one broken file costs its own row, not the table
            unreadable.append(f"{folder.name} ({err})")
            rows.append({"name": folder.name, "status": UNREADABLE, "error": str(err)})
    if unreadable:
        warnings.warn(f"left out {len(unreadable)} run folder(s) whose files cannot be read: {'; '.join(unreadable)}",
                      stacklevel=2)
    return pd.DataFrame(rows)


def _collect_one(folder: Path, status: str) -> dict[str, Any]:
    """:func:`collect`'s row of one folder; :class:`FeddrKitError` naming the file when one cannot be read."""
    row: dict[str, Any] = {"name": folder.name, "status": status}
    if (folder / POINT).exists():
        cfg = _json_object(folder / POINT).get("config", {})
    elif (folder / CONFIG).exists():
        cfg = _json_object(folder / CONFIG)
    else:
        cfg = {}
    row.update({k: _hashable(v) for k, v in cfg.items() if k not in ("out_dir", "progress")})
    if status == DONE:
        for k, v in _json_object(folder / SUMMARY).items():
            if k in cfg:
                if _plain(v) != _plain(cfg[k]):
                    row[f"summary_{k}"] = _hashable(v)
            else:
                row[k] = _hashable(v)
    if status == FAILED:
        row["error"] = (folder / ERROR).read_text(errors="replace").strip()
    return row


def _json_object(path: Path) -> dict:
    """``path``'s JSON object; :class:`FeddrKitError` naming the file when it is unreadable or not an object."""
    obj = _read_json(path)
    if not isinstance(obj, dict):
        raise FeddrKitError(f"cannot read {path}: not a JSON object")
    return obj


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
        if _status(folder) != DONE or not (folder / HISTORY).exists():
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
    summary = _json_object(folder / SUMMARY)
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


def _as_list(x: str | Sequence[str] | None) -> list[str]:
    return [] if x is None else [x] if isinstance(x, str) else list(x)


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
    rows_, cols_ = _as_list(rows), _as_list(cols)
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
    if "seed" in d.columns:
        sizes = d.groupby(keys + ["seed"], sort=False).size()
        if (sizes > 1).any():
            crowded = sizes[sizes > 1]
            *cell, seed = crowded.index[0]
            raise FeddrKitError(f"cell {dict(zip(keys, cell))} holds {crowded.iloc[0]} runs with seed {seed}: a field "
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


# --------------------------------------------------------------------------- results CSVs and intervals
def _parse_value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def fields_from_name(name: str) -> dict[str, Any]:
    """The ``field=value`` parts of a run folder name (:func:`run_dir_name`): ``"algorithm=dr__seed=1"``
    gives ``{"algorithm": "dr", "seed": 1}``. Values that read as int or float are converted; a
    trailing digest (no ``=``) is skipped. Characters replaced in the name stay replaced."""
    out = {}
    for part in str(name).split("__"):
        if "=" in part:
            key, value = part.split("=", 1)
            out[key] = _parse_value(value)
    return out


RESULT_COLUMNS = ("setting", "seed", "final_acc", "best_acc", "last5_acc", "final_local_acc", "sec_per_round",
                  "total_seconds", "name", "machine")


def read_results(path: str | Path, fields: Sequence[str] = (), missing_ok: bool = False) -> pd.DataFrame:
    """A results CSV (``results/<chapter>.csv``, one row per finished run) with the columns ``fields``
    present. The results scripts keep only the config fields that vary, so a partial sweep in which
    one grid field has a single value so far lacks that column; it is filled from the run names
    (grid fields are always in the name). A missing file raises ``FeddrKitError``, or with
    ``missing_ok`` gives an empty frame with the columns ``fields`` and :data:`RESULT_COLUMNS` (a
    sweep not collected yet). Raises ``FeddrKitError`` when a field is neither a column nor in every
    run's name. Returns the DataFrame."""
    path = Path(path)
    if not path.is_file():
        if missing_ok:
            text = {"setting", "name", "machine"}
            return pd.DataFrame({c: pd.Series(dtype=object if c in text or c in fields else float)
                                 for c in dict.fromkeys([*fields, *RESULT_COLUMNS])})
        raise FeddrKitError(f"path must be an existing results CSV, got {path}")
    df = pd.read_csv(path)
    for f in fields:
        if f in df.columns:
            continue
        parsed = [fields_from_name(n) for n in df.get("name", pd.Series([], dtype=str))]
        if not all(f in p for p in parsed):
            raise FeddrKitError(f"fields: {f!r} is neither a column of {path} nor in every run's name")
        df[f] = [p[f] for p in parsed]
    return df


def _select(df: pd.DataFrame, where: Mapping[str, Any]) -> pd.DataFrame:
    mask = pd.Series(True, index=df.index)
    for k, v in where.items():
        if k not in df.columns:
            raise FeddrKitError(f"where: df has no column {k!r}; it has: {', '.join(map(str, df.columns))}")
        mask &= df[k] == v
    return df[mask]


def seed_values(df: pd.DataFrame, where: Mapping[str, Any], value: str = "final_acc") -> pd.Series:
    """``value`` of the runs whose columns equal ``where`` (e.g. ``{"setting": "s=2", "algorithm":
    "dr"}``), one per seed: a Series indexed by seed, sorted (empty when no run matches). Raises
    ``FeddrKitError`` when two matching runs share a seed (``where`` does not pin one cell)."""
    sel = _select(df, where)
    if sel["seed"].duplicated().any():
        raise FeddrKitError(f"where={dict(where)} matches {len(sel)} runs with repeated seeds; name more fields")
    return sel.set_index("seed")[value].sort_index()


def paired_difference(df: pd.DataFrame, a: Mapping[str, Any], b: Mapping[str, Any], value: str = "final_acc",
                      confidence: float = 0.95) -> Interval:
    """Interval of ``mean(a) - mean(b)`` of ``value``, paired by seed (the runs matching ``a`` and those
    matching ``b``, see :func:`seed_values`; only seeds present on both sides count), via
    ``fk.stats.difference(paired=True)``. No common seed gives an untestable interval (NaN mean, n=0)."""
    x, y = seed_values(df, a, value), seed_values(df, b, value)
    common = x.index.intersection(y.index)
    if len(common) == 0:
        return Interval(math.nan, -math.inf, math.inf, 0, confidence, "paired t")
    return difference(x[common].to_numpy(), y[common].to_numpy(), paired=True, confidence=confidence)


def baseline_columns(df: pd.DataFrame, baselines: Sequence[tuple[str, Mapping[str, Any]]], chance: float,
                     band: float = 0.0, value: str = "final_acc", confidence: float = 0.95) -> pd.DataFrame:
    """What a claims table says about each claim's baseline: whether it learned at all, since beating a
    model that sits at chance is no win. ``baselines``: one ``(label, where)`` per claim, ``where``
    selecting the baseline's runs as in :func:`seed_values`. Returns a DataFrame with one row per
    baseline and two columns: ``"baseline final acc (95 % interval)"`` (``"<label> 45.1 [43.0, 47.2] %"``;
    ``"<label> 45.1 % (n=1)"`` for one seed; ``"—"`` with no run) and ``"baseline above chance?"``
    (``"yes"`` when the interval's low end is at least ``chance + band``, else ``"no: reaches chance"``;
    ``"no run"``)."""
    rows = []
    for label, where in baselines:
        values = seed_values(df, where, value)
        if values.empty:
            rows.append(("—", "no run"))
            continue
        iv = interval(values.to_numpy(), confidence)
        text = (f"{label} {100 * iv.mean:.1f} [{100 * iv.low:.1f}, {100 * iv.high:.1f}] %" if math.isfinite(iv.half_width)
                else f"{label} {100 * iv.mean:.1f} % (n={iv.n})")
        rows.append((text, "yes" if iv.low >= chance + band else "no: reaches chance"))
    return pd.DataFrame(rows, columns=[f"baseline final acc ({confidence:.0%} interval)".replace("%", " %"),
                                       "baseline above chance?"])


def intervals(df: pd.DataFrame, by: str | Sequence[str], value: str = "final_acc",
              confidence: float = 0.95) -> pd.DataFrame:
    """Mean and t interval over seeds (``fk.stats.interval``) of ``value`` per group of ``by``: one row
    per group, in order of first appearance, columns ``mean``, ``low``, ``high``, ``half_width``, ``n``
    (``n = 1`` gives an infinite interval). Only ``status == "done"`` rows count when df has a status."""
    keys = _as_list(by)
    d = df[df["status"] == DONE] if "status" in df else df
    missing = [c for c in keys + [value] if c not in d.columns]
    if missing:
        raise FeddrKitError(f"df has no column(s) {', '.join(missing)}")
    rows = []
    for key, group in d.groupby(keys, sort=False):
        iv = interval(group[value].to_numpy(), confidence)
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(keys, key)), "mean": iv.mean, "low": iv.low, "high": iv.high,
                     "half_width": iv.half_width, "n": iv.n})
    return pd.DataFrame(rows, columns=keys + ["mean", "low", "high", "half_width", "n"])


def interval_table(df: pd.DataFrame, rows: str, cols: str, value: str = "final_acc", *, index: Sequence | None = None,
                   columns: Sequence | None = None, scale: float = 100.0, fmt: str = ".1f",
                   confidence: float = 0.95) -> pd.DataFrame:
    """A rows × cols table of strings ``"45.1 ± 3.0 (n=3)"``: mean ± half the t interval over seeds
    (:func:`intervals`), times ``scale``; one seed gives ``"45.1 (n=1)"`` and a cell with no run
    ``"—"``. ``index`` / ``columns`` fix the order and make missing rows / columns show as ``"—"``
    (default: order of first appearance). Returns the DataFrame."""
    iv = intervals(df, [rows, cols], value, confidence)

    def text(r) -> str:
        m = format(r["mean"] * scale, fmt)
        if r["n"] >= 2 and math.isfinite(r["half_width"]):
            m += f" ± {format(r['half_width'] * scale, fmt)}"
        return f"{m} (n={int(r['n'])})"

    cells = pd.Series([text(r) for _, r in iv.iterrows()], index=pd.MultiIndex.from_frame(iv[[rows, cols]]), dtype=object)
    wide = cells.unstack(cols) if len(cells) else pd.DataFrame()
    index = list(index) if index is not None else list(dict.fromkeys(iv[rows]))
    columns = list(columns) if columns is not None else list(dict.fromkeys(iv[cols]))
    wide = wide.reindex(index=index, columns=columns).map(lambda v: v if isinstance(v, str) else "—")
    return wide.rename_axis(index=rows, columns=cols)


# --------------------------------------------------------------------------- notebooks (papermill)
def run_notebook_grid(notebook: str | Path, grid: Mapping[str, Sequence], seeds: Sequence[int], root: str | Path,
                      parameters: Mapping[str, Any] | None = None, *, kernel_name: str = "python3",
                      cwd: str | Path | None = None, progress: bool = True, retry_failed: bool = False) -> pd.DataFrame:
    """Execute ``notebook`` once per grid point × seed under papermill, each into ``root/<name>/``.

    Each execution gets ``parameters`` (fixed ones) updated with the point's values, ``seed`` and
    ``out_dir=<its folder>``; the notebook must write ``results.json`` into ``out_dir``. The
    executed copy is saved as ``<folder>/notebook.ipynb``. Points whose ``results.json`` exists are
    skipped; a point whose execution raises (or writes no ``results.json``) leaves ``error.txt``
    and the grid goes on (retried only with ``retry_failed``). ``<name>`` spells every grid field
    and the seed (as :func:`run_dir_name` does). ``cwd``: the kernel's working folder (default:
    the notebook's). Returns :func:`collect_notebooks` of this grid's folders, in grid order.
    """
    import papermill

    notebook, root = Path(notebook), Path(root)
    if not notebook.is_file():
        raise FeddrKitError(f"notebook must be an existing .ipynb file, got {notebook}")
    _check_grid(grid, seeds)
    fixed = dict(parameters or {})
    for reserved in ("seed", "out_dir"):
        if reserved in grid or reserved in fixed:
            raise FeddrKitError(f"{reserved} is set by the grid runner; leave it out of grid and parameters")
    points = _points(grid, seeds)
    names = [_name_from(sorted(p.items()) + [("seed", s)]) for p, s in points]
    write_json(root / SWEEP, {"notebook": str(notebook), "parameters": {k: _plain(v) for k, v in fixed.items()},
                              "grid": {k: [_plain(v) for v in vs] for k, vs in grid.items()},
                              "seeds": [int(s) for s in seeds]})
    todo = [(p, s, n) for (p, s), n in zip(points, names)
            if not (root / n / RESULTS).exists() and (retry_failed or not (root / n / ERROR).exists())]
    bar = progress_mod.bar(len(points), "notebook grid", unit="runs", initial=len(points) - len(todo),
                           disable=not progress)
    # the kernels papermill starts inherit this process's environment: progress as plain lines, which the
    # executed notebook keeps, not widgets it cannot render (unless the caller chose otherwise)
    with _environment(FEDDR_PROGRESS=os.environ.get("FEDDR_PROGRESS", "lines")):
        for point, seed, name in todo:
            folder = root / name
            (folder / ERROR).unlink(missing_ok=True)
            params = {**fixed, **{k: _plain(v) for k, v in point.items()}, "seed": seed}
            write_json(folder / POINT, {"name": name, "parameters": params})
            try:
                papermill.execute_notebook(str(notebook), str(folder / "notebook.ipynb"),
                                           parameters={**params, "out_dir": str(folder.resolve())},
                                           kernel_name=kernel_name, cwd=str(cwd or notebook.parent.resolve()),
                                           progress_bar=False)
                if not (folder / RESULTS).exists():
                    raise FeddrKitError(f"the notebook ran but wrote no {RESULTS} into out_dir={folder}")
                line = f"{name}: done"
            except (papermill.PapermillExecutionError, FeddrKitError) as err:
                first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
                write_text(folder / ERROR, f"{type(err).__name__}: {first}\n")
                line = f"{name}: failed ({first})"
            if progress:
                progress_mod.write(line)
            bar.update(1)
    bar.close()
    return _in_grid_order(collect_notebooks(root), names)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of the block, then put back what was there."""
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def collect_notebooks(root: str | Path) -> pd.DataFrame:
    """One row per notebook-grid folder under ``root`` (those holding point.json).

    Columns: ``name``, ``status`` (``done`` when results.json exists, ``failed`` with error.txt,
    ``unreadable`` when point.json or results.json cannot be read (a warning names it), else ``partial``), the
    point's parameters (including ``seed``), then results.json flattened (nested keys joined by ``.``; its
    ``units`` left out), and ``error`` for failed points. Returns a DataFrame.
    """
    root = Path(root)
    if not root.is_dir():
        raise FeddrKitError(f"root must be an existing folder, got {root}")
    rows, unreadable = [], []
    for folder in sorted(p for p in root.iterdir() if (p / POINT).exists()):
        status = DONE if (folder / RESULTS).exists() else FAILED if (folder / ERROR).exists() else PARTIAL
        row: dict[str, Any] = {"name": folder.name, "status": status}
        try:
            row.update({k: _hashable(v) for k, v in _json_object(folder / POINT).get("parameters", {}).items()})
            if status == DONE:
                body = {k: v for k, v in _json_object(folder / RESULTS).items() if k != "units"}  # text, not results
                flat = pd.json_normalize(body, sep=".")
                row.update({k: _hashable(v) for k, v in flat.iloc[0].to_dict().items()} if len(flat) else {})
        except FeddrKitError as err:  # one broken file costs its own row, not the table
            unreadable.append(f"{folder.name} ({err})")
            row = {"name": folder.name, "status": UNREADABLE, "error": str(err)}
        if status == FAILED and row["status"] == FAILED:
            row["error"] = (folder / ERROR).read_text(errors="replace").strip()
        rows.append(row)
    if unreadable:
        warnings.warn(f"left out {len(unreadable)} notebook run folder(s) whose files cannot be read: "
                      f"{'; '.join(unreadable)}", stacklevel=2)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- command line
def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sweep`` subcommand to ``python -m feddr_kit``'s subparsers; returns its parser."""
    p = subparsers.add_parser(
        "sweep", allow_abbrev=False, help="run a grid of configs x seeds, resumably, and print the table",
        description="Run every grid point x seed into ROOT/<name>/ (finished runs are skipped, interrupted "
                    "ones resumed), print mean ± std over seeds, and write ROOT/runs.csv and ROOT/table.csv. GRID is "
                    'a JSON or YAML file {"base": {<Config fields>}, "grid": {"<field>": [values, ...]}, "seeds": [0, 1, 2]}. '
                    "The base, later winning: the --config file, the grid file's base, the Config flags typed.")
    p.add_argument("--grid", required=True, help="the grid file (JSON or YAML)")
    p.add_argument("--root", required=True, help="folder that holds one subfolder per run")
    p.add_argument("--value", default="final_acc", help="summary field shown in the table")
    p.add_argument("--retry-failed", action="store_true", help="run again the runs that left error.txt")
    p.add_argument("--no-progress", action="store_true", help="no progress bar and per-run lines")
    return p


def load_grid_file(path: str | Path) -> tuple[dict, dict, list]:
    """Read a grid file (JSON or YAML) ``{"base": {...}, "grid": {...}, "seeds": [...]}``; returns ``(base, grid,
    seeds)``. ``base`` and ``grid`` may be omitted (empty); ``seeds`` defaults to ``[0]``."""
    spec = read_mapping(path, "--grid")
    if set(spec) - {"base", "grid", "seeds"}:
        raise FeddrKitError(f"--grid: {path} must hold the keys base, grid, seeds only, not "
                            f"{', '.join(sorted(set(spec) - {'base', 'grid', 'seeds'}))}")
    return dict(spec.get("base") or {}), dict(spec.get("grid") or {}), list(spec.get("seeds", [0]))


def main(args: Mapping[str, Any]) -> int:
    """The ``sweep`` subcommand (``args``: the parsed flags as a dict). Prints the table of the finished runs
    and names the others; returns the exit code: 0 when every run finished, 1 when some failed, cannot be
    read or are held by another run, 2 on bad input."""
    try:
        base, grid, seeds = load_grid_file(args["grid"])
        # the --config file under the grid file's base, under the Config flags typed
        base = {**args.get("base_file", {}), **base, **args.get("base_flags", {})}
        df = run_sweep(base, grid, seeds, args["root"], progress=not args.get("no_progress", False),
                       retry_failed=args.get("retry_failed", False))
    except FeddrKitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    done = df[df["status"] == DONE] if not df.empty else df
    if not done.empty:
        fields = list(grid) or ["algorithm"]  # rows: the first field (and any beyond the second); cols: the second
        rows, cols = [fields[0]] + fields[2:], fields[1] if len(fields) > 1 else None
        with pd.option_context("display.width", 200, "display.max_columns", 50):
            print(f"\n{args.get('value', 'final_acc')}: mean ± std over seeds (n = seeds per cell)")
            print(table(done, rows=rows, cols=cols, value=args.get("value", "final_acc")))
    status = df["status"] if not df.empty else pd.Series([], dtype=object)
    for _, r in df[status == FAILED].iterrows():
        print(f"failed: {r['name']}: {r['error']}")
    for _, r in df[status == UNREADABLE].iterrows():
        print(f"unreadable: {r['name']}: {r['error']}")
    for _, r in df[status == PARTIAL].iterrows():
        print(f"not finished: {r['name']}: held by another run; run the sweep again once it ends")
    print(f"{len(done)} of {len(df)} runs done; results in {args['root']}/ ({RUNS}: one row per run; {TABLE}: mean and "
          f"95 % t interval over seeds; python -m feddr_kit show {args['root']})")
    return 0 if len(done) == len(df) else 1
