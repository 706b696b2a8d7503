"""Check that runs do not depend on the chunk size or the number of ranks, on any configs:
``mpiexec -n P python bench/invariance.py CONFIG.toml [CONFIG.toml ...] [--iterations K] [--chunks 1,7]``.

For every config as it is (its own reduction and numerical mode: the defaults unless it sets them) and K
outer iterations (default 2): the
reference is the run on one rank (``COMM_SELF``) with automatic chunks; it is compared with the run
on all P ranks of ``COMM_WORLD`` with automatic chunks and with each chunk size of ``--chunks``. A
comparison passes when every non-timing column of the history and the final x and y are bitwise
equal. Rank 0 prints one line per config ("bitwise equal", "DIFFERS: ..." or "NOT RUN: ..." when the config
could not run, e.g. its data is missing) and exits 1 when any config differs or did not run (2: usage error).

Example (every shipped config on 2 ranks; docs/performance.md gives the time it took)::

    FEDNEST_DATA=../shared/data .venv/bin/mpiexec -n 2 .venv/bin/python bench/invariance.py \
        $(find configs -name '*.toml')

docs/design.md ("Rank-count invariance") says what makes this hold; docs/performance.md records runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

from fednest_mpi import config  # noqa: E402
from fednest_mpi.errors import UsageError  # noqa: E402
from fednest_mpi.runner import simulate  # noqa: E402

TIMING_MARKS = ("time", "seconds")


def differences(run, reference) -> list[str]:
    """Names of the non-timing columns (and x, y) in which ``run`` differs from ``reference``, bitwise."""
    names = [
        k
        for k, values in reference.history.items()
        if not any(mark in k for mark in TIMING_MARKS)
        and not np.array_equal(np.asarray(values), np.asarray(run.history[k]), equal_nan=True)
    ]
    return names + [name for name in ("x", "y") if not torch.equal(getattr(run, name), getattr(reference, name))]


def check(path: str, iterations: int, chunks: list[int], comm) -> list[str]:
    """One line per failing comparison of ``path`` (empty: all bitwise equal). **Collective**."""
    base = [f"algorithm.outer_iterations={iterations}", "run.progress=never"]
    reference = simulate(config.load(path, base), MPI.COMM_SELF)
    failures = []
    for chunk in [0, *chunks]:
        run = simulate(config.load(path, [*base, f"run.chunk_clients={chunk}"]), comm)
        diff = differences(run, reference)
        if diff:
            failures.append(f"{comm.size} ranks, chunk {chunk or 'auto'}: {', '.join(diff[:5])}")
    return failures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="example: see the module docstring")
    parser.add_argument("configs", nargs="+", help="TOML run configs")
    parser.add_argument("--iterations", type=int, default=2, help="outer iterations per run (default 2)")
    parser.add_argument("--chunks", default="1,7", help="chunk sizes besides automatic, comma-separated (default 1,7)")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    try:
        chunks = [int(c) for c in args.chunks.split(",") if c]
    except ValueError:
        parser.error(f"--chunks: {args.chunks!r} is not a comma-separated list of integers")
    failed, not_run = 0, 0
    for path in args.configs:
        try:
            failures = check(path, args.iterations, chunks, comm)
        except UsageError as exc:  # the same verdict on every rank, before any collective of the run
            if comm.rank == 0:
                print(f"{path}: NOT RUN: {exc}", flush=True)
            not_run += 1
            continue
        failed += bool(failures)
        if comm.rank == 0:
            print(f"{path}: {'bitwise equal' if not failures else 'DIFFERS: ' + '; '.join(failures)}", flush=True)
    if comm.rank == 0:
        equal = len(args.configs) - failed - not_run
        print(
            f"{equal} of {len(args.configs)} configs bitwise equal on {comm.size} ranks, {failed} differ, "
            f"{not_run} not run{' (a failure: nothing was checked for them)' if not_run else ''}"
        )
    return 1 if failed or not_run else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
