"""Federated algorithms as small declarations on one shared round loop.

An :class:`Algorithm` says only what differs between methods: which head the model gets and
whether it is frozen, whether features are normalized before the head, the local loss, and
(for a few baselines) hooks around local steps and the server update. ``federated.run`` owns
everything else. Register a new method with :func:`register`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import heads, losses
from .config import Config
from .errors import FeddrKitError
from .instruments import GradientRatios
from .models import EVAL_BATCH_SIZE, Net, eval_order

if TYPE_CHECKING:
    from .data import ImageData
    from .partition import Partition

HEAD_KINDS = ("learned", "random_frozen", "etf", "orthonormal")


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
    """What a client's local training knows: who it is, the round, its data and the global model."""

    client: int
    round: int
    lr: float
    num_samples: int
    num_steps: int
    class_counts: torch.Tensor  # float32 [C], the client's training label histogram
    global_state: dict[str, torch.Tensor]  # the round's global model (read-only)
    extra: dict = field(default_factory=dict)  # per-client scratch space for hooks
    # When set, local training records the regularizer:task gradient ratios of every step here
    # (the evaluated rounds of a run with a regularizer; see feddr_kit.instruments).
    gradients: GradientRatios | None = None


class Algorithm:
    """Base class: FedAvg's behaviour, which every method overrides only where it differs."""

    name: ClassVar[str] = ""
    head: ClassVar[str] = "learned"  # one of HEAD_KINDS
    # Whether the head has a bias, as in the reference code: the cross-entropy methods do (FedBABU's is
    # frozen with its head); the fixed geometric heads (etf, orthonormal) do not.
    head_bias: ClassVar[bool] = True
    normalize_features: ClassVar[bool] = False  # logits = head(ĥ) instead of head(h)
    default_regularizer: ClassVar[str] = "none"
    # Default initial lr per model, chosen by the grid in results/lr_grid.csv (teaching scale, cnn)
    # and the reference configs (vgg11 / mobilenet, spec §0).
    default_lr: ClassVar[dict[str, float]] = {}
    # True for methods whose local training reads and changes per-client state (the personalized ones,
    # feddr_kit/pfl.py): the batched engine refuses them.
    serial_only: ClassVar[bool] = False
    personalized: ClassVar[bool] = False  # reports personalized models (history column personalized_acc)

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.regularizer = cfg.regularizer if cfg.regularizer is not None else self.default_regularizer
        self.fixed_head: torch.Tensor | None = None
        self.fixed_bias: torch.Tensor | None = None
        self.trainable_names: list[str] | None = None  # set by setup(): the parameters the optimizer moves

    # ------------------------------------------------------------------ model set-up
    def adapt_model(self, model: Net) -> None:
        """Change the architecture in place (FedETF adds a projection and a temperature); default: nothing.

        Called by :meth:`setup`, and by the loop on every other model that loads the global state
        (the teacher), so all of them have the same parameters. Must not depend on the seed's head.
        """

    def setup(self, model: Net, seed: int) -> None:
        """Adapt the architecture, then install and freeze the head on the global model, once, before round 0.

        A frozen head's bias (FedBABU's; build the model with ``head_bias=self.head_bias``) is set from
        the same seed as its weight and frozen with it, so every client and every run of a seed share it.
        """
        self.adapt_model(model)
        C, d = model.num_classes, model.feature_dim
        build = {"random_frozen": heads.random_head, "etf": heads.simplex_etf, "orthonormal": heads.orthonormal_head}
        if self.head in build:
            with torch.no_grad():
                model.head.weight.copy_(build[self.head](C, d, seed))
            model.head.weight.requires_grad_(False)
            self.fixed_head = model.head.weight.detach().clone()
            if model.head.bias is not None:
                with torch.no_grad():
                    model.head.bias.copy_(heads.random_head_bias(C, d, seed))
                model.head.bias.requires_grad_(False)
                self.fixed_bias = model.head.bias.detach().clone()
        self.trainable_names = [n for n, p in model.named_parameters() if p.requires_grad]

    @property
    def head_frozen(self) -> bool:
        return self.head != "learned"

    def initial_lr(self, model_name: str) -> float:
        """The lr to use when ``Config.lr`` is None."""
        if model_name not in self.default_lr:
            raise FeddrKitError(f"lr must be given for algorithm {self.name!r} with model {model_name!r} (no default)")
        return self.default_lr[model_name]

    # ------------------------------------------------------------------ forward and loss
    def logits(self, model: Net, h: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, C]`` from raw features ``h`` ``[B, d]`` (cast to the head's dtype, e.g. float32
        features of a float64 model from ``forward_all``)."""
        h = h.to(model.head.weight.dtype)
        if self.normalize_features:
            h = F.normalize(h, dim=1, eps=1e-12)
        return model.head(h)

    @property
    def needs_teacher(self) -> bool:
        """True when the loss needs the global model's features/logits on each batch."""
        return self.regularizer in ("fd", "kd", "ntd", "ld")

    def task_loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        """The method's own local loss (FedAvg: cross-entropy)."""
        return losses.cross_entropy(b.z, b.y)

    def regularizer_loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        """The regularizer's term on this batch (spec §10)."""
        r = self.regularizer
        if r == "fd":
            return losses.feature_distillation(b.h, b.h_g)
        if r == "kd":
            return losses.kd(b.z, b.z_g, self.cfg.tau)
        if r == "ntd":
            return losses.ntd(b.z, b.z_g, b.y, self.cfg.tau)
        if r == "ld":
            return losses.logit_distillation(b.z, b.z_g)
        if r == "prox":
            # Names fixed at setup: under torch.func (batched engine) the substituted per-client
            # parameters do not report requires_grad, so it cannot be read here.
            params = dict(model.named_parameters())
            names = self.trainable_names or [n for n, p in params.items() if p.requires_grad]
            return losses.prox([params[n] for n in names], [ctx.global_state[n] for n in names], self.cfg.mu)
        raise FeddrKitError(f"regularizer must be one of none, prox, kd, ntd, ld, fd, got {r!r}")

    def loss_terms(self, model: Net, b: Batch, ctx: ClientContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The two weighted terms of the local loss, ``(β·L_alg, (1-β)·L_reg)`` with a regularizer (the
        paper's Table 1), else ``(L_alg, None)``; two scalars. :meth:`loss` is their sum, and the gradient
        ratio of the two is what :mod:`feddr_kit.instruments` records.

        In the batched engine this runs under ``torch.func.vmap``, once per step for all clients:
        ``model``'s parameters and ``ctx.class_counts`` are then the client's own, ``ctx.global_state``,
        ``ctx.round`` and ``ctx.lr`` are shared, ``ctx.client``/``num_samples``/``num_steps`` are -1 and
        ``ctx.extra`` is empty. A loss must not read those, nor ``requires_grad``, nor convert tensors
        to Python numbers.
        """
        task = self.task_loss(model, b, ctx)
        if self.regularizer == "none":
            return task, None
        beta = self.cfg.beta
        return beta * task, (1.0 - beta) * self.regularizer_loss(model, b, ctx)

    def loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        """The local loss, a scalar: ``β·L_alg + (1-β)·L_reg`` with a regularizer, else ``L_alg``
        (the sum of :meth:`loss_terms`, whose constraints it shares)."""
        task, reg = self.loss_terms(model, b, ctx)
        return task if reg is None else task + reg

    # ------------------------------------------------------------------ hooks (no-ops by default)
    def num_local_steps(self, steps: int) -> int:
        """Local steps of a client given the kit's rule's ``steps`` (:func:`federated.local_steps`);
        default: the same. FedRep adds its head epochs, Per-FedAvg rounds up to whole step pairs."""
        return steps

    def personalized_metrics(self, model: Net, global_state: dict[str, torch.Tensor], evaluator, round: int,
                             lr: float) -> dict[str, float]:
        """Extra history columns of an evaluated round (the personalized methods' ``personalized_acc``);
        default none. ``model`` is a scratch model that may be overwritten; ``evaluator`` is the run's
        :class:`federated.Evaluator` (its ``partition`` and ``data``); ``lr`` the round's lr."""
        return {}

    def client_start(self, model: Net, ctx: ClientContext) -> None:
        """Called after the local model is loaded with the global state, before the first step."""

    def before_step(self, model: Net, ctx: ClientContext) -> None:
        """Called after ``backward()`` and before ``optimizer.step()`` (e.g. to correct gradients)."""

    def before_step_batched(self, grads: dict[str, torch.Tensor], ctxs: list[ClientContext],
                            active: list[bool]) -> None:
        """The batched engine's :meth:`before_step`, for all of a round's clients at once.

        ``grads`` maps each trainable parameter's name to the stacked gradients ``[m, *shape]`` of the
        round's ``m`` clients (row ``i`` is ``ctxs[i]``'s client), to be changed in place; ``active[i]``
        says whether client ``i`` takes this step (an inactive client's row is ignored). An algorithm
        that overrides :meth:`before_step` must override this too, or the batched engine refuses it.
        """
        if type(self).before_step is not Algorithm.before_step:
            raise FeddrKitError(f"algorithm {self.name!r} overrides before_step but not before_step_batched, "
                                "so engine='batched' cannot run it; use engine='serial'")

    def client_end(self, model: Net, ctx: ClientContext) -> dict:
        """Called after local training; returns extra values to upload to the server, each of the kind
        :attr:`uploads` declares for its key."""
        return {}

    def server_update(
        self,
        global_state: dict[str, torch.Tensor],
        average: dict[str, torch.Tensor],
        uploads: list[dict],
        weights: list[float],
        round: int,
    ) -> dict[str, torch.Tensor]:
        """New global state from the size-weighted average of the clients' states (FedAvg)."""
        return average

    def finalize_global(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Re-assert the frozen head (weight, and bias when frozen too) after aggregation (float averages can drift by a few ULP)."""
        if self.fixed_head is not None:
            state["head.weight"] = self.fixed_head.to(state["head.weight"].device).clone()
        if self.fixed_bias is not None and "head.bias" in state:
            state["head.bias"] = self.fixed_bias.to(state["head.bias"].device).clone()
        return state

    def eval_state(self, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The state that is evaluated and reported (FedExP averages the last two iterates)."""
        return global_state

    def after_training(self, model: Net, global_state: dict[str, torch.Tensor], data: "ImageData",
                       partition: "Partition") -> None:
        """Called once after the last round's aggregation, before its evaluation (SphereFed calibration).

        ``model`` is a scratch model of the right architecture that may be overwritten. Whatever
        changes the reported model must go through :meth:`eval_state` and :meth:`state_dict`.
        """

    # ------------------------------------------------------------------ what crosses the wire
    # On one machine these hooks are not needed (one Algorithm object serves the server and every
    # client); :mod:`feddr_kit.flower` uses them to split it between a server and its clients.
    # The kind of each value :meth:`client_end` returns: "scalar" (a Python float, sent exactly as a
    # float64) or "tensors" (a dict name -> tensor, sent as arrays).
    uploads: ClassVar[dict[str, str]] = {}

    def broadcast(self) -> dict[str, torch.Tensor]:
        """Server state every client of a round needs besides the global model (SCAFFOLD: ``c``), by name;
        default: none."""
        return {}

    def receive_broadcast(self, extras: dict[str, torch.Tensor]) -> None:
        """Install :meth:`broadcast`'s tensors on a client's copy of the algorithm (before ``client_start``)."""

    def client_state(self, client: int) -> dict[str, torch.Tensor]:
        """The persistent state of one client, kept by that client between the rounds it trains in
        (SCAFFOLD: ``c_i``), by name; ``{}`` when it has none (yet). Read after :meth:`client_end`."""
        return {}

    def set_client_state(self, client: int, state: dict[str, torch.Tensor]) -> None:
        """Install a client's persistent state before it trains; ``{}``: it has none yet (forget any held)."""

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """Server/client state to checkpoint (beyond the global model)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator adding an algorithm to :data:`ALGORITHMS` under ``cls.name``."""
    if cls.head not in HEAD_KINDS:
        raise FeddrKitError(f"head must be one of {', '.join(HEAD_KINDS)}, got {cls.head!r}")
    if cls.head_bias and cls.head in ("etf", "orthonormal"):
        raise FeddrKitError(f"head_bias must be False for a fixed geometric head ({cls.head!r}), in {cls.__name__}")
    ALGORITHMS[cls.name] = cls
    return cls


def get_algorithm(cfg: Config) -> Algorithm:
    """Instantiate the algorithm ``cfg.algorithm``."""
    if cfg.algorithm not in ALGORITHMS:
        raise FeddrKitError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {cfg.algorithm!r}")
    return ALGORITHMS[cfg.algorithm](cfg)


# Reference learning rates for the paper's models (spec §0); the cnn values come from the teaching grid.
_CE_LR = {"cnn": 0.01, "vgg11": 0.01, "mobilenet": 0.1}


@register
class FedAvg(Algorithm):
    """FedAvg: cross-entropy, everything trained (head weight and bias), size-weighted averaging (spec §2)."""

    name = "fedavg"
    default_lr = _CE_LR


@register
class FedBABU(Algorithm):
    """FedBABU: the head (weight and bias) stays at its shared random initialization; only the body learns (spec §4)."""

    name = "fedbabu"
    head = "random_frozen"
    default_lr = _CE_LR


@register
class DotRegression(Algorithm):
    """Dot-regression on normalized features against a frozen simplex ETF (spec §3, FedDr+ without FD)."""

    name = "dr"
    head = "etf"
    head_bias = False
    normalize_features = True
    default_lr = {"cnn": 0.03, "vgg11": 0.35, "mobilenet": 5.0}  # cnn: results/lr_grid.csv

    def task_loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        return losses.dot_regression(b.h, model.head.weight, b.y)


@register
class FedDrPlus(DotRegression):
    """FedDr+: ``β·L_DR + (1-β)·L_FD`` with the round's global model as feature teacher (spec §1)."""

    name = "feddr+"
    default_regularizer = "fd"


def algorithm_names(personalized: bool = False) -> list[str]:
    """Registered algorithm names, in registration order: the global-model (GFL) methods, or with
    ``personalized=True`` the personalized ones (feddr_kit/pfl.py: fedper, fedrep, perfedavg, ditto)."""
    return [n for n, cls in ALGORITHMS.items() if cls.personalized == personalized]


# --------------------------------------------------------------------------- baselines (issue 4)
def effective_steps(num_steps: int, momentum: float) -> float:
    """SCAFFOLD's momentum-corrected step count ``K_eff = (K - ρ(1-ρ^K)/(1-ρ)) / (1-ρ)`` (spec §5).

    Heavy-ball SGD with momentum ``ρ`` moves a constant gradient ``g`` by ``η·K_eff·g`` in ``K``
    steps, so dividing ``x - y`` by ``K_eff·η`` recovers the mean corrected gradient. ``ρ = 0`` gives ``K``.
    """
    if momentum == 0.0:
        return float(num_steps)
    rho = momentum
    return (num_steps - rho * (1.0 - rho**num_steps) / (1.0 - rho)) / (1.0 - rho)


@register
class Scaffold(Algorithm):
    """SCAFFOLD, option II control variates, server step size 1 (spec §5).

    State: the server's ``c`` and every client's ``c_i`` (trainable parameters only, zero at the
    start; a client that never took part has ``c_i = 0`` and is not stored). Each local gradient
    becomes ``g - c_i + c`` before the SGD step (momentum and weight decay are then applied by SGD,
    as in [REF]). After ``K`` steps at lr ``η``: ``c_i⁺ = c_i - c + (x - y)/(K_eff·η)``; the client
    uploads ``Δc_i = c_i⁺ - c_i``; the server sets ``x`` to the weighted average and ``c ← c + (1/N)Σ Δc_i``.

    ``Config.scaffold_zero_head_grad`` (default off, as the spec recommends) reproduces [REF], which
    zeroes the loss gradient of the head's weight (not its bias) before adding the correction, so the
    head weight moves only by ``c - c_i`` and weight decay (spec §5 pitfall; the paper's SCAFFOLD numbers).
    """

    name = "scaffold"
    default_lr = _CE_LR

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.zero_head_grad = bool(cfg.scaffold_zero_head_grad)
        self.names: list[str] = []
        self.c: dict[str, torch.Tensor] = {}
        self.c_clients: dict[int, dict[str, torch.Tensor]] = {}
        self.device = torch.device("cpu")

    def setup(self, model: Net, seed: int) -> None:
        super().setup(model, seed)
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in trainable]
        self.c = {n: torch.zeros_like(p, requires_grad=False) for n, p in trainable}
        self.device = trainable[0][1].device

    def client_variate(self, client: int) -> dict[str, torch.Tensor]:
        """``c_i`` of one client (zeros when it has not trained yet); shapes as the parameters."""
        if client in self.c_clients:
            return self.c_clients[client]
        return {n: torch.zeros_like(v) for n, v in self.c.items()}

    def client_start(self, model: Net, ctx: ClientContext) -> None:
        params = dict(model.named_parameters())
        c_i = self.client_variate(ctx.client)
        ctx.extra["scaffold_params"] = [params[n] for n in self.names]
        ctx.extra["scaffold_correction"] = [self.c[n] - c_i[n] for n in self.names]
        ctx.extra["scaffold_steps"] = 0

    def before_step(self, model: Net, ctx: ClientContext) -> None:
        for n, p, corr in zip(self.names, ctx.extra["scaffold_params"], ctx.extra["scaffold_correction"]):
            if p.grad is None:  # a parameter the loss did not reach still gets the correction
                p.grad = corr.clone()
                continue
            if self.zero_head_grad and n == "head.weight":
                p.grad.zero_()
            p.grad.add_(corr)
        ctx.extra["scaffold_steps"] += 1

    @torch.no_grad()
    def before_step_batched(self, grads, ctxs, active) -> None:
        # The corrections c - c_i stacked once per round, cached with the round's first client.
        cache = ctxs[0].extra
        if "scaffold_correction_stack" not in cache:
            cache["scaffold_correction_stack"] = [
                torch.stack([c.extra["scaffold_correction"][j] for c in ctxs]) for j in range(len(self.names))]
        for n, corr in zip(self.names, cache["scaffold_correction_stack"]):
            if self.zero_head_grad and n == "head.weight":
                grads[n].zero_()
            grads[n].add_(corr)
        for c, a in zip(ctxs, active):
            c.extra["scaffold_steps"] += int(a)

    @torch.no_grad()
    def client_end(self, model: Net, ctx: ClientContext) -> dict:
        c_i = self.client_variate(ctx.client)
        steps = ctx.extra["scaffold_steps"]
        if steps == 0:
            return {"delta_c": {n: torch.zeros_like(v) for n, v in c_i.items()}}
        scale = 1.0 / (effective_steps(steps, self.cfg.momentum) * ctx.lr)
        new, delta = {}, {}
        for n, y in zip(self.names, ctx.extra["scaffold_params"]):
            new[n] = c_i[n] - self.c[n] + (ctx.global_state[n] - y.detach()) * scale
            delta[n] = new[n] - c_i[n]
        self.c_clients[ctx.client] = new  # c_i belongs to the client: it is replaced as soon as it trains
        return {"delta_c": delta}

    @torch.no_grad()
    def server_update(self, global_state, average, uploads, weights, round):
        for n in self.names:
            self.c[n] += sum(u["delta_c"][n] for u in uploads) / self.cfg.num_clients
        return average

    uploads = {"delta_c": "tensors"}

    def broadcast(self) -> dict[str, torch.Tensor]:
        return dict(self.c)

    def receive_broadcast(self, extras: dict[str, torch.Tensor]) -> None:
        self.c = {n: extras[n].to(self.device) for n in self.names}

    def client_state(self, client: int) -> dict[str, torch.Tensor]:
        return dict(self.c_clients.get(client, {}))

    def set_client_state(self, client: int, state: dict[str, torch.Tensor]) -> None:
        if state:
            self.c_clients[client] = {n: state[n].to(self.device) for n in self.names}
        else:
            self.c_clients.pop(client, None)

    def state_dict(self) -> dict:
        return {"c": self.c, "c_clients": self.c_clients}

    def load_state_dict(self, state: dict) -> None:
        self.c = {n: v.to(self.device) for n, v in state["c"].items()}
        self.c_clients = {int(k): {n: v.to(self.device) for n, v in ci.items()} for k, ci in state["c_clients"].items()}


@register
class FedNTD(Algorithm):
    """FedNTD: ``CE + β_ntd·L_NTD`` with the round's global model as teacher (spec §6).

    ``L_NTD`` is the distillation on the not-true logits (:func:`losses.ntd`) at temperature
    ``Config.tau`` (default 1, as FedNTD's configs; not the ``NTD_Loss`` class default 3), with
    weight ``β_ntd = 1`` added to CE — unlike ``regularizer="ntd"``, the convex ``β·L + (1-β)·L_NTD``.
    """

    name = "fedntd"
    default_lr = _CE_LR
    ntd_weight: ClassVar[float] = 1.0

    @property
    def needs_teacher(self) -> bool:
        return True

    def task_loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        return losses.cross_entropy(b.z, b.y) + self.ntd_weight * losses.ntd(b.z, b.z_g, b.y, self.cfg.tau)


def fedexp_server_lr(mean_sq_norm: float, sq_norm_of_mean: float, num_clients: int, eps: float) -> float:
    """FedExP's server step ``η_g = max(1, 0.5·A / (‖Δ̄‖² + |S|·ε))`` (official code form, spec §7).

    ``mean_sq_norm`` is ``A = Σ p_i ‖Δ_i‖²``, ``sq_norm_of_mean`` is ``‖Σ p_i Δ_i‖²``, ``num_clients``
    is ``|S|``. When every update is zero and ``ε = 0`` the step is 1.
    """
    denominator = sq_norm_of_mean + num_clients * eps
    if denominator <= 0.0:
        return 1.0
    return max(1.0, 0.5 * mean_sq_norm / denominator)


def fedexp_reference_server_lr(mean_norm: float, norm_of_mean: float, total_clients: int, eps: float) -> float:
    """The FedDr+ reference code's FedExP step ``η_g = min(1, 0.5·mean_i‖Δ_i‖ / (‖Δ̄‖ + M·ε))`` (spec §7).

    ``mean_norm`` is the unweighted mean over the round's clients of ``‖Δ_i‖`` (norms, not squared),
    ``norm_of_mean`` is ``‖Σ p_i Δ_i‖``, ``total_clients`` is ``M``, the number of ALL clients (not
    the round's), and ``ε`` is used as given (the reference never decays it). The step is at most 1:
    it never extrapolates. When every update is zero and ``ε = 0`` the step is 1.
    """
    denominator = norm_of_mean + total_clients * eps
    if denominator <= 0.0:
        return 1.0
    return min(1.0, 0.5 * mean_norm / denominator)


@register
class FedExP(Algorithm):
    """FedExP: FedAvg clients, an extrapolated server step, and the last two iterates averaged for reporting (spec §7).

    Two server steps, by ``Config.fedexp_step``:

    * ``"fedexp"`` (default), the FedExP authors' step (their paper and code): over parameters
      ``x ← x + η_g·Δ̄`` with :func:`fedexp_server_lr` (``η_g ≥ 1``); buffers take the plain average.
      ``ε`` starts at ``Config.fedexp_eps`` and is multiplied by ``0.998²`` at the start of every round
      (before use, as the official code). :meth:`eval_state` reports ``(x_{t+1} + x_t)/2`` (after the
      first round: ``x_1``, as the official code); training continues from ``x_{t+1}``.
    * ``"reference"``, the FedDr+ reference code's step, which produced the paper's FedExP numbers
      (≈ FedAvg): :func:`fedexp_reference_server_lr` (``η_g ≤ 1``, never extrapolates) with the
      unweighted mean of the clients' update norms, ``M = Config.num_clients``, a constant ``ε``, and
      the latest iterate reported (no averaging of the last two).

    The local lr is NOT decayed by 0.998 per round: the kit's lr schedule is global and shared by all
    methods, as in [REF]. ``eta_g`` holds the step of every round so far.
    """

    name = "fedexp"
    default_lr = _CE_LR
    eps_decay: ClassVar[float] = 0.998**2

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.reference_step = cfg.fedexp_step == "reference"
        self.eps = float(cfg.fedexp_eps)
        self.param_names: list[str] = []
        self.previous: dict[str, torch.Tensor] | None = None  # x_t, the iterate before the latest step
        self.eta_g: list[float] = []
        self.device = torch.device("cpu")

    @property
    def last_eta_g(self) -> float:
        """The server step of the latest round (NaN before the first)."""
        return self.eta_g[-1] if self.eta_g else math.nan

    def setup(self, model: Net, seed: int) -> None:
        super().setup(model, seed)
        self.param_names = [n for n, _ in model.named_parameters()]
        self.device = model.head.weight.device

    uploads = {"delta_sq_norm": "scalar"}

    @torch.no_grad()
    def client_end(self, model: Net, ctx: ClientContext) -> dict:
        sq = sum(float((p.detach() - ctx.global_state[n]).double().pow(2).sum()) for n, p in model.named_parameters())
        return {"delta_sq_norm": sq}

    @torch.no_grad()
    def server_update(self, global_state, average, uploads, weights, round):
        delta = {n: average[n] - global_state[n] for n in self.param_names}
        sq_norm_of_mean = sum(float(d.double().pow(2).sum()) for d in delta.values())
        if self.reference_step:
            mean_norm = sum(math.sqrt(u["delta_sq_norm"]) for u in uploads) / len(uploads)
            eta = fedexp_reference_server_lr(mean_norm, math.sqrt(sq_norm_of_mean), self.cfg.num_clients, self.eps)
        else:
            self.eps *= self.eps_decay
            mean_sq_norm = sum(w * u["delta_sq_norm"] for u, w in zip(uploads, weights)) / sum(weights)
            eta = fedexp_server_lr(mean_sq_norm, sq_norm_of_mean, len(uploads), self.eps)
        self.eta_g.append(eta)
        keep_previous = round > 0 and not self.reference_step
        self.previous = {n: global_state[n].clone() for n in self.param_names} if keep_previous else None
        new = dict(average)
        for n in self.param_names:
            new[n] = global_state[n] + eta * delta[n]
        return new

    def eval_state(self, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.previous is None:
            return global_state
        out = dict(global_state)
        for n, prev in self.previous.items():
            out[n] = (global_state[n] + prev) / 2
        return out

    def state_dict(self) -> dict:
        return {"eps": self.eps, "previous": self.previous, "eta_g": list(self.eta_g)}

    def load_state_dict(self, state: dict) -> None:
        self.eps = float(state["eps"])
        prev = state["previous"]
        self.previous = None if prev is None else {n: v.to(self.device) for n, v in prev.items()}
        self.eta_g = list(state["eta_g"])


@register
class SphereFed(Algorithm):
    """SphereFed: normalized features, a fixed orthonormal head, MSE to one-hot on ``z = W·ĥ`` (spec §8).

    With ``Config.spherefed_calibration`` the reported head is replaced after the last round by the
    ridge solution ``W*ᵀ = (Σ_k G_k + λI)⁻¹ Σ_k B_k`` with ``G_k = Σ ĥĥᵀ`` ``[d, d]`` and ``B_k = Σ ĥ e_yᵀ``
    ``[d, C]`` over every client's (un-augmented) training images; ``λ = calibration_ridge · tr(G)/d``,
    i.e. 0.1 % of G's mean eigenvalue (the spec leaves λ open). Training itself never sees ``W*``.
    """

    name = "spherefed"
    head = "orthonormal"
    head_bias = False
    normalize_features = True
    default_lr = {"cnn": 0.1, "vgg11": 0.55, "mobilenet": 6.5}  # cnn: results/lr_grid.csv
    calibration_ridge: ClassVar[float] = 1e-3

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.calibrated_head: torch.Tensor | None = None

    def task_loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        return losses.mse_to_onehot(b.z, b.y)

    def server_update(self, global_state, average, uploads, weights, round):
        self.calibrated_head = None  # a run resumed with more rounds calibrates again at its new end
        return average

    @torch.no_grad()
    def after_training(self, model: Net, global_state, data: "ImageData", partition: "Partition") -> None:
        if not self.cfg.spherefed_calibration:
            return
        model.load_state_dict(global_state)
        model.eval()
        device = data.train_x.device
        d, C = model.feature_dim, model.num_classes
        G = torch.zeros(d, d, dtype=torch.float64, device=device)
        B = torch.zeros(d, C, dtype=torch.float64, device=device)
        for k, indices in enumerate(partition.train_indices):  # each client's (G_k, B_k), summed by the server
            idx = torch.from_numpy(np.asarray(indices, dtype=np.int64)).to(device)
            if model.batch_stat_norm:  # a fixed shuffle of the client's images: no one-class batches
                idx = idx[eval_order(len(idx), self.cfg.seed, 3, k).to(device)]
            for chunk in idx.split(EVAL_BATCH_SIZE):  # fixed batches, for batch-statistics BatchNorm
                h = F.normalize(model.features(data.normalize(data.train_x[chunk])).double(), dim=1, eps=1e-12)
                G += h.T @ h
                B.index_add_(1, data.train_y[chunk], h.T)
        ridge = self.calibration_ridge * float(G.trace()) / d
        eye = torch.eye(d, dtype=torch.float64, device=device)
        self.calibrated_head = torch.linalg.solve(G + ridge * eye, B).T.to(torch.float32).contiguous()

    def eval_state(self, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.calibrated_head is None:
            return global_state
        return {**global_state, "head.weight": self.calibrated_head.to(global_state["head.weight"].device)}

    def state_dict(self) -> dict:
        return {"calibrated_head": self.calibrated_head}

    def load_state_dict(self, state: dict) -> None:
        head = state.get("calibrated_head")
        self.calibrated_head = None if head is None else head.to(self.fixed_head.device)


class Projected(nn.Module):
    """A backbone followed by a bias-free linear projection: ``x`` → ``projection(backbone(x))`` ``[B, out_dim]``."""

    def __init__(self, backbone: nn.Module, in_dim: int, out_dim: int):
        super().__init__()
        self.backbone = backbone
        self.projection = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.backbone(x))


@register
class FedETF(Algorithm):
    """FedETF: projection to C dims, normalization, a fixed simplex ETF and a learned temperature (spec §9).

    :meth:`adapt_model` wraps the body with a bias-free ``Linear(d, C)`` ([REF]), so ``model.features``
    returns the projected feature ``[B, C]`` and ``model.feature_dim == C``; the head becomes a
    ``[C, C]`` ETF and ``model.temperature`` a learned scalar β (init 1, averaged like any weight).
    Logits ``z = β·V·ĥ``; loss: balanced softmax ``CE(z + log n_c, y)`` with the client's train counts,
    zero counts clamped to 1 ([ORIG]).
    """

    name = "fedetf"
    head = "etf"
    head_bias = False
    normalize_features = True
    default_lr = {"cnn": 0.01, "vgg11": 0.05, "mobilenet": 0.5}  # cnn: results/lr_grid.csv
    temperature_init: ClassVar[float] = 1.0

    def adapt_model(self, model: Net) -> None:
        if isinstance(model.body, Projected):
            return
        C, d, device = model.num_classes, model.feature_dim, model.head.weight.device
        model.body = Projected(model.body, d, C).to(device)
        model.feature_dim = C
        model.head = nn.Linear(C, C, bias=False).to(device)
        model.temperature = nn.Parameter(torch.full((), self.temperature_init, device=device))

    def logits(self, model: Net, h: torch.Tensor) -> torch.Tensor:
        return model.temperature * super().logits(model, h)

    def task_loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        return losses.balanced_softmax(b.z, b.y, ctx.class_counts)


# The personalized methods (spec §12) register themselves on import; they build on the classes above.
from . import pfl  # noqa: E402,F401
