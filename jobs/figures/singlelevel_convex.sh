#!/usr/bin/env bash
# Single level, convex (FedNest paper section 3.3, Theorem 3.2): FedAvg vs FedSVRG with multinomial
# logistic regression on cross-silo non-iid MNIST, beta in {0.003, 0.01, 0.03}, 3 seeds, 200 rounds.
# Sweep: jobs/sweeps/singlelevel_convex.toml. Options: see jobs/figures/figure.sh (bash $0 -h);
# run it with -n 1 (one rank per run; the sweep's runs are small).
# Example: bash jobs/figures/singlelevel_convex.sh -n 1 -j 2
# Besides figure.sh's outputs, writes FIG_DIR/singlelevel_convex_gap.png (g(y) - g* against rounds,
# log scale, mean over seeds) and FIG_DIR/singlelevel_convex_gap.md (g* of every seed from a
# central L-BFGS solve, and the optimality gap per run at equal rounds: singlelevel_optimum.py).
FIGURE=singlelevel_convex METRIC=inner_loss GROUP_BY="-g algorithm.name -g algorithm.inner_lr" AT="1 10 25 50 100 200"
source "$(dirname "${BASH_SOURCE[0]}")/figure.sh"
python "$(dirname "${BASH_SOURCE[0]}")/singlelevel_optimum.py" "$RUN_DIR"/*.h5 --plot "$FIG_DIR/singlelevel_convex_gap.png" \
    > "$FIG_DIR/singlelevel_convex_gap.md"
cat "$FIG_DIR/singlelevel_convex_gap.md"
echo "output: $FIG_DIR/singlelevel_convex_gap.md"
