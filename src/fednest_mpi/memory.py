"""Memory check before a problem allocates its clients' data: a usage error naming the bytes needed.

A problem stores a few arrays per hosted client (``problems/``); for sizes far beyond the machine
(10^11 clients, a dimension of 10^6) numpy would fail deep inside with ``MemoryError`` or the
kernel would kill the job. :func:`check_memory` compares a lower bound of what a node's ranks will
hold -- the numbers stored per client (:func:`numbers_per_client`, counted from the problem's
arrays) for every hosted client plus the problem's shared base arrays, as numpy arrays and their
torch copies, 8 bytes each -- with the memory the node has available (``MemAvailable`` of
``/proc/meminfo``). Problems whose data are a fixed data set (MNIST, Adult) or generated on demand
(synthetic) store nothing that grows with the config beyond the data set, and are not checked.
A problem takes part by its parameter class's method ``stored_numbers_per_client()`` (docs/extending.md).
No MPI here: the runner agrees on the verdict (:func:`fednest_mpi.runner.agree_on_usage_error`).
"""

from __future__ import annotations

import os

from fednest_mpi.errors import ConfigError
from fednest_mpi.text import format_bytes


def numbers_per_client(problem) -> int:
    """Numbers stored per client by the problem of config section ``problem``: its parameter class's
    ``stored_numbers_per_client()`` (a plugin's too), 0 where it has none (not checked)."""
    count = getattr(problem, "stored_numbers_per_client", None)
    return int(count()) if callable(count) else 0


def available_bytes() -> int | None:
    """Memory available to new allocations on this node, or None when it cannot be told."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(cfg, hosted: int, ranks_on_node: int, available: int | None = None) -> None:
    """ConfigError when the ``ranks_on_node`` ranks of this node, each hosting up to ``hosted``
    clients, need more memory for the problem's data than the node has available."""
    per_client = numbers_per_client(cfg.problem)
    if not per_client:
        return
    per_rank = 8 * 2 * (hosted + 1) * per_client  # numpy arrays and their torch copies; +1: the shared base arrays
    need = per_rank * ranks_on_node
    available = available_bytes() if available is None else available
    if available is not None and need > available:
        p, need_text = cfg.problem, format_bytes(need, binary=True)
        raise ConfigError(
            f"problem: the {p.name} problem's client data need at least {need_text} on this node "
            f"({ranks_on_node} rank(s) x {hosted} clients x {per_client} numbers; problem.n_clients = {p.n_clients}), "
            f"only {format_bytes(available, binary=True)} is available; lower problem.n_clients or the dimensions, "
            "or run on more nodes"
        )
