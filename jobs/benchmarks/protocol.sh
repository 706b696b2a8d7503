#!/usr/bin/env bash
# The tuning protocol of docs/benchmarks.md for the named algorithms of the quadratic tasks, one algorithm after the
# other, resumable across sessions: a run with a benchmark record (docs/benchmarks/records) or a finished run file is
# not run again (--skip-finished: a run file left by a killed run continues from its checkpoint, or starts afresh),
# and an algorithm whose chosen setting has run on the reported seeds is complete and skipped.
# Usage: bash jobs/benchmarks/protocol.sh TASK/ALG ...   (a sweep jobs/benchmarks/TASK/ALG.toml of table.toml's tasks;
#   the MNIST tasks of mnist.toml: TABLE=jobs/benchmarks/mnist.toml FEDNEST_DATA=../shared/data bash ...)
# Example: nice -n 19 bash jobs/benchmarks/protocol.sh quadratic_local/fedmsa quadratic_uneven/fedmbo
# Then: fednest-mpi report --benchmark jobs/benchmarks/table.toml --archive, and commit docs/benchmarks/records.
# DRY_RUN=1 prints what would run and runs nothing. One run at a time (-j 1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
FEDNEST=${FEDNEST:-.venv/bin/fednest-mpi}
# a complete algorithm (its chosen setting run on the reported seeds) is extended again only when EXTENSIONS is given
[ -n "${EXTENSIONS:-}" ] && [ "$EXTENSIONS" -gt 0 ] && recheck="" || recheck="--no-extend"
EXTENSIONS=${EXTENSIONS:-2}   # at most this many grid extensions per algorithm (per call: see docs/benchmarks.md)
TABLE=${TABLE:-jobs/benchmarks/table.toml}   # the MNIST tasks: TABLE=jobs/benchmarks/mnist.toml (and FEDNEST_DATA)
RECORDS=docs/benchmarks/records
if [ $# -eq 0 ] || [ "${1:-}" = "-h" ]; then sed -n '2,9p' "$0"; exit 2; fi
failed=()
done_names() {   # done_names TASK: the names of the runs of TASK that have a run file or a record
    ls runs/benchmarks/"$1"/ 2> /dev/null | sed -n 's/\.h5$//p'
    recorded_names "$1"
}
recorded_names() {   # recorded_names TASK: the names of the runs of TASK that have a record
    for f in "$RECORDS/$1"/*.jsonl.gz; do
        [ -e "$f" ] && gzip -dc "$f" | grep -o '"file":"[^"]*\.h5"' | sed 's/^"file":"//; s/\.h5"$//'
    done
    true
}
run_sweep() {   # run_sweep TASK SWEEP_FILE OUT_DIR: render, then run the tasks without a record (a finished run file
    local name ids   # is skipped by the run itself, --skip-finished; a killed run's file continues or starts again)
    name=$(basename "$2" .toml)
    "$FEDNEST" jobs render "$2" --site local -o "$3/$name" > /dev/null
    ids=$(awk 'NR == FNR { done[$1] = 1; next } !($1 in done) { print FNR - 1 }' \
        <(echo "#"; recorded_names "$1") "$3/$name/$name.tasks" | tr '\n' ' ')
    echo "== $name: $(wc -l < "$3/$name/$name.tasks") runs, without a record: ${ids:-none}"
    [ -n "$ids" ] && [ -z "${DRY_RUN:-}" ] || return 0
    # shellcheck disable=SC2086  # the task ids, one word each
    local rc=0
    FEDNEST_RUN_ARGS="--skip-finished" bash "$3/$name/$name.local.sh" -j 1 $ids || rc=$?
    if [ "$rc" -eq 2 ]; then   # a run refused its input (a usage error): not a result, so the protocol stops
        echo "protocol.sh: $name: runs refused their input (exit 2, listed above): not results; fix and run again" >&2
        exit 2
    fi
    [ "$rc" -eq 0 ] || failed+=("$name")   # a diverged run exits 1: a result
}
follow_up() {   # follow_up TASK ALG DIR [--no-extend]: the printed sweeps of ALG on TASK
    rm -rf "$3"
    "$FEDNEST" report --benchmark "$TABLE" --follow-up "$3" --task "$1" ${4:-} | grep "/${1}_${2}_" || true
}
for pair in "$@"; do
    task=${pair%%/*}; alg=${pair#*/}
    [ -f "jobs/benchmarks/$task/$alg.toml" ] || { echo "protocol.sh: no sweep jobs/benchmarks/$task/$alg.toml" >&2; exit 2; }
    dir=runs/jobs/benchmarks/protocol/follow-up/${task}_$alg
    echo "== $task/$alg ($(date -u +%H:%M:%S) UTC)"
    run_sweep "$task" "jobs/benchmarks/$task/$alg.toml" "runs/jobs/benchmarks/protocol/$task"
    if [ -z "$(follow_up "$task" "$alg" "$dir/check" $recheck)" ] && done_names "$task" | grep -q "^${alg}_.*_seed${REPORT_SEED:-0}$"; then
        echo "== $task/$alg: complete (the chosen setting has run on the reported seeds)"
        continue
    fi
    for pass in $(seq 0 $((EXTENSIONS + 1))); do   # EXTENSIONS extending passes, then the local-step line, the report
        flag=$([ "$pass" -lt "$EXTENSIONS" ] && echo "" || echo "--no-extend")
        sweeps=$(follow_up "$task" "$alg" "$dir/$pass" $flag)
        [ -n "$sweeps" ] || break
        for sweep in $sweeps; do run_sweep "$task" "$sweep" "$dir/$pass"; done
        [ -z "${DRY_RUN:-}" ] || break   # nothing ran: the next pass would print the same
    done
    echo "== $task/$alg: done ($(date -u +%H:%M:%S) UTC)"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "protocol.sh: sweeps with failed runs (diverged, or see their logs under runs/jobs/benchmarks/): ${failed[*]}" >&2
    exit 1
fi
