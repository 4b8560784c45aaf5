"""results/scorecard.py: the page it writes from claims tables, the paper's numbers it quotes, how it counts
distinct comparisons (each fold), which rows it calls the paper's, the baseline and detectable-effect columns,
and whether docs/scorecard.md is what the chapters give today."""
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
    body = [line for line in page.splitlines() if " | 05 | " in line]
    assert len(body) == 2 and all(line.count(" | ") == len(sc.TABLE) - 1 for line in body)
    assert ("In all, 2 rows and 2 distinct comparisons. Of the 2, 2 test the paper's claims (1 held, "
            "1 tie (zero inside the interval)).") in page


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


# --------------------------------------------------------------------------- distinct comparisons, sources, baselines
OWN = "same global model (DR run), own lrs, frozen ETF, 2x10 clients/seed"
SHARED = OWN.replace("own lrs", "shared lr 0.1")
CH07 = "CIFAR-10 shard s=5, 40 rounds, cnn_bn"
CH08 = "CIFAR-10 s=2, cnn_bn, 120 rounds"


def _folding_tables() -> dict[str, pd.DataFrame]:
    """Every kind of fold, at the size of the real chapters: chapter 03's identical pair at both lrs, chapter
    07's base point under its two names, chapter 08's claim with three per-seed bootstraps."""
    ch03 = []
    for st, values, src in ((OWN, [-0.42, -0.41, -0.43], "paper"), (SHARED, [0.10, 0.12, 0.13], "course test")):
        ch03 += [("same model: DR's local accuracy on unobserved classes below CE's", src, st, values),
                 ("same model: DR loses more unobserved-class accuracy than CE (local − global)", src, st, values)]
    base = [-0.01, 0.0, -0.004]
    ch07 = [("FedDr+ beats fedavg at participation 0.1", "paper", CH07, base),
            ("FedDr+ beats fedavg at 3 local epochs", "paper", CH07, [-0.01, -0.012, -0.014]),
            ("FedDr+ beats fedavg at 1 local epochs", "paper", CH07, base)]
    ch08 = [("FedDr+ FT beats the global FedDr+ model (per-client mean)", "paper", CH08, [0.49, 0.47, 0.51])]
    ch08 += [(f"… the same, over the clients of seed {s}", "paper", CH08, [0.5 + s / 100, 0.45, 0.52]) for s in range(3)]
    ch08 += [("FedDr+ FT beats FedAvg-FT", "paper", CH08, [-0.01, 0.0, -0.02])]
    return {"03_dr_forgets_unseen": _table("03_dr_forgets_unseen", ch03), "07_sensitivity": _table("07_sensitivity", ch07),
            "08_personalization": _table("08_personalization", ch08)}


def test_each_comparison_counts_once(tmp_path):
    """The two chapter-03 rows that one shared global model makes identical count once at each lr, chapter 07's
    base point counts once under its two names, and chapter 08's per-seed bootstraps fold under their claim."""
    rows = sc.scorecard(_folding_tables(), scale=sc.paper_scale_rows(tmp_path)).set_index(["claim", "setting"])
    num = lambda claim, setting: (rows.loc[(claim, setting), "#"], rows.loc[(claim, setting), "folded"])
    for st in (OWN, SHARED):
        kept = num("same model: DR loses more unobserved-class accuracy than CE (local − global)", st)
        assert kept[1] == "" and num("same model: DR's local accuracy on unobserved classes below CE's", st) == (kept[0], sc.IDENTICAL)
    kept = num("FedDr+ beats fedavg at participation 0.1", CH07)
    assert kept[1] == "" and num("FedDr+ beats fedavg at 1 local epochs", CH07) == (kept[0], sc.SAME_RUNS)
    assert num("FedDr+ beats fedavg at 3 local epochs", CH07)[1] == ""
    kept = num("FedDr+ FT beats the global FedDr+ model (per-client mean)", CH08)
    assert [num(f"… the same, over the clients of seed {s}", CH08) for s in range(3)] == [(kept[0], sc.BOOTSTRAP)] * 3
    assert sorted(rows.loc[rows["folded"] == "", "#"]) == list(range(1, 7))  # 12 rows, 6 folded
    page = sc.markdown(rows.reset_index())
    assert "In all, 12 rows and 6 distinct comparisons: 6 rows repeat another and are folded into it (2 identical " in page
    assert "; 1 the same runs counted twice (chapter 07's base point" in page and "; 3 per-seed client bootstraps" in page
    assert "Of the 6, 5 test the paper's claims (" in page and " and 1 the course's own test (" in page
    assert "| = 1 (identical by construction) | 03 | same model: DR's local accuracy" in page


