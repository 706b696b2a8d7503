#!/usr/bin/env bash
# Figure 4: FedNest (eq. (9)) vs LFedNest vs FedAvg-S on the minimax problem, s = 1 and 10, at 50 of
# 1000 clients per round and at full participation; ||x - x*||^2 and ||y - y*||^2 on a log scale.
# Sweep: jobs/sweeps/fig4.toml. Options: see jobs/figures/figure.sh (bash $0 -h).
# Example (shortened, 2 ranks per run):  bash jobs/figures/fig4.sh -k 40 -n 2
# Besides figure.sh's outputs, writes FIG_DIR/fig4_s{S}_S{CLIENTS}.png (one panel pair per
# heterogeneity level and participation, unsmoothed) and FIG_DIR/fig4_errors.md (unsmoothed table, and
# FedNest's floor at 50 of 1000 clients against its closed form: jobs/figures/fig4_floor.py).
FIGURE=fig4 METRIC=x_sq_error GROUP_BY="-g algorithm.name -g problem.heterogeneity -g algorithm.clients_per_round" AT="1 5 10 20 40 100"
source "$(dirname "${BASH_SOURCE[0]}")/figure.sh"
for clients in 50 1000; do
    for s in 1.0 10.0; do
        fednest-mpi plot "$RUN_DIR"/*_s${s}_S${clients}_seed*.h5 -m x_sq_error -m y_sq_error -g algorithm.name --logy \
            -o "$FIG_DIR/fig4_s${s}_S${clients}.png"
    done
done
for metric in x_sq_error y_sq_error; do
    echo "$metric (unsmoothed, mean ± sd over seeds):"
    fednest-mpi report "$RUN_DIR" -m $metric "${AT_ARGS[@]}" "${GROUP_ARGS[@]}"
    echo
done > "$FIG_DIR/fig4_errors.md"
echo "FedNest at 50 of 1000 clients: time averages against the closed-form sampling floor" >> "$FIG_DIR/fig4_errors.md"
python "$(dirname "${BASH_SOURCE[0]}")/fig4_floor.py" "$RUN_DIR"/fednest_*.h5 >> "$FIG_DIR/fig4_errors.md"
cat "$FIG_DIR/fig4_errors.md"
echo "output: $FIG_DIR/fig4_errors.md"
