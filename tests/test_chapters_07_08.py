"""Chapters 07 and 08 read the archived old-scale evidence (results/old_scale/), found from the
notebook's working directory, and keep their prose's claims tied to it.

The chapters run with notebooks/ as their working directory (JupyterLab, nbconvert, papermill), so
they find results/ as ``Path.cwd().parent / "results"``; these tests execute their setup cells in a
subprocess (the cells change ``sys.path`` and import the archived scripts) from there and from a
folder with no results/ beside it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def cifar10_available() -> bool:
    """True when $FEDDR_DATA_DIR (set by conftest.py) holds CIFAR-10."""
    root = Path(os.environ.get("FEDDR_DATA_DIR", NOTEBOOKS.parent / "data"))
    return (root / "cifar-10-batches-py").is_dir() or (root / "cifar10-jpeg").is_dir()

CHAPTERS = {"07_sensitivity": "ch07_sensitivity", "08_personalization": "ch08_personalization"}


def _cells(chapter: str) -> list[str]:
    nb = nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(NOTEBOOKS.parent)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _exec_cells(sources: list[str], tail: str) -> str:
    """A script that runs ``sources`` (notebook cells) in one namespace, then ``tail``."""
    return "ns = {}\n" + "".join(f"exec(compile({s!r}, 'cell {i}', 'exec'), ns)\n" for i, s in enumerate(sources)) + tail


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_finds_the_archived_script_and_csvs_from_notebooks(chapter):
    params, setup = _cells(chapter)[:2]
    tail = textwrap.dedent("""
        import json
        csv = ns["csv"] if "csv" in ns else ns["results_csv"]
        print(json.dumps({"script": ns["script"].__file__, "csv": str(csv), "exists": csv.is_file(),
                          "sweeps": ns["_sweeps"].__file__}))
    """)
    out = _run(_exec_cells([params, setup], tail), NOTEBOOKS)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    old = NOTEBOOKS.parent / "results" / "old_scale"
    assert Path(got["script"]).resolve() == old / f"{CHAPTERS[chapter]}.py"
    assert Path(got["csv"]).resolve() == old / f"{CHAPTERS[chapter]}.csv" and got["exists"]
    assert Path(got["sweeps"]).resolve() == NOTEBOOKS.parent / "results" / "_sweeps.py"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_without_results_beside_it_says_so_in_one_line(chapter, tmp_path):
    params, setup = _cells(chapter)[:2]
    (tmp_path / "notebooks").mkdir()
    out = _run(_exec_cells([params, setup], ""), tmp_path / "notebooks")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("FileNotFoundError: ") and "old_scale not found" in last and "notebooks/" in last


def test_chapter_07_claims_table_leads_with_its_verdicts_and_pins_its_prose():
    """The cells up to the live slice (no training): the claims table is sorted held, did not hold, ties,
    untestable, and the cell that pins the prose's numbers passes on the archived CSV."""
    cells = _cells("07_sensitivity")
    stop = next(i for i, s in enumerate(cells) if s.startswith("slice_base"))
    tail = "import json; print(json.dumps(list(ns['claims_table']['verdict'])))"
    out = _run(_exec_cells(cells[:stop], "\n" + tail), NOTEBOOKS)
    assert out.returncode == 0, out.stderr
    verdicts = json.loads(out.stdout.strip().splitlines()[-1])
    order = ["held", "did not hold", "tie (within the interval)", "untestable here"]
    ranks = [order.index(v) for v in verdicts]
    assert ranks == sorted(ranks) and ranks[0] < 2, verdicts


@pytest.mark.slow
@pytest.mark.skipif(not cifar10_available(), reason="real CIFAR-10 not in FEDDR_DATA_DIR")
def test_chapter_08_live_slice_under_papermill(tmp_path):
    """Slow (1-3 min on 2 CPU cores): chapter 08's rerun path (old-scale global runs of 1 round,
    fine-tuned as the archived script did) executes end to end, skipping the prose's pins."""
    import papermill

    out = tmp_path / "08.ipynb"
    papermill.execute_notebook(str(NOTEBOOKS / "08_personalization.ipynb"), str(out),
                               parameters={"rerun": True, "rerun_rounds": 1, "demo_rounds": 1},
                               cwd=str(NOTEBOOKS), kernel_name="python3", progress_bar=False)
    nb = nbformat.read(out, as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "2 (setting, method, seed) cells, 200 client rows" in text
