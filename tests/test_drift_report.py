"""The drift probe's report (results/drift_report.py): the pre-registered comparisons and their reading,
on run tables made up so that the answer is known."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import feddr_kit as fk

SCRIPT = Path(__file__).resolve().parent.parent / "results" / "drift_report.py"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("drift_report_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(autouse=True)
def every_lr_trains(report, monkeypatch):
    """The made-up tables below do not depend on the probe's real run folders: every lr is chosen, and trains."""
    monkeypatch.setattr(report.PROBE, "trains", lambda method, model, epochs: True)
    monkeypatch.setattr(report.PROBE, "chosen_lr", lambda method, model, epochs: 1.0)


def made_up_table(report, feddr_lead: dict[tuple[str, int], float]) -> pd.DataFrame:
    """Evaluation runs of every cell, method and verdict seed: FedAvg at 0.40 + a seed effect, FedDr+ ahead
    of it by ``feddr_lead[cell]`` + a small seed-dependent wobble, the control 1 pp behind FedDr+."""
    rows, rng = [], np.random.default_rng(0)
    for model, epochs in report.PROBE.CELLS:
        lead = feddr_lead.get((model, epochs), 0.0)
        for seed in report.PROBE.EVAL_SEEDS:
            base = 0.40 + 0.02 * seed
            wobble = 0.001 * (seed - 2)
            for method, acc in (("fedavg", base), ("feddr+", base + lead + wobble), ("control", base + lead - 0.01)):
                rows.append({"model": model, "local_epochs": epochs, "method": method, "lr": 1.0, "seed": seed,
                             "role": "evaluation", "status": "done", "final_acc": acc, "late_acc": acc,
                             "weight_change": 0.01 * epochs * (1 + 0.1 * seed), "acc_unobs": acc / 4,
                             "align_unobs": 0.1, "forgetting_unobs": 0.02 * epochs + 0.001 * seed,
                             "grad_ratio_features": 0.01 if method == "feddr+" else np.nan,
                             "feature_norm": 5.0 + rng.random()})
    return pd.DataFrame(rows)


def test_c1_is_the_paired_difference_over_the_verdict_seeds(report):
    table = made_up_table(report, {("cnn_nobn", 5): 0.03})
    c1 = {c.setting: c for c in report.claims(table) if c.claim.startswith("C1")}
    paper_cell = c1[report.cell_label("cnn_nobn", 5)]
    assert paper_cell.diff.mean == pytest.approx(0.03)
    assert paper_cell.diff.n == len(report.PROBE.EVAL_SEEDS)
    assert paper_cell.verdict == fk.stats.HELD
    assert c1[report.cell_label("cnn_bn", 1)].verdict != fk.stats.HELD


def test_reading_names_the_cells_where_feddr_leads_and_not_the_teaching_cell(report):
    table = made_up_table(report, {("cnn_nobn", 5): 0.03})
    text = report.reading(report.claims(table))
    assert "cnn_nobn, E = 5" in text and "not in the teaching cell" in text
    nowhere = report.reading(report.claims(made_up_table(report, {})))
    assert nowhere.startswith("C1 holds in no cell")


def test_manipulation_check_and_interaction_rows(report):
    claims = report.claims(made_up_table(report, {("cnn_nobn", 5): 0.03, ("cnn_nobn", 1): 0.0}))
    c4 = [c for c in claims if c.claim.startswith("C4")]
    assert c4 and all(c.verdict == fk.stats.HELD for c in c4)  # the made-up drift grows with E
    bn_effect = next(c for c in claims if c.claim.startswith("C5: removing") and c.setting == "E = 5")
    assert bn_effect.diff.mean == pytest.approx(0.03)


