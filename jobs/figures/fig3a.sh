#!/usr/bin/env bash
# Figure 3(a): loss tuning on long-tail MNIST, class-balanced test accuracy of FedNest and LFedNest tuning
# the VS-loss, the non-federated bilevel run (the pooled data as one client: a line) and the untuned
# accuracy (plain cross-entropy: a black dashed constant at its final value), iid and non-iid.
# Sweep and presets: jobs/sweeps/fig3a.toml. Options: see jobs/figures/figure.sh (bash $0 -h); 1 rank per
# run by default (the non-federated run has one client).
# Example (shortened):  bash jobs/figures/fig3a.sh -P paper -k 20
FIGURE=fig3a METRIC=balanced_accuracy DEFAULT_RANKS=1 AT="10 20 50 100 200 250 300"
GROUP_BY="-g algorithm.name -g problem.n_clients -g problem.tune_loss -g problem.partition"
PLOT_ARGS="--constant problem.tune_loss=false"
source "$(dirname "${BASH_SOURCE[0]}")/figure.sh"
