"""Fidelity to the paper's runs (docs/fidelity.md): each departure from the FedDr+ reference code that could move
the paper's numbers is either removed or an explicit choice, and is pinned here against an
independent computation (a closed form, a hand-written rule, or the spec's formulas in float64).

* evaluation order of batch-statistics models (no one-class batches on class-sorted data);
* VGG11's He-normal fan-out convolutions;
* the head bias of the cross-entropy methods, and parameter counts equal to the reference's;
* FedExP's two server steps; SCAFFOLD's head-gradient zeroing;
* the reference's own partition files;
* the FedDr+ loss and gradient against the spec's formulas.
"""
import copy
import dataclasses
import math
import types
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feddr_kit as fk
from feddr_kit import algorithms, federated, heads, models
from feddr_kit.algorithms import Batch, ClientContext, FedExP, get_algorithm
from feddr_kit.data import ImageData
from feddr_kit.errors import FeddrKitError
from feddr_kit.federated import Evaluator, local_step, make_partition
from feddr_kit.models import Net, build_model

TINY = dict(dataset="synthetic", model="cnn", shards_per_client=2, num_clients=10, clients_per_round=2, rounds=2, local_epochs=1,
            eval_every=1, progress=False)
CE_METHODS = ["fedavg", "scaffold", "fedntd", "fedexp"]
GEOMETRIC = ["dr", "feddr+", "spherefed", "fedetf"]


pytestmark = pytest.mark.usefixtures("one_thread")


