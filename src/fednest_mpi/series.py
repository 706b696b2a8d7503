"""The runner's side of the 2-D series of a run (docs/hdf5.md): per-client records, per-rank phase
times and snapshots of x and y, iteration by iteration.

Every rank writes the rows of its hosted clients to its own file before the per-iteration
bookkeeping reduction, so a reader who sees iteration k in the run file also finds it in every
per-rank file. The phase times travel in that same reduction (one slot per rank, summed), so rank
0 writes them without another collective.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from fednest_mpi.federation import block_range
from fednest_mpi.io.clients import ClientFile, MainSeries, SeriesLayout, parallel_hdf5
from fednest_mpi.recorder import OFF, ClientRecorder, local_phase_vector, phase_times

logger = logging.getLogger(__name__)


def records_clients(cfg) -> bool:
    """Whether a run of ``cfg`` records per-client series: asked for, and each client evaluated on
    the rank that hosts its row (block placement)."""
    return cfg.run.client_series and cfg.federation.placement == "block"


def series_layout(sim, keep_rows: int | None = None) -> SeriesLayout:
    """The 2-D groups of ``sim``'s run file (``keep_rows``: resuming after iteration keep_rows - 1)."""
    cfg, fed = sim.cfg, sim.fed
    x, _ = sim.problem.initial_point()
    return SeriesLayout(
        run_path=Path(cfg.run.output),
        n_clients=cfg.problem.n_clients,
        blocks=tuple(block_range(fed.n_clients, fed.size, r, fed.group) for r in range(fed.size)),
        client_series=records_clients(cfg),
        snapshot_every=cfg.run.snapshot_every,
        dim_x=sim.problem.dim_x,
        dim_y=sim.problem.dim_y,
        dtype=str(x.cpu().numpy().dtype),
        keep_rows=keep_rows,
        cpu_classes=tuple(sim.cpu_classes),
    )


class RunSeries:
    """One rank's recorder, client file and (rank 0) writer of phase times and snapshots.

    Construct on every rank after rank 0 has created the run file with
    ``RunWriter(..., extend=series_layout(sim, keep_rows).create)``. **Collective** (one barrier:
    the common clock origin, and the point after which the per-rank files may be opened).
    """

    def __init__(self, sim, writer=None, keep_rows: int | None = None):
        cfg, fed = sim.cfg, sim.fed
        self.fed = fed
        self.every, self.last = cfg.run.snapshot_every, cfg.algorithm.outer_iterations
        if cfg.run.client_series and not records_clients(cfg) and fed.rank == 0:
            logger.warning(
                "run.client_series: no per-client series with federation.placement = %r (clients move "
                "between ranks); use placement = 'block' to record them",
                cfg.federation.placement,
            )
        if records_clients(cfg) and parallel_hdf5() and fed.rank == 0:
            logger.info(
                "h5py is built with parallel HDF5; the per-client series still use per-rank files (docs/hdf5.md)"
            )
        self.recorder = ClientRecorder(fed.block) if records_clients(cfg) else OFF
        sim.algorithm.recorder = fed.recorder = self.recorder  # the federation records answered / dropped rounds
        self.writer = writer
        self.main = MainSeries(writer.file) if writer is not None else None
        fed.round_times = []
        self.origin = fed.synchronized_clock()
        self.file = None
        self.completed = keep_rows or 0  # iterations whose bookkeeping reduction this rank completed
        if self.recorder.enabled and len(fed.block):
            self.file = ClientFile(cfg.run.output, fed.rank, fed.block, append=keep_rows is not None)

    def before_bookkeeping(self, k: int, algorithm_seconds: float) -> np.ndarray:
        """Write this rank's client rows of iteration k; return its slot of the phase-time table
        (ranks x (1 + 2R) numbers, zero outside this rank's row), to be summed over the ranks."""
        if self.file is not None:
            assert isinstance(self.recorder, ClientRecorder)  # a client file exists only when records are kept
            self.file.append(k, self.recorder.take())
        local = local_phase_vector(algorithm_seconds, self.fed.take_round_times(), self.origin)
        slots = np.zeros((self.fed.size, local.size))
        slots[self.fed.rank] = local
        return slots.ravel()

    def client_digests(self, iterations: int) -> np.ndarray | None:
        """The digests of the first ``iterations`` columns of this rank's client series (what a checkpoint sums
        over the ranks: :func:`fednest_mpi.io.clients.column_digests`), or None when it records none."""
        return np.asarray(self.file.digests[:iterations], dtype=np.uint64) if self.file is not None else None

    def lost(self) -> str | None:
        """Why one of this rank's files is no longer the one it writes (deleted or replaced mid-run), or None."""
        for f in (self.writer, self.file):
            why = f.lost() if f is not None else None
            if why:
                return why
        return None

    def after_bookkeeping(self, k: int, table: np.ndarray, x, y) -> None:
        """Rank 0: write iteration k's phase times (``table``: the summed slots) and a due snapshot,
        before the run file's row (which flushes the file)."""
        self.completed = k + 1
        if self.main is None:
            return
        due = self.every > 0 and (k % self.every == 0 or k == self.last)
        self.main.append(k, phase_times(table.reshape(self.fed.size, -1)), (x, y) if due else None)

    def close(self, iterations: int | None = None) -> None:
        """Close this rank's client file, cut to ``iterations`` if given (:attr:`completed` after a
        NaN stop, whose iteration never completes: its column is dropped)."""
        if self.file is not None:
            self.file.close(iterations)
