#!/usr/bin/env bash
# Figure 5 (appendix H.1): LFedNest vs LFedNest_SVRG vs LFedNest-NonAlt on non-iid MNIST hyper-representation,
# test accuracy against outer iterations (a) and communication rounds (b).
# Sweep and presets: jobs/sweeps/fig5.toml. Options: see jobs/figures/figure.sh (bash $0 -h).
# Example (shortened):  bash jobs/figures/fig5.sh -P paper -k 20 -n 1
FIGURE=fig5 METRIC=test_accuracy GROUP_BY="-g algorithm.name" AT="10 20 50 100 200 500"
source "$(dirname "${BASH_SOURCE[0]}")/figure.sh"
