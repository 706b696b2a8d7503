"""Latency and bandwidth of ``Allreduce`` (the alpha-beta model of :mod:`bench.model`), on every rank:
``mpiexec -n P python bench/allreduce.py [max_bytes]``.

For float32 buffers of 4 B .. ``max_bytes`` (powers of 4), a sum-``Allreduce`` ping loop (a barrier,
then ``repeats`` calls timed together; the best of 5 such loops). Rank 0 prints one line
``ALLREDUCE {"ranks": P, "bytes": [...], "seconds": [...]}`` (seconds per call).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from mpi4py import MPI


def ping(comm, nbytes: int, loops: int = 5) -> float:
    send = np.ones(max(nbytes // 4, 1), dtype=np.float32)
    recv = np.empty_like(send)
    repeats = int(min(1000, max(5, 2**22 // max(nbytes, 1))))
    best = float("inf")
    for _ in range(loops):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(repeats):
            comm.Allreduce(send, recv, op=MPI.SUM)
        best = min(best, (time.perf_counter() - t0) / repeats)
    return comm.allreduce(best, op=MPI.MAX)


def main(argv: list[str]) -> int:
    comm = MPI.COMM_WORLD
    top = int(argv[0]) if argv else 2**24
    sizes = [4**k for k in range(1, 20) if 4**k <= top]
    seconds = [ping(comm, n) for n in sizes]
    if comm.Get_rank() == 0:
        print("ALLREDUCE " + json.dumps({"ranks": comm.Get_size(), "bytes": sizes, "seconds": seconds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
