"""The batched engine equals the serial loop; SGD on stacks equals torch.optim.SGD; runs are reproducible.

Equivalence is checked per parameter tensor as ``‖a - b‖ / ‖a‖ ≤ 1e-5`` after one round. The cnn runs
in float32. The batched engine's speed options (``channels_last``, ``fused_sgd``) are the same arithmetic
in another memory order or in one kernel, so they meet the same float32 bound against the serial loop
(a channels-last convolution sums in another order: reassociation, ~1e-7 per step). MobileNet's batch-statistics BatchNorm on 8×8 images and batches of a few images is
ill-conditioned (a 1×1 feature map normalised over 2–4 values), so float32 reassociation alone moves
its outputs by ~1e-3; its cases run in float64, where the two engines agree to ~1e-12.
"""
import json

import numpy as np
import pandas as pd
import pytest
import torch

import feddr_kit as fk
from feddr_kit import engine
from feddr_kit.algorithms import Algorithm, ClientContext, get_algorithm
from feddr_kit.errors import FeddrKitError
from feddr_kit.federated import local_steps, make_partition, sample_clients

ALGORITHMS = fk.algorithms.algorithm_names()
# 10 clients of a 200-image set, 3 per round, batches of 8: shard clients have 20 images (two full
# batches and a short one of 4 per epoch); Dirichlet(0.3) clients range from 1 to ~60 images.
BASE = dict(dataset="synthetic", model="cnn", num_clients=10, shards_per_client=2, clients_per_round=3, local_epochs=1,
            batch_size=8, progress=False, eval_every=1, lr=0.05)
SETTINGS = {"shard": dict(partition="shard"), "dirichlet": dict(partition="dirichlet", alpha=0.3)}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data():
    return fk.data.synthetic(num_classes=10, train_per_class=20, test_per_class=10)


@pytest.fixture(scope="module")
def tiny_images():
    """17×17 images for MobileNet on CPU: the smallest it takes (its four stride-2 stages end at 2×2)."""
    return fk.data.synthetic(num_classes=10, train_per_class=6, test_per_class=4, image_size=17)


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def both_engines(data, **kw) -> tuple[fk.federated.Result, fk.federated.Result]:
    cfg = fk.Config(**{**BASE, **kw})
    return fk.run(cfg, data=data, engine="serial"), fk.run(cfg, data=data, engine="batched")


def worst_relative_error(a: dict, b: dict) -> float:
    """max over tensors of ‖a - b‖ / ‖a‖ (0 for two zero tensors)."""
    return max(float((a[n].double() - b[n].double()).norm() / a[n].double().norm().clamp(min=1e-300)) for n in a)


def assert_same_round(serial, batched, tol=1e-5):
    assert worst_relative_error(serial.model.state_dict(), batched.model.state_dict()) <= tol
    loss_s, loss_b = serial.history["train_loss"].to_numpy(), batched.history["train_loss"].to_numpy()
    np.testing.assert_allclose(loss_b, loss_s, rtol=tol)


# --------------------------------------------------------------------------- SGD on stacks
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("momentum,weight_decay", [(0.9, 1e-2), (0.0, 0.0), (0.5, 0.0)])
def test_sgd_step_equals_torch_sgd_per_client(momentum, weight_decay, fused):
    """Three clients, one stops after 2 steps and one after 3: masked stack SGD = torch.optim.SGD per client.
    ``fused``: the steps all three take run the fused kernel, on a conv stack laid out channels-last (as
    ``engine.stacked`` makes it) while its gradients come contiguous."""
    gen = torch.Generator().manual_seed(0)
    m, shapes, lr = 3, [(4, 5), (7,), (2, 3, 3, 3)], 0.1
    stacks = [engine.stacked(torch.zeros(s), m, channels_last=True).add_(torch.randn(m, *s, generator=gen))
              for s in shapes]
    assert not stacks[2].is_contiguous()
    clients = [[s[i].clone().requires_grad_() for s in stacks] for i in range(m)]
    opts = [torch.optim.SGD(p, lr=lr, momentum=momentum, weight_decay=weight_decay) for p in clients]
    bufs = [torch.zeros_like(s) for s in stacks]
    last_step = [4, 2, 3]
    for step in range(4):
        grads = [torch.randn(m, *s, generator=gen) for s in shapes]
        active = torch.tensor([step < k for k in last_step])
        engine.sgd_step(stacks, grads, bufs, lr, momentum, weight_decay, None if active.all() else active, fused=fused)
        for i in range(m):
            if active[i]:
                for p, g in zip(clients[i], grads):
                    p.grad = g[i].clone()
                opts[i].step()
    for i in range(m):
        for s, p in zip(stacks, clients[i]):
            torch.testing.assert_close(s[i], p.detach(), rtol=1e-6, atol=0)


