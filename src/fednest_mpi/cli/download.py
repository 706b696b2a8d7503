"""``fednest-mpi download DATASET``: fetch MNIST, Fashion-MNIST or UCI Adult, checking checksums."""

from __future__ import annotations

import sys

from fednest_mpi.cli.common import subcommand


def add(sub) -> None:
    from fednest_mpi.config import DATASETS  # here, not at import: the stop signals are installed first

    dl = subcommand(
        sub,
        "download",
        "fetch MNIST, Fashion-MNIST or UCI Adult (needs internet), checking checksums",
        "example:\n  fednest-mpi download mnist --dest ~/data && export FEDNEST_DATA=~/data",
    )
    dl.add_argument("datasets", nargs="+", choices=tuple(DATASETS), help="data set(s) to fetch")
    dl.add_argument("--dest", "-d", help="data root (default: $FEDNEST_DATA); the files go to DEST/mnist, ...")
    dl.add_argument("--mirror", help="base URL replacing the default mirror (file:// works too)")


def execute(args) -> int:
    import os

    from fednest_mpi.data import ENV_VAR, download
    from fednest_mpi.errors import DataError

    dest = args.dest or os.environ.get(ENV_VAR)
    if not dest:
        print(
            f"fednest-mpi: error: --dest: no data root given and {ENV_VAR} is not set; pass --dest DIR", file=sys.stderr
        )
        return 2
    try:
        for name in args.datasets:
            print(f"output: {download(name, dest, base_url=args.mirror)}")
    except DataError as exc:
        print(f"fednest-mpi: error: {exc}", file=sys.stderr)
        return 1
    return 0
