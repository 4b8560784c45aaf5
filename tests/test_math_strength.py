"""Tests that catch wrong math: each pins a behaviour a plausible bug would change.

Every expected value comes from an independent computation: a number worked out by hand, a
closed form evaluated with plain Python floats, or a second path through the kit (a per-client
loop, the optimizer's own arithmetic replayed on recorded gradients). Short runs on the synthetic
set observe the round loop through small spies on its hooks; nothing here changes library code.
"""
import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feddr_kit as fk
from feddr_kit import federated, heads, local, losses, probes
from feddr_kit.algorithms import Batch, ClientContext, FedAvg, FedBABU, get_algorithm
from feddr_kit.errors import FeddrKitError
from feddr_kit.models import Net

TINY = dict(dataset="synthetic", model="cnn", shards_per_client=2, num_clients=10, clients_per_round=2, rounds=2, local_epochs=1,
            eval_every=1, progress=False)


pytestmark = pytest.mark.usefixtures("one_thread")


def trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def clone_all(tensors) -> list[torch.Tensor]:
    return [t.detach().clone() for t in tensors]


# --------------------------------------------------------------------------- closed forms in plain Python
def py_softmax(values: list[float], tau: float = 1.0) -> list[float]:
    top = max(values)
    e = [math.exp((v - top) / tau) for v in values]
    return [v / sum(e) for v in e]


def py_kl(q: list[float], p: list[float]) -> float:
    return sum(qi * math.log(qi / pi) for qi, pi in zip(q, p))


def py_cross_entropy(z: torch.Tensor, y: torch.Tensor) -> float:
    rows = z.tolist()
    return sum(-math.log(py_softmax(r)[int(c)]) for r, c in zip(rows, y)) / len(rows)


def py_dot_regression(h: torch.Tensor, V: torch.Tensor, y: torch.Tensor) -> float:
    total = 0.0
    for hi, c in zip(h.tolist(), y.tolist()):
        norm = math.sqrt(sum(v * v for v in hi))
        cos = sum(a * b for a, b in zip(hi, V[c].tolist())) / norm  # V rows have unit norm
        total += 0.5 * (cos - 1.0) ** 2
    return total / len(y)


def py_regularizer(name: str, b: Batch, model: nn.Module, global_state: dict, cfg: fk.Config) -> float:
    """Each regularizer (``Algorithm.regularizer_loss``) written out element by element."""
    if name == "fd":
        diffs = [(a - g) ** 2 for ra, rg in zip(b.h.tolist(), b.h_g.tolist()) for a, g in zip(ra, rg)]
        return sum(diffs) / len(diffs)
    if name == "ld":
        diffs = [(a - g) ** 2 for ra, rg in zip(b.z.tolist(), b.z_g.tolist()) for a, g in zip(ra, rg)]
        return sum(diffs) / len(diffs)
    if name in ("kd", "ntd"):
        tau, total = cfg.tau, 0.0
        for z, zg, c in zip(b.z.tolist(), b.z_g.tolist(), b.y.tolist()):
            if name == "ntd":
                z, zg = z[:c] + z[c + 1:], zg[:c] + zg[c + 1:]
            total += py_kl(py_softmax(zg, tau), py_softmax(z, tau))
        return tau**2 * total / len(b.y)
    if name == "prox":
        sq = sum(float(((p.detach().double() - global_state[n].double()) ** 2).sum())
                 for n, p in model.named_parameters() if p.requires_grad)
        return 0.5 * cfg.mu * sq
    raise AssertionError(name)


