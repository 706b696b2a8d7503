"""Statistics over recorded series: best/final values, medians per iteration, trailing running means
and the mean +- sd of a metric over several runs (seeds) on a common x grid. numpy only."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from fednest_mpi.errors import UsageError

__all__ = [
    "GroupStats",
    "best",
    "final",
    "finite",
    "group_mean_sd",
    "higher_is_better",
    "median_per_iteration",
    "running_mean",
]


def higher_is_better(metric: str, declared: bool | None = None) -> bool:
    """Whether the best value of ``metric`` is its maximum: what the run file declares (the column's
    ``higher_is_better`` attribute, from the problem's ``metric_info``); a run file written before metrics
    declared it (schema of 2026-12-01 and earlier): True for names with "accuracy"."""
    if declared is not None:
        return declared
    return "accuracy" in metric.lower() and "gap" not in metric.lower()


def finite(a) -> np.ndarray:
    """The finite values of ``a`` as a float array."""
    a = np.asarray(a, dtype=float)
    return a[np.isfinite(a)]


def final(a) -> float:
    """The last value of ``a`` (NaN when empty)."""
    a = np.asarray(a, dtype=float)
    return float(a[-1]) if a.size else math.nan


def best(a, metric: str, declared: bool | None = None) -> float:
    """The best finite value of ``a``: max where higher is better, min otherwise (:func:`higher_is_better`);
    NaN if none."""
    f = finite(a)
    if not f.size:
        return math.nan
    return float(f.max() if higher_is_better(metric, declared) else f.min())


def median_per_iteration(data: Mapping[str, np.ndarray], column: str) -> float:
    """Median of a per-iteration time over iterations 1..K (iteration 0 is the initial point, no step)."""
    if column not in data:
        return math.nan
    values = np.asarray(data[column], dtype=float)
    it = np.asarray(data.get("iteration", np.arange(values.size)))
    f = finite(values[it >= 1])
    return float(np.median(f)) if f.size else math.nan


class GroupStats(NamedTuple):
    """Mean and sample standard deviation over runs on a common x grid (:func:`group_mean_sd`)."""

    x: np.ndarray
    mean: np.ndarray
    sd: np.ndarray  # ddof=1; NaN where fewer than 2 runs have a value
    n: np.ndarray  # number of runs with a finite value at each x


def group_mean_sd(frames, metric: str, x_axis: str = "iteration") -> GroupStats:
    """Mean +- sd of ``metric`` over several runs (``frames``: DataFrames or {column: array} mappings).

    When the runs share their x values (``iteration``; ``comm_rounds`` of a deterministic
    schedule), the statistics are taken pointwise over the runs that reach each x (a run that
    stopped early, e.g. diverged, counts up to its last iteration; ``n`` says how many). Otherwise
    (``wall_time``, random round counts) every run is linearly interpolated onto the union of the x
    values inside the range that all runs cover. NaN values are left out of the statistics (``n``
    counts the runs used).
    """
    xs, ys = _series(frames, metric, x_axis)
    longest = max(xs, key=lambda x: x.size)
    if all(np.array_equal(x, longest[: x.size]) for x in xs):
        # shared x values; a shorter run (stopped, diverged) leaves the statistics where it ends
        grid = longest
        Y = np.full((len(ys), grid.size), np.nan)
        for row, y in zip(Y, ys):
            row[: y.size] = y
    else:
        grid, Y = _interpolated(xs, ys, x_axis)
    n = np.isfinite(Y).sum(axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)  # all-NaN columns -> NaN
        mean = np.nanmean(Y, axis=0)
        sd = np.nanstd(Y, axis=0, ddof=1)
    sd = np.where(n >= 2, sd, np.nan)
    return GroupStats(x=grid, mean=mean, sd=sd, n=n)


def _series(frames, metric: str, x_axis: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The x values and the ``metric`` of each run in ``frames``, as float arrays; at least one run, each with
    both columns and a recorded iteration."""
    frames = list(frames)
    if not frames:
        raise UsageError("group_mean_sd: no runs given")
    xs, ys = [], []
    for i, f in enumerate(frames):
        for col in (x_axis, metric):
            if col not in f:
                raise UsageError(f"group_mean_sd: run {i} has no column {col!r}")
        x = np.asarray(f[x_axis], dtype=float)
        y = np.asarray(f[metric], dtype=float)
        if x.size == 0:
            raise UsageError(f"group_mean_sd: run {i} has no recorded iteration")
        xs.append(x)
        ys.append(y)
    return xs, ys


def _interpolated(xs: list[np.ndarray], ys: list[np.ndarray], x_axis: str) -> tuple[np.ndarray, np.ndarray]:
    """The union of the runs' x values inside the range all of them cover, and each run's finite values
    linearly interpolated onto it (a row per run; NaN outside the run's own finite range)."""
    for i, x in enumerate(xs):
        if np.any(np.diff(x) < 0):
            raise UsageError(
                f"x_axis {x_axis!r} decreases within run {i}; use a monotone column (iteration, comm_rounds, wall_time)"
            )
    lo, hi = max(x[0] for x in xs), min(x[-1] for x in xs)
    if lo > hi:
        raise UsageError(f"the runs cover disjoint ranges of {x_axis!r}; they cannot be averaged")
    grid = np.unique(np.concatenate(xs))
    grid = grid[(grid >= lo) & (grid <= hi)]
    rows = []
    for x, y in zip(xs, ys):
        ok = np.isfinite(y)
        row = np.full(grid.shape, np.nan)
        if ok.any():
            inside = (grid >= x[ok][0]) & (grid <= x[ok][-1])
            row[inside] = np.interp(grid[inside], x[ok], y[ok])
        rows.append(row)
    return grid, np.vstack(rows)


def running_mean(values, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` values (fewer at the start); NaNs are skipped."""
    a = np.asarray(values, dtype=float)
    if window <= 1 or a.size == 0:
        return a
    ok = np.isfinite(a)
    total = np.concatenate([[0.0], np.cumsum(np.where(ok, a, 0.0))])
    count = np.concatenate([[0], np.cumsum(ok)])
    lo = np.maximum(np.arange(1, a.size + 1) - window, 0)
    hi = np.arange(1, a.size + 1)
    n = count[hi] - count[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (total[hi] - total[lo]) / n, np.nan)
