#!/usr/bin/env bash
# The benchmark table (docs/benchmarks.md): render and run every sweep of the named tasks on this machine,
# then write the table. Usage: bash jobs/benchmarks/run.sh [-j N] TASK ...   (TASK: a folder of jobs/benchmarks/)
# Example: bash jobs/benchmarks/run.sh -j 2 quadratic
# On a SLURM site: fednest-mpi jobs render jobs/benchmarks/TASK/ALG.toml --site jobs/sites/YOURS.toml, sbatch
# the .array.sbatch of each, then the report line at the end of this script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
FEDNEST=${FEDNEST:-.venv/bin/fednest-mpi}
jobs=1
failed=()
if [ "${1:-}" = "-j" ]; then jobs=$2; shift 2; fi
if [ $# -eq 0 ] || [ "${1:-}" = "-h" ]; then sed -n '2,6p' "$0"; exit 2; fi
for task in "$@"; do
    [ -d "jobs/benchmarks/$task" ] || { echo "run.sh: no task $task (the folders of jobs/benchmarks/)" >&2; exit 2; }
    for sweep in jobs/benchmarks/"$task"/*.toml; do
        name=$(basename "$sweep" .toml)
        "$FEDNEST" jobs render "$sweep" --site local -o "runs/jobs/benchmarks/$task/$name" > /dev/null
        echo "== $task / $name"
        # a run that diverges (a grid value too large) exits 1: a result of the tuning grid, not a reason to stop
        bash "runs/jobs/benchmarks/$task/$name/$name.local.sh" -j "$jobs" || failed+=("$task/$name")
    done
done
"$FEDNEST" report --benchmark jobs/benchmarks/table.toml --configs-dir docs/benchmarks/configs > docs/benchmarks/table.md
echo "output: docs/benchmarks/table.md"
if [ ${#failed[@]} -gt 0 ]; then
    echo "run.sh: sweeps with failed runs (see their logs under runs/jobs/benchmarks/): ${failed[*]}" >&2
    exit 1
fi