# --------------------------------------------------------------------------- engine equivalence
@pytest.mark.parametrize("partition", list(SETTINGS))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_batched_equals_serial_cnn(data, algorithm, partition):
    assert_same_round(*both_engines(data, algorithm=algorithm, rounds=1, **SETTINGS[partition]))
    serial, batched = both_engines(data, algorithm=algorithm, rounds=3, eval_every=3, **SETTINGS[partition])
    assert abs(serial.summary["final_acc"] - batched.summary["final_acc"]) <= 0.01


@pytest.mark.parametrize("algorithm", ["fedavg", "feddr+", "scaffold", "fedetf"])
def test_batched_equals_serial_cnn_bn(data, float64, algorithm):
    """The teaching model (batch-statistics BatchNorm behind a space-to-depth stem), one round in float64,
    as MobileNet below: parameters to 1e-5 and the same test accuracy."""
    serial, batched = both_engines(data, algorithm=algorithm, rounds=1, model="cnn_bn")
    assert_same_round(serial, batched)
    assert serial.summary["final_acc"] == batched.summary["final_acc"]


# MobileNet in float64 costs ~2 s a run on CPU: every algorithm on shards, and on Dirichlet the ones
# whose batched path differs per client beyond the shared loop (teacher, class counts, control variates).
MOBILENET_CASES = [(a, "shard") for a in ALGORITHMS] + [(a, "dirichlet") for a in ("feddr+", "fedntd", "fedetf", "scaffold")]


@pytest.mark.parametrize("algorithm,partition", MOBILENET_CASES)
def test_batched_equals_serial_mobilenet(tiny_images, float64, algorithm, partition):
    """One round in float64: parameters to 1e-5 (they agree to ~1e-7), the same test accuracy.

    At this scale (17×17 images, so 2×2 maps in the last stages, batches of 4) batch-statistics
    BatchNorm amplifies float32 rounding far beyond 1e-5 (at 8×8 the engines differed by ~0.5
    relative after one round in float32, ~1e-7 in float64), so the comparison runs in float64. It
    also makes three rounds chaotic, so the three-round accuracy comparison is made on the cnn.
    """
    # 60 images, 5 clients: shard clients have 12 (batches of 4); Dirichlet(5) clients 10 or more.
    kw = dict(SETTINGS[partition], model="mobilenet", batch_size=4, lr=0.01, num_clients=5, clients_per_round=2)
    if partition == "dirichlet":
        kw.update(alpha=5.0)
    serial, batched = both_engines(tiny_images, algorithm=algorithm, rounds=1, **kw)
    assert_same_round(serial, batched)
    assert serial.summary["final_acc"] == batched.summary["final_acc"]


@pytest.mark.parametrize("regularizer", ["prox", "kd", "ntd", "ld", "fd"])
def test_batched_equals_serial_with_regularizer(data, regularizer):
    assert_same_round(*both_engines(data, algorithm="fedavg", regularizer=regularizer, rounds=1, mu=0.1,
                                    **SETTINGS["dirichlet"]))


OPTIONS = {"channels_last": dict(channels_last=True), "fused_sgd": dict(fused_sgd=True),
           "both": dict(channels_last=True, fused_sgd=True)}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("algorithm,partition", [("feddr+", "shard"), ("feddr+", "dirichlet"), ("fedavg", "dirichlet"),
                                                 ("scaffold", "shard")])
def test_engine_options_equal_serial_cnn(data, algorithm, partition, option):
    """The batched engine with a speed option against the serial loop, one round in float32: the same bound as the
    plain batched engine. Dirichlet clients take masked steps (the fused kernel only where every client trains),
    shards full ones; SCAFFOLD's gradient hook sees channels-last gradients; FedDr+ a channels-last teacher."""
    cfg = fk.Config(**{**BASE, "algorithm": algorithm, "rounds": 1, **SETTINGS[partition]})
    serial = fk.run(cfg, data=data, engine="serial")
    batched = fk.run(cfg, data=data, engine="batched", **OPTIONS[option])
    assert_same_round(serial, batched)