# --------------------------------------------------------------------------- β·L_alg + (1-β)·L_reg
def tiny_model_and_batch(algorithm: str, regularizer: str):
    """A float64 model (linear body ``[4 → 3]``, head ``[3, 3]``), a perturbed teacher and one batch."""
    cfg = fk.Config(algorithm=algorithm, regularizer=regularizer, beta=0.7, tau=2.0, mu=0.3)
    algo = get_algorithm(cfg)
    torch.manual_seed(0)
    model = Net(nn.Linear(4, 3, bias=False), 3, 3).double()
    algo.setup(model, 0)
    teacher = copy.deepcopy(model)  # the same architecture, whatever setup() did to the head
    with torch.no_grad():
        for p in trainable(teacher):
            p.add_(0.5 * torch.randn_like(p))
    x = torch.randn(6, 4, dtype=torch.float64)
    y = torch.tensor([0, 2, 1, 1, 0, 2])
    h = model.features(x)
    with torch.no_grad():
        h_g = teacher.features(x)
        z_g = algo.logits(teacher, h_g)
    b = Batch(x=x, y=y, h=h, z=algo.logits(model, h), h_g=h_g, z_g=z_g)
    ctx = ClientContext(client=0, round=0, lr=0.1, num_samples=6, num_steps=1, class_counts=torch.ones(3),
                        global_state={k: v.clone() for k, v in teacher.state_dict().items()})
    return cfg, algo, model, b, ctx


@pytest.mark.parametrize("algorithm", ["fedavg", "dr"])
@pytest.mark.parametrize("regularizer", ["prox", "kd", "ntd", "ld", "fd"])
def test_loss_is_beta_task_plus_one_minus_beta_regularizer(algorithm, regularizer):
    cfg, algo, model, b, ctx = tiny_model_and_batch(algorithm, regularizer)
    if algorithm == "fedavg":
        task = py_cross_entropy(b.z.detach(), b.y)
    else:
        task = py_dot_regression(b.h.detach(), model.head.weight.detach(), b.y)
    reg = py_regularizer(regularizer, b, model, ctx.global_state, cfg)
    assert reg > 1e-3 and task > 1e-3  # both terms matter, so a wrong weight shows
    expected = 0.7 * task + 0.3 * reg
    assert algo.loss(model, b, ctx).item() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("algorithm", ["fedavg", "dr"])
def test_no_regularizer_means_the_unweighted_task_loss(algorithm):
    _, _, model, b, ctx = tiny_model_and_batch(algorithm, "fd")
    algo = get_algorithm(fk.Config(algorithm=algorithm, beta=0.7))  # regularizer none: β is not applied
    task = (py_cross_entropy(b.z.detach(), b.y) if algorithm == "fedavg"
            else py_dot_regression(b.h.detach(), model.head.weight.detach(), b.y))
    assert algo.loss(model, b, ctx).item() == pytest.approx(task, rel=1e-9)


def test_prox_is_half_mu_squared_distance():
    params = [torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([[3.0], [-1.0]], requires_grad=True)]
    global_params = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0], [1.0]])]
    value = losses.prox(params, global_params, mu=0.2)
    assert value.item() == pytest.approx(0.5 * 0.2 * (1 + 4 + 4 + 4))  # ‖θ - θ_g‖² = 13
    value.backward()  # ∇ = μ(θ - θ_g)
    assert torch.allclose(params[0].grad, torch.tensor([0.2, 0.4]))
    assert torch.allclose(params[1].grad, torch.tensor([[0.4], [-0.4]]))


def test_kd_scales_with_tau_squared():
    z, zg = torch.tensor([[1.0, 0.0, -1.0]], dtype=torch.float64), torch.tensor([[0.0, 2.0, 0.0]], dtype=torch.float64)
    for tau in (0.5, 2.0, 4.0):
        expected = tau**2 * py_kl(py_softmax(zg[0].tolist(), tau), py_softmax(z[0].tolist(), tau))
        assert losses.kd(z, zg, tau).item() == pytest.approx(expected, rel=1e-12)


# --------------------------------------------------------------------------- the other losses, by hand
def test_cross_entropy_and_cosine_to_class_by_hand():
    z = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    e2 = math.exp(2.0)
    expected = (-math.log(e2 / (e2 + 2)) - math.log(1 / 3)) / 2
    assert losses.cross_entropy(z, y).item() == pytest.approx(expected, rel=1e-12)
    h = torch.tensor([[3.0, 4.0], [0.0, -2.0], [1.0, 1.0]])
    V = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-0.6, 0.8]])
    cos = losses.cosine_to_class(h, V, torch.tensor([1, 2, 1]))
    assert torch.allclose(cos, torch.tensor([0.8, -0.8, 1 / math.sqrt(2)]))


