"""The simulation loop: build problem, federation and algorithm, iterate, record, stream to HDF5.

Used by the command line and by tests (call :func:`simulate` with ``COMM_SELF`` for the 1-rank
reference of an N-rank run).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from fednest_mpi.algorithms import build_algorithm
from fednest_mpi.config import RunConfig
from fednest_mpi.federation import Federation, torch_device
from fednest_mpi.problems import ORACLES, build_problem

logger = logging.getLogger(__name__)

FAULT_ENV = "FEDNEST_MPI_INJECT_FAULT"  # "rank:iteration": raise on that rank (tests of the abort path)

BOOKKEEPING = {
    "iteration": ("outer iteration k (0 = initial point)", "1"),
    "comm_rounds": ("cumulative communication rounds (aggregations), paper Table 2", "1"),
    "comm_bytes": ("cumulative bytes of aggregated buffers, per rank", "B"),
    "comm_seconds": ("cumulative wall time inside Allreduce on rank 0", "s"),
    "wall_time": ("wall time since the start of the loop", "s"),
    "algorithm_time": ("wall time of the iteration's algorithm part on rank 0", "s"),
    "evaluation_time": ("wall time of the iteration's evaluation", "s"),
    "hypergradient_estimate_norm": ("||h||, the aggregated hypergradient estimate of FedOut (NaN for local variants)", "1"),
}
ORACLE_COLUMNS = {f"oracle_{name}": (f"cumulative {name} oracle calls, summed over clients", "1") for name in ORACLES}


@dataclass
class RunResult:
    """Final iterates and the per-iteration record (identical on every rank)."""

    x: torch.Tensor
    y: torch.Tensor
    history: dict[str, list] = field(default_factory=dict)


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[name]


def _fault_iteration(rank: int) -> int | None:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return None
    r, k = spec.split(":")
    return int(k) if int(r) == rank else None


class Simulation:
    """A run of ``cfg`` on ``comm``: problem, federation and algorithm, built on every rank.

    Construction and :meth:`run` are **collective** over ``comm``.
    """

    def __init__(self, cfg: RunConfig, comm):
        torch.set_num_threads(cfg.run.torch_threads)
        self.cfg = cfg
        self.fed = Federation(comm, cfg.problem.n_clients, cfg.federation.reduction, cfg.federation.wait, cfg.federation.placement)
        if self.fed.node_rank == 0 and self.fed.node_size * cfg.run.torch_threads > (os.cpu_count() or 1):
            logger.warning("%d ranks x %d torch threads exceed the node's %d cores: lower run.torch_threads", self.fed.node_size, cfg.run.torch_threads, os.cpu_count())
        device = torch_device(cfg.run.device, self.fed.node_rank)  # local rank -> GPU
        self.problem = build_problem(cfg.problem, cfg.seed, self.fed.block, device=device, dtype=torch_dtype(cfg.run.dtype))
        self.algorithm = build_algorithm(cfg.algorithm, self.problem, self.fed, cfg.seed)

    def columns(self) -> dict[str, tuple[str, str]]:
        """name -> (description, units) of every per-iteration value :meth:`run` records."""
        cols = dict(BOOKKEEPING)
        cols.update(ORACLE_COLUMNS)
        cols.update(self.problem.metric_info())
        return cols

    def run(self, writer=None, progress=None) -> RunResult:
        """Iterate Algorithm 1 for ``outer_iterations`` steps, recording after each.

        Parameters
        ----------
        writer : object with ``append(row)`` (rank 0's :class:`~fednest_mpi.io.h5.RunWriter`) or None.
        progress : callable ``(k, row)`` called after every iteration (rank 0's display) or None.
        """
        cfg, fed, problem = self.cfg, self.fed, self.problem
        fault_at = _fault_iteration(fed.rank)
        x, y = problem.initial_point()
        history: dict[str, list] = {}
        start = time.perf_counter()

        def record(k: int, alg_seconds: float, diag: dict) -> None:
            t0 = time.perf_counter()
            metrics = problem.evaluate(x, y)
            eval_seconds = time.perf_counter() - t0
            finite = all(math.isfinite(v) for v in metrics.values()) and bool(torch.isfinite(x).all() and torch.isfinite(y).all())
            # one small bookkeeping reduction: oracle counts (sum) and the health of every rank
            totals = fed.sum_uncounted(np.concatenate([problem.counts_vector(), [0.0 if finite else 1.0]]))
            if totals[-1] > 0:
                raise FloatingPointError(f"iteration {k}: the iterates or metrics became NaN/Inf (diverged); lower the step sizes")
            row = {
                "iteration": k,
                "comm_rounds": fed.stats.rounds,
                "comm_bytes": fed.stats.bytes,
                "comm_seconds": fed.stats.seconds,
                "wall_time": time.perf_counter() - start,
                "algorithm_time": alg_seconds,
                "evaluation_time": eval_seconds,
                "hypergradient_estimate_norm": diag.get("hypergradient_estimate_norm", math.nan),
            }
            row.update({f"oracle_{name}": float(c) for name, c in zip(ORACLES, totals[:-1])})
            row.update(metrics)
            for name, value in row.items():
                history.setdefault(name, []).append(value)
            if writer is not None:
                writer.append(row)
            if progress is not None:
                progress(k, row)

        record(0, 0.0, {})
        for k in range(1, cfg.algorithm.outer_iterations + 1):
            if fault_at == k:
                raise RuntimeError(f"fault injected by {FAULT_ENV} at iteration {k}")
            t0 = time.perf_counter()
            x, y, diag = self.algorithm.step(k, x, y)
            record(k, time.perf_counter() - t0, diag)
        return RunResult(x=x, y=y, history=history)


def simulate(cfg: RunConfig, comm, writer=None, progress=None) -> RunResult:
    """Build and run a :class:`Simulation`. **Collective** over ``comm``."""
    return Simulation(cfg, comm).run(writer, progress)


class Progress:
    """Rank 0's progress: a tqdm bar on a terminal, else one log line every ``log_every`` iterations."""

    def __init__(self, total: int, mode: str, log_every: int, keys=("outer_objective", "x_error", "comm_rounds")):
        self.total, self.log_every, self.keys = total, log_every, keys
        use_bar = mode == "always" or (mode == "auto" and sys.stderr.isatty())
        self.bar = None
        if use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="it", file=sys.stderr, dynamic_ncols=True)

    def __call__(self, k: int, row: dict) -> None:
        summary = {key: row[key] for key in self.keys if key in row}
        if self.bar is not None:
            if k > 0:
                self.bar.update(1)
            self.bar.set_postfix({kk: f"{v:.3g}" for kk, v in summary.items()}, refresh=False)
        elif k % self.log_every == 0 or k == self.total:
            text = " ".join(f"{kk}={v:.4g}" for kk, v in summary.items())
            logger.info("iteration %d/%d %s wall=%.2fs", k, self.total, text, row["wall_time"])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
