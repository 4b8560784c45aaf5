"""The baselines the paper compares FedDr+ with: SCAFFOLD, FedNTD, FedExP, SphereFed and FedETF.

Each is written from its own paper and code; where the FedDr+ reference code (the authors' code
that produced the paper's numbers, see docs/fidelity.md) does something else, a Config switch
gives its way too (``fedexp_step="reference"``, ``scaffold_zero_head_grad=True``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import losses, streams
from ..models import EVAL_BATCH_SIZE, Net
from .base import Algorithm, Batch, ClientContext, register
from .global_fl import _CE_LR

if TYPE_CHECKING:  # annotations only: these modules sit above this one
    from ..config import Config
    from ..data import ImageData
    from ..partition import Partition


def effective_steps(num_steps: int, momentum: float) -> float:
    """SCAFFOLD's momentum-corrected step count ``K_eff = (K - ρ(1-ρ^K)/(1-ρ)) / (1-ρ)``.

    Heavy-ball SGD with momentum ``ρ`` moves a constant gradient ``g`` by ``η·K_eff·g`` in ``K``
    steps, so dividing ``x - y`` by ``K_eff·η`` recovers the mean corrected gradient. ``ρ = 0`` gives ``K``.
    """
    if momentum == 0.0:
        return float(num_steps)
    rho = momentum
    return (num_steps - rho * (1.0 - rho**num_steps) / (1.0 - rho)) / (1.0 - rho)


@dataclass
class _ScaffoldClient:
    """SCAFFOLD's scratch for one client's round (``ctx.state``).

    ``params``: the client's trainable parameters (the live tensors of the local model, read at the end
    as ``y``); ``correction``: ``c - c_i`` for each; ``steps``: the steps taken so far. The batched
    engine keeps the round's corrections stacked ``[m, *shape]`` in ``correction_stack`` of its first client.
    """

    params: list[torch.Tensor]
    correction: list[torch.Tensor]
    steps: int = 0
    correction_stack: list[torch.Tensor] | None = None


@register
class Scaffold(Algorithm):
    """SCAFFOLD, option II control variates, server step size 1.

    State: the server's ``c`` and every client's ``c_i`` (trainable parameters only, zero at the
    start; a client that never took part has ``c_i = 0`` and is not stored). Each local gradient
    becomes ``g - c_i + c`` before the SGD step (momentum and weight decay are then applied by SGD,
    as in the FedDr+ reference code). After ``K`` steps at lr ``η``: ``c_i⁺ = c_i - c + (x - y)/(K_eff·η)``; the client
    uploads ``Δc_i = c_i⁺ - c_i``; the server sets ``x`` to the weighted average and ``c ← c + (1/N)Σ Δc_i``.

    ``Config.scaffold_zero_head_grad`` (default off: plain SCAFFOLD) reproduces the FedDr+ reference
    code, which zeroes the loss gradient of the head's weight (not its bias) before adding the
    correction, so the head weight moves only by ``c - c_i`` and weight decay: the paper's SCAFFOLD
    numbers were made that way (docs/fidelity.md).
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
        ctx.state = _ScaffoldClient([params[n] for n in self.names], [self.c[n] - c_i[n] for n in self.names])

    def before_step(self, model: Net, ctx: ClientContext) -> None:
        for n, p, corr in zip(self.names, ctx.state.params, ctx.state.correction):
            if p.grad is None:  # a parameter the loss did not reach still gets the correction
                p.grad = corr.clone()
                continue
            if self.zero_head_grad and n == "head.weight":
                p.grad.zero_()
            p.grad.add_(corr)
        ctx.state.steps += 1

    @torch.no_grad()
    def before_step_batched(self, grads, ctxs, active) -> None:
        first = ctxs[0].state  # the corrections c - c_i are stacked once per round
        if first.correction_stack is None:
            first.correction_stack = [torch.stack([c.state.correction[j] for c in ctxs]) for j in range(len(self.names))]
        for n, corr in zip(self.names, first.correction_stack):
            if self.zero_head_grad and n == "head.weight":
                grads[n].zero_()
            grads[n].add_(corr)
        for c, a in zip(ctxs, active):
            c.state.steps += int(a)

    @torch.no_grad()
    def client_end(self, model: Net, ctx: ClientContext) -> dict:
        c_i = self.client_variate(ctx.client)
        steps = ctx.state.steps
        if steps == 0:
            return {"delta_c": {n: torch.zeros_like(v) for n, v in c_i.items()}}
        scale = 1.0 / (effective_steps(steps, self.cfg.momentum) * ctx.lr)
        new, delta = {}, {}
        for n, y in zip(self.names, ctx.state.params):
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
    """FedNTD: ``CE + β_ntd·L_NTD`` with the round's global model as teacher.

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
    """FedExP's server step ``η_g = max(1, 0.5·A / (‖Δ̄‖² + |S|·ε))`` (the form of FedExP's official code).

    ``mean_sq_norm`` is ``A = Σ p_i ‖Δ_i‖²``, ``sq_norm_of_mean`` is ``‖Σ p_i Δ_i‖²``, ``num_clients``
    is ``|S|``. When every update is zero and ``ε = 0`` the step is 1.
    """
    denominator = sq_norm_of_mean + num_clients * eps
    if denominator <= 0.0:
        return 1.0
    return max(1.0, 0.5 * mean_sq_norm / denominator)


def fedexp_reference_server_lr(mean_norm: float, norm_of_mean: float, total_clients: int, eps: float) -> float:
    """The FedDr+ reference code's FedExP step ``η_g = min(1, 0.5·mean_i‖Δ_i‖ / (‖Δ̄‖ + M·ε))``.

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
    """FedExP: FedAvg clients, an extrapolated server step, and the last two iterates averaged for reporting.

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
    methods, as in the FedDr+ reference code. ``eta_g`` holds the step of every round so far.
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
    """SphereFed: normalized features, a fixed orthonormal head, MSE to one-hot on ``z = W·ĥ``.

    With ``Config.spherefed_calibration`` the reported head is replaced after the last round by the
    ridge solution ``W*ᵀ = (Σ_k G_k + λI)⁻¹ Σ_k B_k`` with ``G_k = Σ ĥĥᵀ`` ``[d, d]`` and ``B_k = Σ ĥ e_yᵀ``
    ``[d, C]`` over every client's (un-augmented) training images; ``λ = calibration_ridge · tr(G)/d``,
    i.e. 0.1 % of G's mean eigenvalue (SphereFed's paper leaves λ open). Training itself never sees ``W*``.
    """

    name = "spherefed"
    head = "orthonormal"
    head_bias = False
    normalize_features = True
    default_lr = {"cnn_bn": 30.0, "cnn": 0.1, "vgg11": 0.55, "mobilenet": 6.5}  # cnn, cnn_bn: results/lr_grid.csv
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
    def after_training(self, model: Net, global_state, data: ImageData, partition: Partition) -> None:
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
                idx = idx[streams.eval_order(len(idx), self.cfg.seed, streams.EVAL_CALIBRATION, k).to(device)]
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
    """FedETF: projection to C dims, normalization, a fixed simplex ETF and a learned temperature.

    :meth:`adapt_model` wraps the body with a bias-free ``Linear(d, C)`` (as the FedDr+ reference code), so
    ``model.features`` returns the projected feature ``[B, C]`` and ``model.feature_dim == C``; the head becomes a
    ``[C, C]`` ETF and ``model.temperature`` a learned scalar β (init 1, averaged like any weight).
    Logits ``z = β·V·ĥ``; loss: balanced softmax ``CE(z + log n_c, y)`` with the client's train counts,
    zero counts clamped to 1 (as FedETF's own code).
    """

    name = "fedetf"
    head = "etf"
    head_bias = False
    normalize_features = True
    default_lr = {"cnn_bn": 0.5, "cnn": 0.01, "vgg11": 0.05, "mobilenet": 0.5}  # cnn, cnn_bn: results/lr_grid.csv
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

    # FedETF's own personalization, which feddr_kit.personalize.finetune runs with protocol="fedetf":
    # after one ordinary local update, alternations of these phases, each training one tensor alone
    # with plain cross-entropy for this many epochs.
    personalization_epochs_per_phase: ClassVar[int] = 3

    def personalization_phases(self, model: Net) -> list[tuple[nn.Parameter, float, float, float]]:
        """FedETF's personalization phases on ``model`` (adapted), in order, as ``(parameter, lr, momentum,
        weight decay)``: the ETF ``V`` alone (lr 0.1, no momentum), then the projection alone (lr 0.05,
        momentum 0.9, weight decay 5e-4)."""
        return [(model.head.weight, 0.1, 0.0, 0.0), (model.body.projection.weight, 0.05, 0.9, 5e-4)]
