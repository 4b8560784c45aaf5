"""The baselines: SCAFFOLD, FedNTD, FedExP, SphereFed, FedETF, and the regularizers on every method.

Hand-made tensors check each server/client rule against its formula; short runs on
the synthetic set check that every algorithm trains on the shared loop, through the CLI too, and
that the stateful ones resume exactly.
"""
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import feddr_kit as fk
from feddr_kit import heads, losses
from feddr_kit.algorithms import (Batch, ClientContext, FedExP, Scaffold, effective_steps, fedexp_server_lr,
                                  get_algorithm)
from feddr_kit.federated import local_step
from feddr_kit.models import Net, build_model

ALL = ["fedavg", "fedbabu", "scaffold", "fedntd", "fedexp", "spherefed", "fedetf", "dr", "feddr+"]
REGULARIZERS = ["none", "prox", "kd", "ntd", "ld", "fd"]
TINY = dict(dataset="synthetic", model="cnn", shards_per_client=2, num_clients=10, clients_per_round=2, rounds=2, local_epochs=1,
            eval_every=1, progress=False)


pytestmark = pytest.mark.usefixtures("one_thread")


def linear_net(dim: int = 3, classes: int = 2) -> Net:
    """A model whose only parameter is the head ``[classes, dim]``: features are the inputs."""
    return Net(nn.Identity(), dim, classes)


def context(global_state: dict, client: int = 1, lr: float = 0.1, classes: int = 2) -> ClientContext:
    return ClientContext(client=client, round=0, lr=lr, num_samples=10, num_steps=0,
                         class_counts=torch.ones(classes), global_state=global_state)


def history(result) -> pd.DataFrame:
    """The training record: the history without wall time and without the gradient-ratio instruments
    (recorded only with a regularizer, so absent from a run without one)."""
    return result.history.drop(columns=["seconds", *fk.instruments.COLUMNS], errors="ignore")


# --------------------------------------------------------------------------- FedExP
def fedexp_with_head(dim: int, eps: float) -> tuple[FedExP, Net]:
    algo = get_algorithm(fk.Config(algorithm="fedexp", fedexp_eps=eps))
    model = linear_net(dim)
    model.register_buffer("stat", torch.zeros(2))  # a float buffer: averaged, never extrapolated
    algo.setup(model, 0)
    return algo, model


def fedexp_round(algo: FedExP, model: Net, x: dict, ys: list[torch.Tensor], weights: list[float], round: int):
    """One server round from client heads ``ys``: uploads through ``client_end``, the loop's weighted average."""
    uploads = []
    for y in ys:
        model.load_state_dict({"head.weight": y, "stat": torch.full((2,), 7.0)})
        uploads.append(algo.client_end(model, context(x)))
    average = {"head.weight": sum(w * y for w, y in zip(weights, ys)), "stat": torch.full((2,), 7.0)}
    return algo.server_update(x, average, uploads, weights, round)


