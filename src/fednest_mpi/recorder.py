"""What a run records beyond its per-iteration row: per-client records and per-rank phase times.

No MPI and no HDF5 here (the runner moves the numbers, :mod:`fednest_mpi.io.clients` stores them).

**Per-client records.** An algorithm reports, for the clients this rank evaluates, in which role
each took part in the current outer iteration and a few local quantities, through the
:class:`ClientRecorder` the runner gives it (``algorithm.recorder``; :data:`OFF` when nobody
stores them, which skips their computation). Roles are bits of a mask (paper Algorithms 2-6):

* :data:`INNER` (1) -- a member of a FedInn / LFedInn client set (Alg. 4 / 6);
* :data:`IHGP` (2)  -- a member of a FedIHGP client set S_n (Alg. 3);
* :data:`OUTER` (4) -- a member of the FedOut / LFedOut client set (Alg. 2 / 5).

A value reported twice in one iteration (a client in two of the T FedInn rounds) keeps the last.
The federation counts, per client, the counted aggregations of the iteration it answered and those it
was a member of but did not answer (:mod:`fednest_mpi.heterogeneity`): :data:`ROUND_COUNTS`.

**Per-rank phase times.** :func:`phase_times` splits every rank's algorithm time of one iteration
into local computation, waiting and transfer, from the enter/exit times of its counted
aggregations (:attr:`fednest_mpi.federation.Federation.round_times`): an ``Allreduce`` cannot
finish before the last rank has entered it, so a rank that enters round j at e_j waits
``max_r e_{r,j} - e_j`` for the others and spends the rest of the call, until it leaves, in the
reduction itself ("wait at N x N" of Scalasca).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fednest_mpi.io import schema as S

INNER, IHGP, OUTER = 1, 2, 4

#: per-client counts of the iteration's aggregations the client answered / was a member of and did not answer,
#: kept by the federation (:meth:`ClientRecorder.answered`)
ROUND_COUNTS = ("answered_rounds", "dropped_rounds")
#: per-client value series an algorithm may report: every series of the run file's /clients but the roles and
#: the round counts (declared once, with dtype, fill, description and units, in io/schema.CLIENT_SERIES; docs/hdf5.md)
CLIENT_VALUES = tuple(name for name in S.CLIENT_SERIES if name != "participation" and name not in ROUND_COUNTS)


def row_norms(rows) -> torch.Tensor:
    """Euclidean norm of every row of a (B, d) tensor, or of a factored form's rows from its factors
    (its ``row_norms()``, e.g. :class:`~fednest_mpi.problems.representation.OuterProductRows`): a per-client
    series never forms the dense rows that the summation groups avoid."""
    if not isinstance(rows, torch.Tensor):
        return rows.row_norms()
    return torch.linalg.vector_norm(rows, dim=1)


class ClientRecorder:
    """One outer iteration's records of the clients ``hosted`` (a range of client ids) by this rank."""

    enabled = True

    def __init__(self, hosted: range):
        self.hosted = hosted
        self._reset()

    def _reset(self) -> None:
        n = len(self.hosted)
        self.roles = np.zeros(n, dtype=np.uint8)
        self.values = {name: np.full(n, np.nan) for name in CLIENT_VALUES}
        self.rounds = {name: np.zeros(n, dtype=np.uint16) for name in ROUND_COUNTS}

    def _rows(self, ids) -> np.ndarray:
        rows = np.asarray(ids, dtype=np.int64) - self.hosted.start
        if rows.size and (rows.min() < 0 or rows.max() >= len(self.hosted)):
            raise ValueError(
                f"clients {ids} are not all hosted by this rank ({self.hosted}); "
                "per-client records need block placement"
            )
        return rows

    def took_part(self, ids, role: int) -> None:
        """Clients ``ids`` are members of a client set of the given role in this iteration."""
        self.roles[self._rows(ids)] |= np.uint8(role)

    def answered(self, answered_ids, dropped_ids) -> None:
        """One counted aggregation: the members ``answered_ids`` answered it, ``dropped_ids`` did not."""
        self.rounds["answered_rounds"][self._rows(answered_ids)] += np.uint16(1)
        self.rounds["dropped_rounds"][self._rows(dropped_ids)] += np.uint16(1)

    def record(self, name: str, ids, compute: Callable[[], torch.Tensor | None]) -> None:
        """Store ``compute()`` (one number per client of ``ids``, or None when the problem has no such
        value) as the clients' ``name`` of this iteration; ``compute`` is not called when recording is off."""
        if name not in self.values:
            raise KeyError(f"per-client series {name!r} is not declared in io/schema.CLIENT_SERIES ({CLIENT_VALUES})")
        values = compute()
        if values is not None:
            self.values[name][self._rows(ids)] = values.detach().to("cpu", torch.float64).numpy()

    def take(self) -> dict[str, np.ndarray]:
        """This iteration's records (``participation``, :data:`CLIENT_VALUES` and :data:`ROUND_COUNTS`, one
        entry per hosted client, NaN / 0 for non-participants); starts the next iteration."""
        out = {"participation": self.roles, **self.values, **self.rounds}
        self._reset()
        return out


class _Off:
    """The recorder of a run that stores no per-client series: records nothing, computes nothing."""

    enabled = False

    def took_part(self, ids, role: int) -> None:
        pass

    def answered(self, answered_ids, dropped_ids) -> None:
        pass

    def record(self, name: str, ids, compute) -> None:
        pass


OFF = _Off()

#: per-rank phase series (name -> meaning); see docs/hdf5.md
PHASES = ("compute_seconds", "wait_seconds", "transfer_seconds")


def local_phase_vector(algorithm_seconds: float, round_times: np.ndarray, clock_origin: float) -> np.ndarray:
    """This rank's entry for the bookkeeping reduction: [algorithm seconds, enter time of every
    counted aggregation of the iteration (relative to the common ``clock_origin``), exit times]."""
    rt = np.asarray(round_times, dtype=np.float64).reshape(-1, 2) - clock_origin
    return np.concatenate([[algorithm_seconds], rt[:, 0], rt[:, 1]])


def phase_times(per_rank: np.ndarray) -> dict[str, np.ndarray]:
    """Split each rank's algorithm time into compute, wait and transfer seconds.

    ``per_rank`` is (ranks, 1 + 2R): every rank's :func:`local_phase_vector` of one iteration with R
    aggregations. Wait in round j = min(exit, max over ranks of enter) - enter (>= 0); transfer =
    the rest of the time in the call; compute = algorithm time - time in calls.
    """
    per_rank = np.asarray(per_rank, dtype=np.float64)
    alg = per_rank[:, 0]
    n_rounds = (per_rank.shape[1] - 1) // 2
    enter, leave = per_rank[:, 1 : 1 + n_rounds], per_rank[:, 1 + n_rounds :]
    last_enter = enter.max(axis=0, initial=-np.inf)[None, :]
    wait = np.clip(np.minimum(leave, last_enter) - enter, 0.0, None).sum(axis=1)
    in_calls = (leave - enter).sum(axis=1)
    return {"compute_seconds": alg - in_calls, "wait_seconds": wait, "transfer_seconds": in_calls - wait}
