"""``fednest-mpi data convert | check``: your own data as a federated data-set file (docs/data.md)."""

from __future__ import annotations

import argparse

from fednest_mpi.cli.common import usage_error
from fednest_mpi.errors import UsageError

EPILOG_DATA = """\
examples:
  fednest-mpi data convert mine.npz --partition dirichlet --clients 100 --alpha 0.5 --seed 0 -o mine.h5
  fednest-mpi data check mine.h5
  # mine.npz: np.savez("mine.npz", features=X, labels=Y[, test_features=Xt, test_labels=Yt]); docs/data.md
exit codes: 0 done / valid, 2 bad arguments or a malformed input file (one line naming the defect)
"""


def add(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    data = sub.add_parser("data", help="your own data: convert arrays to a federated data-set file, check one",
                          epilog=EPILOG_DATA, formatter_class=fmt)  # fmt: skip
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    conv = dsub.add_parser("convert", help="split (features, labels) of a .npz among clients into an HDF5 file",
                           epilog=EPILOG_DATA, formatter_class=fmt)  # fmt: skip
    conv.add_argument("input", help=".npz with features and labels (or x_train, y_train)")
    conv.add_argument("--output", "-o", required=True, help="federated data-set file to write (.h5)")
    conv.add_argument("--partition", "-p", default="iid", choices=("iid", "shards", "dirichlet"), help="(default iid)")
    conv.add_argument("--clients", "-M", type=int, default=10, help="number of clients (default %(default)s)")
    conv.add_argument("--seed", type=int, default=0, help="seed of the partition (default %(default)s)")
    conv.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration (default %(default)s)")
    conv.add_argument("--shards-per-client", type=int, default=2, help="shards partition (default %(default)s)")
    conv.add_argument("--min-size", type=int, default=1, help="Dirichlet: samples per client at least (default 1)")
    conv.add_argument("--n-classes", type=int, help="number of classes (default: the largest label + 1)")
    conv.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    chk = dsub.add_parser("check", help="validate a federated data-set file (reads it whole) and summarise it",
                          epilog=EPILOG_DATA, formatter_class=fmt)  # fmt: skip
    chk.add_argument("file", help="federated data-set file (.h5)")


def execute(args) -> int:
    from fednest_mpi.data.federated import convert_npz, describe

    try:
        if args.data_command == "check":
            print(describe(args.file), end="")
            return 0
        options = dict(partition=args.partition, n_clients=args.clients, seed=args.seed, alpha=args.alpha,
                       shards_per_client=args.shards_per_client, min_size=args.min_size)  # fmt: skip
        path = convert_npz(args.input, args.output, n_classes=args.n_classes, overwrite=args.overwrite, **options)
        print(describe(path), end="")
    except UsageError as exc:
        return usage_error(exc)
    return 0
