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


# -- summation groups of the exact reduction (federation.group_clients) ------------------------------------


def test_the_automatic_summation_group_is_one_client_for_small_rounds_and_about_group_members_else():
    from fednest_mpi.federation import GROUP_FROM_CLIENTS, summation_group

    assert summation_group(0, 100, 10) == 1 and summation_group(0, 10_000, GROUP_FROM_CLIENTS - 1) == 1
    assert summation_group(0, 10_000, 1000) == 320  # 32 members of a 10 % sample per 320 ids
    assert summation_group(0, 1000, 1000) == 32  # full participation
    assert summation_group(0, 5000, 200) == 300  # 12 members of a 4 % sample per 300 ids: 17 groups a round
    assert summation_group(0, 10_000, GROUP_FROM_CLIENTS) == 625  # 2 members, 16 groups
    assert summation_group(0, 10_000, 100) == 600  # 6 members, about 17 groups
    assert summation_group(0, 10_000, 128) == 625  # 8 members, 16 groups
    assert summation_group(7, 100, 10) == 7 and summation_group(500, 100, 10) == 100  # the user's, at most M


@pytest.mark.parametrize(
    "n_clients,group,ranks", [(100, 1, 3), (1000, 16, 2), (1000, 16, 7), (10, 4, 5), (161, 160, 2)]
)
def test_rank_blocks_are_whole_groups_and_cover_every_client_once(n_clients, group, ranks):
    blocks = [block_range(n_clients, ranks, r, group) for r in range(ranks)]
    assert [i for b in blocks for i in b] == list(range(n_clients))
    for b in blocks[:-1]:
        assert b.stop % group == 0 or b.stop == n_clients  # a block ends at a group's end
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= group + (n_clients % group)  # within one group (the last may be short)
    if group == 1:
        assert sizes == [len(range(r * n_clients // ranks, (r + 1) * n_clients // ranks)) for r in range(ranks)]


@pytest.mark.parametrize("size", [1, 3, 7, 50])
def test_chunks_hold_whole_groups(size):
    from fednest_mpi.federation import Participants

    ids = rng.sample_without_replacement(3, 1000, 300)
    part = Participants(ids=ids, local_slots=np.arange(40, 260), group=16)
    pieces = part.chunks(size)
    assert np.array_equal(np.concatenate([p.local_slots for p in pieces]), part.local_slots)
    groups = [set(p.local_ids // 16) for p in pieces]
    assert all(not (a & b) for i, a in enumerate(groups) for b in groups[i + 1 :])  # no group in two pieces
    for p, g in zip(pieces, groups):
        last = int(np.sum(p.local_ids // 16 == p.local_ids[-1] // 16))  # the members of the piece's last group
        # over the size only as one group alone, or by less than half of the last group (the nearest boundary)
        assert p.local_slots.size <= size or len(g) == 1 or 2 * (p.local_slots.size - size) <= last
        assert p.group == 16


def test_balanced_placement_keeps_a_groups_members_together():
    for key in range(5):
        ids = rng.sample_without_replacement(key, 1000, 300)
        rank = balanced_assignment(ids, 1000, 4, group=16)
        for g in np.unique(ids // 16):
            assert np.unique(rank[ids // 16 == g]).size == 1
        counts = np.bincount([rank[ids // 16 == g][0] for g in np.unique(ids // 16)], minlength=4)
        assert counts.max() - counts.min() <= 1  # groups, not members, are balanced


def test_group_sums_are_the_same_bits_in_any_chunk_and_match_the_float_sums():
    """The groups' sums computed from a group's rows alone: the same whatever piece the rows come in (other
    neighbours, another offset in memory), and each one the GEMM of its own rows."""
    import torch

    from fednest_mpi import exactsum
    from fednest_mpi.federation import _GroupDeposits

    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(60, 1001, dtype=torch.float64, generator=gen) * torch.logspace(-8, 8, 1001, dtype=torch.float64)
    ids = np.sort(rng.sample_without_replacement(1, 400, 60))
    w = torch.rand(60, dtype=torch.float64, generator=gen)

    def total(cuts):
        binned = exactsum.BinnedSum(1001, exactsum.bins_for(torch.float64))
        groups = _GroupDeposits(binned, 10)
        for lo, hi in zip(cuts, cuts[1:]):
            groups.add([rows[lo:hi].clone()], w[lo:hi], ids[lo:hi])
        groups.flush()
        return binned.value()

    starts = [int(i) for i in np.flatnonzero(np.diff(ids // 10)) + 1]  # where a new group begins
    whole, pieces = total([0, 60]), total([0, *starts[::3], 60])
    assert torch.equal(whole, pieces)
    direct = sum(w[ids // 10 == g] @ rows[ids // 10 == g] for g in np.unique(ids // 10))
    torch.testing.assert_close(whole, direct, rtol=1e-13, atol=0)


def test_a_shared_row_waits_across_pieces_and_gives_the_bits_of_one_deposit_per_piece():
    """FedOut's x - alpha h (one row shared by every member, stride 0) is deposited once for the copies of
    consecutive pieces: the same bits as a deposit per piece, and a different row or weight is deposited on its
    own (the exact sum of all of them)."""
    import torch

    from fednest_mpi import exactsum
    from fednest_mpi.federation import _ExactDeposits

    gen = torch.Generator().manual_seed(3)
    row = torch.randn(1, 513, dtype=torch.float32, generator=gen) * torch.logspace(-6, 6, 513)
    other = row * 1.5
    pieces = [(row, 7, 0.01), (row.clone(), 5, 0.01), (other, 3, 0.01), (row, 4, 0.02), (row, 2, 0.02)]

    def total(waiting: bool):
        binned = exactsum.BinnedSum(513, exactsum.bins_for(torch.float32))
        deposits = _ExactDeposits(binned, None)
        for r, n, w in pieces:
            weights = torch.full((n,), w, dtype=torch.float64)
            if waiting:
                deposits.add([r.expand(n, -1)], weights, np.arange(n), np.arange(n))
            else:
                binned.add(r.expand(n, -1), weights=weights)
        deposits.flush()
        return binned.value()

    assert torch.equal(total(True), total(False))
    direct = (0.12 * row.double() + 0.03 * other.double() + 0.12 * row.double())[0]
    torch.testing.assert_close(total(True), direct, rtol=1e-8, atol=0)  # float32 payload: 33 bits kept


def test_a_factored_forms_shared_part_is_deposited_once_for_the_round_by_the_first_members_piece():
    """Under summation groups a form's shared row (here FedIHGP's r - eta lambda v of mlp.GradientRows) is left
    out of the groups' sums and deposited once, times the round's total weight, where the round's first weighted
    member is: the same bits for any cut of the round into pieces (the first member in any of them), and the
    weighted sum of the dense rows to rounding."""
    import torch

    from fednest_mpi import exactsum
    from fednest_mpi.federation import _exact_deposits
    from fednest_mpi.problems.mlp import GradientRows

    gen = torch.Generator().manual_seed(4)
    C, d = 40, 3 * 5 + 3
    factors = [
        (
            torch.randn(C, 4, 3, generator=gen, dtype=torch.float64),
            torch.randn(C, 4, 5, generator=gen, dtype=torch.float64),
            torch.randn(C, 3, generator=gen, dtype=torch.float64),
        )
    ]
    rows = GradientRows(factors, torch.randn(d, generator=gen, dtype=torch.float64), scale=-0.3)
    ids = np.sort(rng.sample_without_replacement(2, 200, C))
    w = np.where(np.arange(C) < 3, 0.0, np.linspace(0.5, 1.5, C))  # the first weighted member: slot 3
    w = w / w.sum()

    def total(cuts):
        deposits = _exact_deposits([rows], "cpu", 10, w)
        for lo, hi in zip(cuts, cuts[1:]):
            deposits.add([rows.part(lo, hi)], torch.as_tensor(w[lo:hi]), ids[lo:hi], np.arange(lo, hi))
        deposits.flush()
        assert isinstance(deposits.binned, exactsum.BinnedSum)
        return deposits.binned.value()

    starts = [int(i) for i in np.flatnonzero(np.diff(ids // 10)) + 1]
    whole = total([0, C])
    assert torch.equal(whole, total([0, *starts[::2], C]))
    assert torch.equal(whole, total([0, starts[0], C]))
    torch.testing.assert_close(whole, torch.as_tensor(w) @ rows.dense(), rtol=1e-12, atol=1e-12)
