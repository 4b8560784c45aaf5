"""Federated algorithms as small declarations on one shared round loop.

An :class:`Algorithm` says only what differs between methods: which head the model gets and
whether it is frozen, whether features are normalized before the head, the local loss, and
(for a few baselines) hooks around local steps and the server update. ``federated.run`` owns
everything else. Register a new method with :func:`register`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from . import heads, losses
from .config import Config
from .errors import FeddrKitError
from .models import Net

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


class Algorithm:
    """Base class: FedAvg's behaviour, which every method overrides only where it differs."""

    name: ClassVar[str] = ""
    head: ClassVar[str] = "learned"  # one of HEAD_KINDS
    normalize_features: ClassVar[bool] = False  # logits = head(ĥ) instead of head(h)
    default_regularizer: ClassVar[str] = "none"
    # Default initial lr per model, chosen by the grid in results/lr_grid.csv (teaching scale, cnn)
    # and the reference configs (vgg11 / mobilenet, spec §0).
    default_lr: ClassVar[dict[str, float]] = {}

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.regularizer = cfg.regularizer if cfg.regularizer is not None else self.default_regularizer
        self.fixed_head: torch.Tensor | None = None

    # ------------------------------------------------------------------ model set-up
    def setup(self, model: Net, seed: int) -> None:
        """Install and freeze the head on the (server's) global model, once, before round 0."""
        C, d = model.num_classes, model.feature_dim
        build = {"random_frozen": heads.random_head, "etf": heads.simplex_etf, "orthonormal": heads.orthonormal_head}
        if self.head in build:
            with torch.no_grad():
                model.head.weight.copy_(build[self.head](C, d, seed))
            model.head.weight.requires_grad_(False)
            self.fixed_head = model.head.weight.detach().clone()

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
        """Logits ``[B, C]`` from raw features ``h`` ``[B, d]``."""
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
            names = [n for n, p in model.named_parameters() if p.requires_grad]
            params = [p for p in model.parameters() if p.requires_grad]
            return losses.prox(params, [ctx.global_state[n] for n in names], self.cfg.mu)
        raise FeddrKitError(f"regularizer must be one of none, prox, kd, ntd, ld, fd, got {r!r}")

    def loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        """``β·L_alg + (1-β)·L_reg`` with a regularizer (the paper's Table 1), else ``L_alg``."""
        task = self.task_loss(model, b, ctx)
        if self.regularizer == "none":
            return task
        beta = self.cfg.beta
        return beta * task + (1.0 - beta) * self.regularizer_loss(model, b, ctx)

    # ------------------------------------------------------------------ hooks (no-ops by default)
    def client_start(self, model: Net, ctx: ClientContext) -> None:
        """Called after the local model is loaded with the global state, before the first step."""

    def before_step(self, model: Net, ctx: ClientContext) -> None:
        """Called after ``backward()`` and before ``optimizer.step()`` (e.g. to correct gradients)."""

    def client_end(self, model: Net, ctx: ClientContext) -> dict:
        """Called after local training; returns extra values to upload to the server."""
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
        """Re-assert the frozen head after aggregation (float averages can drift by a few ULP)."""
        if self.fixed_head is not None:
            state["head.weight"] = self.fixed_head.to(state["head.weight"].device).clone()
        return state

    def eval_state(self, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The state that is evaluated and reported (FedExP averages the last two iterates)."""
        return global_state

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
    """FedAvg: cross-entropy, everything trained, size-weighted averaging (spec §2)."""

    name = "fedavg"
    default_lr = _CE_LR


@register
class FedBABU(Algorithm):
    """FedBABU: the head stays at its shared random initialization; only the body learns (spec §4)."""

    name = "fedbabu"
    head = "random_frozen"
    default_lr = _CE_LR


@register
class DotRegression(Algorithm):
    """Dot-regression on normalized features against a frozen simplex ETF (spec §3, FedDr+ without FD)."""

    name = "dr"
    head = "etf"
    normalize_features = True
    default_lr = {"cnn": 0.1, "vgg11": 0.35, "mobilenet": 5.0}

    def task_loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        return losses.dot_regression(b.h, model.head.weight, b.y)


@register
class FedDrPlus(DotRegression):
    """FedDr+: ``β·L_DR + (1-β)·L_FD`` with the round's global model as feature teacher (spec §1)."""

    name = "feddr+"
    default_regularizer = "fd"


def algorithm_names() -> list[str]:
    """Registered algorithm names, in registration order."""
    return list(ALGORITHMS)


