"""Behaviour of the round loop: determinism, exact resume, frozen heads, NaN handling, outputs."""
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

import feddr_kit as fk
from feddr_kit import federated, local
from feddr_kit.algorithms import Batch, ClientContext, get_algorithm
from feddr_kit.errors import FeddrKitError
from feddr_kit.federated import lr_at, sample_clients
from feddr_kit.models import Net

SMALL = dict(dataset="synthetic", model="cnn", shards_per_client=2, num_clients=10, clients_per_round=3, rounds=4, local_epochs=1,
             progress=False, checkpoint_every=1, eval_every=1)


pytestmark = pytest.mark.usefixtures("one_thread")


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
    # The loss on a hand-made batch: head rows at 90°, 210°, 330° (a simplex ETF of 3 classes in 2-D),
    # h = [(0, 2), (1, 0)] with labels [0, 2] -> cosines 1 and √3/2, so L_DR = ½·½(√3/2 - 1)²;
    # h_g = [(0, 1), (1, 1)] -> L_FD = mean of (0, 1, 0, 1)² = ½; FedDr+ = 0.9·L_DR + 0.1·L_FD.
    algo = get_algorithm(fk.Config(algorithm="feddr+"))
    model = Net(torch.nn.Identity(), 2, 3)
    with torch.no_grad():
        model.head.weight.copy_(torch.tensor([[0.0, 1.0], [-math.sqrt(3) / 2, -0.5], [math.sqrt(3) / 2, -0.5]]))
    h, y = torch.tensor([[0.0, 2.0], [1.0, 0.0]]), torch.tensor([0, 2])
    b = Batch(x=h, y=y, h=h, z=algo.logits(model, h), h_g=torch.tensor([[0.0, 1.0], [1.0, 1.0]]))
    ctx = ClientContext(client=0, round=0, lr=0.1, num_samples=2, num_steps=1, class_counts=torch.ones(3),
                        global_state={})
    dr, fd = 0.5 * 0.5 * (math.sqrt(3) / 2 - 1) ** 2, 0.5
    assert algo.loss(model, b, ctx).item() == pytest.approx(0.9 * dr + 0.1 * fd, rel=1e-6)
    # and a whole run of feddr+ is dr with regularizer fd, which differs from dr alone
    a = fk.run(fk.Config(algorithm="feddr+", **SMALL), data=synthetic)
    b = fk.run(fk.Config(algorithm="dr", regularizer="fd", **SMALL), data=synthetic)
    c = fk.run(fk.Config(algorithm="dr", **SMALL), data=synthetic)
    pd.testing.assert_frame_equal(deterministic_columns(a.history), deterministic_columns(b.history))
    assert not deterministic_columns(a.history).equals(deterministic_columns(c.history))


def test_all_algorithms_share_the_client_stream(synthetic, monkeypatch):
    trained: list[tuple[int, int]] = []  # (round, client) of every local training, in order
    train_client = local.train_client

    def spy(model, teacher, algo, data, idx, ctx, cfg, device):
        trained.append((ctx.round, ctx.client))
        return train_client(model, teacher, algo, data, idx, ctx, cfg, device)

    monkeypatch.setattr(local, "train_client", spy)
    streams = {}
    for i, algorithm in enumerate(["fedavg", "feddr+", "fedetf"]):
        np.random.seed(100 + i)  # the global RNGs must not matter
        torch.manual_seed(100 + i)
        trained.clear()
        fk.run(fk.Config(algorithm=algorithm, **{**SMALL, "rounds": 3, "checkpoint_every": 0}), data=synthetic)
        streams[algorithm] = list(trained)
    assert streams["fedavg"] == streams["feddr+"] == streams["fedetf"]
    expected = [(t, int(k)) for t in range(3) for k in sample_clients(0, t, 10, 3)]
    assert streams["fedavg"] == expected
    rounds = [sample_clients(0, t, 100, 10) for t in range(5)]
    assert all(len(set(r)) == 10 and set(r) <= set(range(100)) for r in rounds)
    assert len({tuple(r) for r in rounds}) == 5  # a new draw every round
    assert list(sample_clients(0, 0, 100, 10)) != list(sample_clients(1, 0, 100, 10))


def test_lr_schedule_decays_at_half_and_three_quarters():
    cfg = fk.Config(rounds=320)
    assert lr_at(cfg, 0.35, 0) == 0.35 and lr_at(cfg, 0.35, 159) == 0.35
    assert lr_at(cfg, 0.35, 160) == pytest.approx(0.035) and lr_at(cfg, 0.35, 239) == pytest.approx(0.035)
    assert lr_at(cfg, 0.35, 240) == pytest.approx(0.0035)


def test_outputs_and_history_columns(synthetic, tmp_path):
    result = fk.run(fk.Config(algorithm="feddr+", lr=0.04, probes=True, out_dir=str(tmp_path), **SMALL),
                    data=synthetic)
    for name in ("config.json", "history.csv", "summary.json", "checkpoint.pt"):
        assert (tmp_path / name).exists(), name
    hist = pd.read_csv(tmp_path / "history.csv")
    for col in ["round", "lr", "test_acc", "local_test_acc", "train_loss", "seconds"] + fk.probes.PROBE_COLUMNS:
        assert col in hist.columns, col
    pd.testing.assert_frame_equal(hist, result.history, check_dtype=False, rtol=1e-12)  # the file is the history
    assert hist["round"].tolist() == [1, 2, 3, 4]
    assert hist["lr"].tolist() == pytest.approx([0.04, 0.04, 0.004, 0.0004])  # milestones int(0.5·4), int(0.75·4)
    for col in ("test_acc", "local_test_acc", "acc_obs", "global_acc_obs", "acc_unobs", "global_acc_unobs"):
        assert hist[col].between(0, 1).all(), col
    assert hist["feat_angle_obs"].between(0, 180).all() and (hist["feat_dist_obs"] >= 0).all()
    assert hist["align_obs"].between(-1, 1).all() and np.isfinite(hist["train_loss"]).all()
    summary = json.loads((tmp_path / "summary.json").read_text())
    acc = hist["test_acc"]
    assert summary["final_acc"] == pytest.approx(acc.iloc[-1])
    assert summary["best_acc"] == pytest.approx(acc.max())
    assert summary["last5_acc"] == pytest.approx(acc.tail(5).mean())
    assert summary["final_local_acc"] == pytest.approx(hist["local_test_acc"].iloc[-1])
    assert summary["rounds"] == 4 and summary["algorithm"] == "feddr+" and summary["seed"] == 0
    assert summary["sec_per_round"] > 0
    assert fk.Config.from_dict(json.loads((tmp_path / "config.json").read_text())) == result.config
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ckpt["next_round"] == 4
    for name, t in result.model.state_dict().items():  # the checkpoint holds the reported model
        assert torch.equal(ckpt["global_state"][name], t), name
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
    with pytest.raises(FeddrKitError, match="momentum: 0.9 -> 0.5"):
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
