"""Behaviour of the round loop: determinism, exact resume, frozen heads, NaN handling, outputs."""
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

import feddr_kit as fk
from feddr_kit.errors import FeddrKitError
from feddr_kit.federated import lr_at, sample_clients

SMALL = dict(dataset="synthetic", num_clients=10, clients_per_round=3, rounds=4, local_epochs=1,
             progress=False, checkpoint_every=1, eval_every=1)


@pytest.fixture(scope="module")
def synthetic():
    return fk.data.load("synthetic")


def deterministic_columns(history: pd.DataFrame) -> pd.DataFrame:
    """All history columns but the wall-clock ``seconds``."""
    return history.drop(columns=["seconds"])


@pytest.mark.parametrize("algorithm", ["fedavg", "fedbabu", "dr", "feddr+"])
def test_same_seed_same_history(synthetic, algorithm, tmp_path):
    a = fk.run(fk.Config(algorithm=algorithm, out_dir=str(tmp_path / "a"), **SMALL), data=synthetic)
    b = fk.run(fk.Config(algorithm=algorithm, out_dir=str(tmp_path / "b"), **SMALL), data=synthetic)
    pd.testing.assert_frame_equal(deterministic_columns(a.history), deterministic_columns(b.history))
    for name, t in a.model.state_dict().items():
        assert torch.equal(t, b.model.state_dict()[name]), name
    csv_a = pd.read_csv(tmp_path / "a" / "history.csv").drop(columns=["seconds"])
    csv_b = pd.read_csv(tmp_path / "b" / "history.csv").drop(columns=["seconds"])
    pd.testing.assert_frame_equal(csv_a, csv_b)


def test_different_seed_different_run(synthetic):
    a = fk.run(fk.Config(algorithm="fedavg", seed=0, **SMALL), data=synthetic)
    b = fk.run(fk.Config(algorithm="fedavg", seed=1, **SMALL), data=synthetic)
    assert not torch.equal(a.model.head.weight, b.model.head.weight)


@pytest.mark.parametrize("algorithm", ["fedavg", "feddr+"])
def test_interrupted_then_resumed_equals_uninterrupted(synthetic, algorithm, tmp_path):
    straight = fk.run(fk.Config(algorithm=algorithm, out_dir=str(tmp_path / "straight"), probes=True, **SMALL),
                      data=synthetic)

    def stop_after_two(row):
        if row["round"] == 2:
            raise KeyboardInterrupt

    cfg = fk.Config(algorithm=algorithm, out_dir=str(tmp_path / "resumed"), probes=True, **SMALL)
    with pytest.raises(KeyboardInterrupt):
        fk.run(cfg, data=synthetic, callback=stop_after_two)
    resumed = fk.run(cfg, data=synthetic, resume=True)
    pd.testing.assert_frame_equal(deterministic_columns(straight.history), deterministic_columns(resumed.history))
    for name, t in straight.model.state_dict().items():
        assert torch.equal(t, resumed.model.state_dict()[name]), name


@pytest.mark.parametrize("algorithm", ["fedbabu", "dr", "feddr+"])
def test_frozen_heads_are_bit_identical_after_training(synthetic, algorithm):
    cfg = fk.Config(algorithm=algorithm, **SMALL)
    result = fk.run(cfg, data=synthetic)
    torch.manual_seed(cfg.seed)
    algo = fk.algorithms.get_algorithm(cfg)
    fresh = fk.models.build_model("cnn", synthetic.num_classes, head_bias=algo.head_bias)
    algo.setup(fresh, cfg.seed)
    assert torch.equal(result.model.head.weight, fresh.head.weight)
    assert not result.model.head.weight.requires_grad
    if algorithm == "fedbabu":  # its head bias is frozen too (the reference's); dr/feddr+ heads have none
        assert torch.equal(result.model.head.bias, fresh.head.bias) and not result.model.head.bias.requires_grad
    else:
        assert result.model.head.bias is None


def test_fedavg_head_trains(synthetic):
    cfg = fk.Config(algorithm="fedavg", **SMALL)
    result = fk.run(cfg, data=synthetic)
    torch.manual_seed(cfg.seed)
    fresh = fk.models.build_model("cnn", synthetic.num_classes)
    assert not torch.equal(result.model.head.weight, fresh.head.weight)