@pytest.mark.parametrize("model", ["mobilenet", "cnn_bn"])
def test_engine_options_equal_serial_with_batchnorm(tiny_images, data, float64, model):
    """Both options on the BatchNorm models (MobileNet's depthwise convolutions are grouped twice under vmap), in
    float64 as the plain comparisons above: parameters to 1e-5 and the same test accuracy."""
    kw = dict(model="mobilenet", batch_size=4, lr=0.01, num_clients=5, clients_per_round=2) if model == "mobilenet" \
        else dict(model="cnn_bn")
    images = tiny_images if model == "mobilenet" else data
    cfg = fk.Config(**{**BASE, "algorithm": "feddr+", "rounds": 1, **kw})
    serial = fk.run(cfg, data=images, engine="serial")
    batched = fk.run(cfg, data=images, engine="batched", channels_last=True, fused_sgd=True)
    assert_same_round(serial, batched)
    assert serial.summary["final_acc"] == batched.summary["final_acc"]


def test_scaffold_control_variates_match_over_rounds(data, float64):
    """SCAFFOLD's c and c_i after three rounds (the correction is non-zero from round 2 on).

    In float64: c_i = (x - y)/(K_eff·η) is a difference of two nearby weights, so its relative
    rounding error in float32 is ‖x‖/‖x - y‖ times the weights' (measured 1.7e-5)."""
    serial, batched = both_engines(data, algorithm="scaffold", rounds=3, **SETTINGS["shard"])
    a, b = serial.algorithm, batched.algorithm
    assert worst_relative_error(a.c, b.c) <= 1e-5 and any(v.abs().sum() > 0 for v in a.c.values())
    assert a.c_clients.keys() == b.c_clients.keys()
    for k in a.c_clients:
        assert worst_relative_error(a.c_clients[k], b.c_clients[k]) <= 1e-5


def round_pieces(data, cfg):
    """What run() sets up for round 0: model, teacher, algorithm, the clients' indices and contexts."""
    part = make_partition(cfg, data)
    torch.manual_seed(cfg.seed)
    algo = get_algorithm(cfg)
    model = fk.models.build_model(cfg.model, data.num_classes)
    algo.setup(model, cfg.seed)
    teacher = fk.models.build_model(cfg.model, data.num_classes)
    algo.adapt_model(teacher)
    teacher.load_state_dict(model.state_dict())
    teacher.eval().requires_grad_(False)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    counts = torch.from_numpy(part.counts("train")).float()
    mean_size = len(data.train_y) // cfg.num_clients
    clients = sample_clients(cfg.seed, 0, cfg.num_clients, cfg.clients_per_round).tolist()
    idx = [torch.from_numpy(part.train_indices[k].astype(np.int64)) for k in clients]
    ctxs = [ClientContext(client=k, round=0, lr=cfg.lr, num_samples=len(i), num_steps=local_steps(len(i), cfg, mean_size),
                          class_counts=counts[k], global_state=state) for k, i in zip(clients, idx)]
    return model, teacher, algo, idx, ctxs


RAGGED = {  # shard: 30 clients of 6-8 images, batches of 3 (short last batches, 2 or 3 steps an epoch);
    # Dirichlet: clients of 10 to ~50 images, batches of 16 (clients smaller than a batch)
    "shard": dict(partition="shard", num_clients=30, batch_size=3),
    "dirichlet": dict(partition="dirichlet", num_clients=10, batch_size=16, alpha=0.3),
}


@pytest.mark.parametrize("partition", list(RAGGED))
def test_ragged_batches_give_the_serial_losses(data, partition):
    """Per-client losses and states with short last batches, clients smaller than a batch, unequal step counts."""
    cfg = fk.Config(**dict(BASE, algorithm="feddr+", clients_per_round=6, local_epochs=2, **RAGGED[partition]))
    outputs = {}
    for name in ("serial", "batched"):
        model, teacher, algo, idx, ctxs = round_pieces(data, cfg)
        outputs[name] = [(loss, {k: v.clone() for k, v in model.state_dict().items()})
                         for loss in engine.train_round(name, model, teacher, algo, data, idx, ctxs, cfg, torch.device("cpu"))]
    sizes = [len(i) for i in idx]
    if partition == "shard":  # the test needs raggedness: short last batches and unequal step counts
        assert any(n % cfg.batch_size for n in sizes) and len({c.num_steps for c in ctxs}) > 1
    else:
        assert min(sizes) < cfg.batch_size < max(sizes)
    for (loss_s, state_s), (loss_b, state_b) in zip(outputs["serial"], outputs["batched"]):
        assert loss_b == pytest.approx(loss_s, rel=1e-6)
        assert worst_relative_error(state_s, state_b) <= 1e-5


