"""What every algorithm is to the runner: :class:`Algorithm` (the hooks it calls) and :class:`State`
(everything an algorithm carries from one outer iteration to the next beyond x, y and k).

The runner builds an algorithm from its parameter object (one of the frozen classes of
:data:`fednest_mpi.config.ALGORITHMS`), calls :meth:`Algorithm.step` once per outer iteration, and
for a checkpoint saves :attr:`Algorithm.state` as a whole (:meth:`State.replicated`,
:meth:`State.per_client`) and gives it back the same way (:meth:`State.restore`); x, y and the
counter k are saved by the runner, and k is the state of every random stream. No MPI, no HDF5.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.federation import Federation, Participants
from fednest_mpi.problems.base import BilevelProblem, is_shared, shared_rows
from fednest_mpi.recorder import OFF

ClientRows = dict[str, tuple[np.ndarray, torch.Tensor]]  # name -> (client ids, one row per id)


class ClientStore:
    """Per-client rows that persist across rounds, for the clients a rank hosts (``block``), stored
    compactly: a row exists only for a client that has been written (taken part), in a table that
    grows by doubling; every other client reads ``initial[name]``. Memory: (clients written so far)
    x (row length) numbers per name, not (hosted clients) x (row length) (docs/performance.md).
    :meth:`seen` tells which clients have been written.
    """

    def __init__(self, block: range, initial: dict[str, torch.Tensor]):
        self.block = block
        self.initial = {name: row.clone() for name, row in initial.items()}
        self.slot = np.full(len(block), -1, dtype=np.int64)  # row of each hosted client in the tables, -1: unwritten
        self.count = 0
        self.tables = {name: row.new_empty(0, row.shape[0]) for name, row in initial.items()}

    def _index(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < self.block.start or ids.max() >= self.block.stop):
            raise IndexError(f"clients {ids} are not all hosted here ({self.block})")
        return ids - self.block.start

    def get(self, name: str, ids: np.ndarray) -> torch.Tensor:
        slots = self.slot[self._index(ids)]
        out = self.initial[name].expand(slots.size, -1).clone()
        written = np.flatnonzero(slots >= 0)
        if written.size:
            device = out.device
            out[torch.as_tensor(written, device=device)] = self.tables[name][
                torch.as_tensor(slots[written], device=device)
            ]
        return out

    def seen(self, ids: np.ndarray) -> np.ndarray:
        return self.slot[self._index(ids)] >= 0

    def put(self, ids: np.ndarray, **rows: torch.Tensor) -> None:
        idx = self._index(ids)
        fresh = np.unique(idx[self.slot[idx] < 0])
        if fresh.size:
            self.slot[fresh] = np.arange(self.count, self.count + fresh.size)
            self.count += fresh.size
            for name, table in self.tables.items():
                if table.shape[0] < self.count:  # grow by doubling
                    grown = table.new_empty(max(self.count, 2 * table.shape[0]), table.shape[1])
                    grown[: table.shape[0]] = table
                    self.tables[name] = grown
        for name, value in rows.items():
            self.tables[name][torch.as_tensor(self.slot[idx], device=value.device)] = value

    def block_rows(self, name: str) -> torch.Tensor:
        """(hosted clients, row length): every hosted client's row (the unwritten ones: the initial row)."""
        return self.get(name, np.arange(self.block.start, self.block.stop))

    def block_sum(self, name: str) -> torch.Tensor:
        """Sum of every hosted client's row, without forming the unwritten ones: the written rows in
        client-id order (so a restored store sums exactly as the original) plus the initial row
        times the number of unwritten clients."""
        table = self.tables[name]
        written = table[torch.as_tensor(self.slot[self.slot >= 0], device=table.device)]
        return written.sum(0) + (len(self.block) - self.count) * self.initial[name]

    def export(self) -> ClientRows:
        """name -> (client ids written so far, their rows)."""
        ids = np.arange(self.block.start, self.block.stop)[self.slot >= 0]
        return {name: (ids, self.get(name, ids)) for name in self.tables}

    def load(self, states: ClientRows) -> None:
        for name, (ids, rows) in states.items():
            self.put(ids, **{name: rows.to(self.initial[name])})


@dataclass
class State:
    """An algorithm's state beyond (x, y, k), saved and restored as a whole.

    A subclass declares its parts as dataclass fields: a field holding a :class:`ClientStore` is
    per-client state (its rows are saved under the store's row names, by client id, in the per-rank
    files), every other field is a replicated tensor or None (saved on rank 0 under the field's
    name while it is not None). The base class has no parts: the FedNest family carries nothing
    across iterations.
    """

    def _parts(self):
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]

    def replicated(self) -> dict[str, torch.Tensor]:
        """The replicated tensors that exist, copied: name -> tensor."""
        return {name: v.clone() for name, v in self._parts() if isinstance(v, torch.Tensor)}

    def per_client(self) -> ClientRows:
        """This rank's hosted clients that have state so far: row name -> (ids, rows)."""
        out: ClientRows = {}
        for _, v in self._parts():
            if isinstance(v, ClientStore):
                out.update(v.export())
        return out

    def restore(self, replicated: dict[str, torch.Tensor], per_client: ClientRows) -> None:
        """Set what :meth:`replicated` and :meth:`per_client` saved; every entry of ``per_client``
        holds only (and all) the saved ids this rank hosts, in increasing order."""
        for name, v in self._parts():
            if isinstance(v, ClientStore):
                v.load({key: rows for key, rows in per_client.items() if key in v.tables})
            else:
                setattr(self, name, replicated.get(name))