def test_a_fold_by_construction_must_repeat_the_value(tmp_path):
    """Rows folded as identical by construction (or as the same runs) that differ mean the construction broke."""
    tables = {"03_dr_forgets_unseen": _table("03_dr_forgets_unseen", [
        ("same model: DR's local accuracy on unobserved classes below CE's", "paper", OWN, [-0.42, -0.41, -0.43]),
        ("same model: DR loses more unobserved-class accuracy than CE (local − global)", "paper", OWN, [-0.42, -0.41, -0.40])])}
    with pytest.raises(ValueError, match="identical by construction"):
        sc.scorecard(tables, scale=sc.paper_scale_rows(tmp_path))


def test_source_is_the_paper_only_where_the_paper_states_the_claim(tmp_path):
    """The β-scaled control, chapter 03's shared lr and chapter 07's participation rows for FedDr+ and FedAvg
    are the course's own tests, without a paper number; a per-client fine-tuning gain is not set beside the
    paper's test-set number, which goes beside the mixed-batch row alone."""
    st04 = "cifar10 s=5, 120 rounds, E=1, own lrs"
    tables = {
        "03_dr_forgets_unseen": _table("03_dr_forgets_unseen", [
            ("same model: DR aligns unobserved classes less than CE", "paper", OWN, [-0.4, -0.38, -0.37]),
            ("same model: DR aligns unobserved classes less than CE", "course test", SHARED, [0.04, 0.05, 0.03])]),
        "04_feature_distillation": _table("04_feature_distillation", [
            ("FedDr+'s global model more accurate (final round), vs DR", "paper", st04, [0.0, 0.01, -0.02]),
            ("FedDr+'s global model more accurate (final round), vs control", "course test", st04, [0.0, 0.01, -0.02])]),
        "07_sensitivity": _table("07_sensitivity", [
            ("feddr+: participation 0.2 beats 0.05", "course test", CH07, [0.05, 0.07, 0.08]),
            ("fedavg: participation 0.2 beats 0.05", "course test", CH07, [0.1, 0.11, 0.12]),
            ("FedDr+ beats fedavg at participation 0.2", "paper", CH07, [-0.03, -0.04, -0.04]),
            ("feddr+: 10 local epochs beat 1", "paper", CH07, [0.0, 0.1, 0.12])]),
        "08_personalization": _table("08_personalization", [
            ("FedDr+ FT beats the global FedDr+ model (per-client mean)", "paper", CH08, [0.49, 0.47, 0.51]),
            ("FedDr+ FT beats the global FedDr+ model scored in mixed batches (its test accuracy)", "paper", CH08, [0.4, 0.43, 0.45]),
            ("FedDr+ FT beats the global FedDr+ model (per-client mean)", "paper", "CIFAR-10 α=0.1, cnn_bn, 120 rounds",
             [0.4, 0.45, 0.46])])}
    rows = sc.scorecard(tables, scale=sc.paper_scale_rows(tmp_path))
    src, paper = list(rows["source"]), list(rows["paper"])
    assert src[0] == "paper" and src[1] == "course: one lr for both losses" and paper[1].startswith("none: the course's own test")
    assert src[2] == "paper" and paper[2].startswith("+6.17 pp at s=10")
    assert src[3].startswith("course: against the β-scaled control") and paper[3] == "none: the paper has no β-scaled control"
    assert src[4] == src[5] == "course: the paper says it of FedBABU and SphereFed"
    assert all("FedBABU and SphereFed" in p and p.startswith("none") for p in paper[4:6])
    assert src[6] == "paper" and src[7] == "paper" and paper[7].startswith("none: stated in words (CIFAR-10 grid search")
    assert paper[8].startswith("none: this gain is over the global model scored on each client's own test batches")
    assert paper[9].startswith("+24.42 pp (75.42 vs 51.00; MobileNet, CIFAR-100 s=20, `apptab:pfl_acc`)")
    assert paper[10].startswith("+28.92 pp (74.75 vs 45.83") and "per-client mean" in paper[10]  # the α entries are
    assert "Of the 11, 7 test the paper's claims" in sc.markdown(rows)


