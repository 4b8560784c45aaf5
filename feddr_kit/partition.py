"""Split a labelled dataset across federated clients: ``iid``, ``shard`` and ``dirichlet``.

Each partitioner returns a :class:`Partition`: per-client train indices and per-client test
indices drawn from the official test split, built exactly as the FedDr+ reference code does
(spec/algorithms.md §11):

* ``shard`` (§11.1): each class is cut, in dataset order, into ``s·K/C`` shards; a shuffled
  class list decides which classes each client gets; the test split reuses the same
  class assignment, so a client's test classes are its train classes.
* ``dirichlet`` (§11.2, the FedML variant with the N/K cap, redrawn until every client has
  ``min_size`` samples); test sets per §11.3: per class, as many test images as train
  images (truncated at what exists), sampled afresh for each client.
* ``iid``: shuffle and split evenly; the test split likewise.

All randomness comes from a local ``np.random.default_rng(seed)``: deterministic under a seed
and independent of the global NumPy/Python random state.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .errors import FeddrKitError


@dataclass(repr=False)
class Partition:
    """Which train and test samples each client holds.

    ``train_indices[k]`` / ``test_indices[k]`` are int64 index arrays into the train set and the
    official test set; ``train_labels`` / ``test_labels`` are the int64 labels ``[N]`` / ``[M]``.
    """

    kind: str
    params: dict
    train_indices: list[np.ndarray]
    test_indices: list[np.ndarray]
    train_labels: np.ndarray
    test_labels: np.ndarray
    num_classes: int

    @property
    def num_clients(self) -> int:
        """Number of clients K."""
        return len(self.train_indices)

    @property
    def sizes(self) -> np.ndarray:
        """Train-set size of every client, int64 ``[K]``."""
        return np.array([len(i) for i in self.train_indices], dtype=np.int64)

    def __repr__(self) -> str:
        sizes = self.sizes
        return (f"Partition({self.kind!r}, {self.params}, clients={self.num_clients}, "
                f"classes={self.num_classes}, train sizes {sizes.min()}..{sizes.max()})")

    def counts(self, split: str = "train") -> np.ndarray:
        """Samples per client and class for ``split`` ("train" or "test"): int64 ``[K, C]``."""
        if split not in ("train", "test"):
            raise FeddrKitError(f"split: must be 'train' or 'test', got {split!r}")
        labels = self.train_labels if split == "train" else self.test_labels
        indices = self.train_indices if split == "train" else self.test_indices
        return np.stack([np.bincount(labels[idx], minlength=self.num_classes)
                         for idx in indices]).astype(np.int64)

    def classes_of(self, client: int) -> np.ndarray:
        """Sorted classes present in ``client``'s train split: int64 ``[<=C]``."""
        if not _is_int(client) or not 0 <= client < self.num_clients:
            raise FeddrKitError(f"client: must be an integer in [0, {self.num_clients - 1}], "
                                f"got {client!r}")
        return np.unique(self.train_labels[self.train_indices[client]]).astype(np.int64)


# --------------------------------------------------------------------------------------
# partitioners
# --------------------------------------------------------------------------------------

def iid(train_y, test_y, num_clients: int, seed: int = 0) -> Partition:
    """Shuffle train and test indices and split each evenly (sizes differ by at most one).

    ``train_y`` ``[N]`` and ``test_y`` ``[M]``: integer labels (NumPy or torch). Returns a
    ``Partition`` of kind "iid".
    """
    train, test, num_classes = _labels_pair(train_y, test_y)
    _check_clients(num_clients, len(train), len(test))
    rng = _rng(seed)
    train_idx = np.array_split(rng.permutation(len(train)), num_clients)
    test_idx = np.array_split(rng.permutation(len(test)), num_clients)
    return Partition("iid", {"num_clients": num_clients, "seed": seed},
                     _as_int64(train_idx), _as_int64(test_idx), train, test, num_classes)


