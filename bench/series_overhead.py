"""Cost of the 2-D series of a run (docs/performance.md): time inside the per-client value oracles,
the per-rank client file, and the /ranks + /snapshots writes, per outer iteration, 1 rank, in-process.

    python -m bench.series_overhead CONFIG ITERATIONS OUT.h5 [key=value ...]

CPU time (``time.process_time``) is reported next to wall time because the development machine is
shared: its wall times vary by a factor of 2-4 between runs, CPU time much less.
"""

from __future__ import annotations

import sys
import time

from mpi4py import MPI

from fednest_mpi import config, recorder
from fednest_mpi import series as series_mod
from fednest_mpi.callbacks import Recorder
from fednest_mpi.io.h5 import RunWriter
from fednest_mpi.runner import Simulation

PARTS = {
    "values": (recorder.ClientRecorder, "record"),
    "client_file": (series_mod.RunSeries, "before_bookkeeping"),
    "ranks_snapshots": (series_mod.RunSeries, "after_bookkeeping"),
}


def main(argv) -> None:
    path, iterations, out, *overrides = argv
    totals: dict[str, list[float]] = {k: [0.0, 0.0] for k in PARTS}

    for key, (cls, name) in PARTS.items():
        inner = getattr(cls, name)

        def wrapper(*args, _inner=inner, _key=key, **kwargs):
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                totals[_key][0] += time.process_time() - c0
                totals[_key][1] += time.perf_counter() - w0

        setattr(cls, name, wrapper)
    cfg = config.load(
        path,
        [
            f"algorithm.outer_iterations={iterations}",
            "run.checkpoint_every=0",
            f'run.output="{out}"',
            "run.overwrite=true",
            *overrides,
        ],
    )
    sim = Simulation(cfg, MPI.COMM_SELF)
    writer = RunWriter(
        cfg.run.output, {"config_json": cfg.to_json()}, sim.columns(), extend=series_mod.series_layout(sim).create
    )
    series = series_mod.RunSeries(sim, writer)
    c0, w0 = time.process_time(), time.perf_counter()
    sim.run([Recorder(writer)], series=series)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    series.close()
    writer.close()
    n = cfg.algorithm.outer_iterations + 1
    print(f"{path}: {n} records; whole run {cpu / n * 1e3:.2f} ms CPU / {wall / n * 1e3:.2f} ms wall per iteration")
    for key, (c, w) in totals.items():
        print(
            f"  {key}: {c / n * 1e3:.3f} ms CPU, {w / n * 1e3:.3f} ms wall per iteration ({100 * c / cpu:.2f} % of CPU)"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
