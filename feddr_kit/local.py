"""One client's local training: its steps and batches, its context, its loss, one SGD step, the whole update.

Every caller trains through these: the round loop (both engines), fine-tuning and local-only
training (:mod:`feddr_kit.personalize`), chapter 03's local round (:mod:`feddr_kit.teaching`), and
the methods whose clients take extra steps (Ditto's personal model, Per-FedAvg's adaptation).
:class:`ClientContext` and :class:`Batch` are what the algorithms' hooks and losses receive.

:func:`train_client` draws the client's batches from its own generator (:mod:`feddr_kit.streams`),
gathers, augments and normalizes them on the device, and takes :func:`local_step` on each: the
algorithm's loss (:func:`client_loss`), backward, the algorithm's gradient hook, the optimizer step.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import torch

from . import instruments
from . import partition as partition_mod
from .clients import Clients
from .data import ImageData
from .errors import DivergedError
from .instruments import GradientRatios
from .models import Net, build_model
from .streams import client_generator

if TYPE_CHECKING:  # annotations only: these modules sit above this one
    from .config import Config
    from .methods.base import Algorithm


# --------------------------------------------------------------------------- what a client's training knows
@dataclass
class Batch:
    """One local mini-batch after the forward pass.

    ``x`` images ``[B,3,H,W]`` (normalized), ``y`` labels ``[B]``, ``h`` raw features ``[B,d]``,
    ``z`` logits ``[B,C]``; ``h_g``/``z_g`` the same from the round's global model (teacher) when
    the loss needs them, else ``None``.
    """

    x: torch.Tensor
    y: torch.Tensor
    h: torch.Tensor
    z: torch.Tensor
    h_g: torch.Tensor | None = None
    z_g: torch.Tensor | None = None


@dataclass
class ClientContext:
    """What a client's local training knows: who it is, the round, its data and the global model.

    Built by :func:`client_context`. ``optimizer`` and ``batch`` are set by :func:`local_step` before
    the hooks of each step run: the optimizer taking the step, and the step's normalized images
    ``[B,3,H,W]`` and labels ``[B]``. ``state`` belongs to the algorithm: its per-client scratch for
    this round (each method its own small dataclass, set in ``Algorithm.client_start``).
    """

    client: int
    round: int
    lr: float
    num_samples: int
    num_steps: int
    class_counts: torch.Tensor  # float32 [C], the client's training label histogram
    global_state: dict[str, torch.Tensor]  # the round's global model (read-only)
    state: Any = None
    # When set, local training records the regularizer:task gradient ratios of every step here
    # (the evaluated rounds of a run with a regularizer; see feddr_kit.instruments).
    gradients: GradientRatios | None = None
    optimizer: torch.optim.Optimizer | None = None
    batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def vmapped(self, class_counts: torch.Tensor) -> "ClientContext":
        """What a loss sees of this round's clients under the batched engine's ``vmap``: the shared
        ``round``, ``lr`` and ``global_state``, a client's own ``class_counts`` ``[C]``, and -1 where
        the value differs between clients and cannot be a Python number (see ``Algorithm.loss_terms``)."""
        return ClientContext(client=-1, round=self.round, lr=self.lr, num_samples=-1, num_steps=-1,
                             class_counts=class_counts, global_state=self.global_state)


# --------------------------------------------------------------------------- steps and batches
def dirichlet_steps(cfg: Config) -> bool:
    """True when clients take the Dirichlet (LDA) rule's random batches: ``partition="dirichlet"``, or a
    reference partition file of the Dirichlet kind (:func:`feddr_kit.partition.reference_scheme`)."""
    if cfg.partition == "reference":
        return partition_mod.reference_scheme(cfg.reference_partition) == "dirichlet"
    return cfg.partition == "dirichlet"


def local_steps(num_samples: int, cfg: Config, mean_client_size: int) -> int:
    """Local SGD steps of a client with ``num_samples`` training images.

    Shard / iid: ``E`` full epochs, ``E·⌈n/B⌉`` steps. Dirichlet: ``E·⌊(N/K)/B⌋`` random batches
    whatever the client's own size ``n``, with ``N/K`` = ``mean_client_size`` (the FedML rule the
    paper's Dirichlet runs follow: every client takes the same number of steps).
    """
    if dirichlet_steps(cfg):
        return cfg.local_epochs * max(1, mean_client_size // cfg.batch_size)
    return cfg.local_epochs * math.ceil(num_samples / cfg.batch_size)


def local_batches(indices: torch.Tensor, cfg: Config, num_steps: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Yield ``num_steps`` index batches (int64 ``[≤B]``) of one client's train ``indices`` (int64 ``[n]``).

    Shard / iid: shuffled full epochs (the last batch of an epoch may be smaller). Dirichlet: each
    batch is the first ``B`` of a fresh shuffle, so batches are i.i.d. across steps.
    """
    n = indices.numel()
    if dirichlet_steps(cfg):
        for _ in range(num_steps):
            yield indices[torch.randperm(n, generator=gen, device=indices.device)[: cfg.batch_size]]
        return
    # Whole shuffled epochs until num_steps batches (E·⌈n/B⌉ steps are exactly E epochs; an algorithm
    # asking for more steps through Algorithm.num_local_steps gets more epochs, e.g. FedRep's head epochs).
    steps = 0
    while steps < num_steps:
        for batch in indices[torch.randperm(n, generator=gen, device=indices.device)].split(cfg.batch_size):
            yield batch
            steps += 1
            if steps == num_steps:
                return


