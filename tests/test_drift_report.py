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
    assert next(c for c in claims if c.setting == report.cell_label("cnn_bn", 5)).verdict == fk.stats.UNTESTABLE
    assert report.reading(claims).startswith("Not every cell")
    path = tmp_path / "runs.csv"
    table.to_csv(path, index=False)
    out = tmp_path / "drift.md"
    report.main(["--csv", str(path), "--out", str(out)])
    text = out.read_text()
    assert "## The pre-registered comparisons" in text and "untestable here" in text


def test_budget_needs_are_runs_left_times_rounds_times_the_fastest_seconds_per_round(report):
    table = made_up_table(report, {})
    cell = (table["model"] == "cnn_nobn") & (table["local_epochs"] == 5)
    table = table[~cell | (table["seed"] == 1)].assign(sec_per_round=30.0, total_seconds=3600.0)
    table.loc[cell & (table["method"] == "fedavg"), "sec_per_round"] = 20.0  # the fastest run sets the bound
    table = table[(table["model"] == "cnn_nobn") & (table["local_epochs"] == 5)]  # the other cells not measured
    need = report.budget_table(table, grid_left={("cnn_nobn", 5): 2}).set_index("cell")
    row = need.loc[report.cell_label("cnn_nobn", 5)]
    assert row["verdict runs left"] == 6 and row["grid runs left"] == 2  # seeds 2 and 3 of three methods
    assert row["core-hours needed, at least"] == pytest.approx(8 * report.PROBE.BASE["rounds"] * 20.0 / 3600)
    assert need["core-hours needed, at least"].drop(report.cell_label("cnn_nobn", 5)).isna().all()
    text = report.budget_text(table, grid_left={("cnn_nobn", 5): 2})
    assert "recorded 3.0" in text and "more than the budget" not in text  # 3 h spent + 3.6 h needed < 14 h
    over = report.budget_text(table.assign(total_seconds=4 * 3600.0), grid_left={("cnn_nobn", 5): 2})
    assert "more than the budget holds" in over  # 12 h spent + 3.6 h needed > 14 h