# --------------------------------------------------------------------------- errors and settings
def test_unvectorised_hook_is_refused(data):
    class GradientClip(Algorithm):
        name = "clip"

        def before_step(self, model, ctx):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    cfg = fk.Config(**BASE)
    model = fk.models.build_model("cnn", 10)
    with pytest.raises(FeddrKitError, match="before_step_batched"):
        engine.check_batchable(model, GradientClip(cfg), cfg)
    engine.check_batchable(model, get_algorithm(cfg.replace(algorithm="scaffold")), cfg)  # has its batched hook


def test_batchnorm_running_statistics_are_refused():
    cfg = fk.Config(**BASE)
    model = fk.models.build_model("cnn", 10)
    model.body.insert(1, torch.nn.BatchNorm2d(16))
    with pytest.raises(FeddrKitError, match="running statistics"):
        engine.check_batchable(model, get_algorithm(cfg), cfg)


@pytest.mark.parametrize("field,value", [("engine", "fast"), ("precision", "fp16"), ("deterministic", "yes"), ("tf32", 1),
                                         ("channels_last", "true"), ("fused_sgd", None)])
def test_config_rejects_bad_engine_settings(field, value):
    with pytest.raises(FeddrKitError, match=field):
        fk.Config(**{field: value})


def test_auto_engine_is_serial_on_cpu_and_batched_on_cuda():
    assert engine.resolve_engine("auto", torch.device("cpu")) == "serial"
    assert engine.resolve_engine("auto", torch.device("cuda")) == "batched"
    assert engine.resolve_engine("batched", torch.device("cpu")) == "batched"


@pytest.mark.parametrize("engine_name", ["serial", "batched"])
def test_deterministic_run_is_reproducible_and_restores_the_setting(data, engine_name):
    seen = []
    cfg = fk.Config(**{**BASE, "algorithm": "fedetf", "rounds": 2, "engine": engine_name, "deterministic": True,
                       **SETTINGS["dirichlet"]})
    before = torch.are_deterministic_algorithms_enabled()
    a = fk.run(cfg, data=data, callback=lambda row: seen.append(torch.are_deterministic_algorithms_enabled()))
    b = fk.run(cfg, data=data)
    assert seen == [True, True] and torch.are_deterministic_algorithms_enabled() == before
    assert a.history.drop(columns="seconds").equals(b.history.drop(columns="seconds"))
    for n, t in a.model.state_dict().items():
        assert torch.equal(t, b.model.state_dict()[n]), n
    seen.clear()
    fk.run(cfg.replace(deterministic=False, rounds=1), data=data,
           callback=lambda row: seen.append(torch.are_deterministic_algorithms_enabled()))
    assert seen == [False]


@pytest.mark.parametrize("options", [{}, {"channels_last": True, "fused_sgd": True}])
@pytest.mark.parametrize("algorithm", ["feddr+", "fedetf"])
def test_bf16_round_stays_close_to_fp32(data, algorithm, options):
    """bf16 copies of fp32 weights: the round's update (new global minus initial) stays near fp32's.

    bf16 keeps 8 significant bits (0.4 % per rounding), compounded over layers and steps: the
    updates differ by ~7 % (measured); the bound of 15 % is loose on purpose, while a wrong path
    (a teacher or counts that are not the client's, an update lost in bf16) is off by O(1). With the speed
    options (a channels-last bf16 teacher and stacks, the fused step) the same bound holds."""
    cfg = fk.Config(**{**BASE, "algorithm": algorithm, "rounds": 1, "engine": "batched", **SETTINGS["dirichlet"]})
    initial = round_pieces(data, cfg)[0].state_dict()
    fp32 = fk.run(cfg, data=data).model.state_dict()
    bf16 = fk.run(cfg, data=data, precision="bf16", **options).model.state_dict()
    assert all(t.dtype == torch.float32 for t in bf16.values())  # the master weights stay fp32
    moved = [n for n in fp32 if not torch.equal(fp32[n], initial[n])]
    assert moved
    update_fp32 = {n: fp32[n] - initial[n] for n in moved}
    update_bf16 = {n: bf16[n] - initial[n] for n in moved}
    assert 0 < worst_relative_error(update_fp32, update_bf16) <= 0.15


def test_bf16_needs_the_batched_engine(data):
    with pytest.raises(FeddrKitError, match="batched"):
        fk.run(fk.Config(**{**BASE, "rounds": 1}), data=data, engine="serial", precision="bf16")


