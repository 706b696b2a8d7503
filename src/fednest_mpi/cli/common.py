"""What the subcommands share: their parser with its examples, one that reads a config and its ``--set``
overrides, the line of a usage error."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys

from fednest_mpi.errors import UsageError


class Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, as every other usage error of the program, with the
    way out: ``fednest-mpi run: error: argument --output/-o: expected one argument; ...; see fednest-mpi run -h``."""

    def error(self, message: str):
        hint = ""
        if "expected one argument" in message:  # --output -x.h5: argparse takes '-x.h5' for an option
            hint = "; a value that starts with '-' goes after '=' (--output=-run.h5) or as a path (./-run.h5)"
        self.exit(2, f"{self.prog}: error: {message}{hint}; see {self.prog} --help\n")


def config_command(sub, name: str, help_text: str, epilog: str):
    """The subcommand ``name`` that reads a config file and its ``--set`` overrides (``run``, ``check``)."""
    parser = subcommand(sub, name, help_text, epilog)
    parser.add_argument("config", help="TOML config file (see docs/config.md)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field, e.g. --set algorithm.outer_lr=0.05 (repeatable)",
    )
    return parser


def subcommand(sub, name: str, help_text: str, epilog: str) -> argparse.ArgumentParser:
    """The subcommand ``name``, its epilog (the examples) printed with its line breaks."""
    return sub.add_parser(name, help=help_text, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)


def usage_error(exc: UsageError) -> int:
    """Print a usage error's one line and return the exit status 2."""
    print(f"fednest-mpi: error: {exc}", file=sys.stderr)
    return 2


#: where launchers put a process's rank before MPI starts: MPICH's Hydra, PMIx (Open MPI 5), Open MPI 4, SLURM's srun
RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def launcher_rank(environ=os.environ) -> int:
    """This process's rank as its launcher announced it (before MPI starts), 0 when none did."""
    for name in RANK_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def parsed(parser: argparse.ArgumentParser, argv, environ=os.environ) -> argparse.Namespace:
    """``parser.parse_args(argv)``, whose usage errors, ``--help`` and ``--version`` (argparse prints them and
    exits) only the first rank of an MPI job prints: ``mpiexec -n 2 fednest-mpi run --bad`` says it once."""
    if launcher_rank(environ) == 0:
        return parser.parse_args(argv)
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return parser.parse_args(argv)
