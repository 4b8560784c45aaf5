"""Chapters 05 and 06 while their evidence is the archived old-scale sweep (results/old_scale/).

They find results/ from the notebook's working directory (``Path.cwd().parent / "results"``: JupyterLab,
nbconvert and papermill run a chapter from notebooks/), import the archived scripts' constants, say at
the top that the evidence is old-scale and how far the new-scale sweep is, name the paper's tables by
label, drive every exercise through a parameter, and flag comparisons against a baseline that has not
been shown to learn. The cells are executed in a subprocess (they change ``sys.path`` and import the
archived scripts), up to the live slice, so nothing trains.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CHAPTERS = {"05_nine_algorithms": "ch05_algorithms", "06_regularizer_synergy": "ch06_synergy"}


def _nb(chapter: str):
    return nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4)


def _code(chapter: str) -> list[str]:
    return [c.source for c in _nb(chapter).cells if c.cell_type == "code"]


def _markdown(chapter: str) -> str:
    return "\n".join(c.source for c in _nb(chapter).cells if c.cell_type == "markdown")


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(NOTEBOOKS.parent)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _exec_cells(sources: list[str], tail: str) -> str:
    """A script that runs ``sources`` (notebook cells) in one namespace, then ``tail``."""
    return "ns = {}\n" + "".join(f"exec(compile({s!r}, 'cell {i}', 'exec'), ns)\n" for i, s in enumerate(sources)) + tail


def _until_slice(chapter: str, overrides: str = "") -> list[str]:
    """The code cells before the live slice, with ``overrides`` (parameter lines) after the parameters cell."""
    cells = _code(chapter)
    stop = next(i for i, s in enumerate(cells) if s.startswith("slice_"))
    return [cells[0], overrides, *cells[1:stop]]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_finds_the_archived_script_and_csvs_from_notebooks(chapter):
    params, setup = _code(chapter)[:2]
    tail = ("import json; print(json.dumps({'script': ns['script'].__file__, 'csv': str(ns['csv']), "
            "'sweeps': ns['_sweeps'].__file__}))")
    out = _run(_exec_cells([params, setup], tail), NOTEBOOKS)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    old = NOTEBOOKS.parent / "results" / "old_scale"
    assert Path(got["script"]).resolve() == old / f"{CHAPTERS[chapter]}.py"
    assert Path(got["csv"]).resolve() == old / f"{CHAPTERS[chapter]}.csv"
    assert Path(got["sweeps"]).resolve() == NOTEBOOKS.parent / "results" / "_sweeps.py"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_without_results_beside_it_says_so_in_one_line(chapter, tmp_path):
    params, setup = _code(chapter)[:2]
    (tmp_path / "notebooks").mkdir()
    out = _run(_exec_cells([params, setup], ""), tmp_path / "notebooks")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("FileNotFoundError: ") and "old_scale not found" in last and "notebooks/" in last


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_old_scale_banner_and_new_sweep_progress_near_the_top(chapter):
    cells = _nb(chapter).cells
    top = "\n".join(c.source for c in cells[:6])
    assert "**Old-scale evidence.**" in top and "cannot show the paper's feature-distillation" in top
    progress = next(c for c in cells[:6] if f'_sweeps.progress("{CHAPTERS[chapter]}")' in c.source)
    printed = "".join(o.get("text", "") for o in progress.outputs)
    assert re.fullmatch(r"new-scale sweep \(results/runs/\w+\): (\d+ of \d+ runs finished|not started)\n", printed), printed


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_paper_tables_named_by_label_and_no_revision_history(chapter):
    text = _markdown(chapter)
    assert not re.search(r"\bTable \d", text), "name the paper's tables by label or caption, not by number"
    assert "`tab:" in text
    assert not re.search(r"(first|earlier|previous) version", text, re.IGNORECASE)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_exercises_set_parameters_only(chapter):
    params = {s.targets[0].id for s in ast.parse(_code(chapter)[0]).body}
    text = _markdown(chapter)
    exercises = text[text.index("## Exercises"):]
    assigned = re.findall(r"`(\w+) = [^`]+`", exercises)
    assert assigned and set(assigned) <= params, set(assigned) - params
    assert "slice_base" not in exercises and "runs/" not in exercises  # nothing a fresh clone lacks


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_claims_name_their_baseline_and_the_prose_pins_pass(chapter):
    """Every claim row says whether its baseline is shown above chance, computed from the CSV; at the
    defaults the cell that pins the prose's verdicts passes."""
    tail = ("import json; t = ns['claims_table']; print(json.dumps([list(t['verdict']), "
            "list(t['baseline above chance?'])]))")
    out = _run(_exec_cells(_until_slice(chapter), tail), NOTEBOOKS)
    assert out.returncode == 0, out.stderr
    verdicts, above = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(above) == {"yes", "no: reaches chance"} and len(above) == len(verdicts)


def test_chapter_05_seeds_parameter_keeps_only_those_seeds():
    """Exercise 2: two seeds widen the intervals (t quantile 12.71) and flag more baselines."""
    tail = ("import json; t = ns['claims_table']; print(json.dumps([sorted(set(ns['runs']['seed'])), "
            "int((t['baseline above chance?'] != 'yes').sum()), int(ns['expected'])]))")
    default = _run(_exec_cells(_until_slice("05_nine_algorithms"), tail), NOTEBOOKS)
    two = _run(_exec_cells(_until_slice("05_nine_algorithms", "seeds = [0, 1]"), tail), NOTEBOOKS)
    assert default.returncode == 0 and two.returncode == 0, default.stderr + two.stderr
    (seeds3, flagged3, expected3), (seeds2, flagged2, expected2) = (json.loads(o.stdout.strip().splitlines()[-1])
                                                                    for o in (default, two))
    assert seeds3 == [0, 1, 2] and seeds2 == [0, 1] and expected2 == expected3 * 2 // 3
    assert flagged2 >= flagged3
