"""``fednest-mpi run CONFIG``: a simulation to its run file (under mpiexec for several ranks)."""

from __future__ import annotations

import logging
import os
import sys
import threading

from fednest_mpi.cli.common import config_command
from fednest_mpi.errors import UsageError

EPILOG_RUN = """\
example:
  mpiexec -n 2 fednest-mpi run configs/quadratic.toml --set algorithm.outer_iterations=50 \\
      --output runs/quadratic.h5 --overwrite
  # after a preemption or SIGTERM (on any number of ranks):
  mpiexec -n 1 fednest-mpi run configs/quadratic.toml --set algorithm.outer_iterations=50 \\
      --output runs/quadratic.h5 --resume
  # a sweep run again (more seeds, a longer budget): finished runs are skipped, shorter ones extended
  fednest-mpi run configs/quadratic.toml --set algorithm.outer_iterations=80 --output runs/quadratic.h5 \\
      --skip-finished --overwrite
"""


def add(sub) -> None:
    run = config_command(sub, "run", "run a simulation (under mpiexec for several ranks)", EPILOG_RUN)
    run.add_argument("--output", "-o", help="HDF5 output path (run.output)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing output file (run.overwrite)")
    run.add_argument("--quiet", "-q", action="store_true", help="warnings only")
    again = run.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run's latest checkpoint (run.checkpoint_dir): same config, any number of "
        "ranks; the output file is cut back to the checkpoint and appended to",
    )
    again.add_argument(
        "--skip-finished",
        action="store_true",
        help="do not run again a run whose output file already holds it to its end (the same config up to "
        "logging and checkpoint fields, iterations 0..algorithm.outer_iterations); continue one whose checkpoint "
        "allows it (an interrupted run, or a shorter one: a larger outer_iterations extends it); else start it "
        "(replacing the file only with --overwrite). For sweeps and figure scripts",
    )


def execute(args) -> int:
    from fednest_mpi import config as configuration
    from fednest_mpi.comm import world  # starts MPI (after the thread-level setting)
    from fednest_mpi.errors import RunFailed
    from fednest_mpi.logs import setup_logging
    from fednest_mpi.session import Session, report_failure, report_usage_error

    comm = world()
    rank, size = comm.Get_rank(), comm.Get_size()
    log = setup_logging(rank, size, logging.WARNING if args.quiet else logging.INFO)
    try:  # deterministic on every rank, before any collective
        values: dict[str, object] = {}  # as given, never through TOML: a path is a path, whatever its bytes
        if args.output is not None:
            values["run.output"] = args.output
        if args.overwrite:
            values["run.overwrite"] = True
        cfg = configuration.load(args.config, args.overrides, values)
    except UsageError as exc:
        return report_usage_error(comm, exc)
    try:
        return Session(cfg, comm, resume=args.resume, skip_finished=args.skip_finished, log=log).run_to_file()
    except UsageError as exc:
        return report_usage_error(comm, exc)
    except RunFailed as exc:  # its traceback (an exception on one rank) goes to the run's failure folder
        from fednest_mpi.failure import folder_of

        return report_failure(comm, exc, folder_of(cfg.run.output))


def leave(code: int) -> int:
    """``code``, once the run is over; where plugin code left threads that are no daemons running (the interpreter
    would wait for them at exit: a finished job that never ends), one line says so and the process ends now,
    MPI finalised first, without waiting for them."""
    stray = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not stray:
        return code
    from fednest_mpi.comm import mpi, world
    from fednest_mpi.logs import write_line

    comm = world()
    names = ", ".join(f"{t.name!r} ({_target(t)})" for t in stray[:3]) + (", ..." if len(stray) > 3 else "")
    write_line(
        f"fednest-mpi: warning: rank {comm.Get_rank()}/{comm.Get_size()}: the run is over, yet {len(stray)} thread(s) "
        f"started by plugin code still run: {names}; not waiting for them (start such a thread with daemon=True, or "
        "end it before the hook returns)"
    )
    sys.stdout.flush()
    sys.stderr.flush()
    if not mpi().Is_finalized():
        mpi().Finalize()
    os._exit(code)


def _target(thread: threading.Thread) -> str:
    target = getattr(thread, "_target", None)  # Thread(target=f): what it runs
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}" if target else "?"
