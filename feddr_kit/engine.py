"""How a round's sampled clients train: ``serial`` (one client after another) or ``batched`` (all at once).

Both engines are generators over the round's clients: after each ``next`` the live ``model`` holds
that client's final local state and the value yielded is its mean local loss, so the round loop
(upload, aggregation, probes) is the same for both.

``serial`` loads the global state into the one reusable model and runs
:func:`feddr_kit.local.train_client` for each client. ``batched`` trains the ``m`` clients as
one vectorised model: every trainable parameter becomes a stack ``[m, *shape]``, one
``torch.func.vmap`` of ``functional_call`` runs the clients' forward passes and losses (the same
:func:`feddr_kit.local.client_loss` as the serial loop) and one backward gives every client its
own gradient (the summed losses are independent across rows). Each client draws its batches and
augmentations from its own ``(seed, round, client)`` generator in the serial order, and keeps its
own SGD momentum buffer (:func:`sgd_step`, equal to ``torch.optim.SGD``). Clients whose batches
differ in size at a step (an epoch's short last batch, small Dirichlet clients) are grouped by
batch size, one vmapped forward per group: nothing is padded, so BatchNorm statistics only ever
see a client's own images; a client that has finished its steps is masked out of the update.
The batched engine reads the losses back once per round.

Where a run trains (:func:`resolve_device`, named in timings by :func:`device_name`) and with which
kernels (:func:`kernel_settings`) are decided here too.
"""
from __future__ import annotations

import contextlib
import copy
import os
from typing import TYPE_CHECKING, Iterator

import torch
from torch import nn
from torch.func import functional_call, vmap

from . import instruments, local
from .data import ImageData
from .errors import FeddrKitError
from .local import ClientContext, body_parameter_names, check_local_loss, client_loss, local_batches, measured_terms
from .methods.base import Algorithm
from .models import Net
from .streams import client_generator

if TYPE_CHECKING:  # annotations only: the config module sits above this one
    from .config import Config