def test_dr_head_is_a_simplex_etf(synthetic):
    result = fk.run(fk.Config(algorithm="dr", **SMALL), data=synthetic)
    V = result.model.head.weight.double()
    C = V.shape[0]
    G = V @ V.T
    assert torch.allclose(G.diagonal(), torch.ones(C, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(G[0, 1:], torch.full((C - 1,), -1 / (C - 1), dtype=torch.float64), atol=1e-6)


def test_feddr_plus_is_dr_with_feature_distillation(synthetic):
    a = fk.run(fk.Config(algorithm="feddr+", **SMALL), data=synthetic)
    b = fk.run(fk.Config(algorithm="dr", regularizer="fd", **SMALL), data=synthetic)
    c = fk.run(fk.Config(algorithm="dr", **SMALL), data=synthetic)
    pd.testing.assert_frame_equal(deterministic_columns(a.history), deterministic_columns(b.history))
    assert not deterministic_columns(a.history).equals(deterministic_columns(c.history))


def test_all_algorithms_share_the_client_stream():
    rounds = [sample_clients(0, t, 100, 10) for t in range(5)]
    assert all(len(set(r)) == 10 for r in rounds)
    assert [list(r) for r in rounds] == [list(sample_clients(0, t, 100, 10)) for t in range(5)]
    assert list(sample_clients(0, 0, 100, 10)) != list(sample_clients(1, 0, 100, 10))


def test_lr_schedule_decays_at_half_and_three_quarters():
    cfg = fk.Config(rounds=320)
    assert lr_at(cfg, 0.35, 0) == 0.35 and lr_at(cfg, 0.35, 159) == 0.35
    assert lr_at(cfg, 0.35, 160) == pytest.approx(0.035) and lr_at(cfg, 0.35, 239) == pytest.approx(0.035)
    assert lr_at(cfg, 0.35, 240) == pytest.approx(0.0035)


def test_outputs_and_history_columns(synthetic, tmp_path):
    result = fk.run(fk.Config(algorithm="feddr+", probes=True, out_dir=str(tmp_path), **SMALL), data=synthetic)
    for name in ("config.json", "history.csv", "summary.json", "checkpoint.pt"):
        assert (tmp_path / name).exists(), name
    hist = pd.read_csv(tmp_path / "history.csv")
    for col in ["round", "lr", "test_acc", "local_test_acc", "train_loss", "seconds"] + fk.probes.PROBE_COLUMNS:
        assert col in hist.columns, col
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("final_acc", "best_acc", "last5_acc", "sec_per_round", "rounds", "algorithm", "seed"):
        assert key in summary, key
    assert summary["best_acc"] >= summary["final_acc"]
    assert fk.Config.from_dict(json.loads((tmp_path / "config.json").read_text())) == result.config
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temp files


def test_nan_loss_names_round_and_client_and_keeps_checkpoint(synthetic, tmp_path):
    cfg = fk.Config(algorithm="fedavg", out_dir=str(tmp_path), **{**SMALL, "rounds": 3})
    fk.run(cfg, data=synthetic)
    before = (tmp_path / "checkpoint.pt").read_bytes()
    with pytest.warns(UserWarning, match="resuming with"), \
            pytest.raises(FloatingPointError, match=r"round 4, client \d+.*smaller learning rate"):
        fk.run(cfg.replace(lr=1e30, rounds=5), data=synthetic, resume=True)
    assert (tmp_path / "checkpoint.pt").read_bytes() == before


def test_resume_refuses_a_changed_config(synthetic, tmp_path):
    cfg = fk.Config(algorithm="fedavg", out_dir=str(tmp_path), **{**SMALL, "rounds": 2})
    fk.run(cfg, data=synthetic)
    with pytest.raises(FeddrKitError, match="config field momentum"):
        fk.run(cfg.replace(momentum=0.5), data=synthetic, resume=True)
    with pytest.raises(FeddrKitError, match="no checkpoint"):
        fk.run(cfg.replace(out_dir=str(tmp_path / "empty")), data=synthetic, resume=True)


@pytest.mark.parametrize("field,value,needle", [
    ("rounds", 0, "rounds"), ("lr", -0.1, "lr"), ("beta", 1.5, "beta"), ("alpha", 0, "alpha"),
    ("clients_per_round", 200, "clients_per_round"), ("algorithm", "fedsgd", "algorithm"),
    ("model", "resnet", "model"), ("partition", "pathological", "partition"), ("regularizer", "l2", "regularizer"),
    ("momentum", 1.0, "momentum"), ("dataset", "mnist", "dataset"), ("device", "tpu", "device"),
])
def test_config_rejects_bad_values_naming_the_field(field, value, needle):
    with pytest.raises(FeddrKitError, match=needle):
        fk.Config(**{field: value})


def test_dirichlet_runs_a_fixed_number_of_steps(synthetic):
    from feddr_kit.federated import local_steps
    cfg = fk.Config(partition="dirichlet", local_epochs=2, batch_size=50)
    assert local_steps(7, cfg, 500) == local_steps(900, cfg, 500) == 2 * 10
    cfg = fk.Config(partition="shard", local_epochs=2, batch_size=50)
    assert local_steps(500, cfg, 500) == 20 and local_steps(510, cfg, 500) == 22
    result = fk.run(fk.Config(algorithm="feddr+", **{**SMALL, "partition": "dirichlet", "alpha": 0.5}), data=synthetic)
    assert math.isfinite(result.summary["final_acc"])


def test_cli_writes_outputs(tmp_path, capsys):
    from feddr_kit.__main__ import main
    code = main(["run", "--dataset", "synthetic", "--num-clients", "10", "--clients-per-round", "2",
                 "--rounds", "2", "--progress", "false", "--out-dir", str(tmp_path)])
    assert code == 0
    assert "final accuracy" in capsys.readouterr().out
    assert (tmp_path / "summary.json").exists()
    assert main(["run", "--alpha", "-1"]) == 2
    assert "alpha must be" in capsys.readouterr().err
