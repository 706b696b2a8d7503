"""Two runs' per-iteration records compared bit for bit: what ``fednest-mpi check`` (:mod:`fednest_mpi.checking`)
and ``report --verify`` (:mod:`fednest_mpi.post.benchmark`) report when a rerun differs."""

from __future__ import annotations

import numpy as np

#: columns that measure time, not the computation: never compared
TIMING = frozenset({"wall_time", "algorithm_time", "evaluation_time", "comm_seconds"})


def first_difference(a: dict, b: dict) -> str | None:
    """``column at iteration k (A vs B)`` for the first value that differs between two records (name ->
    values per iteration; NaN equals NaN), a column missing from one, or None when they agree."""
    names = [name for name in a if name not in TIMING]
    for name in names:
        if name not in b:
            return f"column {name} missing"
        x, y = np.asarray(a[name], dtype=np.float64), np.asarray(b[name], dtype=np.float64)
        if x.shape != y.shape:
            return f"{name}: {x.size} vs {y.size} iterations"
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        if not same.all():
            k = int(np.flatnonzero(~same)[0])
            return f"{name} at iteration {k} ({float(x[k])!r} vs {float(y[k])!r})"
    return None
