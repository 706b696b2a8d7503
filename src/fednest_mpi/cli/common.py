"""What several subcommands share: a subcommand that reads a config and its ``--set`` overrides."""

from __future__ import annotations

import argparse


def config_command(sub, name: str, help_text: str, epilog: str):
    """The subcommand ``name`` that reads a config file and its ``--set`` overrides (``run``, ``check``)."""
    parser = sub.add_parser(name, help=help_text, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
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
