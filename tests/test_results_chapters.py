"""What every results chapter (05-08) does alike: it finds its sweep script and CSVs from notebooks/, says
in one line when results/ is not beside it, and, while its evidence is the archived old-scale sweep,
says so at the top with its new-scale sweep's progress."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chapter_cells import NOTEBOOKS, code, exec_cells, notebook, run

SCRIPTS = {"05_nine_algorithms": "ch05_algorithms", "06_regularizer_synergy": "ch06_synergy",
           "07_sensitivity": "ch07_sensitivity", "08_personalization": "ch08_personalization"}
# where each chapter's script and CSV live: results/ once its teaching-scale sweep is complete
EVIDENCE = {"05_nine_algorithms": "", "06_regularizer_synergy": "", "07_sensitivity": "old_scale",
            "08_personalization": ""}
OLD_SCALE = [c for c, where in EVIDENCE.items() if where == "old_scale"]


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
    where = NOTEBOOKS.parent / "results" / EVIDENCE[chapter]
    assert Path(got["script"]).resolve() == where / f"{SCRIPTS[chapter]}.py"
    assert Path(got["csv"]).resolve() == where / f"{SCRIPTS[chapter]}.csv" and got["exists"]
    assert Path(got["sweeps"]).resolve() == NOTEBOOKS.parent / "results" / "_sweeps.py"


@pytest.mark.parametrize("chapter", SCRIPTS)
def test_chapter_without_results_beside_it_says_so_in_one_line(chapter, tmp_path):
    params, setup = code(chapter)[:2]
    (tmp_path / "notebooks").mkdir()
    out = run(exec_cells([params, setup], ""), tmp_path / "notebooks")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("FileNotFoundError: ") and " not found" in last and "notebooks/" in last
    assert (EVIDENCE[chapter] or SCRIPTS[chapter]) in last


@pytest.mark.parametrize("chapter", OLD_SCALE)
def test_old_scale_banner_and_new_sweep_progress_near_the_top(chapter):
    cells = notebook(chapter).cells
    top = "\n".join(c.source for c in cells[:8])
    assert "**Old-scale evidence.**" in top
    progress = next(c for c in cells[:8] if f'_sweeps.progress("{SCRIPTS[chapter]}")' in c.source)
    printed = "".join(o.get("text", "") for o in progress.outputs)
    assert re.search(r"new-scale sweep \(results/runs/\w+\): (\d+ of \d+ runs finished|not started)", printed), printed


@pytest.mark.parametrize("chapter", SCRIPTS)
def test_sweep_script_starts_and_its_archive_refuses(chapter):
    """Each chapter's sweep script parses its command line (``--help`` does nothing else), while an
    archived old-scale script, if one is left, refuses to run: its runs would land in the new sweep's folders."""
    results = NOTEBOOKS.parent / "results"

    def start(path, *args):  # as a user starts it, with results/ importable for the archive's imports
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(NOTEBOOKS.parent), str(results)])}
        return subprocess.run([sys.executable, str(path), *args], cwd=NOTEBOOKS.parent, env=env, capture_output=True,
                              text=True, timeout=300)

    out = start(results / f"{SCRIPTS[chapter]}.py", "--help")
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout and "archived" not in out.stdout + out.stderr
    archived = results / "old_scale" / f"{SCRIPTS[chapter]}.py"
    if archived.is_file():
        out = start(archived)
        assert out.returncode != 0 and "is archived" in out.stderr
