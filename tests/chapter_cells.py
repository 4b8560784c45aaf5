"""Helpers for the tests that execute a results chapter's cells (05-08) in a subprocess.

The chapters run with notebooks/ as their working directory (JupyterLab, nbconvert, papermill) and
change ``sys.path`` to import their sweep script's constants, so a test runs their cells in a fresh
interpreter, from notebooks/, the repository root or any other folder.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def cifar10_available() -> bool:
    """True when $FEDDR_DATA_DIR (tests/conftest.py sets it) holds CIFAR-10. Here rather than imported from
    conftest: pytest also collects notebooks/conftest.py, so ``from conftest import`` is ambiguous."""
    root = Path(os.environ.get("FEDDR_DATA_DIR", NOTEBOOKS.parent / "data"))
    return (root / "cifar-10-batches-py").is_dir() or (root / "cifar10-jpeg").is_dir()


def notebook(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4)


def code(chapter: str) -> list[str]:
    """The sources of the chapter's code cells, in order."""
    return [c.source for c in notebook(chapter).cells if c.cell_type == "code"]


def markdown(chapter: str) -> str:
    """The chapter's Markdown cells, joined."""
    return "\n".join(c.source for c in notebook(chapter).cells if c.cell_type == "markdown")


def run(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -c script`` from ``cwd`` with the repository importable and a non-interactive matplotlib."""
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(NOTEBOOKS.parent)}
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def exec_cells(sources: list[str], tail: str) -> str:
    """A script that runs ``sources`` (notebook cells) in one namespace ``ns``, then ``tail``."""
    return "ns = {}\n" + "".join(f"exec(compile({s!r}, 'cell {i}', 'exec'), ns)\n" for i, s in enumerate(sources)) + tail


def until_slice(chapter: str, overrides: str = "", marker: str = "slice_") -> list[str]:
    """The code cells before the live slice (the first cell starting with ``marker``), with ``overrides``
    (parameter lines) run right after the parameters cell."""
    cells = code(chapter)
    stop = next(i for i, s in enumerate(cells) if s.startswith(marker))
    return [cells[0], overrides, *cells[1:stop]]
