#!/usr/bin/env bash
# Every command of docs/tutorial.md, in the tutorial's order: tests/unit/test_tutorial.py runs this script and
# checks that each command of the tutorial's shell blocks is one of its lines. From the repository root:
#   source .venv/bin/activate && bash examples/tutorial/tutorial.sh        (36-48 s on 2 busy cores)
set -euo pipefail
export OMP_NUM_THREADS=1 MPI4PY_RC_THREAD_LEVEL=single

# 2. a first run, on 1 and on 2 ranks
fednest-mpi run configs/quadratic.toml --set algorithm.outer_iterations=20 --output runs/tutorial/quadratic.h5
mpiexec -n 2 fednest-mpi run configs/quadratic.toml --set algorithm.outer_iterations=20 --output runs/tutorial/quadratic_2ranks.h5

# 3. reading the run file
fednest-mpi report runs/tutorial/quadratic.h5 runs/tutorial/quadratic_2ranks.h5
fednest-mpi plot runs/tutorial/quadratic.h5 -m x_error -x comm_rounds -o runs/tutorial/quadratic.png
python examples/tutorial/read_run.py runs/tutorial/quadratic_2ranks.h5

# 4. your own problem
export PYTHONPATH=$PWD/examples/tutorial
mpiexec -n 2 fednest-mpi run examples/tutorial/shrinkage.toml

# 5. your own algorithm
if fednest-mpi run examples/tutorial/shrinkage.toml --set algorithm.outer_lr=4.0 --output runs/tutorial/diverges.h5; then
    echo "tutorial.sh: FedNest at outer_lr = 4 was expected to diverge" >&2
    exit 1
fi
mpiexec -n 2 fednest-mpi run examples/tutorial/clip.toml

# 6. checking a plugin
fednest-mpi check examples/tutorial/clip.toml

# 7. a sweep, on SLURM or on this machine
fednest-mpi jobs list examples/tutorial/tutorial_sweep.toml
fednest-mpi jobs render examples/tutorial/tutorial_sweep.toml --site example-cluster -o runs/jobs/tutorial_slurm
fednest-mpi jobs render examples/tutorial/tutorial_sweep.toml
bash runs/jobs/tutorial_sweep/tutorial_sweep.local.sh -j 1
fednest-mpi report runs/tutorial/sweep -g algorithm.max_norm