def test_fedexp_step_equals_its_formula_on_hand_made_deltas():
    eps0 = 1e-3
    algo, model = fedexp_with_head(dim=2, eps=eps0)  # 4 parameters
    x0 = {"head.weight": torch.zeros(2, 2), "stat": torch.zeros(2)}
    # Round 0: four orthogonal unit updates, equal weights -> A = 1, ||mean||^2 = 4/16.
    ys = [torch.eye(4)[i].view(2, 2) for i in range(4)]
    x1 = fedexp_round(algo, model, x0, ys, [0.25] * 4, round=0)
    eps = eps0 * 0.998**2
    eta = 0.5 * 1.0 / (0.25 + 4 * eps)
    assert algo.last_eta_g == pytest.approx(eta, rel=1e-12) and eta > 1.9
    assert torch.allclose(x1["head.weight"], torch.full((2, 2), 0.25 * eta))
    assert torch.equal(x1["stat"], torch.full((2,), 7.0))  # buffer: the plain average
    assert torch.equal(algo.eval_state(x1)["head.weight"], x1["head.weight"])  # round 0 reports x_1
    # Round 1: two identical updates -> A = ||mean||^2, so 0.5·A/(...) < 1 and the step is plain FedAvg.
    v = torch.tensor([[1.0, -2.0], [0.5, 3.0]])
    x2 = fedexp_round(algo, model, x1, [x1["head.weight"] + v] * 2, [0.3, 0.7], round=1)
    assert algo.eta_g == [pytest.approx(eta, rel=1e-12), 1.0]
    assert torch.allclose(x2["head.weight"], x1["head.weight"] + v)
    assert algo.eps == pytest.approx(eps0 * 0.998**4, rel=1e-12)
    # Reported: the mean of the last two iterates; training continues from x2.
    assert torch.allclose(algo.eval_state(x2)["head.weight"], (x1["head.weight"] + x2["head.weight"]) / 2)
    assert torch.equal(algo.eval_state(x2)["stat"], x2["stat"])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), dim=st.integers(1, 5), eps=st.sampled_from([0.0, 1e-6, 1e-3, 0.1]),
       seed=st.integers(0, 10_000))
def test_fedexp_step_is_at_least_one_and_matches_the_formula(n, dim, eps, seed):
    g = torch.Generator().manual_seed(seed)
    algo, model = fedexp_with_head(dim=dim, eps=eps)
    x = {"head.weight": torch.randn(2, dim, generator=g, dtype=torch.float64), "stat": torch.zeros(2)}
    deltas = [torch.randn(2, dim, generator=g, dtype=torch.float64) * float(torch.rand((), generator=g) * 3)
              for _ in range(n)]
    sizes = torch.randint(1, 50, (n,), generator=g).double()
    p = (sizes / sizes.sum()).tolist()
    uploads = [{"delta_sq_norm": float(d.pow(2).sum())} for d in deltas]
    mean = sum(w * d for w, d in zip(p, deltas))
    average = {"head.weight": x["head.weight"] + mean, "stat": torch.zeros(2)}
    new = algo.server_update(x, average, uploads, p, 0)
    A = sum(w * float(d.pow(2).sum()) for w, d in zip(p, deltas))
    den = float(mean.pow(2).sum()) + n * eps * 0.998**2
    expected = 1.0 if den == 0 else max(1.0, 0.5 * A / den)
    assert algo.last_eta_g >= 1.0
    assert algo.last_eta_g == pytest.approx(expected, rel=1e-9)
    assert torch.allclose(new["head.weight"], x["head.weight"] + expected * mean, atol=1e-9)


def test_fedexp_without_extrapolation_trains_like_fedavg(synthetic):
    # A huge ε forces η_g = 1: the same training as FedAvg (up to float rounding of x + (avg - x)).
    a = fk.run(fk.Config(algorithm="fedavg", **{**TINY, "rounds": 3}), data=synthetic)
    b = fk.run(fk.Config(algorithm="fedexp", fedexp_eps=1e6, **{**TINY, "rounds": 3}), data=synthetic)
    assert b.algorithm.eta_g == [1.0, 1.0, 1.0]
    np.testing.assert_allclose(a.history["train_loss"], b.history["train_loss"], rtol=1e-4)
    assert a.history["test_acc"].iloc[0] == b.history["test_acc"].iloc[0]  # round 1 reports x_1 itself


def test_fedexp_server_lr_edge_cases():
    assert fedexp_server_lr(0.0, 0.0, 3, 0.0) == 1.0  # no update at all
    assert fedexp_server_lr(1.0, 1.0, 2, 0.0) == 1.0  # identical updates: 0.5 < 1
    assert fedexp_server_lr(4.0, 0.5, 2, 0.25) == pytest.approx(2.0)


