#!/usr/bin/env bash
# The examples as a user runs them: the fednest-mpi wheel and each example's package installed
# into a fresh venv, every example run from a folder outside the source tree under mpiexec -n 2, and one
# sweep over a plugin rendered and run by its workstation script.
#   bash jobs/ci/examples.sh            (from the checkout; FEDNEST_DATA: the data folder, default ../shared/data)
# Iterations are cut to a few per example (--set algorithm.outer_iterations), the configs are the shipped ones.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
export FEDNEST_DATA=${FEDNEST_DATA:-$ROOT/../shared/data} MPI4PY_RC_THREAD_LEVEL=single OMP_NUM_THREADS=1
TMP=$(mktemp -d /tmp/fednest-examples.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
PIP=(-m pip --disable-pip-version-check --no-input -q)

echo "== wheel of fednest-mpi, fresh venv $TMP/venv"
cp -r "$ROOT/src" "$ROOT/pyproject.toml" "$ROOT/setup.cfg" "$ROOT/README.md" "$TMP/" && mkdir "$TMP/src-tree" && mv "$TMP/src" "$TMP/pyproject.toml" "$TMP/setup.cfg" "$TMP/README.md" "$TMP/src-tree/"
find "$TMP/src-tree" -name '__pycache__' -prune -exec rm -rf {} + -o -name '*.egg-info' -prune -exec rm -rf {} +
"$PYTHON" -m venv "$TMP/venv"
V=$TMP/venv/bin
"$V/python" "${PIP[@]}" install -r "$ROOT/requirements.txt"
"$V/python" "${PIP[@]}" wheel --no-deps --no-build-isolation --no-index -w "$TMP/dist" "$TMP/src-tree"
"$V/python" "${PIP[@]}" install --no-deps --no-index "$TMP"/dist/fednest_mpi-*.whl
mkdir "$TMP/packages"
for pkg in "$ROOT"/examples/*/pyproject.toml; do   # each from a copy: a build writes build/ beside the sources
    cp -r "$(dirname "$pkg")" "$TMP/packages/"
    "$V/python" "${PIP[@]}" install --no-deps --no-build-isolation --no-index "$TMP/packages/$(basename "$(dirname "$pkg")")"
done

mkdir -p "$TMP/work" && cd "$TMP/work"
"$V/python" -c "import fednest_mpi, sys; assert '$ROOT' not in fednest_mpi.__file__, fednest_mpi.__file__"
run() {  # run NAME CONFIG [--set ...]: mpiexec -n 2 from outside the tree, the output file checked
    local name=$1 cfg=$2; shift 2
    echo "== example $name: mpiexec -n 2 fednest-mpi run $cfg $*"
    timeout -k 10 600 "$V/mpiexec" -n 2 "$V/fednest-mpi" run "$cfg" --output "out/$name.h5" --quiet "$@"
    "$V/fednest-mpi" report "out/$name.h5" > /dev/null
}
run server_momentum "$ROOT/examples/server_momentum/quadratic_momentum.toml" --set algorithm.outer_iterations=10
for cfg in "$ROOT"/examples/*/*.toml; do   # hyper_cleaning (a problem plugin), cnn_hyperrep (a model: problem.model)
    case $cfg in */pyproject.toml|*/server_momentum/*|*/tutorial/*) continue ;; esac   # tutorial: tests/unit/test_tutorial.py
    run "$(basename "$(dirname "$cfg")")" "$cfg" --set algorithm.outer_iterations=3
done

echo "== a sweep over the plugin algorithm: jobs render --site local, then its workstation script"
cp "$ROOT/examples/server_momentum/quadratic_momentum.toml" momentum.toml
cat > sweep.toml <<'SWEEP'
config = "momentum.toml"
output_dir = "sweep"
[set]
algorithm.outer_iterations = 5
[grid]
algorithm.server_momentum = [0.0, 0.5]
[resources]
tasks_per_node = 2
SWEEP
"$V/fednest-mpi" jobs render sweep.toml -o jobs
PATH="$V:$PATH" timeout -k 10 600 bash jobs/sweep.local.sh -j 1   # as in an activated venv
ls sweep/*.h5 | wc -l | grep -qx 2
"$V/fednest-mpi" report sweep/*.h5 -g algorithm.server_momentum
echo "== examples: PASSED"