# =========================================================================== 1. evaluation order
def sorted_tagged_data(classes: int = 10, per_class: int = 100) -> ImageData:
    """A dataset stored sorted by class (as an image folder) whose test images carry their own label and
    index in three pixels, so a model can report which samples each batch held. mean 0 / std 1: the
    normalized pixel is value/255."""
    test_y = torch.arange(classes).repeat_interleave(per_class)
    n = len(test_y)
    test_x = torch.zeros(n, 3, 4, 4, dtype=torch.uint8)
    test_x[:, 0, 0, 0] = test_y.to(torch.uint8)
    test_x[:, 1, 0, 0] = (torch.arange(n) // 256).to(torch.uint8)
    test_x[:, 2, 0, 0] = (torch.arange(n) % 256).to(torch.uint8)
    train_y = torch.arange(classes).repeat_interleave(20)
    train_x = torch.zeros(len(train_y), 3, 4, 4, dtype=torch.uint8)
    return ImageData("sorted", train_x, train_y, test_x, test_y, [str(c) for c in range(classes)],
                     mean=torch.zeros(3), std=torch.ones(3))


class BatchSpy(nn.Module):
    """A body that records, for every batch it sees, the (index, label) of its samples; features = the 3 tag pixels."""

    def __init__(self):
        super().__init__()
        self.batches: list[tuple[np.ndarray, np.ndarray]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tags = (x[:, :, 0, 0] * 255).round().long()
        self.batches.append(((tags[:, 1] * 256 + tags[:, 2]).numpy(), tags[:, 0].numpy()))
        return x[:, :, 0, 0].float()


def spy_model(batch_stat_norm: bool = True) -> Net:
    return Net(BatchSpy(), 3, 10, batch_stat_norm=batch_stat_norm)


def test_batch_stat_eval_batches_hold_the_test_sets_class_mix_on_class_sorted_data():
    data = sorted_tagged_data()
    part = fk.partition.shard(data.train_y, data.test_y, num_clients=10, shards_per_client=2, seed=0)
    model = spy_model()
    algo = get_algorithm(fk.Config(algorithm="dr"))
    Evaluator(data, part, seed=3)(model, algo)
    batches = model.body.batches
    global_batches = batches[: len(data.test_y) // models.EVAL_BATCH_SIZE]
    assert all(len(idx) == models.EVAL_BATCH_SIZE for idx, _ in global_batches)
    seen = np.concatenate([idx for idx, _ in global_batches])
    assert np.array_equal(np.sort(seen), np.arange(len(data.test_y)))  # every test image, once
    share = models.EVAL_BATCH_SIZE / 10
    for _, labels in global_batches:  # no class above twice its share of a batch (sorted order: 100 = all of one)
        assert np.bincount(labels, minlength=10).max() <= 2 * share
    # Then each client's local test set, alone, in batches of at most 100, each image once.
    client_batches = batches[len(global_batches):]
    assert len(client_batches) == part.num_clients  # 100 test images per client here: one batch each
    for k, (idx, labels) in enumerate(client_batches):
        assert np.array_equal(np.sort(idx), np.sort(part.test_indices[k]))
        assert not np.array_equal(idx, part.test_indices[k])  # shuffled, not the stored class-sorted order
        assert np.array_equal(labels, data.test_y.numpy()[idx])


def test_batch_stat_eval_order_is_the_same_every_round_and_on_resume():
    data = sorted_tagged_data()
    part = fk.partition.shard(data.train_y, data.test_y, num_clients=10, shards_per_client=2, seed=0)
    algo = get_algorithm(fk.Config(algorithm="dr"))

    def batches(evaluator):
        model = spy_model()
        evaluator(model, algo)
        return [idx for idx, _ in model.body.batches]

    evaluator = Evaluator(data, part, seed=5)
    first, second = batches(evaluator), batches(evaluator)
    resumed = batches(Evaluator(data, part, seed=5))  # a resumed run builds a new evaluator from the same seed
    other_seed = batches(Evaluator(data, part, seed=6))
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    assert all(np.array_equal(a, b) for a, b in zip(first, resumed))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other_seed))


def test_no_batchnorm_model_gives_the_same_accuracy_in_any_order(synthetic):
    torch.manual_seed(0)
    model = build_model("cnn", 10)
    algo = get_algorithm(fk.Config(algorithm="fedavg"))
    part = fk.partition.shard(synthetic.train_y, synthetic.test_y, num_clients=10, shards_per_client=2, seed=0)
    sorted_result = Evaluator(synthetic, part, seed=0)(model, algo)  # synthetic test data is stored by class
    perm = np.random.default_rng(1).permutation(len(synthetic.test_y))
    inverse = np.argsort(perm)
    shuffled = dataclasses.replace(synthetic, test_x=synthetic.test_x[perm], test_y=synthetic.test_y[perm])
    shuffled_part = dataclasses.replace(part, test_indices=[inverse[t] for t in part.test_indices],
                                        test_labels=part.test_labels[perm])
    shuffled_result = Evaluator(shuffled, shuffled_part, seed=0)(model, algo)
    assert shuffled_result["test_acc"] == pytest.approx(sorted_result["test_acc"], abs=1e-7)
    assert shuffled_result["local_test_acc"] == pytest.approx(sorted_result["local_test_acc"], abs=1e-7)
    # The batch-statistics path (permuted batches, one pass per client) scores a batch-independent model
    # exactly as the one-pass path does: the two paths agree wherever order cannot matter.
    model.batch_stat_norm = True
    assert Evaluator(synthetic, part, seed=0)(model, algo) == pytest.approx(sorted_result, abs=1e-7)


def test_probe_set_of_a_batch_stat_model_is_shuffled_once_and_for_all(synthetic):
    plain_x, plain_y = federated.probe_set(synthetic, 200, 0, spy_model(batch_stat_norm=False))
    x, y = federated.probe_set(synthetic, 200, 0, spy_model())
    assert torch.equal(plain_y, torch.sort(plain_y).values)  # class-balanced subsample in stored (sorted) order
    assert torch.equal(torch.sort(y).values, plain_y) and not torch.equal(y, plain_y)
    for chunk in y.split(models.EVAL_BATCH_SIZE):
        assert torch.bincount(chunk, minlength=10).max() <= 2 * len(chunk) / 10
    x2, y2 = federated.probe_set(synthetic, 200, 0, spy_model())
    assert torch.equal(x, x2) and torch.equal(y, y2)


# =========================================================================== 2. VGG11 init
def test_vgg11_convolutions_are_he_normal_fan_out_with_zero_bias():
    torch.manual_seed(0)
    model = build_model("vgg11", 10)
    convs = [m for m in model.body.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.body.modules() if isinstance(m, nn.Linear)]
    assert len(convs) == 8 and len(linears) == 2
    for conv in convs:
        w = conv.weight.detach().double()
        target = math.sqrt(2.0 / (conv.kernel_size[0] * conv.kernel_size[1] * conv.out_channels))
        se = 1.0 / math.sqrt(2 * w.numel())  # relative standard error of a sample std
        assert abs(float(w.std()) / target - 1) < 6 * se, conv
        assert abs(float(w.mean())) < 6 * target / math.sqrt(w.numel()), conv
        assert torch.count_nonzero(conv.bias) == 0
    for lin in linears:  # PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), std 1/sqrt(3 fan_in)
        w = lin.weight.detach().double()
        bound = 1.0 / math.sqrt(lin.in_features)
        assert float(w.abs().max()) <= bound
        assert abs(float(w.std()) * math.sqrt(3 * lin.in_features) - 1) < 6 / math.sqrt(2 * w.numel())


# =========================================================================== 3. head bias
def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_match_the_reference():
    torch.manual_seed(0)
    assert count(build_model("vgg11", 10, head_bias=True)) == 9_750_922
    assert count(build_model("vgg11", 10, head_bias=False)) == 9_750_912
    assert count(build_model("mobilenet", 100, head_bias=True)) == 3_309_476
    assert count(build_model("mobilenet", 100, head_bias=False)) == 3_309_376


@pytest.mark.parametrize("algorithm", CE_METHODS + ["fedbabu"] + GEOMETRIC)
def test_head_bias_as_in_the_reference(algorithm):
    algo = get_algorithm(fk.Config(algorithm=algorithm))
    assert algo.head_bias == (algorithm not in GEOMETRIC)
    torch.manual_seed(0)
    model = build_model("cnn", 10, head_bias=algo.head_bias)
    algo.setup(model, 0)
    bias = model.head.bias
    if algorithm in GEOMETRIC:
        assert bias is None
    elif algorithm == "fedbabu":
        assert not bias.requires_grad and torch.equal(bias, heads.random_head_bias(10, 128, 0))
    else:
        assert bias.shape == (10,) and bias.requires_grad


@pytest.mark.parametrize("algorithm", ["fedavg", "fedntd"])
def test_cross_entropy_methods_train_their_head_bias(synthetic, algorithm):
    # fedntd also builds the teacher: it must have the same architecture (load_state_dict is strict).
    cfg = fk.Config(algorithm=algorithm, **TINY)
    result = fk.run(cfg, data=synthetic)
    torch.manual_seed(cfg.seed)
    fresh = build_model("cnn", 10, head_bias=True)
    assert not torch.equal(result.model.head.bias, fresh.head.bias)


def test_fedbabu_bias_is_frozen_at_its_seeded_init_and_reasserted_after_aggregation(synthetic):
    cfg = fk.Config(algorithm="fedbabu", **{**TINY, "rounds": 3})
    result = fk.run(cfg, data=synthetic)
    expected = heads.random_head_bias(10, 128, cfg.seed)
    assert torch.equal(result.model.head.bias, expected) and not result.model.head.bias.requires_grad
    assert torch.equal(result.model.head.weight, heads.random_head(10, 128, cfg.seed))
    # Averaging copies may drift by a few ULP; finalize_global puts weight and bias back exactly.
    algo = result.algorithm
    drifted = {k: v.clone() for k, v in result.model.state_dict().items()}
    drifted["head.weight"] += 1e-7
    drifted["head.bias"] += 1e-7
    fixed = algo.finalize_global(drifted)
    assert torch.equal(fixed["head.weight"], heads.random_head(10, 128, cfg.seed))
    assert torch.equal(fixed["head.bias"], expected)
    # PyTorch's default bias init, U(-1/sqrt(d), 1/sqrt(d)), and a different draw for another seed.
    assert expected.abs().max() <= 1 / math.sqrt(128) and expected.std() > 0.5 / math.sqrt(3 * 128)
    assert not torch.equal(heads.random_head_bias(10, 128, cfg.seed + 1), expected)


# =========================================================================== 4. FedExP steps
def fedexp_on_head(step: str, num_clients: int = 20, eps: float = 1e-3) -> tuple[FedExP, Net]:
    algo = get_algorithm(fk.Config(algorithm="fedexp", fedexp_step=step, num_clients=num_clients,
                                   clients_per_round=2, fedexp_eps=eps))
    model = Net(nn.Identity(), 2, 2)  # the only parameter: the head [2, 2]
    algo.setup(model, 0)
    return algo, model


def server_round(algo: FedExP, model: Net, x: torch.Tensor, deltas: list[torch.Tensor], weights: list[float], round: int):
    uploads = []
    for d in deltas:
        model.load_state_dict({"head.weight": x + d})
        uploads.append(algo.client_end(model, ClientContext(0, round, 0.1, 10, 1, torch.ones(2), {"head.weight": x})))
    average = {"head.weight": x + sum(w * d for w, d in zip(weights, deltas))}
    return algo.server_update({"head.weight": x}, average, uploads, weights, round)["head.weight"]


def test_fedexp_reference_step_equals_its_closed_form():
    algo, model = fedexp_on_head("reference", num_clients=20, eps=1e-3)
    x0 = torch.zeros(2, 2, dtype=torch.float64)
    d1 = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)  # ||d1|| = 5
    d2 = torch.tensor([[0.0, 0.0], [0.0, 2.0]], dtype=torch.float64)  # ||d2|| = 2
    x1 = server_round(algo, model, x0, [d1, d2], [0.75, 0.25], round=0)
    # mean = (2.25, 3, 0, 0.5), ||mean||^2 = 14.3125; unweighted mean norm (5 + 2)/2; M = all 20 clients.
    eta = min(1.0, 0.5 * 3.5 / (math.sqrt(14.3125) + 20 * 1e-3))
    assert eta == pytest.approx(0.46014, abs=1e-5)
    assert algo.last_eta_g == pytest.approx(eta, rel=1e-12)
    assert torch.allclose(x1, eta * torch.tensor([[2.25, 3.0], [0.0, 0.5]], dtype=torch.float64))
    # Round 1: opposite updates give 0.5·1.5/(0.5 + 0.02) > 1, capped at 1: never an extrapolation.
    d3, d4 = torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float64)
    d3[0, 0], d4[0, 0] = 2.0, -1.0
    x2 = server_round(algo, model, x1, [d3, d4], [0.5, 0.5], round=1)
    assert algo.eta_g[-1] == 1.0 and torch.allclose(x2, x1 + (d3 + d4) / 2)
    assert algo.eps == 1e-3  # the reference never decays ε
    assert torch.equal(algo.eval_state({"head.weight": x2})["head.weight"], x2)  # no averaging of iterates


