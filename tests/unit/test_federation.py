"""Placement of a round's clients on ranks (federation.py), as pure functions: no MPI ranks needed.
The collective side is tested under mpiexec in tests/mpi/test_balanced_placement.py."""

import numpy as np
import pytest

from fednest_mpi import rng
from fednest_mpi.federation import balanced_assignment, block_range


@pytest.mark.parametrize("n_clients,size,ranks", [(100, 10, 2), (100, 10, 4), (3, 3, 4), (1000, 37, 16), (50, 50, 3)])
def test_balanced_assignment_counts_and_home_members(n_clients, size, ranks):
    """Pure function, every world size: counts within one, each member once, and a member leaves
    home only when its home rank holds more than its target."""
    for key in range(10):
        ids = rng.sample_without_replacement(key, n_clients, size)
        rank = balanced_assignment(ids, n_clients, ranks)
        counts = np.bincount(rank, minlength=ranks)
        assert counts.sum() == size and counts.max() - counts.min() <= 1
        home = np.array([next(r for r in range(ranks) if i in block_range(n_clients, ranks, r)) for i in ids])
        moved = rank != home
        assert all(counts[h] == np.sum(rank == h) for h in home[moved])  # whoever moved left a full home
        assert moved.sum() == sum(max(0, int(np.sum(home == r)) - int(counts[r])) for r in range(ranks))


def test_a_call_with_its_own_bytes_per_client_gets_its_own_chunk_unless_the_user_fixed_one():
    from mpi4py import MPI

    from fednest_mpi.federation import Federation

    fed = Federation(MPI.COMM_SELF, 100, "ordered", "auto", "block")
    fed.chunk_clients, fed.block_bytes = 7, 1000
    assert fed.chunk_for(None) == 7  # the problem's default estimate
    assert fed.chunk_for(30) == 33 and fed.chunk_for(5000) == 1  # the budget over this call's bytes, at least 1
    fed.fixed_chunk = True  # run.chunk_clients set by the user
    assert fed.chunk_for(30) == 7
