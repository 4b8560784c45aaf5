"""Sweeps: a grid over ``Config`` fields × seeds, one resumable folder per run, and the paper's tables.

::

    df = fk.sweep.run({"dataset": "cifar10", "rounds": 20}, {"algorithm": ["fedavg", "feddr+"]},
                      seeds=[0, 1, 2], root="runs/table3")
    fk.sweep.table(df, rows="algorithm")            # "45.1 ± 1.2 (n=3)" per cell

This package's ``__init__`` is its face: ``fk.sweep.<name>`` for every public name of the modules that do
the work, one job each:

* :mod:`feddr_kit.sweep.grid`: the grid's configs (:func:`expand`) and each run's folder name
  (:func:`run_dir_name`: the grid's fields, then the seed, ``algorithm=feddr+__shards_per_client=5__seed=1``);
* :mod:`feddr_kit.sweep.root`: a root's files and the state of each run folder;
* :mod:`feddr_kit.sweep.running`: running a grid (:func:`run`), resumably: finished runs are skipped,
  interrupted ones continue with the kit's exact resume, ``jobs=N`` runs N at once in processes of
  their own; ``root/sweep.json`` records the root's one grid (:mod:`feddr_kit.sweep.root` refuses another);
* :mod:`feddr_kit.sweep.collecting`: the results gathered (:func:`collect`, :func:`histories`) and tabulated
  over seeds (:func:`table`, :func:`interval_summary`, the root's ``runs.csv`` and ``table.csv``);
* :mod:`feddr_kit.sweep.claims`: the chapters' claims over seeds (:func:`read_results`, :func:`intervals`,
  :func:`interval_table`, :func:`seed_values`, :func:`paired_difference`, :func:`baseline_columns`);
* :mod:`feddr_kit.sweep.notebooks`: a notebook executed per grid point under papermill
  (:func:`run_notebook_grid`, :func:`collect_notebooks`);
* :mod:`feddr_kit.sweep.workers`: the processes ``jobs=N`` runs its runs in, side by side;
* :mod:`feddr_kit.sweep.cli`: ``python -m feddr_kit sweep --grid grid.json --root runs/x`` with
  ``grid.json = {"base": {...}, "grid": {"field": [values, ...]}, "seeds": [0, 1, 2]}``.
"""
from __future__ import annotations

from .claims import (RESULT_COLUMNS, baseline_columns, fields_from_name, interval_table, intervals,
                     paired_difference, read_results, seed_values)
from .cli import add_parser, load_grid_file, main
from .collecting import collect, histories, interval_summary, table, write_tables
from .grid import BOOKKEEPING, MAX_NAME, TEACHING_SCALE, expand, run_dir_name
from .notebooks import collect_notebooks, run_notebook_grid
from .root import (CONFIG, DONE, ERROR, FAILED, HISTORY, PARTIAL, POINT, RESULTS, RUNS, SUMMARY, SWEEP, TABLE,
                   UNREADABLE)
from .running import run_sweep

run = run_sweep  # fk.sweep.run

__all__ = ["run", "run_sweep", "expand", "run_dir_name", "TEACHING_SCALE", "BOOKKEEPING", "MAX_NAME",
           "collect", "histories", "table", "interval_summary", "write_tables",
           "read_results", "fields_from_name", "RESULT_COLUMNS", "seed_values", "paired_difference",
           "baseline_columns", "intervals", "interval_table", "run_notebook_grid", "collect_notebooks",
           "add_parser", "load_grid_file", "main",
           "SUMMARY", "CONFIG", "HISTORY", "ERROR", "POINT", "SWEEP", "RESULTS", "TABLE", "RUNS",
           "DONE", "PARTIAL", "FAILED", "UNREADABLE"]
