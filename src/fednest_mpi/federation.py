"""The MPI shell: where clients live, who takes part in a round, and counted aggregation.

This is the only module that issues MPI collectives for the algorithms. Algorithms see two
primitives (paper notation: S is a round's client set):

* :meth:`Federation.sample` -- draw S uniformly without replacement from all M clients with a
  counter-based key (the same set on every rank, no communication), and tell this rank which
  members of S it evaluates;
* :meth:`Federation.mean` -- the weighted mean over S of one or several flat vectors, fused into
  **one** ``Allreduce`` of one contiguous buffer, counted as one communication round.

Placement (``placement``): ``"block"`` -- a contiguous block of client ids per rank
(:func:`block_range`; ranks may hold no client), and a rank evaluates the members of S it hosts;
``"balanced"`` -- every round, every rank evaluates floor or ceil(|S|/P) members of S, members staying
on their block's rank unless it has more than its share (:func:`balanced_assignment`). Balanced placement needs
every rank to be able to evaluate any client: :attr:`Federation.hosted` is then all M clients
(problems with stored data keep every client's samples on every rank -- 188 MB of MNIST images
per rank -- and the synthetic problem generates any client from its id), and algorithms without
per-client state that persists across rounds (config validation refuses balanced placement for
FedBiO / FedBiOAcc, whose y^(m) live on the hosting rank).
Results do not depend on the placement, the chunk size or the number of ranks, bit for bit, with the
default ``reduction = "exact"`` (:mod:`fednest_mpi.exactsum`: the sum over S is exact, so its grouping
cannot show) and with ``"ordered"``; with ``"sum"`` only up to floating-point rounding.

Devices: with ``run.device = "cuda"`` every rank takes GPU ``node rank mod GPUs per node``
(:func:`torch_device`). Aggregation buffers on a GPU go through one reused pinned host buffer,
or straight to MPI when it reports CUDA support (:func:`cuda_aware_mpi`).
"""

from __future__ import annotations

import ctypes
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fednest_mpi import exactsum, rng
from fednest_mpi.comm import mpi, wtime
from fednest_mpi.errors import UsageError
from fednest_mpi.heterogeneity import IDEAL, SystemModel
from fednest_mpi.recorder import OFF


