"""What every results chapter (05-08) does alike: it finds its sweep script and CSVs in results/ from
notebooks/ (from elsewhere, and when there is no repository: test_chapter_paths.py), says no word of the
old scale (the small cnn of the first sweeps, now deleted), and its script starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chapter_cells import NOTEBOOKS, code, exec_cells, notebook, run

SCRIPTS = {"05_nine_algorithms": "ch05_algorithms", "06_regularizer_synergy": "ch06_synergy",
           "07_sensitivity": "ch07_sensitivity", "08_personalization": "ch08_personalization"}


@pytest.mark.parametrize("chapter", SCRIPTS)
def test_chapter_finds_its_script_and_csvs_from_notebooks(chapter):
    params, setup = code(chapter)[:2]
    tail = textwrap.dedent("""
        import json
        from pathlib import Path
        csv = Path(ns["csv"] if "csv" in ns else ns["results_csv"])
        print(json.dumps({"script": ns["script"].__file__, "csv": str(csv), "exists": csv.is_file(),
                          "sweeps": ns["_sweeps"].__file__}))
    """)
    out = run(exec_cells([params, setup], tail), NOTEBOOKS)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    where = NOTEBOOKS.parent / "results"
    assert Path(got["script"]).resolve() == where / f"{SCRIPTS[chapter]}.py"
    assert Path(got["csv"]).resolve() == where / f"{SCRIPTS[chapter]}.csv" and got["exists"]
    assert Path(got["sweeps"]).resolve() == NOTEBOOKS.parent / "results" / "_sweeps.py"


@pytest.mark.parametrize("chapter", SCRIPTS)
def test_chapter_says_no_word_of_the_old_scale(chapter):
    text = "\n".join(c.source for c in notebook(chapter).cells)
    assert "old_scale" not in text and "SWEEP_SCALE" not in text and "Old-scale" not in text


@pytest.mark.parametrize("chapter", SCRIPTS)
def test_sweep_script_starts(chapter):
    """Each chapter's sweep script parses its command line (``--help`` does nothing else)."""
    results = NOTEBOOKS.parent / "results"
    env = {**os.environ, "PYTHONPATH": str(NOTEBOOKS.parent)}  # as a user starts it, from the repository root
    out = subprocess.run([sys.executable, str(results / f"{SCRIPTS[chapter]}.py"), "--help"], cwd=NOTEBOOKS.parent,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout and "archived" not in out.stdout + out.stderr
