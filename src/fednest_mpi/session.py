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
import signal
import sys
import threading
import traceback as _traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fednest_mpi import __version__
from fednest_mpi.callbacks import Callback, Callbacks, Recorder
from fednest_mpi.errors import OutputLost, RanksDisagree, RunFailed, UsageError
from fednest_mpi.io.schema import METRICS, PRIMARY_METRIC

if TYPE_CHECKING:
    from fednest_mpi.failure import FatalLog, Watch
    from fednest_mpi.io.h5 import RunWriter
    from fednest_mpi.runner import Progress
    from fednest_mpi.series import RunSeries

LOST_HINT = "its results are gone with it; start the run again (keep the output's folder in place while it runs)"


def report_usage_error(comm, exc: UsageError) -> int:
    """Print a usage error once (rank 0) and return the exit status 2."""
    if comm.Get_rank() == 0:
        print(f"fednest-mpi: error: {exc}", file=sys.stderr)
    return 2


def report_failure(comm, exc: RunFailed, folder=None) -> int:
    """Print a failed run's line once (rank 0) and return 1. When the run raised, the traceback of its cause goes
    to ``folder/traceback-rank00000.log`` (the run's failure folder, :func:`fednest_mpi.failure.folder_of`), which
    the line names, as under MPI (:func:`fednest_mpi.logs.log_failure`); without ``folder``, to stderr."""
    from fednest_mpi.logs import log_failure

    if comm.Get_rank() == 0:
        line = f"fednest-mpi: {exc}"
        cause = exc.__cause__
        if cause is None or isinstance(cause, (FloatingPointError, OutputLost, RanksDisagree)):
            print(line, file=sys.stderr)
        elif folder is not None:
            log_failure(cause, line, folder, comm.Get_rank())
        else:
            print(line, file=sys.stderr)
            _traceback.print_exception(cause, file=sys.stderr)
    return 1


def quiet_stderr() -> None:
    """From now on this process's stderr (file descriptor 2) goes nowhere: its one line is written."""
    sys.stderr.flush()
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
    except OSError:
        pass


def failure_line(exc: BaseException, rank: int, size: int, last: int | None) -> str:
    """The one line of a run that failed on ``rank`` after iteration ``last`` (None: before iteration 0 was
    recorded), naming the plugin hook the exception came from (:func:`fednest_mpi.contract.hook_of`)."""
    from fednest_mpi.contract import hook_of

    where = f" after iteration {last}" if last is not None else ""
    hook = hook_of(exc)
    text = exception_text(exc)
    what = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if type(exc).__module__ == "mpi4py.MPI":  # MPICH's error stack (dozens of frames) is in the traceback log
        what = f"MPI error: {text.split(', error stack:')[0]} ({MPI_HINT})"
    return f"rank {rank}/{size}: run failed{where}: {what}" + (f" (raised in {hook})" if hook else "")


#: what an MPI error in a collective during the run most likely means
MPI_HINT = (
    "the ranks called different collectives: plugin code that aggregates (mean_over, evaluation_sum) a different "
    "number of times on different ranks, or calls MPI itself"
)


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or what its ``__str__`` raised instead: a plugin's exception whose ``__str__`` fails must
    still give the rank's one line (the job would wait for it in a collective)."""
    try:
        return str(exc)
    except Exception as err:  # noqa: BLE001 -- anything a plugin's __str__ raises
        return f"<str() of it raised {type(err).__name__}>"


class Beat:
    """The session's callback (:mod:`fednest_mpi.callbacks`): the last iteration recorded (for its lines) and
    the watchdog's beat (``stop.beat``)."""

    def __init__(self, stop):
        self.stop, self.k = stop, None

    def on_iteration(self, k: int, row: dict) -> None:
        self.k = k
        self.stop.beat(k)


