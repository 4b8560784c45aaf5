"""How a round's sampled clients train: ``serial`` (one client after another) or ``batched`` (all at once).

Both engines are generators over the round's clients: after each ``next`` the live ``model`` holds
that client's final local state and the value yielded is its mean local loss, so the round loop
(upload, aggregation, probes) is the same for both.

``serial`` loads the global state into the one reusable model and runs
:func:`feddr_kit.federated.train_client` for each client. ``batched`` trains the ``m`` clients as
one vectorised model: every trainable parameter becomes a stack ``[m, *shape]``, one
``torch.func.vmap`` of ``functional_call`` runs the clients' forward passes and losses (the same
:func:`feddr_kit.federated.client_loss` as the serial loop) and one backward gives every client its
own gradient (the summed losses are independent across rows). Each client draws its batches and
augmentations from its own ``(seed, round, client)`` generator in the serial order, and keeps its
own SGD momentum buffer (:func:`sgd_step`, equal to ``torch.optim.SGD``). Clients whose batches
differ in size at a step (an epoch's short last batch, small Dirichlet clients) are grouped by
batch size, one vmapped forward per group: nothing is padded, so BatchNorm statistics only ever
see a client's own images; a client that has finished its steps is masked out of the update.
The batched engine reads the losses back once per round.
"""
from __future__ import annotations

import contextlib
import copy
import os
from typing import Iterator

import torch
from torch import nn
from torch.func import functional_call, vmap

from . import federated as fed
from . import instruments
from .algorithms import Algorithm, ClientContext
from .config import Config
from .data import ImageData
from .errors import FeddrKitError
from .models import Net


def resolve_engine(name: str, device: torch.device) -> str:
    """``"auto"`` → ``"batched"`` on CUDA, ``"serial"`` on CPU (where batched was measured slower); else ``name``."""
    if name == "auto":
        return "batched" if device.type == "cuda" else "serial"
    return name


@contextlib.contextmanager
def kernel_settings(deterministic: bool, device: torch.device) -> Iterator[None]:
    """Kernel choices for the duration of a run, restored afterwards.

    ``deterministic=True``: ``torch.use_deterministic_algorithms(True)`` (an op without a
    deterministic kernel raises), no cuDNN autotuning, and on CUDA ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
    when unset. ``False``: cuDNN autotuning on CUDA. TF32 is allowed on CUDA in both (it is
    deterministic, only less precise).
    """
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
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


def _serial(model, teacher, algo, data, client_idx, ctxs, cfg, device) -> Iterator[float]:
    if cfg.precision != "fp32":
        raise FeddrKitError(f"precision={cfg.precision!r} needs engine='batched' (the serial engine runs in fp32)")
    for idx, ctx in zip(client_idx, ctxs):
        _load(model, ctx.global_state)
        yield fed.train_client(model, teacher, algo, data, idx, ctx, cfg, device)


class _ClientLoss(nn.Module):
    """``functional_call`` target: one client's loss on one batch, with ``model``'s parameters substituted."""

    def __init__(self, model: Net):
        super().__init__()
        self.model = model

    def forward(self, teacher, algo, x, y, ctx, measure: bool = False):
        if measure:  # (loss, reg, feature-gradient norms): what the instruments need
            return fed.measured_terms(self.model, teacher, algo, x, y, ctx)
        return fed.client_loss(self.model, teacher, algo, x, y, ctx)


def check_batchable(model: Net, algo: Algorithm, cfg: Config) -> None:
    """Raise ``FeddrKitError`` naming what the batched engine cannot vectorise (never fall back silently)."""
    if algo.serial_only:
        raise FeddrKitError(f"engine='batched': algorithm {algo.name!r} keeps per-client state that its local "
                            "training reads and changes (a personalized method), which only engine='serial' runs")
    if type(algo).before_step is not Algorithm.before_step and \
            type(algo).before_step_batched is Algorithm.before_step_batched:
        raise FeddrKitError(f"engine='batched': algorithm {algo.name!r} overrides before_step but not "
                            "before_step_batched; add it or use engine='serial'")
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            raise FeddrKitError(f"engine='batched': {name} is a BatchNorm with running statistics, which the "
                                "clients would share; use track_running_stats=False or engine='serial'")