# --------------------------------------------------------------------------- SCAFFOLD
def test_effective_steps():
    assert effective_steps(7, 0.0) == 7
    assert effective_steps(1, 0.9) == pytest.approx(1.0)
    K, rho = 5, 0.9
    assert effective_steps(K, rho) == pytest.approx(sum((1 - rho**k) / (1 - rho) for k in range(1, K + 1)))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_scaffold_control_variates_on_a_linear_loss(momentum):
    # Loss <g, W> has the constant gradient g. Corrected SGD moves W by -lr·K_eff·(g - c_i + c),
    # so option II gives back c_i⁺ = c_i - c + (x - y)/(K_eff·lr) = g exactly.
    cfg = fk.Config(algorithm="scaffold", num_clients=4, clients_per_round=1, momentum=momentum, weight_decay=0.0)
    algo: Scaffold = get_algorithm(cfg)
    model = linear_net()
    algo.setup(model, 0)
    g = torch.tensor([[0.3, -1.0, 2.0], [0.5, 0.0, -0.7]])
    c0 = torch.tensor([[0.1, 0.2, 0.3], [-0.4, 0.5, 0.0]])
    ci0 = torch.tensor([[-0.2, 0.0, 0.1], [0.3, 0.3, -0.1]])
    algo.c = {"head.weight": c0.clone()}
    algo.c_clients[1] = {"head.weight": ci0.clone()}
    x = {"head.weight": torch.randn(2, 3)}
    model.load_state_dict(x)
    lr, K = 0.05, 6
    ctx = context(x, client=1, lr=lr)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=0.0)
    algo.client_start(model, ctx)
    for step in range(K):  # the loop's order: backward, before_step, step
        opt.zero_grad(set_to_none=True)
        (g * model.head.weight).sum().backward()
        assert torch.allclose(model.head.weight.grad, g)
        algo.before_step(model, ctx)
        assert torch.allclose(model.head.weight.grad, g - ci0 + c0)
        opt.step()
    y = model.head.weight.detach()
    k_eff = effective_steps(K, momentum)
    assert torch.allclose(y, x["head.weight"] - lr * k_eff * (g - ci0 + c0), atol=1e-6)
    upload = algo.client_end(model, ctx)
    assert torch.allclose(algo.c_clients[1]["head.weight"], g, atol=1e-4)
    assert torch.allclose(upload["delta_c"]["head.weight"], g - ci0, atol=1e-4)
    average = {"head.weight": y.clone()}
    new = algo.server_update(x, average, [upload], [1.0], 0)
    assert new is average  # x ← the weighted average (η_g = 1)
    assert torch.allclose(algo.c["head.weight"], c0 + (g - ci0) / 4, atol=1e-5)  # c += (1/N) Σ Δc_i


def test_scaffold_state_persists_across_rounds(synthetic):
    cfg = fk.Config(algorithm="scaffold", **{**TINY, "rounds": 3})
    result = fk.run(cfg, data=synthetic)
    algo = result.algorithm
    sampled = {int(k) for t in range(3) for k in fk.federated.sample_clients(cfg.seed, t, 10, 2)}
    assert set(algo.c_clients) == sampled
    assert set(algo.c) == {n for n, _ in result.model.named_parameters()}
    # c starts at 0 and moves by (1/N)·Σ Δc_i while each c_i moves by Δc_i, so c is always the mean of all c_i.
    for n, c in algo.c.items():
        mean_ci = sum(ci[n] for ci in algo.c_clients.values()) / cfg.num_clients
        assert torch.allclose(c, mean_ci, atol=1e-6), n
        assert c.abs().max() > 0


@pytest.mark.parametrize("algorithm,extra", [("scaffold", {}), ("fedexp", {}), ("fedetf", {}),
                                             ("spherefed", {"spherefed_calibration": True})])
