"""System heterogeneity: how much local work each client does, and which members of a round answer.

Two properties of the clients' devices, as pure functions of integer keys (:mod:`fednest_mpi.rng`), so that
every rank computes the same answer for a client without communication, and a resumed run the same answer as
an uninterrupted one (nothing is carried from one round to the next):

The parameters are the ``[heterogeneity]`` section (:class:`~fednest_mpi.config.HeterogeneityConfig`):

* **Local work.** With ``local_work = "uniform"``, client i performs, in a local phase whose configured number
  of steps is tau, tau_i steps drawn uniformly from {ceil(local_work_min tau), ..., tau} (at least one), from
  the stream (seed, LOCAL_WORK, i) -- the same for the whole run (``local_work_draw = "client"``) -- or
  (seed, LOCAL_WORK, k, i), redrawn every outer iteration k (``"iteration"``). One uniform number per client
  and draw serves every phase, so a slow client is slow in all of them. ``"full"`` (default): tau_i = tau.
* **Unavailability.** A member of a round's client set S fails to answer the round's aggregation (it computes
  nothing and sends nothing) with probability ``drop_probability``, from the stream (seed, ANSWERS, r, i) of
  the communication round r (the run's counted aggregations, 1, 2, ...: ``comm_rounds`` after it), and/or
  when the ``availability_trace`` says it is unavailable in round r: a (rounds, M) table of 0/1, row r - 1
  for round r, read cyclically when the run has more rounds than the table has rows. A client answers when
  both allow it.

The aggregation over the members that answered (plain weighting: their weights renormalised) and what a round
nobody answered returns are :meth:`fednest_mpi.federation.Federation.mean`'s; algorithms ask the federation
for :meth:`~fednest_mpi.federation.Federation.local_steps` and
:meth:`~fednest_mpi.federation.Federation.answering`. No MPI, no torch here.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fednest_mpi import rng
from fednest_mpi.config import HeterogeneityConfig
from fednest_mpi.errors import UsageError


def read_trace(path: str, n_clients: int) -> np.ndarray:
    """The availability table of ``path`` as a (rounds, n_clients) bool array; a :class:`UsageError`
    naming ``heterogeneity.availability_trace`` for a missing, unreadable or misshapen file."""
    field = "heterogeneity.availability_trace"
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{field}: no file {path!r}; give the path of a (rounds, clients) 0/1 table (.npy or .csv)")
    try:
        table = np.load(p, allow_pickle=False) if p.suffix == ".npy" else np.loadtxt(p, delimiter=",", ndmin=2)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{field}: cannot read {path!r} ({exc}); write a 0/1 table, one row per round") from None
    table = np.asarray(table)
    if table.ndim != 2 or table.shape[1] != n_clients or table.shape[0] == 0:
        raise UsageError(
            f"{field}: {path!r} has shape {table.shape}; it needs one row per round and one column per client "
            f"({n_clients} = problem.n_clients)"
        )
    if not np.isin(table, (0, 1)).all():
        raise UsageError(f"{field}: {path!r} holds values other than 0 and 1 (1 = the client is available)")
    return table.astype(bool)


class SystemModel:
    """The clients' local work and availability in a run with ``seed`` and M = ``n_clients`` clients, as
    ``params`` (the validated ``[heterogeneity]`` section) states them.

    Construction reads the availability trace, if any (every rank reads the same small file).
    """

    def __init__(self, params: HeterogeneityConfig, seed: int, n_clients: int):
        self.params, self.seed, self.n_clients = params, seed, n_clients
        self.trace = read_trace(params.availability_trace, n_clients) if params.availability_trace else None

    @property
    def drops(self) -> bool:
        """Whether any member of any round may fail to answer."""
        return self.params.drop_probability > 0.0 or self.trace is not None

    @property
    def varies_work(self) -> bool:
        """Whether clients may perform fewer local steps than configured."""
        return self.params.local_work != "full"

    def local_steps(self, ids: np.ndarray, k: int, steps: int) -> np.ndarray:
        """tau_i of each client of ``ids`` in outer iteration ``k`` for a phase of ``steps`` configured local
        steps (int64, in [1, steps]; ``steps`` for every client with ``local_work = "full"``)."""
        ids = np.asarray(ids, dtype=np.int64)
        if not self.varies_work or steps <= 1:
            return np.full(ids.shape, steps, dtype=np.int64)
        counters = (k, ids) if self.params.local_work_draw == "iteration" else (ids,)
        u = rng.uniform(rng.key(self.seed, int(rng.Purpose.LOCAL_WORK), *counters), 1)[..., 0]
        low = max(1, math.ceil(self.params.local_work_min * steps))
        return np.minimum(low + np.floor(u * (steps - low + 1)).astype(np.int64), steps)

    def answers(self, ids: np.ndarray, round_: int) -> np.ndarray:
        """Whether each client of ``ids`` answers communication round ``round_`` (1, 2, ...), a bool array."""
        ids = np.asarray(ids, dtype=np.int64)
        ok = np.ones(ids.shape, dtype=bool)
        if self.params.drop_probability > 0.0:
            u = rng.uniform(rng.key(self.seed, int(rng.Purpose.ANSWERS), round_, ids), 1)[..., 0]
            ok &= u >= self.params.drop_probability
        if self.trace is not None:
            ok &= self.trace[(round_ - 1) % self.trace.shape[0], ids]
        return ok


#: the system model of a federation built without one: every client answers and does the configured work
IDEAL = SystemModel(HeterogeneityConfig(), 0, 0)