def test_fused_sgd_needs_the_batched_engine(data):
    with pytest.raises(FeddrKitError, match="fused_sgd=True needs engine='batched'"):
        fk.run(fk.Config(**{**BASE, "rounds": 1}), data=data, engine="serial", fused_sgd=True)


@pytest.mark.parametrize("model,algorithm", [("cnn", "feddr+"), ("cnn", "scaffold"), ("cnn_nobn", "fedavg"),
                                             ("cnn_bn", "feddr+")])
def test_serial_channels_last_is_the_same_arithmetic(data, model, algorithm, monkeypatch, float64):
    """The serial engine laid out channels-last against the contiguous layout, one round in float64 to 1e-9: only the
    order of the convolutions' sums differs. (In float32 that reassociation, ~1e-7 a step, grows to ~5e-4 in the
    weights over this round's steps at lr 0.05, so float32 could not tell it from a wrong gradient.) A spy on the local step sees the layout
    really change: channels-last images reach the model, whose conv weights (and the FedDr+ teacher's) are
    channels-last; the contiguous run sees neither."""
    seen = []

    def spy(model, teacher, algo, opt, x, y, ctx, _step=fk.local.local_step):
        conv = [p for p in model.parameters() if p.dim() == 4]
        nets = [model] + ([teacher] if algo.needs_teacher else [])
        seen.append(x.is_contiguous(memory_format=torch.channels_last) and all(
            p.is_contiguous(memory_format=torch.channels_last) for net in nets for p in net.parameters() if p.dim() == 4)
            and bool(conv))
        return _step(model, teacher, algo, opt, x, y, ctx)

    monkeypatch.setattr(fk.local, "local_step", spy)
    cfg = fk.Config(**{**BASE, "model": model, "algorithm": algorithm, "rounds": 1})
    plain = fk.run(cfg, data=data, engine="serial", channels_last=False)
    assert seen and not any(seen)
    seen.clear()
    laid_out = fk.run(cfg, data=data, engine="serial", channels_last=True)
    assert seen and all(seen)
    assert_same_round(plain, laid_out, tol=1e-9)


def test_auto_layout_is_channels_last_for_the_serial_engine_on_the_cpu_and_contiguous_otherwise(data, tmp_path):
    """``channels_last=None`` (the default) is decided once, when the run is built: channels-last where it was measured
    faster (the serial engine on the CPU), contiguous elsewhere. The run then holds, returns and saves the bool."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [engine.resolve_layout(None, e, d) for e in ("serial", "batched") for d in (cpu, cuda)] == [True, False,
                                                                                                        False, False]
    assert engine.resolve_layout(False, "serial", cpu) is False and engine.resolve_layout(True, "batched", cuda) is True
    cfg = fk.Config(**{**BASE, "rounds": 1})
    assert cfg.channels_last is None
    assert fk.federated.build_run(cfg, cpu, data).cfg.channels_last is True  # engine auto: serial on the CPU
    for engine_name, laid_out in (("serial", True), ("batched", False)):
        folder = tmp_path / engine_name
        result = fk.run(cfg, data=data, engine=engine_name, out_dir=str(folder))
        assert result.config.channels_last is laid_out
        assert engine._laid_out_channels_last(result.model) is laid_out  # the batched engine lays out its own stacks
        assert json.loads((folder / "config.json").read_text())["channels_last"] is laid_out
        assert torch.load(folder / "checkpoint.pt", weights_only=False)["config"]["channels_last"] is laid_out


def _interrupted(cfg: fk.Config, data, folder, recorded: str) -> None:
    """Run ``cfg`` into ``folder`` until its round-2 evaluation (its checkpoint holds round 1); ``recorded="absent"``
    takes channels_last out of the checkpoint's config, as a checkpoint written before the field's default changed."""
    def stop_at_two(row):
        if row["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fk.run(cfg.replace(out_dir=str(folder)), data=data, callback=stop_at_two)
    if recorded == "absent":
        ckpt = torch.load(folder / "checkpoint.pt", weights_only=False)
        del ckpt["config"]["channels_last"]
        torch.save(ckpt, folder / "checkpoint.pt")


@pytest.mark.parametrize("recorded,layout", [("False", False), ("absent", False), ("auto", True)])
def test_a_resume_left_at_auto_continues_the_checkpoints_layout(data, tmp_path, recorded, layout):
    """A resume with ``channels_last=None`` on the CPU, where auto would choose channels-last, continues the layout
    the checkpoint ran in: NCHW for one made with False or without the field, channels-last for one made at auto.
    The model is laid out before the checkpoint's state is loaded, so the history and weights equal the uninterrupted
    run's in that layout bit for bit; the two layouts round differently here, so the equality says which one ran."""
    cfg = fk.Config(**{**BASE, "rounds": 3, "checkpoint_every": 1})
    straight = fk.run(cfg.replace(channels_last=layout), data=data)
    other = fk.run(cfg.replace(channels_last=not layout), data=data)
    assert not straight.history.drop(columns="seconds").equals(other.history.drop(columns="seconds"))
    folder = tmp_path / "run"
    _interrupted(cfg.replace(channels_last=None if recorded == "auto" else False), data, folder, recorded)
    resumed = fk.run(cfg.replace(out_dir=str(folder), channels_last=None), data=data, resume=True)
    assert resumed.config.channels_last is layout and engine._laid_out_channels_last(resumed.model) is layout
    assert json.loads((folder / "config.json").read_text())["channels_last"] is layout
    assert torch.load(folder / "checkpoint.pt", weights_only=False)["config"]["channels_last"] is layout
    pd.testing.assert_frame_equal(straight.history.drop(columns="seconds"), resumed.history.drop(columns="seconds"),
                                  check_exact=True)
    for name, t in straight.model.state_dict().items():
        assert torch.equal(t, resumed.model.state_dict()[name]), name


