"""The one seeded build of a run: its data and partition, algorithm, model and teacher, initial global
state, initial lr and regularizer, decided once for :func:`feddr_kit.run`, the Flower apps,
fine-tuning and local-only training alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import engine as engine_mod
from . import local
from .clients import Clients, data_and_partition
from .config import Config
from .data import ImageData
from .local import ClientContext, build_teacher
from .methods import Algorithm, get_algorithm, resolve_regularizer
from .models import Net, build_model
from .partition import Partition


@dataclass
class Run:
    """What a run builds before round 0, the same for :func:`feddr_kit.run` and for the Flower apps, so both start
    from the same bits.

    ``cfg`` with its regularizer decided (:func:`feddr_kit.methods.resolve_regularizer`) and its layout
    (``channels_last`` True or False: :func:`feddr_kit.engine.resolve_layout`), as the run records it; ``lr0`` the
    schedule's initial lr (:attr:`Algorithm.lr0`); ``model`` the one reusable local model (built right
    after ``torch.manual_seed(cfg.seed)``, the head installed by ``algo.setup``); ``teacher`` a second
    model of the same architecture that holds the round's global model when the algorithm needs it;
    ``initial_state`` the global state before round 0 (detached copies); ``clients`` the clients' train
    indices and label counts on the device.
    """

    cfg: Config
    device: torch.device
    engine: str
    data: ImageData
    partition: Partition
    algo: Algorithm
    model: Net
    teacher: Net
    lr0: float
    initial_state: dict[str, torch.Tensor]
    clients: Clients

    def context(self, client: int, round: int, lr: float, global_state: dict[str, torch.Tensor],
                measure: bool = False) -> ClientContext:
        """The :class:`ClientContext` of ``client`` in round ``round`` (:func:`feddr_kit.local.client_context`)."""
        return local.client_context(self.algo, self.cfg, self.clients, client, round, lr, global_state, measure=measure)

    def renew_algorithm(self) -> Algorithm:
        """Replace ``algo`` by a fresh one of the config, set up on ``model`` (so no state of another client is
        held: a Flower client trains with one per message); returns it."""
        self.algo = get_algorithm(self.cfg)
        self.algo.setup(self.model, self.cfg.seed)
        return self.algo


RunSetup = Run  # the name the Flower module and chapter 09 knew it by


def build_algorithm(cfg: Config, data: ImageData, device: torch.device) -> tuple[Algorithm, Net]:
    """The seeded build: ``torch.manual_seed(cfg.seed)``, the algorithm of ``cfg``, its model for ``data``'s
    classes and image size on ``device``, set up by the algorithm (head installed and frozen). Every run,
    fine-tuning and local-only baseline of one seed starts from these weights."""
    torch.manual_seed(cfg.seed)
    algo = get_algorithm(cfg)
    model = build_model(cfg.model, data.num_classes, head_bias=algo.head_bias, image_size=data.image_shape[1:]).to(device)
    algo.setup(model, cfg.seed)
    return algo, model


def build_run(cfg: Config, device: torch.device, data: ImageData | None = None,
              partition: Partition | None = None) -> Run:
    """Build a run's data, partition, algorithm, models and initial global state (see :class:`Run`).

    ``data`` / ``partition`` reuse already-loaded ones (checked against ``cfg``). ``cfg.channels_last=None``
    becomes the layout of the run's engine on ``device`` (:func:`feddr_kit.engine.resolve_layout`); a resume
    passes the checkpoint's instead (:func:`feddr_kit.federated.open_run`).
    """
    cfg = resolve_regularizer(cfg)
    engine = engine_mod.resolve_engine(cfg.engine, device)
    if cfg.channels_last is None:  # decided here, once: what engine.py, local.py and the saved config read
        cfg = cfg.replace(channels_last=engine_mod.resolve_layout(None, engine, device))
    data, part = data_and_partition(cfg, device, data, partition)
    algo, model = build_algorithm(cfg, data, device)
    teacher = build_teacher(cfg.model, data.num_classes, algo, device)
    if cfg.channels_last and engine == "serial":
        # Laid out here, once, before anything holds views of the weights: converting swaps each parameter's
        # storage, so a state_dict taken earlier (the round's live views of the local state) would go stale.
        # On the CPU the channels-last convolution and max-pooling kernels are the fast ones
        # (benchmarks/cpu_step.py); the batched engine lays out its own stacks.
        model.to(memory_format=torch.channels_last)
        teacher.to(memory_format=torch.channels_last)
    initial_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Run(cfg, device, engine, data, part, algo, model, teacher, algo.lr0, initial_state,
               Clients.of(data, part, device))


prepare = build_run  # the name the Flower tests and chapter 09 use
