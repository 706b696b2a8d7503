#!/usr/bin/env bash
# The benchmark table (docs/benchmarks.md): render and run every tuning sweep of the named tasks on this machine,
# carry the tuning protocol on (grids extended past an edge, then the chosen settings on the reported seeds),
# then write the table. Usage: bash jobs/benchmarks/run.sh [-j N] TASK ...   (TASK: a folder of jobs/benchmarks/)
# Example: bash jobs/benchmarks/run.sh -j 2 quadratic quadratic_uneven
# The tasks of jobs/benchmarks/table.toml give docs/benchmarks/table.md, those of mnist.toml docs/benchmarks/mnist.md,
# each once some task of its file has runs (the others are named with their command). SLURM: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
FEDNEST=${FEDNEST:-.venv/bin/fednest-mpi}
EXTENSIONS=${EXTENSIONS:-2}   # at most this many grid extensions per algorithm and task
jobs=1
failed=()
if [ "${1:-}" = "-j" ]; then jobs=$2; shift 2; fi
if [ $# -eq 0 ] || [ "${1:-}" = "-h" ]; then sed -n '2,7p' "$0"; exit 2; fi
run_sweep() {   # run_sweep SWEEP_FILE OUT_DIR: render for this machine and run; a failed run is noted, not fatal
    local name
    name=$(basename "$1" .toml)
    "$FEDNEST" jobs render "$1" --site local -o "$2/$name" > /dev/null
    echo "== $name"
    # a run that diverges (a grid value too large) exits 1: a result of the tuning grid, not a reason to stop;
    # a run that refused its input (exit 2, a usage error) is not a result: stop
    local rc=0
    bash "$2/$name/$name.local.sh" -j "$jobs" || rc=$?
    if [ "$rc" -eq 2 ]; then
        echo "run.sh: $name: runs refused their input (exit 2, listed above): not results; fix and run again" >&2
        exit 2
    fi
    [ "$rc" -eq 0 ] || failed+=("$name")
}
for task in "$@"; do
    [ -d "jobs/benchmarks/$task" ] || { echo "run.sh: no task $task (the folders of jobs/benchmarks/)" >&2; exit 2; }
    for sweep in jobs/benchmarks/"$task"/*.toml; do run_sweep "$sweep" "runs/jobs/benchmarks/$task"; done
done
for table in jobs/benchmarks/table.toml jobs/benchmarks/mnist.toml; do
    # extend the grids at most EXTENSIONS times; then, without extension, the local-step line and the reported seeds
    for pass in $(seq 0 $((EXTENSIONS + 1))); do
        flag=$([ "$pass" -lt "$EXTENSIONS" ] && echo "" || echo "--no-extend")
        dir=runs/jobs/benchmarks/follow-up/$(basename "$table" .toml)/$pass
        rm -rf "$dir"
        sweeps=$("$FEDNEST" report --benchmark "$table" --follow-up "$dir" $flag)
        for sweep in $sweeps; do run_sweep "$sweep" "$dir"; done
        [ -n "$sweeps" ] || break
    done
    out=docs/benchmarks/$(basename "$table" .toml).md
    if "$FEDNEST" report --benchmark "$table" --configs-dir docs/benchmarks/configs > "$out.tmp" 2> /dev/null; then
        mv "$out.tmp" "$out"
        echo "output: $out"
    else
        rm -f "$out.tmp"   # no task of the file has runs here yet
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "run.sh: sweeps with failed runs (see their logs under runs/jobs/benchmarks/): ${failed[*]}" >&2
    exit 1
fi
