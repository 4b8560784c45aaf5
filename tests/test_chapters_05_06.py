"""Chapters 05 and 06 name the paper's tables by label, drive every exercise through a parameter, and
flag comparisons against a baseline that has not been shown to learn; both read their complete
teaching-scale sweeps. The cells are executed in a subprocess (they change ``sys.path`` and import the
sweep scripts), up to the live slice, so nothing trains. What every results chapter does alike is in
test_results_chapters.py.
"""
from __future__ import annotations

import ast
import json
import re
import textwrap

import pytest

from chapter_cells import NOTEBOOKS, code as _code, exec_cells as _exec_cells, markdown as _markdown, \
    run as _run, until_slice as _until_slice

CHAPTERS = ["05_nine_algorithms", "06_regularizer_synergy"]


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
    assert above and set(above) <= {"yes", "no: reaches chance"} and len(above) == len(verdicts)


@pytest.mark.parametrize("chapter, runs", [("05_nine_algorithms", 54), ("06_regularizer_synergy", 42)])
def test_chapter_reads_the_teaching_scale_sweep_complete(chapter, runs):
    """The chapter's CSV holds every planned run at the teaching scale."""
    tail = "import json; print(json.dumps([bool(ns['complete']), ns['SCALE']['model'], len(ns['runs'])]))"
    out = _run(_exec_cells(_until_slice(chapter), tail), NOTEBOOKS)
    assert out.returncode == 0, out.stderr
    complete, model, n = json.loads(out.stdout.strip().splitlines()[-1])
    assert complete and model == "cnn_bn" and n == runs


def test_chapter_06_controls_take_the_beta_scaled_step():
    """Every control run of chapter 06 has no regularizer and its method's lr0 times beta, and each
    regularized cell has a gain over the method alone and over the control for every seed."""
    tail = textwrap.dedent("""
        import json
        c = ns['runs'][ns['runs']['cell'] == ns['CONTROL']]
        print(json.dumps([sorted(set(c['regularizer'])), sorted(set(c['algorithm'])),
                          sorted({d.n for d in ns['gain_iv'].values()} | {d.n for d in ns['control_iv'].values()}),
                          float(ns['SWEEP_BETA'])]))
    """)
    out = _run(_exec_cells(_until_slice("06_regularizer_synergy"), tail), NOTEBOOKS)
    assert out.returncode == 0, out.stderr
    regs, methods, ns_, beta = json.loads(out.stdout.strip().splitlines()[-1])
    assert regs == ["none"] and methods == ["dr", "fedavg"] and ns_ == [3] and beta == 0.9


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_seeds_parameter_keeps_only_those_seeds(chapter):
    """Two seeds widen the intervals (t quantile 12.71) and flag at least as many baselines."""
    tail = ("import json; t = ns['claims_table']; print(json.dumps([sorted(set(ns['runs']['seed'])), "
            "int((t['baseline above chance?'] != 'yes').sum()), int(ns['expected'])]))")
    default = _run(_exec_cells(_until_slice(chapter), tail), NOTEBOOKS)
    two = _run(_exec_cells(_until_slice(chapter, "seeds = [0, 1]"), tail), NOTEBOOKS)
    assert default.returncode == 0 and two.returncode == 0, default.stderr + two.stderr
    (seeds3, flagged3, expected3), (seeds2, flagged2, expected2) = (json.loads(o.stdout.strip().splitlines()[-1])
                                                                    for o in (default, two))
    assert seeds3 == [0, 1, 2] and seeds2 == [0, 1] and expected2 == expected3 * 2 // 3
    assert flagged2 >= flagged3