def test_a_source_label_that_disagrees_with_the_reasons_is_one_line(tmp_path):
    """A chapter's "course test" row needs its reason in OWN_TESTS, and a row OWN_TESTS names may not be
    labelled "paper": either slip stops the page with one line naming the row, so the chapters' claims tables
    and the page never disagree on whose claim a row is."""
    st04 = "cifar10 s=5, 120 rounds, E=1, own lrs"
    as_paper = {"04_feature_distillation": _table("04_feature_distillation", [
        ("FedDr+'s global model more accurate (final round), vs control", "paper", st04, [0.0, 0.01, -0.02])])}
    with pytest.raises(SystemExit, match="labelled 'paper', but it is the course's own test"):
        sc.scorecard(as_paper, scale=sc.paper_scale_rows(tmp_path))
    no_reason = {"04_feature_distillation": _table("04_feature_distillation", [
        ("FedDr+'s global model more accurate (final round), vs DR", "course test", st04, [0.0, 0.01, -0.02])])}
    with pytest.raises(SystemExit, match="is a course test with no reason in OWN_TESTS"):
        sc.scorecard(no_reason, scale=sc.paper_scale_rows(tmp_path))
    hypothesis = {"04_feature_distillation": _table("04_feature_distillation", [
        ("FedDr+'s global model more accurate (final round), vs control", "chapter hypothesis", st04, [0.0, 0.01, -0.02])])}
    assert sc.scorecard(hypothesis, scale=sc.paper_scale_rows(tmp_path)).empty  # hypotheses stay in the chapters


def test_detectable_effect_is_the_interval_half_width(tmp_path):
    """The detectable column is each row's half-width, in the row's unit and digits, read from a symmetric or a
    bootstrap interval, and is marked where it is wider than every effect the paper reports for the row."""
    values = {"FedDr+ beats FedAvg": [-0.05, 0.0, -0.03], "FedDr+ beats FedBABU": [-0.100, -0.105, -0.110]}
    tables = {"05_nine_algorithms": _table("05_nine_algorithms", [(c, "paper", "s=2, 120 rounds", v) for c, v in values.items()])}
    rows = sc.scorecard(tables, scale=sc.paper_scale_rows(tmp_path))
    for claim, v in values.items():
        want = f"{100 * fk.stats.interval(v).half_width:.1f} pp"
        assert rows.set_index("claim").loc[claim, "detectable"].split(" (")[0] == want
    assert rows.loc[0, "detectable"].endswith(" pp (wider than the paper's effect)")  # ± 6.3 pp against +4.49 pp
    assert rows.loc[1, "detectable"] == "1.2 pp"
    boot = fk.stats.Interval(0.511, 0.480, 0.540, 100, method="bootstrap BCa")
    assert boot.format(".1f", 100, " pp", sign=True) == "+51.1 [48.0, 54.0] pp"
    assert sc.detectable("+51.1 [48.0, 54.0] pp", "none") == f"{100 * boot.half_width:.1f} pp"
    assert sc.detectable("-0.068 ± 0.013", "none: a figure") == "0.013" and sc.detectable("0.1 (n=1)", "none") == "—"
    assert "1 of the paper's comparisons without a finding at the margin sit on intervals wider than the paper's own effect" \
        in sc.markdown(rows)


def test_baseline_check_comes_along(tmp_path):
    """A chapter's check that the baseline learned is a column; β = 0 at chance says only that the DR term trains
    the extractor; a chapter without the check shows "—"."""
    t = _table("07_sensitivity", [("balanced β beats β=0", "paper", CH07, [0.34, 0.36, 0.37]),
                                  ("FedDr+ beats fedavg at participation 0.2", "paper", CH07, [-0.03, -0.04, -0.04])])
    t[sc.BASELINE_TEXT] = ["feddr+ β=0 11.3 [8.9, 13.7] %", "fedavg at 0.2 58.1 [56.0, 60.2] %"]
    t[sc.BASELINE_OK] = ["no: reaches chance", "yes"]
    tables = {"07_sensitivity": t, "00_quickstart": _table("00_quickstart", [
        ("FedDr+ beats FedAvg", "paper", "s=5, 120 rounds", [0.0, 0.01, -0.02])])}
    rows = sc.scorecard(tables, scale=sc.paper_scale_rows(tmp_path))
    assert rows.loc[0, "baseline"] == ("not learned (reaches chance): feddr+ β=0 11.3 [8.9, 13.7] %; β = 0 is distillation "
                                       "alone; the win says only that the DR term trains the extractor")
    assert rows.loc[1, "baseline"] == "learned: fedavg at 0.2 58.1 [56.0, 60.2] %" and rows.loc[2, "baseline"] == "—"
    assert "1 held over a baseline that has not learned" in sc.markdown(rows)