def test_fedexp_default_step_equals_its_closed_form():
    algo, model = fedexp_on_head("fedexp", num_clients=20, eps=1e-3)
    x0 = torch.zeros(2, 2, dtype=torch.float64)
    units = [torch.eye(4, dtype=torch.float64)[i].view(2, 2) for i in range(4)]  # 4 orthogonal unit updates
    server_round(algo, model, x0, units, [0.25] * 4, round=0)
    eps = 1e-3 * 0.998**2
    assert algo.last_eta_g == pytest.approx(max(1.0, 0.5 * 1.0 / (0.25 + 4 * eps)), rel=1e-12)  # ≈ 1.97
    # The same updates under the reference step: 0.5·1/(0.5 + 20·0.001).
    ref, ref_model = fedexp_on_head("reference", num_clients=20, eps=1e-3)
    server_round(ref, ref_model, x0, units, [0.25] * 4, round=0)
    assert ref.last_eta_g == pytest.approx(0.5 / 0.52, rel=1e-12)


def test_fedexp_step_functions_and_validation():
    assert algorithms.fedexp_server_lr(4.0, 0.5, 2, 0.25) == pytest.approx(2.0)
    assert algorithms.fedexp_reference_server_lr(2.0, 0.5, 100, 0.0) == 1.0  # 0.5·2/0.5 = 2, capped
    assert algorithms.fedexp_reference_server_lr(1.0, 0.9, 100, 1e-3) == pytest.approx(0.5 / 1.0)
    assert algorithms.fedexp_reference_server_lr(0.0, 0.0, 100, 0.0) == 1.0  # no update at all
    assert fk.Config().fedexp_step == "fedexp"
    with pytest.raises(FeddrKitError, match="fedexp_step"):
        fk.Config(fedexp_step="paper")


