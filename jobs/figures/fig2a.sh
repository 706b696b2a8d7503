#!/usr/bin/env bash
# Figure 2(a): FedNest vs LFedNest, iid and non-iid MNIST hyper-representation, test accuracy.
# Sweep: jobs/sweeps/fig2a.toml. Options: see jobs/figures/figure.sh (bash $0 -h).
# Example (shortened, 2 ranks per run, 2 runs at once):  FEDNEST_DATA=../shared/data bash jobs/figures/fig2a.sh -k 40 -n 1 -j 2
FIGURE=fig2a METRIC=test_accuracy GROUP_BY="-g algorithm.name -g problem.partition" AT="10 20 30 38 60 100 200 500"
source "$(dirname "${BASH_SOURCE[0]}")/figure.sh"
