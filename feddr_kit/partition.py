"""Split a labelled dataset across federated clients: ``iid``, ``shard``, ``dirichlet`` and ``reference``.

Each partitioner returns a :class:`Partition`: per-client train indices and per-client test
indices drawn from the official test split, built exactly as the FedDr+ reference code does
(docs/fidelity.md):

* ``shard``: each class is cut, in dataset order, into ``s·K/C`` shards; a shuffled
  class list decides which classes each client gets; the test split reuses the same
  class assignment, so a client's test classes are its train classes.
* ``dirichlet`` (the FedML variant with the N/K cap, redrawn until every client has
  ``min_size`` samples); its test sets: per class, as many test images as train
  images (truncated at what exists), sampled afresh for each client.
* ``iid``: shuffle and split evenly; the test split likewise.
* ``reference``: the FedDr+ reference code's own pre-computed partitions (``.npz`` files in
  ``shared/reference-partitions``), which its seed does not reproduce; they index torchvision's
  CIFAR order, so they are refused for data stored in another order.

All randomness comes from a local ``np.random.default_rng(seed)``: deterministic under a seed
and independent of the global NumPy/Python random state.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

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

    def client_id(self, client, name: str = "client") -> int:
        """``client`` as a plain int if it is a client id of this partition (an integer, not a bool, in
        ``[0, K)``); otherwise :class:`FeddrKitError` naming the argument ``name``."""
        if not _is_int(client) or not 0 <= client < self.num_clients:
            raise FeddrKitError(f"{name}: must be an integer in [0, {self.num_clients - 1}], "
                                f"got {client!r}")
        return int(client)

    def classes_of(self, client: int) -> np.ndarray:
        """Sorted classes present in ``client``'s train split: int64 ``[<=C]``."""
        return np.unique(self.train_labels[self.train_indices[self.client_id(client)]]).astype(np.int64)


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
    """Pathological non-IID sharding (FedAvg/FedBABU/FedNTD), as the reference code cuts shards.

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
    if (shard_per_class * num_classes) % num_clients != 0:  # implied by the above; checked, as the reference code does
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


# A Dirichlet partition's defaults: the least train samples of a client, and the draws tried to get there.
DIRICHLET_MIN_SIZE, DIRICHLET_MAX_TRIES = 10, 1000


def dirichlet(train_y, test_y, num_clients: int = 100, alpha: float = 0.1, seed: int = 0,
              min_size: int = DIRICHLET_MIN_SIZE, max_tries: int = DIRICHLET_MAX_TRIES) -> Partition:
    """Latent Dirichlet allocation of classes to clients (FedML variant), as the reference code draws it.

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
# the reference code's partition files
# --------------------------------------------------------------------------------------

REFERENCE_ENV = "FEDDR_REFERENCE_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[1]
_REFERENCE_KEY = re.compile(r"^(train|test)_(\d+)$")
# Files named cifar10_* / cifar100_* index torchvision's CIFAR splits: (classes, train size, test size, folder).
_CIFAR = {"cifar10": (10, 50000, 10000, "cifar-10-batches-py"), "cifar100": (100, 50000, 10000, "cifar-100-python")}


def reference_folder(reference_dir: str | os.PathLike | None = None) -> Path:
    """Folder of the reference partition files: ``reference_dir``, else ``$FEDDR_REFERENCE_DIR``, else
    ``shared/reference-partitions`` beside the repository (where this workplace keeps them)."""
    if reference_dir is not None:
        return Path(reference_dir).expanduser()
    env = os.environ.get(REFERENCE_ENV)
    if not env:
        return _REPO_ROOT.parent / "shared" / "reference-partitions"
    folder = Path(env).expanduser()
    if not folder.is_absolute() and not folder.exists() and (_REPO_ROOT / folder).exists():
        return _REPO_ROOT / folder
    return folder


def reference_scheme(path_or_name: str | os.PathLike) -> str | None:
    """``"shard"`` or ``"dirichlet"``, as a reference file's name says (``cifar10_shard_s2`` → ``"shard"``);
    None when the name says neither. Local training draws its batches by this scheme's rule
    (:func:`feddr_kit.local.local_steps`)."""
    stem = Path(str(path_or_name)).name.removesuffix(".npz")
    for scheme in ("shard", "dirichlet"):
        if f"_{scheme}_" in f"_{stem}_":
            return scheme
    return None