def test_fedexp_reference_step_runs_and_never_extrapolates(synthetic):
    result = fk.run(fk.Config(algorithm="fedexp", fedexp_step="reference", **{**TINY, "rounds": 3}), data=synthetic)
    assert len(result.algorithm.eta_g) == 3 and all(0 < e <= 1 for e in result.algorithm.eta_g)


# =========================================================================== 5. SCAFFOLD head gradient
def reference_scaffold(params: dict[str, torch.Tensor], batches, c, c_i, lr, momentum, wd, zero_head):
    """The FedDr+ reference code's SCAFFOLD client steps, written out: CE gradient (head weight zeroed when asked), ``- c_i + c``,
    then SGD with weight decay and momentum by hand. The model is ``relu(x W1ᵀ + b1) Whᵀ + bh``."""
    p = {n: v.clone().requires_grad_(True) for n, v in params.items()}
    buf = {}
    for x, y in batches:
        z = torch.relu(x @ p["body.0.weight"].T + p["body.0.bias"]) @ p["head.weight"].T + p["head.bias"]
        grads = torch.autograd.grad(F.cross_entropy(z, y), list(p.values()))
        with torch.no_grad():
            for (n, v), g in zip(p.items(), grads):
                if zero_head and n == "head.weight":
                    g = torch.zeros_like(g)
                d = g - c_i[n] + c[n] + wd * v
                buf[n] = d.clone() if n not in buf else momentum * buf[n] + d
                v -= lr * buf[n]
    return {n: v.detach() for n, v in p.items()}


