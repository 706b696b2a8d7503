"""``fednest-mpi check CONFIG``: a config's plugins against their contract and the 1-vs-2-rank and chunk invariance."""

from __future__ import annotations

import logging

from fednest_mpi.cli.common import config_command, usage_error
from fednest_mpi.errors import UsageError

EPILOG_CHECK = """\
example: fednest-mpi check my_plugin.toml --set problem.n_clients=8
prints one line per check (contract, chunks, ranks): ok, differs (the first column and iteration), or not
run (why). Exit codes: 0 every check ran and agreed, 2 a mistake in the config or a plugin's broken contract
(one line naming the hook), 3 a check differs, 4 a check could not run (and none differs).
"""


def add(sub) -> None:
    chk = config_command(
        sub,
        "check",
        "check a config's plugins: their contract, and the same bits at 1 and 2 ranks and any chunk size",
        EPILOG_CHECK,
    )
    chk.add_argument("--iterations", type=int, default=3, help="outer iterations of each run (default 3)")
    chk.add_argument("--ranks", type=int, default=2, help="ranks of the run compared with one rank (default 2)")
    chk.add_argument("--timeout", type=float, default=600.0, help="seconds the many-rank run may take (default 600)")


def execute(args) -> int:
    from fednest_mpi.checking import check
    from fednest_mpi.logs import setup_logging

    setup_logging(0, 1, logging.WARNING)
    try:
        return check(args.config, args.overrides, args.iterations, args.ranks, args.timeout)
    except UsageError as exc:
        return usage_error(exc)