def test_missing_seeds_are_untestable_and_the_report_says_so(report, tmp_path):
    table = made_up_table(report, {})
    table = table[~((table["model"] == "cnn_bn") & (table["local_epochs"] == 5) & (table["seed"] > 1))]
    claims = report.claims(table)
    assert next(c for c in claims if c.setting == f"{report.cell_label('cnn_bn', 5)}: {report.STILL_RUNNING}").verdict \
        == fk.stats.UNTESTABLE
    assert report.reading(claims).startswith("Not every cell")
    path = tmp_path / "runs.csv"
    table.to_csv(path, index=False)
    out = tmp_path / "drift.md"
    report.main(["--csv", str(path), "--out", str(out)])
    text = out.read_text()
    assert "## The pre-registered comparisons" in text and "untestable here" in text


def test_a_comparison_is_read_only_when_every_cell_it_reads_has_its_seeds_in(report):
    """One seed short in (cnn_bn, E = 5): its own comparisons, and the two-cell ones that read it (C4 for cnn_bn,
    C5 at E = 5), are untestable and say the seeds are still running, even though two seeds give an interval;
    every other comparison keeps its verdict, and the decided ones are exactly those."""
    full = made_up_table(report, {("cnn_nobn", 5): 0.03})
    short = full[~((full["model"] == "cnn_bn") & (full["local_epochs"] == 5) & (full["seed"] == 3))]
    assert report.complete_cells(short) == [report.cell_label(*c) for c in report.PROBE.CELLS if c != ("cnn_bn", 5)]
    running = {(c.claim[:2], c.setting.split(":")[0]) for c in report.claims(short) if report.STILL_RUNNING in c.setting}
    assert running == {("C1", "cnn_bn, E = 5"), ("C2", "cnn_bn, E = 5"), ("C3", "cnn_bn, E = 5"), ("C4", "cnn_bn"),
                       ("C5", "cnn_bn"), ("C5", "E = 5")}
    assert all(c.verdict == fk.stats.UNTESTABLE for c in report.claims(short) if report.STILL_RUNNING in c.setting)
    decided = report.decided_claims(short)
    assert len(decided) == sum(report.STILL_RUNNING not in c.setting for c in report.claims(short))
    assert all(c.verdict != fk.stats.UNTESTABLE for c in decided)
    assert [(c.claim, c.verdict) for c in report.decided_claims(full)] == [(c.claim, c.verdict) for c in report.claims(full)]
    c5 = next(c for c in decided if c.claim.startswith("C5: removing") and c.setting == "E = 1")  # both E = 1 cells in
    assert c5.verdict != fk.stats.UNTESTABLE


def test_budget_needs_are_runs_left_times_rounds_times_each_methods_idle_pace(report, monkeypatch):
    table = made_up_table(report, {})
    cell = (table["model"] == "cnn_nobn") & (table["local_epochs"] == 5)
    table = table[cell & (table["seed"] == 1)].assign(sec_per_round=3600.0 * report.PROBE.PROCESSES / report.PROBE.BASE["rounds"],
                                                        total_seconds=99.0)  # 3 runs, 3 h of the machine
    pace = {(m, e, meth): s for m, e in report.PROBE.CELLS for meth, s in (("fedavg", 20.0), ("feddr+", 30.0))}
    monkeypatch.setattr(report, "idle_pace", lambda: {**pace, **{(m, e, "control"): 20.0 for m, e in report.PROBE.CELLS}})
    grid_left = {("cnn_nobn", 5, "fedavg"): 1, ("cnn_nobn", 5, "feddr+"): 1}
    need = report.budget_table(table, grid_left).set_index("cell")
    row = need.loc[report.cell_label("cnn_nobn", 5)]
    assert row["verdict runs left"] == 6 and row["grid runs left"] == 2  # seeds 2 and 3 of three methods
    rounds = report.PROBE.BASE["rounds"]
    # FedAvg: a grid run and two verdict runs at 20 s; FedDr+: the same at 30 s; the control: two at FedAvg's pace
    assert row["machine-hours left, at least"] == pytest.approx(rounds * (3 * 20 + 3 * 30 + 2 * 20) / 3600 / report.PROBE.PROCESSES)
    other = need.drop(report.cell_label("cnn_nobn", 5))
    assert (other["verdict runs left"] == 9).all() and (other["grid runs left"] == 0).all()
    assert other["machine-hours left, at least"].tolist() == pytest.approx([rounds * 3 * 70 / 3600 / report.PROBE.PROCESSES] * 3)
    text = report.budget_text(table, grid_left)
    assert "took 3.0" in text and "That fits the budget" in text  # 3 h spent + 9.1 h needed (2 processes) < 25 h
    over = report.budget_text(table.assign(sec_per_round=6 * table["sec_per_round"]), grid_left)
    assert "more than the budget holds" in over and report.cell_label(*report.PROBE.CELLS[-1]) in over  # 18 + 9.1 > 25
    # a finished grid run of the cell is not a verdict run: the verdict runs left stay six
    grid_run = table.head(1).assign(role="grid", seed=0, lr=0.5)
    with_grid = report.budget_table(pd.concat([table, grid_run]), grid_left).set_index("cell")
    assert with_grid.loc[report.cell_label("cnn_nobn", 5), "verdict runs left"] == 6
    # the runs finished before the amendment are not counted against the amended budget
    before = table.assign(lr=0.03, seed=0, role="grid", method="fedavg", sec_per_round=50 * 3600.0)
    assert report.spent_hours(before.head(1)) == 0.0


