"""The simulation loop: build problem, federation and algorithm, iterate, record, stream to HDF5,
checkpoint (:mod:`fednest_mpi.checkpoint`) and resume.

Used by the command line and by tests (call :func:`simulate` with ``COMM_SELF`` for the 1-rank
reference of an N-rank run).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from fednest_mpi import checkpoint as ckpt_io
from fednest_mpi import consistency, contract, failure, numerics, rng
from fednest_mpi import stop as stop_module
from fednest_mpi.algorithms import build_algorithm
from fednest_mpi.algorithms.server import PREFIX as SERVER_STATE
from fednest_mpi.algorithms.server import ServerOptimizer
from fednest_mpi.allocator import keep_freed_memory
from fednest_mpi.callbacks import Callback, Callbacks
from fednest_mpi.config import RunConfig
from fednest_mpi.errors import ConfigError, DataError, OutputLost, RanksDisagree, UsageError
from fednest_mpi.federation import Federation, sum_in_client_order, summation_group, torch_device
from fednest_mpi.heterogeneity import SystemModel
from fednest_mpi.io.schema import DEFAULT_METRICS
from fednest_mpi.memory import check_memory
from fednest_mpi.problems import ORACLES, BilevelProblem, build_problem
from fednest_mpi.problems.base import shared_rows

logger = logging.getLogger(__name__)

# "rank:iteration[:kind]" injects a fault on that rank in that iteration (tests): raise (default) an
# exception before the step; nan: a NaN in x after the step; kill: SIGKILL itself after the step
# (mid-iteration); term: send itself SIGTERM before the step (a preemption notice); term2: twice (ends at once)
FAULT_ENV = "FEDNEST_MPI_INJECT_FAULT"

BOOKKEEPING = {
    "iteration": ("outer iteration k (0 = initial point)", "1"),
    "comm_rounds": ("cumulative communication rounds (aggregations), paper Table 2", "1"),
    "comm_bytes": ("cumulative bytes of aggregated buffers, per rank", "B"),
    "comm_seconds": ("cumulative wall time inside Allreduce on rank 0", "s"),
    "wall_time": ("wall time since the start of the loop", "s"),
    "algorithm_time": ("wall time of the iteration's algorithm part on rank 0", "s"),
    "evaluation_time": ("wall time of the iteration's evaluation", "s"),
}
#: the columns of a run whose clients may fail to answer (heterogeneity.drop_probability / availability_trace)
ANSWER_COLUMNS = {
    "clients_answered": ("members of the iteration's counted aggregations that answered, summed over its rounds", "1"),
    "clients_dropped": (
        "members of the iteration's counted aggregations that did not answer, summed over its rounds",
        "1",
    ),
}
ORACLE_COLUMNS = {f"oracle_{name}": (f"cumulative {name} oracle calls, summed over clients", "1") for name in ORACLES}


def diagnostic_values(algorithm: type, diag: dict) -> dict[str, float]:
    """The columns of the algorithm's declared :attr:`~fednest_mpi.algorithms.Algorithm.diagnostics` from
    one step's ``diag`` (NaN where it reports none; an undeclared key was refused by
    :func:`fednest_mpi.contract.check_step`)."""
    return {name: float(diag.get(name, math.nan)) for name in algorithm.diagnostics}  # type: ignore[attr-defined]


@dataclass
class RunResult:
    """Final iterates and the per-iteration record (identical on every rank)."""

    x: torch.Tensor
    y: torch.Tensor
    history: dict[str, list] = field(default_factory=dict)
    stopped_by: str | None = None  # the signal that stopped the run at a checkpoint before the last iteration


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[name]


def _fault(rank: int) -> tuple[int | None, str]:
    """(iteration, kind) of the fault :data:`FAULT_ENV` injects on ``rank``, or (None, "")."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return None, ""
    r, k, *kind = spec.split(":")
    return (int(k), kind[0] if kind else "raise") if int(r) == rank else (None, "")


USAGE_ERRORS = (UsageError, ConfigError, DataError, contract.PluginError)


def agree_on_usage_error(comm, error: UsageError | None) -> None:
    """Raise, on every rank, the usage error of the lowest rank that had one (if any did).

    **Collective** (one small allgather): construction steps that may fail on some ranks only
    (a data file one node cannot read) call it before any other collective of the run.
    """
    reports = comm.allgather(None if error is None else (type(error).__name__, str(error)))
    failed = [(rank, report) for rank, report in enumerate(reports) if report is not None]
    if not failed:
        return
    rank, (kind, message) = failed[0]
    cls = {c.__name__: c for c in USAGE_ERRORS}.get(kind, UsageError)
    if len(failed) < len(reports):
        message = f"rank {rank}/{len(reports)}: {message}"
    agreed = cls(message)
    agreed.agreed = True  # type: ignore[attr-defined]  # every rank raises it: no abort needed (session)
    raise agreed