def test_dot_regression_by_hand():
    V = torch.tensor([[0.0, 1.0], [-math.sqrt(3) / 2, -0.5], [math.sqrt(3) / 2, -0.5]], dtype=torch.float64)
    h = torch.tensor([[0.0, 5.0], [1.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
    y = torch.tensor([0, 2, 0])  # cosines 1, √3/2, -1
    expected = (0.0 + 0.5 * (math.sqrt(3) / 2 - 1) ** 2 + 0.5 * 4.0) / 3
    assert losses.dot_regression(h, V, y).item() == pytest.approx(expected, rel=1e-12)


def test_balanced_softmax_adds_log_counts_by_hand():
    z = torch.tensor([[0.0, 0.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([1])
    counts = torch.tensor([1.0, 3.0, 0.0])  # absent class: count 1, log 0
    expected = -math.log(3 / (1 + 3 + 1))
    assert losses.balanced_softmax(z, y, counts).item() == pytest.approx(expected, rel=1e-12)


def test_mse_to_onehot_by_hand_when_the_last_class_is_absent():
    z = torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    y = torch.tensor([0, 1])  # the one-hot targets still have 3 columns
    expected = ((1 - 1) ** 2 + 0 ** 2 + 2 ** 2 + 0.5 ** 2 + (0.5 - 1) ** 2 + 0 ** 2) / 6
    assert losses.mse_to_onehot(z, y).item() == pytest.approx(expected, rel=1e-12)


def test_distillation_temperature_defaults_to_one():
    g = torch.Generator().manual_seed(0)
    z, zg = torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 3, 1])
    assert losses.kd(z, zg).item() == pytest.approx(losses.kd(z, zg, 1.0).item(), rel=1e-12)
    assert losses.ntd(z, zg, y).item() == pytest.approx(losses.ntd(z, zg, y, 1.0).item(), rel=1e-12)
    assert losses.kd(z, zg, 2.0).item() != pytest.approx(losses.kd(z, zg).item())


def test_not_true_logits_keeps_the_other_classes_in_order():
    z = torch.tensor([[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]])
    assert torch.equal(losses.not_true_logits(z, torch.tensor([2, 0])), torch.tensor([[0.0, 1.0, 3.0], [5.0, 6.0, 7.0]]))


def test_pull_and_push_by_hand():
    # W = I (2 classes, d = 2), h = 0: p = (½, ½); for y = 0: pull = -(1 - ½)·w_0, push = ½·w_1.
    W = torch.eye(2, dtype=torch.float64)
    pull, push = losses.pull_push(torch.zeros(1, 2, dtype=torch.float64), W, torch.tensor([0]))
    assert torch.allclose(pull, torch.tensor([[-0.5, 0.0]], dtype=torch.float64))
    assert torch.allclose(push, torch.tensor([[0.0, 0.5]], dtype=torch.float64))
    # three classes, W = (0, log 2, log 5)ᵀ ⊗ e_1 and h = e_1: p = (1/8, 2/8, 5/8); for y = 2
    # pull = -(1 - 5/8)·w_2 and push = (1/8)·w_0 + (2/8)·w_1.
    W3 = torch.tensor([[0.0, 0.0], [math.log(2), 0.0], [math.log(5), 0.0]], dtype=torch.float64)
    pull, push = losses.pull_push(torch.tensor([[1.0, 0.0]], dtype=torch.float64), W3, torch.tensor([2]))
    assert torch.allclose(pull, torch.tensor([[-3 / 8 * math.log(5), 0.0]], dtype=torch.float64))
    assert torch.allclose(push, torch.tensor([[2 / 8 * math.log(2), 0.0]], dtype=torch.float64))


# --------------------------------------------------------------------------- heads
def test_centering_basis_is_the_helmert_basis():
    U = heads.centering_basis(3)
    expected = torch.tensor([[1 / math.sqrt(2), 1 / math.sqrt(6)],
                             [-1 / math.sqrt(2), 1 / math.sqrt(6)],
                             [0.0, -2 / math.sqrt(6)]], dtype=torch.float64)
    assert torch.allclose(U, expected, atol=1e-12)
    U = heads.centering_basis(7)
    assert torch.allclose(U.T @ U, torch.eye(6, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(U @ U.T, torch.eye(7, dtype=torch.float64) - 1 / 7, atol=1e-12)


@pytest.mark.parametrize("build", [heads.simplex_etf, heads.orthonormal_head, heads.random_head])
def test_every_head_checks_its_arguments(build):
    with pytest.raises(FeddrKitError, match="num_classes must be an integer >= 2"):
        build(1, 16)
    with pytest.raises(FeddrKitError, match="num_classes must be an integer >= 2"):
        build(3.0, 16)
    with pytest.raises(FeddrKitError, match="dim must be a positive integer"):
        build(3, 0)
    with pytest.raises(FeddrKitError, match="dim must be a positive integer"):
        build(3, 16.0)
    assert build(2, 2).shape == (2, 2)  # the smallest valid sizes


@pytest.mark.parametrize("build", [heads.simplex_etf, heads.orthonormal_head, heads.random_head])
def test_every_head_is_float32_and_seed_zero_by_default(build):
    W = build(4, 6)
    assert W.dtype == torch.float32 and W.shape == (4, 6) and W.is_contiguous()
    assert torch.equal(W, build(4, 6, seed=0)) and torch.equal(W, build(4, 6, 0))
    assert torch.equal(build(4, 6, seed=np.int64(2)), build(4, 6, seed=2))  # any integer-like seed


def test_simplex_etf_error_says_which_dim_is_needed_and_why():
    with pytest.raises(FeddrKitError) as info:
        heads.simplex_etf(10, 8)
    assert str(info.value) == (
        "dim must be >= num_classes - 1 = 9 for a simplex ETF of 10 classes, got dim=8: the ETF's Gram matrix "
        "has rank C-1, so it cannot live in fewer dimensions (add a projection layer to at least C-1 dimensions "
        "instead)")


def test_orthonormal_head_is_square_at_dim_equal_classes_and_seeded():
    W = heads.orthonormal_head(5, 5, seed=1).double()
    assert torch.allclose(W @ W.T, torch.eye(5, dtype=torch.float64), atol=1e-6)
    assert torch.equal(heads.orthonormal_head(5, 9, seed=2), heads.orthonormal_head(5, 9, seed=2))
    assert not torch.equal(heads.orthonormal_head(5, 9, seed=2), heads.orthonormal_head(5, 9, seed=3))
    # Built in float64, then rounded: orthonormal to float32 rounding (~1e-8), not to float32 QR's ~3e-7.
    for seed in range(3):
        W = heads.orthonormal_head(10, 512, seed=seed).double()
        assert (W @ W.T - torch.eye(10, dtype=torch.float64)).abs().max() < 1e-7


def assert_uniform(values: torch.Tensor, low: float, high: float) -> None:
    """``values`` look like i.i.d. draws of U(low, high): they fill the range and pass a Kolmogorov–Smirnov test.

    The KS level is about 1e-6 (critical ``D = 2.7/√n``, as ``P(√n·D > x) ≈ 2e^{-2x²}``), so a fixed seed
    never fails by chance while a constant, a shifted or a shrunk range fails by far.
    """
    x = values.flatten().double().sort().values
    n = x.numel()
    cdf = ((x - low) / (high - low)).clamp(0, 1)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    D = max(float((i / n - cdf).max()), float((cdf - (i - 1) / n).max()))
    assert D < 2.7 / math.sqrt(n), f"KS distance {D:.4f} from U({low:.4f}, {high:.4f})"
    span = high - low  # the extremes of n ≥ 1000 uniform draws lie within 2 % of the ends
    assert float(x[0]) < low + 0.02 * span and float(x[-1]) > high - 0.02 * span


def test_random_head_is_uniform_in_the_linear_init_range_and_seeded():
    C, d = 10, 128
    W = heads.random_head(C, d, seed=5)
    bound = 1 / math.sqrt(d)
    assert W.shape == (C, d) and W.dtype == torch.float32
    assert float(W.abs().max()) <= bound
    assert_uniform(W, -bound, bound)
    assert torch.equal(W, heads.random_head(C, d, seed=5))
    assert not torch.equal(W, heads.random_head(C, d, seed=6))


# --------------------------------------------------------------------------- probes
def hand_views():
    """Six probe images of three classes; class 1 unobserved. Per-sample values worked out by hand:

    ====  =  ===========  ==========  =========  ======  ==========  ======  ======  =====  =====
    i     y  local h      global h    distance   angle   norm diff   pred_l  pred_g  al_l   al_g
    ====  =  ===========  ==========  =========  ======  ==========  ======  ======  =====  =====
    0     0  (3, 4)       (3, 0)      4          53.13   2           0 ✓     1 ✗     0.1    0.9
    1     1  (0, 2)       (0, 1)      1          0       1           2 ✗     1 ✓     -0.2   0.0
    2     2  (1, 0)       (0, 1)      √2         90      0           2 ✓     0 ✗     0.4    0.6
    3     1  (-.1, -.2)   (.2, .4)    √.45       180     -√.05       1 ✓     1 ✓     -0.6   0.2
    4     0  (2, 0)       (1, 0)      1          0       1           1 ✗     0 ✓     0.7    0.3
    5     2  (.1, .2)     (.2, .4)    √.05       0       -√.05       2 ✓     2 ✓     0.0    0.0
    ====  =  ===========  ==========  =========  ======  ==========  ======  ======  =====  =====

    Samples 3 and 5 have float32 cosines just beyond -1 and 1: the angle must still be 180 / 0.
    """
    y = torch.tensor([0, 1, 2, 1, 0, 2])
    local = probes.ModelView(
        h=torch.tensor([[3.0, 4.0], [0.0, 2.0], [1.0, 0.0], [-0.1, -0.2], [2.0, 0.0], [0.1, 0.2]]),
        pred=torch.tensor([0, 2, 2, 1, 1, 2]),
        align=torch.tensor([0.1, -0.2, 0.4, -0.6, 0.7, 0.0]))
    glob = probes.ModelView(
        h=torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.2, 0.4], [1.0, 0.0], [0.2, 0.4]]),
        pred=torch.tensor([1, 1, 0, 1, 0, 2]),
        align=torch.tensor([0.9, 0.0, 0.6, 0.2, 0.3, 0.0]))
    return local, glob, y, torch.tensor([True, False, True])


def test_probe_quantities_on_a_hand_built_case():
    local, glob, y, observed = hand_views()
    r05 = math.sqrt(0.05)
    expected = {  # observed: samples 0, 2, 4, 5; unobserved: samples 1, 3
        "align_obs": (0.1 + 0.4 + 0.7 + 0.0) / 4, "align_unobs": (-0.2 - 0.6) / 2,
        "acc_obs": 3 / 4, "acc_unobs": 1 / 2,
        "global_align_obs": (0.9 + 0.6 + 0.3 + 0.0) / 4, "global_align_unobs": (0.0 + 0.2) / 2,
        "global_acc_obs": 2 / 4, "global_acc_unobs": 2 / 2,
        "feat_dist_obs": (4 + math.sqrt(2) + 1 + r05) / 4, "feat_dist_unobs": (1 + 3 * r05) / 2,
        "feat_angle_obs": (math.degrees(math.acos(0.6)) + 90 + 0 + 0) / 4, "feat_angle_unobs": (0 + 180) / 2,
        "feat_norm_diff_obs": (2 + 0 + 1 - r05) / 4, "feat_norm_diff_unobs": (1 - r05) / 2,
        "global_feat_norm_obs": (3 + 1 + 1 + math.sqrt(0.2)) / 4, "global_feat_norm_unobs": (1 + math.sqrt(0.2)) / 2,
    }
    out = probes.compare(local, glob, y, observed)
    assert set(out) == set(probes.PROBE_COLUMNS) == set(expected)
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, abs=1e-5), key


def test_probes_of_an_absent_class_set_are_nan():
    local, glob, y, _ = hand_views()
    out = probes.compare(local, glob, y, torch.tensor([True, True, True]))
    assert all(math.isnan(out[f"{q}_unobs"]) for q in ("align", "acc", "feat_angle", "feat_norm_diff"))
    assert out["acc_obs"] == pytest.approx(4 / 6)  # all six images count as observed


def test_probe_view_takes_argmax_and_cosine_to_the_own_head_row():
    head = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-0.6, 0.8]])
    h = torch.tensor([[3.0, 4.0], [0.0, -2.0], [1.0, 1.0]])
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, -1.0, 0.0], [0.0, 0.0, 3.0]])
    v = probes.view(h, logits, head, torch.tensor([1, 2, 0]))
    assert torch.equal(v.pred, torch.tensor([1, 0, 2]))
    assert torch.allclose(v.align, torch.tensor([0.8, -0.8, 1 / math.sqrt(2)]))
    assert v.h is h


