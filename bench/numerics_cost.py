"""The cost of the numerical modes (``run.numerics``) and reductions (``federation.reduction``): the paper
setting and the many-clients targets run in each setting side by side, one rank, one torch thread, the settings
interleaved case by case so that the machine's load falls on all of them alike. The settings: the fastest one
offered (``native``, ``sum``), the default (``reproducible``, ``exact``), the default mode with the plain sum (the
exact sum's own cost), ``portable`` and the ``ordered`` reduction.

    FEDNEST_DATA=../shared/data .venv/bin/python bench/numerics_cost.py [--iterations 4] [--cases a,b] \
        [--settings native:sum,reproducible:exact]

Each run is a ``fednest-mpi run`` under ``/usr/bin/time -v`` in a fresh process whose
``FEDNEST_NUMERICS`` names the mode. Prints a Markdown table: median seconds per outer iteration of the
algorithm (iterations after the first), user and sys CPU seconds and peak RSS of the whole process, and each
setting's time and user CPU relative to the first setting (by default the fastest, native with sum).
Rows: docs/performance.md, "The cost of the guarantee".
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: (run.numerics, federation.reduction), the first the baseline of the ratios
SETTINGS = (
    ("native", "sum"),
    ("reproducible", "exact"),
    ("reproducible", "sum"),
    ("portable", "exact"),
    ("reproducible", "ordered"),
)

#: name -> (config, overrides): the paper setting and the issue-16 targets (bench/targets.toml), shortened
CASES = {
    "paper_hyperrep": ("configs/mnist/hyperrep/noniid/fednest.toml", []),
    "fedavg_tiny": (
        "configs/singlelevel/mnist/iid/fedavg.toml",
        [
            "problem.n_clients=10000",
            "problem.hidden2=0",
            "problem.batch_size=4",
            "problem.val_fraction=0.01",
            "algorithm.inner_local_steps=5",
            "algorithm.inner_lr=0.01",
            "algorithm.clients_per_round=1000",
        ],
    ),
    "hyperrep_tiny": (
        "configs/mnist/hyperrep/iid/fednest.toml",
        [
            "problem.n_clients=10000",
            "problem.batch_size=3",
            "algorithm.inner_local_steps=5",
            "algorithm.clients_per_round=1000",
        ],
    ),
    "losstune_tiny": (
        "configs/mnist/losstuning/iid/fednest.toml",
        [
            "problem.n_clients=10000",
            "problem.imbalance_ratio=1.0",
            "problem.batch_size=3",
            "algorithm.inner_local_steps=5",
            "algorithm.clients_per_round=1000",
        ],
    ),
    "synthetic_float32": (
        "",  # no shipped Synthetic config: the problem's defaults
        [
            "problem.name=synthetic",
            "problem.n_clients=10000",
            "algorithm.clients_per_round=1000",
            "run.dtype=float32",
        ],
    ),
}


def run_case(
    config: str, overrides: list[str], mode: str, reduction: str, iterations: int, folder: Path
) -> dict[str, float]:
    """One run of ``config`` in mode ``mode`` with ``reduction``: median algorithm seconds per iteration, rusage."""
    out = folder / f"{mode}-{reduction}.h5"
    if not config:
        config = str(folder / "empty.toml")
        Path(config).write_text('[problem]\nname = "synthetic"\n')
    sets = [*overrides, f"algorithm.outer_iterations={iterations}", f"run.numerics={mode}"]
    sets.append(f"federation.reduction={reduction}")
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "fednest_mpi", "run", config, "--output", str(out)]
    cmd += ["--overwrite", "--quiet"] + [a for s in sets for a in ("--set", s)]
    env = dict(os.environ, FEDNEST_NUMERICS=mode, OMP_NUM_THREADS="1", MPI4PY_RC_THREAD_LEVEL="single")
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    from fednest_mpi.io.h5 import read_run

    attrs, cols = read_run(out)
    usage = {
        key: float(re.search(pattern, done.stderr).group(1))  # type: ignore[union-attr]
        for key, pattern in (
            ("user", r"User time \(seconds\): ([\d.]+)"),
            ("sys", r"System time \(seconds\): ([\d.]+)"),
            ("rss_mib", r"Maximum resident set size \(kbytes\): (\d+)"),
        )
    }
    usage["rss_mib"] /= 1024
    usage["seconds"] = float(np.median(cols["algorithm_time"][2:]))  # row 0: start, row 1: warm-up
    usage["mkl"] = attrs.get("numerics", "")
    return usage


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=4, help="outer iterations per run (default 4)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument(
        "--settings",
        default=",".join(f"{m}:{r}" for m, r in SETTINGS),
        help="comma-separated MODE:REDUCTION pairs, the first one the baseline (default: all five)",
    )
    args = parser.parse_args(argv)
    settings = [tuple(s.split(":", 1)) for s in args.settings.split(",")]
    if any(len(s) != 2 for s in settings):
        parser.error("--settings: give MODE:REDUCTION pairs, e.g. native:sum,reproducible:exact")
    first = f"{settings[0][0]}, {settings[0][1]}"
    print(f"| case | mode | reduction | s / iteration | vs {first} | user s | user vs {first} | sys s | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            config, overrides = CASES[name]
            base = None
            for mode, reduction in settings:
                r = run_case(config, overrides, mode, reduction, args.iterations, Path(tmp))
                base = base or r
                print(
                    f"| {name} | {mode} | {reduction} | {r['seconds']:.3f} | {r['seconds'] / base['seconds']:.2f}x "
                    f"| {r['user']:.1f} | {r['user'] / base['user']:.2f}x | {r['sys']:.2f} | {r['rss_mib']:.0f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