@torch.no_grad()
def sgd_step(params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor], lr: float,
             momentum: float, weight_decay: float, active: torch.Tensor | None = None) -> None:
    """One step of ``torch.optim.SGD`` (dampening 0, no Nesterov) on stacked per-client tensors, in place.

    ``params``, ``grads``, ``bufs`` (momentum buffers, zeros at a client's start; unused when
    ``momentum == 0``) are matching lists of ``[m, *shape]`` tensors. ``active`` (bool ``[m]``) masks the
    clients that take the step; the others keep their parameters and buffers unchanged. With buffers
    starting at zero, ``0·ρ + d = d`` reproduces SGD's first-step ``buf = d`` exactly.
    """
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
    m, lr, global_state = len(ctxs), ctxs[0].lr, ctxs[0].global_state
    _load(model, global_state)
    model.train()
    live = dict(model.named_parameters())
    names = [n for n, p in live.items() if p.requires_grad]  # frozen parameters and buffers stay shared
    stacks = [live[n].detach().expand(m, *live[n].shape).clone().requires_grad_() for n in names]
    bufs = [torch.zeros_like(s) for s in stacks] if cfg.momentum else []
    for ctx in ctxs:  # with the global state loaded, as in the serial loop
        algo.client_start(model, ctx)

    gens = [fed.client_generator(cfg.seed, c.round, c.client, device) for c in ctxs]
    batches = [fed.local_batches(idx, cfg, c.num_steps, g) for idx, c, g in zip(client_idx, ctxs, gens)]
    counts = torch.stack([c.class_counts for c in ctxs])
    step_module = _ClientLoss(model)
    # bf16: forward/backward on bf16 copies of the fp32 weights (cast by hand: autocast fails under
    # vmap); the casts are differentiable, so the gradients and the SGD update stay fp32.
    low = torch.bfloat16 if cfg.precision == "bf16" else None
    shared = {}  # frozen parameters and buffers, the same for every client
    if low is not None:
        shared = {f"model.{n}": t.to(low) for n, t in [*live.items(), *model.named_buffers()]
                  if n not in names and t.is_floating_point()}
        teacher = copy.deepcopy(teacher).to(low) if algo.needs_teacher else teacher

    # A measured round (ctx.gradients set) also returns each client's regularizer term and feature-gradient
    # norms, and takes the regularizer's gradient w.r.t. the body stacks: see feddr_kit.instruments.
    measure = ctxs[0].gradients is not None and algo.regularizer != "none"
    body = set(fed.body_parameter_names(model))
    body_rows = [i for i, n in enumerate(names) if n in body]
    if measure:
        ratio_sums = torch.zeros(2, m, dtype=torch.float64, device=device)  # features, body

    def one_client(params, x, y, class_counts):
        ctx = ClientContext(client=-1, round=ctxs[0].round, lr=lr, num_samples=-1, num_steps=-1,
                            class_counts=class_counts, global_state=global_state)
        if low is not None:
            params, x = {n: p.to(low) for n, p in params.items()}, x.to(low)
        return functional_call(step_module, {**params, **shared}, (teacher, algo, x, y, ctx, measure))

    losses_of = vmap(one_client)
    on_device: dict[tuple, torch.Tensor] = {}  # row selections and masks, copied to the device once each

    def device_tensor(values: tuple) -> torch.Tensor:
        if values not in on_device:
            on_device[values] = torch.tensor(values, device=device)
        return on_device[values]

    totals = torch.zeros(m, device=device)
    steps = [0] * m
    while True:
        drawn: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i in range(m):  # each client draws from its own generator, in the serial loop's order
            b = next(batches[i], None) if batches[i] is not None else None
            if b is None:
                batches[i] = None
                continue
            drawn[i] = (data.train_batch(b, gens[i]), data.train_y[b])
            steps[i] += 1
        if not drawn:
            break
        by_size: dict[int, list[int]] = {}
        for i, (x, _) in drawn.items():
            by_size.setdefault(x.shape[0], []).append(i)
        total = reg_total = 0.0
        feature_norms = torch.ones(2, m, device=device) if measure else None  # task, reg (1, 1 off the step)
        for rows in by_size.values():  # one vmapped forward per batch size: no padding anywhere
            x = torch.stack([drawn[i][0] for i in rows])
            y = torch.stack([drawn[i][1] for i in rows])
            if len(rows) == m:
                params, sel = stacks, None
            else:
                sel = device_tensor(tuple(rows))
                params = [s[sel] for s in stacks]
            out = losses_of({f"model.{n}": p for n, p in zip(names, params)}, x, y,
                            counts if sel is None else counts[sel])
            if measure:
                loss, reg, (task_norm, reg_norm) = out
                reg_total = reg_total + reg.sum()
                feature_norms[:, sel if sel is not None else slice(None)] = torch.stack([task_norm, reg_norm]).float()
            else:
                loss = out
            if sel is None:
                totals += loss.detach()
            else:
                totals[sel] += loss.detach()
            total = total + loss.sum()
        grads = list(torch.autograd.grad(total, stacks, allow_unused=True, materialize_grads=True,
                                         retain_graph=measure))
        active = [i in drawn for i in range(m)]
        if measure:
            reg_grads = torch.autograd.grad(reg_total, [stacks[i] for i in body_rows], allow_unused=True)
            body_norms = instruments.split_norms([grads[i] for i in body_rows], reg_grads, stacked=True)
            took = device_tensor(tuple(active))
            step_ratios = torch.stack([feature_norms[1] / feature_norms[0], body_norms[1] / body_norms[0]]).double()
            ratio_sums += torch.where(took, step_ratios, torch.zeros((), dtype=torch.float64, device=device))
        algo.before_step_batched(dict(zip(names, grads)), ctxs, active)
        mask = None if all(active) else device_tensor(tuple(active))
        sgd_step(stacks, grads, bufs, lr, cfg.momentum, cfg.weight_decay, mask)

    means = [t / max(s, 1) for t, s in zip(totals.tolist(), steps)]  # the round's one read-back
    for mean, ctx in zip(means, ctxs):
        fed.check_local_loss(mean, ctx)
    if measure:
        for i, ctx in enumerate(ctxs):
            ctx.gradients.add_sums(ratio_sums[0, i], ratio_sums[1, i], steps[i])
    trained = [live[n] for n in names]
    for i, mean in enumerate(means):
        with torch.no_grad():
            torch._foreach_copy_(trained, [s[i] for s in stacks])
        yield mean
