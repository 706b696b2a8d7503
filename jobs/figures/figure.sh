#!/usr/bin/env bash
# Shared body of the figure scripts (jobs/figures/fig*.sh): run a figure's sweep, under one of its
# presets, on this machine through mpiexec (or as a SLURM job array), then draw it and tabulate it
# from the run files.
#
# usage: bash jobs/figures/figNN.sh [-P PRESET] [-n RANKS] [-k ITERATIONS] [-j PARALLEL] [-f] [-p] [-r RUN_DIR]
#                                   [-o FIG_DIR] [-s SITE]
#   -P PRESET      paper (default: every value the paper's text and appendix state, the rest ours) or
#                  authors_code (the authors' published scripts where they differ); the sweep file's
#                  [presets.*] tables (jobs/sweeps/figNN.toml) say which values each sets
#   -n RANKS       MPI ranks per run (default 2; fig3a: 1, its non-federated run has one client)
#   -k ITERATIONS  outer iterations per run (default: the sweep's config, 500 / 300); e.g. -k 40; the
#                  table then shows the figure's iterations below ITERATIONS and ITERATIONS itself
#   -j PARALLEL    runs at once (default 1); mind RANKS x PARALLEL <= cores
#   -f             force: run every run again from its start. Without -f a run whose file already holds it
#                  to its end (the same config, iterations 0..ITERATIONS: fednest-mpi run --skip-finished)
#                  is not run again, an interrupted one (a cut-off job, Ctrl-C) or a shorter one (a longer
#                  -k than before) continues from its checkpoint, and the rest (new seeds, another config,
#                  a run longer than -k: -p draws it as it is) run from the start
#   -p             plot only: draw from the existing run files (e.g. after a cluster sweep:
#                  fednest-mpi jobs render jobs/sweeps/figNN.toml --site YOUR_SITE; sbatch ...)
#   -r RUN_DIR     with -p: draw the run files in RUN_DIR (default runs/NAME, where the sweep writes)
#   -o FIG_DIR     where the figures and the table go (default figs); -r and -o are relative to
#                  the repository root
#   -s SITE        run on a cluster instead: render the sweep for SITE (a site file, jobs/sites/*.toml),
#                  submit it as a SLURM job array and, after it, a job that draws it (this script with -p);
#                  the sweep's full length (no -k); every run is submitted (-f or not), and a task that
#                  SLURM requeues continues from its checkpoint
# Needs FEDNEST_DATA (the folder holding mnist/) and the project's virtual environment.
# Runs go to runs/NAME/PRESET; writes FIG_DIR/NAME_PRESET_iteration.png, FIG_DIR/NAME_PRESET_comm_rounds.png
# and FIG_DIR/NAME_PRESET_table.md.
# The calling script sets FIGURE (sweep name), METRIC, GROUP_BY (--group-by arguments), AT (iterations),
# optionally PLOT_ARGS (more fednest-mpi plot arguments, e.g. --hline) and AXES (default "iteration comm_rounds").

set -euo pipefail
RANKS=${DEFAULT_RANKS:-2} ITERATIONS="" PARALLEL=1 PLOT_ONLY=0 FIG_DIR=figs RUN_DIR="" PRESET=paper SITE="" FORCE=0
while getopts "P:n:k:j:fpr:o:s:h" opt; do
    case $opt in
        P) PRESET=$OPTARG ;;
        s) SITE=$OPTARG ;;
        n) RANKS=$OPTARG ;;
        k) ITERATIONS=$OPTARG ;;
        j) PARALLEL=$OPTARG ;;
        f) FORCE=1 ;;
        p) PLOT_ONLY=1 ;;
        r) RUN_DIR=$OPTARG ;;
        o) FIG_DIR=$OPTARG ;;
        h) sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "usage: bash $0 [-P PRESET] [-n RANKS] [-k ITERATIONS] [-j PARALLEL] [-f] [-p] [-r RUN_DIR] [-o FIG_DIR] [-s SITE]" >&2; exit 2 ;;
    esac
done
for v in "$RANKS" "$PARALLEL" ${ITERATIONS:+"$ITERATIONS"}; do
    case $v in ''|*[!0-9]*|0) echo "$0: -n, -k and -j take positive integers, got '$v'" >&2; exit 2 ;; esac
