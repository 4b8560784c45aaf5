"""Tests of feddr_kit.partition and the partition heatmap: invariants under
hypothesis on small label arrays, the paper's settings on real CIFAR-10, and bad inputs."""

import math

import matplotlib
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from feddr_kit import partition as P
from feddr_kit import plots
from feddr_kit.errors import FeddrKitError

matplotlib.use("Agg")

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_labels(counts, seed=0) -> np.ndarray:
    """Labels with counts[c] samples of class c, in a shuffled dataset order."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(len(counts)), counts))


def assert_each_index_once(indices, n):
    joined = np.concatenate(indices)
    assert joined.dtype == np.int64
    assert np.array_equal(np.sort(joined), np.arange(n))


def assert_counts_match_indices(part):
    for split, labels, indices in (("train", part.train_labels, part.train_indices),
                                   ("test", part.test_labels, part.test_indices)):
        counts = part.counts(split)
        assert counts.shape == (part.num_clients, part.num_classes) and counts.dtype == np.int64
        for k, idx in enumerate(indices):
            for c in range(part.num_classes):
                assert counts[k, c] == np.sum(labels[idx] == c)
    assert np.array_equal(part.sizes, part.counts("train").sum(1))


def assert_cap_respected(part):
    """The N/K cap of the Dirichlet rule: classes are dealt out in order 0..C-1 and a client already
    holding >= N/K samples gets no share of later classes. As in the reference code, the
    last client can still get 1 sample per later class: cumsum(p) ends at 1 - eps, and
    flooring it leaves the final sample to the last split."""
    cap = len(part.train_labels) / part.num_clients
    for k, row in enumerate(part.counts("train")):
        before = np.concatenate([[0], np.cumsum(row)[:-1]])  # size when class c was dealt
        late = row[before >= cap]
        assert np.all(late <= (1 if k == part.num_clients - 1 else 0)), (k, row)


def same_partition(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a.train_indices + a.test_indices,
                                                     b.train_indices + b.test_indices))


# --------------------------------------------------------------------------------------
# shard
# --------------------------------------------------------------------------------------

@st.composite
def shard_case(draw):
    """Parameters that satisfy the divisibility rule, and per-class counts large enough that
    every shard holds more than s samples (so a client's shard multiset is recoverable)."""
    num_classes = draw(st.integers(2, 10))
    s = draw(st.integers(1, num_classes))
    unit = num_classes // math.gcd(s, num_classes)  # num_clients must be a multiple of this
    num_clients = unit * draw(st.integers(1, max(1, 30 // unit)))
    spc = s * num_clients // num_classes
    train = [spc * (s + 1) + draw(st.integers(0, 60)) for _ in range(num_classes)]
    test = [spc * (s + 1) + draw(st.integers(0, 20)) for _ in range(num_classes)]
    return num_classes, s, num_clients, train, test, draw(st.integers(0, 2**16))


@FAST
@given(shard_case())
def test_shard_invariants(case):
    num_classes, s, num_clients, train_counts, test_counts, seed = case
    train, test = make_labels(train_counts, seed), make_labels(test_counts, seed + 1)
    part = P.shard(train, test, num_clients=num_clients, shards_per_client=s, seed=seed)
    spc = s * num_clients // num_classes
    assert part.kind == "shard" and part.num_clients == num_clients
    assert part.params == {"num_clients": num_clients, "shards_per_client": s, "seed": seed}
    assert_each_index_once(part.train_indices, len(train))
    assert_each_index_once(part.test_indices, len(test))
    multiplicity = {}
    for split, counts, totals in (("train", part.counts("train"), train_counts),
                                  ("test", part.counts("test"), test_counts)):
        base = np.array(totals) // spc  # shard sizes are base or base+1 (leftovers)
        m = counts // base  # exact, since each client gets at most s < base leftovers
        assert np.all(m.sum(1) == s), f"{split}: every client holds exactly s shards"
        assert np.all(counts - m * base <= m) and np.all(counts - m * base >= 0)
        multiplicity[split] = m
    assert np.array_equal(multiplicity["train"], multiplicity["test"]), \
        "test shards reuse the train class assignment"
    for k in range(num_clients):
        train_classes = part.classes_of(k)
        assert 1 <= len(train_classes) <= s
        assert np.array_equal(train_classes, np.unique(test[part.test_indices[k]]))
    assert_counts_match_indices(part)


def test_shard_without_leftovers_gives_equal_sizes():
    train, test = make_labels([60] * 5), make_labels([20] * 5)
    part = P.shard(train, test, num_clients=10, shards_per_client=2, seed=1)
    assert np.all(part.sizes == 2 * 60 // 4)
    assert all(len(t) == 2 * 20 // 4 for t in part.test_indices)


def test_shard_splits_each_class_in_dataset_order():
    """Shards are contiguous runs of each class's indices in dataset order (not shuffled)."""
    train, test = make_labels([40] * 4, seed=3), make_labels([8] * 4, seed=4)
    part = P.shard(train, test, num_clients=8, shards_per_client=2, seed=0)
    runs = {c: np.flatnonzero(train == c).reshape(4, 10) for c in range(4)}
    shards = {tuple(r) for c in runs for r in runs[c]}
    for idx in part.train_indices:
        assert tuple(idx[:10]) in shards and tuple(idx[10:]) in shards


def test_shard_leftovers_go_one_each_to_the_first_shards():
    """Class 0 has 23 samples in 2 shards: 11 + 1 leftover and 11. Class 1: 10 and 10."""
    train, test = make_labels([23, 20], seed=5), make_labels([4, 4], seed=6)
    for seed in range(6):
        part = P.shard(train, test, num_clients=2, shards_per_client=2, seed=seed)
        assert sorted(part.counts()[:, 0]) in ([0, 23], [11, 12])
        assert sorted(part.counts()[:, 1]) in ([0, 20], [10, 10])


def test_shard_is_deterministic_and_seed_dependent_and_ignores_global_rng():
    train, test = make_labels([50] * 10), make_labels([10] * 10)
    np.random.seed(1)
    a = P.shard(train, test, num_clients=20, shards_per_client=2, seed=7)
    state = np.random.get_state()[1].copy()
    np.random.seed(2)
    b = P.shard(train, test, num_clients=20, shards_per_client=2, seed=7)
    c = P.shard(train, test, num_clients=20, shards_per_client=2, seed=8)
    assert same_partition(a, b) and not same_partition(a, c)
    np.random.seed(1)
    P.shard(train, test, num_clients=20, shards_per_client=2, seed=7)
    assert np.array_equal(np.random.get_state()[1], state), "global RNG must not be used"


def test_shard_accepts_torch_labels():
    train, test = make_labels([30] * 3), make_labels([6] * 3)
    a = P.shard(torch.from_numpy(train), torch.from_numpy(test), num_clients=3,
                shards_per_client=2, seed=0)
    b = P.shard(train, test, num_clients=3, shards_per_client=2, seed=0)
    assert same_partition(a, b) and a.train_labels.dtype == np.int64


# --------------------------------------------------------------------------------------
# dirichlet
# --------------------------------------------------------------------------------------

@st.composite
def dirichlet_case(draw):
    num_classes = draw(st.integers(2, 10))
    train = draw(st.lists(st.integers(20, 200), min_size=num_classes, max_size=num_classes))
    test = draw(st.lists(st.integers(1, 60), min_size=num_classes, max_size=num_classes))
    num_clients = draw(st.integers(1, 20))
    alpha = draw(st.floats(0.05, 10.0))
    min_size = draw(st.integers(0, min(10, sum(train) // (4 * num_clients))))
    return train, test, num_clients, alpha, min_size, draw(st.integers(0, 2**16))


@FAST
@given(dirichlet_case())
def test_dirichlet_invariants(case):
    train_counts, test_counts, num_clients, alpha, min_size, seed = case
    train, test = make_labels(train_counts, seed), make_labels(test_counts, seed + 1)
    try:
        part = P.dirichlet(train, test, num_clients=num_clients, alpha=alpha, seed=seed,
                           min_size=min_size)
    except FeddrKitError as err:  # a legitimately hard case (tiny alpha, few classes)
        assert str(err).startswith("max_tries:")
        assume(False)
    assert part.kind == "dirichlet" and part.num_clients == num_clients
    assert_each_index_once(part.train_indices, len(train))
    assert part.sizes.min() >= min_size
    assert_cap_respected(part)
    expected_test = np.minimum(part.counts("train"), np.array(test_counts)[None, :])
    assert np.array_equal(part.counts("test"), expected_test)
    for idx in part.test_indices:
        assert len(np.unique(idx)) == len(idx), "no repeats within a client's test set"
    assert_counts_match_indices(part)
    again = P.dirichlet(train, test, num_clients=num_clients, alpha=alpha, seed=seed,
                        min_size=min_size)
    assert same_partition(part, again)


def test_dirichlet_seeds_differ_and_low_alpha_is_skewed():
    train, test = make_labels([200] * 10), make_labels([40] * 10)
    a = P.dirichlet(train, test, num_clients=10, alpha=0.1, seed=0)
    b = P.dirichlet(train, test, num_clients=10, alpha=0.1, seed=1)
    assert not same_partition(a, b)
    wide = P.dirichlet(train, test, num_clients=10, alpha=1000.0, seed=0)
    share = lambda p: (p.counts().max(1) / p.sizes).mean()  # top class's share per client
    assert share(a) > share(wide)


def test_dirichlet_cap_stops_clients_at_the_mean_size():
    """A client at or above N/K gets nothing from later classes: with alpha huge, every
    class is split evenly, so sizes stay close to N/K."""
    train, test = make_labels([100] * 10), make_labels([10] * 10)
    part = P.dirichlet(train, test, num_clients=10, alpha=1e6, seed=0, min_size=0)
    assert part.sizes.max() <= 100 + 10 and part.sizes.min() >= 100 - 10


def test_dirichlet_test_sets_overlap_across_clients():
    train, test = make_labels([300] * 2), make_labels([20] * 2)
    part = P.dirichlet(train, test, num_clients=4, alpha=1.0, seed=0, min_size=1)
    joined = np.concatenate(part.test_indices)
    assert len(joined) > len(np.unique(joined)), "each client samples the test set afresh"


# --------------------------------------------------------------------------------------
# iid
# --------------------------------------------------------------------------------------

@FAST
@given(st.lists(st.integers(1, 50), min_size=2, max_size=8), st.integers(1, 12),
       st.integers(0, 2**16))
def test_iid_invariants(counts, num_clients, seed):
    train, test = make_labels(counts, seed), make_labels(counts, seed + 1)
    if num_clients > len(train):
        return
    part = P.iid(train, test, num_clients=num_clients, seed=seed)
    assert part.kind == "iid" and part.params == {"num_clients": num_clients, "seed": seed}
    assert_each_index_once(part.train_indices, len(train))
    assert_each_index_once(part.test_indices, len(test))
    assert part.sizes.max() - part.sizes.min() <= 1
    assert_counts_match_indices(part)
    assert same_partition(part, P.iid(train, test, num_clients=num_clients, seed=seed))


# --------------------------------------------------------------------------------------
# real CIFAR-10, the paper's settings
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("s", [2, 5, 10])
def test_cifar10_shards(cifar10, s):
    part = P.shard(cifar10.train_y, cifar10.test_y, num_clients=100, shards_per_client=s, seed=0)
    assert np.all(part.sizes == 500)
    assert all(len(t) == 100 for t in part.test_indices)
    assert_each_index_once(part.train_indices, 50_000)
    assert_each_index_once(part.test_indices, 10_000)
    test_counts = part.counts("test")
    for k in range(100):
        classes = part.classes_of(k)
        assert len(classes) <= s
        assert np.array_equal(classes, np.flatnonzero(test_counts[k]))
    # same class mix on both sides: test = train / 5 per class (5000 vs 1000 per class)
    assert np.array_equal(part.counts("train"), 5 * test_counts)


@pytest.mark.parametrize("alpha", [0.1, 0.3])
def test_cifar10_dirichlet(cifar10, alpha):
    part = P.dirichlet(cifar10.train_y, cifar10.test_y, num_clients=100, alpha=alpha, seed=0)
    assert part.sizes.min() >= 10
    assert_each_index_once(part.train_indices, 50_000)
    train_counts = part.counts("train")
    assert np.array_equal(part.counts("test"), np.minimum(train_counts, 1000))
    assert_cap_respected(part)


def test_cifar10_iid(cifar10):
    part = P.iid(cifar10.train_y, cifar10.test_y, num_clients=100, seed=0)
    assert np.all(part.sizes == 500) and all(len(t) == 100 for t in part.test_indices)
    assert_each_index_once(part.train_indices, 50_000)


# --------------------------------------------------------------------------------------
# heatmap
# --------------------------------------------------------------------------------------

def test_partition_heatmap_draws_counts():
    train, test = make_labels([40] * 5), make_labels([10] * 5)
    part = P.shard(train, test, num_clients=10, shards_per_client=2, seed=0)
    ax = plots.partition_heatmap(part, split="test", max_clients=4)
    assert ax.get_xlabel() == "class" and ax.get_ylabel() == "client"
    assert "shard" in ax.get_title() and "shards_per_client=2" in ax.get_title()
    assert "first 4 of 10" in ax.get_title()
    mesh = ax.collections[0].get_array().reshape(4, 5)
    assert np.array_equal(np.asarray(mesh), part.counts("test")[:4])
    matplotlib.pyplot.close(ax.figure)


def test_partition_heatmap_bad_max_clients():
    part = P.iid(make_labels([5, 5]), make_labels([2, 2]), num_clients=2)
    with pytest.raises(FeddrKitError, match=r"^max_clients: must be an integer >= 1"):
        plots.partition_heatmap(part, max_clients=0)


# --------------------------------------------------------------------------------------
# bad inputs: each raises FeddrKitError naming the argument
# --------------------------------------------------------------------------------------

TRAIN, TEST = make_labels([30] * 10), make_labels([10] * 10)


def test_shards_not_divisible_by_classes():
    with pytest.raises(FeddrKitError, match=r"^shards_per_client: shards_per_client\*num_clients "
                                            r"= 3 must be divisible by the 10 classes"):
        P.shard(TRAIN, TEST, num_clients=3, shards_per_client=1)


def test_shards_above_number_of_classes():
    with pytest.raises(FeddrKitError, match=r"^shards_per_client: must be an integer in \[1, 10\]"):
        P.shard(TRAIN, TEST, num_clients=10, shards_per_client=11)


def test_shards_zero():
    with pytest.raises(FeddrKitError, match=r"^shards_per_client: must be an integer"):
        P.shard(TRAIN, TEST, num_clients=10, shards_per_client=0)


def test_shards_more_than_a_class_holds():
    with pytest.raises(FeddrKitError, match=r"^test_y: class \d has 10 samples, fewer than its 20 "
                                            r"shards"):
        P.shard(TRAIN, TEST, num_clients=100, shards_per_client=2)


@pytest.mark.parametrize("alpha", [0, -0.5, float("nan"), float("inf"), "0.1", True])
def test_bad_alpha(alpha):
    with pytest.raises(FeddrKitError, match=r"^alpha: must be a finite number > 0"):
        P.dirichlet(TRAIN, TEST, num_clients=5, alpha=alpha)


@pytest.mark.parametrize("fn", [P.iid, P.shard, P.dirichlet])
@pytest.mark.parametrize("num_clients", [0, -3, 2.5, 301])
def test_bad_num_clients(fn, num_clients):
    with pytest.raises(FeddrKitError, match=r"^num_clients: must be an integer in \[1, 300\]"):
        fn(TRAIN, TEST, num_clients=num_clients)


def test_iid_more_clients_than_test_samples():
    with pytest.raises(FeddrKitError, match=r"^num_clients: 150 clients exceed the 100 test"):
        P.iid(TRAIN, TEST, num_clients=150)


def test_min_size_impossible():
    with pytest.raises(FeddrKitError, match=r"^min_size: 10 samples for each of 31 clients needs "
                                            r"310 > 300"):
        P.dirichlet(TRAIN, TEST, num_clients=31, alpha=0.5, min_size=10)


def test_max_tries_exhausted_suggests_a_fix():
    with pytest.raises(FeddrKitError, match=r"^max_tries: no draw in 3 gave every client >= 6 "
                                            r"samples; use a larger alpha, a smaller min_size"):
        P.dirichlet(TRAIN, TEST, num_clients=50, alpha=0.01, min_size=6, max_tries=3)


@pytest.mark.parametrize("labels", [np.zeros((10, 2), dtype=int), np.zeros(10, dtype=np.float32),
                                    [], torch.zeros(10, dtype=torch.bool)])
def test_labels_not_1d_integer(labels):
    with pytest.raises(FeddrKitError, match=r"^train_y: labels "):
        P.iid(labels, TEST, num_clients=2)


def test_negative_labels():
    with pytest.raises(FeddrKitError, match=r"^test_y: labels must be >= 0"):
        P.iid(TRAIN, TEST - 1, num_clients=2)


def test_train_and_test_class_sets_differ():
    with pytest.raises(FeddrKitError, match=r"^test_y: has 9 classes but train_y has 10"):
        P.dirichlet(TRAIN, TEST[TEST != 3], num_clients=5)


@pytest.mark.parametrize("seed", [-1, 1.5])
def test_bad_seed(seed):
    with pytest.raises(FeddrKitError, match=r"^seed: must be an integer >= 0"):
        P.iid(TRAIN, TEST, num_clients=5, seed=seed)


def test_bad_min_size_and_max_tries_types():
    with pytest.raises(FeddrKitError, match=r"^min_size: must be an integer >= 0"):
        P.dirichlet(TRAIN, TEST, num_clients=5, min_size=-1)
    with pytest.raises(FeddrKitError, match=r"^max_tries: must be an integer >= 1"):
        P.dirichlet(TRAIN, TEST, num_clients=5, max_tries=0)


def test_counts_bad_split_and_classes_of_bad_client():
    part = P.iid(TRAIN, TEST, num_clients=5)
    with pytest.raises(FeddrKitError, match=r"^split: must be 'train' or 'test'"):
        part.counts("val")
    with pytest.raises(FeddrKitError, match=r"^client: must be an integer in \[0, 4\]"):
        part.classes_of(5)