def client_context(algo: Algorithm, cfg: Config, clients: Clients, client: int, round: int, lr: float,
                   global_state: dict[str, torch.Tensor], *, num_steps: int | None = None,
                   measure: bool = False) -> ClientContext:
    """The :class:`ClientContext` of ``client`` in round ``round`` at ``lr``, from the received ``global_state``.

    ``num_steps``: default the algorithm's count (:meth:`Algorithm.num_local_steps`) of the kit's rule
    (:func:`local_steps`). ``round`` also names the client's random stream
    (:func:`feddr_kit.streams.client_generator`). ``measure``: record the regularizer:task gradient
    ratios of its steps in ``ctx.gradients`` (the evaluated rounds); nothing is recorded without a regularizer.
    """
    n = clients.size(client)
    if num_steps is None:
        num_steps = algo.num_local_steps(local_steps(n, cfg, clients.mean_size))
    gradients = GradientRatios() if measure and algo.regularizer != "none" else None
    return ClientContext(client=client, round=round, lr=lr, num_samples=n, num_steps=num_steps,
                         class_counts=clients.counts[client], global_state=global_state, gradients=gradients)


def build_teacher(model: str, num_classes: int, algo: Algorithm, device: torch.device) -> Net:
    """A frozen (eval, no grad) ``model`` of the global model's architecture after ``algo.adapt_model``
    (FedETF's projection): the distillation teacher and the probes' view of the global model. Load the
    global state into it before use."""
    teacher = build_model(model, num_classes, head_bias=algo.head_bias).to(device)
    algo.adapt_model(teacher)
    return teacher.eval().requires_grad_(False)


# --------------------------------------------------------------------------- the loss of one batch
def client_batch(model: Net, teacher: Net | None, algo: Algorithm, x: torch.Tensor, y: torch.Tensor) -> Batch:
    """The :class:`Batch` of a normalized batch ``x`` ``[B,3,H,W]`` with labels ``y`` ``[B]``: ``model``'s
    features and logits, and the teacher's (``teacher`` holds the round's global model) when the
    algorithm needs them."""
    h = model.features(x)
    b = Batch(x=x, y=y, h=h, z=algo.logits(model, h))
    if algo.needs_teacher:
        with torch.no_grad():
            b.h_g = teacher.features(x)
            b.z_g = algo.logits(teacher, b.h_g)
    return b


def client_loss(model: Net, teacher: Net | None, algo: Algorithm, x: torch.Tensor, y: torch.Tensor,
                ctx: ClientContext) -> torch.Tensor:
    """The algorithm's loss (a scalar) of ``model`` on a normalized batch ``x`` ``[B,3,H,W]``, labels ``y`` ``[B]``:
    ``algo.loss`` on :func:`client_batch`. Both engines call it (the batched one under vmap)."""
    return algo.loss(model, client_batch(model, teacher, algo, x, y), ctx)


