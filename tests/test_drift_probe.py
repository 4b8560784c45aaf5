"""The drift probe's pre-registered machinery (results/drift_probe.py): the lr rule's bracketing, the
control's lr, the seeds the verdicts use, and a tiny end-to-end run of the whole plan."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "results" / "drift_probe.py"


@pytest.fixture
def probe():
    spec = importlib.util.spec_from_file_location("drift_probe_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def scores_peaking_at(peak: float, done=lambda lr: True):
    """A fake finished-run measure: highest (1.0, a run that trains) at ``peak`` on a log scale, None for runs not
    yet done."""
    def score(item):
        return 1.0 - abs(math.log10(item.lr) - math.log10(peak)) if done(item.lr) else None
    return score


@pytest.mark.parametrize("peak, chosen, points", [
    (3.0, 3.0, [1.0, 3.0, 10.0]),                 # inside the first grid: no extension
    (30.0, 30.0, [1.0, 3.0, 10.0, 30.0, 100.0]),  # extends up until the winner is inside
    (0.3, 0.3, [0.1, 0.3, 1.0, 3.0, 10.0]),       # extends down likewise
    (1000.0, 100.0, [1.0, 3.0, 10.0, 30.0, 100.0]),  # at most two extra points: the edge then wins
])
def test_lr_rule_brackets_the_winner(probe, monkeypatch, peak, chosen, points):
    monkeypatch.setattr(probe, "score", scores_peaking_at(peak))
    assert probe.grid_points("feddr+", "cnn_bn", 1) == (points, chosen)


def test_lr_rule_waits_for_unfinished_runs_and_ranks_a_diverged_run_last(probe, monkeypatch):
    monkeypatch.setattr(probe, "score", scores_peaking_at(3.0, done=lambda lr: lr != 10.0))
    assert probe.grid_points("feddr+", "cnn_bn", 1) == ([1.0, 3.0, 10.0], None)
    # 0.3 would win, but the run at the largest lr diverged: it ranks last, so the winner (0.3) is inside
    monkeypatch.setattr(probe, "score", lambda it: -math.inf if it.lr == 0.3 else -abs(it.lr - 0.1))
    assert probe.grid_points("fedavg", "cnn_bn", 1) == ([0.03, 0.1, 0.3], 0.1)


def test_exact_tie_goes_to_the_smaller_lr(probe, monkeypatch):
    monkeypatch.setattr(probe, "score", lambda it: 0.5 if it.lr in (0.1, 0.3) else 0.1)
    assert probe.grid_points("fedavg", "cnn_bn", 1)[1] == 0.1


def test_control_is_dr_at_beta_times_feddr_lr_and_verdict_seeds_skip_the_grid_seed(probe, monkeypatch):
    monkeypatch.setattr(probe, "score", scores_peaking_at(3.0))
    assert probe.chosen_lr("control", "cnn_nobn", 5) == pytest.approx(2.7)
    items, undecided = probe.plan()
    assert undecided == 0
    control = [it for it in items if it.method == "control"]
    assert sorted({it.seed for it in control}) == [1, 2, 3]
    cfg = control[0].config()
    assert (cfg.algorithm, cfg.regularizer, cfg.lr) == ("dr", "none", pytest.approx(2.7))
    evaluation = [it for it in items if it.seed != probe.GRID_SEED]
    assert len(evaluation) == len(probe.CELLS) * len(probe.METHODS) * 3
    # the amended order: cell by cell in CELLS's order (the cheapest first), each cell's grid runs before its
    # verdict seeds, seed by seed
    cells = [(it.model, it.epochs) for it in items]
    assert list(dict.fromkeys(cells)) == probe.CELLS and cells == sorted(cells, key=probe.CELLS.index)
    for cell in probe.CELLS:
        seeds = [it.seed for it in items if (it.model, it.epochs) == cell]
        assert seeds == sorted(seeds) and seeds[0] == probe.GRID_SEED
    assert probe.CELLS[:2] == [("cnn_bn", 1), ("cnn_nobn", 1)]  # the one-epoch cells first, as amended


def test_a_method_whose_chosen_lr_does_not_train_gets_no_verdict_runs(probe, monkeypatch):
    # FedDr+'s grid peaks at 3, but the best run stays below the amendment's "trains" threshold
    monkeypatch.setattr(probe, "score", lambda it: (probe.TRAINS - 0.01 - abs(it.lr - 3.0) / 100) if it.method == "feddr+"
                        else probe.TRAINS + 0.1 - abs(it.lr - 0.1))
    assert probe.trains("feddr+", "cnn_bn", 1) is False and probe.trains("control", "cnn_bn", 1) is False
    assert probe.trains("fedavg", "cnn_bn", 1) is True
    items, undecided = probe.plan()
    verdict_methods = {it.method for it in items if it.seed != probe.GRID_SEED}
    assert undecided == 0 and verdict_methods == {"fedavg"}  # FedDr+ and its control are not run
    monkeypatch.setattr(probe, "score", lambda it: probe.TRAINS)  # exactly at the threshold: it trains
    assert probe.trains("feddr+", "cnn_bn", 1) is True


def test_tiny_plan_runs_end_to_end(probe, tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "CELLS", [("cnn_nobn", 1)])  # one cell: the whole machinery, a fifth of the runs
    probe.main(["--tiny", "--root", str(tmp_path)])
    table = pd.read_csv(tmp_path / "drift_probe.csv")
    history = pd.read_csv(tmp_path / "drift_probe_history.csv")
    assert set(table["status"]) <= {"done", "failed"}
    evaluation = table[table["role"] == "evaluation"]
    assert len(evaluation) == len(probe.CELLS) * len(probe.METHODS) * 3
    for column in ("late_acc", "weight_change", "forgetting_unobs", "acc_unobs"):
        assert evaluation[column].notna().all(), column
    assert (evaluation["weight_change"] > 0).all()
    assert table.loc[table["method"] == "feddr+", "grad_ratio_features"].notna().all()
    assert {"round", "weight_change", "test_acc"} <= set(history.columns)


def test_relative_change_closed_form():
    import torch
    from feddr_kit.probes import relative_change
    glob = [torch.tensor([3.0, 0.0]), torch.tensor([[0.0], [4.0]])]  # ‖θ_g‖ = 5
    local = [torch.tensor([3.0, 1.0]), torch.tensor([[0.0], [4.0 + 2.0]])]  # moved by (0, 1, 0, 2): ‖Δ‖ = √5
    assert relative_change(local, glob) == pytest.approx(math.sqrt(5) / 5)
    assert relative_change(glob, glob) == 0.0


def test_cnn_nobn_is_cnn_bn_without_its_batchnorm():
    import torch
    import feddr_kit as fk
    torch.manual_seed(0)
    bn, plain = fk.models.build_model("cnn_bn", 10), fk.models.build_model("cnn_nobn", 10)
    kinds = lambda net: [type(m).__name__ for m in net.body]
    assert [k for k in kinds(bn) if k != "BatchNorm2d"] == kinds(plain)
    assert (bn.feature_dim, bn.batch_stat_norm, plain.batch_stat_norm) == (plain.feature_dim, True, False)
    x = torch.randn(4, 3, 32, 32)
    # no batch statistics: an image's features do not depend on the rest of its batch
    torch.testing.assert_close(plain.features(x)[:1], plain.features(x[:1]))
    # He-normal with fan-out, as the paper's BatchNorm-free VGG-11: std √(2 / (9 · out_channels))
    convs = [m for m in plain.body if isinstance(m, torch.nn.Conv2d)]
    for conv in convs:
        assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (9 * conv.out_channels)), rel=0.1)
        assert conv.bias is not None and not conv.bias.any()


def test_probed_history_records_the_extractors_weight_change():
    import feddr_kit as fk
    cfg = fk.Config(dataset="synthetic", model="cnn_nobn", algorithm="fedavg", lr=0.05, rounds=2, eval_every=1,
                    probes=True, num_clients=4, clients_per_round=2, probe_samples=20, progress=False)
    h = fk.run(cfg).history
    assert (h["weight_change"] > 0).all()
    # the second round trains at a tenth of the lr (the schedule's decay at half the rounds): a smaller move
    assert h["weight_change"].iloc[1] < h["weight_change"].iloc[0]


CHILD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("drift_probe_child", sys.argv[1])
probe = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = probe
spec.loader.exec_module(probe)
probe.CELLS, probe.EVAL_SEEDS = [("cnn_nobn", 1)], (1,)
probe.TINY = {**probe.TINY, "rounds": 6}  # checkpoints at rounds 2, 4 and 6: a pause after the first lands mid-run
probe.main(["--tiny", "--root", sys.argv[2]])
"""


