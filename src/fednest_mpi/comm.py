"""Communicators, created by entry points and passed down: nothing here or elsewhere starts MPI at import.

* :func:`world` -- ``MPI.COMM_WORLD`` of mpi4py, importing ``mpi4py.MPI`` on first use (after
  setting ``MPI4PY_RC_THREAD_LEVEL=single`` unless the environment says otherwise: three times lower
  Allreduce latency with MPICH, docs/performance.md);
* :class:`SerialComm` -- a one-rank stand-in with the methods the simulator calls (``Get_rank``,
  ``Get_size``, ``Barrier``, ``allgather``, ``bcast``, ``gather``, ``Abort``), so that a problem, an
  algorithm and a whole run can be used in a notebook or a test without MPI;
* :func:`wtime` -- ``MPI.Wtime()`` for an mpi4py communicator (a clock common to its ranks'
  phase times), ``time.perf_counter()`` for the serial one.

A reduction on one rank is the identity, so :class:`~fednest_mpi.federation.Federation` never calls
``Allreduce`` on a communicator of size 1.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def mpi():
    """The ``mpi4py.MPI`` module (initialises MPI on the first call)."""
    os.environ.setdefault("MPI4PY_RC_THREAD_LEVEL", "single")
    from mpi4py import MPI

    return MPI


def world():
    """``MPI.COMM_WORLD``."""
    return mpi().COMM_WORLD


class SerialComm:
    """A communicator of one rank (rank 0 of size 1), without MPI."""

    def Get_rank(self) -> int:  # noqa: N802 (mpi4py's names)
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return 1

    def Barrier(self) -> None:  # noqa: N802
        return None

    def allgather(self, value: Any) -> list:
        return [value]

    def gather(self, value: Any, root: int = 0) -> list:
        return [value]

    def bcast(self, value: Any, root: int = 0) -> Any:
        return value

    def Abort(self, errorcode: int = 1) -> None:  # noqa: N802
        sys.exit(errorcode)


def is_mpi(comm) -> bool:
    """Whether ``comm`` is an mpi4py communicator (rather than a :class:`SerialComm`)."""
    return not isinstance(comm, SerialComm)


def wtime(comm) -> float:
    """Seconds on a clock shared by the ranks of ``comm`` (``MPI.Wtime``; ``perf_counter`` when serial)."""
    return mpi().Wtime() if is_mpi(comm) else time.perf_counter()