def test_once_every_cell_is_in_the_report_says_so_and_that_none_was_cut(report, monkeypatch):
    """With every cell's verdict seeds in, the budget's account and the first paragraph say the probe ran to its
    end, no cell cut, with the machine-hours it took; one run short, they say how far it is instead."""
    full = made_up_table(report, {}).assign(sec_per_round=1800.0 * report.PROBE.PROCESSES / report.PROBE.BASE["rounds"])
    monkeypatch.setattr(report, "idle_pace", lambda: {(m, e, meth): 20.0 for m, e in report.PROBE.CELLS
                                                     for meth in report.PROBE.METHODS})
    nothing_left = {(m, e, meth): 0 for m, e in report.PROBE.CELLS for meth in report.PROBE.TUNED}
    runs = len(full)  # half an hour of the machine each
    assert report.budget_text(full, nothing_left).endswith(
        f"Every cell has its verdict seeds in, so no cell was cut: the probe took {runs / 2:.1f} of its "
        f"{report.PROBE.BUDGET_MACHINE_HOURS:g} machine-hours.")
    assert report.progress_text(full, runs, runs).startswith(f"**All {runs} runs finished**")
    short = full.iloc[:-1]
    assert "runs left need" not in report.budget_text(full, nothing_left)
    assert "no cell was cut" not in report.budget_text(short, nothing_left)
    assert report.progress_text(short, runs - 1, runs).startswith(f"**Progress: {runs - 1} of {runs} runs finished**")


def test_a_method_without_a_working_lr_has_no_verdict_runs_and_its_comparisons_say_why(report, monkeypatch):
    no_fd = lambda method, model, epochs: not (method in ("feddr+", "control") and (model, epochs) == ("cnn_bn", 5))
    monkeypatch.setattr(report.PROBE, "trains", no_fd)
    monkeypatch.setattr(report, "idle_pace", lambda: {})
    left = report.runs_left(made_up_table(report, {}).iloc[:0], grid_left={})
    assert left[("cnn_bn", 5, "feddr+")] == left[("cnn_bn", 5, "control")] == (0, 0)
    assert left[("cnn_bn", 5, "fedavg")] == (0, 3)
    claims = report.claims(made_up_table(report, {}))
    where = report.cell_label("cnn_bn", 5)
    c1 = [c for c in claims if c.setting.startswith(where) and c.claim.startswith(("C1", "C2", "C3"))]
    assert len(c1) == 3 and all(c.verdict == fk.stats.UNTESTABLE and report.NO_WORKING_LR in c.setting for c in c1)
    c4 = [c for c in claims if c.claim.startswith("C4") and c.setting == "cnn_bn"]
    assert c4 and all(report.NO_WORKING_LR not in c.setting for c in c4)  # FedAvg's drift needs no FedDr+ lr
