"""Helpers of jobs/figures/fairness_retrain.sh (fair FL on UCI Adult: retrain with tuned group weights).

usage: python jobs/figures/fairness_retrain.py weights RUN_FILE
           the run's cell weights at its last iteration, as a problem.initial_weights value
       python jobs/figures/fairness_retrain.py table [--last K] RUN_FILE...
           Markdown table, mean ± sd over the runs of each kind (retrained with given weights,
           unweighted): the fairness metrics at the last iteration and averaged over the last K
           iterations (default 20)
"""

from __future__ import annotations

import sys

import numpy as np

from fednest_mpi import config
from fednest_mpi.post import load_run

METRICS = (
    "worst_group_accuracy",
    "group_accuracy_gap",
    "worst_cell_accuracy",
    "test_accuracy",
    "eo_gap",
    "dp_gap",
    "worst_group_test_loss",
)


def weights(path: str) -> str:
    last = load_run(path).iloc[-1]
    return ",".join(f"{name[len('weight_') :]}={last[name]:.6g}" for name in last.index if name.startswith("weight_"))


def table(paths: list[str], last: int) -> str:
    kinds: dict[str, list] = {}
    for path in paths:
        df = load_run(path)
        tuned = config.from_dict(df.attrs["config"]).problem.initial_weights.strip() != ""
        kinds.setdefault("tuned weights" if tuned else "unweighted", []).append(df)
    lines = [
        "| weights | runs | " + " | ".join(f"{m} (last / mean of last {last})" for m in METRICS) + " |",
        "|---|---|" + "---|" * len(METRICS),
    ]
    for kind, runs in sorted(kinds.items()):
        cells = []
        for m in METRICS:
            end = [df[m].iloc[-1] for df in runs]
            tail = [df[m].iloc[-last:].mean() for df in runs]
            cells.append(f"{np.mean(end):.2f} ± {np.std(end):.2f} / {np.mean(tail):.2f} ± {np.std(tail):.2f}")
        lines.append(f"| {kind} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "weights":
        print(weights(argv[1]))
        return 0
    if argv and argv[0] == "table":
        rest, last = argv[1:], 20
        if rest[:1] == ["--last"]:
            last, rest = int(rest[1]), rest[2:]
        if rest and not any(a.startswith("-") for a in rest):
            print(table(rest, last))
            return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
