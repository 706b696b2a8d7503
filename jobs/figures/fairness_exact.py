"""Fair FL on UCI Adult: the metrics at the exact lower-level solution y*(x) of the global lower level,
min_y (1/M) sum_i g_i(x, y) (logistic regression: strongly convex), for the unweighted x = 0 and for
the tuned weights of runs. This separates what the weights achieve from how far the federated
training of y is from y*(x) (docs/algorithms.md, "Fair federated learning").

usage: python jobs/figures/fairness_exact.py RUN_FILE... [--weights NAME=W,...]...
                                                         (called by jobs/figures/fairness_retrain.sh)
For every run: y*(0), y*(x_last) and y*(x) for every --weights (a problem.initial_weights value, e.g.
Asian-Pac-Islander=3) by L-BFGS on the problem's own oracles (float64, whole splits, certified by
||grad|| <= 1e-8), then one Markdown row each of accuracy, worst-group accuracy, group accuracy
gap, EO and DP gaps and the worst-group test loss on adult.test.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from fednest_mpi import config
from fednest_mpi.post import load_run
from fednest_mpi.problems import build_problem

METRICS = (
    "test_accuracy",
    "worst_group_accuracy",
    "group_accuracy_gap",
    "worst_cell_accuracy",
    "eo_gap",
    "dp_gap",
    "worst_group_test_loss",
)


def exact_inner(prob, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(y*(x), ||grad_y g(x, y*)||) for the mean over all clients of g_i."""
    ids = np.arange(prob.n_clients)
    X = x.expand(len(ids), -1)
    y = prob.initial_point()[1].clone().requires_grad_(True)
    solver = torch.optim.LBFGS(
        [y],
        lr=1.0,
        max_iter=1000,
        history_size=30,
        tolerance_grad=1e-10,
        tolerance_change=1e-16,
        line_search_fn="strong_wolfe",
    )

    def closure():
        Y = y.detach().expand(len(ids), -1)
        y.grad = prob.grad_y_inner(ids, X, Y, None).mean(0)
        return prob.inner_value(ids, X, Y).mean()

    solver.step(closure)
    closure()
    return y.detach(), float(y.grad.norm())


def main(argv: list[str]) -> int:
    paths, probes, it = [], [], iter(argv)
    for a in it:
        if a == "--weights":
            probes.append(next(it, ""))
        elif a.startswith("-"):
            paths = []
            break
        else:
            paths.append(a)
    if not paths:
        print(__doc__)
        return 2
    print("| run | weights | ‖∇g‖ at y* | " + " | ".join(METRICS) + " |")
    print("|---|---|---|" + "---|" * len(METRICS))
    for path in paths:
        df = load_run(path)
        cfg = config.from_dict(df.attrs["config"])
        prob = build_problem(cfg.problem, cfg.seed, range(cfg.problem.n_clients), dtype=torch.float64)
        names = prob.cell_names()
        tuned = torch.as_tensor([df[f"weight_{n}"].iloc[-1] for n in names], dtype=torch.float64).log()
        points = [
            ("unweighted", torch.zeros(prob.dim_x, dtype=torch.float64)),
            ("tuned (last iteration)", tuned - tuned.mean()),
        ]
        points += [(f"given {text}", prob.x_of_weights(text)) for text in probes]
        for label, x in points:
            y, norm = exact_inner(prob, x)
            if norm > 1e-8:
                raise SystemExit(f"fairness_exact.py: L-BFGS stopped at ||grad|| = {norm:.1e} > 1e-8 for {path}")
            m = prob.evaluate(x, y)
            w = ", ".join(f"{n} {float(v):.2f}" for n, v in zip(names, prob.cell_weights(x)))
            print(
                f"| {path.rsplit('/', 1)[-1]}, seed {cfg.seed}: {label} | {w} | {norm:.0e} | "
                + " | ".join(f"{m[k]:.2f}" if k != "worst_group_test_loss" else f"{m[k]:.4f}" for k in METRICS)
                + " |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
