"""Personalized FL: the 1-step methods on the round loop (feddr_kit/pfl.py), the FT protocol and the
local-only baselines (feddr_kit/personalize.py). Tiny models and synthetic data, CPU."""
import pandas as pd
import pytest
import torch
from torch import nn

import feddr_kit as fk
from feddr_kit import federated, local
from feddr_kit.algorithms import ClientContext, get_algorithm
from feddr_kit.errors import FeddrKitError
from feddr_kit.models import Net

SMALL = dict(dataset="synthetic", model="cnn", shards_per_client=2, num_clients=10, clients_per_round=3, rounds=4, local_epochs=1,
             progress=False, checkpoint_every=1, eval_every=1, fedrep_head_epochs=1)
PFL = ["fedper", "fedrep", "perfedavg", "ditto"]

pytestmark = pytest.mark.usefixtures("one_thread")


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: v.detach().clone() for n, v in model.state_dict().items()}


def linear_net(dim: int, classes: int) -> Net:
    """A tiny linear softmax model in float64: features = the flattened input (no parameters), head Linear."""
    return Net(nn.Flatten(), dim, classes, head_bias=True).double()


def softmax_grads(W: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
    """Closed-form gradient of the mean cross-entropy of ``softmax(x Wᵀ + b)``: ``((P−Y)ᵀx/B, mean(P−Y))``."""
    p = torch.softmax(x @ W.T + b, dim=1)
    r = p - torch.nn.functional.one_hot(y, W.shape[0]).double()
    return r.T @ x / len(y), r.mean(0)


def context(algo, model, lr, global_state, client=0, num_steps=2) -> ClientContext:
    return ClientContext(client=client, round=0, lr=lr, num_samples=4, num_steps=num_steps,
                         class_counts=torch.ones(model.num_classes), global_state=global_state)


# --------------------------------------------------------------------------- registration and engines
def test_personalized_methods_are_registered_apart_from_the_global_ones():
    assert fk.algorithms.algorithm_names(personalized=True) == PFL
    assert not set(PFL) & set(fk.algorithms.algorithm_names())
    assert "feddr+" in fk.algorithms.algorithm_names()


@pytest.mark.parametrize("algorithm", PFL)
def test_each_method_reports_personalized_accuracy(synthetic, algorithm):
    r = fk.run(fk.Config(algorithm=algorithm, **SMALL), data=synthetic)
    acc = r.history["personalized_acc"]
    assert acc.between(0, 1).all() and len(acc) == SMALL["rounds"]
    assert r.summary["final_personalized_acc"] == acc.iloc[-1]
    assert len(r.algorithm.client_acc) == SMALL["num_clients"]
    assert acc.iloc[-1] == pytest.approx(sum(r.algorithm.client_acc) / SMALL["num_clients"])


@pytest.mark.parametrize("algorithm", PFL)
def test_batched_engine_refuses_personalized_methods(synthetic, algorithm):
    with pytest.raises(FeddrKitError, match="engine='batched'.*serial"):
        fk.run(fk.Config(algorithm=algorithm, engine="batched", **SMALL), data=synthetic)


# --------------------------------------------------------------------------- what trains, what stays
def test_fedper_heads_stay_local_and_the_global_head_never_moves(synthetic):
    cfg = fk.Config(algorithm="fedper", **SMALL)
    r = fk.run(cfg, data=synthetic)
    torch.manual_seed(cfg.seed)
    init = fk.models.build_model("cnn", 10, head_bias=True)
    for n in ("head.weight", "head.bias"):  # the server never aggregates heads
        assert torch.equal(r.model.state_dict()[n], init.state_dict()[n]), n
    assert not torch.equal(r.model.state_dict()["body.0.weight"], init.state_dict()["body.0.weight"])
    algo = r.algorithm
    assert algo.visited and len(algo.visited) < cfg.num_clients
    for k in range(cfg.num_clients):
        head = algo.client_state(k)["head.weight"]
        assert torch.equal(head, init.head.weight) == (k not in algo.visited), k


def test_fedrep_trains_the_head_first_then_the_body_and_freezes_the_other(synthetic):
    """Snapshots at every step: during the head phase the body is bit-identical, then the head is."""
    cfg = fk.Config(algorithm="fedrep", weight_decay=1e-3, **{**SMALL, "fedrep_head_epochs": 2})
    algo = get_algorithm(cfg)
    model = fk.models.build_model("cnn", 10, head_bias=True)
    algo.setup(model, 0)
    snaps = []
    original = algo.before_step

    def record(m, ctx):
        snaps.append(state(m))
        original(m, ctx)

    algo.before_step = record
    idx = torch.arange(100)  # 100 images, batch 50: 2 steps per epoch
    steps = algo.num_local_steps(federated.local_steps(100, cfg, 100))
    assert steps == 2 * (2 + 1)
    ctx = context(algo, model, 0.05, state(model), num_steps=steps)
    federated.train_client(model, model, algo, synthetic, idx, ctx, cfg, torch.device("cpu"))
    snaps.append(state(model))
    head = {"head.weight", "head.bias"}
    body = [n for n in snaps[0] if n not in head]
    for i in range(1, 5):  # after head steps 1..4: body untouched, head moved
        assert all(torch.equal(snaps[i][n], snaps[0][n]) for n in body), i
        assert not torch.equal(snaps[i]["head.weight"], snaps[i - 1]["head.weight"]), i
    for i in range(5, 7):  # after body steps 5..6: head untouched (no weight decay either), body moved
        assert all(torch.equal(snaps[i][n], snaps[4][n]) for n in head), i
        assert not torch.equal(snaps[i]["body.0.weight"], snaps[i - 1]["body.0.weight"]), i
    algo.client_end(model, ctx)
    assert all(p.requires_grad for p in model.parameters())  # restored for the next client
    assert torch.equal(algo.client_state(0)["head.weight"], snaps[-1]["head.weight"])


def test_perfedavg_two_step_update_matches_the_closed_form():
    """w̃ = w − α·∇L(w; D); w ← w − β·(ρ·g₁ + ∇L(w̃; D′)) with the momentum buffer shared by both steps."""
    torch.manual_seed(0)
    d, C, alpha, beta, rho = 6, 3, 0.3, 0.7, 0.5
    cfg = fk.Config(algorithm="perfedavg", dataset="synthetic", num_clients=2, clients_per_round=1, lr=alpha,
                    perfedavg_beta=beta, momentum=rho, weight_decay=0.0)
    model = linear_net(d, C)
    algo = get_algorithm(cfg)
    algo.setup(model, 0)
    W0, b0 = model.head.weight.detach().clone(), model.head.bias.detach().clone()
    x1, x2 = torch.randn(4, d, dtype=torch.float64), torch.randn(4, d, dtype=torch.float64)
    y1, y2 = torch.tensor([0, 1, 2, 1]), torch.tensor([2, 2, 0, 1])
    opt = torch.optim.SGD(model.parameters(), lr=alpha, momentum=rho)
    ctx = context(algo, model, alpha, state(model))
    algo.client_start(model, ctx)
    federated.local_step(model, None, algo, opt, x1, y1, ctx)
    gW1, gb1 = softmax_grads(W0, b0, x1, y1)
    Wt, bt = W0 - alpha * gW1, b0 - alpha * gb1  # w̃
    assert torch.allclose(model.head.weight, Wt, atol=1e-12)
    federated.local_step(model, None, algo, opt, x2, y2, ctx)
    gW2, gb2 = softmax_grads(Wt, bt, x2, y2)
    assert torch.allclose(model.head.weight, W0 - beta * (rho * gW1 + gW2), atol=1e-12)
    assert torch.allclose(model.head.bias, b0 - beta * (rho * gb1 + gb2), atol=1e-12)


def test_ditto_personal_step_has_the_proximal_term_and_the_global_copy_plain_sgd():
    """v₁ = v₀ − η·∇F(v₀) − η·λ·(v₀ − w); the client's copy of w takes a plain SGD step."""
    torch.manual_seed(0)
    d, C, eta, lam = 5, 3, 0.2, 0.75
    cfg = fk.Config(algorithm="ditto", dataset="synthetic", num_clients=2, clients_per_round=1, lr=eta,
                    ditto_lambda=lam, momentum=0.0, weight_decay=0.0)
    model = linear_net(d, C)
    algo = get_algorithm(cfg)
    algo.setup(model, 0)
    w = state(model)
    v0 = {n: t + 0.3 * torch.randn_like(t) for n, t in w.items()}
    algo.set_client_state(1, v0)
    x, y = torch.randn(6, d, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    opt = torch.optim.SGD(model.parameters(), lr=eta)
    ctx = context(algo, model, eta, w, client=1, num_steps=1)
    algo.client_start(model, ctx)
    federated.local_step(model, None, algo, opt, x, y, ctx)
    algo.client_end(model, ctx)
    gW, gb = softmax_grads(v0["head.weight"], v0["head.bias"], x, y)
    v1 = algo.client_state(1)
    assert torch.allclose(v1["head.weight"], v0["head.weight"] - eta * gW
                          - eta * lam * (v0["head.weight"] - w["head.weight"]), atol=1e-12)
    assert torch.allclose(v1["head.bias"], v0["head.bias"] - eta * gb - eta * lam * (v0["head.bias"] - w["head.bias"]),
                          atol=1e-12)
    gW, gb = softmax_grads(w["head.weight"], w["head.bias"], x, y)
    assert torch.allclose(model.head.weight, w["head.weight"] - eta * gW, atol=1e-12)
    assert torch.allclose(model.head.bias, w["head.bias"] - eta * gb, atol=1e-12)
    assert algo.client_state(0)["head.weight"].equal(w["head.weight"])  # never trained: the initial model


# --------------------------------------------------------------------------- per-client state and resume
@pytest.mark.parametrize("algorithm", ["ditto", "fedrep"])
def test_killed_and_resumed_equals_straight_run_bit_for_bit(synthetic, algorithm, tmp_path):
    straight = fk.run(fk.Config(algorithm=algorithm, out_dir=str(tmp_path / "a"), **SMALL), data=synthetic)

    def stop_after_two(row):
        if row["round"] == 2:
            raise KeyboardInterrupt

    cfg = fk.Config(algorithm=algorithm, out_dir=str(tmp_path / "b"), **SMALL)
    with pytest.raises(KeyboardInterrupt):
        fk.run(cfg, data=synthetic, callback=stop_after_two)
    resumed = fk.run(cfg, data=synthetic, resume=True)
    pd.testing.assert_frame_equal(straight.history.drop(columns="seconds"), resumed.history.drop(columns="seconds"))
    a, b = straight.algorithm, resumed.algorithm
    assert a.visited == b.visited and set(a.clients) == set(b.clients) and a.client_acc == b.client_acc
    for k in a.clients:
        for n, t in a.client_state(k).items():
            assert torch.equal(t, b.client_state(k)[n]), (k, n)
    for n, t in straight.model.state_dict().items():
        assert torch.equal(t, resumed.model.state_dict()[n]), n


def test_client_state_round_trips_through_state_dict():
    cfg = fk.Config(algorithm="fedper", dataset="synthetic", num_clients=3, clients_per_round=1)
    a, b = get_algorithm(cfg), get_algorithm(cfg)
    model = fk.models.build_model("cnn", 10, head_bias=True)
    a.setup(model, 0)
    b.setup(fk.models.build_model("cnn", 10, head_bias=True), 0)
    a.set_client_state(2, {"head.weight": torch.full_like(model.head.weight, 3.0), "head.bias": model.head.bias})
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.client_state(2)["head.weight"], torch.full_like(model.head.weight, 3.0))
    assert torch.equal(b.client_state(0)["head.weight"], b.initial_head["head.weight"])  # b's own initial head
    assert not torch.equal(b.client_state(0)["head.weight"], model.head.weight)


# --------------------------------------------------------------------------- FT protocol and local-only
@pytest.fixture(scope="module")
def feddr_run(synthetic, tmp_path_factory):
    out = tmp_path_factory.mktemp("feddr")
    return fk.run(fk.Config(algorithm="feddr+", out_dir=str(out), **{**SMALL, "rounds": 2}), data=synthetic)


def test_finetune_improves_a_weak_feddr_model_and_keeps_the_etf_frozen(synthetic, feddr_run):
    ft = fk.personalize.finetune(feddr_run, epochs=2, lr=0.02, data=synthetic)
    s = ft.summary()
    assert len(ft.per_client) == 10 and s["head_trained"] is False
    assert s["before_mean"] == pytest.approx(feddr_run.history["local_test_acc"].iloc[-1], abs=1e-6)
    assert s["after_mean"] > s["before_mean"] + 0.1  # a 2-round global model on 2-class clients
    # the same run given as its folder gives the same numbers
    again = fk.personalize.finetune(feddr_run.out_dir, epochs=2, lr=0.02, data=synthetic)
    pd.testing.assert_frame_equal(ft.per_client, again.per_client)


def test_finetune_of_some_clients_gives_their_rows_of_every_clients_finetuning(synthetic, feddr_run):
    """Each client starts from the global model on its own random stream: a subset, in any order, is the full
    run's rows for those clients."""
    every = fk.personalize.finetune(feddr_run, epochs=1, lr=0.02, data=synthetic).per_client
    some = fk.personalize.finetune(feddr_run, epochs=1, lr=0.02, data=synthetic, clients=[7, 2]).per_client
    pd.testing.assert_frame_equal(some, every.set_index("client").loc[[7, 2]].reset_index())
    assert fk.personalize.finetune(feddr_run, epochs=1, data=synthetic, clients=[]).per_client.empty


def test_finetune_freezes_the_etf_but_tunes_fedbabus_head(synthetic, monkeypatch):
    moved = {}
    real = local.train_client

    def spy(model, teacher, algo, data, idx, ctx, cfg, device):
        before = state(model)
        out = real(model, teacher, algo, data, idx, ctx, cfg, device)
        moved[(algo.name, ctx.client)] = {n: not torch.equal(v, model.state_dict()[n]) for n, v in before.items()}
        return out

    monkeypatch.setattr(local, "train_client", spy)
    for algorithm in ("feddr+", "fedbabu"):
        r = fk.run(fk.Config(algorithm=algorithm, **{**SMALL, "rounds": 1}), data=synthetic)
        fk.personalize.finetune(r, epochs=1, lr=0.01, data=synthetic)
    assert {a for a, _ in moved} == {"feddr+", "fedbabu"}  # the spy saw every fine-tuning
    assert all(not m["head.weight"] and m["body.0.weight"] for (a, _), m in moved.items() if a == "feddr+")
    assert all(m["head.weight"] and m["head.bias"] for (a, _), m in moved.items() if a == "fedbabu")


def test_finetune_rejects_bad_input(synthetic, feddr_run, tmp_path):
    with pytest.raises(FeddrKitError, match="protocol"):
        fk.personalize.finetune(feddr_run, protocol="nope")
    with pytest.raises(FeddrKitError, match="fedetf"):
        fk.personalize.finetune(feddr_run, protocol="fedetf")
    with pytest.raises(FeddrKitError, match="method"):
        fk.personalize.finetune(feddr_run, method="ditto")
    with pytest.raises(FeddrKitError, match="different model"):
        fk.personalize.finetune(feddr_run, method="fedetf", data=synthetic)
    with pytest.raises(FeddrKitError, match="not a finished run folder"):
        fk.personalize.finetune(tmp_path)
    for bad, message in ((range(9, 11), r"clients: must be an integer in \[0, 9\], got 10"), ([1, 1], "each client once"), ("3", "client ids"),
                         ([0.5], "got 0.5"), (3, "client ids")):
        with pytest.raises(FeddrKitError, match=message):
            fk.personalize.finetune(feddr_run, data=synthetic, clients=bad)


def test_fedetf_original_protocol_moves_only_projection_and_etf_after_the_local_update(synthetic):
    r = fk.run(fk.Config(algorithm="fedetf", **{**SMALL, "rounds": 1}), data=synthetic)
    generic = fk.personalize.finetune(r, epochs=1, lr=0.01, data=synthetic)
    original = fk.personalize.finetune(r, epochs=1, lr=0.01, data=synthetic, protocol="fedetf",
                                       fedetf_alternations=1)
    assert original.summary()["protocol"] == "fedetf"
    assert not original.per_client["after"].equals(generic.per_client["after"])
    assert original.per_client["before"].equals(generic.per_client["before"])


@pytest.mark.parametrize("loss", ["ce", "ce_etf", "dr"])
def test_local_only_trains_each_client_for_its_expected_federated_budget(synthetic, loss):
    cfg = fk.Config(**SMALL)  # 4 rounds × 3 of 10 clients: 1.2 visits of 2 steps (100 images, batch 50)
    res = fk.personalize.local_only(cfg, loss, data=synthetic)
    assert (res.per_client["steps"] == round(1.2 * 2)).all()
    assert res.per_client["after"].between(0, 1).all() and res.per_client["before"].isna().all()
    more = fk.personalize.local_only(cfg, loss, data=synthetic, epochs=3, lr=0.05)
    assert (more.per_client["steps"] == 6).all()
    assert more.summary()["after_mean"] > 0.5  # 2-class clients, 10 steps: well above chance (0.1)


def test_local_only_rejects_an_unknown_loss():
    with pytest.raises(FeddrKitError, match="loss must be one of ce, ce_etf, dr"):
        fk.personalize.local_only(fk.Config(**SMALL), "mse")
