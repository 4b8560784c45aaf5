"""The time to rerun a seed of chapters 03 and 04, as the chapters quote it, is what results/rerun_time.py computes
from the committed timings."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def rt():
    spec = importlib.util.spec_from_file_location("rerun_time_under_test", REPO / "results" / "rerun_time.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _markdown(stem: str) -> str:
    """The chapter's Markdown cells, joined, with every run of whitespace one space."""
    nb = nbformat.read(REPO / "notebooks" / f"{stem}.ipynb", as_version=4)
    return " ".join("\n".join(c.source for c in nb.cells if c.cell_type == "markdown").split())


def test_the_paces_and_the_probed_rounds_come_from_the_committed_files(rt):
    assert "AMD EPYC" in rt.machine()  # the machine the chapters name
    assert rt.pace(1) == {"fedavg": 4.76, "feddr+": 6.97}
    factor = rt.probed_factor()  # probed rounds cost a few plain ones; FedDr+'s teacher makes its plain rounds dearer
    assert set(factor) == {"fedavg", "feddr+"} and 1 < factor["feddr+"] < factor["fedavg"] < 5
    # chapter 04 at one thread, by hand: DR and the control at FedAvg's pace, FedDr+ at its own
    by_hand = (2 * 4.76 * (96 + 24 * factor["fedavg"]) + 6.97 * (96 + 24 * factor["feddr+"])) / 60
    assert rt.minutes("04", 1) == pytest.approx(by_hand)


def test_chapters_quote_the_computed_figures_and_no_other(rt):
    ch03, ch04 = _markdown("03_dr_forgets_unseen"), _markdown("04_feature_distillation")
    assert f"about {rt.about(rt.minutes('ch03_04_probes.py', 1))} minutes per seed at its default one torch thread" in ch03
    assert f"about {rt.about(rt.minutes('03', 2))} minutes per seed on a 2-core CPU" in ch03
    assert ch04.count(f"about {rt.about(rt.minutes('04', 2))} minutes per seed on a 2-core CPU") == 2
    for chapter, text in (("03", ch03), ("04", ch04)):
        figures = re.findall(r"(an hour|about \d+ minutes) per seed", text)
        assert len(figures) == 2, (chapter, figures)  # the two places each chapter gives the time
