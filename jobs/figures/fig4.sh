#!/usr/bin/env bash
# Figure 4: FedNest (eq. (9)) vs LFedNest (Algorithm 5's minimax line) vs FedAvg-S on the minimax
# problem, s = 1 and 10; ||x - x*||^2 and ||y - y*||^2 on a log scale against outer iterations, as in
# the paper. Sweep and presets: jobs/sweeps/fig4.toml (paper: all 1000 clients with equal local work,
# all 1000 with client drift (tau_i ~ U{1..10}), 50 of 1000; authors_code: the notebook's settings).
# Options: see jobs/figures/figure.sh (bash $0 -h).
# Example (shortened, 1 rank per run):  bash jobs/figures/fig4.sh -P paper -k 40 -n 1
# Besides figure.sh's outputs, writes FIG_DIR/fig4_PRESET_s{S}_S{CLIENTS}_{WORK}.png (the paper's panel
# pair, ||x - x*||^2 and ||y - y*||^2, per heterogeneity level and participation setting, unsmoothed) and
# FIG_DIR/fig4_PRESET_errors.md (unsmoothed table, and FedNest's floor at 50 of 1000 clients against its
# closed form: jobs/figures/fig4_floor.py).
FIGURE=fig4 METRIC=x_sq_error AT="1 5 10 20 40 100 200"
GROUP_BY="-g algorithm.name -g problem.heterogeneity -g algorithm.clients_per_round -g heterogeneity.local_work"
source "$(dirname "${BASH_SOURCE[0]}")/figure.sh"
for run in "$RUN_DIR"/fednest_s*_seed0.h5; do
    setting=$(basename "$run" _seed0.h5); setting=${setting#fednest_}
    fednest-mpi plot "$RUN_DIR"/*_"${setting}"_seed*.h5 -m x_sq_error -m y_sq_error -g algorithm.name --logy \
        -o "$FIG_DIR/${NAME}_${setting}.png"
done
for metric in x_sq_error y_sq_error; do
    echo "$metric (unsmoothed, mean ± sd over seeds):"
    fednest-mpi report "$RUN_DIR" -m $metric "${AT_ARGS[@]}" "${GROUP_ARGS[@]}"
    echo
done > "$FIG_DIR/${NAME}_errors.md"
echo "FedNest at 50 of 1000 clients: time averages against the closed-form sampling floor" >> "$FIG_DIR/${NAME}_errors.md"
python "$(dirname "${BASH_SOURCE[0]}")/fig4_floor.py" "$RUN_DIR"/fednest_*.h5 >> "$FIG_DIR/${NAME}_errors.md"
cat "$FIG_DIR/${NAME}_errors.md"
echo "output: $FIG_DIR/${NAME}_errors.md"
