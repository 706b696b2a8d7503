#!/usr/bin/env bash
# Figure 6 (a)-(d) (appendix H.2): learning rate alpha = 0.0075, 0.005, 0.0025, 0.001 (one panel each),
# FedNest, FedNest_SGD, LFedNest and LFedNest_SVRG on non-iid MNIST hyper-representation, test accuracy
# against communication rounds. Sweep and presets: jobs/sweeps/fig6.toml (authors_code: alpha = eta).
# Options: see jobs/figures/figure.sh (bash $0 -h). Example (shortened):  bash jobs/figures/fig6.sh -P paper -k 10 -n 1
# Besides figure.sh's outputs (all panels in one plot, table grouped by alpha), writes the paper's panels
# FIG_DIR/fig6_PRESET_{a,b,c,d}.png.
FIGURE=fig6 METRIC=test_accuracy GROUP_BY="-g algorithm.outer_lr -g algorithm.name" AT="10 20 50 100 200 500" AXES=comm_rounds
source "$(dirname "${BASH_SOURCE[0]}")/figure.sh"
panel=(a b c d)
i=0
for alpha in 0.0075 0.005 0.0025 0.001; do
    fednest-mpi plot "$RUN_DIR"/*_alpha${alpha}_seed*.h5 -m test_accuracy -x comm_rounds -g algorithm.name --smooth 5 \
        --title "Fig. 6(${panel[$i]}): alpha = $alpha, non-iid" -o "$FIG_DIR/${NAME}_${panel[$i]}.png"
    i=$((i + 1))
done
