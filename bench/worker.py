"""One measurement, run on every rank (``mpiexec -n P python bench/worker.py '<json>'``).

The JSON names ``config`` (a run config as plain data), ``mode`` (``project``: the batched
oracles; ``sequential``: :class:`bench.sequential.SequentialProblem`), ``iterations`` measured
after ``warmup`` unmeasured ones. Rank 0 prints one line ``BENCH <json>`` with medians over the
measured iterations of: the algorithm part (max over ranks of each iteration's wall time), the
evaluation, time inside Allreduce (incl. waiting for slower ranks), peak RSS per rank and the RSS
growth from the first to the last measured iteration (flat memory: about 0). ``alg_cpu_s`` is the
CPU time of the algorithm part (max over ranks): on a machine shared with other jobs it is a
steadier measure of the work than wall time (MPI busy-polling counts as CPU time).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `bench` importable when run as a script

from mpi4py import MPI  # noqa: E402

from bench.sequential import SequentialProblem  # noqa: E402
from fednest_mpi import config  # noqa: E402
from fednest_mpi.algorithms import build_algorithm  # noqa: E402
from fednest_mpi.runner import Simulation  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(spec: dict, comm) -> dict | None:
    """Run the measurement; returns the summary on rank 0, None elsewhere. **Collective**."""
    warmup, iterations = int(spec.get("warmup", 1)), int(spec["iterations"])
    data = json.loads(json.dumps(spec["config"]))
    data.setdefault("algorithm", {})["outer_iterations"] = warmup + iterations
    cfg = config.from_dict(data)
    sim = Simulation(cfg, comm)
    if spec.get("mode", "project") == "sequential":
        sim.problem = SequentialProblem(sim.problem)
        sim.algorithm = build_algorithm(cfg.algorithm, sim.problem, sim.fed, cfg.seed)
    rss, comm_s, cpu = [], [], []
    step = sim.algorithm.step

    cuda = sim.problem.initial_point()[0].device.type == "cuda"

    def timed_step(*args):  # CPU time of this process in the algorithm part (robust on a shared machine)
        t0 = time.process_time()
        out = step(*args)
        if cuda:  # the runner's wall clock around step() must include the queued kernels
            torch.cuda.synchronize()
        cpu.append(time.process_time() - t0)
        return out

    sim.algorithm.step = timed_step

    def progress(k, row):
        rss.append(rss_mb())
        comm_s.append(sim.fed.stats.seconds)

    history = sim.run(progress=progress).history
    alg = np.array(history["algorithm_time"][1:])
    alg_max = np.max(comm.allgather(alg), axis=0)[warmup:]
    cpu_max = np.max(comm.allgather(np.array(cpu)), axis=0)[warmup:]
    comm_per_iter = np.diff(comm_s)[warmup:]
    peak = comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    growth = comm.gather(rss[-1] - rss[warmup + 1] if len(rss) > warmup + 1 else 0.0)
    if comm.Get_rank():
        return None
    p = cfg.algorithm.clients_per_round
    return {
        "alg_s": float(np.median(alg_max)),
        "alg_s_min": float(np.min(alg_max)),
        "alg_cpu_s": float(np.median(cpu_max)),
        "eval_s": float(np.median(history["evaluation_time"][1 + warmup:])),
        "comm_s": float(np.median(comm_per_iter)),
        "comm_share": float(np.median(comm_per_iter / alg[warmup:])),
        "updates_per_s": p / float(np.median(alg_max)),
        "peak_rss_mb": float(max(peak)),
        "rss_growth_mb": float(max(growth)),
        "ranks": comm.Get_size(),
        "final_test_accuracy": float(history["test_accuracy"][-1]) if "test_accuracy" in history else float("nan"),
    }


if __name__ == "__main__":
    result = measure(json.loads(sys.argv[1]), MPI.COMM_WORLD)
    if result is not None:
        print("BENCH " + json.dumps(result), flush=True)
