"""Running a grid: every config of the grid × seeds into its own folder of a root, resumably (:func:`run_sweep`).

A sweep that is killed and started again finds its folders: finished runs (``summary.json``) are
skipped, interrupted ones (``checkpoint.pt`` without ``summary.json``) continue with the kit's exact
resume, and the rest start fresh. Each folder is prepared and run under its lock, so two sweeps on one
root share the work.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from . import progress as progress_mod
from . import rundir
from .clients import load_data
from .config import Config
from .data import ImageData
from .errors import BusyError, FeddrKitError
from .federated import run as run_one
from .rundir import CHECKPOINT, write_json, write_text
from .sweep_collect import collect, in_grid_order, write_tables
from .sweep_grid import expand, plain, run_dir_name
from .sweep_root import CONFIG, DONE, ERROR, FAILED, HISTORY, POINT, mismatch, starting, status


def run_sweep(base: Mapping[str, Any] | Config, grid: Mapping[str, Sequence], seeds: Sequence[int],
              root: str | Path, *, data: ImageData | None = None, progress: bool = True,
              retry_failed: bool = False, callback=None) -> pd.DataFrame:
    """Run every config of :func:`feddr_kit.sweep_grid.expand` (``base``, ``grid``, ``seeds``) into ``root/<name>/``.

    Finished runs are skipped, interrupted ones resumed (``fk.run(cfg, resume=True)``), missing ones
    run; a folder that holds a different config is an error, raised before anything trains. A run
    that fails with ``FeddrKitError`` or ``FloatingPointError`` leaves ``error.txt`` and the sweep goes
    on; it is skipped next time unless ``retry_failed``. The dataset is loaded once per distinct
    ``(dataset, data_path)``, or ``data`` is used for every run. ``progress``: one bar over the runs
    and a line per run (the runs' own bars are off). ``callback`` goes to every ``fk.run``.
    Writes ``root/sweep.json``; a root holds one grid: a sweep of another base, or varying other fields,
    is refused naming both grids (:func:`feddr_kit.sweep_root.starting`), while one that adds values or
    seeds to the same fields joins it. Returns :func:`feddr_kit.sweep_collect.collect` of this sweep's folders, in
    sweep order. Safe to kill and call again. Each folder is prepared and run under its lock
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

    spec = {"base": {k: plain(v) for k, v in base_d.items()}, "grid": {k: [plain(v) for v in vs] for k, vs in grid.items()},
            "seeds": [int(s) for s in seeds]}
    with starting(root, spec):  # one grid per root: refuses another; records this one once the folders pass
        plan = []
        for cfg, name in zip(configs, names):
            folder = root / name
            state = status(folder)
            if state is not None:
                why = mismatch(folder, cfg)
                if why is not None:
                    raise FeddrKitError(f"{folder} holds another run ({why}); use a new root or delete that folder")
            plan.append((cfg, name, folder, state))
    todo = [p for p in plan if p[3] != DONE and (p[3] != FAILED or retry_failed)]
    bar = progress_mod.bar(len(plan), "sweep", unit="runs", initial=len(plan) - len(todo), disable=not progress)
    if progress and len(todo) < len(plan):
        progress_mod.write(f"{len(plan) - len(todo)} of {len(plan)} runs already in {root} (done or failed): skipped")
    cache: dict[tuple, ImageData] = {}
    for cfg, name, folder, _ in todo:
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
    return in_grid_order(collect(root), names)


def _run_point(cfg: Config, name: str, folder: Path, retry_failed: bool, data: ImageData | None,
               cache: dict[tuple, ImageData], callback) -> str:
    """Run (or resume) one grid point in ``folder``, which the caller holds; returns the line to show.

    The folder's state is read again under the lock: another sweep may have finished it meanwhile.
    """
    state = status(folder)
    if state == DONE or (state == FAILED and not retry_failed):
        return f"{name}: {state} meanwhile (by another sweep): skipped"
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
