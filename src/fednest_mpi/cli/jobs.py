"""``fednest-mpi jobs list | render SWEEP``: the runs of a sweep and their batch scripts (:mod:`fednest_mpi.jobs`)."""

from __future__ import annotations

import argparse

from fednest_mpi.cli.common import usage_error
from fednest_mpi.errors import UsageError

#: the examples of ``jobs --help`` and ``jobs render --help``
_EPILOG = (
    "examples:\n  fednest-mpi jobs list jobs/sweeps/quadratic_variants.toml\n"
    "  fednest-mpi jobs render jobs/sweeps/quadratic_variants.toml --site local\n"
    "  fednest-mpi jobs render jobs/sweeps/fig2a.toml --site jobs/sites/YOURS.toml -o runs/jobs/fig2a\n"
    "  bash runs/jobs/quadratic_variants/quadratic_variants.local.sh -j 2"
)


def add(sub) -> None:
    """The ``jobs`` subcommand and its actions ``render`` and ``list``."""
    jobs = sub.add_parser(
        "jobs",
        help="batch scripts for a sweep of runs: SLURM job array, one sbatch per run, workstation script",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    jsub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    ren = _add_render(jsub)
    lst = jsub.add_parser(
        "list", help="print the runs of a sweep", epilog="example: fednest-mpi jobs list jobs/sweeps/fig4.toml -P paper"
    )
    lst.add_argument("sweep", help="sweep file (jobs/sweeps/*.toml)")
    for p in (ren, lst):
        p.add_argument(
            "--preset",
            "-P",
            default="",
            help="a named [presets.NAME] of the sweep file laid over it (figures: paper, authors_code); "
            "its runs go to OUTPUT_DIR/NAME (default: none, the file as written)",
        )


def _add_render(jsub) -> argparse.ArgumentParser:
    """``jobs render SWEEP``: the site, the folders, the launcher, the check of the tasks' configs."""
    ren = jsub.add_parser(
        "render",
        help="validate a sweep and write its tasks file and scripts for one site",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ren.add_argument("sweep", help="sweep file (jobs/sweeps/*.toml)")
    ren.add_argument(
        "--site",
        "-s",
        default="local",
        help="a built-in site (local, example-cluster) or the path of a site file (default: %(default)s)",
    )
    ren.add_argument("--out-dir", "-o", help="folder for the scripts, tasks file and logs (default: runs/jobs/SWEEP)")
    ren.add_argument("--workdir", help="folder the jobs run in (default: the current directory)")
    ren.add_argument(
        "--launcher", choices=("srun", "mpirun"), help="MPI launcher of the SLURM scripts (default: the site's)"
    )
    ren.add_argument("--no-check", dest="check", action="store_false", help="do not validate every task's config first")
    return ren


def execute(args) -> int:
    from fednest_mpi import jobs

    try:
        if args.jobs_command == "list":
            print(jobs.describe(jobs.expand(jobs.load_sweep(args.sweep, args.preset))), end="")
            return 0
        paths = jobs.render_all(
            args.sweep,
            args.site,
            args.out_dir,
            workdir=args.workdir,
            launcher=args.launcher,
            check=args.check,
            preset=args.preset,
        )
    except UsageError as exc:
        return usage_error(exc)
    print(*paths, sep="\n")
    print(f"submit: sbatch {paths[1]}\nworkstation: bash {paths[2]} [-j N] [TASK_ID ...]")
    return 0
