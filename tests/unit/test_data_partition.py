"""Client partitions: disjointness, sizes, determinism in the seed, label skew, long tail."""

from __future__ import annotations

import numpy as np
import pytest
from shared_data import DATA as SHARED
from shared_data import need

from fednest_mpi.data import (
    dirichlet_partition,
    iid_partition,
    long_tail_indices,
    read_idx,
    shard_partition,
    split_inner_outer,
)
from fednest_mpi.data.mnist import LABELS_MAGIC


@pytest.fixture(scope="module")
def mnist_labels():
    path = SHARED / "mnist" / "train-labels-idx1-ubyte.gz"
    need(path)
    return read_idx(path, LABELS_MAGIC).astype(np.int64)


def synthetic_labels(n=1000, n_classes=10):
    return np.arange(n) % n_classes


def assert_disjoint(parts, n):
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined), "an index is used twice"
    assert joined.min() >= 0 and joined.max() < n
    assert all(np.all(np.diff(p) > 0) for p in parts), "each client's indices are sorted"


def assert_same(a, b):
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def assert_differ(a, b):
    assert any(not np.array_equal(x, y) for x, y in zip(a, b))


def test_iid_partition():
    parts = iid_partition(1003, 10, seed=1)
    assert [len(p) for p in parts] == [100] * 10
    assert_disjoint(parts, 1003)
    assert_same(parts, iid_partition(1003, 10, seed=1))
    assert_differ(parts, iid_partition(1003, 10, seed=2))
    with pytest.raises(ValueError, match="cannot give 11 clients 1 sample"):
        iid_partition(10, 11, seed=0)
    with pytest.raises(ValueError, match="n_clients must be at least 1"):
        iid_partition(10, 0, seed=0)


def test_shard_partition_gives_mostly_two_labels_per_client(mnist_labels):
    parts = shard_partition(mnist_labels, 100, seed=0)
    assert [len(p) for p in parts] == [600] * 100
    assert_disjoint(parts, 60000)
    n_labels = np.array([len(np.unique(mnist_labels[p])) for p in parts])
    assert np.mean(n_labels <= 2) >= 0.9 and n_labels.max() <= 4
    assert_same(parts, shard_partition(mnist_labels, 100, seed=0))
    assert_differ(parts, shard_partition(mnist_labels, 100, seed=1))


def test_shard_partition_arguments():
    labels = synthetic_labels(1000)
    parts = shard_partition(labels, 10, seed=3, n_shards=50, shards_per_client=3)
    assert [len(p) for p in parts] == [60] * 10
    assert_disjoint(parts, 1000)
    with pytest.raises(ValueError, match="1000 samples cannot be cut into 300 equal shards"):
        shard_partition(labels, 10, seed=0, n_shards=300)
    with pytest.raises(ValueError, match="cannot give 101 clients 2 sample"):
        shard_partition(labels, 101, seed=0)
    with pytest.raises(ValueError, match="1-D integer array"):
        shard_partition(labels.astype(float), 10, seed=0)


def test_dirichlet_partition_uses_every_sample_once_and_is_deterministic():
    labels = synthetic_labels(2000)
    parts = dirichlet_partition(labels, 20, alpha=0.5, seed=4, min_size=5)
    assert sum(len(p) for p in parts) == 2000 and min(len(p) for p in parts) >= 5
    assert_disjoint(parts, 2000)
    assert_same(parts, dirichlet_partition(labels, 20, alpha=0.5, seed=4, min_size=5))
    assert_differ(parts, dirichlet_partition(labels, 20, alpha=0.5, seed=5, min_size=5))


def test_dirichlet_alpha_controls_label_skew(mnist_labels):
    def top_class_share(alpha):
        parts = dirichlet_partition(mnist_labels, 10, alpha=alpha, seed=0)
        return np.mean([np.bincount(mnist_labels[p]).max() / len(p) for p in parts])

    assert top_class_share(0.1) > 0.5  # few classes per client
    assert top_class_share(1000.0) < 0.15  # close to IID (0.11)


