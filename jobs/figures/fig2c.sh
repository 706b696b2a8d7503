#!/usr/bin/env bash
# Figure 2(c): FedNest with tau = 1 vs 5 local outer steps, non-iid MNIST hyper-representation.
# Sweep: jobs/sweeps/fig2c.toml. Options: see jobs/figures/figure.sh (bash $0 -h).
# Example (shortened, 2 ranks per run, 2 runs at once):  FEDNEST_DATA=../shared/data bash jobs/figures/fig2c.sh -k 40 -n 1 -j 2
FIGURE=fig2c METRIC=test_accuracy GROUP_BY="-g algorithm.outer_local_steps" AT="10 20 30 38 60 100 200 500"
source "$(dirname "${BASH_SOURCE[0]}")/figure.sh"