@pytest.mark.parametrize("recorded,asked,says", [("False", True, "channels_last: False -> True"),
                                                 ("absent", True, "channels_last: False -> True"),
                                                 ("auto", False, "channels_last: True -> False")])
def test_a_resume_asking_another_layout_than_the_checkpoints_is_refused(data, tmp_path, recorded, asked, says):
    cfg = fk.Config(**{**BASE, "rounds": 3, "checkpoint_every": 1, "channels_last": None if recorded == "auto" else False})
    _interrupted(cfg, data, tmp_path, recorded)
    before = (tmp_path / "checkpoint.pt").read_bytes()
    with pytest.raises(FeddrKitError, match=says):
        fk.run(cfg.replace(out_dir=str(tmp_path), channels_last=asked), data=data, resume=True)
    assert (tmp_path / "checkpoint.pt").read_bytes() == before


@pytest.mark.parametrize("tf32", [True, False])
def test_tf32_sets_the_cuda_flags_for_the_run_and_restores_them(monkeypatch, tf32):
    """The flags are only Python settings, so a CUDA device object checks them without a GPU; on CPU they are left alone."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what a deterministic CUDA run would set
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with engine.kernel_settings(True, torch.device("cuda"), tf32=tf32):
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (tf32, tf32)
    with engine.kernel_settings(True, torch.device("cpu"), tf32=not before[0]):
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_tf32_is_recorded_and_changes_nothing_on_cpu(data, tmp_path):
    cfg = fk.Config(**{**BASE, "rounds": 2, "engine": "serial"})
    on = fk.run(cfg, data=data, out_dir=str(tmp_path / "on"))
    off = fk.run(cfg, data=data, tf32=False, out_dir=str(tmp_path / "off"))
    assert json.loads((tmp_path / "off" / "config.json").read_text())["tf32"] is False
    assert json.loads((tmp_path / "on" / "config.json").read_text())["tf32"] is True
    assert on.history.drop(columns="seconds").equals(off.history.drop(columns="seconds"))


READ_BACKS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy")


@pytest.mark.parametrize("engine_name", ["serial", "batched"])
def test_no_host_read_back_per_local_step(data, monkeypatch, engine_name):
    """Reading a tensor's value on the host waits for the device; on a GPU one such wait per step leaves it idle.
    A round's read-backs (the divergence check on the summed losses, evaluation) must not grow with its steps:
    three local epochs read back as often as one."""
    counts = []

    def spy(name):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, **kw):
            counts.append(name)
            return original(self, *a, **kw)
        return counted

    def read_backs(epochs: int) -> int:
        cfg = fk.Config(**{**BASE, "algorithm": "feddr+", "rounds": 1, "engine": engine_name, "local_epochs": epochs,
                           **SETTINGS["dirichlet"]})
        with monkeypatch.context() as patch:
            for name in READ_BACKS:
                patch.setattr(torch.Tensor, name, spy(name))
            counts.clear()
            fk.run(cfg, data=data)
            return len(counts)

    one, three = read_backs(1), read_backs(3)
    assert one > 0 and three == one
