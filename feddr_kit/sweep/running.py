"""Running a grid: every config of the grid × seeds into its own folder of a root, resumably (:func:`run_sweep`).

A sweep that is killed and started again finds its folders: finished runs (``summary.json``) are
skipped, interrupted ones (``checkpoint.pt`` without ``summary.json``) continue with the kit's exact
resume, and the rest start fresh. Each folder is prepared and run under its lock, so two sweeps on one
root share the work. ``jobs=N`` runs N at once, each in a process of its own (:mod:`feddr_kit.sweep.workers`);
the runs, the folders and the numbers are the same as one at a time.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from .. import progress as progress_mod
from .. import rundir
from ..clients import load_data
from ..config import Config
from ..data import ImageData
from ..errors import BusyError, FeddrKitError, StorageError
from ..federated import run as run_one
from ..rundir import CHECKPOINT, write_json, write_text
from . import workers
from .collecting import collect, in_grid_order, write_tables
from .grid import expand, plain, recorded_base, run_dir_name
from .root import CONFIG, DONE, ERROR, FAILED, HISTORY, POINT, mismatch, starting, status


def run_sweep(base: Mapping[str, Any] | Config, grid: Mapping[str, Sequence], seeds: Sequence[int],
              root: str | Path, *, data: ImageData | None = None, progress: bool = True,
              retry_failed: bool = False, callback=None, jobs: int = 1, threads: int | None = None) -> pd.DataFrame:
    """Run every config of :func:`feddr_kit.sweep.grid.expand` (``base``, ``grid``, ``seeds``) into ``root/<name>/``.

    Finished runs are skipped, interrupted ones resumed (``fk.run(cfg, resume=True)``), missing ones
    run; a folder that holds a different config is an error, raised before anything trains. A run
    that fails with ``FeddrKitError`` or ``FloatingPointError`` leaves ``error.txt`` and the sweep goes
    on; it is skipped next time unless ``retry_failed``. A result file that cannot be written (a full disk)
    stops the sweep with :class:`~feddr_kit.errors.StorageError` naming the file; that run is not marked
    failed, so the same call resumes it once there is room. The dataset is loaded once per distinct
    ``(dataset, data_path)`` (and process), or ``data`` is used for every run. ``callback(row)`` goes to
    every ``fk.run``. Writes ``root/sweep.json``; a root holds one grid: a sweep of another base, or
    varying other fields, is refused naming both grids (:func:`feddr_kit.sweep.root.starting`), while one
    that adds values or seeds to the same fields joins it. Returns :func:`feddr_kit.sweep.collecting.collect`
    of this sweep's folders, in sweep order. Safe to kill and call again. Each folder is prepared and run
    under its lock (:func:`feddr_kit.rundir.claim`), so two sweeps at once on one root (or a sweep meeting
    a folder that a run holds) never touch each other's folders: a held folder is skipped with a line
    saying so and is ``partial`` in the frame until its owner finishes it.

    ``jobs``: runs at once, each ``jobs > 1`` run in a process of its own (on CPU cores, or sharing one
    GPU: :func:`feddr_kit.sweep.workers.run_each`), the next one starting as one ends; every run is under its
    own lock and gives the numbers it gives alone with the same torch threads. ``threads``: torch threads
    per run; with ``jobs > 1`` it defaults to 1 per run (the runs share the cores; a run on 1 thread gives
    the same numbers on every machine's core count), with ``jobs=1`` to this process's setting. With
    ``jobs > 1`` a ``callback`` runs in the run's process, so it must be a module-level function.
    Ctrl-C stops every run, keeping its last checkpoint and releasing its folder. A script that calls this
    with ``jobs > 1`` must do so under ``if __name__ == "__main__":`` (each run's process imports it).
    ``progress``: one bar over the runs, one over the evaluated rounds of each run under way, and a line
    per finished run (bars in a terminal or notebook, lines elsewhere: :mod:`feddr_kit.progress`).
    """
    workers.exit_if_importing_main(jobs)  # before anything is touched or shown: see its docstring
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
    _check_jobs(jobs, threads, callback)

    spec = {"base": {k: plain(v) for k, v in recorded_base(base_d).items()},
            "grid": {k: [plain(v) for v in vs] for k, vs in grid.items()},
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
    todo = [(cfg, name, folder, retry_failed, callback) for cfg, name, folder, state in plan
            if state != DONE and (state != FAILED or retry_failed)]
    shown = _Shown(len(plan), [item[1] for item in todo], progress)
    if progress and len(todo) < len(plan):
        progress_mod.write(f"{len(plan) - len(todo)} of {len(plan)} runs already in {root} (done or failed): skipped")
    if jobs > 1:
        threads = 1 if threads is None else threads
        if progress and todo:
            progress_mod.write(f"{min(jobs, len(todo))} runs at once, each in a process of its own with {threads} torch "
                               "thread(s)")
        data = data.to("cpu") if data is not None else None  # handed to each process once
    try:
        workers.run_each(_run_folder, todo, jobs, threads=threads, setup=_Datasets, setup_args=(data,),
                         on_event=shown.event, on_result=shown.finished)
    finally:
        shown.close()
    write_tables(root)
    return in_grid_order(collect(root), names)


def _check_jobs(jobs: Any, threads: Any, callback) -> None:
    """One-line :class:`FeddrKitError` for a ``jobs`` or ``threads`` that is not a positive integer, or a
    ``callback`` that cannot reach the runs' processes."""
    workers.check_jobs(jobs, threads)
    if jobs > 1 and callback is not None:
        try:
            pickle.dumps(callback)
        except Exception as err:  # a lambda, a closure, a function defined in a notebook cell
            raise FeddrKitError(f"callback: with jobs > 1 it runs in each run's process, so it must be a module-level "
                                f"function ({type(err).__name__}: {str(err)[:80]})") from None


class _Datasets:
    """The data of a process's runs: ``data`` when given, else each ``(dataset, data_path)`` loaded once."""

    def __init__(self, data: ImageData | None):
        self.data, self.loaded = data, {}

    def __call__(self, cfg: Config) -> ImageData:
        if self.data is not None:
            return self.data
        key = (cfg.dataset, cfg.data_path)
        if key not in self.loaded:
            self.loaded[key] = load_data(cfg)
        return self.loaded[key]


def _run_folder(item: tuple, emit, datasets: _Datasets) -> str:
    """One run of the sweep, in whichever process runs it: its folder claimed, then the run (or the line
    saying another run holds the folder). Returns the line to show."""
    cfg, name, folder, retry_failed, callback = item
    try:
        with rundir.claim(folder, resume=True, overwrite=False):  # nothing in the folder is touched before
            emit(("start", cfg.rounds))

            def report(row: dict) -> None:
                emit(("round", int(row["round"]), float(row["test_acc"])))
                if callback is not None:
                    callback(row)

            return _run_point(cfg, name, folder, retry_failed, datasets, report)
    except BusyError as err:  # another sweep or run holds it: left to that one, untouched
        return f"{name}: skipped, {err}"


def _run_point(cfg: Config, name: str, folder: Path, retry_failed: bool, datasets: _Datasets, callback) -> str:
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
    try:
        result = run_one(cfg.replace(out_dir=str(folder), progress=False), resume=resume, claim=False,
                         data=datasets(cfg), callback=callback)
    except StorageError:  # not the run's fault: left unmarked, so the next sweep resumes it once there is room
        raise
    except (FeddrKitError, FloatingPointError) as err:
        write_text(folder / ERROR, f"{type(err).__name__}: {err}\n")
        return f"{name}: failed ({type(err).__name__}: {err})"
    return f"{name}: {'resumed, ' if resume else ''}final accuracy {result.summary['final_acc']:.2%}"


class _Shown:
    """What a sweep shows while it runs: a bar over its runs, one over the evaluated rounds of each run under
    way (opened when the run holds its folder, closed when it ends), and a line per finished run."""

    def __init__(self, total: int, names: list[str], show: bool):
        self.names, self.show = names, show
        self.bar = progress_mod.bar(total, "sweep", unit="runs", initial=total - len(names), disable=not show)
        self.runs: dict[int, Any] = {}  # index -> [display, rounds shown]

    def event(self, index: int, event: tuple) -> None:
        """A run's event: ``("start", rounds)`` or ``("round", round, test_acc)`` (an evaluated round)."""
        if event[0] == "start":
            self.runs[index] = [progress_mod.bar(event[1], self.names[index], unit="rounds", leave=False,
                                                 disable=not self.show), 0]
        elif event[0] == "round" and index in self.runs:
            display, at = self.runs[index]
            display.set_postfix(test_acc=f"{event[2]:.2%}")
            display.update(event[1] - at)
            self.runs[index][1] = event[1]

    def finished(self, index: int, line: str) -> None:
        """A run ended with ``line``."""
        if index in self.runs:
            self.runs.pop(index)[0].close()
        if self.show:
            progress_mod.write(line)
        self.bar.update(1)

    def close(self) -> None:
        """Close every display (the runs' first: a run interrupted leaves its bar open)."""
        for display, _ in self.runs.values():
            display.close()
        self.runs.clear()
        self.bar.close()
