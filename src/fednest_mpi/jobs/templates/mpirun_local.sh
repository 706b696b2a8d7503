#!/usr/bin/env bash
# fednest-mpi: sweep {{job_name}} on a workstation, {{n_tasks}} runs through mpiexec.
# Rendered from the template mpirun_local.sh of fednest_mpi.jobs: change the sweep or the
# site file and render again rather than editing this file.
#
# usage: bash THIS_FILE [-j PARALLEL] [TASK_ID ...]
#   TASK_ID   runs only these tasks (0-based line numbers of the tasks file); default: all
#   -j N      N runs at once (default 1, or $FEDNEST_MAX_PARALLEL); mind ranks x N <= cores
# Each run logs to {{log_dir}}/NAME.log; one status line per run here. Exit status 2 when a
# run refused its input (exit 2: a usage error, e.g. a config a seed cannot run, or an existing
# output: fix it, it is not a result), else 1 when a run failed (diverged, killed). The tasks
# file has one run per line: NAME RANKS --set F=V ... --output PATH.
# Environment: FEDNEST_RANKS=N runs every task on N ranks instead of the sweep's count;
# FEDNEST_RUN_ARGS="--set algorithm.outer_iterations=40" adds arguments to every run (after the
# task's own, so its --set win), e.g. for a shortened figure.

PARALLEL=${FEDNEST_MAX_PARALLEL:-1}
while getopts "j:h" opt; do
    case $opt in
        j) PARALLEL=$OPTARG ;;
        h) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "usage: bash $0 [-j PARALLEL] [TASK_ID ...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
case $PARALLEL in ''|*[!0-9]*|0) echo "$0: -j needs a positive integer, got '$PARALLEL'" >&2; exit 2 ;; esac

cd {{workdir}} || exit 2
{{site_setup}}
set -u

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
CONFIG={{config}}
TASKS_FILE={{tasks_file}}
LOG_DIR={{log_dir}}
N_TASKS=$(wc -l < "$TASKS_FILE" | tr -d ' ')
mkdir -p "$LOG_DIR" || exit 2

# the launcher: mpiexec of the active virtual environment, else of ./.venv, else the site's
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/mpiexec" ]; then
    MPIEXEC=$VIRTUAL_ENV/bin/mpiexec
elif [ -x .venv/bin/mpiexec ]; then
    MPIEXEC=$PWD/.venv/bin/mpiexec
    PATH=$PWD/.venv/bin:$PATH
else
    MPIEXEC={{mpirun_command}}
fi
if ! command -v "$MPIEXEC" > /dev/null; then
    echo "$0: no MPI launcher '$MPIEXEC': activate the virtual environment (or run make install)" >&2
    exit 2
fi

FAILED_FILE=$(mktemp "${TMPDIR:-/tmp}/fednest-failed.XXXXXX") || exit 2
REFUSED_FILE=$(mktemp "${TMPDIR:-/tmp}/fednest-refused.XXXXXX") || exit 2
trap 'rm -f "$FAILED_FILE" "$REFUSED_FILE"' EXIT

run_task() {   # run_task ID: the run on line ID of the tasks file
    local id=$1 line name ranks log rc
    line=$(sed -n "$((id + 1))p" "$TASKS_FILE")
    if [ -z "$line" ]; then
        echo "task $id: no such task in $TASKS_FILE ($N_TASKS tasks)" >&2
        echo "$id" >> "$FAILED_FILE"
        return
    fi
    eval "set -- $line"   # written with shlex.quote: one word per argument
    name=$1 ranks=${FEDNEST_RANKS:-$2}
    shift 2
    # shellcheck disable=SC2206  # word splitting of the extra arguments is intended
    local extra=(${FEDNEST_RUN_ARGS:-})
    log=$LOG_DIR/$name.log
    echo "task $id/$N_TASKS $name: $ranks ranks, log $log"
    "$MPIEXEC" -n "$ranks" {{command}} run "$CONFIG" "$@" "${extra[@]}" > "$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "task $id/$N_TASKS $name: done, $(grep '^output: ' "$log" | tail -n 1)"
    else
        echo "task $id/$N_TASKS $name: FAILED with exit $rc; last lines of $log:" >&2
        tail -n 5 "$log" >&2
        echo "$id" >> "$FAILED_FILE"
        [ "$rc" -ne 2 ] || echo "$id" >> "$REFUSED_FILE"
    fi
}

if [ $# -gt 0 ]; then
    ids=("$@")
else
    ids=()
    i=0
    while [ "$i" -lt "$N_TASKS" ]; do ids+=("$i"); i=$((i + 1)); done
fi
for id in "${ids[@]}"; do
    case $id in ''|*[!0-9]*) echo "$0: task ids are numbers from 0 to $((N_TASKS - 1)), got '$id'" >&2; exit 2 ;; esac
done

if [ "$PARALLEL" -le 1 ]; then
    for id in "${ids[@]}"; do run_task "$id"; done
else
    # each run in its own process group, so that Ctrl-C ends the runs too
    set -m
    # shellcheck disable=SC2317  # called by the trap
    stop_all() {
        local pid
        for pid in $(jobs -p); do kill -TERM -- "-$pid" 2>/dev/null; done
        exit 130
    }
    trap stop_all INT TERM
    for id in "${ids[@]}"; do
        while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n 2>/dev/null || sleep 1; done
        run_task "$id" &
    done
    wait
fi

if [ -s "$FAILED_FILE" ]; then
    echo "failed tasks: $(sort -n "$FAILED_FILE" | tr '\n' ' ')(of ${#ids[@]})" >&2
    if [ -s "$REFUSED_FILE" ]; then
        echo "refused (exit 2, a usage error, not a result: fix the input and run them again):" \
            "$(sort -n "$REFUSED_FILE" | tr '\n' ' ')" >&2
        exit 2
    fi
    exit 1
fi
echo "all ${#ids[@]} tasks done"
