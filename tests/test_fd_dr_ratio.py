"""The one table of FedDr+'s FD:DR ratio (results/fd_dr_ratio.py, docs/fd_dr_ratio.md) and the places that quote
it."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
NUMBER = re.compile(r"(?<![\d.])0\.0\d+")  # how the ratio is written wherever it is quoted (0.014, 0.00077)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", RESULTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fd():
    yield _load("fd_dr_ratio")
    sys.modules.pop("fd_dr_ratio_under_test", None)


@pytest.fixture(scope="module")
def cells(fd):
    return fd.cells(fd.measurements())


@pytest.fixture(scope="module")
def quotable(fd, cells) -> set[str]:
    """Every number the table (and its note on the criterion's rounds) prints, as the docs write it."""
    out = {fd.fmt(v) for stat in ("mean", "min", "max") for v in cells[stat]}
    return out | {fd.fmt(fd.criterion_rounds().mean())}


def test_cells_are_the_committed_csvs_recomputed(fd, cells):
    """A closed recomputation with plain pandas of cells in every phase and kind of source."""
    ch04 = pd.read_csv(RESULTS / "ch04_runs.csv")
    feddr = ch04[ch04["run"] == "FedDr+ (beta=0.9)"]
    for lr, row in ((3.0, "full lr"), (0.3, fd.PHASES[1]), (0.03, fd.PHASES[2])):
        values = feddr.loc[feddr["lr"].round(9) == lr, "grad_ratio_features"]
        assert fd.value(cells, "cnn_bn", row) == pytest.approx(values.mean(), rel=1e-12)
        assert fd.value(cells, "cnn_bn", row, "n") == len(values)
    assert fd.value(cells, "cnn_bn", "all") == pytest.approx(feddr["grad_ratio_features"].mean(), rel=1e-12)
    first = feddr[feddr["round"] <= 15]["grad_ratio_features"]  # rounds 5, 10, 15 of each seed
    assert fd.value(cells, "cnn_bn", "full lr, first 3") == pytest.approx(first.mean(), rel=1e-12)

    h100 = pd.read_csv(RESULTS / "paper_regime_nvidia_h100_80gb_hbm3.csv")
    mobilenet = h100.loc[h100["setting"] == "mobilenet-s10", "grad_ratio_features"]
    assert fd.value(cells, "MobileNet, s = 10", "full lr", machine="NVIDIA") == pytest.approx(mobilenet.mean(), rel=1e-12)
    assert fd.value(cells, "MobileNet, s = 10", "full lr", "n", machine="NVIDIA") == 23
    cpu = pd.read_csv(RESULTS / "paper_regime_cpu.csv")
    vgg = cpu.loc[cpu["setting"] == "vgg11-s5", "grad_ratio_features"]
    assert fd.value(cells, "VGG-11, s = 5", "full lr", machine="CPU") == pytest.approx(vgg.mean(), rel=1e-12)
    mob2 = cpu[(cpu["setting"] == "mobilenet-s2") & (cpu["round"] <= 3)]["grad_ratio_features"]
    assert fd.value(cells, "MobileNet, s = 2", "full lr, first 3", machine="CPU") == pytest.approx(mob2.mean(), rel=1e-12)
    # the paper models' runs kept a constant lr: they have no decayed rows, and nothing is CIFAR-100
    decayed = cells.loc[cells["row"] == fd.ROWS[fd.PHASES[1]], "column"]
    assert [c.split(" ")[0] for c in decayed] == ["cnn_bn"]
    assert set(cells["dataset"]) == {"CIFAR-10"}


def test_committed_table_is_what_the_script_writes(fd, tmp_path):
    fd.main(["--out", str(tmp_path / "page.md"), "--csv", str(tmp_path / "cells.csv")])
    assert (tmp_path / "page.md").read_text() == (REPO / "docs" / "fd_dr_ratio.md").read_text()
    assert (tmp_path / "cells.csv").read_text() == (RESULTS / "fd_dr_ratio.csv").read_text()


def _units(text: str) -> list[str]:
    """The sentences of ``text`` (a bullet item ends one too)."""
    return [u for p in re.split(r"\n\s*\n|\n(?=\s*[*-] )", text) for u in re.split(r"(?<=[.!?])\s+(?=[A-Z*`(])", p)]


def _quoting_units() -> dict[str, list[str]]:
    """Where the docs and chapters speak of the ratio by phase: each sentence that links the table, names the
    FD:DR ratio or an lr phase, in README.md and the chapters that quote it (00, 04, 06: their Markdown cells)."""
    texts = {"README.md": (REPO / "README.md").read_text()}
    for stem in ("00_quickstart", "04_feature_distillation", "06_regularizer_synergy"):
        nb = nbformat.read(REPO / "notebooks" / f"{stem}.ipynb", as_version=4)
        texts[stem] = "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    marks = ("fd_dr_ratio.md", "FD:DR", "full lr", "decay", "after the first")
    return {name: [u for u in _units(t) if any(m in u for m in marks)] for name, t in texts.items()}


def test_every_quoted_ratio_is_a_cell_of_the_table(quotable):
    units = _quoting_units()
    assert all(units.values()), f"no quote of the table found in {[k for k, v in units.items() if not v]}"
    for name, found in units.items():
        for unit in found:
            stray = [n for n in NUMBER.findall(unit) if n not in quotable]
            assert not stray, f"{name} quotes {stray}, which the FD:DR table does not have: {unit[:200]!r}"


def test_drift_report_and_teaching_scale_quote_the_table(fd, cells, quotable):
    drift = (REPO / "docs" / "drift.md").read_text()
    section = drift.split("## Drift beside the teaching scale and the paper's models")[1].split("\n## ")[0]
    assert "fd_dr_ratio.md" in section
    assert set(NUMBER.findall(section)) <= quotable
    row = next(line for line in section.splitlines() if line.startswith("| teaching scale, chapter 04: FedDr+"))
    cols = [c.strip() for c in row.strip("|").split("|")]
    assert fd.fmt(fd.value(cells, "cnn_bn", "full lr")) in cols and fd.fmt(fd.value(cells, "cnn_bn", "all")) in cols
    phases = " → ".join(fd.fmt(fd.value(cells, "cnn_bn", k)) for k in ("full lr", fd.PHASES[1], fd.PHASES[2]))
    assert phases in " ".join((REPO / "docs" / "teaching_scale.md").read_text().split())
