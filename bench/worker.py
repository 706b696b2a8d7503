"""One measurement, run on every rank (``mpiexec -n P python bench/worker.py '<json>'``).

The JSON names ``config`` (a run config as plain data), ``mode`` (``project``: this package;
``sequential``: :class:`bench.sequential.SequentialProblem` inside this package's algorithms;
``plain``: :class:`bench.plain.PlainLoop`, 1 rank, no package code on the hot path),
``iterations`` measured after ``warmup`` unmeasured ones. Rank 0 prints one line ``BENCH <json>``
with medians over the measured iterations of: the algorithm part (wall time of the step, max over
ranks), its CPU time (max over ranks), its user and system CPU and minor page faults (sums over
ranks, ``getrusage``), the evaluation, time inside Allreduce (incl. waiting for slower ranks) and
the aggregations (count, bytes per rank), peak RSS per rank and the RSS growth from the first to
the last measured iteration (flat memory: about 0). On a machine shared with other jobs CPU time is
a steadier measure of the work than wall time (MPI busy-polling counts as CPU time).
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

from bench.plain import PlainLoop  # noqa: E402
from bench.sequential import SequentialProblem  # noqa: E402
from fednest_mpi import config  # noqa: E402
from fednest_mpi.callbacks import Callback  # noqa: E402
from fednest_mpi.runner import Simulation  # noqa: E402

NAN = float("nan")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Meter:
    """Per call of a wrapped function: wall, CPU, user and system seconds, minor page faults (this
    process), and the RSS after it. ``sync`` runs before the clocks stop (queued CUDA kernels)."""

    FIELDS = ("wall", "cpu", "user", "sys", "minflt")

    def __init__(self, sync=None):
        self.calls: list[tuple[float, ...]] = []
        self.rss: list[float] = []
        self.sync = sync

    def wrap(self, fn):
        def timed(*args):
            r0, t0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), time.process_time()
            out = fn(*args)
            if self.sync is not None:
                self.sync()
            t1, c1, r1 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
            self.calls.append(
                (
                    t1 - t0,
                    c1 - c0,
                    r1.ru_utime - r0.ru_utime,
                    r1.ru_stime - r0.ru_stime,
                    float(r1.ru_minflt - r0.ru_minflt),
                )
            )
            self.rss.append(rss_mb())
            return out

        return timed

    def summary(self, comm, warmup: int) -> dict | None:
        """Medians over the measured calls (max or sum over ranks, see the module docstring); rank 0 only.
        **Collective**."""
        calls = np.array(self.calls)[warmup:]
        every = comm.allgather(calls)
        peak = comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
        growth = comm.gather(self.rss[-1] - self.rss[warmup] if len(self.rss) > warmup + 1 else 0.0)
        if comm.Get_rank():
            return None
        stack = np.stack(every)  # (ranks, iterations, fields)
        worst, total = stack.max(axis=0), stack.sum(axis=0)
        col = {name: j for j, name in enumerate(self.FIELDS)}
        return {
            "alg_s": float(np.median(worst[:, col["wall"]])),
            "alg_s_min": float(np.min(worst[:, col["wall"]])),
            "alg_cpu_s": float(np.median(worst[:, col["cpu"]])),
            "user_s": float(np.median(total[:, col["user"]])),
            "sys_s": float(np.median(total[:, col["sys"]])),
            "minflt": float(np.median(total[:, col["minflt"]])),
            "peak_rss_mb": float(max(peak)),
            "rss_growth_mb": float(max(growth)),
            "ranks": comm.Get_size(),
        }


def measure_project(spec: dict, comm) -> dict | None:
    """This package (or the sequential baseline inside it) for warmup + iterations outer iterations. **Collective**."""
    warmup, iterations = int(spec.get("warmup", 1)), int(spec["iterations"])
    data = json.loads(json.dumps(spec["config"]))
    data.setdefault("algorithm", {})["outer_iterations"] = warmup + iterations
    cfg = config.from_dict(data)
    sequential = spec.get("mode", "project") == "sequential"
    sim = Simulation(cfg, comm, problem_wrapper=SequentialProblem if sequential else None)
    cuda = sim.problem.initial_point()[0].device.type == "cuda"
    meter = Meter(torch.cuda.synchronize if cuda else None)
    comm_log = []

    class CommLog(Callback):
        def on_iteration(self, k, row):
            comm_log.append((sim.fed.stats.seconds, sim.fed.stats.rounds, sim.fed.stats.bytes))

    history = sim.run([CommLog()], step_wrapper=meter.wrap).history
    out = meter.summary(comm, warmup)
    if out is None:
        return None
    per_iter = np.diff(np.array(comm_log), axis=0)[warmup:]  # comm_log[0]: after iteration 0 (no step)
    alg = np.array(meter.calls)[warmup:, 0]
    out.update(
        {
            "eval_s": float(np.median(history["evaluation_time"][1 + warmup :])),
            "comm_s": float(np.median(per_iter[:, 0])),
            "comm_share": float(np.median(per_iter[:, 0] / alg)),
            "allreduce_calls": float(np.median(per_iter[:, 1])),
            "allreduce_bytes": float(np.median(per_iter[:, 2])),
            "final_test_accuracy": float(history["test_accuracy"][-1]) if "test_accuracy" in history else NAN,
        }
    )
    return out


def measure_plain(spec: dict, comm) -> dict | None:
    """:class:`bench.plain.PlainLoop` on one rank for warmup + iterations outer iterations."""
    if comm.Get_size() != 1:
        raise SystemExit("the plain loop runs on one rank")
    loop = PlainLoop(config.from_dict(spec["config"]))
    meter = Meter()
    step = meter.wrap(loop.step)
    for _ in range(int(spec.get("warmup", 1)) + int(spec["iterations"])):
        step()
    out = meter.summary(comm, int(spec.get("warmup", 1)))
    out.update({"eval_s": NAN, "comm_s": 0.0, "comm_share": 0.0, "final_test_accuracy": loop.test_accuracy()})
    return out


def measure(spec: dict, comm) -> dict | None:
    """The measurement of ``spec``; the summary on rank 0, None elsewhere. **Collective**."""
    out = (measure_plain if spec.get("mode") == "plain" else measure_project)(spec, comm)
    if out is not None:
        out["updates_per_s"] = spec["config"]["algorithm"]["clients_per_round"] / out["alg_s"]
    return out


if __name__ == "__main__":
    result = measure(json.loads(sys.argv[1]), MPI.COMM_WORLD)
    if result is not None:
        print("BENCH " + json.dumps(result), flush=True)