@pytest.mark.parametrize("zero_head", [True, False])
def test_scaffold_head_update_matches_the_reference_rule(zero_head):
    cfg = fk.Config(algorithm="scaffold", scaffold_zero_head_grad=zero_head, num_clients=4, clients_per_round=1,
                    momentum=0.9, weight_decay=1e-3)
    algo = get_algorithm(cfg)
    torch.manual_seed(0)
    model = Net(nn.Sequential(nn.Linear(4, 6), nn.ReLU()), 6, 3, head_bias=True)
    algo.setup(model, 0)
    g = torch.Generator().manual_seed(1)
    params = {n: v.detach().clone() for n, v in model.named_parameters()}
    algo.c = {n: 0.1 * torch.randn(v.shape, generator=g) for n, v in params.items()}
    algo.c_clients[1] = {n: 0.1 * torch.randn(v.shape, generator=g) for n, v in params.items()}
    c, c_i = copy.deepcopy(algo.c), copy.deepcopy(algo.c_clients[1])
    batches = [(torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(4)]
    lr = 0.05
    ctx = ClientContext(client=1, round=0, lr=lr, num_samples=20, num_steps=4, class_counts=torch.ones(3),
                        global_state={n: v.clone() for n, v in model.state_dict().items()})
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-3)
    algo.client_start(model, ctx)
    for x, y in batches:
        local_step(model, None, algo, opt, x, y, ctx)
    expected = reference_scaffold(params, batches, c, c_i, lr, 0.9, 1e-3, zero_head)
    for n, v in model.named_parameters():
        torch.testing.assert_close(v.detach(), expected[n], rtol=0, atol=1e-6, msg=n)
    # Option II with the momentum-corrected step count, K_eff = Σ_{k=1..K} (1 - ρ^k)/(1 - ρ).
    k_eff = sum((1 - 0.9**k) / 0.1 for k in range(1, 5))
    algo.client_end(model, ctx)
    for n in params:
        want = c_i[n] - c[n] + (params[n] - expected[n]) / (k_eff * lr)
        torch.testing.assert_close(algo.c_clients[1][n], want, rtol=0, atol=1e-4, msg=n)
    if zero_head:  # the head weight moved by the correction and weight decay only: other labels, same head weight
        no_ce = reference_scaffold(params, [(x, torch.zeros_like(y)) for x, y in batches], c, c_i, lr, 0.9, 1e-3, True)
        torch.testing.assert_close(model.head.weight.detach(), no_ce["head.weight"], rtol=0, atol=1e-6)


def test_scaffold_zero_head_grad_is_a_config_field_off_by_default():
    assert fk.Config().scaffold_zero_head_grad is False
    assert get_algorithm(fk.Config(algorithm="scaffold")).zero_head_grad is False
    assert get_algorithm(fk.Config(algorithm="scaffold", scaffold_zero_head_grad=True)).zero_head_grad is True
    with pytest.raises(FeddrKitError, match="scaffold_zero_head_grad"):
        fk.Config(scaffold_zero_head_grad="yes")


# =========================================================================== 6. reference partitions
REFERENCE_DIR = fk.partition.reference_folder()
SHIPPED = sorted(p.name.removesuffix(".npz") for p in REFERENCE_DIR.glob("*.npz")) if REFERENCE_DIR.is_dir() else []
WITHOUT_TESTS = {"cifar10_dirichlet_alpha0.3", "cifar100_dirichlet_alpha0.1", "cifar100_dirichlet_alpha0.3"}
needs_files = pytest.mark.skipif(not SHIPPED, reason=f"reference partition files not found in {REFERENCE_DIR}")


