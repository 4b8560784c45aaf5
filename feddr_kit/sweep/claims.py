"""Claims over seeds, the chapters' way: results CSVs read back, and intervals of values and of paired differences.

:func:`read_results` loads a results CSV, :func:`intervals` / :func:`interval_table` give mean ± 95 % t
interval over seeds (``"45.1 ± 3.0 (n=3)"``, ``"—"`` for a missing cell), :func:`paired_difference` the
interval of a difference paired by seed, ready for ``fk.stats.verdict``, and :func:`baseline_columns`
whether each claim's baseline learned at all.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from ..errors import FeddrKitError
from ..stats import Interval, difference, interval
from .root import DONE


def as_list(x: str | Sequence[str] | None) -> list[str]:
    """Column names as a list: None gives ``[]``, one name ``[name]``."""
    return [] if x is None else [x] if isinstance(x, str) else list(x)


def _parse_value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def fields_from_name(name: str) -> dict[str, Any]:
    """The ``field=value`` parts of a run folder name (:func:`feddr_kit.sweep.grid.run_dir_name`):
    ``"algorithm=dr__seed=1"`` gives ``{"algorithm": "dr", "seed": 1}``. Values that read as int or float
    are converted; a trailing digest (no ``=``) is skipped. Characters replaced in the name stay replaced."""
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
    keys = as_list(by)
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