def test_interrupted_then_resumed_equals_uninterrupted(synthetic, tmp_path, algorithm, extra):
    common = dict(algorithm=algorithm, checkpoint_every=1, **{**TINY, "rounds": 4}, **extra)
    straight = fk.run(fk.Config(out_dir=str(tmp_path / "straight"), **common), data=synthetic)

    def stop_after_two(row):
        if row["round"] == 2:
            raise KeyboardInterrupt

    cfg = fk.Config(out_dir=str(tmp_path / "resumed"), **common)
    with pytest.raises(KeyboardInterrupt):
        fk.run(cfg, data=synthetic, callback=stop_after_two)
    resumed = fk.run(cfg, data=synthetic, resume=True)
    pd.testing.assert_frame_equal(history(straight), history(resumed))
    for name, t in straight.model.state_dict().items():
        assert torch.equal(t, resumed.model.state_dict()[name]), name
    a, b = straight.algorithm.state_dict(), resumed.algorithm.state_dict()
    if algorithm == "scaffold":
        assert all(torch.equal(a["c"][n], b["c"][n]) for n in a["c"])
        assert set(a["c_clients"]) == set(b["c_clients"])
        for k, ci in a["c_clients"].items():
            assert all(torch.equal(v, b["c_clients"][k][n]) for n, v in ci.items())
    if algorithm == "fedexp":
        assert a["eta_g"] == b["eta_g"] and a["eps"] == b["eps"]


# --------------------------------------------------------------------------- distillation losses
def softmax(values: list[float], tau: float) -> list[float]:
    e = [math.exp(v / tau) for v in values]
    return [v / sum(e) for v in e]


def kl(q: list[float], p: list[float]) -> float:
    return sum(qi * math.log(qi / pi) for qi, pi in zip(q, p))


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(3)
    return torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(5, 4, generator=g, dtype=torch.float64), \
        torch.tensor([0, 3, 1, 1, 2])


@pytest.mark.parametrize("tau", [1.0, 3.0])
def test_kd_and_ntd_equal_their_closed_forms(logits, tau):
    z, zg, y = logits
    B = len(y)
    kd = sum(kl(softmax(zg[i].tolist(), tau), softmax(z[i].tolist(), tau)) for i in range(B)) / B * tau**2
    assert losses.kd(z, zg, tau).item() == pytest.approx(kd, rel=1e-10)
    drop = [[c for c in range(4) if c != int(y[i])] for i in range(B)]
    ntd = sum(kl(softmax(zg[i, drop[i]].tolist(), tau), softmax(z[i, drop[i]].tolist(), tau)) for i in range(B))
    assert losses.ntd(z, zg, y, tau).item() == pytest.approx(ntd / B * tau**2, rel=1e-10)


def test_ld_equals_its_closed_form(logits):
    z, zg, _ = logits
    expected = sum(float((z[i, c] - zg[i, c]) ** 2) for i in range(5) for c in range(4)) / 20
    assert losses.logit_distillation(z, zg).item() == pytest.approx(expected, rel=1e-12)


def test_ntd_leaves_the_true_class_out(logits):
    z, zg, y = logits
    rows = torch.arange(len(y))
    base = losses.ntd(z, zg, y, 1.0)
    z2, zg2 = z.clone(), zg.clone()
    z2[rows, y] += 5.0
    zg2[rows, y] -= 7.0
    assert losses.ntd(z2, zg, y, 1.0).item() == pytest.approx(base.item(), rel=1e-12)
    assert losses.ntd(z, zg2, y, 1.0).item() == pytest.approx(base.item(), rel=1e-12)
    assert losses.kd(z2, zg, 1.0).item() != pytest.approx(losses.kd(z, zg, 1.0).item())  # KD does see it


def test_fedntd_loss_is_ce_plus_ntd_at_tau_one(logits):
    z, zg, y = logits
    algo = get_algorithm(fk.Config(algorithm="fedntd"))
    assert algo.needs_teacher and algo.regularizer == "none"
    b = Batch(x=torch.zeros(5), y=y, h=torch.zeros(5, 2), z=z, z_g=zg)
    expected = F.cross_entropy(z, y) + losses.ntd(z, zg, y, 1.0)
    assert algo.loss(linear_net(), b, context({})).item() == pytest.approx(expected.item(), rel=1e-12)


