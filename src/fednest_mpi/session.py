"""One run session: a config on a communicator, run to its output file as ``fednest-mpi run`` does
it -- validation on every rank before any collective, one writer per output (locks), the run file
and per-rank client files, checkpoints and stop signals, resume, and the end of the job on any
rank's failure with every file closed (docs/reliability.md). Used by the command line, the tests
and anyone who wants a run file from Python:

    from fednest_mpi.comm import SerialComm
    from fednest_mpi.session import Session
    Session(config.load("configs/quadratic.toml"), SerialComm()).run_to_file()  # raises UsageError / RunFailed

In-memory runs without files: :class:`fednest_mpi.runner.Simulation` (with its ``problem_wrapper``
and ``step_wrapper`` hooks, used by ``bench/``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import traceback
from pathlib import Path

from fednest_mpi import __version__
from fednest_mpi.errors import OutputLost, RunFailed, UsageError
from fednest_mpi.io.schema import METRICS, PRIMARY_METRIC

LOST_HINT = "its results are gone with it; start the run again (keep the output's folder in place while it runs)"


def report_usage_error(comm, exc: UsageError) -> int:
    """Print a usage error once (rank 0) and return the exit status 2."""
    if comm.Get_rank() == 0:
        print(f"fednest-mpi: error: {exc}", file=sys.stderr)
    return 2


def report_failure(comm, exc: RunFailed) -> int:
    """Print a failed run's line once (rank 0; the traceback of its cause when the run raised) and return 1."""
    if comm.Get_rank() == 0:
        print(f"fednest-mpi: {exc}", file=sys.stderr)
        cause = exc.__cause__
        if cause is not None and not isinstance(cause, (FloatingPointError, OutputLost)):
            traceback.print_exception(cause, file=sys.stderr)
    return 1