def shard(train_y, test_y, num_clients: int = 100, shards_per_client: int = 2,
          seed: int = 0) -> Partition:
    """Pathological non-IID sharding (FedAvg/FedBABU/FedNTD), per spec §11.1.

    Every class is split in dataset order into ``shards_per_client·num_clients/C`` shards;
    each client gets ``shards_per_client`` shards of classes from a shuffled class list, and
    test shards of the same classes. ``train_y`` ``[N]``, ``test_y`` ``[M]``: integer labels.
    Returns a ``Partition`` of kind "shard".
    """
    train, test, num_classes = _labels_pair(train_y, test_y)
    _check_clients(num_clients, len(train), len(test))
    s = shards_per_client
    if not _is_int(s) or not 1 <= s <= num_classes:
        raise FeddrKitError(f"shards_per_client: must be an integer in [1, {num_classes}] "
                            f"(the number of classes), got {s!r}")
    if (s * num_clients) % num_classes != 0:
        raise FeddrKitError(f"shards_per_client: shards_per_client*num_clients = "
                            f"{s * num_clients} must be divisible by the {num_classes} classes")
    shard_per_class = s * num_clients // num_classes
    if (shard_per_class * num_classes) % num_clients != 0:  # implied by the above; as [REF]
        raise FeddrKitError(f"num_clients: {shard_per_class * num_classes} shards do not divide "
                            f"among {num_clients} clients")
    _check_shardable(train, num_classes, shard_per_class, "train_y")
    _check_shardable(test, num_classes, shard_per_class, "test_y")
    rng = _rng(seed)
    rand_set_all = rng.permutation(np.repeat(np.arange(num_classes), shard_per_class))
    rand_set_all = rand_set_all.reshape(num_clients, s)
    train_idx = _assign_shards(_class_shards(train, num_classes, shard_per_class), rand_set_all, rng)
    test_idx = _assign_shards(_class_shards(test, num_classes, shard_per_class), rand_set_all, rng)
    params = {"num_clients": num_clients, "shards_per_client": s, "seed": seed}
    return Partition("shard", params, train_idx, test_idx, train, test, num_classes)


def dirichlet(train_y, test_y, num_clients: int = 100, alpha: float = 0.1, seed: int = 0,
              min_size: int = 10, max_tries: int = 1000) -> Partition:
    """Latent Dirichlet allocation of classes to clients (FedML variant), per spec §11.2–11.3.

    For each class, client shares ``p ~ Dir(alpha)``; clients already holding ``N/K`` samples
    get no more; the whole draw is repeated until every client has ``min_size`` samples (at
    most ``max_tries`` draws). A client's test set holds, per class, as many test samples as
    its train count (truncated at the available ones), drawn afresh for every client, so
    test sets overlap across clients. ``train_y`` ``[N]``, ``test_y`` ``[M]``: integer labels.
    Returns a ``Partition`` of kind "dirichlet".
    """
    train, test, num_classes = _labels_pair(train_y, test_y)
    _check_clients(num_clients, len(train), None)
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) \
            or not math.isfinite(alpha) or alpha <= 0:
        raise FeddrKitError(f"alpha: must be a finite number > 0, got {alpha!r}")
    if not _is_int(min_size) or min_size < 0:
        raise FeddrKitError(f"min_size: must be an integer >= 0, got {min_size!r}")
    if min_size * num_clients > len(train):
        raise FeddrKitError(f"min_size: {min_size} samples for each of {num_clients} clients "
                            f"needs {min_size * num_clients} > {len(train)} train samples")
    if not _is_int(max_tries) or max_tries < 1:
        raise FeddrKitError(f"max_tries: must be an integer >= 1, got {max_tries!r}")
    rng = _rng(seed)
    by_class = [np.flatnonzero(train == c) for c in range(num_classes)]
    for _ in range(max_tries):
        clients, sizes = _dirichlet_draw(by_class, len(train), num_clients, float(alpha), rng)
        if sizes.min() >= min_size:
            break
    else:
        raise FeddrKitError(f"max_tries: no draw in {max_tries} gave every client >= {min_size} "
                            f"samples; use a larger alpha, a smaller min_size or fewer clients")
    train_idx = [rng.permutation(np.concatenate(c)).astype(np.int64) for c in clients]
    test_idx = _matching_test_sets(train, test, train_idx, num_classes, rng)
    params = {"num_clients": num_clients, "alpha": alpha, "seed": seed, "min_size": min_size}
    return Partition("dirichlet", params, train_idx, test_idx, train, test, num_classes)


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def _class_shards(labels: np.ndarray, num_classes: int, shard_per_class: int) -> list[list]:
    """Per class: its indices in dataset order cut into equal shards; leftovers one each to
    shards 0..r-1 (as the reference code)."""
    shards = []
    for c in range(num_classes):
        idx = np.flatnonzero(labels == c)
        n_left = len(idx) % shard_per_class
        main, leftover = idx[:len(idx) - n_left], idx[len(idx) - n_left:]
        parts = list(main.reshape(shard_per_class, -1))
        for i, extra in enumerate(leftover):
            parts[i] = np.append(parts[i], extra)
        shards.append(parts)
    return shards


def _assign_shards(shards: list[list], rand_set_all: np.ndarray,
                   rng: np.random.Generator) -> list[np.ndarray]:
    """Client i pops a uniformly random remaining shard of each class in rand_set_all[i]."""
    out = []
    for labels in rand_set_all:
        picked = [shards[c].pop(rng.integers(len(shards[c]))) for c in labels]
        out.append(np.concatenate(picked).astype(np.int64))
    return out


