#!/usr/bin/env bash
# Fair FL on UCI Adult, race (docs/algorithms.md, "Fair federated learning"): tune the group weights by
# FedNest for the pooled smooth worst-group validation loss (configs/fairness/race/fednest_worst_group.toml,
# 60 outer iterations), then retrain the classifier by FedAvg for ROUNDS rounds with the tuned weights
# and, as the baseline, unweighted (same seed: same partition and minibatches). Seeds 0, 1, 2.
# usage: bash jobs/figures/fairness_retrain.sh [-r ROUNDS] [-o OUT_DIR]      (defaults 200, runs/fairness/retrain)
# Example: bash jobs/figures/fairness_retrain.sh -r 50 -o /tmp/retrain
# Writes OUT_DIR/*.h5 and OUT_DIR/retrain_table.md (mean +- sd over seeds, last iteration and mean of the
# last 20 iterations; then, per seed, the metrics at the exact y*(x) for x = 0, the tuned weights and
# Asian-Pac-Islander weighted 3: jobs/figures/fairness_exact.py).
set -euo pipefail
ROUNDS=200 OUT=runs/fairness/retrain
while getopts "r:o:h" opt; do
    case $opt in
        r) ROUNDS=$OPTARG ;;
        o) OUT=$OPTARG ;;
        h) sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "usage: bash $0 [-r ROUNDS] [-o OUT_DIR]" >&2; exit 2 ;;
    esac
done
case $ROUNDS in ''|*[!0-9]*|0) echo "$0: -r takes a positive integer, got '$ROUNDS'" >&2; exit 2 ;; esac
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$HERE/../.."
if [ -x .venv/bin/fednest-mpi ] && [ -z "${VIRTUAL_ENV:-}" ]; then PATH=$PWD/.venv/bin:$PATH; fi
command -v fednest-mpi > /dev/null || { echo "$0: fednest-mpi not found: run make install" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"
for s in 0 1 2; do
    fednest-mpi run configs/fairness/race/fednest_worst_group.toml --set seed=$s -o "$OUT/tune-s$s.h5" --overwrite
    weights=$(python "$HERE/fairness_retrain.py" weights "$OUT/tune-s$s.h5")
    common=(--set seed=$s --set problem.val_per_cell=100 --set algorithm.outer_iterations=$ROUNDS)
    fednest-mpi run configs/fairness/race/fedavg.toml "${common[@]}" --set "problem.initial_weights=\"$weights\"" -o "$OUT/retrain_tuned-s$s.h5" --overwrite
    fednest-mpi run configs/fairness/race/fedavg.toml "${common[@]}" -o "$OUT/retrain_unweighted-s$s.h5" --overwrite
done
python "$HERE/fairness_retrain.py" table "$OUT"/retrain_*.h5 > "$OUT/retrain_table.md"
echo -e "\nthe same weights at the exact lower-level solution y*(x) (jobs/figures/fairness_exact.py):\n" >> "$OUT/retrain_table.md"
python "$HERE/fairness_exact.py" "$OUT"/tune-s*.h5 --weights "Asian-Pac-Islander=3" >> "$OUT/retrain_table.md"
cat "$OUT/retrain_table.md"
echo "output: $OUT/retrain_table.md"