class RunFiles(Callback):
    """One rank's files of a run (rank 0: the run file and the progress line; every rank: its client files)
    and the ways the run ends at once, each closing them cut to the same iterations (:class:`failure.Watch`).
    A callback itself: at the run's end it closes the files (the callbacks after it, the writers of
    :mod:`fednest_mpi.writers` and the session's own, find them closed); when a failure or a stop on another
    rank ends this one, it tells them ``on_error``."""

    def __init__(self, session: Session, folder):
        self.session, self.folder = session, folder
        self.rank, self.size = session.comm.Get_rank(), session.comm.Get_size()
        self.writer: RunWriter | None = None
        self.progress: Progress | None = None
        self.series: RunSeries | None = None
        self.watch: Watch | None = None
        self.fatal: FatalLog | None = None
        self.watchers = Callbacks([*session.writers, *session.callbacks])
        self.running = False  # between the run's start and its end or error
        self.lost: str | None = None
        self.shut_down = False
        self.stopped_by: str | None = None  # the signal that stopped the run before its last iteration, if one did

    def open(self, sim, resume) -> None:
        """Create the files of ``sim`` (``resume``: keep the rows its checkpoint recorded) and, under MPI, the
        watch that closes them when any rank fails."""
        from fednest_mpi import failure
        from fednest_mpi.io.h5 import RunWriter
        from fednest_mpi.runner import Progress, headline_metrics
        from fednest_mpi.series import RunSeries, series_layout

        cfg = self.session.cfg
        if self.rank == 0:
            attrs = self._attrs(sim, resume)
            keep = resume.output_rows if resume else None
            try:
                self.writer = RunWriter(
                    cfg.run.output, attrs, sim.columns(), keep_rows=keep, extend=series_layout(sim, keep).create
                )
            except BaseException as exc:  # an MLflow run opened for it ends FAILED
                Callbacks(self.session.writers).tell_error(exc)
                raise
            self.progress = Progress(
                cfg.algorithm.outer_iterations,
                cfg.run.progress,
                cfg.run.log_every,
                keys=(*headline_metrics(sim.problem), "comm_rounds"),
                start=resume.iteration if resume else 0,
            )
        self.series = RunSeries(sim, self.writer, keep_rows=resume.output_rows if resume else None)
        self.fatal = failure.FatalLog(cfg.run.output, self.rank, self.size)  # a C-level abort: its line, its stack
        if self.size > 1:  # an exception on any rank: every rank closes its files before the abort
            self.watch = failure.Watch(cfg.run.output, self.rank, self.size, self.close, on_end=self.ended_elsewhere)

    def _attrs(self, sim, resume) -> dict:
        """Rank 0's attributes of the run file, those of the writers of :mod:`fednest_mpi.writers` included:
        each with a ``run_file_attributes(sim, stored)`` is given the attributes of theirs that the file being
        resumed holds (``stored``: an MLflow run's id to reopen; empty for a new run) and says what to store."""
        from fednest_mpi.io.h5 import TRACKING_ATTRS, stored_attributes

        cfg = self.session.cfg
        attrs = {
            "mpi_size": self.size,
            "seed": cfg.seed,
            "problem": cfg.problem.name,
            "algorithm": cfg.algorithm.name,
            "config_json": cfg.to_json(),
            "numerics": json.dumps(sim.numerics),
            PRIMARY_METRIC: sim.primary_metric,
            METRICS: json.dumps(list(sim.problem.metric_info())),
        }
        asking = [w for w in self.session.writers if hasattr(w, "run_file_attributes")]
        stored = stored_attributes(cfg.run.output, TRACKING_ATTRS) if resume and asking else {}
        for writer in asking:
            attrs.update(writer.run_file_attributes(sim, stored))
        return attrs

    def on_start(self, sim, k: int) -> None:
        self.running = True

    def on_end(self, result) -> None:
        self.running = False
        self.stopped_by = result.stopped_by
        self.shut()

    def on_error(self, error: BaseException) -> None:
        self.running = False  # the simulation tells the callbacks after this one itself

    def _close_writer(self, mark: bool = True) -> int | None:
        """Close rank 0's run file; the rows kept. A run stopped by a signal (:attr:`stopped_by`) is marked so in
        the closed file (``mark``: unless the file was lost); a file that refuses the mark (a full disk) is one
        warning: the run and its checkpoint are fine, only a reader takes the file for one that ended there."""
        from fednest_mpi.io.h5 import mark_stopped

        assert self.writer is not None
        rows = self.writer.close()
        if not (mark and rows and self.stopped_by):
            return rows
        try:
            mark_stopped(self.writer.path, self.stopped_by, rows - 1)
        except OSError as exc:
            self.session.log.warning(
                "could not mark %s as stopped (%s): a reader takes it for a run that ended", self.writer.path, exc
            )
        return rows

    def close(self, rows=None):
        """Close this rank's files, all cut to the same iterations (failure.Watch); the rows kept. A run ended
        while this rank was running (by another rank's failure, a second signal, a timeout): the writers and
        the session's callbacks are told ``on_error``."""
        kept = self._close_writer() if self.writer is not None else rows  # rank 0: the rows of the run file
        if self.series is not None:
            self.series.close(kept if kept is not None else self.series.completed)
        if self.running:
            self.running = False
            self.watchers.tell_error(RunFailed("the run was ended on every rank (see the job's line)"))
        return kept

    def end_now(self, code: int, message: str) -> None:
        """stop.StopRequests: end the run at once (a second signal, run.stop_timeout, the watchdog)."""
        from fednest_mpi import failure

        folder_note = f"; the files are closed; continue from the last checkpoint ({self.folder}) with --resume"
        if code > 128:  # a second signal, or run.stop_timeout after the first: the run is continued, not a result
            self.stopped_by = f"{signal.Signals(code - 128).name} (ended at once)"
        if self.watch is not None:
            self.watch.end(code, message + folder_note)
        elif failure._GUARD.acquire(timeout=failure.GUARD_SECONDS):
            self.close()
        self._exit(code, message + folder_note)

    def ended_elsewhere(self, code: int, message: str) -> None:
        """failure.Watch: another rank ended the run at once; this rank's files are closed."""
        self._exit(code, message)

    def _exit(self, code: int, message: str) -> None:
        """Exit with the job's line printed once: the printer prints and says so; the others wait for that (at
        most failure.END_ACK_SECONDS) before they exit, since the launcher ends the job when one rank exits."""
        from fednest_mpi import failure

        printer = self.printer()
        if not printer and self.watch is not None:
            self.watch.wait_printed(failure.END_ACK_SECONDS)
        done = self.watch.printed if printer and self.watch is not None else None
        self.session._exit_now(code, message, printer, done)

    def printer(self) -> bool:
        """Who prints the line of a run ended at once: rank 0, or rank 1 when rank 0 could not close (stopped)."""
        return self.rank == 0 or (self.rank == 1 and self.watch is not None and not self.watch.closed(0))

    def shut(self) -> str | None:
        """The end of the run, however it ended: the watch stopped, the files closed (once); what of the output
        was lost (deleted after the last iteration's check), or None."""
        if not self.shut_down:
            self.shut_down = True
            self.lost = self._shut()
        return self.lost

    def _shut(self) -> str | None:
        if self.watch is not None:
            self.watch.stop()
        if self.fatal is not None:
            self.fatal.close()
        if self.progress is not None:
            self.progress.close()
        lost = self.series.lost() if self.series is not None else None
        if self.series is not None:
            self.series.close()
        if self.writer is not None:
            self._close_writer(mark=lost is None)
        return lost


