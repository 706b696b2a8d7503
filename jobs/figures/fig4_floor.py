"""Figure 4 at |S| < M: FedNest's time-averaged squared errors against the closed-form sampling
floor (``fednest_mpi.problems.minimax.fednest_sampling_floor``; docs/algorithms.md, "Figure 4").

usage: python jobs/figures/fig4_floor.py RUN_FILE... [--from K]    (called by jobs/figures/fig4.sh)
Prints one Markdown row per FedNest run with partial participation: mean over iterations >= K
(default 20) of ||y - y*||^2 and ||x - x*||^2, and the closed form for that run's data.
"""

from __future__ import annotations

import sys

from fednest_mpi import config
from fednest_mpi.post import load_run
from fednest_mpi.problems import build_problem
from fednest_mpi.problems.minimax import fednest_sampling_floor


def main(argv: list[str]) -> int:
    start = 20
    if "--from" in argv:
        at = argv.index("--from")
        start, argv = int(argv[at + 1]), argv[:at] + argv[at + 2 :]
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__)
        return 2
    print(f"| run | mean ‖y − y*‖², k ≥ {start} | closed form | mean ‖x − x*‖², k ≥ {start} | closed form |")
    print("|---|---|---|---|---|")
    for path in argv:
        df = load_run(path)
        cfg = config.from_dict(df.attrs["config"])
        a = cfg.algorithm
        if (
            a.name != "fednest"
            or a.clients_per_round >= cfg.problem.n_clients
            or cfg.heterogeneity.local_work != "full"
        ):
            continue  # the closed form: FedNest, |S| < M, every client the same local steps
        if a.inner_rounds != 1:  # the authors_code preset's T = 10: the closed form is for T = 1
            print(f"| {path}: T = {a.inner_rounds}, no closed form (T = 1 only) | | | | |")
            continue
        var_y, var_x = fednest_sampling_floor(build_problem(cfg.problem, cfg.seed, range(cfg.problem.n_clients)), a)
        tail = df[df.iteration >= start]
        print(
            f"| s = {cfg.problem.heterogeneity:g}, \\|S\\| = {a.clients_per_round}, seed {cfg.seed} | "
            f"{tail.y_sq_error.mean():.3g} | "
            f"{var_y:.3g} | {tail.x_sq_error.mean():.3g} | {var_x:.3g} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
