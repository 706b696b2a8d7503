"""Optimality gap of single-level runs on a strongly convex task (multinomial logistic regression:
``configs/singlelevel/convex/``; docs/algorithms.md, "Single-level FedAvg and FedSVRG").

usage: python jobs/figures/singlelevel_optimum.py RUN_FILE... [--at R ...] [--plot PNG]
                                                          (called by jobs/figures/singlelevel_convex.sh)

For every seed among the runs, g* = min_y (1/M) sum_i g_i(x0, y) by a central L-BFGS solve (float64,
all clients, whole splits), certified with the problem's own oracles by strong convexity:
g(y) - g* <= ||grad g(y)||^2 / (2 mu).
Then, per (algorithm, beta), the mean and sd over seeds of the gap inner_loss - g* at equal
communication rounds R (default 10 50 100 200), and the test accuracy. --plot draws the mean gap
against rounds on a log scale.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from fednest_mpi import config
from fednest_mpi.post import load_run
from fednest_mpi.problems import build_problem


def optimum(cfg) -> tuple[float, float, float]:
    """(g*, ||grad g||, certified bound on g(y) - g*) for the run's problem and seed.

    L-BFGS runs on the pooled softmax regression (the samples gathered once, each weighted
    1/(M n_i): g = (1/M) sum_i g_i); the value and gradient that are reported and certified are
    the problem's own oracles (``inner_value``, ``grad_y_inner`` on whole splits) at the solution.
    """
    prob = build_problem(cfg.problem, cfg.seed, range(cfg.problem.n_clients), dtype=torch.float64)
    if len(prob.widths) != 2:
        raise SystemExit("singlelevel_optimum.py: the task must be logistic regression (problem.hidden1 = hidden2 = 0)")
    x0, y = prob.initial_point()
    M, (classes, pixels) = cfg.problem.n_clients, prob.shapes[0]
    rows = [prob.inner.index[i][: prob.inner.count[i]] for i in range(M)]
    pos = torch.as_tensor(np.concatenate(rows))
    A, t = prob.inputs[pos], prob.targets[pos]
    weight = torch.as_tensor(np.concatenate([np.full(len(r), 1.0 / (M * len(r))) for r in rows]), dtype=torch.float64)
    mu = cfg.problem.inner_regularization
    y = y.clone().requires_grad_(True)
    solver = torch.optim.LBFGS(
        [y],
        lr=1.0,
        max_iter=5000,
        history_size=50,
        tolerance_grad=1e-7,
        tolerance_change=1e-16,
        line_search_fn="strong_wolfe",
    )

    def closure():
        solver.zero_grad()
        z = A @ y[: classes * pixels].reshape(classes, pixels).T + y[classes * pixels :]
        loss = (weight * torch.nn.functional.cross_entropy(z, t, reduction="none")).sum() + 0.5 * mu * (y * y).sum()
        loss.backward()
        return loss

    solver.step(closure)
    ids = np.arange(M)
    X, Y = x0.expand(M, -1), y.detach().expand(M, -1)
    value = float(prob.inner_value(ids, X, Y).mean())
    norm = float(prob.grad_y_inner(ids, X, Y, None).mean(0).norm())
    return value, norm, norm**2 / (2 * mu)


def main(argv: list[str]) -> int:
    rounds, plot, paths, it = [], None, [], iter(argv)
    for a in it:
        if a == "--at":
            rounds.append(int(next(it)))
        elif a == "--plot":
            plot = next(it)
        elif a.startswith("-"):
            print(__doc__)
            return 2
        else:
            paths.append(a)
    if not paths:
        print(__doc__)
        return 2
    rounds = rounds or [10, 50, 100, 200]
    frames = [load_run(p) for p in paths]
    runs = [(df, config.from_dict(df.attrs["config"])) for df in frames]
    best = {}
    print("| seed | g* (L-BFGS) | ‖∇g‖ at the solve | certified g − g* ≤ |")
    print("|---|---|---|---|")
    for seed in sorted({cfg.seed for _, cfg in runs}):
        cfg = next(c for _, c in runs if c.seed == seed)
        best[seed] = optimum(cfg)
        print(f"| {seed} | {best[seed][0]:.10f} | {best[seed][1]:.1e} | {best[seed][2]:.1e} |")
    groups: dict[tuple[str, float], list] = {}
    for df, cfg in runs:
        df = df[np.isfinite(df.inner_loss)].set_index("comm_rounds")
        groups.setdefault((cfg.algorithm.name, cfg.algorithm.inner_lr), []).append((df, best[cfg.seed][0]))
    print()
    print(
        "| algorithm | β | "
        + " | ".join(f"g − g*, {r} rounds" for r in rounds)
        + f" | test accuracy %, {rounds[-1]} rounds |"
    )
    print("|---|---|" + "---|" * (len(rounds) + 1))
    for (name, lr), members in sorted(groups.items()):
        cells = []
        for r in rounds:
            gaps = [df.inner_loss.get(float(r), np.nan) - g for df, g in members]
            cells.append(f"{np.mean(gaps):.3g} ± {np.std(gaps):.2g}")
        acc = [df.test_accuracy.get(float(rounds[-1]), np.nan) for df, _ in members]
        print(f"| {name} | {lr:g} | " + " | ".join(cells) + f" | {np.mean(acc):.2f} ± {np.std(acc):.2f} |")
    if plot:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6.4, 4.2))
        ax = fig.add_subplot()
        for (name, lr), members in sorted(groups.items()):
            gap = np.mean([(df.inner_loss - g).to_numpy() for df, g in members], axis=0)
            ax.semilogy(members[0][0].index, gap, ls="-" if name == "fedsvrg" else "--", label=f"{name}, β = {lr:g}")
        ax.set_xlabel("communication rounds")
        ax.set_ylabel("g(y) − g*  (mean over seeds)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(plot, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
