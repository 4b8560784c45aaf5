"""A sweep's root: the files in it, the state of each run folder, and the one grid it holds.

``root/<name>/`` holds one run (:func:`feddr_kit.sweep.grid.run_dir_name`); ``root/sweep.json`` the grid.
A folder is ``done`` (summary.json), ``failed`` (error.txt), ``partial`` (started) or not a run yet.

One root, one grid (:func:`starting`). A root's tables group its runs by the grid's fields and count
the rest as seeds, so runs of another grid (another base, or other fields varied) would be pooled as
seeds of one setting. Grouping by every field that varies across the root instead was the other way
out; it is not taken because it cannot tell a setting run twice from two settings (two grids give the
same config two folder names: FedAvg at the base lr is ``algorithm=fedavg`` in one and ``lr=0.05`` in
the other), and a table whose rows change as sweeps are added reads badly. So a sweep refuses a root
that holds another grid, naming both. A sweep with the same base and the same grid fields may add
values and seeds: its runs are told apart by those fields, and ``sweep.json`` records the union.
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Iterator

from .. import rundir
from ..config import Config
from ..errors import BusyError, FeddrKitError
from ..rundir import CHECKPOINT, write_json
from .grid import BOOKKEEPING, plain, saved_defaults

SUMMARY, CONFIG, HISTORY, ERROR, POINT, SWEEP, RESULTS, TABLE, RUNS = (
    "summary.json", "config.json", "history.csv", "error.txt", "point.json", "sweep.json", "results.json", "table.csv",
    "runs.csv")
DONE, PARTIAL, FAILED, UNREADABLE = "done", "partial", "failed", "unreadable"
# How long a sweep waits for another one that is checking the root's grid (which takes milliseconds).
ROOT_WAIT_S = 60.0


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
    (what the run saved; there a ``None`` in ``cfg`` — "the algorithm's default", "the layout of the run's
    device" — matches anything). A field the saved file lacks counts at :func:`~.grid.saved_defaults`.
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
    defaults = saved_defaults()
    for k, v in want.items():
        if k in BOOKKEEPING or (lenient and v is None):
            continue
        have = saved.get(k, defaults[k])
        if plain(have) != plain(v):
            return f"{k}={have!r} there but the sweep asks {k}={v!r}"
    return None


# --------------------------------------------------------------------------- one grid per root
@contextlib.contextmanager
def starting(root: Path, spec: dict) -> Iterator[dict]:
    """Hold ``root`` while a sweep of ``spec`` starts; yields the grid the root will hold.

    ``spec``: what ``sweep.json`` records, ``{"base", "grid", "seeds"}`` (a notebook grid:
    ``{"notebook", "parameters", "grid", "seeds"}``). Raises :class:`FeddrKitError` naming both grids
    when ``root/sweep.json`` holds another one (:func:`other_grid`), or when it cannot be read. The
    block checks the run folders; on a normal exit ``sweep.json`` is written: ``spec`` joined with the
    grid already there (values and seeds in order of first appearance). The root's lock
    (:func:`feddr_kit.rundir.claim`) is held meanwhile, so of two sweeps started at once the second sees
    the first's grid; it is released before any run starts, so two sweeps of one grid share the work.
    """
    with _held(root):
        old = json_object(root / SWEEP) if (root / SWEEP).exists() else None
        joined = spec
        if old is not None:
            why = other_grid(old, spec)
            if why is not None:
                raise FeddrKitError(f"{root} holds the runs of another grid ({_grid_text(old)}), not this sweep's "
                                    f"({_grid_text(spec)}): {why}; runs of two grids in one root would be pooled as "
                                    "seeds of one setting, so give this sweep another root")
            joined = _joined(old, spec)
        yield joined
        if joined != old:
            write_json(root / SWEEP, joined)


def _held(root: Path) -> contextlib.ExitStack:
    """``root`` claimed (its ``.lock``), waiting up to :data:`ROOT_WAIT_S` while another sweep checks it."""
    deadline = time.monotonic() + ROOT_WAIT_S
    while True:
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(rundir.claim(root, resume=True, overwrite=False))  # resume: deletes no file
            return stack
        except BusyError:
            if time.monotonic() > deadline:
                raise


def other_grid(old: dict, new: dict) -> str | None:
    """Why a root whose ``sweep.json`` is ``old`` may not take a sweep of ``new`` (the first difference: the
    kind of grid, the fields varied, a fixed setting), or None when they differ only in the grid's values
    and the seeds."""
    if ("notebook" in old) != ("notebook" in new):
        return "one is a notebook grid, the other a grid of runs"
    fields_old, fields_new = list(old.get("grid") or {}), list(new.get("grid") or {})
    if sorted(fields_old) != sorted(fields_new):
        return (f"they vary different fields ({', '.join(fields_old) or 'none'} there, "
                f"{', '.join(fields_new) or 'none'} here)")
    fixed_old, fixed_new = _fixed(old), _fixed(new)
    for k in dict.fromkeys([*fixed_old, *fixed_new]):
        if fixed_old.get(k) != fixed_new.get(k):
            return f"{k}={fixed_old.get(k)!r} there but {k}={fixed_new.get(k)!r} here"
    return None


def _fixed(spec: dict) -> dict[str, Any]:
    """What every run of ``spec``'s grid shares: for a grid of runs every Config field the grid does not
    vary (at its default where the base leaves it; bookkeeping and seed left out), for a notebook grid
    the notebook's file name and the fixed parameters. A field the base leaves out counts at
    :func:`~.grid.saved_defaults` (a ``sweep.json`` written before ``channels_last``'s default changed holds
    NCHW runs; a sweep records that field since: :func:`~.grid.recorded_base`)."""
    grid = spec.get("grid") or {}
    if "notebook" in spec:
        params = {f"parameters.{k}": plain(v) for k, v in (spec.get("parameters") or {}).items()}
        return {"notebook": Path(str(spec["notebook"])).name, **params}
    base = {**saved_defaults(), **(spec.get("base") or {})}
    return {k: plain(v) for k, v in base.items() if k not in grid and k not in BOOKKEEPING and k not in ("seed", "out_dir")}


def _joined(old: dict, new: dict) -> dict:
    """``old`` with ``new``'s grid values and seeds added after its own."""
    grid = {}
    for k, values in (old.get("grid") or {}).items():
        seen = [plain(v) for v in values]
        grid[k] = list(values) + [v for v in new["grid"][k] if plain(v) not in seen]
    seeds = list(old.get("seeds") or [])
    return {**old, "grid": grid, "seeds": seeds + [s for s in new["seeds"] if s not in seeds]}


def _grid_text(spec: dict) -> str:
    return "grid " + json.dumps(spec.get("grid") or {}, ensure_ascii=False)