def _dirichlet_draw(by_class: list[np.ndarray], n: int, num_clients: int, alpha: float,
                    rng: np.random.Generator) -> tuple[list[list[np.ndarray]], np.ndarray]:
    """One FedML-style draw: per class, Dirichlet shares masked by the N/K cap. Returns each
    client's index pieces and the client sizes."""
    clients: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    for idx_c in by_class:
        if len(idx_c) == 0:
            continue
        idx_c = rng.permutation(idx_c)
        p = rng.dirichlet(np.full(num_clients, alpha)) * (sizes < n / num_clients)
        if not p.sum() > 0:
            # Every uncapped share underflowed to 0 (tiny alpha); [REF] would divide by zero.
            # Share the class evenly among the uncapped clients instead.
            p = (sizes < n / num_clients).astype(float)
        p = p / p.sum()
        # As [REF]: cumsum(p) may end at 1 - eps, so the last client can receive one sample
        # of a class even when capped. Kept for fidelity.
        cuts = (np.cumsum(p) * len(idx_c)).astype(int)[:-1]
        for j, part in enumerate(np.split(idx_c, cuts)):
            clients[j].append(part)
            sizes[j] += len(part)
    return clients, sizes


def _matching_test_sets(train: np.ndarray, test: np.ndarray, train_idx: list[np.ndarray],
                        num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per client and class: test count = train count, truncated at the available test
    samples; a fresh shuffle of the class's test indices for every client (spec §11.3)."""
    test_by_class = [np.flatnonzero(test == c) for c in range(num_classes)]
    out = []
    for idx in train_idx:
        train_counts = np.bincount(train[idx], minlength=num_classes)
        parts = [rng.permutation(test_by_class[c])[:train_counts[c]]
                 for c in range(num_classes) if train_counts[c] > 0]
        out.append(np.concatenate(parts).astype(np.int64) if parts
                   else np.zeros(0, dtype=np.int64))
    return out


def _labels(y, arg: str) -> np.ndarray:
    """Labels as a 1-D int64 NumPy array, or a FeddrKitError naming ``arg``."""
    try:
        import torch

        if isinstance(y, torch.Tensor):
            y = y.detach().cpu().numpy()
    except ImportError:  # pragma: no cover - torch is a dependency, but labels need not be torch
        pass
    arr = np.asarray(y)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise FeddrKitError(f"{arg}: labels must be a 1-D integer array, got dtype {arr.dtype} "
                            f"and shape {arr.shape}")
    if arr.size == 0:
        raise FeddrKitError(f"{arg}: labels are empty; need at least one sample")
    if arr.min() < 0:
        raise FeddrKitError(f"{arg}: labels must be >= 0, got {arr.min()}")
    return arr.astype(np.int64)


def _labels_pair(train_y, test_y) -> tuple[np.ndarray, np.ndarray, int]:
    train, test = _labels(train_y, "train_y"), _labels(test_y, "test_y")
    train_classes, test_classes = np.unique(train), np.unique(test)
    if not np.array_equal(train_classes, test_classes):
        raise FeddrKitError(f"test_y: has {len(test_classes)} classes but train_y has "
                            f"{len(train_classes)}; both splits need the same class set")
    return train, test, int(train_classes.max()) + 1


def _check_clients(num_clients, n_train: int, n_test: int | None) -> None:
    if not _is_int(num_clients) or not 1 <= num_clients <= n_train:
        raise FeddrKitError(f"num_clients: must be an integer in [1, {n_train}] (the number of "
                            f"train samples), got {num_clients!r}")
    if n_test is not None and num_clients > n_test:
        raise FeddrKitError(f"num_clients: {num_clients} clients exceed the {n_test} test "
                            "samples; every client needs a test sample")


def _check_shardable(labels: np.ndarray, num_classes: int, shard_per_class: int, arg: str) -> None:
    counts = np.bincount(labels, minlength=num_classes)
    c = int(np.argmin(counts))
    if counts[c] < shard_per_class:
        raise FeddrKitError(f"{arg}: class {c} has {counts[c]} samples, fewer than its "
                            f"{shard_per_class} shards; use fewer clients or shards_per_client")


def _rng(seed) -> np.random.Generator:
    if not _is_int(seed) or seed < 0:
        raise FeddrKitError(f"seed: must be an integer >= 0, got {seed!r}")
    return np.random.default_rng(seed)


def _as_int64(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [p.astype(np.int64) for p in parts]


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)
