"""FeatureStore (fednest_mpi.problems.representation): the bookkeeping of the cached hidden features
is exact (the fast paths of issue 34 give the answers of the plain definitions)."""

import numpy as np
import torch

from fednest_mpi.problems.representation import FeatureStore


def _store(blocks):
    store = FeatureStore()
    for split, ids in blocks:
        ids = np.asarray(ids)
        store.add(split, ids, np.full(ids.size, 2), torch.ones(ids.size, 2, 3))
    return store


def test_missing_is_the_clients_of_no_block_of_the_split():
    gen = np.random.default_rng(3)
    blocks = [(split, gen.choice(200, size=gen.integers(1, 40), replace=False)) for split in "abab" * 3]
    store = _store(blocks)
    for split in "abc":
        clients = gen.permutation(200)[:70]
        held = [ids for s, ids in blocks if s == split]
        expected = [c for c in clients if not any(c in ids for ids in held)]
        got = store.missing(split, clients)
        assert got.tolist() == expected  # the order of ``clients`` kept
    assert FeatureStore().missing("a", np.array([4, 1])).tolist() == [4, 1]


def test_add_zeroes_only_the_padding_rows_and_keeps_a_full_block_as_is():
    gen = torch.Generator().manual_seed(5)
    store = FeatureStore()
    full = torch.randn(3, 4, 2, generator=gen)
    before = full.clone()
    store.add("a", np.array([1, 2, 3]), np.array([4, 4, 4]), full)
    assert store.blocks[-1][2] is full and torch.equal(full, before)  # no padding: the block itself, untouched
    ragged = torch.randn(3, 4, 2, generator=gen)
    expected = ragged.clone()
    expected[0, 2:] = 0.0
    expected[2, 1:] = 0.0
    store.add("a", np.array([4, 5, 6]), np.array([2, 4, 1]), ragged)
    assert torch.equal(store.blocks[-1][2], expected)