def _without_timings(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path)
    return frame.drop(columns=[c for c in ("seconds", "sec_per_round", "total_seconds", "machine") if c in frame])


@pytest.mark.slow
def test_a_probe_paused_at_a_checkpoint_killed_and_started_again_gives_the_uninterrupted_histories(probe, tmp_path,
                                                                                                   monkeypatch):
    """The way a run is carried from one working day to the next: --pause stops the probe just after a
    checkpoint, the process dies with the day, and the next day's probe resumes from that checkpoint."""
    import os
    import signal
    import subprocess
    import time
    monkeypatch.setattr(probe, "CELLS", [("cnn_nobn", 1)])  # one cell and one verdict seed: 9 runs, as in the child
    monkeypatch.setattr(probe, "EVAL_SEEDS", (1,))
    monkeypatch.setattr(probe, "TINY", {**probe.TINY, "rounds": 6})
    carried, whole = tmp_path / "carried", tmp_path / "whole"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(SCRIPT), str(carried)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        monkeypatch.setattr(probe, "ROOT", carried)
        deadline = time.time() + 120
        while not list(carried.glob("*/*/seed=*/checkpoint.pt")):  # a run under way, past its first checkpoint
            assert child.poll() is None and time.time() < deadline, "the probe ended before its first checkpoint"
            time.sleep(0.05)
        called = time.time_ns()
        line = probe.pause(poll=0.01, timeout=60)
        assert "paused probe process" in line
        if "just after its checkpoint" in line:  # it waited for the run's next checkpoint before stopping it
            folder = Path(line.split(" of ", 1)[1].splitlines()[0])
            assert (folder / "checkpoint.pt").stat().st_mtime_ns >= called
        in_progress = [p for p in carried.glob("*/*/seed=*/checkpoint.pt") if not (p.parent / "summary.json").exists()]
        child.kill()  # the working day ends with the probe stopped: nothing after the checkpoint is kept
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    probe.main(["--tiny", "--root", str(carried)])  # the next day: resumes what was under way, runs the rest
    monkeypatch.setattr(probe, "ROOT", whole)
    probe.main(["--tiny", "--root", str(whole)])
    pd.testing.assert_frame_equal(_without_timings(carried / "drift_probe_history.csv"),
                                  _without_timings(whole / "drift_probe_history.csv"))
    pd.testing.assert_frame_equal(_without_timings(carried / "drift_probe.csv"), _without_timings(whole / "drift_probe.csv"))
    assert not list(carried.glob("*/*/seed=*/checkpoint.pt"))  # a finished run's checkpoint is not carried
    assert in_progress or "between runs" in line or "finished its run" in line  # what was carried, if anything