def refuse_disagreement(comm, k: int, digest: int, every: int, agreed: int | None) -> None:
    """Raise :class:`~fednest_mpi.errors.RanksDisagree` on every rank, naming the ranks whose ``digest`` of (x, y)
    differs from rank 0's at iteration ``k`` (:func:`fednest_mpi.consistency.disagreement`).

    **Collective** (one small allgather), called by every rank once the bookkeeping reduction showed that
    the digests differ (:func:`fednest_mpi.consistency.agree`): the check's only collective of its own.
    """
    raise RanksDisagree(consistency.disagreement(k, comm.allgather(digest), every, agreed))


def broadcast_usage_error(comm, error: UsageError | None, root: int = 0) -> None:
    """Raise, on every rank, the usage error that ``root`` found (if it found one).

    **Collective** (one small bcast): for checks only ``root`` makes (rank 0 takes the output's
    lock), called before any other collective of the run, so every rank exits 2 together.
    """
    report = comm.bcast(None if error is None else (type(error).__name__, str(error)), root=root)
    if report is not None:
        kind, message = report
        raise {c.__name__: c for c in USAGE_ERRORS}.get(kind, UsageError)(message)


TRAINING_COLUMNS: dict[str, tuple] = {
    "outer_loss": (
        "mean over all clients of f_i(x, y) on their outer (validation) data "
        "(every run.train_eval_every iterations, else NaN)",
        "1",
    ),
    "inner_loss": (
        "mean over all clients of g_i(x, y) on their inner (training) data "
        "(every run.train_eval_every iterations, else NaN)",
        "1",
    ),
    "train_accuracy": (
        "accuracy on the inner (training) data of all clients (every run.train_eval_every iterations, else NaN)",
        "%",
        True,
    ),
}


