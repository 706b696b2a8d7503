#!/usr/bin/env bash
# Device check for a 16-core machine with one GPU (the H200 machine of DEVELOPERS.md: Open MPI,
# torch with CUDA). Not run by the author (no GPU on the development machine). About 5-8 minutes.
# Writes everything under $OUT (default bench/results/device):
#   env.txt                 cores, GPU, torch/CUDA and MPI versions
#   strong.h5 / .log / _strong.png   synthetic, 1600 clients per round, 1, 2, 4, 8, 16 ranks (CPU),
#                           block and balanced placement (target: efficiency >= 0.8 at 16 ranks)
#   gpu.h5 / .log           one GPU, fp32: MNIST paper setting (needs FEDNEST_DATA; target <= 30 ms per
#                           outer iteration), synthetic at 10 and 10,000 clients per round (target <= 0.5 s)
# Usage: OUT=/some/dir [PYTHON=python3] [MPIEXEC="mpiexec --oversubscribe"] [FEDNEST_DATA=...] bench/device_check.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results/device}
PY=${PYTHON:-python3}
[ -x "$ROOT/.venv/bin/python" ] && PY=${PYTHON:-$ROOT/.venv/bin/python}
MPIEXEC=${MPIEXEC:-mpiexec}
export PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 MPI4PY_RC_THREAD_LEVEL=single
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # Open MPI refuses root without these
mkdir -p "$OUT"
cd "$ROOT"

{ date -u; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.version.cuda)"
  "$PY" -c "from mpi4py import MPI; print(MPI.Get_library_version().strip()); from fednest_mpi.federation import cuda_aware_mpi; print('cuda-aware MPI:', cuda_aware_mpi())"
  $MPIEXEC --version 2>&1 | head -2; } > "$OUT/env.txt" 2>&1

SYNTH='{ name = "synthetic", n_clients = 100000 }'
cat > "$OUT/strong.toml" <<TOML
iterations = 3
warmup = 1
output = "$OUT/strong.h5"
sequential_max_clients = 0
mpiexec = "$MPIEXEC"
timeout = 300

[[case]]
name = "block"
clients_per_round = [1600]
strong_ranks = [2, 4, 8, 16]
config = { problem = $SYNTH, run = { dtype = "float32" } }

[[case]]
name = "balanced"
clients_per_round = [1600]
strong_ranks = [2, 4, 8, 16]
weak_ranks = [1, 2, 4, 8, 16]
weak_clients_per_rank = 100
config = { problem = $SYNTH, run = { dtype = "float32" }, federation = { placement = "balanced" } }
TOML
timeout 420 "$PY" -m bench "$OUT/strong.toml" > "$OUT/strong.log" 2>&1; echo "strong scaling: exit $?" >> "$OUT/env.txt"

DATA=${FEDNEST_DATA:-$ROOT/../shared/data}
cat > "$OUT/gpu.toml" <<TOML
iterations = 10
warmup = 2
output = "$OUT/gpu.h5"
sequential_max_clients = 0
timeout = 300

[[case]]
name = "mnist_gpu"
requires_data = true
base = "configs/mnist/hyperrep/noniid/fednest.toml"
clients_per_round = [10]
config = { problem = { data_dir = "$DATA" }, run = { device = "cuda", dtype = "float32" } }

[[case]]
name = "synth_gpu"
clients_per_round = [10, 10000]
config = { problem = $SYNTH, run = { device = "cuda", dtype = "float32" } }

[[case]]
name = "synth_cpu1"
clients_per_round = [10, 10000]
iterations = 3
warmup = 1
config = { problem = $SYNTH, run = { dtype = "float32" } }
TOML
FEDNEST_DATA="$DATA" timeout 300 "$PY" -m bench "$OUT/gpu.toml" > "$OUT/gpu.log" 2>&1; echo "gpu: exit $?" >> "$OUT/env.txt"
cat "$OUT/env.txt" "$OUT/strong.log" "$OUT/gpu.log"