def reference(path_or_name: str | os.PathLike, train_y, test_y, seed: int = 0,
              reference_dir: str | os.PathLike | None = None) -> Partition:
    """A ``Partition`` from one of the FedDr+ reference code's partition files (``.npz``).

    ``path_or_name``: a path to an ``.npz``, or a bare name such as ``"cifar10_shard_s2"`` looked up
    in :func:`reference_folder` (``reference_dir``, ``$FEDDR_REFERENCE_DIR``, or the workplace's
    ``shared/reference-partitions``). A file holds ``train_k`` (and ``test_k``) int64 index arrays for
    clients ``k = 0..K-1`` into torchvision's CIFAR train (test) split, in torchvision's order.
    ``train_y`` ``[N]``, ``test_y`` ``[M]``: the labels, in that same order.

    Checked against the labels: every train index appears exactly once, every index is in range,
    the client keys are contiguous, and for files named ``cifar10_*`` / ``cifar100_*`` the class count
    and split sizes are CIFAR's. Labels stored in one block per class (the image-folder copy of CIFAR,
    sorted by class) are refused:
    the file's indices cannot be mapped onto them. A file without test sets gets them drawn by the
    kit's rule (as :func:`dirichlet`'s test sets, from ``seed``), with a warning saying so. Returns a ``Partition`` of kind
    ``"reference"``; ``params["scheme"]`` is :func:`reference_scheme` of the file.
    """
    path = _reference_path(path_or_name, reference_dir)
    name = path.name.removesuffix(".npz")
    train, test, num_classes = _labels_pair(train_y, test_y)
    rng = _rng(seed)
    expected = _CIFAR.get(name.split("_")[0])
    if expected is not None:
        classes, n_train, n_test, folder = expected
        if num_classes != classes:
            raise FeddrKitError(f"train_y: has {num_classes} classes but {name} partitions "
                                f"{name.split('_')[0]} ({classes} classes)")
        for arg, labels, n in (("train_y", train, n_train), ("test_y", test, n_test)):
            if len(labels) != n:
                raise FeddrKitError(f"{arg}: has {len(labels)} labels but {name} indexes torchvision's "
                                    f"{name.split('_')[0]} split of {n}; pass that split's labels in its own order")
    else:
        folder = "torchvision's CIFAR files"
    for arg, labels in (("train_y", train), ("test_y", test)):
        if len(labels) > 1 and np.count_nonzero(np.diff(labels)) < num_classes:  # one block per class
            raise FeddrKitError(f"{arg}: labels are sorted by class, not in torchvision's CIFAR order (an image-folder "
                                f"copy?), so {name}'s indices cannot be mapped onto them; load torchvision's CIFAR "
                                f"files instead ({folder}/ in FEDDR_DATA_DIR)")
    train_idx, test_idx = _read_reference(path, name)
    everything = np.concatenate(train_idx)
    if len(everything) != len(train):
        raise FeddrKitError(f"train_y: has {len(train)} labels but {name} assigns {len(everything)} train "
                            "indices; pass the labels of the whole train split it was made for")
    _check_reference_range(everything, len(train), name, "train", "train_y")
    seen = np.bincount(everything, minlength=len(train))
    if (seen != 1).any():
        i = int(np.flatnonzero(seen != 1)[0])
        raise FeddrKitError(f"path_or_name: {path} is corrupt: train index {i} appears {seen[i]} times "
                            "(every train index must appear exactly once)")
    params = {"file": name, "num_clients": len(train_idx), "scheme": reference_scheme(name)}
    if test_idx is None:
        warnings.warn(f"{name} holds no test sets: each client's test set is drawn from test_y by the kit's "
                      f"rule (per class, as many as the client's train count) with seed={seed}",
                      stacklevel=2)
        test_idx = _matching_test_sets(train, test, train_idx, num_classes, rng)
        params["test_seed"] = seed
    else:
        _check_reference_range(np.concatenate(test_idx), len(test), name, "test", "test_y")
    return Partition("reference", params, train_idx, test_idx, train, test, num_classes)