def _page_rows() -> pd.DataFrame:
    """docs/scorecard.md's table, one string per cell (its freshness is test_scorecard_is_what_the_chapters_give's)."""
    lines = [ln for ln in (REPO / "docs" / "scorecard.md").read_text().splitlines() if ln.startswith("| ")]
    split = lambda ln: [c.strip() for c in re.split(r"(?<!\\) \| ", ln.strip("| "))]
    return pd.DataFrame([split(ln) for ln in lines[1:]], columns=split(lines[0]))


def test_the_page_folds_and_labels_the_named_rows():
    """On docs/scorecard.md itself: chapter 03's identical rows, chapter 07's base point and chapter 08's
    bootstraps are folded, the named rows carry the course's label, every detectable cell is its row's
    half-width, and the count of distinct comparisons is the rows less the folded ones."""
    page = _page_rows()
    assert list(page.columns) == sc.TABLE
    folded = page[page["#"].str.startswith("=")]
    reasons = folded["#"].str.extract(r"\((.*)\)")[0].value_counts().to_dict()
    assert reasons == {sc.IDENTICAL: 2, sc.SAME_RUNS: 1, sc.BOOTSTRAP: 6}
    number = lambda claim, where: page.loc[(page["claim"] == claim) & page["setting"].str.contains(where), "#"].tolist()
    for lrs in ("own lrs", "shared lr 0.1"):
        kept = number("same model: DR loses more unobserved-class accuracy than CE (local − global)", lrs)
        assert number("same model: DR's local accuracy on unobserved classes below CE's", lrs) == [f"= {kept[0]} ({sc.IDENTICAL})"]
    kept = number("FedDr+ beats fedavg at participation 0.1", "")
    assert number("FedDr+ beats fedavg at 1 local epochs", "") == [f"= {kept[0]} ({sc.SAME_RUNS})"]
    assert (page.loc[page["setting"].str.contains("shared lr"), "source"] == "course: one lr for both losses").all()
    assert page.loc[page["claim"].str.endswith(", vs control"), "source"].str.startswith("course: against the β-scaled").all()
    assert (page.loc[page["claim"].str.match(r"(feddr\+|fedavg): participation"), "source"]
            == "course: the paper says it of FedBABU and SphereFed").all()
    assert (page.loc[~page["source"].str.startswith("paper"), "the paper's number"].str.startswith("none")).all()
    beta0 = page.loc[page["claim"] == "balanced β beats β=0", "baseline"]
    assert beta0.str.startswith("not learned").all() and beta0.str.contains("DR term trains the extractor").all()
    for value, cell in zip(page["effect ± 95 % interval"], page["detectable"]):
        width, unit, decimals = sc.half_width(value)
        assert cell.split(" (")[0] == f"{width:.{decimals}f}{unit}", (value, cell)
    n = len(page)
    text = (REPO / "docs" / "scorecard.md").read_text()
    assert f"In all, {n} rows and {n - 9} distinct comparisons: 9 rows repeat another" in text


# --------------------------------------------------------------------------- the drift probe's rows
PROBE_CSV_COLUMNS = ["model", "local_epochs", "method", "lr", "seed", "role", "status", "final_acc", "late_acc",
                     "weight_change", "acc_unobs", "align_unobs", "forgetting_unobs", "grad_ratio_features",
                     "feature_norm", "sec_per_round", "total_seconds", "machine"]
PROBE_SCALE = "(CIFAR-10 s=2, 80 rounds × 10 clients)"


