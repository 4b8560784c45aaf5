"""A sweep's root: the files in it and the state of each run folder.

``root/<name>/`` holds one run (:func:`feddr_kit.sweep_grid.run_dir_name`); ``root/sweep.json`` the grid.
A folder is ``done`` (summary.json), ``failed`` (error.txt), ``partial`` (started) or not a run yet.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .config import Config
from .errors import FeddrKitError
from .rundir import CHECKPOINT
from .sweep_grid import BOOKKEEPING, field_defaults, plain

SUMMARY, CONFIG, HISTORY, ERROR, POINT, SWEEP, RESULTS, TABLE, RUNS = (
    "summary.json", "config.json", "history.csv", "error.txt", "point.json", "sweep.json", "results.json", "table.csv",
    "runs.csv")
DONE, PARTIAL, FAILED, UNREADABLE = "done", "partial", "failed", "unreadable"


def read_json(path: Path) -> Any:
    """``path``'s JSON; :class:`FeddrKitError` ``"cannot read <path>: <reason>"`` when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:  # ValueError: bad JSON, and bytes that are not UTF-8
        raise FeddrKitError(f"cannot read {path}: {(str(err).splitlines() or [type(err).__name__])[0][:160]}") from None


def readable_json(path: Path) -> Any:
    """``path``'s JSON, or None when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def json_object(path: Path) -> dict:
    """``path``'s JSON object; :class:`FeddrKitError` naming the file when it is unreadable or not an object."""
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise FeddrKitError(f"cannot read {path}: not a JSON object")
    return obj


def hashable(v: Any) -> Any:
    """A JSON value fit for a DataFrame cell that pandas can group by: lists as tuples."""
    return tuple(hashable(x) for x in v) if isinstance(v, list) else v


def status(folder: Path) -> str | None:
    """``done`` (summary.json), ``failed`` (error.txt), ``partial`` (started: checkpoint or config), or None."""
    if (folder / SUMMARY).exists():
        return DONE
    if (folder / ERROR).exists():
        return FAILED
    if (folder / CHECKPOINT).exists() or (folder / CONFIG).exists() or (folder / POINT).exists():
        return PARTIAL
    return None


def mismatch(folder: Path, cfg: Config) -> str | None:
    """Why ``folder`` holds a different run than ``cfg`` (one field), or None when it is the same run.

    Compared against ``point.json`` (what the sweep asked for) when present, else ``config.json``
    (what the run saved; there a ``None`` in ``cfg`` — "the algorithm's default" — matches anything).
    """
    want = cfg.to_dict()
    saved, lenient = None, False
    if (folder / POINT).exists():
        saved = readable_json(folder / POINT)
        saved = saved.get("config") if isinstance(saved, dict) else None
    if not isinstance(saved, dict) and (folder / CONFIG).exists():
        saved, lenient = readable_json(folder / CONFIG), True
    if not isinstance(saved, dict):  # nothing readable says what the folder holds: the sweep's run rewrites it
        return None
    defaults = field_defaults()
    for k, v in want.items():
        if k in BOOKKEEPING or (lenient and v is None):
            continue
        have = saved.get(k, defaults[k])
        if plain(have) != plain(v):
            return f"{k}={have!r} there but the sweep asks {k}={v!r}"
    return None
