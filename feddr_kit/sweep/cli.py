"""``python -m feddr_kit sweep --grid grid.json --root runs/x``: a grid run from a file, and its table printed.

``grid.json = {"base": {...}, "grid": {"field": [values, ...]}, "seeds": [0, 1, 2]}`` (or YAML).
"""
from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from ..config import read_mapping
from ..errors import FeddrKitError, report
from .collecting import table
from .root import DONE, FAILED, PARTIAL, RUNS, TABLE, UNREADABLE
from .running import run_sweep
from .workers import default_jobs


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sweep`` subcommand to ``python -m feddr_kit``'s subparsers; returns its parser."""
    p = subparsers.add_parser(
        "sweep", allow_abbrev=False, help="run a grid of configs x seeds, resumably, and print the table",
        description="Run every grid point x seed into ROOT/<name>/ (finished runs are skipped, interrupted "
                    "ones resumed), print mean ± std over seeds, and write ROOT/runs.csv and ROOT/table.csv. GRID is "
                    'a JSON or YAML file {"base": {<Config fields>}, "grid": {"<field>": [values, ...]}, "seeds": [0, 1, 2]}. '
                    "The base, later winning: the --config file, the grid file's base, the Config flags typed. "
                    "--jobs N runs N at once; Ctrl-C stops them all, and the same command continues.")
    p.add_argument("--grid", required=True, help="the grid file (JSON or YAML)")
    p.add_argument("--root", required=True, help="folder that holds one subfolder per run")
    p.add_argument("--value", default="final_acc", help="summary field shown in the table")
    p.add_argument("--retry-failed", action="store_true", help="run again the runs that left error.txt")
    p.add_argument("--no-progress", action="store_true", help="no progress bar and per-run lines")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="runs at once, each in a process of its own (CPU cores, or processes sharing one GPU); "
                        "default: one per CPU core on the CPU, the fastest measured there, and 1 on a GPU")
    p.add_argument("--threads", type=int, default=None, metavar="T",
                   help="torch threads per run (default: 1 per run with --jobs above 1, else torch's default)")
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
    read, are held by another run, or lost their process (killed, out of memory), 2 on bad input, 3 when a
    result file could not be written (a full disk; that run stays resumable). SIGTERM is taken as Ctrl-C:
    ``KeyboardInterrupt``, every run released (the caller says so and returns 130)."""
    try:
        base, grid, seeds = load_grid_file(args["grid"])
        # the --config file under the grid file's base, under the Config flags typed
        base = {**args.get("base_file", {}), **base, **args.get("base_flags", {})}
        jobs = args.get("jobs")
        if jobs is None:  # the grid may vary the device: one run at a time if any run is on a GPU
            devices = list(grid.get("device") or []) or [base.get("device", "auto")]
            jobs = min(default_jobs(str(d)) for d in devices)
        with _sigterm_as_interrupt():
            df = run_sweep(base, grid, seeds, args["root"], progress=not args.get("no_progress", False),
                           retry_failed=args.get("retry_failed", False), jobs=jobs,
                           threads=args.get("threads"))
    except FeddrKitError as err:  # a lost process is 1 (WorkerLostError), a full disk 3, bad input 2
        return report(err)
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


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises ``KeyboardInterrupt`` in the block, as Ctrl-C does, so a sweep stopped by a scheduler or
    ``kill`` releases its runs and ends with its exit code instead of dying mid-write (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt
