"""Personalized FL methods as algorithms on the shared round loop: FedPer, FedRep,
Per-FedAvg (first-order, as implemented) and Ditto.

Each keeps what is personal in the algorithm object, keyed by client id: FedPer's and FedRep's
local heads, Ditto's personal models. :meth:`PersonalizedAlgorithm.client_state` /
:meth:`~PersonalizedAlgorithm.set_client_state` read and write one client's state (a dict of
tensors), and :meth:`~PersonalizedAlgorithm.state_dict` checkpoints all of it, so a resumed run
continues bit for bit. A client that never took part has its method's initial state (FedPer/FedRep:
the common initial head; Ditto: the initial global model).

At every evaluated round each method evaluates every client's personalized model on that client's
own test set (the partition's local test set) and adds ``personalized_acc`` (mean over all clients) and
``personalized_acc_seen`` (mean over the clients that have trained at least once) to the history.
They run in the serial engine only.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..clients import Clients
from ..local import ClientContext, client_context, client_optimizer, local_step, train_client
from ..models import Net
from ..streams import PERSONALIZED_EVAL_ROUND
from .base import Algorithm, CrossEntropyOf, register
from .global_fl import _CE_LR

HEAD_KEYS = ("head.weight", "head.bias")


class PersonalizedAlgorithm(Algorithm):
    """Base of the personalized methods: per-client state, its checkpoint, and the personalized evaluation.

    Subclasses say what a client's state is (:meth:`initial_client_state`) and which model a client
    is evaluated with (:meth:`personal_model_state`).
    """

    personalized = True
    serial_only = True
    default_lr = _CE_LR

    def __init__(self, cfg):
        super().__init__(cfg)
        self.clients: dict[int, dict[str, torch.Tensor]] = {}  # per-client persistent state
        self.visited: set[int] = set()  # clients that have trained at least once
        self.client_acc: list[float] = []  # personalized accuracy of every client at the last evaluation
        self.device = torch.device("cpu")

    def setup(self, model: Net, seed: int) -> None:
        super().setup(model, seed)
        self.device = model.head.weight.device

    # ------------------------------------------------------------------ per-client state
    def initial_client_state(self) -> dict[str, torch.Tensor]:
        """The state of a client that has not trained yet; default: none."""
        return {}

    def client_state(self, client: int) -> dict[str, torch.Tensor]:
        """Client ``client``'s persistent state: name → tensor (a copy of the initial one if it never trained)."""
        if client in self.clients:
            return self.clients[client]
        return {n: v.clone() for n, v in self.initial_client_state().items()}

    def set_client_state(self, client: int, state: dict[str, torch.Tensor]) -> None:
        """Store ``state`` (name → tensor, copied) as client ``client``'s persistent state."""
        self.clients[int(client)] = {n: v.detach().to(self.device).clone() for n, v in state.items()}

    def personal_model_state(self, client: int, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The full model state client ``client`` is evaluated with (default: the global one)."""
        return global_state

    def client_end(self, model: Net, ctx: ClientContext) -> dict:
        self.visited.add(int(ctx.client))
        return {}

    # ------------------------------------------------------------------ evaluation
    def client_accuracies(self, model: Net, global_state, evaluator, round: int, lr: float) -> list[float]:
        """Accuracy of every client's personalized model on its own test set: a list of ``K`` floats."""
        accs = []
        for k in range(evaluator.num_clients):
            model.load_state_dict(self.personal_model_state(k, global_state))
            accs.append(evaluator.client_accuracy(model, self, k))
        return accs

    def personalized_metrics(self, model, global_state, evaluator, round, lr) -> dict[str, float]:
        self.client_acc = self.client_accuracies(model, global_state, evaluator, round, lr)
        seen = [a for k, a in enumerate(self.client_acc) if k in self.visited]
        return {"personalized_acc": float(np.mean(self.client_acc)),
                "personalized_acc_seen": float(np.mean(seen)) if seen else math.nan}

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        return {"clients": {k: {n: v.cpu() for n, v in s.items()} for k, s in self.clients.items()},
                "visited": sorted(self.visited), "client_acc": list(self.client_acc)}

    def load_state_dict(self, state: dict) -> None:
        self.clients = {int(k): {n: v.to(self.device) for n, v in s.items()} for k, s in state["clients"].items()}
        self.visited = {int(k) for k in state["visited"]}
        self.client_acc = list(state["client_acc"])


@register
class FedPer(PersonalizedAlgorithm):
    """FedPer: every client trains all layers with CE from the global body and its own persistent head;
    the server averages the body only, the heads never leave the clients.

    Personalized model of client k: the global body with k's head.
    """

    name = "fedper"

    def setup(self, model: Net, seed: int) -> None:
        super().setup(model, seed)
        state = model.state_dict()
        self.head_keys = [n for n in HEAD_KEYS if n in state]
        self.initial_head = {n: state[n].detach().clone() for n in self.head_keys}

    def initial_client_state(self) -> dict[str, torch.Tensor]:
        return self.initial_head

    def client_start(self, model: Net, ctx: ClientContext) -> None:
        with torch.no_grad():
            for n, v in self.client_state(ctx.client).items():
                model.get_parameter(n).copy_(v)

    def client_end(self, model: Net, ctx: ClientContext) -> dict:
        self.set_client_state(ctx.client, {n: model.get_parameter(n) for n in self.head_keys})
        return super().client_end(model, ctx)

    def server_update(self, global_state, average, uploads, weights, round):
        # The body is averaged; the global head stays the common initial one (heads are never aggregated).
        return {**average, **{n: global_state[n] for n in self.head_keys}}

    def personal_model_state(self, client, global_state):
        return {**global_state, **self.client_state(client)}


@dataclass
class _FedRepClient:
    """FedRep's scratch for one client's round (``ctx.state``): its head-only steps and the steps taken."""

    head_steps: int
    steps: int = 0


@register
class FedRep(FedPer):
    """FedRep: with its own head loaded, a client first trains the head only for
    ``Config.fedrep_head_epochs`` epochs (body frozen), then the body only for ``local_epochs`` epochs
    (head frozen); the server averages the body, heads persist.

    Frozen parts take no step at all (no gradient, so no weight decay nor momentum either), and the
    body is frozen by ``requires_grad`` during the head phase, so its backward is not computed.
    """

    name = "fedrep"

    def num_local_steps(self, steps: int) -> int:
        per_epoch = steps // self.cfg.local_epochs
        return per_epoch * (self.cfg.fedrep_head_epochs + self.cfg.local_epochs)

    def _train_only(self, model: Net, head: bool) -> None:
        for n, p in model.named_parameters():
            if n in self.trainable_names:
                p.requires_grad_((n in self.head_keys) == head)

    def client_start(self, model: Net, ctx: ClientContext) -> None:
        super().client_start(model, ctx)
        h, e = self.cfg.fedrep_head_epochs, self.cfg.local_epochs
        ctx.state = _FedRepClient(head_steps=ctx.num_steps * h // (h + e))
        self._train_only(model, head=ctx.state.head_steps > 0)

    def before_step(self, model: Net, ctx: ClientContext) -> None:
        ctx.state.steps += 1
        if ctx.state.steps == ctx.state.head_steps:  # the last head step: body next
            self._train_only(model, head=False)

    def client_end(self, model: Net, ctx: ClientContext) -> dict:
        for n, p in model.named_parameters():
            if n in self.trainable_names:
                p.requires_grad_(True)
        return super().client_end(model, ctx)


@dataclass
class _PerFedAvgClient:
    """Per-FedAvg's scratch for one client's round (``ctx.state``): its trainable parameters, the steps
    taken, and ``w`` (the parameters before the pair's first step)."""

    params: list[torch.Tensor]
    steps: int = 0
    w: list[torch.Tensor] | None = None


@register
class PerFedAvg(PersonalizedAlgorithm):
    """Per-FedAvg, first-order, as the FedBABU and FedDr+ reference code implement it.

    Local steps go in pairs of batches (D, D′): ``w̃ = w − α·∇L(w; D)`` then, from ``w`` again,
    ``w ← w − β·∇L(w̃; D′)``, with one SGD optimizer (its momentum shared by both steps). ``α`` is the
    round's lr, ``β`` is ``Config.perfedavg_beta`` (None: the run's initial lr). The server averages ``w``.
    The number of pairs per visit follows the kit's local rule, or the reference code's with
    ``Config.perfedavg_steps="reference"`` (:meth:`num_local_steps`); the reference applies no weight decay
    (``Config.weight_decay=0``).

    Personalized model of client k: from the global ``w``, one plain SGD step (cross-entropy, no
    momentum, no weight decay) at the round's lr on one batch of k's own training data (not its test
    data: the reference code's bug, see docs/fidelity.md), then k's test set.
    """

    name = "perfedavg"

    def num_local_steps(self, steps: int) -> int:
        """Whole (D, D′) pairs: the kit's ``steps`` batches (rounded up to even) or, with
        ``Config.perfedavg_steps="reference"``, the reference code's ``E·(⌊nb/E⌋+1)`` pairs, ``nb = steps/E``
        the batches of one epoch (30 batches instead of 50 at n=500, B=50, E=5)."""
        if self.cfg.perfedavg_steps == "reference":
            epochs = self.cfg.local_epochs
            return 2 * epochs * (steps // epochs // epochs + 1)
        return steps + steps % 2

    @property
    def beta(self) -> float:
        """The outer step size: ``Config.perfedavg_beta``, or when None the run's initial lr."""
        return self.cfg.perfedavg_beta if self.cfg.perfedavg_beta is not None else self.lr0

    def client_start(self, model: Net, ctx: ClientContext) -> None:
        ctx.state = _PerFedAvgClient([p for p in model.parameters() if p.requires_grad])

    @torch.no_grad()
    def before_step(self, model: Net, ctx: ClientContext) -> None:
        own = ctx.state
        inner = own.steps % 2 == 0
        if inner:  # the step to w̃ on D: remember w
            own.w = [p.detach().clone() for p in own.params]
        else:  # gradient taken at w̃ on D′: step from w
            for p, w in zip(own.params, own.w):
                p.copy_(w)
        for group in ctx.optimizer.param_groups:
            group["lr"] = ctx.lr if inner else self.beta
        own.steps += 1

    def client_accuracies(self, model, global_state, evaluator, round, lr):
        data, device = evaluator.data, evaluator.data.train_x.device
        clients = Clients.of(data, evaluator.partition, device)
        adapt, plain = CrossEntropyOf(self), self.cfg.replace(momentum=0.0, weight_decay=0.0)
        accs = []
        for k in range(evaluator.num_clients):
            model.load_state_dict(global_state)
            ctx = client_context(adapt, plain, clients, k, PERSONALIZED_EVAL_ROUND + round, lr, global_state, num_steps=1)
            train_client(model, None, adapt, data, clients.indices[k], ctx, plain, device)
            accs.append(evaluator.client_accuracy(model, self, k))
        return accs


@dataclass
class _DittoClient:
    """Ditto's scratch for one client's round (``ctx.state``): the SGD optimizer of the personal model
    ``v`` and the context its steps run in (the client's, without the instruments)."""

    opt: torch.optim.Optimizer
    personal_ctx: ClientContext


@register
class Ditto(PersonalizedAlgorithm):
    """Ditto: the global model by FedAvg, plus a persistent personal model ``v_k`` per client, never
    aggregated, trained on the same local batches as the client's copy of ``w``::

        v ← v − η·∇F_k(v)              (SGD with the run's momentum and weight decay)
        v ← v − η·λ·(v_prev − w^t)     (v_prev: v before the step, w^t: the round-start global)

    ``λ = Config.ditto_lambda``. Personalized model of client k: ``v_k``; a client that never trained
    has the initial global model.
    """

    name = "ditto"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.personal_loss = CrossEntropyOf(self)  # v's own step: plain cross-entropy, no regularizer

    def setup(self, model: Net, seed: int) -> None:
        super().setup(model, seed)
        self.initial = {n: v.detach().clone() for n, v in model.state_dict().items()}
        self.personal = copy.deepcopy(model)  # the scratch model v is trained in

    def initial_client_state(self) -> dict[str, torch.Tensor]:
        return self.initial

    def client_start(self, model: Net, ctx: ClientContext) -> None:
        self.personal.load_state_dict(self.client_state(ctx.client))
        self.personal.train()
        params = dict(self.personal.named_parameters())
        opt = client_optimizer([params[n] for n in self.trainable_names], ctx.lr, self.cfg)
        ctx.state = _DittoClient(opt, dataclasses.replace(ctx, gradients=None))

    def before_step(self, model: Net, ctx: ClientContext) -> None:
        x, y = ctx.batch  # v steps on the batch the client's copy of w has just taken its gradient on
        params = dict(self.personal.named_parameters())
        prev = [params[n].detach().clone() for n in self.trainable_names]
        local_step(self.personal, None, self.personal_loss, ctx.state.opt, x, y, ctx.state.personal_ctx)
        with torch.no_grad():
            for n, p_prev in zip(self.trainable_names, prev):
                params[n].sub_(ctx.lr * self.cfg.ditto_lambda * (p_prev - ctx.global_state[n]))

    def client_end(self, model: Net, ctx: ClientContext) -> dict:
        self.set_client_state(ctx.client, self.personal.state_dict())
        return super().client_end(model, ctx)

    def personal_model_state(self, client, global_state):
        return self.client_state(client)