def prior_run(cfg) -> tuple[str, str]:
    """What a run of ``cfg`` finds of itself already done (``fednest-mpi run --skip-finished``), and why.

    * ``("finished", why)``: ``run.output`` holds this run to its end, read as every reader reads a run file
      (:func:`fednest_mpi.io.h5.read_run`, a file its writer closed): the config equal to ``cfg`` in every field
      but those a resume may change (:data:`fednest_mpi.checkpoint.RESUMABLE_CHANGES`: logging, checkpoints,
      timeouts), and exactly the rows of iterations 0, ..., ``algorithm.outer_iterations``;
    * ``("resume", why)``: its checkpoint may be continued (every check of ``--resume`` passes: the same
      config up to those fields, at or before ``algorithm.outer_iterations``, the client files and the output's
      rows it recorded): an interrupted run, or a finished shorter one that a larger ``outer_iterations`` extends;
    * ``("start", why)``: neither (no output, another config, a longer run than ``cfg``'s, a damaged file).

    Reads files only (no MPI): the same answer on every rank of a job."""
    from fednest_mpi import checkpoint
    from fednest_mpi.io.h5 import check_resumable_output, read_run
    from fednest_mpi.io.schema import SCALE

    output, budget = cfg.run.output, cfg.algorithm.outer_iterations
    if not Path(output).exists():
        return "start", f"no run file {output!r}"
    why = ""
    try:
        attrs, data = read_run(output, unclosed="refuse")
        diffs = checkpoint.config_differences(attrs.get("config_json", "{}"), cfg)
        done = data[SCALE].tolist()
        if not diffs and done == list(range(budget + 1)):
            return "finished", f"{output!r} holds this config's {budget} iterations"
        if diffs:
            why = f"another config ({diffs[0].replace(': checkpoint ', ': file ', 1)})"
        else:
            why = f"iterations 0..{done[-1] if done else '-'} of {budget}"
    except UsageError as exc:  # unreadable, unclosed (killed), not a run file: its checkpoint may still serve
        why = str(exc)
    try:
        folder = checkpoint.folder_of(cfg)
        ckpt = checkpoint.load(folder)
        checkpoint.check_resumable(ckpt, cfg)
        checkpoint.check_client_files(folder, ckpt)
        check_resumable_output(
            output,
            ckpt.output_rows,
            ckpt.row_digests,
            ckpt.attr_digests,
            ckpt.client_series_digests,
            ckpt.main_digests,
        )
    except UsageError as exc:
        return "start", f"{why}; not resumable: {exc}"
    return "resume", f"{why}; its checkpoint is at iteration {ckpt.iteration}"


