"""What every federated method is made of: :class:`Algorithm` and the registry (with :class:`Batch` and
:class:`ClientContext`, the types its hooks receive, defined with the local training that builds them).

An :class:`Algorithm` says only what differs between methods; the shared round loop
(:mod:`feddr_kit.federated`, :mod:`feddr_kit.local`, :mod:`feddr_kit.engine`) owns everything else.
Its members come in groups, by who asks:

* declarations (class attributes): the head and whether it is frozen, feature normalization, the
  default regularizer and learning rates, and :attr:`~Algorithm.uploads`;
* capabilities, the questions other modules ask instead of comparing names or methods:
  :attr:`~Algorithm.head_frozen`, :attr:`~Algorithm.geometric_head`, :attr:`~Algorithm.needs_teacher`,
  :meth:`~Algorithm.batched_refusal`;
* the model and the loss: :meth:`~Algorithm.adapt_model`, :meth:`~Algorithm.setup`,
  :meth:`~Algorithm.logits`, :meth:`~Algorithm.task_loss`, :meth:`~Algorithm.regularizer_loss`,
  :meth:`~Algorithm.loss_terms`, :meth:`~Algorithm.loss`;
* local training (called by the loop around each client and step): :meth:`~Algorithm.num_local_steps`,
  :meth:`~Algorithm.client_start`, :meth:`~Algorithm.before_step` and the batched engine's form of it,
  :meth:`~Algorithm.before_step_batched`, :meth:`~Algorithm.client_end`;
* the server: :meth:`~Algorithm.server_update`, :meth:`~Algorithm.finalize_global`,
  :meth:`~Algorithm.eval_state`, :meth:`~Algorithm.after_training`, :meth:`~Algorithm.personalized_metrics`;
* one algorithm split between a server and its clients (Flower): :meth:`~Algorithm.broadcast`,
  :meth:`~Algorithm.receive_broadcast`, :meth:`~Algorithm.client_state`, :meth:`~Algorithm.set_client_state`;
* checkpointing: :meth:`~Algorithm.state_dict`, :meth:`~Algorithm.load_state_dict`.

Register a new method with :func:`register`; the families register on import of :mod:`feddr_kit.methods`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F

from .. import heads, losses
from ..errors import FeddrKitError
from ..local import Batch, ClientContext  # noqa: F401  (re-exported: the types every hook receives)
from ..models import Net

if TYPE_CHECKING:  # annotations only: these modules sit above this one
    from ..config import Config
    from ..data import ImageData
    from ..partition import Partition

HEAD_KINDS = ("learned", "random_frozen", "etf", "orthonormal")
GEOMETRIC_HEADS = ("etf", "orthonormal")  # fixed by their geometry: no bias, frozen even when fine-tuning
REGULARIZERS_WITH_TEACHER = ("fd", "kd", "ntd", "ld")  # read the round's global model on every batch


class Algorithm:
    """Base class: FedAvg's behaviour, which every method overrides only where it differs."""

    name: ClassVar[str] = ""
    head: ClassVar[str] = "learned"  # one of HEAD_KINDS
    # Whether the head has a bias, as in the reference code: the cross-entropy methods do (FedBABU's is
    # frozen with its head); the fixed geometric heads (etf, orthonormal) do not.
    head_bias: ClassVar[bool] = True
    normalize_features: ClassVar[bool] = False  # logits = head(ĥ) instead of head(h)
    default_regularizer: ClassVar[str] = "none"
    # Default initial lr per model: at the teaching scale FedAvg, DR, FedDr+, FedETF and SphereFed each by its
    # own grid in results/lr_grid.csv, the other cross-entropy methods FedAvg's (the authors' code gives them one
    # lr); vgg11 / mobilenet from the reference code's configs.
    default_lr: ClassVar[dict[str, float]] = {}
    # True for methods whose local training reads and changes per-client state (the personalized ones,
    # feddr_kit/methods/personalized.py): the batched engine refuses them.
    serial_only: ClassVar[bool] = False
    personalized: ClassVar[bool] = False  # reports personalized models (history column personalized_acc)
    # The kind of each value client_end returns: "scalar" (a Python float, sent exactly as a float64)
    # or "tensors" (a dict name -> tensor, sent as arrays). On one machine one Algorithm object serves
    # the server and every client; feddr_kit.flower sends the uploads over the wire by these kinds.
    uploads: ClassVar[dict[str, str]] = {}

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.regularizer = self.regularizer_for(cfg.regularizer)
        self.fixed_head: torch.Tensor | None = None
        self.fixed_bias: torch.Tensor | None = None
        self.trainable_names: list[str] | None = None  # set by setup(): the parameters the optimizer moves

    # ------------------------------------------------------------------ settings from the config
    @classmethod
    def regularizer_for(cls, regularizer: str | None) -> str:
        """The regularizer a run of this algorithm uses: ``regularizer``, or when None its own
        :attr:`default_regularizer` (``"fd"`` for FedDr+, ``"none"`` for the others)."""
        return cls.default_regularizer if regularizer is None else regularizer

    def initial_lr(self, model_name: str) -> float:
        """The default initial lr for ``model_name`` (:attr:`default_lr`); an error when there is none."""
        if model_name not in self.default_lr:
            raise FeddrKitError(f"lr must be given for algorithm {self.name!r} with model {model_name!r} (no default)")
        return self.default_lr[model_name]

    @property
    def lr0(self) -> float:
        """The initial lr of the run's schedule: ``cfg.lr``, or when None :meth:`initial_lr` of ``cfg.model``."""
        return self.cfg.lr if self.cfg.lr is not None else self.initial_lr(self.cfg.model)

    # ------------------------------------------------------------------ capabilities
    @property
    def head_frozen(self) -> bool:
        """True when the head is not trained during federated training (every head but a learned one)."""
        return self.head != "learned"

    @property
    def geometric_head(self) -> bool:
        """True for a head fixed by its geometry (simplex ETF, orthonormal): it stays frozen even when a
        finished model is fine-tuned, where a learned head or FedBABU's random one is trained."""
        return self.head in GEOMETRIC_HEADS

    @property
    def needs_teacher(self) -> bool:
        """True when the loss needs the global model's features/logits on each batch."""
        return self.regularizer in REGULARIZERS_WITH_TEACHER

    def batched_refusal(self) -> str | None:
        """Why the batched engine cannot train this algorithm's clients, or None when it can."""
        if self.serial_only:
            return (f"algorithm {self.name!r} keeps per-client state that its local training reads and changes "
                    "(a personalized method), which only engine='serial' runs")
        if _overrides(self, "before_step") and not _overrides(self, "before_step_batched"):
            return f"algorithm {self.name!r} overrides before_step but not before_step_batched; add it or use engine='serial'"
        return None

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

    # ------------------------------------------------------------------ forward and loss
    def logits(self, model: Net, h: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, C]`` from raw features ``h`` ``[B, d]`` (cast to the head's dtype, e.g. float32
        features of a float64 model from ``forward_all``)."""
        h = h.to(model.head.weight.dtype)
        if self.normalize_features:
            h = F.normalize(h, dim=1, eps=1e-12)
        return model.head(h)

    def task_loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        """The method's own local loss (FedAvg: cross-entropy)."""
        return losses.cross_entropy(b.z, b.y)

    def regularizer_loss(self, model: Net, b: Batch, ctx: ClientContext) -> torch.Tensor:
        """The regularizer's term on this batch: feature distillation (``fd``), distillation of the
        logits at temperature ``cfg.tau`` (``kd``) or of the not-true logits (``ntd``), logit
        distillation (``ld``), or the proximal term ``(mu/2)·‖θ - θ_g‖²`` (``prox``)."""
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

        In the batched engine this runs under ``torch.func.vmap``, once per step for all clients, with
        :meth:`ClientContext.vmapped`: ``model``'s parameters and ``ctx.class_counts`` are then the
        client's own, ``ctx.global_state``, ``ctx.round`` and ``ctx.lr`` are shared,
        ``ctx.client``/``num_samples``/``num_steps`` are -1 and ``ctx.state`` is None. A loss must not
        read those, nor ``requires_grad``, nor convert tensors to Python numbers.
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

    # ------------------------------------------------------------------ local training (no-ops by default)
    def num_local_steps(self, steps: int) -> int:
        """Local steps of a client given the kit's rule's ``steps`` (:func:`feddr_kit.local.local_steps`);
        default: the same. FedRep adds its head epochs, Per-FedAvg rounds up to whole step pairs."""
        return steps

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
        that overrides :meth:`before_step` must override this too, or the batched engine refuses it
        (:meth:`batched_refusal`).
        """

    def client_end(self, model: Net, ctx: ClientContext) -> dict:
        """Called after local training; returns extra values to upload to the server, each of the kind
        :attr:`uploads` declares for its key."""
        return {}

    # ------------------------------------------------------------------ the server
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

    def after_training(self, model: Net, global_state: dict[str, torch.Tensor], data: ImageData,
                       partition: Partition) -> None:
        """Called once after the last round's aggregation, before its evaluation (SphereFed calibration).

        ``model`` is a scratch model of the right architecture that may be overwritten. Whatever
        changes the reported model must go through :meth:`eval_state` and :meth:`state_dict`.
        """

    def personalized_metrics(self, model: Net, global_state: dict[str, torch.Tensor], evaluator, round: int,
                             lr: float) -> dict[str, float]:
        """Extra history columns of an evaluated round (the personalized methods' ``personalized_acc``);
        default none. ``model`` is a scratch model that may be overwritten; ``evaluator`` is the run's
        :class:`feddr_kit.evaluation.Evaluator` (its ``partition`` and ``data``); ``lr`` the round's lr."""
        return {}

    # ------------------------------------------------------------------ one algorithm split between a server and its clients
    # On one machine these are not needed (one Algorithm object serves the server and every client);
    # feddr_kit.flower uses them to give each client what it would have read from the shared object.
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


def _overrides(algo: Algorithm, method: str) -> bool:
    """Whether ``algo``'s class replaces the base class's ``method``."""
    return getattr(type(algo), method) is not getattr(Algorithm, method)


class CrossEntropyOf(Algorithm):
    """Plain cross-entropy on another algorithm's logits: no regularizer, no hooks, no teacher.

    The loss of the steps some methods take besides their own local training, run by the shared
    :func:`feddr_kit.local.local_step`: Ditto's personal model, Per-FedAvg's adaptation before
    evaluation, FedETF's personalization phases.
    """

    def __init__(self, algo: Algorithm):
        super().__init__(algo.cfg)
        self.of = algo
        self.regularizer = "none"

    def logits(self, model: Net, h: torch.Tensor) -> torch.Tensor:
        return self.of.logits(model, h)


# --------------------------------------------------------------------------- the registry
ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator adding an algorithm to :data:`ALGORITHMS` under ``cls.name``."""
    if cls.head not in HEAD_KINDS:
        raise FeddrKitError(f"head must be one of {', '.join(HEAD_KINDS)}, got {cls.head!r}")
    if cls.head_bias and cls.head in GEOMETRIC_HEADS:
        raise FeddrKitError(f"head_bias must be False for a fixed geometric head ({cls.head!r}), in {cls.__name__}")
    ALGORITHMS[cls.name] = cls
    return cls


def get_algorithm(cfg: Config) -> Algorithm:
    """Instantiate the algorithm ``cfg.algorithm``."""
    if cfg.algorithm not in ALGORITHMS:
        raise FeddrKitError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {cfg.algorithm!r}")
    return ALGORITHMS[cfg.algorithm](cfg)


def algorithm_names(personalized: bool = False) -> list[str]:
    """Registered algorithm names, in registration order: the global-model (GFL) methods, or with
    ``personalized=True`` the personalized ones (feddr_kit/methods/personalized.py: fedper, fedrep,
    perfedavg, ditto)."""
    return [n for n, cls in ALGORITHMS.items() if cls.personalized == personalized]


def initial_lr(cfg: Config) -> float:
    """The initial lr ``lr0`` of ``cfg``'s schedule: ``cfg.lr``, or when None the algorithm's default for
    the model (:attr:`Algorithm.default_lr`: its own grid in ``results/lr_grid.py``, or FedAvg's)."""
    return get_algorithm(cfg).lr0


def resolve_regularizer(cfg: Config) -> Config:
    """``cfg`` with ``regularizer=None`` replaced by the one its algorithm uses (:meth:`Algorithm.regularizer_for`):
    what a run records, so that its config and summary name the regularizer that was used."""
    if cfg.regularizer is not None:
        return cfg
    return cfg.replace(regularizer=ALGORITHMS[cfg.algorithm].regularizer_for(None))