class Session:
    """A run of ``cfg`` on ``comm`` to ``cfg.run.output`` (``resume``: continue from its checkpoint).

    :meth:`run_to_file` returns 0 when the run is done (or stopped by a signal after writing a
    checkpoint); it raises :class:`~fednest_mpi.errors.UsageError` (the same on every rank: a mistake in the
    config, the data or the output path; ``fednest-mpi run`` exits 2) or
    :class:`~fednest_mpi.errors.RunFailed` (``fednest-mpi run`` exits 1); nothing is printed for either, except
    that under MPI an exception on one rank ends the whole job (its line printed, the files closed).
    **Collective**.
    """

    def __init__(self, cfg, comm, *, resume: bool = False, log: logging.Logger | None = None):
        self.cfg, self.comm, self.resume, self.log = cfg, comm, resume, log or logging.getLogger("fednest_mpi")
        self._locks: list = []
        self._ending = threading.Lock()

    def _exit_now(self, code: int, message: str, printer: bool) -> None:
        """End this process at once (the files are closed): release the locks, print the line, exit."""
        with self._ending:  # the stop watch and the failure watcher may both get here
            for held in reversed(self._locks):
                held.release()
            if printer:
                print(f"fednest-mpi: {message}", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def run_to_file(self) -> int:
        from fednest_mpi.stop import StopRequests

        run = self.cfg.run
        with StopRequests(run.stop_timeout, run.round_timeout) as stop:  # from the start: checks may block too
            # until the files exist, ending at once is exiting (the locks released)
            stop.arm(lambda code, message: self._exit_now(code, message, self.comm.Get_rank() == 0))
            return self._checked_run(stop)

    def _checked_run(self, stop) -> int:
        """Validation, locks, then :meth:`_simulate`."""
        from fednest_mpi import checkpoint, failure, lock
        from fednest_mpi import config as configuration
        from fednest_mpi.io.h5 import check_directory, check_names, check_output_path, check_resumable_output
        from fednest_mpi.runner import broadcast_usage_error

        cfg, comm = self.cfg, self.comm
        rank, size = comm.Get_rank(), comm.Get_size()
        # ---- validation: deterministic on every rank, before any collective
        resume = None
        try:
            configuration.validate_world(cfg, size)
            check_names(cfg.run.output, cfg.run.checkpoint_dir)  # every name the run makes, also for --resume
            folder = checkpoint.folder_of(cfg)
            if self.resume:
                resume = checkpoint.load(folder)
                checkpoint.check_resumable(resume, cfg)
                check_directory(Path(cfg.run.output).parent, "run.output")
            else:
                check_output_path(cfg.run.output, cfg.run.overwrite)
            check_directory(folder, "run.checkpoint_dir")
        except UsageError:
            raise

        # ---- one writer per output: rank 0 locks the output and the checkpoint folder (and checks the
        # files a resume reads) and tells every rank, in the run's first collective
        locks = []
        found = None
        if rank == 0:
            try:
                # a stale lock (its writer provably gone) is taken over by --resume and --overwrite
                targets = [(cfg.run.output, "run.output"), (folder, "run.checkpoint_dir")]
                locks = lock.acquire_all(targets, take_stale=self.resume or cfg.run.overwrite)
                if resume is not None:
                    checkpoint.check_client_files(folder, resume)
                    check_resumable_output(cfg.run.output, resume.output_rows, resume.row_digests)
                failure.clear(cfg.run.output)  # the failure notes of an earlier run
            except UsageError as exc:
                found = exc
        try:
            broadcast_usage_error(comm, found)
        except UsageError:
            for held in locks:
                held.release()
            raise
        self._locks = locks
        try:
            return self._simulate(resume, folder, stop)
        finally:
            for held in reversed(locks):
                held.release()

    def _simulate(self, resume, folder, stop) -> int:
        """The run itself (after validation and locking): a usage error while building agrees across
        ranks; any exception
        aborts the job."""
        from fednest_mpi import failure
        from fednest_mpi.io.h5 import RunWriter
        from fednest_mpi.logs import log_failure
        from fednest_mpi.runner import Progress, Simulation, headline_metrics
        from fednest_mpi.series import RunSeries, series_layout

        cfg, comm, log = self.cfg, self.comm, self.log
        rank, size = comm.Get_rank(), comm.Get_size()
        writer = progress = series = watch = None
        last = {"k": None}

        def close_files(rows=None):
            """Close this rank's files, all cut to the same iterations (failure.Watch); the rows kept."""
            kept = writer.close() if writer is not None else rows  # rank 0: the rows of the run file
            if series is not None:
                series.close(kept if kept is not None else series.completed)
            return kept

        def end_now(code: int, message: str) -> None:
            """stop.StopRequests: end the run at once (a second signal, run.stop_timeout, the watchdog)."""
            folder_note = f"; the files are closed; continue from the last checkpoint ({folder}) with --resume"
            if watch is not None:
                watch.end(code, message + folder_note)
            elif failure._GUARD.acquire(timeout=failure.GUARD_SECONDS):
                close_files()
            self._exit_now(code, message + folder_note, printer())

        def on_end(code: int, message: str) -> None:
            """failure.Watch: another rank ended the run at once; this rank's files are closed."""
            self._exit_now(code, message, printer())

        def printer() -> bool:
            """Who prints the line of a run ended at once: rank 0, or rank 1 when rank 0 could not close (stopped)."""
            return rank == 0 or (rank == 1 and watch is not None and not watch.closed(0))

        try:
            log.info(
                "fednest-mpi %s: %s on %s, %d clients, %d ranks, seed %d%s",
                __version__,
                cfg.algorithm.name,
                cfg.problem.name,
                cfg.problem.n_clients,
                size,
                cfg.seed,
                f", resuming after iteration {resume.iteration}" if resume else "",
            )
            sim = Simulation(cfg, comm)  # a UsageError: the same on every rank (Simulation agrees on it)
            if rank == 0:
                attrs = {
                    "mpi_size": size,
                    "seed": cfg.seed,
                    "problem": cfg.problem.name,
                    "algorithm": cfg.algorithm.name,
                    "config_json": cfg.to_json(),
                    "numerics": json.dumps(sim.numerics),
                    PRIMARY_METRIC: sim.primary_metric,
                    METRICS: json.dumps(list(sim.problem.metric_info())),
                }
                keep = resume.output_rows if resume else None
                writer = RunWriter(
                    cfg.run.output, attrs, sim.columns(), keep_rows=keep, extend=series_layout(sim, keep).create
                )
                progress = Progress(
                    cfg.algorithm.outer_iterations,
                    cfg.run.progress,
                    cfg.run.log_every,
                    keys=(*headline_metrics(sim.problem), "comm_rounds"),
                    start=resume.iteration if resume else 0,
                )
            series = RunSeries(sim, writer, keep_rows=resume.output_rows if resume else None)
            if size > 1:  # an exception on any rank: every rank closes its files before the abort
                watch = failure.Watch(cfg.run.output, rank, size, close_files, on_end=on_end)
            stop.arm(end_now, rounds=True)  # the watchdog from iteration 0 on

            def on_iteration(k, row):
                last["k"] = k
                stop.beat(k)
                if progress is not None:
                    progress(k, row)

            result = sim.run(
                writer=writer, progress=on_iteration, checkpoint_dir=folder, stop=stop, resume=resume, series=series
            )
            stop.disarm()
        except UsageError:  # agreed on by every rank (a client file of the checkpoint gone since the check)
            stop.disarm()
            close_files()
            raise
        except FloatingPointError as exc:  # NaN/Inf: every rank stops after the same iteration, no abort needed
            stop.disarm()
            close_files()  # the bad iteration's client columns go
            raise RunFailed(
                f"run failed: FloatingPointError: {exc}; the output file and the last checkpoint ({folder}) hold "
                "the iterations before"
            ) from exc
        except OutputLost as exc:  # every rank learnt it in the same bookkeeping reduction
            stop.disarm()
            close_files()
            raise RunFailed(f"run failed: {exc}; {LOST_HINT}") from exc
        except Exception as exc:  # noqa: BLE001 -- the job must end, whatever the cause
            stop.disarm()
            where = f" after iteration {last['k']}" if last["k"] is not None else ""
            message = f"rank {rank}/{size}: run failed{where}: {type(exc).__name__}: {exc}"
            if size == 1:  # the caller learns it as an exception
                close_files()
                raise RunFailed(message) from exc
            line = log_failure(exc, "fednest-mpi: " + message, failure.folder_of(cfg.run.output), rank)
            if watch is not None:
                watch.fail(line)  # every rank closes its files, then the job is aborted
            else:
                close_files()
            comm.Abort(1)
            raise RunFailed(message) from exc
        finally:
            stop.disarm()
            if watch is not None:
                watch.stop()
            if progress is not None:
                progress.close()
            lost = series.lost() if series is not None else None  # deleted after the last iteration's check
            if series is not None:
                series.close()
            if writer is not None:
                writer.close()
        if lost:
            raise RunFailed(f"run failed: {lost}; {LOST_HINT}")
        if rank == 0 and result.stopped_by:
            print(
                f"fednest-mpi: stopped by {result.stopped_by} after iteration {last['k']}, "
                f"checkpoint written to {folder}; "
                f"continue with the same command and --resume",
                file=sys.stderr,
            )
        if rank == 0:
            print(f"output: {cfg.run.output}")
        return 0