def test_dirichlet_partition_arguments():
    labels = synthetic_labels(30, n_classes=3)
    with pytest.raises(ValueError, match="alpha must be positive"):
        dirichlet_partition(labels, 3, alpha=0.0, seed=0)
    with pytest.raises(ValueError, match="cannot give 11 clients 3 sample"):
        dirichlet_partition(labels, 11, alpha=1.0, seed=0, min_size=3)
    with pytest.raises(ValueError, match="raise alpha or lower min_size"):
        dirichlet_partition(labels, 10, alpha=0.01, seed=0, min_size=3)


def test_split_inner_outer():
    clients = iid_partition(1000, 4, seed=0) + [np.arange(1000, 1010)]
    splits = split_inner_outer(clients, 0.7, seed=9)
    for idx, (train, val) in zip(clients, splits):
        assert len(val) == int(np.ceil(0.7 * len(idx) - 1e-9)) and len(train) + len(val) == len(idx)
        assert np.array_equal(np.sort(np.concatenate([train, val])), np.sort(idx))
    assert len(splits[-1][1]) == 7  # 0.7 * 10 is 7.000000000000001 in floating point
    # a client's split depends on the seed and its own position only, not on the other clients
    other = split_inner_outer(clients[:1] + [np.arange(5)], 0.7, seed=9)
    assert np.array_equal(other[0][1], splits[0][1])
    assert not np.array_equal(split_inner_outer(clients, 0.7, seed=10)[0][1], splits[0][1])
    with pytest.raises(ValueError, match=r"val_fraction must be in \(0, 1\)"):
        split_inner_outer(clients, 1.0, seed=0)
    with pytest.raises(ValueError, match="client 1 has 1 samples"):
        split_inner_outer([np.arange(5), np.arange(5, 6)], 0.2, seed=0)


def test_long_tail_counts_on_mnist(mnist_labels):
    keep = long_tail_indices(mnist_labels)
    assert np.bincount(mnist_labels[keep]).tolist() == [5923, 3597, 2157, 1293, 775, 465, 279, 167, 101, 61]
    assert len(keep) == 14818
    # the first samples of each class in file order
    assert np.array_equal(keep[mnist_labels[keep] == 9], np.flatnonzero(mnist_labels == 9)[:61])


def test_long_tail_arguments():
    labels = synthetic_labels(400, n_classes=4)  # 100 per class
    keep = long_tail_indices(labels, n_classes=4, max_per_class=80, ratio=8)  # mu = 1/2
    assert np.bincount(labels[keep]).tolist() == [80, 40, 20, 10]
    with pytest.raises(ValueError, match=r"labels must be in 0..2"):
        long_tail_indices(labels, n_classes=3)
    with pytest.raises(ValueError, match="ratio >= 1"):
        long_tail_indices(labels, n_classes=4, ratio=0.5)


def test_split_is_the_per_client_keyed_permutation_for_clients_of_mixed_sizes():
    # the split is vectorised over clients of equal size; each client's must still be the one its
    # own key (seed, client i) gives
    import math

    from fednest_mpi import rng
    from fednest_mpi.data.partition import _SPLIT

    gen = np.random.default_rng(3)
    clients = [np.sort(gen.choice(1000, size=n, replace=False)) for n in [5, 9, 5, 12, 9, 5, 30]]
    splits = split_inner_outer(clients, 0.3, seed=8)
    for i, idx in enumerate(clients):
        perm = rng.permutation(rng.key(8, _SPLIT, i), len(idx))
        n_val = math.ceil(0.3 * len(idx) - 1e-9)
        np.testing.assert_array_equal(splits[i][0], np.sort(idx[perm[n_val:]]))
        np.testing.assert_array_equal(splits[i][1], np.sort(idx[perm[:n_val]]))
