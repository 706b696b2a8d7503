"""CPU profile of outer iterations by phase: ``python bench/cpuprofile.py CONFIG.toml [--set-style overrides ...]``.

Runs one warm-up outer iteration, then profiles 3 with ``cProfile.Profile(time.process_time)``
(CPU time, so other jobs on the machine distort it less than wall time) and prints the CPU per
iteration, the share of the main phases and kernels and the functions with the most own time. 1 rank, no MPI.
Example (docs/performance.md):

    FEDNEST_DATA=../shared/data .venv/bin/python bench/cpuprofile.py configs/mnist/hyperrep/noniid/fednest.toml
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpi4py import MPI  # noqa: E402

from fednest_mpi import config  # noqa: E402
from fednest_mpi.runner import Simulation  # noqa: E402

PHASES = [
    "_inner_local",
    "fed_ihgp",
    "hypergradient",
    "_hvp_yy_inner",
    "_jvp_xy_inner",
    "_grad_x_outer",
    "_grad_y_outer",
    "_grad_y_inner",
    "generate",
    "addmm",
    "bmm",
    "baddbmm",
    "index_select",
    "batch",
    "argsort",
    "key",
]
TOP = 15


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cfg = config.load(argv[0], ["algorithm.outer_iterations=4", "run.progress=never"] + argv[1:])
    sim = Simulation(cfg, MPI.COMM_SELF)
    x, y = sim.problem.initial_point()
    x, y, _ = sim.algorithm.step(1, x, y)
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    for k in range(2, 5):
        x, y, _ = sim.algorithm.step(k, x, y)
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt / 3
    print(f"CPU per outer iteration under cProfile: {total:.3f} s")
    for name in PHASES:
        hits = [
            v
            for f, v in stats.stats.items()
            if f[2] == name or f[2].endswith((f" {name}>", f".{name}>")) or f"'{name}'" in f[2]
        ]
        own, cum = sum(v[2] for v in hits) / 3, sum(v[3] for v in hits) / 3
        if cum:
            print(f"{name:>16}: self {own:.3f} s, cumulative {cum:.3f} s ({100 * cum / total:.0f} %)")
    print(f"the {TOP} functions with the most own CPU per outer iteration:")
    for (path, line, name), v in sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:TOP]:
        where = name if path == "~" else f"{Path(path).name}:{line}({name})"
        print(f"  {v[2] / 3:.3f} s  {v[1] // 3:>6} calls  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