class Algorithm(ABC):
    """Base of every algorithm: the hooks the runner calls and the keyed sampling every algorithm uses.

    Parameters
    ----------
    cfg : the algorithm's parameter object (a frozen class of :data:`fednest_mpi.config.ALGORITHMS`).
    problem : the rank's problem (oracles for the clients it hosts).
    fed : the federation (sampling, aggregation).
    seed : run seed; with ``k`` and the purpose it keys every random stream.

    Subclasses take the registry entry's ``options`` as keyword arguments, call ``super().__init__``
    and set :attr:`state` when they carry any. ``recorder`` (set by the runner;
    :data:`~fednest_mpi.recorder.OFF` by default) receives the per-client records.
    """

    recorder = OFF
    #: name -> (description, units) of every key :meth:`step` may return in its diagnostics: each becomes a
    #: column of the run file's /iterations (NaN in an iteration that does not report it); a key not declared
    #: here fails the run. Subclasses extend it: ``diagnostics = {**Algorithm.diagnostics, "name": (...)}``.
    diagnostics: dict[str, tuple[str, str]] = {
        "hypergradient_estimate_norm": (
            "||h||, the aggregated hypergradient estimate of FedOut (NaN for local variants)",
            "1",
        ),
    }

    def __init__(self, cfg, problem: BilevelProblem, fed: Federation, seed: int):
        self.cfg = cfg
        self.problem = problem
        self.fed = fed
        self.seed = seed
        self.state = State()

    @abstractmethod
    def step(self, k: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Outer iteration k (from 1): returns (x+, y+, diagnostics)."""

    @classmethod
    @abstractmethod
    def rounds_per_iteration(cls, cfg, **options) -> int:
        """Communication rounds (counted aggregations) of one outer iteration with parameters ``cfg``
        and the registry entry's ``options`` (deterministic FedIHGP for the FedNest family)."""

    # -- checkpoint hooks (docs/reliability.md): the state as a whole ------------------------------
    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """Replicated state beyond x and y that a restart needs."""
        return self.state.replicated()

    def client_states(self) -> ClientRows:
        """Persistent state of the hosted clients: name -> (client ids, one row per id)."""
        return self.state.per_client()

    def restore(self, global_state: dict[str, torch.Tensor], client_states: ClientRows) -> None:
        """Set what :meth:`checkpoint_state` and :meth:`client_states` saved (:meth:`State.restore`)."""
        self.state.restore(global_state, client_states)

    # -- helpers ---------------------------------------------------------------------------------
    def key(self, purpose: rng.Purpose, *counters):
        return rng.key(self.seed, int(purpose), *counters)

    def sample_clients(self, purpose: rng.Purpose, *counters) -> Participants:
        return self.fed.sample(self.key(purpose, *counters), self.cfg.clients_per_round)

    def factored(self, hook: str) -> bool:
        """Whether to ask the problem for the factored rows of ``hook`` (``gradient_rows``, ``hvp_rows``,
        ``hypergradient_rows``): only where the exact reduction sums by summation groups (Federation.sums_groups),
        and the problem offers the hook (which may still answer None: then the dense oracle)."""
        return self.fed.sums_groups and hasattr(self.problem, hook)

    def mean_y_side(self, S: Participants, rows, factored: bool = False) -> list[torch.Tensor]:
        """``fed.mean_over(S, rows)`` for rows of y-side oracles at the shared x (FedInn's anchor, the
        estimators' rounds), in chunks sized by the problem's
        :meth:`~fednest_mpi.problems.base.BilevelProblem.y_side_bytes` (``factored``: rows of a factored-row
        oracle, by :meth:`~fednest_mpi.problems.base.BilevelProblem.factored_rows_bytes` where it gives one).
        **Collective**."""
        client_bytes = (self.problem.factored_rows_bytes() if factored else None) or self.problem.y_side_bytes()
        return self.fed.mean_over(S, rows, client_bytes=client_bytes)

    @staticmethod
    def _rows(vector: torch.Tensor, n: int) -> torch.Tensor:
        return shared_rows(vector, n)


def active_rows(steps: np.ndarray, nu: int) -> np.ndarray | None:
    """The rows whose clients perform local step ``nu`` (0-based) of their own ``steps``
    (:meth:`~fednest_mpi.federation.Federation.local_steps`); None when all of them do."""
    active = np.flatnonzero(steps > nu)
    return None if active.size == steps.size else active


def take_rows(rows: torch.Tensor, index: np.ndarray | None) -> torch.Tensor:
    """``rows[index]`` (all rows for None), keeping a shared block (:func:`shared_rows`) shared, so that the
    oracles compute a row the same way whichever rows are taken with it."""
    if index is None:
        return rows
    if is_shared(rows):
        return shared_rows(rows[0], index.size)
    return rows[torch.as_tensor(index, device=rows.device)]


def put_rows(rows: torch.Tensor, index: np.ndarray | None, values: torch.Tensor) -> torch.Tensor:
    """``rows`` with the rows ``index`` replaced by ``values`` (``values`` itself for None; a new tensor)."""
    if index is None:
        return values
    out = rows.clone()
    out[torch.as_tensor(index, device=rows.device)] = values
    return out