def block_range(n_clients: int, size: int, rank: int, group: int = 1) -> range:
    """Client ids hosted by ``rank``: a contiguous block of whole summation groups (``group`` consecutive ids,
    :func:`summation_group`); block sizes differ by at most one group (one client with groups of one)."""
    n_groups = -(-n_clients // group)
    return range(min(n_clients, rank * n_groups // size * group), min(n_clients, (rank + 1) * n_groups // size * group))


#: the automatic summation group (:func:`summation_group`): groups of one below this many clients per round (where
#: a group would hold fewer than two members of a round; every reference run, figure and MNIST benchmark record
#: has at most 10 wide clients per round and keeps the client-by-client bits), else about GROUP_MEMBERS members of a
#: round's client set per group, and at least MIN_GROUPS groups a round. 32, not 128 (until 2026-12-07, fourth
#: session): at 32 / 64 / 100 clients per round hyper-representation 1.27x / 1.74x / 2.0x and loss tuning 1.37x /
#: 2.25x / 2.6x less CPU per iteration (docs/lab/issue34.md, seventh session)
GROUP_FROM_CLIENTS = 32
#: 32, not 16: half the exact deposits and group products per round (loss tuning's targets -7 %, FedAvg's -6 %,
#: docs/lab/issue34.md, sixth session), at the price of half the ranks that can hold a round's groups
GROUP_MEMBERS = 32
#: fewer members per group in rounds under GROUP_MEMBERS * MIN_GROUPS clients, so that as many ranks can hold them
MIN_GROUPS = 16
#: plain rows narrower than this are summed client by client even with summation groups (:func:`_exact_deposits`)
GROUP_MIN_WIDTH = 4096


def summation_group(setting: int, n_clients: int, clients_per_round: int) -> int:
    """Consecutive client ids per summation group of the exact reduction (``federation.group_clients``; 0:
    automatic). Automatic: 1 (every client's row summed exactly) when fewer than :data:`GROUP_FROM_CLIENTS`
    clients take part in a round, else ``m * M // |S|`` ids with ``m = min(GROUP_MEMBERS, |S| // MIN_GROUPS)``,
    so that a round's client set has about m members in each group (32 from 512 clients per round; 8 at 128,
    2 at 32, in 16 groups). Depends on the config only, never on the ranks or the chunk size."""
    if setting > 0:
        return min(setting, n_clients)
    if clients_per_round < GROUP_FROM_CLIENTS:
        return 1
    members = min(GROUP_MEMBERS, clients_per_round // MIN_GROUPS)
    return max(1, min(n_clients, members * n_clients // clients_per_round))


def group_starts(group_of: np.ndarray) -> np.ndarray:
    """Where each run of equal entries of ``group_of`` (the group of each member, in increasing order) begins."""
    return np.flatnonzero(np.concatenate([[True], group_of[1:] != group_of[:-1]])) if group_of.size else group_of


def balanced_assignment(ids: np.ndarray, n_clients: int, size: int, group: int = 1) -> np.ndarray:
    """The rank that evaluates each member of S (``ids`` in increasing order) under balanced
    placement: every rank gets floor(|S|/P) or ceil(|S|/P) members (the extra ones go to the ranks
    with the most members in their own block), and a member stays on its home rank (the one whose
    block holds it) unless that rank has more than its share; the surplus members, in id order,
    fill the other ranks in rank order. So the fewest members possible leave home (their
    features cached at home stay useful), and every rank derives the same answer from S alone.
    With summation groups of ``group`` ids the groups that have members in S are assigned so (a group's
    members stay together: each rank gets floor or ceil of the groups over P)."""
    if group > 1:
        first = group_starts(ids // group)
        per_group = balanced_assignment(ids[first] // group, -(-n_clients // group), size)
        return np.repeat(per_group, np.diff(np.concatenate([first, [ids.size]])))
    home = np.searchsorted([block_range(n_clients, size, r).stop for r in range(size)], ids, side="right")
    counts = np.bincount(home, minlength=size)
    base, extra = divmod(ids.size, size)
    target = np.full(size, base)
    target[np.lexsort((np.arange(size), -counts))[:extra]] += 1
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])  # ids are sorted, so a block's members are contiguous
    keep = np.arange(ids.size) - first[home] < target[home]
    rank = np.where(keep, home, -1)
    rank[~keep] = np.repeat(np.arange(size), target - np.minimum(counts, target))
    return rank


@dataclass(frozen=True)
class Participants:
    """A round's client set S as seen from one rank.

    ``ids`` is the whole of S in increasing client-id order (identical on every rank); the
    ``local_slots`` index into ``ids`` and select the members this rank evaluates.
    """

    ids: np.ndarray
    local_slots: np.ndarray
    group: int = 1  # consecutive client ids per summation group (:func:`summation_group`)

    @property
    def local_ids(self) -> np.ndarray:
        return self.ids[self.local_slots]

    @property
    def size(self) -> int:
        return int(self.ids.size)

    def chunks(self, size: int) -> list[Participants]:
        """This rank's members in consecutive pieces of at most ``size`` (0: one piece), each a
        :class:`Participants` of the same S; always at least one piece (empty on a rank without
        members, so that every rank evaluates the same shapes and reaches the same collectives). With summation
        groups of more than one id a piece holds whole groups, cut at the group boundary nearest to ``size``
        members (so over it by less than half a group; one group alone when it has more than ``size``)."""
        slots = self.local_slots
        if size <= 0 or slots.size <= size:
            return [self]
        if self.group == 1:
            cuts = list(range(0, slots.size, size))
        else:
            cuts = [0]
            starts = group_starts(self.ids[slots] // self.group)
            for lo, hi in zip(starts, np.append(starts[1:], slots.size)):  # cut at the boundary nearest to size
                if hi - cuts[-1] > size and lo > cuts[-1] and hi - cuts[-1] - size >= size - (lo - cuts[-1]):
                    cuts.append(int(lo))
        bounds = zip(cuts, cuts[1:] + [slots.size])
        return [Participants(ids=self.ids, local_slots=slots[lo:hi], group=self.group) for lo, hi in bounds]


def dense(rows, lo: int = 0, hi: int | None = None) -> torch.Tensor:
    """The (hi - lo, d) tensor of rows lo..hi-1 of a block (all by default): a slice of ``rows`` itself, or a
    factored form's ``dense(lo, hi)`` (e.g. :class:`~fednest_mpi.problems.shared_start.LowRankRows`)."""
    return rows[lo:hi] if isinstance(rows, torch.Tensor) else rows.dense(lo, hi)


def _dense_block(rows: list, lo: int = 0, hi: int | None = None) -> torch.Tensor:
    """Rows lo..hi-1 of the (B, sum d_k) concatenation of a piece's blocks of rows (factored forms made dense)."""
    return torch.cat([dense(r, lo, hi) for r in rows], dim=1) if len(rows) > 1 else dense(rows[0], lo, hi)


#: the exact reduction makes a factored form's rows (or several blocks' rows) dense and deposits them tile by
#: tile, so the copy never grows with |S|: tiles of _EXACT_TILE_BYTES, at least _EXACT_TILE_ROWS rows. A block
#: that is one plain tensor is deposited whole (no copy; the kernel blocks it for the cache itself).
_EXACT_TILE_BYTES = 1 << 24
_EXACT_TILE_ROWS = 8


class _ExactDeposits:
    """The deposits of one exact reduction on this rank into ``binned``, piece by piece (:meth:`add`), then
    :meth:`flush` before the collectives. The sum is exact, so neither the tiling nor the waiting changes a bit:

    * plain rows are deposited in tiles of whole rows (a factored form's made dense a tile at a time, so the copy
      never grows with |S|); with summation groups (``groups``, a :class:`_GroupDeposits`; None for groups of one)
      each group's sum instead;
    * a row shared by every member of a piece (stride 0, e.g. FedOut's x - alpha h at tau = 1) with one weight
      is deposited once for all, with or without groups, and waits while the next pieces share the same row
      and weight: n copies cost one deposit (:meth:`~fednest_mpi.exactsum.BinnedSum.add`), not one per piece;
    * with groups, the part of a factored form that every client's row holds once (its ``shared_row``, e.g. the
      starting weights of FedAvg's local models) is left out of the groups' sums and deposited once for the
      round, times the round's total weight ``shared_weight`` (a correctly rounded sum of all members' weights,
      the same on every rank), by the one rank that holds the round's slot ``first_slot`` (its first member
      with a weight): the same decomposition of the sum on any number of ranks and chunks, without a pass over
      the shared row per group."""

    def __init__(
        self, binned: exactsum.BinnedSum, groups: _GroupDeposits | None, first_slot: int = 0, shared_weight=1.0
    ):
        self.binned, self.groups = binned, groups
        self.shared: tuple[torch.Tensor, torch.Tensor] | None = None  # (the (1, d) row, its (1,) weight)
        self.copies = 0
        self.first_slot, self.shared_weight = first_slot, shared_weight
        self.round_shared: list[tuple[int, torch.Tensor]] | None = None  # (offset, shared row) of the forms

    def add(self, rows: list, weights: torch.Tensor, ids: np.ndarray, slots: np.ndarray) -> None:
        """Deposit ``weights[b] * row_b`` of a piece's rows (``ids``: their clients, increasing; ``slots``: their
        places in the round)."""
        if len(rows) == 1 and isinstance(rows[0], torch.Tensor) and rows[0].stride(0) == 0:
            self._add_shared(rows[0], weights)
        elif len(rows) == 1 and isinstance(rows[0], torch.Tensor) and self.groups is None:
            self.binned.add(rows[0], weights=weights)
        elif self.groups is not None:
            forms = self.groups.add(rows, weights, ids)
            if forms and self.round_shared is None and bool(np.any(slots == self.first_slot)):
                self.round_shared = [(at, form.shared_row()) for at, form in forms]
        else:
            d = sum(int(r.shape[1]) for r in rows)
            size = torch.empty((), dtype=rows[0].dtype).element_size()
            tile = max(_EXACT_TILE_ROWS, _EXACT_TILE_BYTES // (d * size))
            for lo in range(0, int(weights.shape[0]), tile):
                self.binned.add(_dense_block(rows, lo, lo + tile), weights=weights[lo : lo + tile])

    def _add_shared(self, rows: torch.Tensor, weights: torch.Tensor) -> None:
        if not bool((weights == weights[0]).all()):
            self.binned.add(rows, weights=weights)
            return
        row, weight = rows[:1], weights[:1]
        if self.shared is not None:
            waiting, waiting_weight = self.shared
            if not (bool(weight == waiting_weight) and row.shape == waiting.shape and torch.equal(row, waiting)):
                self._deposit_shared()
        if self.shared is None:
            self.shared = (row, weight)
        self.copies += int(rows.shape[0])

    def _deposit_shared(self) -> None:
        if self.shared is not None:
            row, weight = self.shared
            self.binned.add(row.expand(self.copies, -1), weights=weight.expand(self.copies))
            self.shared, self.copies = None, 0

    def flush(self) -> None:
        """Deposit what waits: the shared row's copies, the summation groups' sums and the forms' shared part."""
        self._deposit_shared()
        if self.groups is not None:
            self.groups.flush()
        if self.round_shared:
            row = torch.zeros((1, self.binned.bins.shape[1]), dtype=self.round_shared[0][1].dtype)
            for at, part in self.round_shared:
                row[0, at : at + part.shape[0]] = part
            weight = torch.tensor([self.shared_weight], dtype=torch.float64, device=self.binned.bins.device)
            self.binned.add(row.to(self.binned.bins.device), weights=weight)
            self.round_shared = []  # deposited: once for the round


def _exact_deposits(rows: list, device, group: int, w: np.ndarray) -> _ExactDeposits:
    """The deposits into a new binned sum of an exact reduction of rows like a piece's ``rows`` (blocks of (B,
    d_k) rows, d = sum d_k), with summation groups' sums when the groups hold more than one client id and the rows
    are at least :data:`GROUP_MIN_WIDTH` wide or factored (a form that sums a group from its factors, one small
    product instead of forming its rows).
    Narrower plain rows cost less to deposit one by one than a product per group: each client's row exactly, as
    with groups of one. d and the rows' type are fixed by the config and the call site, so the choice is the
    same on every rank and in every chunk. ``w``: the round's weights (:class:`_ExactDeposits`: the shared part
    of factored forms)."""
    d, factored = sum(int(r.shape[1]) for r in rows), any(hasattr(r, "group_sum") for r in rows)
    binned = exactsum.BinnedSum(d, exactsum.bins_for(rows[0].dtype), device=device)
    groups = _GroupDeposits(binned, group) if group > 1 and (d >= GROUP_MIN_WIDTH or factored) else None
    positive = np.flatnonzero(w > 0)
    return _ExactDeposits(binned, groups, int(positive[0]) if positive.size else 0, math.fsum(w.tolist()))


#: group sums wait in a buffer of at most this many bytes (and _GROUP_BUFFER_ROWS rows) and are deposited
#: together: the exact sum's cost per call grows with d, whatever the rows
_GROUP_BUFFER_BYTES = 1 << 25
_GROUP_BUFFER_ROWS = 64


class _GroupDeposits:
    """The summation groups' sums of one exact reduction on this rank (:func:`summation_group`), each computed
    in the rows' precision from the group's rows alone, so the same bits in any chunk, then deposited exactly
    into ``binned`` a buffer at a time (the sum is exact, so the buffering changes no bit)."""

    def __init__(self, binned: exactsum.BinnedSum, group: int):
        self.binned, self.group, self.n = binned, group, 0
        self.buffer: torch.Tensor | None = None  # (rows, d), made at the first group

    def add(self, rows: list, weights: torch.Tensor, ids: np.ndarray) -> list[tuple[int, Any]]:
        """Each group's sum_b w_b row_b of a piece's rows (``ids``: their clients, increasing): a factored form by
        its own ``group_sum`` (e.g. one GEMM of the factors of :class:`~fednest_mpi.problems.shared_start.\
LowRankRows`), plain rows (and a factored form without it, made dense) by one (1, m) x (m, d) GEMM (strict
        MKL, :mod:`fednest_mpi.numerics`: the same bits for the same shapes wherever the rows lie). A factored
        form with a ``shared_row`` (a part every client's row holds once) is summed without it: returns such
        forms with their offsets in the row, whose shared part :class:`_ExactDeposits` adds once for the round."""
        d, dtype = sum(int(r.shape[1]) for r in rows), rows[0].dtype
        offsets = np.cumsum([0] + [int(r.shape[1]) for r in rows])[:-1].tolist()
        forms = [(at, r) for at, r in zip(offsets, rows) if hasattr(r, "group_sum") and hasattr(r, "shared_row")]
        if self.buffer is None:
            size = torch.empty((), dtype=dtype).element_size()
            n_rows = max(1, min(_GROUP_BUFFER_ROWS, _GROUP_BUFFER_BYTES // (d * size)))
            self.buffer = torch.empty((n_rows, d), dtype=dtype, device=weights.device)
        starts = group_starts(ids // self.group)
        w = weights.to(dtype)
        for lo, hi in zip(starts.tolist(), np.append(starts[1:], ids.size).tolist()):
            if self.n == self.buffer.shape[0]:
                self.flush()
            at, self.n = 0, self.n + 1
            for r in rows:
                target = self.buffer[self.n - 1, at : at + int(r.shape[1])]
                at += int(r.shape[1])
                if hasattr(r, "shared_row"):
                    r.group_sum(lo, hi, w[lo:hi], target, shared=False)
                elif hasattr(r, "group_sum"):
                    r.group_sum(lo, hi, w[lo:hi], target)
                else:
                    torch.mm(w[None, lo:hi], dense(r, lo, hi), out=target[None])
        return forms

    def flush(self) -> None:
        """Deposit the waiting sums."""
        if self.n and self.buffer is not None:
            self.binned.add(self.buffer[: self.n])
            self.n = 0


def _weighted_sum(rows: list, w: torch.Tensor) -> torch.Tensor:
    """sum_b w_b rows[b] of each block, concatenated. Plain tensors go through one product of their
    concatenation; a factored form computes its own ``weighted_sum(w)`` without forming its rows."""
    if all(isinstance(r, torch.Tensor) for r in rows):
        rows = [r.contiguous() if r.stride(0) == 0 else r for r in rows]  # a shared row: the product of its copies
        return w @ (torch.cat(rows, dim=1) if len(rows) > 1 else rows[0])
    return torch.cat([w @ r if isinstance(r, torch.Tensor) else r.weighted_sum(w) for r in rows])


#: the values of ``federation.reduction`` (:meth:`Federation.mean`)
REDUCTIONS = ("exact", "sum", "ordered")


@dataclass
class CommStats:
    """Cumulative communication of the algorithm (one round = one aggregation)."""

    rounds: int = 0
    bytes: int = 0  # bytes of the reduced buffer, per rank (what each rank sends)
    seconds: float = 0.0  # wall time spent inside Allreduce on this rank


class Federation:
    """Placement, sampling and aggregation of clients on an MPI communicator.

    Parameters
    ----------
    comm : mpi4py communicator (``MPI.COMM_WORLD``, ``MPI.COMM_SELF`` or a sub-communicator) or a
        :class:`~fednest_mpi.comm.SerialComm` (one rank, no MPI).
    n_clients : M, the number of clients.
    reduction : ``"exact"``, ``"sum"`` or ``"ordered"`` (see :meth:`mean`).
    group : consecutive client ids per summation group of the exact reduction (:func:`summation_group`): a
        round's rows are summed group by group in floating point, the groups' sums exactly.
    wait : how a rank waits for a collective: ``"block"`` (MPI's own wait, which busy-polls in
        MPICH), ``"poll"`` (a non-blocking collective tested in a loop that yields the core), or
        ``"auto"``: poll when this node runs more ranks than the cores this process may use.
        Oversubscribed busy-polling ranks starve each other (docs/performance.md).

    Notes
    -----
    **Collective** construction (``wait="auto"`` asks MPI how many ranks share the node).
    """

    def __init__(
        self,
        comm,
        n_clients: int,
        reduction: str = "exact",
        wait: str = "auto",
        placement: str = "block",
        system: SystemModel = IDEAL,
        group: int = 1,
    ):
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if wait not in ("auto", "block", "poll"):
            raise ValueError(f"wait must be 'auto', 'block' or 'poll', got {wait!r}")
        if placement not in ("block", "balanced"):
            raise ValueError(f"placement must be 'block' or 'balanced', got {placement!r}")
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.node_rank, self.node_size = node_layout(comm)
        self.poll = wait == "poll" or (wait == "auto" and self.node_size > len(os.sched_getaffinity(0)))
        self.placement = placement
        self._host: torch.Tensor | None = None  # pinned staging buffer for device aggregation
        self._cuda_aware: bool | None = None
        self.n_clients = n_clients
        self.reduction = reduction
        #: consecutive client ids per summation group of the exact reduction (:func:`summation_group`; 1 with
        #: the other reductions): a rank hosts and a chunk holds whole groups
        self.group = group if reduction == "exact" else 1
        self.block = block_range(n_clients, self.size, self.rank, self.group)
        # the clients whose data this rank needs: its block, or every client when any rank may evaluate any client
        self.hosted = self.block if placement == "block" else range(n_clients)
        self.stats = CommStats()
        self.evaluation_stats = CommStats()  # evaluation-only aggregations (:meth:`evaluation_sum`)
        self.chunk_clients = (
            0  # members a rank evaluates at once in mean_over (0: all); set by the run from its memory budget
        )
        self.block_bytes = 0  # that budget in bytes (0: none), for calls that state their own bytes per client
        self.fixed_chunk = False  # chunk_clients was set by the user (run.chunk_clients): no call may change it
        self.round_times: list[tuple[float, float]] | None = None  # a list: record (enter, exit) of every round
        #: the clients' local work and availability (:mod:`fednest_mpi.heterogeneity`; default: ideal clients)
        self.system = system
        self.answer_counts = np.zeros(2, dtype=np.int64)  # members that answered / dropped since take_answer_counts
        self.recorder = OFF  # per-client records of answered and dropped rounds (set by the run's series)

    @property
    def sums_groups(self) -> bool:
        """Whether the exact reduction sums the rows of a round by summation groups of several clients: then a
        problem may hand them over factored (a form with ``group_sum``), but each client's rows must take the
        same form in every chunk, since a group's sum of factors and of dense rows round differently."""
        return self.group > 1

    # ---------------------------------------------------------------------------------------
    def sample(self, key, size: int) -> Participants:
        """Draw S (``size`` clients, uniformly without replacement) from the stream ``key``.

        No communication: every rank derives the same S from the key.
        """
        ids = rng.sample_without_replacement(key, self.n_clients, size)
        if self.placement == "balanced":
            local = np.nonzero(balanced_assignment(ids, self.n_clients, self.size, self.group) == self.rank)[0]
        else:
            local = np.nonzero((ids >= self.block.start) & (ids < self.block.stop))[0]
        return Participants(ids=ids, local_slots=local, group=self.group)

    # -- system heterogeneity (heterogeneity.py) -----------------------------------------------
    def local_steps(self, ids: np.ndarray, k: int, steps: int) -> np.ndarray:
        """The local steps each client of ``ids`` performs in outer iteration ``k`` in a phase of ``steps``
        configured steps (:meth:`SystemModel.local_steps`; ``steps`` for every client by default)."""
        return self.system.local_steps(ids, k, steps)

    def answering(self, part: Participants) -> np.ndarray:
        """Which members of S (a bool mask over ``part.ids``) answer the **next** counted aggregation
        (:meth:`mean` / :meth:`mean_over`), the same on every rank; all of them by default."""
        if not self.system.drops:
            return np.ones(part.size, dtype=bool)
        return self.system.answers(part.ids, self.stats.rounds + 1)

    def take_answer_counts(self) -> tuple[int, int]:
        """(members that answered, members that dropped) summed over the counted aggregations since the
        last call (the run's per-iteration columns ``clients_answered`` / ``clients_dropped``)."""
        answered, dropped = (int(c) for c in self.answer_counts)
        self.answer_counts[:] = 0
        return answered, dropped

    def _answered_part(self, part: Participants, weights) -> tuple[Participants, np.ndarray | None]:
        """The members of ``part`` this rank evaluates among those that answer the next aggregation, and
        the weights with the others' set to zero (unchanged: ``part`` and ``weights`` when all answer);
        counts and records the answers."""
        answered = self.answering(part)
        n_answered = int(answered.sum())
        self.answer_counts += (n_answered, part.size - n_answered)
        local = answered[part.local_slots]
        self.recorder.answered(part.local_ids[local], part.local_ids[~local])
        if n_answered == part.size:
            return part, weights
        w = np.ones(part.size) if weights is None else np.asarray(weights, dtype=np.float64)
        answered_part = Participants(ids=part.ids, local_slots=part.local_slots[local], group=part.group)
        return answered_part, np.where(answered, w, 0.0)

    # ---------------------------------------------------------------------------------------
    def mean(
        self,
        part: Participants,
        vectors: list[torch.Tensor],
        weights: np.ndarray | None = None,
        fallback: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Weighted mean over S of each of ``vectors``, in one counted ``Allreduce``.

        Parameters
        ----------
        part : the round's client set.
        vectors : tensors of shape ``(len(part.local_slots), d_k)``: row j belongs to client
            ``part.local_ids[j]``. Several vectors aggregated in the same round are fused into one
            contiguous buffer.
        weights : per-member weights of S (shape ``(part.size,)``); uniform ``1/|S|`` when None,
            as in the paper. They are normalised to sum to one over the members that answer
            (:meth:`answering`; all of them without system heterogeneity).
        fallback : what the server keeps when no member answers (e.g. the current iterate, for an
            average of local iterates); zeros when None (a direction that moves nothing).

        Returns
        -------
        One tensor of shape ``(d_k,)`` per input vector, identical on every rank.

        Notes
        -----
        **Collective**: every rank of ``comm`` calls it in the same order, also ranks that hold no
        member of S (they contribute zeros). With ``reduction="exact"`` (the default) each rank adds its
        weighted rows into a binned exact sum (:class:`~fednest_mpi.exactsum.BinnedSum`); one
        ``Allreduce(MAX)`` of the coordinates' tops (one byte each) and one ``Allreduce(SUM)`` of the bins
        (2 or 3 float64 words per coordinate, whatever |S|) combine the ranks, and the result is bitwise
        independent of the number of ranks and of the chunk size. With ``reduction="sum"`` each rank adds its weighted
        rows and one ``Allreduce(SUM)`` of ``sum(d_k)`` numbers combines the ranks: the result
        depends on the number of ranks only through floating-point summation order. With
        ``reduction="ordered"`` the buffer holds one slot per member of S (``|S| * sum(d_k)``
        numbers, zeros where a rank has no member); after the ``Allreduce`` every entry holds a
        single client's value exactly, and every rank sums the slots in client-id order, so the
        result is bitwise independent of the number of ranks.
        """
        answered, weights = self._answered_part(part, weights)
        if answered is not part:  # the rows of the members that did not answer are dropped
            keep = torch.as_tensor(np.isin(part.local_slots, answered.local_slots), device=vectors[0].device)
            vectors = [v[keep] for v in vectors]
        return self._reduce(answered, [(answered, vectors)], weights, fallback)

    def configure_chunks(self, chunk_clients: int, block_bytes: int, client_bytes: int) -> None:
        """``run.chunk_clients`` (0: automatic), ``run.block_memory`` in bytes and the problem's
        default bytes per client (:meth:`BilevelProblem.client_bytes`): sets :attr:`chunk_clients`."""
        self.block_bytes, self.fixed_chunk = block_bytes, chunk_clients > 0
        self.chunk_clients = chunk_clients if self.fixed_chunk else max(1, block_bytes // max(1, client_bytes))

    def chunk_for(self, client_bytes: int | None) -> int:
        """Members per chunk for a call whose working set is ``client_bytes`` per client (None: the
        problem's default estimate, i.e. :attr:`chunk_clients`); the user's run.chunk_clients wins."""
        if client_bytes is None or self.fixed_chunk or self.block_bytes <= 0:
            return self.chunk_clients
        return max(1, self.block_bytes // max(1, client_bytes))

    def mean_over(
        self,
        part: Participants,
        local_rows,
        weights: np.ndarray | None = None,
        client_bytes: int | None = None,
        fallback: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """:meth:`mean` of rows that this rank computes chunk by chunk: ``local_rows(piece)`` returns,
        for a piece of :meth:`Participants.chunks` (at most :attr:`chunk_clients` members), one
        tensor ``(len(piece.local_slots), d_k)`` per vector. Each piece's rows are folded into the
        reduction buffer before the next piece is computed, so the working set is one chunk, not
        the round's members (with ``reduction="sum"``; the ordered buffer holds |S| slots).

        With ``reduction="ordered"`` the result is bitwise that of :meth:`mean` on all rows at once
        (each row lands in its slot, whatever the chunk); with ``"sum"`` it equals it to rounding
        (the weighted sum is accumulated chunk by chunk; one chunk: bitwise). ``client_bytes``: this
        call's working set per client when it differs from the problem's default (:meth:`chunk_for`).
        Members that do not answer (:meth:`answering`) are not evaluated; ``weights`` and ``fallback``
        as in :meth:`mean`. **Collective**."""
        answered, weights = self._answered_part(part, weights)
        pieces = answered.chunks(self.chunk_for(client_bytes))
        return self._reduce(answered, ((piece, local_rows(piece)) for piece in pieces), weights, fallback)

    def _reduce(self, part: Participants, pieces, weights, fallback=None) -> list[torch.Tensor]:
        """The reduction of :meth:`mean` over ``(piece, rows)`` pairs that cover this rank's members
        (``weights``: zero for the members that did not answer; ``fallback`` when all are zero)."""
        m = part.size
        total = None if weights is None else float(np.sum(weights))
        w = np.full(m, 1.0 / m) if weights is None else np.asarray(weights, dtype=np.float64) / (total or 1.0)
        buf, w_t, dims, deposits, dtype = None, None, [], None, None
        for piece, rows in pieces:
            rows = list(rows)
            if w_t is None:
                dims, dtype = [int(r.shape[1]) for r in rows], rows[0].dtype
                exact = self.reduction == "exact"
                w_t = torch.as_tensor(w, dtype=torch.float64 if exact else dtype, device=rows[0].device)
                if exact:
                    deposits = _exact_deposits(rows, w_t.device, part.group, w)
                elif self.reduction == "ordered":
                    buf = torch.zeros((m, sum(dims)), dtype=w_t.dtype, device=w_t.device)
            slots = torch.as_tensor(piece.local_slots, dtype=torch.long, device=w_t.device)
            if deposits is not None:
                if slots.numel():
                    deposits.add(rows, w_t[slots], piece.local_ids, piece.local_slots)
            elif self.reduction == "ordered":
                assert buf is not None
                buf[slots] = _dense_block(rows)
            elif slots.numel():
                weighted = _weighted_sum(rows, w_t[slots])
                buf = weighted if buf is None else buf.add_(weighted)
        assert w_t is not None and dtype is not None, "no piece of rows to reduce"
        payload = sum(dims) * torch.empty((), dtype=dtype).element_size()  # what the algorithm sends
        if deposits is not None:
            self._allreduce_binned_(payload, deposits)
            if total == 0.0 and fallback is not None:
                return list(fallback)
            return list(torch.split(deposits.binned.value().to(dtype), dims))
        if buf is None:  # a rank without members contributes zeros
            buf = torch.zeros(sum(dims), dtype=w_t.dtype, device=w_t.device)
        buf = buf.contiguous()
        self._allreduce_(buf, payload)
        if total == 0.0 and fallback is not None:  # no member answered: the server keeps what it has
            return list(fallback)
        if self.reduction == "sum":
            return list(torch.split(buf, dims))
        out = buf[0] * w_t[0]
        for s in range(1, m):
            out = out + buf[s] * w_t[s]
        return list(torch.split(out, dims))

    def _allreduce_binned_(self, payload: int, deposits: _ExactDeposits) -> None:
        """The two collectives of an exact aggregation, counted as one communication round of ``payload`` bytes
        (the aggregated vector, as for every reduction): MAX of the coordinates' tops (int8), then, every rank's
        bins aligned to them, SUM of the bins (after what waits in ``deposits`` is deposited)."""
        deposits.flush()
        self.stats.rounds += 1
        self.stats.bytes += payload
        if self.size == 1:
            return
        t0 = wtime(self.comm)
        self._combine_binned_(deposits.binned)
        t1 = wtime(self.comm)
        self.stats.seconds += t1 - t0
        if self.round_times is not None:
            self.round_times.append((t0, t1))

    def _allreduce_(self, buf: torch.Tensor, payload: int) -> None:
        """In-place SUM over ranks of a contiguous tensor; counted as one communication round of ``payload``
        bytes (the aggregated vector: the ordered reduction's buffer of one slot per member is the simulator's
        way to sum it, not what the algorithm sends)."""
        self.stats.rounds += 1
        self.stats.bytes += payload
        if self.size == 1:
            return
        if buf.device.type != "cpu":  # the kernels that produce buf are computation, not communication
            torch.cuda.current_stream(buf.device).synchronize()
        t0 = wtime(self.comm)
        if buf.device.type == "cpu":
            self._allreduce_array(buf.numpy())
        else:
            if self._cuda_aware is None:
                self._cuda_aware = cuda_aware_mpi()
            if self._cuda_aware:  # MPI reads and writes device memory (mpi4py takes __cuda_array_interface__)
                self._allreduce_array(buf)
            else:  # one contiguous copy to a reused pinned host buffer and back
                if self._host is None or self._host.numel() < buf.numel() or self._host.dtype != buf.dtype:
                    self._host = torch.empty(buf.numel(), dtype=buf.dtype, pin_memory=True)
                host = self._host[: buf.numel()]
                host.copy_(buf)
                self._allreduce_array(host.numpy())
                buf.copy_(host)
        t1 = wtime(self.comm)
        self.stats.seconds += t1 - t0
        if self.round_times is not None:
            self.round_times.append((t0, t1))

    def _combine_binned_(self, binned: exactsum.BinnedSum) -> None:
        """Every rank's binned sum made the sum over ranks: MAX of the tops (int8), bins aligned to them, SUM."""
        top = binned.top.to("cpu", torch.int8).numpy()
        self._allreduce_array(top, op=mpi().MAX)
        binned.align(torch.from_numpy(top).to(binned.top.device, torch.int64))
        bins = binned.bins.cpu().contiguous()
        self._allreduce_array(bins.numpy())
        binned.bins = bins.to(binned.bins.device)
        binned.empty = False  # the other ranks' bins are in it now

    def _allreduce_array(self, array, op=None) -> None:
        op = mpi().SUM if op is None else op
        if not self.poll:
            self.comm.Allreduce(mpi().IN_PLACE, array, op=op)
            return
        request = self.comm.Iallreduce(mpi().IN_PLACE, array, op=op)
        tries = 0
        while not request.Test():
            tries += 1
            if tries < 100:
                os.sched_yield()
            else:
                time.sleep(5e-5)

    # ---------------------------------------------------------------------------------------
    def synchronized_clock(self) -> float:
        """``MPI.Wtime()`` on this rank right after a barrier: every rank's reading of (nearly) the
        same instant, the common origin of the per-rank phase times. **Collective**."""
        if self.size > 1:
            self.comm.Barrier()
        return wtime(self.comm)

    def take_round_times(self) -> np.ndarray:
        """(enter, exit) ``MPI.Wtime()`` of every counted aggregation since the last call, shape (R, 2)
        (recorded once :attr:`round_times` is set to a list; ranks = 1 do not record)."""
        times = np.array(self.round_times or [], dtype=np.float64).reshape(-1, 2)
        self.round_times = []
        return times

    def block_slots(self, rows: np.ndarray) -> np.ndarray:
        """(n_clients, k) float64: this rank's block's per-client ``rows`` in their clients' slots,
        zero elsewhere; summed over ranks (:meth:`evaluation_sum`), every slot is exact, and
        :func:`sum_in_client_order` then gives a total that no rank count can change."""
        slots = np.zeros((self.n_clients, rows.shape[1]))
        slots[self.block.start : self.block.stop] = rows
        return slots

    def bookkeeping_sum(self, values: np.ndarray) -> np.ndarray:
        """SUM over ranks of a small float64 array for the runner's bookkeeping (oracle counts, health
        flags, stop requests): not traffic of the algorithm, so counted nowhere. **Collective**."""
        buf = np.ascontiguousarray(values, dtype=np.float64).copy()
        if self.size > 1:
            self._allreduce_array(buf)
        return buf

    def evaluation_exact_sum(self, rows: torch.Tensor) -> torch.Tensor:
        """The sum over every rank's ``rows`` (B_rank, d) of an evaluation-only quantity (as
        :meth:`evaluation_sum`), exact (:class:`~fednest_mpi.exactsum.BinnedSum`): float64 (d,), bitwise the same
        on any number of ranks. **Collective**."""
        binned = exactsum.BinnedSum(int(rows.shape[1]), exactsum.bins_for(rows.dtype), device=rows.device)
        binned.add(rows)
        if self.size > 1:
            self._combine_binned_(binned)
        self.evaluation_stats.rounds += 1
        self.evaluation_stats.bytes += int(rows.shape[1]) * 8  # the float64 vector it yields, as every reduction
        return binned.value()

    def evaluation_sum(self, values: np.ndarray) -> np.ndarray:
        """SUM over ranks of a float64 array that an algorithm needs only to *report* its iterate (e.g.
        FedBiO's population mean of the clients' own y): declared evaluation-only by calling this, it is
        tallied in :attr:`evaluation_stats`, not in :attr:`stats` (the paper's rounds and bytes). Every
        other aggregation of an algorithm goes through :meth:`mean_over` and is counted. **Collective**."""
        buf = self.bookkeeping_sum(values)
        self.evaluation_stats.rounds += 1
        self.evaluation_stats.bytes += buf.nbytes
        return buf


def sum_in_client_order(slots: np.ndarray) -> np.ndarray:
    """The sum of the rows of ``slots`` (one per client), added in client-id order."""
    total = slots[0].copy()
    for row in slots[1:]:
        total += row
    return total


def node_layout(comm) -> tuple[int, int]:
    """(this rank's index among the ranks of ``comm`` on its node, number of such ranks). **Collective**."""
    if comm.Get_size() == 1:
        return 0, 1
    node = comm.Split_type(mpi().COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def torch_device(kind: str, node_rank: int) -> torch.device:
    """``cpu``, or ``cuda:<node_rank mod GPUs on this node>`` (several ranks per GPU when ranks
    outnumber GPUs). Raises UsageError when CUDA is asked for and torch sees no GPU."""
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError(
            "run.device: 'cuda' was asked for but torch sees no CUDA device on this node "
            "(CPU-only torch build or no GPU); use run.device = 'cpu'"
        )
    device = torch.device("cuda", node_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def cuda_aware_mpi() -> bool:
    """Whether the MPI library says it can read CUDA device memory (Open MPI's
    ``MPIX_Query_cuda_support``; False when the symbol is absent, e.g. MPICH builds without it)."""
    try:
        query = ctypes.CDLL(None).MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return False
    query.restype = ctypes.c_int
    return bool(query())
