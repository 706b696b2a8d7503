"""``fednest-mpi recover RUN.h5``: close the files of a killed run at its last complete iteration."""

from __future__ import annotations

from fednest_mpi.cli.common import subcommand, usage_error
from fednest_mpi.errors import UsageError


def add(sub) -> None:
    rec = subcommand(
        sub,
        "recover",
        "close the files of a killed run (SIGKILL, node loss) at its last complete iteration",
        "example:\n  fednest-mpi recover runs/q.h5   # then continue it with run ... --resume",
    )
    rec.add_argument("run", help="run file (.h5) of a run that was killed before it closed its files")


def execute(args) -> int:
    from fednest_mpi.io.recover import recover

    try:
        print(recover(args.run))
    except UsageError as exc:
        return usage_error(exc)
    return 0
