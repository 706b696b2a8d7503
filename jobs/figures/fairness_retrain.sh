#!/usr/bin/env bash
# Fair FL on UCI Adult (docs/algorithms.md, "Fair federated learning"): tune the cell weights by the run of
# CONFIG (default configs/fairness/race/fednest_worst_group.toml: FedNest, pooled smooth worst-group loss),
# then retrain the classifier by FedAvg for ROUNDS rounds with the tuned weights and, as the baseline,
# unweighted (CONFIG's problem with algorithm.name = fedavg; same seed: same partition and minibatches).
# Seeds 0, 1, 2. Each -s KEY=VALUE is passed to every run as --set KEY=VALUE; each -w NAME=W,... is
# also judged at the exact y*(x) (a hand-set probe).
# usage: bash jobs/figures/fairness_retrain.sh [-c CONFIG] [-s KEY=VALUE]... [-w NAME=W,...]... [-r ROUNDS] [-o OUT_DIR]
#        (defaults: the race config, 200 rounds, runs/fairness/retrain)
# Examples: bash jobs/figures/fairness_retrain.sh -w Asian-Pac-Islander=3            (the race study)
#           bash jobs/figures/fairness_retrain.sh -c configs/fairness/fednest_worst_cell.toml -o runs/fairness/retrain_cell  (worst cell)
#           bash jobs/figures/fairness_retrain.sh -c configs/fairness/fednest_worst_cell.toml -s algorithm.outer_lr=0.3 -r 50 -o /tmp/r
# Writes OUT_DIR/*.h5 and OUT_DIR/retrain_table.md (mean +- sd over seeds, last iteration and mean of the
# last 20 iterations; then, per seed, the metrics at the exact y*(x) for x = 0, the tuned weights and
# every -w: jobs/figures/fairness_exact.py).
set -euo pipefail
CONFIG=configs/fairness/race/fednest_worst_group.toml ROUNDS=200 OUT=runs/fairness/retrain
SETS=() PROBES=()
while getopts "c:s:w:r:o:h" opt; do
    case $opt in
        c) CONFIG=$OPTARG ;;
        s) SETS+=(--set "$OPTARG") ;;
        w) PROBES+=(--weights "$OPTARG") ;;
        r) ROUNDS=$OPTARG ;;
        o) OUT=$OPTARG ;;
        h) sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "usage: bash $0 [-c CONFIG] [-s KEY=VALUE]... [-w NAME=W,...]... [-r ROUNDS] [-o OUT_DIR]" >&2; exit 2 ;;
    esac
done
case $ROUNDS in ''|*[!0-9]*|0) echo "$0: -r takes a positive integer, got '$ROUNDS'" >&2; exit 2 ;; esac
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$HERE/../.."
[ -f "$CONFIG" ] || { echo "$0: -c: no config file '$CONFIG'" >&2; exit 2; }
if [ -x .venv/bin/fednest-mpi ] && [ -z "${VIRTUAL_ENV:-}" ]; then PATH=$PWD/.venv/bin:$PATH; fi
command -v fednest-mpi > /dev/null || { echo "$0: fednest-mpi not found: run make install" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"
retrain=(--set 'algorithm.name="fedavg"' --set 'problem.outer_objective="balanced"' --set algorithm.outer_iterations=$ROUNDS)
for s in 0 1 2; do
    fednest-mpi run "$CONFIG" --set seed=$s ${SETS[@]+"${SETS[@]}"} -o "$OUT/tune-s$s.h5" --overwrite
    weights=$(python "$HERE/fairness_retrain.py" weights "$OUT/tune-s$s.h5")
    fednest-mpi run "$CONFIG" --set seed=$s ${SETS[@]+"${SETS[@]}"} "${retrain[@]}" --set "problem.initial_weights=\"$weights\"" -o "$OUT/retrain_tuned-s$s.h5" --overwrite
    fednest-mpi run "$CONFIG" --set seed=$s ${SETS[@]+"${SETS[@]}"} "${retrain[@]}" -o "$OUT/retrain_unweighted-s$s.h5" --overwrite
done
python "$HERE/fairness_retrain.py" table "$OUT"/retrain_*.h5 > "$OUT/retrain_table.md"
echo -e "\nthe same weights at the exact lower-level solution y*(x) (jobs/figures/fairness_exact.py):\n" >> "$OUT/retrain_table.md"
python "$HERE/fairness_exact.py" "$OUT"/tune-s*.h5 ${PROBES[@]+"${PROBES[@]}"} >> "$OUT/retrain_table.md"
cat "$OUT/retrain_table.md"
echo "output: $OUT/retrain_table.md"