def resolve_device(name: str) -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; ``"cuda"`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FeddrKitError("device='cuda' was asked for but no CUDA GPU is available; use device='auto' or 'cpu'")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    """What timings name the machine by: the GPU's name on CUDA, ``"cpu (N cores, T threads)"`` on CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def resolve_engine(name: str, device: torch.device) -> str:
    """``"auto"`` → ``"batched"`` on CUDA, ``"serial"`` on CPU (where batched was measured slower); else ``name``."""
    if name == "auto":
        return "batched" if device.type == "cuda" else "serial"
    return name


def resolve_layout(channels_last: bool | None, engine: str, device: torch.device) -> bool:
    """Whether a run lays out its images and conv weights channels-last (``Config.channels_last``). ``None``
    (auto) → True for the ``"serial"`` engine on the CPU, where the channels-last convolution and max-pooling
    kernels train 1.25-1.4x faster (benchmarks/cpu_step.py, results/cpu_step.csv); False elsewhere (a GPU, the
    batched engine), where no layout was measured faster, so the contiguous one stays. True/False as given."""
    if channels_last is None:
        return engine == "serial" and device.type == "cpu"
    return channels_last


@contextlib.contextmanager
def kernel_settings(deterministic: bool, device: torch.device, tf32: bool = True) -> Iterator[None]:
    """Kernel choices for the duration of a run, restored afterwards.

    ``deterministic=True``: ``torch.use_deterministic_algorithms(True)`` (an op without a
    deterministic kernel raises), no cuDNN autotuning, and on CUDA ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
    when unset. ``False``: cuDNN autotuning on CUDA. ``tf32`` (``Config.tf32``): on CUDA, float32
    matmuls and convolutions may use TF32 (deterministic, only less precise); on CPU the flags are
    left alone, since no CPU kernel reads them.
    """
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
            if deterministic:
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = device.type == "cuda" and not deterministic
        torch.backends.cudnn.deterministic = deterministic
        torch.use_deterministic_algorithms(deterministic, warn_only=False)
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
         torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) = saved[2:]


def train_round(engine: str, model: Net, teacher: Net, algo: Algorithm, data: ImageData,
                client_idx: list[torch.Tensor], ctxs: list[ClientContext], cfg: Config,
                device: torch.device) -> Iterator[float]:
    """Train a round's clients with ``engine`` (``"serial"`` or ``"batched"``).

    ``client_idx[i]`` holds client ``ctxs[i].client``'s train indices (int64 ``[n_i]``); every
    ``ctxs[i].global_state`` is the round's global state. Yields, for each client in order, its mean
    local loss, with ``model`` then holding that client's final local state (read it before the
    next ``next``). ``teacher`` holds the global model when the algorithm needs one.
    """
    if engine == "serial":
        return _serial(model, teacher, algo, data, client_idx, ctxs, cfg, device)
    if engine == "batched":
        return _batched(model, teacher, algo, data, client_idx, ctxs, cfg, device)
    raise FeddrKitError(f"engine must be one of serial, batched (or auto, resolved by the run), got {engine!r}")


def _load(model: Net, state: dict[str, torch.Tensor]) -> None:
    local = model.state_dict()  # detached views of the live tensors
    torch._foreach_copy_(list(local.values()), [state[n] for n in local])


def _laid_out_channels_last(model: Net) -> bool:
    """True when every 4-d parameter of ``model`` (its conv weights) is stored channels-last."""
    return all(p.is_contiguous(memory_format=torch.channels_last) for p in model.parameters() if p.dim() == 4)


def _serial(model, teacher, algo, data, client_idx, ctxs, cfg, device) -> Iterator[float]:
    if cfg.precision != "fp32":
        raise FeddrKitError(f"precision={cfg.precision!r} needs engine='batched' (the serial engine runs in fp32)")
    if cfg.fused_sgd:
        raise FeddrKitError("fused_sgd=True needs engine='batched' (it steps the batched engine's stacks)")
    if cfg.channels_last and not _laid_out_channels_last(model):
        raise FeddrKitError("channels_last=True with the serial engine needs the model laid out channels-last "
                            "before the round (feddr_kit.build.build_run does it)")
    for idx, ctx in zip(client_idx, ctxs):
        _load(model, ctx.global_state)
        yield local.train_client(model, teacher, algo, data, idx, ctx, cfg, device)  # looked up at each call: a spy put on the module sees every client


class _ClientLoss(nn.Module):
    """``functional_call`` target: one client's loss on one batch, with ``model``'s parameters substituted."""

    def __init__(self, model: Net):
        super().__init__()
        self.model = model

    def forward(self, teacher, algo, x, y, ctx, measure: bool = False):
        if measure:  # (loss, reg, feature-gradient norms): what the instruments need
            return measured_terms(self.model, teacher, algo, x, y, ctx)
        return client_loss(self.model, teacher, algo, x, y, ctx)


def check_batchable(model: Net, algo: Algorithm, cfg: Config) -> None:
    """Raise ``FeddrKitError`` naming what the batched engine cannot vectorise (never fall back silently)."""
    refusal = algo.batched_refusal()
    if refusal is not None:
        raise FeddrKitError(f"engine='batched': {refusal}")
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            raise FeddrKitError(f"engine='batched': {name} is a BatchNorm with running statistics, which the "
                                "clients would share; use track_running_stats=False or engine='serial'")


@torch.no_grad()
def sgd_step(params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor], lr: float,
             momentum: float, weight_decay: float, active: torch.Tensor | None = None, fused: bool = False) -> None:
    """One step of ``torch.optim.SGD`` (dampening 0, no Nesterov) on stacked per-client tensors, in place.

    ``params``, ``grads``, ``bufs`` (momentum buffers, zeros at a client's start; unused when
    ``momentum == 0``) are matching lists of ``[m, *shape]`` tensors. ``active`` (bool ``[m]``) masks the
    clients that take the step; the others keep their parameters and buffers unchanged. With buffers
    starting at zero, ``0·ρ + d = d`` reproduces SGD's first-step ``buf = d`` exactly. ``fused``: when
    every client takes the step, one ``torch._fused_sgd_`` call (torch.optim.SGD's ``fused=True``
    kernel) instead of three or four foreach passes; a masked step always takes the foreach path.
    """
    if fused and active is None:
        # The fused kernel walks each tensor's storage in order, so a gradient laid out unlike its
        # parameter (channels-last stacks) is first copied into the parameter's layout.
        grads = [g if g.stride() == p.stride() else torch.empty_like(p).copy_(g) for g, p in zip(grads, params)]
        torch._fused_sgd_(params, grads, bufs if momentum else [], weight_decay=weight_decay, momentum=momentum,
                          lr=lr, dampening=0.0, nesterov=False, maximize=False, is_first_step=False)
        return
    d = torch._foreach_add(grads, params, alpha=weight_decay) if weight_decay else list(grads)
    if momentum:
        if active is None:
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, d)
        else:
            for b, g in zip(bufs, d):
                b.copy_(torch.where(active.view(-1, *[1] * (b.dim() - 1)), b * momentum + g, b))
        d = bufs
    if active is not None:
        d = [g * active.view(-1, *[1] * (g.dim() - 1)).to(g.dtype) for g in d]  # ×1 and ×0 are exact
    torch._foreach_add_(params, d, alpha=-lr)


def _batched(model, teacher, algo, data, client_idx, ctxs, cfg, device) -> Iterator[float]:
    check_batchable(model, algo, cfg)
    m = len(ctxs)
    _load(model, ctxs[0].global_state)
    model.train()
    live = dict(model.named_parameters())
    names = [n for n, p in live.items() if p.requires_grad]  # frozen parameters and buffers stay shared
    stacks = [stacked(live[n].detach(), m, cfg.channels_last).requires_grad_() for n in names]
    bufs = [torch.zeros_like(s) for s in stacks] if cfg.momentum else []
    for ctx in ctxs:  # with the global state loaded, as in the serial loop
        algo.client_start(model, ctx)

    gens = [client_generator(cfg.seed, c.round, c.client, device) for c in ctxs]
    batches = [local_batches(idx, cfg, c.num_steps, g) for idx, c, g in zip(client_idx, ctxs, gens)]
    # A measured round (ctx.gradients set) also returns each client's regularizer term and feature-gradient
    # norms, and takes the regularizer's gradient w.r.t. the body stacks: see feddr_kit.instruments.
    meter = _Meter(model, names, m, device) if ctxs[0].gradients is not None and algo.regularizer != "none" else None
    losses_of = _StackedLosses(model, teacher, algo, ctxs, cfg, names, measure=meter is not None)
    on_device = _DeviceTuples(device)
    totals = torch.zeros(m, device=device)
    steps = [0] * m
    while drawn := _draw(data, batches, gens, steps):
        grads = _gradients(losses_of, stacks, drawn, on_device, totals, meter)
        active = [i in drawn for i in range(m)]
        if meter is not None:
            meter.add_step(stacks, grads, active, on_device)
        algo.before_step_batched(dict(zip(names, grads)), ctxs, active)
        mask = None if all(active) else on_device(tuple(active))
        sgd_step(stacks, grads, bufs, ctxs[0].lr, cfg.momentum, cfg.weight_decay, mask, fused=cfg.fused_sgd)

    means = [t / max(s, 1) for t, s in zip(totals.tolist(), steps)]  # the round's one read-back
    for mean, ctx in zip(means, ctxs):
        check_local_loss(mean, ctx)
    if meter is not None:
        meter.record(ctxs, steps)
    trained = [live[n] for n in names]
    for i, mean in enumerate(means):
        with torch.no_grad():
            torch._foreach_copy_(trained, [s[i] for s in stacks])
        yield mean


def stacked(t: torch.Tensor, m: int, channels_last: bool = False) -> torch.Tensor:
    """``m`` copies of ``t`` as a new ``[m, *t.shape]`` tensor. ``channels_last``: a conv weight ``[O,I,kh,kw]``
    is stored as ``[m,O,kh,kw,I]`` (the logical shape unchanged), so that the ``[m·O,I,kh,kw]`` weight of
    ``vmap``'s grouped convolution is a channels-last view, with no copy."""
    if channels_last and t.dim() == 4:
        nhwc = t.permute(0, 2, 3, 1)  # [O,kh,kw,I]
        return nhwc.expand(m, *nhwc.shape).contiguous().permute(0, 1, 4, 2, 3)
    return t.expand(m, *t.shape).clone()


def stack_images(xs: list[torch.Tensor], channels_last: bool = False) -> torch.Tensor:
    """Images ``[k,B,C,H,W]`` from ``k`` batches ``[B,C,H,W]``. ``channels_last``: stored as ``[B,H,W,k,C]``, so that
    the ``[B,k·C,H,W]`` input of ``vmap``'s grouped convolution is a channels-last view, with no copy."""
    if channels_last:
        return torch.stack([x.permute(0, 2, 3, 1) for x in xs], dim=3).permute(3, 0, 4, 1, 2)
    return torch.stack(xs)


class _StackedLosses:
    """The losses of some of the round's clients in one ``vmap`` of :class:`_ClientLoss`.

    Called with the stacks to use (``[k, *shape]`` each, in ``names``' order), images ``[k,B,3,H,W]``
    (:func:`stack_images`), labels
    ``[k,B]`` and ``sel`` (the clients' rows, int64 ``[k]``, or None for all ``m``), it returns their losses
    ``[k]``; when ``measure``, :func:`feddr_kit.local.measured_terms`' three values, each ``[k]``. With
    ``cfg.precision="bf16"`` the forward and backward run on bf16 copies of the fp32 weights (cast by hand:
    autocast fails under vmap); the casts are differentiable, so the gradients and the SGD update stay fp32.
    With ``cfg.channels_last`` the teacher is a channels-last copy (its convolutions are not grouped: the
    clients' images are its batch).
    """

    def __init__(self, model: Net, teacher: Net, algo: Algorithm, ctxs: list[ClientContext], cfg: Config,
                 names: list[str], measure: bool):
        self.names = names
        self.counts = torch.stack([c.class_counts for c in ctxs])
        step_module = _ClientLoss(model)
        low = torch.bfloat16 if cfg.precision == "bf16" else None
        shared = {}  # frozen parameters and buffers, the same for every client
        if low is not None:
            shared = {f"model.{n}": t.to(low) for n, t in [*model.named_parameters(), *model.named_buffers()]
                      if n not in names and t.is_floating_point()}
        if algo.needs_teacher and (low is not None or cfg.channels_last):
            teacher = copy.deepcopy(teacher).to(low, memory_format=torch.channels_last if cfg.channels_last
                                                else torch.preserve_format)
        self.channels_last = cfg.channels_last
        template = ctxs[0]

        def one_client(params, x, y, class_counts):
            ctx = template.vmapped(class_counts)
            if low is not None:
                params, x = {n: p.to(low) for n, p in params.items()}, x.to(low)
            return functional_call(step_module, {**params, **shared}, (teacher, algo, x, y, ctx, measure))

        self.vmapped = vmap(one_client)

    def __call__(self, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, sel: torch.Tensor | None):
        counts = self.counts if sel is None else self.counts[sel]
        return self.vmapped({f"model.{n}": p for n, p in zip(self.names, params)}, x, y, counts)


class _DeviceTuples:
    """Row selections and masks as device tensors, each copied to the device once per round."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cache: dict[tuple, torch.Tensor] = {}

    def __call__(self, values: tuple) -> torch.Tensor:
        if values not in self.cache:
            self.cache[values] = torch.tensor(values, device=self.device)
        return self.cache[values]


def _draw(data: ImageData, batches: list, gens: list[torch.Generator], steps: list[int]
          ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """The next step's batches, client ``i`` -> (normalized images ``[B_i,3,H,W]``, labels ``[B_i]``), of the
    clients with steps left (each draws from its own generator, in the serial loop's order), counted in
    ``steps``; ``{}`` when every client is done."""
    drawn: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for i in range(len(batches)):
        b = next(batches[i], None) if batches[i] is not None else None
        if b is None:
            batches[i] = None
            continue
        drawn[i] = (data.train_batch(b, gens[i]), data.train_y[b])
        steps[i] += 1
    return drawn


def _gradients(losses_of: _StackedLosses, stacks: list[torch.Tensor], drawn: dict, on_device: _DeviceTuples,
               totals: torch.Tensor, meter: "_Meter | None") -> list[torch.Tensor]:
    """One step's forward and backward for the clients in ``drawn``: one vmapped forward per batch size (no
    padding anywhere), the losses added to ``totals`` ``[m]``. Returns every stack's gradient ``[m, *shape]``
    (zero rows for the clients not in ``drawn``). A ``meter`` takes what it needs of the forward."""
    by_size: dict[int, list[int]] = {}
    for i, (x, _) in drawn.items():
        by_size.setdefault(x.shape[0], []).append(i)
    if meter is not None:
        meter.start_step()
    total = 0.0
    for rows in by_size.values():
        x = stack_images([drawn[i][0] for i in rows], losses_of.channels_last)
        y = torch.stack([drawn[i][1] for i in rows])
        if len(rows) == len(totals):
            params, sel = stacks, None
        else:
            sel = on_device(tuple(rows))
            params = [s[sel] for s in stacks]
        out = losses_of(params, x, y, sel)
        loss = out if meter is None else meter.add_forward(out, sel)
        if sel is None:
            totals += loss.detach()
        else:
            totals[sel] += loss.detach()
        total = total + loss.sum()
    return list(torch.autograd.grad(total, stacks, allow_unused=True, materialize_grads=True,
                                    retain_graph=meter is not None))


class _Meter:
    """The instruments' sums of a measured round in the batched engine (:mod:`feddr_kit.instruments`):
    per client, the regularizer:task gradient ratios w.r.t. the features and w.r.t. the body, summed over
    the steps it takes (float64 ``[2, m]``)."""

    def __init__(self, model: Net, names: list[str], m: int, device: torch.device):
        body = set(body_parameter_names(model))
        self.body_rows = [i for i, n in enumerate(names) if n in body]
        self.m, self.device = m, device
        self.ratio_sums = torch.zeros(2, m, dtype=torch.float64, device=device)  # features, body

    def start_step(self) -> None:
        self.reg_total = 0.0
        self.feature_norms = torch.ones(2, self.m, device=self.device)  # task, reg (1, 1 off the step)

    def add_forward(self, out, sel: torch.Tensor | None) -> torch.Tensor:
        """Keep a group's regularizer terms and feature-gradient norms; returns its losses ``[k]``."""
        loss, reg, (task_norm, reg_norm) = out
        self.reg_total = self.reg_total + reg.sum()
        self.feature_norms[:, sel if sel is not None else slice(None)] = torch.stack([task_norm, reg_norm]).float()
        return loss

    def add_step(self, stacks: list[torch.Tensor], grads: list[torch.Tensor], active: list[bool],
                 on_device: _DeviceTuples) -> None:
        """Add the step's ratios of the clients that took it (``grads``: the loss's, before any hook)."""
        reg_grads = torch.autograd.grad(self.reg_total, [stacks[i] for i in self.body_rows], allow_unused=True)
        body_norms = instruments.split_norms([grads[i] for i in self.body_rows], reg_grads, stacked=True)
        took = on_device(tuple(active))
        fn = self.feature_norms
        step_ratios = torch.stack([fn[1] / fn[0], body_norms[1] / body_norms[0]]).double()
        self.ratio_sums += torch.where(took, step_ratios, torch.zeros((), dtype=torch.float64, device=self.device))

    def record(self, ctxs: list[ClientContext], steps: list[int]) -> None:
        """Hand each client's sums to its ``ctx.gradients``."""
        for i, ctx in enumerate(ctxs):
            ctx.gradients.add_sums(self.ratio_sums[0, i], self.ratio_sums[1, i], steps[i])
