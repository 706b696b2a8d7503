"""Committed reference results: a few small runs whose bits must be the same on every machine of a CPU class.

    .venv/bin/python tests/reference_runs.py --check  [--mode portable]   # exit 1 and the differing case
    .venv/bin/python tests/reference_runs.py --record [--mode portable]   # add this machine's class
    .venv/bin/python tests/reference_runs.py --record --replace --mode M  # after a change that alters the bits

Each case is a small run (float64 and float32, the quadratic, Synthetic and MNIST problems) in-process
on one rank; its digest is the SHA-256 of the bytes of the final x and y and of every metric column
that does not measure time. ``tests/data/references.json`` holds, per ``run.numerics`` mode, the
digests of each CPU class they were recorded on (:func:`fednest_mpi.numerics.cpu_class`): in mode
``portable`` the class names no vendor, so an Intel and an AMD machine check the same entry. The
mode is fixed for a process at its first computation, so each mode is checked in a fresh process
(tests/unit/test_references.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCES = HERE / "data" / "references.json"
TIMING = {"wall_time", "algorithm_time", "evaluation_time", "comm_seconds"}


def cases(data_dir: str) -> dict[str, dict]:
    """name -> config dict of every reference run: the five recorded on Intel and AMD since 0.1 with
    ``federation.reduction = "sum"`` (so those records stay comparable across machines), and each again with the
    default reduction (``NAME_exact``)."""
    first = _first_cases(data_dir)
    with_sum = {name: {**data, "federation": {"reduction": "sum"}} for name, data in first.items()}
    return {**with_sum, **{f"{name}_exact": data for name, data in first.items()}}


def _first_cases(data_dir: str) -> dict[str, dict]:
    small_mnist = {"data_dir": data_dir, "n_clients": 20, "partition": "shards", "batch_size": 8}
    short = {"outer_iterations": 3, "clients_per_round": 5}
    return {
        "quadratic_fednest_float64": {
            "seed": 5,
            "problem": {"name": "quadratic", "n_clients": 12, "dim_x": 4, "dim_y": 6, "gradient_noise": 0.1},
            "algorithm": {"name": "fednest", **short, "neumann_steps": 3},
        },
        "quadratic_fedbioacc_float32": {
            "seed": 6,
            "problem": {"name": "quadratic", "n_clients": 12, "dim_x": 4, "dim_y": 6, "lower_level": "local"},
            "algorithm": {"name": "fedbioacc", **short},
            "run": {"dtype": "float32"},
        },
        "synthetic_fednest_float32": {
            "seed": 7,
            "problem": {
                "name": "synthetic",
                "n_clients": 40,
                "hidden": 6,
                "n_inputs": 9,
                "n_classes": 4,
                "samples_per_client": 12,
                "size_distribution": "lognormal",
                "size_sigma": 0.5,
                "eval_clients": 5,
                "eval_samples": 10,
            },
            "algorithm": {"name": "fednest", **short},
            "run": {"dtype": "float32"},
        },
        "mnist_hyperrep_lfednest_float32": {
            "seed": 8,
            "problem": {"name": "hyper_representation", "hidden": 16, **small_mnist},
            "algorithm": {"name": "lfednest", **short},
            "run": {"dtype": "float32"},
        },
        "mnist_losstuning_fednest_float64": {
            "seed": 9,
            "problem": {"name": "loss_tuning", "hidden1": 12, "hidden2": 8, "max_per_class": 200, **small_mnist},
            "algorithm": {"name": "fednest", **short, "neumann_steps": 2},
        },
    }


def digest(data: dict) -> str:
    """SHA-256 of the final x, y and every non-timing metric of the run of config ``data``."""
    import numpy as np

    from fednest_mpi import config
    from fednest_mpi.comm import SerialComm
    from fednest_mpi.runner import simulate

    result = simulate(config.from_dict(data), SerialComm())
    h = hashlib.sha256()
    for tensor in (result.x, result.y):
        h.update(tensor.detach().cpu().numpy().tobytes())
    for name in sorted(result.history):
        if name not in TIMING:
            h.update(name.encode())
            h.update(np.asarray(result.history[name], dtype=np.float64).tobytes())
    return h.hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="reproducible", help="run.numerics of the runs (default reproducible)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="compare with tests/data/references.json")
    what.add_argument("--record", action="store_true", help="write this machine's digests into it")
    parser.add_argument("--replace", action="store_true", help="with --record: overwrite digests already recorded")
    parser.add_argument("--against", help="compare with this recorded CPU class (of any mode) instead of ours")
    args = parser.parse_args(argv)
    os.environ["FEDNEST_NUMERICS"] = args.mode  # before fednest_mpi is imported: MKL is set for the mode
    from fednest_mpi import numerics

    paths = numerics.establish(args.mode)
    import numpy  # noqa: F401 -- loaded now, so that the class below names OpenBLAS's core

    cpu = numerics.cpu_class(numerics.in_force())
    data_dir = os.environ.get("FEDNEST_DATA") or str(HERE.parents[1] / "shared" / "data")
    got = {}
    for name, data in cases(data_dir).items():
        data = {**data, "run": {**data.get("run", {}), "numerics": args.mode, "output": "unused.h5"}}
        got[name] = digest(data)
    table = json.loads(REFERENCES.read_text()) if REFERENCES.exists() else {}
    if args.record:  # merged into what the class has; a recorded digest is replaced only with --replace
        mine = table.setdefault(args.mode, {}).setdefault(cpu, {})
        for name, value in got.items():
            if name in mine and mine[name] != value and not args.replace:
                print(f"KEPT: {name}: recorded {mine[name][:16]}, here {value[:16]} (--replace to overwrite)")
            else:
                mine[name] = value
        REFERENCES.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(got)} digests for mode {args.mode!r}, CPU class {cpu!r}")
        return 0
    recorded = table.get(args.mode, {})
    if args.against:  # a class recorded in any mode (another mode's class: a comparison that must fail)
        classes = [table[m] for m in MODES_RECORDED if args.against in table.get(m, {})]
        recorded = {cpu: classes[0][args.against] if classes else {}}
    if cpu not in recorded:
        print(
            f"SKIP: no reference results of mode {args.mode!r} for this CPU class {cpu!r} (recorded: "
            f"{'; '.join(map(repr, recorded)) or 'none'}); on such a machine: python tests/reference_runs.py "
            f"--record --mode {args.mode}"
        )
        return 3
    return compare(got, recorded[cpu], table.get(KNOWN, {}).get(args.mode, {}), args.mode, cpu, paths)


#: the modes whose classes references.json records
MODES_RECORDED = ("reproducible", "portable", "native")
#: key of references.json: per mode, the cases known to differ between vendors in a class that names none
#: ({case: {vendor: digest, "why": reason}}), reported as such instead of failing (docs/design.md), and the cases
#: whose digest in such a class was recorded on one vendor only ({case: {"not_yet_compared": [vendor, ...], "why":
#: reason}}): on a listed vendor a differing digest is reported as NOT YET COMPARED (with the command that records
#: it), not as a failure, and the same digest as confirmed
KNOWN = "known_vendor_differences"


def compare(got: dict, recorded: dict, known: dict, mode: str, cpu: str, paths: dict) -> int:
    """Print one line per case that differs, is a known vendor difference or is not recorded for the class;
    0 when none differs."""
    wrong = []
    vendor = paths["cpu_vendor"]
    for name, value in got.items():
        pending = vendor in known.get(name, {}).get("not_yet_compared", [])
        if pending and name in recorded:
            same = "the same digest: confirmed on this vendor (remove it from not_yet_compared)"
            print(
                f"NOT YET COMPARED: {name} on {vendor}: recorded on another vendor only ({known[name]['why']}); "
                + (
                    same
                    if recorded[name] == value
                    else f"got {value[:16]}, recorded {recorded[name][:16]}: add it "
                    f"under {KNOWN} with the cause once found (docs/design.md)"
                )
            )
        elif recorded.get(name) != value and known.get(name, {}).get(vendor) == value:
            print(f"KNOWN VENDOR DIFFERENCE: {name} on {vendor}: {known[name]['why']}")
        elif name not in recorded:
            print(f"NOT RECORDED: {name} in mode {mode!r} for CPU class {cpu!r} (checked where recorded)")
        elif recorded[name] != value:
            wrong.append(name)
            print(
                f"DIFFERENT: {name} in mode {mode!r} on CPU class {cpu!r} ({paths['cpu_model']}): "
                f"got {value[:16]}, recorded {recorded[name][:16]}"
            )
    if not wrong:
        same = sum(recorded.get(n) == v for n, v in got.items())
        print(f"same bits: {same} reference runs, mode {mode!r}, CPU class {cpu!r}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
