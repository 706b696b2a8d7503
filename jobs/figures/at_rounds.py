"""A figure's runs at a budget of communication rounds (the x axis of Figs. 2b, 5b and 6), where
`fednest-mpi report --at K` tabulates at outer iteration K: algorithms that spend different rounds per
iteration (FedNest 2T + N + 3, FedNest_SGD T + N + 3, LFedNest T + 1, LFedNest_SVRG 2T + 1; Table 2)
are compared at the last iteration whose cumulative round count is at most each budget.

usage: python jobs/figures/at_rounds.py RUN_DIR_OR_FILES... -m METRIC -g FIELD [-g FIELD ...] -r ROUNDS [-r ...]
Prints one Markdown row per group (the -g config fields): the metric's 5-iteration trailing running
mean (as the figures draw it) at each budget, mean ± sd (ddof 1) over the group's runs (seeds), and
the outer iteration that budget reaches; "-" where the runs ended before spending that many rounds.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import numpy as np

from fednest_mpi.post.load import read_runs
from fednest_mpi.post.stats import running_mean


def _options(argv: list[str]) -> tuple[list[str], str, list[str], list[int]] | None:
    paths: list[str] = []
    metric, fields, budgets = "", [], []
    it = iter(argv)
    for a in it:
        if a in ("-m", "-g", "-r"):
            value = next(it, None)
            if value is None:
                return None
            if a == "-m":
                metric = value
            elif a == "-g":
                fields.append(value)
            elif not value.isdigit():
                print(f"at_rounds.py: -r takes a whole number of communication rounds, got {value!r}", file=sys.stderr)
                return None
            else:
                budgets.append(int(value))
        elif a.startswith("-"):
            return None
        else:
            paths.append(a)
    if not (paths and metric and fields and budgets):
        return None
    return paths, metric, fields, budgets


def main(argv: list[str]) -> int:
    options = _options(argv)
    if options is None:
        print(__doc__)
        return 2
    paths, metric, fields, budgets = options
    runs = read_runs(paths)
    cells: dict[tuple, list[tuple[float, int]]] = defaultdict(list)
    for run in runs:
        for column in (metric, "comm_rounds", "iteration"):
            if column not in run.data:
                print(f"at_rounds.py: {run.path} records no column {column!r}", file=sys.stderr)
                return 2
        for field in fields:
            if field not in run.config:
                print(f"at_rounds.py: -g {field}: not a config field of {run.path}", file=sys.stderr)
                return 2
        values = running_mean(run.data[metric], 5)
        rounds = np.asarray(run.data["comm_rounds"])
        group = tuple(run.config[f] for f in fields)
        for budget in budgets:
            if budget > rounds[-1]:
                continue  # the run ended before spending this many rounds: "-" unless another run got there
            at = np.nonzero(rounds <= budget)[0][-1]  # iteration 0 has spent 0 rounds
            cells[(group, budget)].append((float(values[at]), int(run.data["iteration"][at])))
    print("| " + ", ".join(fields) + " | " + " | ".join(f"≤ {b} rounds (iteration)" for b in budgets) + " |")
    print("|---|" + "---|" * len(budgets))
    groups = sorted({tuple(run.config[f] for f in fields) for run in runs}, key=str)
    for group in groups:
        row = []
        for budget in budgets:
            got = cells.get((group, budget), [])
            if not got:
                row.append("-")
                continue
            x = np.array([v for v, _ in got])
            sd = f" ± {x.std(ddof=1):.2f}" if x.size > 1 else ""
            iterations = sorted({k for _, k in got})
            row.append(f"{x.mean():.2f}{sd} ({', '.join(map(str, iterations))})")
        print("| " + ", ".join(map(str, group)) + " | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