def measured_terms(model: Net, teacher: Net | None, algo: Algorithm, x: torch.Tensor, y: torch.Tensor,
                   ctx: ClientContext) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`client_loss` of a measured step, with what the instruments need: ``(loss, reg, (‖∂task/∂h‖,
    ‖∂reg/∂h‖))``, all scalars, ``loss`` bit for bit :func:`client_loss`'s (``algo.loss_terms`` summed).
    Both engines call it (the batched one under vmap); the algorithm must have a regularizer."""
    b = client_batch(model, teacher, algo, x, y)
    task, reg = algo.loss_terms(model, b, ctx)

    def terms_of(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return algo.loss_terms(model, dataclasses.replace(b, h=h, z=algo.logits(model, h)), ctx)

    return task + reg, reg, instruments.feature_gradient_norms(terms_of, b.h)


def body_parameter_names(model: Net) -> list[str]:
    """Names of the body's trainable parameters (``body.…``, in ``named_parameters`` order): where the
    instruments measure the gradient ratio with respect to the parameters."""
    return [n for n, p in model.named_parameters() if n.startswith("body.") and p.requires_grad]


# --------------------------------------------------------------------------- one step, one client
def local_step(model: Net, teacher: Net | None, algo: Algorithm, opt: torch.optim.Optimizer,
               x: torch.Tensor, y: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
    """One local SGD step on a normalized batch ``x`` ``[B,3,H,W]`` with labels ``y`` ``[B]``.

    Records ``opt`` and ``(x, y)`` in ``ctx.optimizer`` and ``ctx.batch`` for the hooks, then
    :func:`client_loss`, backward, the algorithm's gradient hook (``before_step``), the optimizer step.
    When ``ctx.gradients`` is set (a measured round of a run with a regularizer), the step also adds its
    gradient ratios to it (:mod:`feddr_kit.instruments`); the update is the same either way.
    Returns the detached loss (a scalar tensor).
    """
    ctx.optimizer, ctx.batch = opt, (x, y)
    if ctx.gradients is None or algo.regularizer == "none":
        loss = client_loss(model, teacher, algo, x, y, ctx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    else:
        loss, reg, feature_norms = measured_terms(model, teacher, algo, x, y, ctx)
        params = dict(model.named_parameters())
        body = [params[n] for n in body_parameter_names(model)]
        reg_grads = torch.autograd.grad(reg, body, retain_graph=True, allow_unused=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        ctx.gradients.add(feature_norms, instruments.split_norms([p.grad for p in body], reg_grads))
    algo.before_step(model, ctx)
    opt.step()
    return loss.detach()


def client_optimizer(params: list[torch.Tensor], lr: float, cfg: Config) -> torch.optim.SGD:
    """A client's local optimizer: SGD over ``params`` at ``lr``, with ``cfg``'s momentum and weight decay
    (fresh for every client and round: no momentum carries over)."""
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def train_client(model: Net, teacher: Net | None, algo: Algorithm, data: ImageData, idx: torch.Tensor,
                 ctx: ClientContext, cfg: Config, device: torch.device, gen: torch.Generator | None = None) -> float:
    """Local training of one client, from the state already loaded into ``model``.

    ``idx``: the client's train indices (int64 ``[n]``, on the device); ``ctx.num_steps`` steps of
    :func:`local_batches` (``cfg`` gives the batch rule and size) with SGD at ``ctx.lr`` and ``cfg``'s
    momentum and weight decay, over the parameters that require grad (frozen ones never reach the
    optimizer). Runs the algorithm's ``client_start``, then :func:`local_step` on each batch. ``gen``:
    the generator of batches and augmentation, default the client's own for ``(cfg.seed, ctx.round,
    ctx.client)``. ``teacher`` holds the round's global model when the algorithm needs one. With
    ``cfg.channels_last`` the batches are laid out channels-last (the model's weights already are). Returns
    the mean local loss; raises :class:`feddr_kit.errors.DivergedError` when it is not finite.
    """
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = client_optimizer(params, ctx.lr, cfg)
    if gen is None:
        gen = client_generator(cfg.seed, ctx.round, ctx.client, device)
    algo.client_start(model, ctx)
    total, steps = torch.zeros((), device=device), 0
    layout = torch.channels_last if cfg.channels_last else torch.contiguous_format
    for batch_idx in local_batches(idx, cfg, ctx.num_steps, gen):
        x = data.train_batch(batch_idx, gen).contiguous(memory_format=layout)
        total += local_step(model, teacher, algo, opt, x, data.train_y[batch_idx], ctx)
        steps += 1
    mean_loss = float(total) / max(steps, 1)
    check_local_loss(mean_loss, ctx)
    return mean_loss


def check_local_loss(mean_loss: float, ctx: ClientContext) -> None:
    """Raise :class:`feddr_kit.errors.DivergedError` when a client's mean local loss is not finite."""
    if not math.isfinite(mean_loss):
        raise DivergedError(
            f"round {ctx.round + 1}, client {ctx.client}: the local loss became {mean_loss} at lr={ctx.lr:g}; "
            "try a smaller learning rate"
        )