# --------------------------------------------------------------------------- FedETF and SphereFed losses
def test_balanced_softmax_is_ce_for_uniform_counts_and_clamps_zeros(logits):
    z, _, y = logits
    assert losses.balanced_softmax(z, y, torch.full((4,), 37.0)).item() == pytest.approx(
        F.cross_entropy(z, y).item(), rel=1e-12)
    counts = torch.tensor([0.0, 5.0, 0.0, 2.0])
    prior = [0.0, math.log(5), 0.0, math.log(2)]  # zero counts act as 1
    expected = -sum(math.log(softmax([float(z[i, c]) + prior[c] for c in range(4)], 1.0)[int(y[i])])
                    for i in range(5)) / 5
    assert losses.balanced_softmax(z, y, counts).item() == pytest.approx(expected, rel=1e-10)


def test_mse_to_onehot_equals_its_closed_form(logits):
    z, _, y = logits
    expected = sum((float(z[i, c]) - float(c == int(y[i]))) ** 2 for i in range(5) for c in range(4)) / 20
    assert losses.mse_to_onehot(z, y).item() == pytest.approx(expected, rel=1e-12)


def test_fedetf_model_projection_etf_and_temperature():
    algo = get_algorithm(fk.Config(algorithm="fedetf"))
    torch.manual_seed(0)
    model = build_model("cnn", 10)
    algo.setup(model, 0)
    assert model.feature_dim == 10 and model.head.weight.shape == (10, 10)
    assert torch.equal(model.head.weight, heads.simplex_etf(10, 10, 0)) and not model.head.weight.requires_grad
    assert model.temperature.requires_grad and model.temperature.item() == 1.0
    x = torch.randn(4, 3, 32, 32)
    h = model.features(x)
    assert h.shape == (4, 10)
    with torch.no_grad():
        model.temperature.fill_(2.5)
    expected = 2.5 * F.normalize(h, dim=1) @ model.head.weight.T
    assert torch.allclose(algo.logits(model, h), expected, atol=1e-6)
    teacher = build_model("cnn", 10)
    algo.adapt_model(teacher)
    teacher.load_state_dict(model.state_dict())  # the teacher takes the global state as it is
    algo.adapt_model(model)  # idempotent
    assert list(model.state_dict()) == list(teacher.state_dict())


# --------------------------------------------------------------------------- runs on synthetic data
def fresh_head(cfg: fk.Config, num_classes: int) -> torch.Tensor:
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, num_classes)
    get_algorithm(cfg).setup(model, cfg.seed)
    return model.head.weight


def test_spherefed_head_is_orthonormal_and_frozen(synthetic):
    cfg = fk.Config(algorithm="spherefed", **TINY)
    result = fk.run(cfg, data=synthetic)
    W = result.model.head.weight.double()
    assert torch.allclose(W @ W.T, torch.eye(10, dtype=torch.float64), atol=1e-6)
    assert torch.equal(result.model.head.weight, fresh_head(cfg, 10))
    assert not result.model.head.weight.requires_grad


def test_fedetf_head_is_frozen_and_temperature_learns(synthetic):
    cfg = fk.Config(algorithm="fedetf", probes=True, probe_samples=50, **TINY)
    result = fk.run(cfg, data=synthetic)
    assert torch.equal(result.model.head.weight, fresh_head(cfg, 10))
    assert result.model.temperature.item() != 1.0
    assert "align_obs" in result.history.columns