done
if [ -n "$RUN_DIR" ] && [ "$PLOT_ONLY" -eq 0 ]; then echo "$0: -r RUN_DIR goes with -p (the sweep writes to runs/$FIGURE/$PRESET)" >&2; exit 2; fi
if [ "$FORCE" -eq 1 ] && [ "$PLOT_ONLY" -eq 1 ]; then echo "$0: -f reruns the runs; -p only draws them: give one of the two" >&2; exit 2; fi
if [ -n "$SITE" ] && [ "$PLOT_ONLY" -eq 1 ]; then echo "$0: -s SITE submits the runs; -p only draws them: give one of the two" >&2; exit 2; fi
if [ -n "$SITE" ] && [ -n "$ITERATIONS" ]; then echo "$0: -s SITE runs the sweep's full length; -k shortens local runs only: drop -k" >&2; exit 2; fi
RUN_DIR=${RUN_DIR:-runs/$FIGURE/$PRESET}
NAME=${FIGURE}_$PRESET
SCRIPT="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ -x .venv/bin/fednest-mpi ] && [ -z "${VIRTUAL_ENV:-}" ]; then PATH=$PWD/.venv/bin:$PATH; fi
command -v fednest-mpi > /dev/null || { echo "$0: fednest-mpi not found: run make install" >&2; exit 2; }
fednest-mpi jobs list "jobs/sweeps/$FIGURE.toml" --preset "$PRESET" > /dev/null || exit 2  # names the presets

if [ -n "$SITE" ]; then  # the cluster: the sweep as a job array, then this script with -p once it is over
    fednest-mpi jobs render "jobs/sweeps/$FIGURE.toml" --preset "$PRESET" --site "$SITE" --out-dir "runs/jobs/$NAME" > /dev/null
    ARRAY=$(sbatch --parsable "runs/jobs/$NAME/$NAME.array.sbatch")
    DRAW=$(sbatch --parsable --dependency="afterany:${ARRAY%%;*}" --job-name="$NAME-plot" --output="runs/jobs/$NAME/logs/plot.out" \
        --wrap "bash $SCRIPT -P $PRESET -p -o $FIG_DIR")
    echo "submitted: runs ${ARRAY%%;*} (array), drawing $DRAW after them; output: $FIG_DIR/${NAME}_*"
    exit 0
fi

FAILED=0
if [ "$PLOT_ONLY" -eq 0 ]; then
    fednest-mpi jobs render "jobs/sweeps/$FIGURE.toml" --preset "$PRESET" --site local --out-dir "runs/jobs/$NAME" > /dev/null
    # a run that fails (e.g. diverges: it keeps its iterations up to there) is reported, the others are
    # still drawn (and the calling script's own steps still run), and the script exits 1 at the end
    # without -f, a finished run is kept and an unfinished one continued (fednest-mpi run --skip-finished)
    SKIP=--skip-finished
    if [ "$FORCE" -eq 1 ]; then SKIP=""; fi
    FEDNEST_RANKS=$RANKS FEDNEST_RUN_ARGS="$SKIP${ITERATIONS:+ --set algorithm.outer_iterations=$ITERATIONS}" \
        bash "runs/jobs/$NAME/$NAME.local.sh" -j "$PARALLEL" || FAILED=1
    if [ "$FAILED" -ne 0 ]; then
        echo "$0: some runs failed (listed above); drawing what the run files hold" >&2
        trap 'exit 1' EXIT
    fi
fi
mkdir -p "$FIG_DIR"
read -r -a GROUP_ARGS <<< "$GROUP_BY"
AT_ARGS=()
for k in $AT; do  # a shortened sweep (-k) is tabulated at the iterations it reaches, and at its end
    if [ -z "$ITERATIONS" ] || [ "$k" -lt "$ITERATIONS" ]; then AT_ARGS+=(--at "$k"); fi
done
if [ -n "$ITERATIONS" ]; then AT_ARGS+=(--at "$ITERATIONS"); fi
read -r -a EXTRA_PLOT_ARGS <<< "${PLOT_ARGS:-}"
for axis in ${AXES:-iteration comm_rounds}; do
    fednest-mpi plot "$RUN_DIR" -m "$METRIC" -x "$axis" "${GROUP_ARGS[@]}" --smooth 5 ${EXTRA_PLOT_ARGS[@]+"${EXTRA_PLOT_ARGS[@]}"} \
        -o "$FIG_DIR/${NAME}_$axis.png"
done
fednest-mpi report "$RUN_DIR" -m "$METRIC" "${AT_ARGS[@]}" "${GROUP_ARGS[@]}" --smooth 5 > "$FIG_DIR/${NAME}_table.md"
echo "table ($METRIC, 5-iteration running mean, mean ± sd over seeds):"
cat "$FIG_DIR/${NAME}_table.md"
echo "output: $FIG_DIR/${NAME}_table.md"