def _reference_path(path_or_name, reference_dir) -> Path:
    """The file ``path_or_name`` names: a path as given, or ``<folder>/<name>.npz``; an error when absent."""
    if not isinstance(path_or_name, (str, os.PathLike)) or not str(path_or_name):
        raise FeddrKitError(f"path_or_name: must be a file name such as 'cifar10_shard_s2' or a path to an "
                            f".npz, got {path_or_name!r}")
    text = str(path_or_name)
    if text.endswith(".npz") or "/" in text or os.sep in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise FeddrKitError(f"path_or_name: no reference partition file at {path}")
        return path
    folder = reference_folder(reference_dir)
    path = folder / f"{text}.npz"
    if not path.is_file():
        names = sorted(p.name.removesuffix(".npz") for p in folder.glob("*.npz")) if folder.is_dir() else []
        known = f"available: {', '.join(names)}" if names else f"set {REFERENCE_ENV} to the folder holding them"
        raise FeddrKitError(f"path_or_name: no reference partition {text!r} in {folder}; {known}")
    return path


def _read_reference(path: Path, name: str) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Per-client train and test index arrays of a reference ``.npz`` (test: None when it has none)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise FeddrKitError(f"path_or_name: {path} is not a readable .npz partition file ({reason})") from None
    clients: dict[str, dict[int, np.ndarray]] = {"train": {}, "test": {}}
    for key, arr in arrays.items():
        match = _REFERENCE_KEY.match(key)
        if match is None:
            raise FeddrKitError(f"path_or_name: {path} holds an array {key!r}; only train_<k> and test_<k> are allowed")
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise FeddrKitError(f"path_or_name: {path}: {key} must be a 1-D integer array, got dtype {arr.dtype} "
                                f"and shape {arr.shape}")
        clients[match.group(1)][int(match.group(2))] = arr.astype(np.int64)
    num_clients = len(clients["train"])
    if num_clients == 0 or set(clients["train"]) != set(range(num_clients)):
        missing = sorted(set(range(max(clients["train"], default=-1) + 1)) - set(clients["train"]))
        raise FeddrKitError(f"path_or_name: {path}: client keys must be train_0..train_<K-1> without gaps; "
                            f"missing {', '.join(f'train_{k}' for k in missing[:5]) or 'all of them'}")
    train_idx = [clients["train"][k] for k in range(num_clients)]
    if not clients["test"]:
        return train_idx, None
    if set(clients["test"]) != set(range(num_clients)):
        raise FeddrKitError(f"path_or_name: {path}: has test sets for {len(clients['test'])} of its "
                            f"{num_clients} clients; a file holds test_<k> for every client or for none")
    return train_idx, [clients["test"][k] for k in range(num_clients)]


def _check_reference_range(indices: np.ndarray, n: int, name: str, split: str, arg: str) -> None:
    if len(indices) and (indices.min() < 0 or indices.max() >= n):
        bad = int(indices.min()) if indices.min() < 0 else int(indices.max())
        raise FeddrKitError(f"{arg}: has {n} labels but {name} uses {split} index {bad}; pass the labels of "
                            f"the whole {split} split it was made for")


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
            # Every uncapped share underflowed to 0 (tiny alpha); the reference code would divide by zero.
            # Share the class evenly among the uncapped clients instead.
            p = (sizes < n / num_clients).astype(float)
        p = p / p.sum()
        # As the reference code: cumsum(p) may end at 1 - eps, so the last client can receive one sample
        # of a class even when capped. Kept for fidelity.
        cuts = (np.cumsum(p) * len(idx_c)).astype(int)[:-1]
        for j, part in enumerate(np.split(idx_c, cuts)):
            clients[j].append(part)
            sizes[j] += len(part)
    return clients, sizes


def _matching_test_sets(train: np.ndarray, test: np.ndarray, train_idx: list[np.ndarray],
                        num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per client and class: test count = train count, truncated at the available test
    samples; a fresh shuffle of the class's test indices for every client (the reference code's rule)."""
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
