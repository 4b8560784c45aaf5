"""Notebook grids: a notebook executed under papermill once per grid point × seed, each into its own folder
of a root, with the sweep's folders-and-skip scheme (:func:`run_notebook_grid`), and the ``results.json``
each execution wrote gathered into one frame (:func:`collect_notebooks`).
"""
from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pandas as pd

from .. import progress as progress_mod
from ..errors import FeddrKitError
from ..rundir import write_json, write_text
from .collecting import in_grid_order
from .grid import check_grid, name_from, plain, points
from .root import DONE, ERROR, FAILED, PARTIAL, POINT, RESULTS, UNREADABLE, hashable, json_object, starting


def run_notebook_grid(notebook: str | Path, grid: Mapping[str, Sequence], seeds: Sequence[int], root: str | Path,
                      parameters: Mapping[str, Any] | None = None, *, kernel_name: str = "python3",
                      cwd: str | Path | None = None, progress: bool = True, retry_failed: bool = False) -> pd.DataFrame:
    """Execute ``notebook`` once per grid point × seed under papermill, each into ``root/<name>/``.

    Each execution gets ``parameters`` (fixed ones) updated with the point's values, ``seed`` and
    ``out_dir=<its folder>``; the notebook must write ``results.json`` into ``out_dir``. The
    executed copy is saved as ``<folder>/notebook.ipynb``. Points whose ``results.json`` exists are
    skipped; a point whose execution raises (or writes no ``results.json``) leaves ``error.txt``
    and the grid goes on (retried only with ``retry_failed``). A root holds one grid: another notebook,
    other fixed parameters or other fields varied are refused, naming both grids. ``<name>`` spells every grid field
    and the seed (as :func:`feddr_kit.sweep.grid.run_dir_name` does). ``cwd``: the kernel's working folder
    (default: the notebook's). Returns :func:`collect_notebooks` of this grid's folders, in grid order.
    """
    import papermill

    notebook, root = Path(notebook), Path(root)
    if not notebook.is_file():
        raise FeddrKitError(f"notebook must be an existing .ipynb file, got {notebook}")
    check_grid(grid, seeds)
    fixed = dict(parameters or {})
    for reserved in ("seed", "out_dir"):
        if reserved in grid or reserved in fixed:
            raise FeddrKitError(f"{reserved} is set by the grid runner; leave it out of grid and parameters")
    todo_points = points(grid, seeds)
    names = [name_from(sorted(p.items()) + [("seed", s)]) for p, s in todo_points]
    with starting(root, {"notebook": str(notebook), "parameters": {k: plain(v) for k, v in fixed.items()},
                         "grid": {k: [plain(v) for v in vs] for k, vs in grid.items()}, "seeds": [int(s) for s in seeds]}):
        pass  # one grid per root, as for a sweep of runs (feddr_kit.sweep.root.starting)
    todo = [(p, s, n) for (p, s), n in zip(todo_points, names)
            if not (root / n / RESULTS).exists() and (retry_failed or not (root / n / ERROR).exists())]
    bar = progress_mod.bar(len(todo_points), "notebook grid", unit="runs", initial=len(todo_points) - len(todo),
                           disable=not progress)
    # the kernels papermill starts inherit this process's environment: progress as plain lines, which the
    # executed notebook keeps, not widgets it cannot render (unless the caller chose otherwise)
    with _environment(FEDDR_PROGRESS=os.environ.get("FEDDR_PROGRESS", "lines")):
        for point, seed, name in todo:
            folder = root / name
            (folder / ERROR).unlink(missing_ok=True)
            params = {**fixed, **{k: plain(v) for k, v in point.items()}, "seed": seed}
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
    return in_grid_order(collect_notebooks(root), names)


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
        state = DONE if (folder / RESULTS).exists() else FAILED if (folder / ERROR).exists() else PARTIAL
        row: dict[str, Any] = {"name": folder.name, "status": state}
        try:
            row.update({k: hashable(v) for k, v in json_object(folder / POINT).get("parameters", {}).items()})
            if state == DONE:
                body = {k: v for k, v in json_object(folder / RESULTS).items() if k != "units"}  # text, not results
                flat = pd.json_normalize(body, sep=".")
                row.update({k: hashable(v) for k, v in flat.iloc[0].to_dict().items()} if len(flat) else {})
        except FeddrKitError as err:  # one broken file costs its own row, not the table
            unreadable.append(f"{folder.name} ({err})")
            row = {"name": folder.name, "status": UNREADABLE, "error": str(err)}
        if state == FAILED and row["status"] == FAILED:
            row["error"] = (folder / ERROR).read_text(errors="replace").strip()
        rows.append(row)
    if unreadable:
        warnings.warn(f"left out {len(unreadable)} notebook run folder(s) whose files cannot be read: "
                      f"{'; '.join(unreadable)}", stacklevel=2)
    return pd.DataFrame(rows)
