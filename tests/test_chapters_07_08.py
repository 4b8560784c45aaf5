"""Chapters 07 and 08 keep their prose's claims tied to their evidence, their complete teaching-scale
sweeps; their cells run in a subprocess from notebooks/. What every results chapter does alike is in
test_results_chapters.py.
"""
from __future__ import annotations

import json

import nbformat
import pytest

import feddr_kit as fk

from chapter_cells import NOTEBOOKS, cifar10_available, code as _cells, exec_cells as _exec_cells, markdown as _markdown, \
    run as _run


@pytest.mark.skipif(not cifar10_available(), reason="real CIFAR-10 not in FEDDR_DATA_DIR (section 1 counts its partitions)")
def test_chapter_07_reads_the_teaching_scale_sweep_complete_and_pins_its_prose():
    """The cells up to the live slice (no training): the CSV holds every planned run at the teaching scale
    with three seeds, the claims table is sorted held, did not hold, the ties (against the claim first),
    untestable, and the cell that
    pins the prose's numbers passes."""
    cells = _cells("07_sensitivity")
    stop = next(i for i, s in enumerate(cells) if s.startswith("slice_base"))
    assert any(s.startswith("# The paragraph above, pinned") for s in cells[:stop])
    tail = ("import json; print(json.dumps([list(ns['claims_table']['verdict']), bool(ns['complete']), "
            "ns['BASE']['model'], len(ns['runs']), sorted(map(int, set(ns['runs']['seed'])))]))")
    out = _run(_exec_cells(cells[:stop], "\n" + tail), NOTEBOOKS)
    assert out.returncode == 0, out.stderr
    verdicts, complete, model, rows, seeds = json.loads(out.stdout.strip().splitlines()[-1])
    assert complete and model == "cnn_bn" and rows == 54 and seeds == [0, 1, 2]
    order = [fk.stats.HELD, fk.stats.NOT_HELD, fk.stats.TIE_AGAINST, fk.stats.TIE_TOWARD, fk.stats.TIE, fk.stats.UNTESTABLE]
    ranks = [order.index(v) for v in verdicts]
    assert ranks == sorted(ranks) and ranks[0] < 2, verdicts


@pytest.mark.slow
@pytest.mark.skipif(not cifar10_available(), reason="real CIFAR-10 not in FEDDR_DATA_DIR")
def test_chapter_08_live_slice_under_papermill(tmp_path):
    """Slow (about a minute on one CPU core): chapter 08's rerun path (teaching-scale global runs of 1 round,
    10 of their clients fine-tuned for one epoch the way the sweep fine-tunes each of its 100) executes end to
    end, skipping the prose's pins."""
    import papermill

    out = tmp_path / "08.ipynb"
    papermill.execute_notebook(str(NOTEBOOKS / "08_personalization.ipynb"), str(out),
                               parameters={"rerun": True, "rerun_rounds": 1, "ft_epochs": 1, "rerun_clients": 10,
                                           "demo_rounds": 1},
                               cwd=str(NOTEBOOKS), kernel_name="python3", progress_bar=False)
    nb = nbformat.read(out, as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "2 (setting, method, seed) cells, 20 client rows" in text


@pytest.mark.skipif(not cifar10_available(), reason="real CIFAR-10 not in FEDDR_DATA_DIR (section 4 counts its partitions)")
def test_chapter_08_reads_the_teaching_scale_sweep_complete_and_pins_its_prose():
    """Every code cell but the live slice (``rerun`` is False): the CSV holds every planned row at the
    teaching scale with three seeds, the cell that pins the prose passes, and the local-only comparison
    has a verdict in each setting."""
    tail = ("import json; v = ns['verdicts']; print(json.dumps([bool(ns['complete']), ns['SCALE']['model'], "
            "len(ns['summary']), sorted(map(int, set(ns['summary']['seed']))), "
            "sorted(v.loc[v['claim'] == 'FedDr+ FT beats local-only DR', 'setting'])]))")
    out = _run(_exec_cells(_cells("08_personalization"), tail), NOTEBOOKS)
    assert out.returncode == 0, out.stderr
    complete, model, rows, seeds, local = json.loads(out.stdout.strip().splitlines()[-1])
    assert complete and model == "cnn_bn" and rows == 66 and seeds == [0, 1, 2]
    assert [w.split(",")[0] for w in local] == ["CIFAR-10 s=2", "CIFAR-10 α=0.1"]


def test_chapter_08_exercises_run_from_a_fresh_clone():
    """The exercises train what they need (``teaching_global``, the toy problem); none reads a run folder."""
    text = _markdown("08_personalization")
    exercises = text[text.index("## Exercises"):]
    assert "teaching_global(" in exercises and "runs/" not in exercises and "checkpoint" not in exercises