def _probe_csv(path: Path, cells: dict[tuple[str, int], tuple[int, ...]], drop: tuple = ()) -> pd.DataFrame:
    """A table shaped like results/drift_probe.csv (written to ``path`` and read back as drift_report reads it):
    each cell's verdict runs of the three methods at the seeds given, less the (model, E, method, seed) in
    ``drop``. Fake values: FedDr+ about 3 pp above FedAvg in late accuracy (C1 holds), within ±1 pp of the
    control (C2 ties) and about 5.5 pp below it on unseen classes (C3 does not hold); five epochs drift more."""
    rows = []
    for (model, epochs), seeds in cells.items():
        for seed in seeds:
            fedavg = 0.40 + 0.01 * seed
            feddr = fedavg + (0.030, 0.032, 0.031)[seed - 1]
            late = {"fedavg": fedavg, "feddr+": feddr, "control": feddr - (0.01, -0.01, 0.002)[seed - 1]}
            unobs = {"fedavg": 0.05, "feddr+": 0.10, "control": 0.10 + (0.05, 0.06, 0.055)[seed - 1]}
            for method in ("feddr+", "fedavg", "control"):
                if (model, epochs, method, seed) in drop:
                    continue
                rows.append({"model": model, "local_epochs": epochs, "method": method, "lr": 1.0, "seed": seed,
                             "role": "evaluation", "status": "done", "final_acc": late[method], "late_acc": late[method],
                             "weight_change": 0.05 * epochs + 0.001 * seed, "acc_unobs": unobs[method],
                             "align_unobs": 0.1, "forgetting_unobs": 0.2 + 0.02 * epochs + 0.001 * seed,
                             "grad_ratio_features": 0.01 if method == "feddr+" else float("nan"), "feature_norm": 5.0,
                             "sec_per_round": 5.0, "total_seconds": 400.0, "machine": "test"})
    pd.DataFrame(rows, columns=PROBE_CSV_COLUMNS).to_csv(path / "drift_probe.csv", index=False)
    return sc.drift_report().load(path / "drift_probe.csv")


@pytest.fixture
def probe_decided(monkeypatch):
    """Every lr of the probe chosen and training, so that which cells are in follows from the fake table alone
    (the real lr rule reads the probe's run folders, which the running probe changes)."""
    probe = sc.drift_report().PROBE
    monkeypatch.setattr(probe, "chosen_lr", lambda method, model, epochs: 1.0)
    monkeypatch.setattr(probe, "trains", lambda method, model, epochs: True)
    return sc.drift_report()


BN1 = ("cnn_bn", 1)


def test_a_probe_cell_with_its_seeds_in_gives_its_rows_with_the_claims_verdicts(tmp_path, probe_decided):
    """A complete cell's C1 goes under chapter 05 as the paper's claim, with the paper's s=2 number; its C2 and
    C3 under chapter 04 as the course's own tests; each with drift_report's value and verdict; the page counts
    them and says which cell is in."""
    dr = probe_decided
    table = _probe_csv(tmp_path, {BN1: (1, 2, 3)})
    assert dr.complete_cells(table) == ["cnn_bn, E = 1"]
    rows = sc.scorecard(sc.probe_tables(table), scale=sc.paper_scale_rows(tmp_path))
    want = {c.claim: c for c in dr.claims(table) if c.setting == "cnn_bn, E = 1"}
    assert [(c[:2], ch[:2]) for c, ch in zip(rows["claim"], rows["chapter"])] == [("C2", "04"), ("C3", "04"), ("C1", "05")]
    for r in rows.to_dict("records"):
        assert (r["value ± interval"], r["verdict"], r["seeds"]) == (
            want[r["claim"]].row()["value ± interval"], want[r["claim"]].verdict, "seeds 1, 2, 3")
        assert r["setting"] == f"drift probe, cnn_bn, E = 1 {PROBE_SCALE}"
    assert list(rows["verdict"]) == [fk.stats.TIE, fk.stats.NOT_HELD, fk.stats.HELD]
    assert list(rows["source"]) == ["course: against the β-scaled control (DR at lr × β)"] * 2 + ["paper"]
    assert list(rows["paper"]) == ["none: the paper has no β-scaled control"] * 2 + [
        "+4.49 pp (FedDr+ 76.57 vs FedAvg 72.08; VGG-11, CIFAR-10 s=2, `tab:gfl_acc_all`)"]  # the paper's s=2 column
    assert list(rows["#"]) == [1, 2, 3] and (rows["folded"] == "").all() and (rows["baseline"] == "—").all()
    assert rows.loc[2, "detectable"] == f"{100 * want[rows.loc[2, 'claim']].diff.half_width:.1f} pp"
    page = sc.markdown(rows, probe_done=dr.complete_cells(table))
    assert ("In all, 3 rows and 3 distinct comparisons. Of the 3, 1 test the paper's claims (1 held) and 2 the "
            "course's own tests (1 did not hold, 1 tie (zero inside the interval)).") in page
    assert "1 of the probe's 4 cells has all its verdict seeds in (cnn_bn, E = 1)" in page
    assert "| 3 | 05 | C1: FedDr+ beats FedAvg (late accuracy) | paper | drift probe, cnn_bn, E = 1 " in page