def torchvision_like_labels(classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random labels of CIFAR's split sizes, interleaved as in torchvision's order (not sorted by class)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, classes, 50_000), rng.integers(0, classes, 10_000)


def test_all_fourteen_reference_files_are_found():
    if not REFERENCE_DIR.is_dir():
        pytest.skip(f"no {REFERENCE_DIR} in this checkout")
    assert len(SHIPPED) == 14


@needs_files
@pytest.mark.parametrize("name", SHIPPED)
def test_reference_partition_from_each_shipped_file(name):
    classes = 100 if name.startswith("cifar100_") else 10
    train_y, test_y = torchvision_like_labels(classes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        part = fk.partition.reference(name, train_y, test_y, seed=4)
    drew = [w for w in caught if "no test sets" in str(w.message)]
    assert len(drew) == (name in WITHOUT_TESTS)
    assert part.kind == "reference" and part.num_clients == 100 and part.num_classes == classes
    assert part.params["scheme"] == ("shard" if "_shard_" in name else "dirichlet")
    everything = np.concatenate(part.train_indices)
    assert np.array_equal(np.sort(everything), np.arange(50_000))  # every train index exactly once
    assert all(t.dtype == np.int64 and len(t) > 0 for t in part.test_indices)
    assert all(t.min() >= 0 and t.max() < 10_000 for t in part.test_indices)
    with np.load(REFERENCE_DIR / f"{name}.npz") as z:  # the file's own order is kept
        assert np.array_equal(part.train_indices[7], z["train_7"])
        if name not in WITHOUT_TESTS:
            assert np.array_equal(part.test_indices[7], z["test_7"])
    if name in WITHOUT_TESTS:  # the Dirichlet test-set rule: per class, as many test images as train images (truncated)
        train_counts, test_counts = part.counts("train"), part.counts("test")
        available = np.bincount(test_y, minlength=classes)
        assert np.array_equal(test_counts, np.minimum(train_counts, available))


@pytest.fixture
def shard_file_copy(tmp_path):
    """The cifar10_shard_s2 arrays, and a function writing a (modified) copy to tmp_path."""
    if "cifar10_shard_s2" not in SHIPPED:
        pytest.skip(f"cifar10_shard_s2.npz not found in {REFERENCE_DIR}")
    with np.load(REFERENCE_DIR / "cifar10_shard_s2.npz") as z:
        arrays = {k: z[k].copy() for k in z.files}

    def write(arrays_, name="cifar10_shard_s2.npz"):
        path = tmp_path / name
        np.savez(path, **arrays_)
        return path

    return arrays, write


@needs_files
def test_reference_refuses_class_sorted_labels_and_wrong_lengths():
    train_y, test_y = torchvision_like_labels(10)
    with pytest.raises(FeddrKitError, match=r"sorted by class.*cifar-10-batches-py") as err:
        fk.partition.reference("cifar10_shard_s2", np.sort(train_y), np.sort(test_y))
    assert "\n" not in str(err.value)
    with pytest.raises(FeddrKitError, match=r"sorted by class.*cifar-100-python"):
        labels100 = torchvision_like_labels(100)
        fk.partition.reference("cifar100_shard_s10", np.sort(labels100[0]), labels100[1])
    with pytest.raises(FeddrKitError, match="test_y: labels are sorted by class"):  # any order of class blocks
        fk.partition.reference("cifar10_shard_s2", train_y, (9 - np.sort(test_y)))
    with pytest.raises(FeddrKitError, match="train_y: has 49999 labels"):
        fk.partition.reference("cifar10_shard_s2", train_y[:-1], test_y)
    with pytest.raises(FeddrKitError, match="test_y: has 9000 labels"):
        fk.partition.reference("cifar10_shard_s2", train_y, test_y[:9000])
    with pytest.raises(FeddrKitError, match="train_y: has 10 classes but cifar100_shard_s10"):
        fk.partition.reference("cifar100_shard_s10", train_y, test_y)


def test_reference_refuses_the_image_folder_cifar10(cifar10):
    if "cifar10_shard_s2" not in SHIPPED:
        pytest.skip(f"cifar10_shard_s2.npz not found in {REFERENCE_DIR}")
    if not torch.all(cifar10.train_y[1:] >= cifar10.train_y[:-1]):
        pytest.skip("CIFAR-10 here comes from torchvision's files (interleaved), not the class-sorted jpeg folder")
    with pytest.raises(FeddrKitError, match="load torchvision's CIFAR files"):
        fk.partition.reference("cifar10_shard_s2", cifar10.train_y, cifar10.test_y)


@needs_files
def test_reference_refuses_corrupt_and_missing_files(shard_file_copy, tmp_path):
    arrays, write = shard_file_copy
    train_y, test_y = torchvision_like_labels(10)
    ok = write(arrays)
    assert fk.partition.reference(str(ok), train_y, test_y).num_clients == 100  # a path works as a name does
    dup = dict(arrays)
    dup["train_1"] = np.concatenate([dup["train_1"][:-1], dup["train_0"][:1]])  # same size, one index twice
    with pytest.raises(FeddrKitError, match=r"corrupt: train index \d+ appears 2 times"):
        fk.partition.reference(write(dup), train_y, test_y)
    gap = {k: v for k, v in arrays.items() if k not in ("train_5", "test_5")}
    with pytest.raises(FeddrKitError, match="train_5"):
        fk.partition.reference(write(gap), train_y, test_y)
    out_of_range = dict(arrays)
    out_of_range["test_3"] = out_of_range["test_3"].copy()
    out_of_range["test_3"][0] = 10_000
    with pytest.raises(FeddrKitError, match="test index 10000"):
        fk.partition.reference(write(out_of_range), train_y, test_y)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(FeddrKitError, match="not a readable .npz"):
        fk.partition.reference(tmp_path / "junk.npz", train_y, test_y)
    with pytest.raises(FeddrKitError, match=r"no reference partition 'cifar10_shard_s3'.*available: cifar100"):
        fk.partition.reference("cifar10_shard_s3", train_y, test_y)
    with pytest.raises(FeddrKitError, match="no reference partition file at"):
        fk.partition.reference(tmp_path / "absent.npz", train_y, test_y)


def test_reference_folder_follows_the_argument_then_the_environment(tmp_path, monkeypatch):
    np.savez(tmp_path / "tiny_shard_s1.npz", train_0=np.array([1, 0]), train_1=np.array([3, 2]))
    train_y, test_y = np.array([0, 1, 1, 0]), np.array([1, 0, 0, 1])
    with pytest.warns(UserWarning, match="no test sets"):
        part = fk.partition.reference("tiny_shard_s1", train_y, test_y, reference_dir=tmp_path)
    assert [t.tolist() for t in part.train_indices] == [[1, 0], [3, 2]]
    monkeypatch.setenv("FEDDR_REFERENCE_DIR", str(tmp_path))
    assert fk.partition.reference_folder() == tmp_path
    with pytest.warns(UserWarning, match="no test sets"):
        assert fk.partition.reference("tiny_shard_s1", train_y, test_y).num_clients == 2


@needs_files
def test_config_partition_reference_is_wired_through_make_partition():
    with pytest.raises(FeddrKitError, match="reference_partition"):
        fk.Config(partition="reference")
    with pytest.raises(FeddrKitError, match="reference_partition"):
        fk.Config(partition="reference", reference_partition=3)
    train_y, test_y = torchvision_like_labels(10)
    data = types.SimpleNamespace(train_y=torch.from_numpy(train_y), test_y=torch.from_numpy(test_y))
    cfg = fk.Config(partition="reference", reference_partition="cifar10_shard_s5")
    part = make_partition(cfg, data)
    with np.load(REFERENCE_DIR / "cifar10_shard_s5.npz") as z:
        assert np.array_equal(part.train_indices[0], z["train_0"])
    assert not federated.dirichlet_steps(cfg)  # shard files: full local epochs
    assert federated.dirichlet_steps(cfg.replace(reference_partition="cifar10_dirichlet_alpha0.1"))  # E·⌊(N/K)/B⌋ steps


def test_a_run_on_a_reference_partition_file(synthetic, tmp_path):
    # The synthetic set is stored by class, so shuffle it (as torchvision's CIFAR is) and partition it by hand.
    perm = torch.from_numpy(np.random.default_rng(0).permutation(len(synthetic.train_y)))
    tperm = torch.from_numpy(np.random.default_rng(1).permutation(len(synthetic.test_y)))
    data = dataclasses.replace(synthetic, train_x=synthetic.train_x[perm], train_y=synthetic.train_y[perm],
                               test_x=synthetic.test_x[tperm], test_y=synthetic.test_y[tperm])
    split = np.array_split(np.random.default_rng(2).permutation(len(data.train_y)), 10)
    path = tmp_path / "tiny_dirichlet_alpha1.npz"
    np.savez(path, **{f"train_{k}": s for k, s in enumerate(split)})
    with pytest.warns(UserWarning, match="no test sets"):
        result = fk.run(fk.Config(algorithm="fedavg", partition="reference", reference_partition=str(path), **TINY),
                        data=data)
    assert result.partition.kind == "reference"
    assert [t.tolist() for t in result.partition.train_indices] == [s.tolist() for s in split]
    assert np.isfinite(result.history["train_loss"]).all()


def test_local_round_probes_take_a_reference_partition(synthetic, tmp_path):
    from feddr_kit import teaching

    perm = np.random.default_rng(0).permutation(len(synthetic.train_y))
    tperm = np.random.default_rng(1).permutation(len(synthetic.test_y))
    data = dataclasses.replace(synthetic, train_x=synthetic.train_x[perm], train_y=synthetic.train_y[perm],
                               test_x=synthetic.test_x[tperm], test_y=synthetic.test_y[tperm])
    path = tmp_path / "tiny_dirichlet_alpha1.npz"
    np.savez(path, **{f"train_{k}": s for k, s in enumerate(np.array_split(np.arange(len(perm)), 4))})
    with pytest.warns(UserWarning, match="no test sets"):
        part = fk.partition.reference(path, data.train_y, data.test_y)
    torch.manual_seed(0)
    model = build_model("cnn", 10)
    df = teaching.local_round_probes(model, data, part, ["dr"], clients=[1], local_epochs=1, probe_samples=40)
    assert len(df) == 1 and df["feat_dist_obs"].iloc[0] > 0


# =========================================================================== FedDr+ against the spec's formulas
def test_feddr_plus_loss_and_gradient_match_the_spec_formulas():
    """FedDr+'s local loss in float64 from plain tensor ops: L = β·½·mean(cos - 1)² + (1-β)·mean((h - h_g)²), β = 0.9,
    cos = ⟨h/‖h‖, v_y⟩, on the raw features of a real kit cnn and of its teacher (the round's global model)."""
    cfg = fk.Config(algorithm="feddr+")
    algo = get_algorithm(cfg)
    torch.manual_seed(0)
    model = build_model("cnn", 10, head_bias=algo.head_bias)
    algo.setup(model, 0)
    teacher = copy.deepcopy(model).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the student has drifted from the global model during local steps
        for p in model.body.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    x = torch.randn(16, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (16,), generator=g)
    body = [p for p in model.parameters() if p.requires_grad]
    assert len(body) == len(list(model.body.parameters()))  # the ETF head is frozen: only the body learns

    # The kit: the algorithm's own loss on the loop's Batch, and autograd.
    h = model.features(x)
    b = Batch(x=x, y=y, h=h, z=algo.logits(model, h), h_g=teacher.features(x), z_g=None)
    ctx = ClientContext(client=0, round=0, lr=0.1, num_samples=16, num_steps=1, class_counts=torch.ones(10),
                        global_state={})
    loss = algo.loss(model, b, ctx)
    kit_grads = torch.autograd.grad(loss, body)

    # The spec, in float64.
    student64 = copy.deepcopy(model).double()
    params64 = [p for p in student64.parameters() if p.requires_grad]
    with torch.no_grad():
        h_g = teacher.double().features(x.double())
    h64 = student64.features(x.double())
    V = student64.head.weight.detach()
    cos = (h64 * V[y]).sum(dim=1) / h64.pow(2).sum(dim=1).sqrt()
    l_dr = 0.5 * ((cos - 1.0) ** 2).sum() / len(y)
    l_fd = ((h64 - h_g) ** 2).sum() / h64.numel()
    spec_loss = 0.9 * l_dr + 0.1 * l_fd
    spec_grads = torch.autograd.grad(spec_loss, params64)

    assert abs(loss.item() - spec_loss.item()) < 1e-6
    assert l_dr.item() > 1e-3 and l_fd.item() > 1e-6  # both terms are active
    for (name, _), kit, spec in zip([(n, p) for n, p in model.named_parameters() if p.requires_grad], kit_grads,
                                    spec_grads):
        assert spec.abs().max() > 0, name
        torch.testing.assert_close(kit.double(), spec, rtol=0, atol=1e-6, msg=name)