def test_spherefed_calibration_is_the_ridge_solution(synthetic):
    cfg = fk.Config(algorithm="spherefed", spherefed_calibration=True, **TINY)
    result = fk.run(cfg, data=synthetic)
    model = result.model
    with torch.no_grad():
        h = F.normalize(model.features(synthetic.normalize(synthetic.train_x)).double(), dim=1)
    Y = F.one_hot(synthetic.train_y, 10).double()
    G = h.T @ h
    ridge = 1e-3 * float(G.trace()) / h.shape[1]  # λ = 0.1 % of G's mean eigenvalue (SphereFed's docstring)
    W = torch.linalg.solve(G + ridge * torch.eye(h.shape[1], dtype=torch.float64), h.T @ Y).T
    assert torch.allclose(model.head.weight.double(), W, atol=1e-4)
    assert not torch.equal(model.head.weight, fresh_head(cfg, 10))


@pytest.mark.parametrize("partition", ["shard", "dirichlet"])
@pytest.mark.parametrize("algorithm", ALL)
def test_every_algorithm_runs_on_both_partitions(synthetic, algorithm, partition):
    result = fk.run(fk.Config(algorithm=algorithm, partition=partition, alpha=0.5, **TINY), data=synthetic)
    assert len(result.history) == 2
    assert np.isfinite(result.history["train_loss"]).all()
    assert 0.0 <= result.summary["final_acc"] <= 1.0


@pytest.fixture(scope="module")
def dr_without_regularizer(synthetic):
    return fk.run(fk.Config(algorithm="dr", **TINY), data=synthetic)


@pytest.mark.parametrize("regularizer", REGULARIZERS[1:])
def test_dr_regularizer_changes_training_by_its_one_minus_beta_share(synthetic, dr_without_regularizer, regularizer):
    mixed = fk.run(fk.Config(algorithm="dr", regularizer=regularizer, **TINY), data=synthetic)
    assert np.isfinite(mixed.history["train_loss"]).all()
    assert not history(mixed).equals(history(dr_without_regularizer))  # β = 0.9: the regularizer acts
    # β = 1: β·L_DR + 0·L_reg is L_DR, so the run is bit-identical to DR alone
    pure = fk.run(fk.Config(algorithm="dr", regularizer=regularizer, beta=1.0, **TINY), data=synthetic)
    pd.testing.assert_frame_equal(history(pure), history(dr_without_regularizer))


def regularizer_closed_form(name: str, model: Net, teacher: Net, algo, x: torch.Tensor, y: torch.Tensor,
                            global_state: dict, cfg: fk.Config) -> float:
    """The regularizers written out from the models' outputs (not through ``losses``)."""
    with torch.no_grad():
        h, h_g = model.features(x).double(), teacher.features(x).double()
        z, z_g = algo.logits(model, model.features(x)).double(), algo.logits(teacher, teacher.features(x)).double()
    if name == "fd":
        return float(((h - h_g) ** 2).mean())
    if name == "ld":
        return float(((z - z_g) ** 2).mean())
    if name == "prox":
        return 0.5 * cfg.mu * sum(float(((p.detach().double() - global_state[n].double()) ** 2).sum())
                                  for n, p in model.named_parameters() if p.requires_grad)
    if name == "ntd":
        keep = torch.ones_like(z, dtype=torch.bool)
        keep[torch.arange(len(y)), y] = False
        z, z_g = z[keep].view(len(y), -1), z_g[keep].view(len(y), -1)
    tau = cfg.tau
    q, p = torch.softmax(z_g / tau, 1), torch.softmax(z / tau, 1)
    return tau**2 * float((q * (q.log() - p.log())).sum(1).mean())


