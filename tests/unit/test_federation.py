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
