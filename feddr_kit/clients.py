"""Who holds what: the dataset and partition a config asks for, and each client's share on the device.

:func:`data_and_partition` turns a config into data and a partition (:func:`load_data`,
:func:`make_partition`), or checks the ones the caller passes (:func:`check_partition`). :class:`Clients` is what local training reads of a
partition: every client's training indices, its label histogram and the mean client size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from . import partition as partition_mod
from .data import ImageData, load
from .errors import FeddrKitError
from .partition import Partition

if TYPE_CHECKING:  # annotations only: the config module sits above this one
    from .config import Config


def data_and_partition(cfg: Config, device: torch.device, data: ImageData | None = None,
                       partition: Partition | None = None) -> tuple[ImageData, Partition]:
    """The config's data on ``device`` and its partition: ``data`` / ``partition`` when given (checked
    against ``cfg``), else loaded (:func:`load_data`) and drawn (:func:`make_partition`)."""
    data = (data or load_data(cfg)).to(device)
    part = partition if partition is not None else make_partition(cfg, data)
    check_partition(part, data, cfg)
    return data, part


def load_data(cfg: Config) -> ImageData:
    """Load the config's dataset (``data_path`` for image folders)."""
    if cfg.dataset == "imagefolder":
        return load("imagefolder", path=cfg.data_path)
    return load(cfg.dataset)


def make_partition(cfg: Config, data: ImageData) -> Partition:
    """The partition the config asks for, over ``data``'s train and test labels."""
    seed = cfg.seed if cfg.partition_seed is None else cfg.partition_seed
    y, ty = data.train_y.cpu(), data.test_y.cpu()
    if cfg.partition == "shard":
        return partition_mod.shard(y, ty, cfg.num_clients, cfg.shards_per_client, seed=seed)
    if cfg.partition == "dirichlet":
        return partition_mod.dirichlet(y, ty, cfg.num_clients, cfg.alpha, seed=seed)
    if cfg.partition == "reference":
        return partition_mod.reference(cfg.reference_partition, y, ty, seed=seed)
    return partition_mod.iid(y, ty, cfg.num_clients, seed=seed)


def check_partition(part: Partition, data: ImageData, cfg: Config) -> None:
    """Raise :class:`FeddrKitError` unless ``part`` has ``cfg.num_clients`` clients and indexes into ``data``."""
    if part.num_clients != cfg.num_clients:
        raise FeddrKitError(f"partition has {part.num_clients} clients but num_clients={cfg.num_clients}")
    for split, indices, n in (("train", part.train_indices, len(data.train_y)), ("test", part.test_indices, len(data.test_y))):
        top = max((int(t.max()) for t in indices if len(t)), default=-1)
        if top >= n:
            raise FeddrKitError(f"partition: its {split} indices reach {top} but the data has {n} {split} images; "
                                "make the partition from this data's labels")


@dataclass
class Clients:
    """The clients' training data as local training reads it.

    ``indices[k]``: client ``k``'s train indices (int64 ``[n_k]``, on the device); ``counts``: every
    client's train label histogram (float32 ``[K, C]``, on the device); ``mean_size``: ``N // K``, the
    mean client size of the Dirichlet step rule (:func:`feddr_kit.local.local_steps`).
    """

    indices: list[torch.Tensor]
    counts: torch.Tensor
    mean_size: int

    @classmethod
    def of(cls, data: ImageData, part: Partition, device: torch.device) -> "Clients":
        """The clients of ``part`` over ``data``, on ``device``."""
        return cls([torch.from_numpy(np.asarray(t, dtype=np.int64)).to(device) for t in part.train_indices],
                   torch.from_numpy(part.counts("train")).float().to(device),
                   len(data.train_y) // part.num_clients)

    def size(self, client: int) -> int:
        """Number of training images of ``client``."""
        return len(self.indices[client])