def test_a_probe_cell_still_running_gives_no_row(tmp_path, probe_decided):
    """With one run of the cell missing (the control at seed 3), no row of it appears: drift_report gives its
    comparisons no verdict yet, C1 (whose runs are all in) included."""
    dr = probe_decided
    table = _probe_csv(tmp_path, {BN1: (1, 2, 3)}, drop=[("cnn_bn", 1, "control", 3)])
    assert dr.complete_cells(table) == []
    early = [c.verdict for c in dr.claims(table) if c.setting == f"cnn_bn, E = 1: {dr.STILL_RUNNING}"]
    assert early == [fk.stats.UNTESTABLE] * 3
    assert sc.probe_claims(table) == [] and sc.probe_tables(table) == {}
    rows = sc.scorecard({"05_nine_algorithms": _table("05_nine_algorithms", [
        ("FedDr+ beats FedAvg", "paper", "s=2, 120 rounds", [0.01, 0.02, 0.03])]), **sc.probe_tables(table)},
        scale=sc.paper_scale_rows(tmp_path))
    assert list(rows["claim"]) == ["FedDr+ beats FedAvg"]
    page = sc.markdown(rows, probe_done=dr.complete_cells(table))
    assert "None of the probe's 4 cells has all its verdict seeds in yet, so it has no row here" in page
    assert "drift probe, cnn_bn" not in page.split("| # |")[1]


def test_a_probe_claim_over_two_cells_needs_both(tmp_path, probe_decided):
    """C4 and C5 compare two cells: they count only once both are in. (cnn_bn, E = 1) and (cnn_bn, E = 5) in
    give C4 and C5's epochs effect for cnn_bn, not C5's BatchNorm effect at E = 1 while (cnn_nobn, E = 1) runs;
    with (cnn_bn, E = 5) one run short, none of them. They are the probe's hypotheses, so never on the page."""
    dr = probe_decided
    cells = {BN1: (1, 2, 3), ("cnn_bn", 5): (1, 2, 3), ("cnn_nobn", 1): (1, 2)}
    table = _probe_csv(tmp_path, cells)
    assert dr.complete_cells(table) == ["cnn_bn, E = 1", "cnn_bn, E = 5"]
    two_cells = [(c.claim[:2], c.setting) for c in sc.probe_claims(table) if c.claim.startswith(("C4", "C5"))]
    assert two_cells == [("C4", "cnn_bn")] * 2 + [("C5", "cnn_bn")]
    table = _probe_csv(tmp_path, cells, drop=[("cnn_bn", 5, "fedavg", 2)])
    assert dr.complete_cells(table) == ["cnn_bn, E = 1"]
    assert [c.setting for c in sc.probe_claims(table)] == ["cnn_bn, E = 1"] * 3
    table = _probe_csv(tmp_path, cells)
    rows = sc.scorecard(sc.probe_tables(table), scale=sc.paper_scale_rows(tmp_path))
    assert sorted(rows["claim"].str[:2]) == ["C1", "C1", "C2", "C2", "C3", "C3"]


def test_the_page_shows_the_probe_only_for_cells_in():
    """On docs/scorecard.md: every drift-probe row is from a cell whose verdict seeds are all in now (a cell that
    completes after the page was written has none until it is regenerated, which the freshness test catches),
    under the chapter that shows its comparison."""
    page = _page_rows()
    probe = page[page["setting"].str.startswith("drift probe, ")]
    done = sc.drift_report().complete_cells(sc.drift_report().load())
    cells = probe["setting"].str.extract(r"^drift probe, (.*) \(CIFAR-10")[0]
    assert cells.isin(done).all(), (list(cells), done)
    assert (probe["chapter"] == probe["claim"].str[:2].map({"C1": "05", "C2": "04", "C3": "04"})).all()
    assert ((probe["source"] == "paper") == probe["claim"].str.startswith("C1")).all()


def test_the_probe_sentence_names_the_cells_in_and_says_when_all_are():
    """None in: no row yet; some in: which, and that the others have no row; all in: that each has its rows."""
    labels = [sc.drift_report().cell_label(*cell) for cell in sc.drift_report().PROBE.CELLS]
    assert sc.probe_status([]).startswith(f"None of the probe's {len(labels)} cells")
    some = sc.probe_status(labels[:2])
    assert some.startswith(f"2 of the probe's {len(labels)} cells have all their") and some.endswith("the others have no row.")
    assert sc.probe_status(labels) == f"All {len(labels)} of the probe's cells have their verdict seeds in, and each has its rows."
