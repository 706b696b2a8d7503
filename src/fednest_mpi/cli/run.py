"""``fednest-mpi run CONFIG``: a simulation to its run file (under mpiexec for several ranks)."""

from __future__ import annotations

import logging

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
