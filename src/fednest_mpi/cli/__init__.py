"""Command line: ``fednest-mpi run | report | plot | recover | jobs | download | data | config-doc``
(also ``python -m fednest_mpi``).

Exit codes: 0 success, also a run stopped by SIGTERM/SIGINT/SIGUSR1 after writing its checkpoint
(continue it with ``--resume``); 1 failure of the run; 2 usage error (bad arguments, config,
output path, checkpoint, missing or damaged data file). Usage errors are detected identically on
every rank (or agreed on in one collective while building the problem) and printed once (by rank
0). A NaN/Inf stops every rank after the same iteration with one message; any other exception
during the run prints ``rank r/P`` and its cause, and aborts the whole MPI job, so no rank is left
waiting in a collective. See docs/reliability.md.
"""

from __future__ import annotations

import argparse
import sys

from fednest_mpi import __version__
from fednest_mpi.cli import analyse, check, data, download, jobs, recover, run
from fednest_mpi.cli.common import Parser, parsed

#: each subcommand's module: ``add(sub)`` makes its parser, ``execute(args)`` runs it and returns the exit code
COMMANDS = {
    "run": run,
    "report": analyse,
    "plot": analyse,
    "recover": recover,
    "jobs": jobs,
    "download": download,
    "data": data,
    "check": check,
}


def _parser() -> argparse.ArgumentParser:
    parser = Parser(  # its subcommands' parsers are of its class: usage errors in one line
        prog="fednest-mpi",
        description="MPI simulator for federated bilevel optimisation (FedNest family).",
        epilog="example: mpiexec -n 2 fednest-mpi run configs/quadratic.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fednest-mpi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in dict.fromkeys(COMMANDS.values()):  # in the order of the help
        module.add(sub)
    doc = sub.add_parser(
        "config-doc",
        help="print the config reference (Markdown) generated from the config definitions",
        epilog="example: fednest-mpi config-doc > my-config-reference.md (the project's docs/config.md: make docs)",
    )
    doc.add_argument(
        "--builtin",
        action="store_true",
        help="only what fednest-mpi itself defines, without the installed plugins (how docs/config.md is made)",
    )
    return parser


def main(argv=None) -> int:
    program_run = argv is None and sys.argv[1:2] == ["run"]  # the program itself, not a test calling main()
    for stream in (sys.stdout, sys.stderr) if argv is None else ():  # a path's undecodable bytes printed as such
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    if program_run:  # as early as can be
        from fednest_mpi import stop

        stop.install()
    # the program under MPI: argparse's errors (and --help) printed by the first rank only
    args = parsed(_parser(), argv) if argv is None else _parser().parse_args(argv)
    if program_run and args.command == "run":
        code = run.execute(args)
        stop.ignore_from_now()  # the run is over: the interpreter's teardown would put back SIG_DFL (exit 15)
        return run.leave(code)  # not waiting for a plugin's threads
    if args.command == "config-doc":
        return _config_doc(installed=not args.builtin)
    return COMMANDS[args.command].execute(args)


def _config_doc(installed: bool = True) -> int:
    """``fednest-mpi config-doc``: the reference (with the installed plugins unless ``installed`` is False), or one
    line and exit 2 when an installed plugin is broken (a name taken twice, a module that does not import)."""
    from fednest_mpi.config import reference_markdown
    from fednest_mpi.errors import UsageError

    try:
        text = reference_markdown(installed=installed)
    except UsageError as exc:
        print(f"fednest-mpi: error: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0