@pytest.mark.parametrize("algorithm", ALL)
def test_every_algorithm_takes_every_regularizer(synthetic, algorithm):
    # One local step of each algorithm with each regularizer: gradients on the trained parameters, and
    # the loss is β·(the algorithm's own loss) + (1-β)·(the regularizer written out).
    x = synthetic.normalize(synthetic.train_x[:8])
    y = synthetic.train_y[:8]
    own_loss = None
    for regularizer in REGULARIZERS:
        cfg = fk.Config(algorithm=algorithm, regularizer=regularizer)
        algo = get_algorithm(cfg)
        torch.manual_seed(0)
        model = build_model("cnn", 10)
        algo.setup(model, 0)
        teacher = build_model("cnn", 10)
        algo.adapt_model(teacher)
        teacher.load_state_dict(model.state_dict())
        with torch.no_grad():  # move the student away from the teacher so every term is non-trivial
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.01 * torch.randn_like(p))
        ctx = ClientContext(client=0, round=0, lr=0.01, num_samples=8, num_steps=1,
                            class_counts=torch.bincount(y, minlength=10).float(),
                            global_state={k: v.clone() for k, v in teacher.state_dict().items()})
        algo.client_start(model, ctx)
        trained = [p for p in model.parameters() if p.requires_grad]
        loss = local_step(model, teacher, algo, torch.optim.SGD(trained, lr=0.0), x, y, ctx)  # lr 0: keep the grads
        assert torch.isfinite(loss), (algorithm, regularizer)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in trained), (algorithm, regularizer)
        if regularizer == "none":  # the same model (same seeds) without a regularizer: the algorithm's own loss
            own_loss = loss.item()
            continue
        reg = regularizer_closed_form(regularizer, model, teacher, algo, x, y, ctx.global_state, cfg)
        assert reg > 0, (algorithm, regularizer)
        expected = cfg.beta * own_loss + (1 - cfg.beta) * reg
        assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-7), (algorithm, regularizer)


@pytest.mark.parametrize("algorithm", ALL)
def test_every_algorithm_runs_from_the_cli(algorithm, tmp_path, capsys):
    from feddr_kit.__main__ import main
    code = main(["run", "--algorithm", algorithm, "--dataset", "synthetic", "--num-clients", "10",
                 "--clients-per-round", "2", "--rounds", "1", "--local-epochs", "1", "--progress", "false",
                 "--out-dir", str(tmp_path)])
    assert code == 0
    assert f"{algorithm} on synthetic" in capsys.readouterr().out
    assert (tmp_path / "summary.json").exists()


def test_registry_has_the_nine_algorithms_with_default_lrs():
    assert set(ALL) <= set(fk.algorithms.algorithm_names())
    for name in ALL:
        algo = get_algorithm(fk.Config(algorithm=name))
        for model in ("cnn", "vgg11", "mobilenet"):
            assert algo.initial_lr(model) > 0
    lr = {n: get_algorithm(fk.Config(algorithm=n)).initial_lr for n in ALL}
    assert lr["spherefed"]("vgg11") == 0.55 and lr["spherefed"]("mobilenet") == 6.5
    assert lr["fedetf"]("vgg11") == 0.05 and lr["fedetf"]("mobilenet") == 0.5
    assert all(lr[n]("vgg11") == 0.01 and lr[n]("mobilenet") == 0.1 for n in ("scaffold", "fedntd", "fedexp"))


def test_each_cnn_bn_default_lr_is_its_grids_bracketed_best():
    """The rule the chapters rely on: an algorithm's cnn_bn default is the lr with the best final accuracy
    in results/lr_grid.csv, a larger lr of its grid did worse (the best is not the grid's edge), and the
    algorithms without a grid of their own take FedAvg's."""
    grid = pd.read_csv(fk.repo.results() / "lr_grid.csv")
    grid = grid[grid["model"] == "cnn_bn"]
    best = {name: runs.loc[runs["final_acc"].idxmax(), "lr"] for name, runs in grid.groupby("algorithm")}
    assert set(best) == {"fedavg", "dr", "feddr+", "spherefed", "fedetf"}
    for name in fk.algorithms.algorithm_names() + fk.algorithms.algorithm_names(personalized=True):
        default = get_algorithm(fk.Config(algorithm=name)).initial_lr("cnn_bn")
        assert default == best.get(name, best["fedavg"]), name
    for name, lr in best.items():
        assert (grid.loc[grid["algorithm"] == name, "lr"] > lr).any(), f"{name}: its best lr {lr} is its grid's largest"