class Session:
    """A run of ``cfg`` on ``comm`` to ``cfg.run.output`` (``resume``: continue from its checkpoint).

    ``skip_finished``: first ask :func:`prior_run`: a finished run is not run again (its output line says so),
    a resumable one is resumed, any other started (``resume`` is then ignored).

    :meth:`run_to_file` returns 0 when the run is done (or stopped by a signal after writing a
    checkpoint); it raises :class:`~fednest_mpi.errors.UsageError` (the same on every rank: a mistake in the
    config, the data or the output path; ``fednest-mpi run`` exits 2) or
    :class:`~fednest_mpi.errors.RunFailed` (``fednest-mpi run`` exits 1); nothing is printed for either, except
    that under MPI an exception on one rank ends the whole job (its line printed, the files closed).
    ``callbacks``: more callbacks of the run (:mod:`fednest_mpi.callbacks`, e.g. a
    :class:`~fednest_mpi.writers.MLflowWriter`), called after the session's own and the writers of
    ``run.tensorboard_dir`` / ``run.mlflow_uri``; at ``on_end`` the run's files are closed. **Collective**.
    """

    def __init__(
        self,
        cfg,
        comm,
        *,
        resume: bool = False,
        skip_finished: bool = False,
        log: logging.Logger | None = None,
        callbacks=(),
    ):
        self.cfg, self.comm, self.resume, self.log = cfg, comm, resume, log or logging.getLogger("fednest_mpi")
        self.skip_finished = skip_finished
        self.callbacks = [c for c in callbacks if c is not None]
        self.writers: list = []  # rank 0's writers of run.tensorboard_dir and run.mlflow_uri (fednest_mpi.writers)
        self._locks: list = []
        self._ending = threading.Lock()

    def _exit_now(self, code: int, message: str, printer: bool, printed: Callable[[], None] | None = None) -> None:
        """End this process at once (the files are closed): release the locks, print the line (then tell the
        other ranks, ``printed``), exit."""
        with self._ending:  # the stop watch and the failure watcher may both get here
            for held in reversed(self._locks):
                held.release()
            if printer:
                print(f"fednest-mpi: {message}", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            if printed is not None:
                printed()
            os._exit(code)

    def _end_start_up(self, code: int, message: str) -> None:
        """Before the files exist: a signal ends this process (rank 0 prints the line); the start-up watchdog
        (code 1) ends the job from the rank stuck in a plugin hook, which prints its line (the others wait for it
        in a collective: the job is aborted; on one rank the process exits)."""
        if code == 1 and self.comm.Get_size() > 1:
            self._abort(code, message, None, lambda: None, None)
        self._exit_now(code, message, code == 1 or self.comm.Get_rank() == 0)

    def _abort(self, code: int, message: str, watch, close_files, exc: BaseException | None) -> None:
        """This rank failed alone: print its one line (with an exception, its traceback goes to a per-rank log
        file the line names: :func:`fednest_mpi.logs.log_failure`), tell the other ranks (every rank closes its
        files), end the job with ``code``."""
        from fednest_mpi import failure
        from fednest_mpi.logs import log_failure, write_line

        line = "fednest-mpi: " + message
        if exc is not None:
            line = log_failure(exc, line, failure.folder_of(self.cfg.run.output), self.comm.Get_rank())
        else:
            write_line(line)
        if watch is not None:
            watch.fail(line)  # every rank closes its files, then the job is aborted
        else:
            close_files()
        quiet_stderr()  # MPICH's own "Abort(1) on node 1 ...: application called MPI_Abort" would be a second line
        self.comm.Abort(code)

    def run_to_file(self) -> int:
        from fednest_mpi.io.h5 import check_names
        from fednest_mpi.stop import StopRequests

        run = self.cfg.run
        if self.skip_finished:
            check_names(run.output, run.checkpoint_dir)  # before prior_run looks at them (every rank, no MPI)
            state, why = prior_run(self.cfg)
            if state == "finished":
                if self.comm.Get_rank() == 0:
                    print(f"output: {run.output} (finished earlier: {why}; not run again)")
                return 0
            self.resume = state == "resume"
            self.log.info("--skip-finished: %s: %s", "resuming" if self.resume else "starting", why)
        # from the start: checks may block too
        with StopRequests(run.stop_timeout, run.round_timeout, run.round_timeout_factor, run.idle_timeout) as stop:
            # until the files exist, ending at once is exiting (the locks released)
            stop.arm(self._end_start_up, locate=self._stuck_in)
            return self._checked_run(stop)

    def _checked_run(self, stop) -> int:
        """Validation, locks, then :meth:`_simulate`."""
        resume, folder = self._validated()
        locks = self._locked(resume, folder)
        self._locks = locks
        try:
            return self._simulate(resume, folder, stop)
        finally:
            for held in reversed(locks):
                held.release()

    def _validated(self):
        """The checkpoint to resume from (or None) and the checkpoint folder, once the config, the world and
        the output's names and folders are checked: deterministic on every rank, before any collective."""
        from fednest_mpi import checkpoint
        from fednest_mpi import config as configuration
        from fednest_mpi.io.h5 import check_directory, check_names, check_output_path

        cfg = self.cfg
        resume = None
        configuration.validate_world(cfg, self.comm.Get_size())
        check_names(cfg.run.output, cfg.run.checkpoint_dir)  # every name the run makes, also for --resume
        folder = checkpoint.folder_of(cfg)
        if self.resume:
            resume = checkpoint.load(folder)
            checkpoint.check_resumable(resume, cfg)
            check_directory(Path(cfg.run.output).parent, "run.output")
        else:
            check_output_path(cfg.run.output, cfg.run.overwrite)
        check_directory(folder, "run.checkpoint_dir")
        return resume, folder

    def _locked(self, resume, folder) -> list:
        """One writer per output: rank 0 locks the output and the checkpoint folder (and checks the files a
        resume reads), builds the writers the config asks for (:func:`fednest_mpi.writers.from_config`: a
        missing package is a usage error) and tells every rank, in the run's first collective; the locks
        held (rank 0's)."""
        from fednest_mpi import checkpoint, failure, lock, writers
        from fednest_mpi.io.h5 import check_resumable_output
        from fednest_mpi.runner import broadcast_usage_error

        cfg = self.cfg
        locks = []
        found = None
        if self.comm.Get_rank() == 0:
            try:
                # a stale lock (its writer provably gone) is taken over by --resume and --overwrite
                targets = [(cfg.run.output, "run.output"), (folder, "run.checkpoint_dir")]
                locks = lock.acquire_all(targets, take_stale=self.resume or cfg.run.overwrite)
                if resume is not None:
                    checkpoint.check_client_files(folder, resume)
                    check_resumable_output(
                        cfg.run.output,
                        resume.output_rows,
                        resume.row_digests,
                        resume.attr_digests,
                        resume.client_series_digests,
                        resume.main_digests,
                    )
                failure.clear(cfg.run.output)  # the failure notes of an earlier run
                self.writers = writers.from_config(cfg)
            except UsageError as exc:
                found = exc
        try:
            broadcast_usage_error(self.comm, found)
        except UsageError:
            for held in locks:
                held.release()
            raise
        return locks

    def _simulate(self, resume, folder, stop) -> int:
        """The run itself (after validation and locking): a usage error while building agrees across
        ranks; any exception aborts the job."""
        from fednest_mpi.runner import Simulation

        files, beat = RunFiles(self, folder), Beat(stop)
        try:
            self._log_start(resume)
            sim = Simulation(self.cfg, self.comm)  # a UsageError: the same on every rank (Simulation agrees on it)
            files.open(sim, resume)
            stop.arm(files.end_now, rounds=True, locate=self._stuck_in)  # the watchdog from iteration 0 on
            recorder = Recorder(files.writer) if files.writer is not None else None
            callbacks = [recorder, beat, files.progress, files, *self.writers, *self.callbacks]
            result = sim.run(callbacks, checkpoint_dir=folder, stop=stop, resume=resume, series=files.series)
            stop.disarm()
        except BaseException as exc:  # noqa: BLE001 -- SystemExit, KeyboardInterrupt too: the job must end
            stop.disarm()
            failed = self._failed(exc, files, beat)
            if failed is None:
                raise
            raise failed from exc
        finally:
            stop.disarm()
            lost = files.shut()
        if lost:
            raise RunFailed(f"run failed: {lost}; {LOST_HINT}")
        if self.comm.Get_rank() == 0 and result.stopped_by:
            print(
                f"fednest-mpi: stopped by {result.stopped_by} after iteration {beat.k}, "
                f"checkpoint written to {folder}; "
                f"continue with the same command and --resume",
                file=sys.stderr,
            )
        if self.comm.Get_rank() == 0:
            print(f"output: {self.cfg.run.output}")
        return 0

    def _stuck_in(self) -> str | None:
        """The watchdog's question: the plugin hook this rank's main thread runs (``rank R/N is in ...``), or
        None when it waits for the other ranks (:func:`fednest_mpi.contract.hook_running`)."""
        from fednest_mpi.contract import hook_running

        hook = hook_running()
        return None if hook is None else f"rank {self.comm.Get_rank()}/{self.comm.Get_size()} is in {hook}"

    def _log_start(self, resume) -> None:
        cfg = self.cfg
        self.log.info(
            "fednest-mpi %s: %s on %s, %d clients, %d ranks, seed %d%s",
            __version__,
            cfg.algorithm.name,
            cfg.problem.name,
            cfg.problem.n_clients,
            self.comm.Get_size(),
            cfg.seed,
            f", resuming after iteration {resume.iteration}" if resume else "",
        )

    def _failed(self, exc: BaseException, files: RunFiles, beat: Beat) -> RunFailed | None:
        """The run raised ``exc``: close this rank's files (or abort the job when this rank failed alone) and
        return the :class:`RunFailed` to raise, or None to raise ``exc`` itself (a usage error)."""
        rank, size = self.comm.Get_rank(), self.comm.Get_size()
        if isinstance(exc, UsageError):
            if size > 1 and not getattr(exc, "agreed", True):  # a plugin's broken contract on this rank alone
                self._abort(2, f"rank {rank}/{size}: {exc}", files.watch, files.close, None)
            files.close()  # agreed on by every rank (a client file of the checkpoint gone since the check)
            return None
        if isinstance(exc, FloatingPointError):  # NaN/Inf: every rank stops after the same iteration, no abort
            files.close()  # the bad iteration's client columns go
            return RunFailed(
                f"run failed: FloatingPointError: {exc}; the output file and the last checkpoint ({files.folder}) "
                "hold the iterations before"
            )
        if isinstance(exc, OutputLost):  # every rank learnt it in the same bookkeeping reduction
            files.close()
            return RunFailed(f"run failed: {exc}; {LOST_HINT}")
        if isinstance(exc, RanksDisagree):  # run.check_consistency: every rank learnt it in the same reduction
            files.close()
            return RunFailed(f"run failed: {exc}; the output file holds the iterations before")
        message = failure_line(exc, rank, size, beat.k)
        if size == 1:  # the caller learns it as an exception
            files.close()
            return RunFailed(message)
        self._abort(1, message, files.watch, files.close, exc)
        return RunFailed(message)
