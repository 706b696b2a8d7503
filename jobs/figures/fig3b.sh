#!/usr/bin/env bash
# Figure 3(b): loss tuning on long-tail MNIST, SVRG vs SGD in FedInn, class-balanced test accuracy.
# Sweep: jobs/sweeps/fig3b.toml. Options: see jobs/figures/figure.sh (bash $0 -h).
# Example (shortened, 2 ranks per run, 2 runs at once):  FEDNEST_DATA=../shared/data bash jobs/figures/fig3b.sh -k 40 -n 1 -j 2
FIGURE=fig3b METRIC=balanced_accuracy GROUP_BY="-g algorithm.name -g problem.partition" AT="10 20 50 100 200 300"
source "$(dirname "${BASH_SOURCE[0]}")/figure.sh"
