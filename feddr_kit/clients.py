"""Who holds what: the dataset and partition a config asks for, and each client's share on the device.

:func:`data_and_partition` turns a config into data and a partition (:func:`load_data`,
:func:`make_partition`), or checks the ones the caller passes (:func:`check_partition`). :class:`Clients` is what local training reads of a
partition: every client's training indices, its label histogram and the mean client size.
:func:`fingerprint` sums up data and partition, so that a resume can tell that they changed.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


def fingerprint(data: ImageData, part: Partition) -> dict[str, Any]:
    """What a checkpoint records of the data and partition it was trained on: the image shape, the train
    and test set sizes and label counts, and SHA-256 digests of the labels in order and of every client's
    train and test indices. Cheap (no pixels are read) and equal on every device; a resume compares it
    (:func:`fingerprint_changes`)."""
    def digest(arrays) -> str:
        h = hashlib.sha256()
        for a in arrays:
            a = np.ascontiguousarray(np.asarray(a, dtype=np.int64))
            h.update(len(a).to_bytes(8, "little"))  # lengths too, so that [1,2][3] differs from [1][2,3]
            h.update(a.tobytes())
        return h.hexdigest()[:16]

    train_y, test_y = part.train_labels, part.test_labels
    return {
        "image_shape": [int(v) for v in data.image_shape],
        "train_size": int(len(train_y)),
        "test_size": int(len(test_y)),
        "train_label_counts": np.bincount(train_y, minlength=part.num_classes).tolist(),
        "test_label_counts": np.bincount(test_y, minlength=part.num_classes).tolist(),
        "labels_sha256": digest([train_y, test_y]),
        "num_clients": int(part.num_clients),
        "partition_sha256": digest([*part.train_indices, *part.test_indices]),
    }


# How each entry of a fingerprint reads in a message.
_FINGERPRINT_WORDS = {"image_shape": "image shape", "train_size": "train set size", "test_size": "test set size",
                      "train_label_counts": "train label counts", "test_label_counts": "test label counts",
                      "labels_sha256": "labels (their order)", "num_clients": "number of clients",
                      "partition_sha256": "partition (the clients' indices)"}


def fingerprint_changes(saved: dict, now: dict) -> list[str]:
    """The entries of two :func:`fingerprint` s that differ, in words (``"train set size 50000 -> 50030"``);
    empty when they agree. Entries missing from ``saved`` (an older checkpoint) are not compared."""
    out = []
    for key, words in _FINGERPRINT_WORDS.items():
        if key not in saved or saved[key] == now.get(key):
            continue
        old, new = saved[key], now.get(key)
        if key.endswith("label_counts") and isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
            classes = [str(c) for c, (a, b) in enumerate(zip(old, new)) if a != b]
            out.append(f"{words} of class(es) {', '.join(classes[:5])}{' …' if len(classes) > 5 else ''}")
        elif key.endswith("sha256") or key.endswith("counts"):
            out.append(words)
        else:
            out.append(f"{words} {old} -> {new}")
    return out


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
        try:
            return partition_mod.dirichlet(y, ty, cfg.num_clients, cfg.alpha, seed=seed)
        except FeddrKitError as err:  # speak of the config's fields, which are what a command-line user can set
            least = partition_mod.DIRICHLET_MIN_SIZE
            if str(err).startswith("min_size:"):
                raise FeddrKitError(f"num_clients: a Dirichlet partition gives every client at least {least} train "
                                    f"images, more than the {len(y)} there are for {cfg.num_clients} clients; use "
                                    "fewer clients") from None
            if str(err).startswith("max_tries:"):
                raise FeddrKitError(f"alpha: no Dirichlet draw in {partition_mod.DIRICHLET_MAX_TRIES} tries gave every "
                                    f"client at least {least} train images at alpha={cfg.alpha}; use a larger alpha "
                                    "or fewer clients (num_clients)") from None
            raise
    if cfg.partition == "reference":
        try:
            return partition_mod.reference(cfg.reference_partition, y, ty, seed=seed)
        except FeddrKitError as err:
            raise FeddrKitError(str(err).replace("path_or_name: ", "reference_partition: ", 1)) from None
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