@pytest.mark.parametrize("scale", [1.0, 0.1, 1e-9])
def test_cosines_do_not_depend_on_the_feature_scale(scale):
    # Alignment, cos_to_class and the feature angle are cosines: small features (ReLU outputs early in
    # training) must give the same values as large ones, down to norms far below 1.
    head = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-0.6, 0.8]], dtype=torch.float64)
    h = scale * torch.tensor([[3.0, 4.0], [0.0, -2.0], [1.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([1, 2, 0])
    expected = torch.tensor([0.8, -0.8, 1 / math.sqrt(2)], dtype=torch.float64)
    assert torch.allclose(losses.cosine_to_class(h, head, y), expected)
    assert torch.allclose(probes.view(h, torch.zeros(3, 3), head, y).align, expected)
    other = scale * torch.tensor([[3.0, 0.0], [0.0, 1.0], [-1.0, 1.0]], dtype=torch.float64)
    local = probes.ModelView(h=h, pred=torch.zeros(3, dtype=torch.long), align=torch.zeros(3))
    glob = probes.ModelView(h=other, pred=torch.zeros(3, dtype=torch.long), align=torch.zeros(3))
    out = probes.compare(local, glob, y, torch.tensor([True, False, True]))
    # observed classes 0, 2: samples 1 (180°) and 2 (90°); unobserved class 1: sample 0 (53.13°)
    assert out["feat_angle_obs"] == pytest.approx((180 + 90) / 2, abs=1e-6)
    assert out["feat_angle_unobs"] == pytest.approx(math.degrees(math.acos(0.6)), abs=1e-6)


def test_probe_set_is_class_balanced_and_seeded():
    rng = np.random.default_rng(0)
    test_y = torch.from_numpy(rng.permutation(np.repeat([0, 1, 2], [50, 30, 8])))
    idx = probes.probe_indices(test_y, num_samples=30, seed=0)
    assert idx.dtype == torch.int64
    assert torch.equal(idx, idx.sort().values) and len(set(idx.tolist())) == len(idx)
    # 30 // 3 = 10 per class; class 2 has only 8
    assert torch.bincount(test_y[idx], minlength=3).tolist() == [10, 10, 8]
    assert torch.equal(idx, probes.probe_indices(test_y, 30, seed=0))
    draws = {tuple(probes.probe_indices(test_y, 30, seed=s).tolist()) for s in range(4)}
    assert len(draws) == 4  # a seeded random subsample, not the first images of each class
    # fewer samples than classes: still one image of every class
    assert torch.bincount(test_y[probes.probe_indices(test_y, 2, seed=0)], minlength=3).tolist() == [1, 1, 1]


# --------------------------------------------------------------------------- the round loop
def test_lr_column_and_the_lr_the_optimizer_uses_follow_the_schedule(synthetic, monkeypatch):
    used: list[list[float]] = []  # per optimizer: the lr of each of its steps

    class RecordingSGD(torch.optim.SGD):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            used.append([])

        def step(self, closure=None):
            used[-1].append(self.param_groups[0]["lr"])
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "SGD", RecordingSGD)
    cfg = fk.Config(algorithm="fedavg", lr=0.05, lr_decay_at=(0.3, 0.7), lr_gamma=0.5, **{**TINY, "rounds": 5})
    result = fk.run(cfg, data=synthetic)
    # milestones int(0.3·5) = 1 and int(0.7·5) = 3: rounds 0 | 1 2 | 3 4
    schedule = [0.05, 0.025, 0.025, 0.0125, 0.0125]
    assert result.history["lr"].tolist() == pytest.approx(schedule, rel=1e-12)
    assert len(used) == 5 * cfg.clients_per_round and all(len(steps) > 0 for steps in used)
    for t, lr in enumerate(schedule):
        for steps in used[t * cfg.clients_per_round:(t + 1) * cfg.clients_per_round]:
            assert steps == pytest.approx([lr] * len(steps), rel=1e-12), t


def test_momentum_is_fresh_for_every_client(synthetic, monkeypatch):
    """The first local step of every client is plain SGD ``θ₁ = θ₀ - η(g₀ + λθ₀)``; the second uses momentum ρ."""
    log: list[dict] = []
    start, before, end = FedAvg.client_start, FedAvg.before_step, FedAvg.client_end

    def client_start(self, model, ctx):
        start(self, model, ctx)
        log.append({"lr": ctx.lr, "steps": []})

    def before_step(self, model, ctx):  # after backward: the parameters before this step and their gradients
        before(self, model, ctx)
        params = trainable(model)
        log[-1]["steps"].append((clone_all(params), clone_all(p.grad for p in params)))

    def client_end(self, model, ctx):
        log[-1]["final"] = clone_all(trainable(model))
        return end(self, model, ctx)

    monkeypatch.setattr(FedAvg, "client_start", client_start)
    monkeypatch.setattr(FedAvg, "before_step", before_step)
    monkeypatch.setattr(FedAvg, "client_end", client_end)
    rho, wd = 0.9, 1e-3
    cfg = fk.Config(algorithm="fedavg", lr=0.05, momentum=rho, weight_decay=wd, **{**TINY, "clients_per_round": 3})
    fk.run(cfg, data=synthetic)
    assert len(log) == cfg.rounds * cfg.clients_per_round
    for client in log:
        lr, steps = client["lr"], client["steps"]
        assert len(steps) >= 2
        (theta0, g0), (theta1, g1) = steps[0], steps[1]
        theta2 = steps[2][0] if len(steps) > 2 else client["final"]
        d0 = [g + wd * t for g, t in zip(g0, theta0)]
        for got, t, d in zip(theta1, theta0, d0):
            torch.testing.assert_close(got, t - lr * d, rtol=1e-5, atol=1e-7)
        buf = [rho * b + g + wd * t for b, g, t in zip(d0, g1, theta1)]
        for got, t, b in zip(theta2, theta1, buf):
            torch.testing.assert_close(got, t - lr * b, rtol=1e-5, atol=1e-7)


def test_fedetf_loss_sees_each_clients_own_counts(synthetic, monkeypatch):
    current: dict[str, int] = {}
    seen: list[tuple[int, torch.Tensor]] = []
    train_client, balanced_softmax = local.train_client, losses.balanced_softmax

    def spy_train_client(model, teacher, algo, data, idx, ctx, cfg, device):
        current["client"] = ctx.client
        return train_client(model, teacher, algo, data, idx, ctx, cfg, device)

    def spy_balanced_softmax(logits, y, class_counts):
        seen.append((current["client"], class_counts.detach().cpu().clone()))
        return balanced_softmax(logits, y, class_counts)

    monkeypatch.setattr(local, "train_client", spy_train_client)
    monkeypatch.setattr(losses, "balanced_softmax", spy_balanced_softmax)
    result = fk.run(fk.Config(algorithm="fedetf", **TINY), data=synthetic)
    counts = result.partition.counts("train")
    sampled = {int(k) for t in range(TINY["rounds"])
               for k in federated.sample_clients(result.config.seed, t, TINY["num_clients"], TINY["clients_per_round"])}
    assert {k for k, _ in seen} == sampled
    for k, c in seen:
        assert c.tolist() == counts[k].tolist(), k
    assert (counts[seen[0][0]] == 0).any()  # shard clients lack classes: the global counts would differ


def test_local_test_acc_is_the_mean_of_per_client_accuracies(synthetic):
    cfg = fk.Config(algorithm="fedavg", **{**TINY, "rounds": 1})
    part = federated.make_partition(cfg, synthetic)
    K = part.num_clients
    uneven = dataclasses.replace(  # local test sets of 10 % .. 100 % of their size: pooling would weigh them
        part, test_indices=[t[: max(1, len(t) * (k + 1) // K)] for k, t in enumerate(part.test_indices)])
    result = fk.run(cfg, data=synthetic, partition=uneven)
    model = result.model.eval()
    with torch.no_grad():
        correct = (model(synthetic.normalize(synthetic.test_x)).argmax(1) == synthetic.test_y).double()
    per_client = [float(correct[torch.from_numpy(t)].mean()) for t in uneven.test_indices]
    pooled = float(sum(correct[torch.from_numpy(t)].sum() for t in uneven.test_indices)) / sum(
        len(t) for t in uneven.test_indices)
    assert abs(pooled - np.mean(per_client)) > 1e-3  # the two definitions differ on this case
    assert result.history["local_test_acc"].iloc[-1] == pytest.approx(np.mean(per_client), abs=1e-6)
    assert result.history["test_acc"].iloc[-1] == pytest.approx(float(correct.mean()), abs=1e-6)


def test_fedbabu_head_is_random_frozen_shared_and_seeded(synthetic, monkeypatch):
    heads_seen: list[torch.Tensor] = []
    end = FedBABU.client_end

    def client_end(self, model, ctx):
        heads_seen.append(model.head.weight.detach().clone())
        return end(self, model, ctx)

    monkeypatch.setattr(FedBABU, "client_end", client_end)
    cfg = fk.Config(algorithm="fedbabu", seed=3, **TINY)
    result = fk.run(cfg, data=synthetic)
    W = result.model.head.weight
    assert not W.requires_grad
    d = W.shape[1]
    assert_uniform(W.detach(), -1 / math.sqrt(d), 1 / math.sqrt(d))  # non-trivial: nn.Linear's init range
    assert len(heads_seen) == cfg.rounds * cfg.clients_per_round
    assert all(torch.equal(h, W) for h in heads_seen)  # every client trains with the same, untouched head
    torch.manual_seed(0)
    other = fk.models.build_model("cnn", 10)
    get_algorithm(cfg.replace(seed=4)).setup(other, 4)
    assert not torch.equal(other.head.weight, W)  # another seed, another head


def batchnorm_body() -> tuple[nn.Module, int]:
    """A tiny body with a running-statistics BatchNorm: float running_mean/var and an int64 num_batches_tracked."""
    return nn.Sequential(nn.Conv2d(3, 6, 4, stride=4), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten()), 6


def test_integer_buffers_are_kept_and_float_buffers_averaged(synthetic, monkeypatch):
    monkeypatch.setitem(fk.models._BUILDERS, "cnn", batchnorm_body)
    rounds: list[dict] = []  # per round: the global state the clients start from, each client's final state and size
    start, end = FedAvg.client_start, FedAvg.client_end

    def client_start(self, model, ctx):
        start(self, model, ctx)
        if not rounds or rounds[-1]["round"] != ctx.round:
            rounds.append({"round": ctx.round, "global": {k: v.clone() for k, v in ctx.global_state.items()},
                           "clients": []})

    def client_end(self, model, ctx):
        rounds[-1]["clients"].append(({k: v.detach().clone() for k, v in model.state_dict().items()},
                                      ctx.num_samples, ctx.num_steps))
        return end(self, model, ctx)

    monkeypatch.setattr(FedAvg, "client_start", client_start)
    monkeypatch.setattr(FedAvg, "client_end", client_end)
    cfg = fk.Config(algorithm="fedavg", lr=0.05, **{**TINY, "clients_per_round": 3})
    result = fk.run(cfg, data=synthetic)
    final = result.model.state_dict()
    assert final["body.1.num_batches_tracked"].dtype == torch.int64
    assert len(rounds) == cfg.rounds
    next_globals = [r["global"] for r in rounds[1:]] + [final]
    for r, new_global in zip(rounds, next_globals):
        start_count = int(r["global"]["body.1.num_batches_tracked"])
        assert start_count == 0  # the initial global value, kept round after round
        sizes = np.array([n for _, n, _ in r["clients"]], dtype=np.float64)
        weights = sizes / sizes.sum()
        for state, _, steps in r["clients"]:  # every client starts from the global count
            assert int(state["body.1.num_batches_tracked"]) == start_count + steps
        assert int(new_global["body.1.num_batches_tracked"]) == start_count  # kept, not averaged
        for name in ("body.1.running_mean", "body.1.running_var"):
            mean = sum(w * state[name].double() for w, (state, _, _) in zip(weights, r["clients"]))
            assert torch.allclose(new_global[name].double(), mean, atol=1e-6), name
            assert not torch.allclose(new_global[name], r["global"][name])  # it did move
