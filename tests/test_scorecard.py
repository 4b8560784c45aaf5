"""results/scorecard.py: the page it writes from claims tables, the paper's numbers it quotes, and
whether docs/scorecard.md is what the chapters give today."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import feddr_kit as fk

REPO = Path(__file__).resolve().parents[1]
PAPER_TEX = REPO.parent / "shared" / "paper" / "feddr-plus-paper.tex"


def _script():
    spec = importlib.util.spec_from_file_location("scorecard", REPO / "results" / "scorecard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sc = _script()


def _table(chapter: str, rows: list[tuple]) -> pd.DataFrame:
    claims = [fk.stats.Claim(claim, source, setting, fk.stats.interval(values), margin=0.005, scale=100, unit=" pp",
                             fmt=".1f") for claim, source, setting, values in rows]
    return fk.stats.claims_table(claims).assign(chapter=chapter)


def test_one_row_per_paper_claim_with_its_verdict_and_the_papers_number(tmp_path):
    tables = {"05_nine_algorithms": _table("05_nine_algorithms", [
        ("FedDr+ beats FedAvg", "paper", "s=2, 120 rounds", [-0.081, -0.05, -0.02]),
        ("FedDr+ beats SCAFFOLD", "paper", "α=0.1, 120 rounds", [0.02, 0.03, 0.04]),
        ("FedETF beats FedDr+ at this scale", "chapter hypothesis", "s=2, 120 rounds", [0.1, 0.2, 0.15]),
        ("FedDr+ beats FedExP", "paper", "s=2, 120 rounds", [0.1]),  # one seed: untestable, left out
    ])}
    rows = sc.scorecard(tables, scale=sc.paper_scale_rows(tmp_path))
    assert list(rows["claim"]) == ["FedDr+ beats FedAvg", "FedDr+ beats SCAFFOLD"]
    assert list(rows["verdict"]) == [fk.stats.verdict(fk.stats.interval([-0.081, -0.05, -0.02]), "greater", 0.005),
                                     fk.stats.HELD]
    t3 = fk.paper.table3()
    want = t3.loc[("feddr+", "mean"), "s=2"] - t3.loc[("fedavg", "mean"), "s=2"]
    assert rows.loc[0, "paper"].startswith(f"{want:+.2f} pp") and "`tab:gfl_acc_all`" in rows.loc[0, "paper"]
    assert rows.loc[1, "paper"].startswith("none: SCAFFOLD's run failed")  # the paper marks it "(Failed)" at α = 0.1
    assert (rows["paper scale"] == "not run").all()
    page = sc.markdown(rows)
    body = [line for line in page.splitlines() if line.startswith("| 05 |")]
    assert len(body) == 2 and all(line.count(" | ") == 8 for line in body)  # nine cells
    assert "In all, 2 claims: 1 held" in page


def test_paper_scale_runs_fill_the_claims_they_can_test(tmp_path):
    """A FedDr+-against-X claim gets the paired difference of the paper-scale runs' final accuracies over the
    seeds both sides have (the β-scaled control, a DR run, is not DR); anything else stays "not run"."""
    tables = {"05_nine_algorithms": _table("05_nine_algorithms", [
        ("FedDr+ beats FedAvg", "paper", "s=2, 120 rounds", [0.01, 0.02, 0.03]),
        ("FedDr+ beats FedAvg", "paper", "α=0.1, 120 rounds", [0.01, 0.02, 0.03]),
        ("FedDr+ beats DR (the paper credits feature distillation)", "paper", "s=2, 120 rounds", [0.01, 0.02, 0.03])]),
        "06_regularizer_synergy": _table("06_regularizer_synergy", [("FD helps dr", "paper", "s=5", [0.0, 0.01, 0.02])])}
    runs = [("s=2", "FedDr+", s, "feddr+", a) for s, a in ((0, 0.77), (1, 0.76), (2, 0.75))]
    runs += [("s=2", "FedAvg", s, "fedavg", a) for s, a in ((0, 0.72), (1, 0.73))]  # seed 2 not finished
    runs += [("s=2", "DR at lr·β (control)", 0, "dr", 0.70), ("α=0.1", "FedAvg", 0, "fedavg", 0.69)]
    pd.DataFrame(runs, columns=["setting", "cell", "seed", "algorithm", "final_acc"]).to_csv(tmp_path / "paper_scale.csv", index=False)
    rows = sc.scorecard(tables, scale=sc.paper_scale_rows(tmp_path))
    want = fk.stats.difference([0.77, 0.76], [0.72, 0.73])
    assert rows.loc[0, "paper scale"] == (f"{want.format('.1f', 100, ' pp', sign=True)}, "
                                         f"{fk.stats.verdict(want, 'greater', 0.005)} (n=2)")
    assert list(rows["paper scale"][1:]) == ["not run"] * 3  # no FedDr+ at α=0.1; DR has only its control; chapter 06
    assert (sc.scorecard(tables, scale=sc.paper_scale_rows(tmp_path / "none"))["paper scale"] == "not run").all()


@pytest.mark.skipif(not PAPER_TEX.is_file(), reason="the paper's LaTeX source is not beside the repository")
def test_pfl_numbers_match_the_latex_source():
    """The PFL rows the scorecard quotes, against the paper's LaTeX tables (read here independently)."""
    tex = PAPER_TEX.read_text()

    def numbers(line: str) -> tuple[float, ...]:  # each cell's mean: drop the {\tiny ±(std)} part, keep the first number
        return tuple(float(re.search(r"\d+\.\d+", re.sub(r"\{\\tiny[^}]*\}", "", c))[0]) for c in line.split("&")[1:])

    def row(block: str, label: str) -> str:
        return next(ln for ln in block.splitlines() if ln.strip().startswith(label) and "&" in ln)

    labels = {"local-ce": r"Local only ($\mathcal{L}_\text{CE}$) ", "local-dr": r"Local only ($\mathcal{L}_\text{DR}$)",
              "fedper": "FedPer", "perfedavg": "Per-FedAvg", "fedrep": "FedRep", "ditto": "Ditto",
              "fedavg-FT": "FedAvg-FT", "fedbabu-FT": "FedBABU-FT", "spherefed-FT": "SphereFed-FT",
              "fedetf-FT": "FedETF-FT", "feddr+-FT": r"\textbf{{\alg}\,FT (ours)}"}
    table = tex[tex.index("\\label{tab:pfl_acc}"):]
    table = table[:table.index("\\end{tabular}")]
    for key, label in labels.items():
        assert numbers(row(table, label)) == sc.PFL[key], key
    app = tex[tex.index("\\label{apptab:pfl_acc}"):]
    assert numbers(row(app[:app.index("\\end{tabular}")], r"\alg (ours)")) == sc.PFL["feddr+ global"]


def test_scorecard_is_what_the_chapters_give():
    """docs/scorecard.md is regenerated from the chapters' claims tables (their cells, up to the table, from
    the committed CSVs) and compared: a chapter or CSV that changes a verdict without the scorecard fails."""
    out = subprocess.run([sys.executable, str(REPO / "results" / "scorecard.py"), "--check"], cwd=REPO,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]


def test_readme_and_quickstart_link_the_scorecard():
    assert "docs/scorecard.md" in (REPO / "README.md").read_text()
    import nbformat

    nb = nbformat.read(REPO / "notebooks" / "00_quickstart.ipynb", as_version=4)
    assert any("scorecard.md" in c.source for c in nb.cells if c.cell_type == "markdown")