def training_sums(problem, fed, x: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """([sum_i f_i, sum_i g_i, clients, correct, samples], slots) over the whole local data of the
    clients in this rank's block (NaN sums where the problem defines no value oracle), a chunk of
    clients at a time (:attr:`Federation.chunk_clients`), for the bookkeeping SUM over ranks. With
    ``federation.reduction = "exact"`` or ``"ordered"`` the two loss sums are left 0 and each client's (f_i, g_i) goes
    to its slot instead
    (:meth:`Federation.block_slots`, carried by the same bookkeeping reduction), so that the
    caller adds them in client-id order: bitwise the same on any number of ranks, as the iterates
    are; else ``slots`` is empty. The counts are integers, exact in any order. No MPI."""
    block, chunk = fed.block, max(1, fed.chunk_clients)
    values = np.full((block.stop - block.start, 2), np.nan)
    sums = np.zeros(5)
    with torch.no_grad():
        for lo in range(block.start, block.stop, chunk):
            ids = np.arange(lo, min(lo + chunk, block.stop))
            X, Y = shared_rows(x, ids.size), shared_rows(y, ids.size)
            for slot, v in ((0, problem.outer_value(ids, X, Y)), (1, problem.inner_value(ids, X, Y))):
                if v is not None:
                    values[ids - block.start, slot] = v.double().numpy(force=True)
            counts = problem.correct_counts(ids, X, Y)
            if counts is not None:
                sums[3] += float(counts[0].sum())
                sums[4] += float(counts[1].sum())
            sums[2] += ids.size
    if fed.reduction != "sum":
        return sums, fed.block_slots(values)
    sums[:2] = values.sum(0)
    return sums, np.zeros((0, 2))


def training_metrics(totals: np.ndarray, names) -> dict[str, float]:
    """The :data:`TRAINING_COLUMNS` in ``names`` from the summed :func:`training_sums`."""
    f, g, n, correct, samples = totals
    values = {
        "outer_loss": f / n if n else math.nan,
        "inner_loss": g / n if n else math.nan,
        "train_accuracy": 100.0 * correct / samples if samples else math.nan,
    }
    return {name: values[name] for name in names}


def _largest(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


class Bookkeeping:
    """The fields of the per-iteration bookkeeping reduction (one uncounted float64 ``Allreduce``), in
    buffer order with their lengths (None: whatever remains -- the per-rank phase times)."""

    VARIABLE = -1  # a length the caller states (the same on every rank)
    FIELDS: dict[str, int | None] = {
        "oracle_counts": len(ORACLES),
        "health": 3,  # failing ranks: count, sum of their ranks, those of them whose iterates are finite
        "stop_requests": 1,
        "lost_files": 1,  # ranks whose output file or client file was deleted or replaced
        "contract": 1,  # ranks whose plugin broke its contract in the step or the evaluation (contract.py)
        "training": 5,
        "training_slots": VARIABLE,  # per-client (f_i, g_i) with the ordered reduction, see training_sums
        "consistency": VARIABLE,  # run.check_consistency: the digest of (x, y), fednest_mpi.consistency.moments
        "phases": None,
    }

    @classmethod
    def pack(cls, **parts) -> np.ndarray:
        for name, size in cls.FIELDS.items():
            if size is not None and size != cls.VARIABLE and len(parts[name]) != size:
                raise ValueError(f"bookkeeping field {name}: {len(parts[name])} numbers, expected {size}")
        return np.concatenate([np.asarray(parts[name], dtype=np.float64).reshape(-1) for name in cls.FIELDS])

    @classmethod
    def unpack(cls, buffer: np.ndarray, **lengths: int) -> dict[str, np.ndarray]:
        """The fields of ``buffer``; ``lengths`` gives those of the VARIABLE fields (default 0)."""
        out, at = {}, 0
        for name, size in cls.FIELDS.items():
            size = lengths.get(name, 0) if size == cls.VARIABLE else size
            end = len(buffer) if size is None else at + size
            out[name], at = buffer[at:end], end
        return out


def _log_layout(cfg: RunConfig, fed: Federation) -> None:
    """On rank 0 (of the run or of the node): the summation groups when they hold more than one client (their
    size decides the bits), and one warning each when ranks would host no client (more ranks than groups) or
    the node's ranks times torch threads exceed its cores."""
    n_groups = -(-cfg.problem.n_clients // fed.group)
    if fed.rank == 0 and fed.group > 1:
        logger.info(
            "exact sums over %d summation groups of %d client ids (federation.group_clients)", n_groups, fed.group
        )
    if fed.rank == 0 and n_groups < fed.size:
        logger.warning(
            "%d ranks share %d summation groups of %d clients (federation.group_clients): %d ranks host no "
            "client; set federation.group_clients to at most %d to use them all",
            fed.size,
            n_groups,
            fed.group,
            fed.size - n_groups,
            max(1, cfg.problem.n_clients // fed.size),
        )
    if fed.node_rank == 0 and fed.node_size * cfg.run.torch_threads > (os.cpu_count() or 1):
        logger.warning(
            "%d ranks x %d torch threads exceed the node's %d cores: lower run.torch_threads",
            fed.node_size,
            cfg.run.torch_threads,
            os.cpu_count(),
        )


class Simulation:
    """A run of ``cfg`` on ``comm``: problem, federation and algorithm, built on every rank.

    Construction and :meth:`run` are **collective** over ``comm``. ``problem_wrapper`` (a public hook)
    replaces the built problem by ``problem_wrapper(problem)`` before the algorithm is built (bench/:
    the one-client-at-a-time baseline's oracles). Runs to files: :class:`fednest_mpi.session.Session`.
    """

    def __init__(self, cfg: RunConfig, comm, problem_wrapper=None):
        keep_freed_memory()
        try:  # before the first computation: which MKL, ATen and OpenBLAS paths compute the run
            paths, numerics_error = numerics.establish(cfg.run.numerics), None
        except ConfigError as exc:  # agreed on below with the other usage errors
            paths, numerics_error = numerics.in_force(), exc
        torch.set_num_threads(cfg.run.torch_threads)
        self.cfg = cfg
        #: numerics.in_force() on this rank: the code paths in force (run file attribute ``numerics``)
        self.numerics = {"mode": cfg.run.numerics, **paths}
        group = summation_group(cfg.federation.group_clients, cfg.problem.n_clients, cfg.algorithm.clients_per_round)
        self.fed = Federation(
            comm,
            cfg.problem.n_clients,
            cfg.federation.reduction,
            cfg.federation.wait,
            cfg.federation.placement,
            group=group,
        )
        _log_layout(cfg, self.fed)
        # no collective before the agreement: a usage error (missing or damaged data file, a data-dependent
        # config check) on any rank ends every rank with the same message
        error = numerics_error if numerics_error is not None else self._build(problem_wrapper)
        agree_on_usage_error(comm, error)
        #: numerics.cpu_class of every rank (one allgather): ranks of different classes may round differently
        self.cpu_classes = comm.allgather(numerics.cpu_class(paths))
        if self.fed.rank == 0 and len(set(self.cpu_classes)) > 1:
            logger.warning(
                "the ranks run on CPUs of %d classes (%s): results may differ in the last bits from a run on one "
                "class; /ranks/cpu_class says which rank ran where (run.numerics = 'portable' removes the vendor "
                "difference, docs/design.md)",
                len(set(self.cpu_classes)),
                " | ".join(sorted(set(self.cpu_classes))),
            )

    def _build(self, problem_wrapper) -> UsageError | None:
        """Build this rank's problem, algorithm and server optimiser, checking them at the plugin boundary
        (:mod:`fednest_mpi.contract`); no collective. The usage error that stopped it, or None."""
        cfg = self.cfg
        try:
            device = torch_device(cfg.run.device, self.fed.node_rank)  # local rank -> GPU
            # the clients' local work and availability (reads the availability trace, if any)
            self.fed.system = SystemModel(cfg.heterogeneity, cfg.seed, cfg.problem.n_clients)
            check_memory(cfg, len(self.fed.hosted), self.fed.node_size)  # before the problem allocates its data
            around = contract.surroundings()
            self.problem = build_problem(
                cfg.problem, cfg.seed, self.fed.hosted, device=device, dtype=torch_dtype(cfg.run.dtype)
            )
            contract.check_surroundings(self.problem, around)
            if problem_wrapper is not None:  # a public hook (bench/: the sequential baseline's oracles)
                self.problem = problem_wrapper(self.problem)
            # the plugin boundary (fednest_mpi.contract): the oracles' outputs, the algorithm's State
            contract.probe_problem(
                self.problem, self.fed.hosted, torch_dtype(cfg.run.dtype), int(rng.key(cfg.seed, rng.Purpose.PROBE))
            )
            self.algorithm = build_algorithm(cfg.algorithm, self.problem, self.fed, cfg.seed)
            contract.check_surroundings(self.algorithm, around)
            contract.check_state(self.algorithm)
            #: the most counted rounds one iteration may take (checked after each step: contract.check_rounds)
            self.declared_rounds = self._declared_rounds()
            #: the server optimiser of x (algorithm.server_optimizer; "none": the algorithm's own x)
            self.server = ServerOptimizer.of(cfg.algorithm)
            self.fed.configure_chunks(cfg.run.chunk_clients, cfg.run.block_memory * 2**20, self.problem.client_bytes())
        except UsageError as exc:
            return exc
        except MemoryError as exc:  # beyond the estimate of check_memory
            return UsageError(
                f"problem: the problem's data do not fit in this rank's memory ({exc}); "
                "lower problem.n_clients or the dimensions, or run on more nodes"
            )
        return None

    @property
    def primary_metric(self) -> str:
        """The problem's primary metric (``BilevelProblem.primary_metric``, else its first metric)."""
        return self.problem.primary_metric or next(iter(self.problem.metric_info()), "outer_objective")

    def columns(self) -> dict[str, tuple]:
        """name -> (description, units) of every per-iteration value :meth:`run` records."""
        cols = dict(BOOKKEEPING)
        cols.update(type(self.algorithm).diagnostics)
        if self.fed.system.drops:
            cols.update(ANSWER_COLUMNS)
        cols.update(ORACLE_COLUMNS)
        cols.update(self.problem.metric_info())
        for name, info in self._training_columns().items():
            cols[name] = info
        return cols

    def _training_columns(self) -> dict[str, tuple]:
        """The training-set columns this run records: none unless ``run.train_eval_every`` > 0;
        the problem's own metrics of the same name (closed forms) take precedence."""
        if self.cfg.run.train_eval_every <= 0:
            return {}
        kind, own = type(self.problem), self.problem.metric_info()
        defined = {
            "outer_loss": kind.outer_value is not BilevelProblem.outer_value,
            "inner_loss": kind.inner_value is not BilevelProblem.inner_value,
            "train_accuracy": kind.correct_counts is not BilevelProblem.correct_counts,
        }
        return {name: info for name, info in TRAINING_COLUMNS.items() if defined[name] and name not in own}

    def run(
        self,
        callbacks=(),
        checkpoint_dir=None,
        stop=None,
        resume: ckpt_io.Checkpoint | None = None,
        series=None,
        step_wrapper=None,
    ) -> RunResult:
        """Iterate Algorithm 1 up to ``outer_iterations``, recording after each step.

        Parameters
        ----------
        callbacks : objects told of the run's start, each evaluation, iteration and checkpoint, and its end
            or its exception (:mod:`fednest_mpi.callbacks`: e.g. ``Recorder(writer)``, rank 0's run file,
            :class:`Progress`, the writers of :mod:`fednest_mpi.writers`), in order.
        checkpoint_dir : folder for checkpoints (at iteration 0, every ``run.checkpoint_every``
            iterations, at the end and when stopped), or None for none.
        stop : object whose ``requested`` says that this rank received a stop signal and whose
            ``reached()`` is called once the ranks agreed to stop
            (:class:`~fednest_mpi.stop.StopRequests`) or None. The flag is OR-ed over the
            ranks in the per-iteration bookkeeping reduction, so all ranks stop after the same
            iteration, with a checkpoint.
        resume : continue after this checkpoint (from :func:`fednest_mpi.checkpoint.load`, read
            from ``checkpoint_dir``) instead of starting at the initial point.
        series : this rank's :class:`~fednest_mpi.series.RunSeries` (per-client rows, per-rank phase
            times, snapshots; the phase times ride in the bookkeeping reduction) or None.
        step_wrapper : a public hook: ``step_wrapper(step)`` returns the callable run for each outer
            iteration in place of the algorithm's ``step(k, x, y)`` (bench/: per-step CPU and faults).
        """
        loop = RunLoop(self, callbacks, checkpoint_dir, stop, resume, series)
        step = self.algorithm.step if step_wrapper is None else step_wrapper(self.algorithm.step)
        try:
            loop.hooks.call("on_start", self, loop.k)
            halt = loop.iterate_all(step, initial=resume is None)
        except BaseException as exc:  # noqa: BLE001 -- told to the callbacks, then raised again
            loop.hooks.tell_error(exc)
            raise
        stopped = halt and loop.k < self.cfg.algorithm.outer_iterations
        stopped_by = (stop.received or "a signal to another rank") if stopped else None
        result = RunResult(x=loop.x, y=loop.y, history=loop.history, stopped_by=stopped_by)
        loop.hooks.call("on_end", result)
        return result

    def _declared_rounds(self) -> int:
        """The most rounds one iteration may count: the algorithm's ``rounds_per_iteration``, and one more for
        the statistics of a pooled outer objective (``pools_outer_objective``)."""
        from fednest_mpi.config import ALGORITHMS

        spec = ALGORITHMS[self.cfg.algorithm.name]
        declared = type(self.algorithm).rounds_per_iteration(self.cfg.algorithm, **spec.options)
        contract.check_declared_rounds(self.algorithm, declared)
        return declared + int(spec.pools_outer_objective and self.problem.pooled_outer_objective)

    def _restore(self, resume: ckpt_io.Checkpoint, checkpoint_dir) -> tuple[torch.Tensor, torch.Tensor]:
        """Put the federation's counters and the algorithm's state where ``resume`` left them; (x, y)."""
        like = self.problem.initial_point()[0]
        stats = self.fed.stats
        stats.rounds, stats.bytes, stats.seconds = resume.comm_rounds, resume.comm_bytes, resume.comm_seconds
        error, clients = None, {}
        try:  # a client file missing or damaged since rank 0 checked them: every rank refuses together
            clients = ckpt_io.load_client_states(checkpoint_dir, resume, self.fed.block)
        except UsageError as exc:
            error = exc
        agree_on_usage_error(self.fed.comm, error)
        saved = {name: t.to(like.device) for name, t in resume.algorithm_state.items()}
        self.server.restore({name: t for name, t in saved.items() if name.startswith(SERVER_STATE)})
        self.algorithm.restore(
            {name: t for name, t in saved.items() if not name.startswith(SERVER_STATE)},
            {name: (ids, rows.to(like.device)) for name, (ids, rows) in clients.items()},
        )
        return resume.x.to(like.device), resume.y.to(like.device)


class RunLoop:
    """One call of :meth:`Simulation.run` in progress: the iterates x and y, the iteration k, the totals carried
    from a checkpoint and the history of the rows, with the steps of an outer iteration (the step, the
    evaluation and the bookkeeping reduction that agrees on it, the row, the checkpoint)."""

    def __init__(self, sim: Simulation, callbacks, checkpoint_dir, stop, resume: ckpt_io.Checkpoint | None, series):
        self.sim, self.hooks = sim, Callbacks(callbacks)
        self.checkpoint_dir, self.stop, self.series = checkpoint_dir, stop, series
        self.fault = _fault(sim.fed.rank)
        n_oracles = len(ORACLES)
        self.history: dict[str, list] = {}
        if resume is None:
            # copies: a problem that keeps its x0 and y0 and writes into them later must not move the iterates
            self.x, self.y = (t.clone() for t in sim.problem.initial_point())
            self.k, self.base_counts, self.base_wall = 0, np.zeros(n_oracles), 0.0
        else:
            self.x, self.y = sim._restore(resume, checkpoint_dir)
            self.k, self.base_wall = resume.iteration, resume.wall_time
            # rank 0 carries the saved totals, so the sum over ranks continues them
            self.base_counts = resume.oracle_totals.numpy() if sim.fed.rank == 0 else np.zeros(n_oracles)
        self.start = time.perf_counter()
        self.counts, self.wall = np.zeros(n_oracles), 0.0  # the last recorded row's totals (for a checkpoint)
        self.agreed: int | None = None  # the last iteration at which the ranks' digests agreed
        self.metric_names = tuple(sim.problem.metric_info())
        self.declared_rounds = sim.declared_rounds
        self.train_columns = list(sim._training_columns())
        self.check_every = sim.cfg.run.check_consistency

    def iterate_all(self, step, initial: bool) -> bool:
        """The iterations up to ``outer_iterations`` (``initial``: first record and checkpoint the initial point)
        with their checkpoints; True when a stop was requested."""
        K, every = self.sim.cfg.algorithm.outer_iterations, self.sim.cfg.run.checkpoint_every
        halt = False
        if initial:
            halt = self.record(0, 0.0, {})
            self.save(0)
        while self.k < K and not halt:
            halt = self.iterate(step)
            if halt or self.k == K or (every and self.k % every == 0):
                self.save(self.k)
        return halt

    def iterate(self, step) -> bool:
        """Outer iteration k + 1: ``step`` (the algorithm's, or the ``step_wrapper``'s), its contract, the server
        optimiser's update of x and the record; True when a stop was requested."""
        sim, fed = self.sim, self.sim.fed
        self.k += 1
        k, (fault_at, fault_kind) = self.k, self.fault
        if fault_at == k and fault_kind == "raise":
            raise RuntimeError(f"fault injected by {FAULT_ENV} at iteration {k}")
        if fault_at == k and fault_kind in ("term", "term2"):
            self._signal_self()
        if fault_at == k and fault_kind == "term2":  # a second signal, not the first's repeat: ends the run at once
            time.sleep(stop_module.SAME_NOTICE_SECONDS)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10.0)
        t0, rounds, versions = time.perf_counter(), fed.stats.rounds, contract.versions(self.x, self.y)
        failure.hook_entered(f"{contract.plugin_of(sim.algorithm)} hook step")  # named by a fatal signal's line
        try:
            out = step(k, self.x, self.y)
        finally:
            failure.hook_left()
        broken = (
            contract.violation(contract.check_step, sim.algorithm, out, self.x, self.y)
            or contract.violation(contract.check_kept, sim.algorithm, versions, self.x, self.y)
            or contract.violation(
                contract.check_rounds, sim.algorithm, self.declared_rounds, fed.stats.rounds - rounds, k
            )
        )
        diag = {}
        if broken is None:
            proposed, self.y, diag = out
            self.x = sim.server.step(self.x, proposed)
        if fault_at == k and fault_kind == "nan":
            self.x = torch.full_like(self.x, math.nan)
        if fault_at == k and fault_kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return self.record(k, time.perf_counter() - t0, diag, broken)

    def _signal_self(self) -> None:
        """The injected SIGTERM, waited for (up to 5 s) until the stop handlers' reader thread has noted it: the
        signal arrives during this iteration, so its bookkeeping carries the stop request, however the threads
        are scheduled (without the wait, a short iteration could reach its bookkeeping first)."""
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while self.stop is not None and not self.stop.requested and time.monotonic() < deadline:
            time.sleep(0.001)

    def record(self, k: int, alg_seconds: float, diag: dict, broken: contract.PluginError | None = None) -> bool:
        """Evaluate, agree on the contract (``broken``: the step's violation on this rank), health and stop
        requests, record; True when a stop was requested."""
        sim, x, y = self.sim, self.x, self.y
        t0 = time.perf_counter()
        metrics: dict = {}
        if broken is None:
            metrics = sim.problem.evaluate(x, y)
            broken = contract.violation(contract.check_metrics, sim.problem, metrics, self.metric_names)
        if broken is not None:
            metrics = {}
        train_due = bool(self.train_columns) and k % sim.cfg.run.train_eval_every == 0
        train, slots = training_sums(sim.problem, sim.fed, x, y) if train_due else (np.zeros(5), np.zeros((0, 2)))
        check_due = bool(self.check_every) and sim.fed.size > 1 and k % self.check_every == 0  # one rank agrees
        digest = consistency.digest(x, y) if check_due else 0
        eval_seconds = time.perf_counter() - t0
        totals, lost = self._bookkeeping(k, alg_seconds, metrics, broken, train, slots, check_due, digest)
        n_stop = self._agree(k, totals, broken, lost, check_due, digest)
        self.hooks.call("on_evaluation", k, metrics)
        row = self._row(k, alg_seconds, eval_seconds, diag, metrics, totals, train_due)
        for name, value in row.items():
            self.history.setdefault(name, []).append(value)
        if self.series is not None:
            self.series.after_bookkeeping(k, totals["phases"], x, y)
        self.hooks.call("on_iteration", k, row)
        self.counts, self.wall = totals["oracle_counts"], row["wall_time"]
        return n_stop > 0

    def _bookkeeping(self, k, alg_seconds, metrics, broken, train, slots, check_due, digest) -> tuple[dict, str | None]:
        """The one bookkeeping reduction: oracle counts (sum), the health of every rank (count of failing
        ranks, sum of their ranks), stop requests and the training-set sums (or their client slots); the totals
        and this rank's lost file (or None)."""
        fed, series, stop = self.sim.fed, self.series, self.stop
        iterates = contract.all_finite(self.x) and contract.all_finite(self.y)
        finite = iterates and all(math.isfinite(v) for v in metrics.values())
        health = [0.0, 0.0, 0.0] if finite else [1.0, float(fed.rank), float(iterates)]
        phases = series.before_bookkeeping(k, alg_seconds) if series is not None else []
        lost = series.lost() if series is not None else None
        totals = Bookkeeping.unpack(
            fed.bookkeeping_sum(
                Bookkeeping.pack(
                    oracle_counts=self.sim.problem.counts_vector() + self.base_counts,
                    health=health,
                    stop_requests=[1.0 if stop is not None and stop.requested else 0.0],
                    lost_files=[1.0 if lost else 0.0],
                    contract=[0.0 if broken is None else 1.0],
                    training=train,
                    training_slots=slots,
                    consistency=consistency.moments(digest) if check_due else [],
                    phases=phases,
                )
            ),
            training_slots=slots.size,
            consistency=2 * consistency.PIECES if check_due else 0,
        )
        if slots.size:  # the exact and ordered reductions: the loss sums in client-id order
            totals["training"][:2] = sum_in_client_order(totals["training_slots"].reshape(-1, 2))
        return totals, lost

    def _agree(self, k: int, totals: dict, broken, lost: str | None, check_due: bool, digest: int) -> float:
        """Act on what the reduction told every rank alike: a stop request (its count returned), a broken
        contract, a lost file, NaN/Inf, ranks whose digests differ."""
        fed = self.sim.fed
        (n_bad, rank_sum, n_metrics), n_stop = totals["health"], totals["stop_requests"][0]
        if n_stop > 0 and self.stop is not None:
            self.stop.reached()
        if totals["contract"][0] > 0:  # every rank raises the lowest failing rank's line
            agree_on_usage_error(fed.comm, broken)
        if totals["lost_files"][0] > 0:  # every rank learns it here and stops
            raise OutputLost(f"iteration {k}: " + (lost or "a file of another rank was deleted or replaced"))
        if n_bad > 0:
            where = f"rank {int(rank_sum)}" if n_bad == 1 else f"{int(n_bad)} of {fed.size} ranks"
            if n_metrics == n_bad:  # x and y finite: the metrics alone
                plugin, largest = contract.plugin_of(self.sim.problem), max(_largest(self.x), _largest(self.y))
                raise FloatingPointError(
                    f"iteration {k}: the metrics of {plugin} hook evaluate became NaN/Inf at finite x and y (largest "
                    f"|entry| {largest:.3g}) on {where}: evaluate returns NaN/Inf there, or the iterates diverged "
                    "until it overflows (then lower the step sizes)"
                )
            note = getattr(self.sim.problem, "nonfinite_note", None)  # this rank's first oracle NaN/Inf, if any
            raise FloatingPointError(
                f"iteration {k}: the iterates or metrics became NaN/Inf on {where} (diverged); lower the step sizes"
                + (f"; {note}" if note else "")
            )
        if check_due:  # before the row is recorded: the output keeps the iterations before
            if not consistency.agree(totals["consistency"], fed.size):
                refuse_disagreement(fed.comm, k, digest, self.check_every, self.agreed)
            self.agreed = k
        return n_stop

    def _row(self, k, alg_seconds, eval_seconds, diag, metrics, totals, train_due) -> dict:
        """The row of iteration k (the run file's /iterations, the history)."""
        fed = self.sim.fed
        row = {
            "iteration": k,
            "comm_rounds": fed.stats.rounds,
            "comm_bytes": fed.stats.bytes,
            "comm_seconds": fed.stats.seconds,
            "wall_time": self.base_wall + time.perf_counter() - self.start,
            "algorithm_time": alg_seconds,
            "evaluation_time": eval_seconds,
        }
        row.update(diagnostic_values(type(self.sim.algorithm), diag))
        answered, dropped = fed.take_answer_counts()
        if fed.system.drops:
            row.update(clients_answered=answered, clients_dropped=dropped)
        row.update({f"oracle_{name}": float(c) for name, c in zip(ORACLES, totals["oracle_counts"])})
        row.update(metrics)
        if self.train_columns:
            row.update(
                training_metrics(totals["training"], self.train_columns)
                if train_due
                else dict.fromkeys(self.train_columns, math.nan)
            )
        return row

    def save(self, k: int) -> None:
        """A checkpoint after iteration k (none without a checkpoint folder)."""
        if self.checkpoint_dir is None:
            return
        sim, fed = self.sim, self.sim.fed
        saved = ckpt_io.Checkpoint(
            iteration=k,
            x=self.x,
            y=self.y,
            comm_rounds=fed.stats.rounds,
            comm_bytes=fed.stats.bytes,
            comm_seconds=fed.stats.seconds,
            oracle_totals=torch.from_numpy(self.counts.copy()),
            wall_time=self.wall,
            output_rows=k + 1,
            config_json=sim.cfg.to_json(),
            mpi_size=fed.size,
            algorithm_state={**sim.algorithm.checkpoint_state(), **sim.server.state()},
        )
        digests = self.hooks.first("row_digests", k + 1)  # rank 0's recorder: what a resume checks the rows against
        if digests is not None:
            saved.row_digests = torch.tensor(digests, dtype=torch.int64)
        attributes = self.hooks.first("attr_digests")  # and of the run file's attributes
        if attributes is not None:
            saved.attr_digests = attributes
        main = self.hooks.first("main_digests", k + 1)  # and of its /ranks and /snapshots
        if main is not None:
            saved.main_digests = torch.from_numpy(np.asarray(main, dtype=np.uint64).view(np.int64).copy())
        series = self.series.client_digests(k + 1) if self.series is not None else None
        ckpt_io.save(fed.comm, self.checkpoint_dir, saved, sim.algorithm.client_states(), series)
        self.hooks.call("on_checkpoint", k, self.checkpoint_dir)


def simulate(cfg: RunConfig, comm, callbacks=(), **checkpointing) -> RunResult:
    """Build and run a :class:`Simulation` (``callbacks`` and ``checkpointing``: see :meth:`Simulation.run`).
    **Collective** over ``comm``."""
    return Simulation(cfg, comm).run(callbacks, **checkpointing)


HEADLINE_METRICS = 3  # how many of a problem's declared metrics the progress lines show


def headline_metrics(problem: BilevelProblem) -> tuple[str, ...]:
    """What the progress lines show of a problem's metrics (:meth:`BilevelProblem.metric_info`): its
    primary metric, then those of :data:`~fednest_mpi.io.schema.DEFAULT_METRICS` it declares, then its
    other ones in their order, :data:`HEADLINE_METRICS` in all."""
    declared = list(problem.metric_info())
    first = problem.primary_metric or next(iter(declared), "outer_objective")
    headline = [m for m in DEFAULT_METRICS if m in declared]
    return tuple(dict.fromkeys([first, *headline, *declared]))[:HEADLINE_METRICS]


class Progress(Callback):
    """Rank 0's progress (a :class:`~fednest_mpi.callbacks.Callback`): a tqdm bar on a terminal, else one log
    line every ``log_every`` iterations with ``keys``' values, the rate (iterations per second since the start
    or resume) and the time left."""

    def __init__(
        self, total: int, mode: str, log_every: int, keys=("outer_objective", "x_error", "comm_rounds"), start: int = 0
    ):
        self.total, self.log_every, self.keys = total, log_every, tuple(dict.fromkeys(keys))
        self.start, self.t0 = start, time.monotonic()
        use_bar = mode == "always" or (mode == "auto" and sys.stderr.isatty())
        self.bar = None
        if use_bar:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total, initial=start, unit="it", file=sys.stderr, dynamic_ncols=True
            )  # start: a resumed run

    def on_iteration(self, k: int, row: dict) -> None:
        summary = {key: row[key] for key in self.keys if key in row}
        if self.bar is not None:
            if k > 0:
                self.bar.update(1)
            self.bar.set_postfix({kk: f"{v:.3g}" for kk, v in summary.items()}, refresh=False)
        elif k % self.log_every == 0 or k == self.total:
            text = " ".join(f"{kk}={v:.4g}" for kk, v in summary.items())
            logger.info("iteration %d/%d %s wall=%.2fs%s", k, self.total, text, row["wall_time"], self.pace(k))

    def pace(self, k: int) -> str:
        """`` 3.1 it/s, 0:02:14 left`` after iteration ``k`` ('' before the first one since the start)."""
        done, seconds = k - self.start, time.monotonic() - self.t0
        if done <= 0 or seconds <= 0:
            return ""
        rate = done / seconds
        left = round((self.total - k) / rate)
        return f" {rate:.3g} it/s, {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d} left"

    def on_end(self, result) -> None:
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
