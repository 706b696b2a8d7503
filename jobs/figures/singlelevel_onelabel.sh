#!/usr/bin/env bash
# Single level, MLP (FedNest paper section 3.3): FedAvg vs FedSVRG on cross-silo MNIST with one
# label-sorted shard per client (the largest client drift), beta in {0.01, 0.05}, 3 seeds, 100 rounds.
# Sweep: jobs/sweeps/singlelevel_onelabel.toml. Options: see jobs/figures/figure.sh (bash $0 -h);
# run it with -n 1 (one rank per run). The metric is the training objective over all clients
# (inner_loss, recorded every 10 iterations); the table is at iterations 10, 20, ... of each run.
# Example: bash jobs/figures/singlelevel_onelabel.sh -n 1 -j 2
FIGURE=singlelevel_onelabel METRIC=inner_loss GROUP_BY="-g algorithm.name -g algorithm.inner_lr" AT="10 20 30 40 50 100"
source "$(dirname "${BASH_SOURCE[0]}")/figure.sh"
