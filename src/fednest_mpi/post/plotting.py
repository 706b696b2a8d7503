"""Plots of runs: metric(s) against iteration, communication rounds or wall time; runs overlaid, or
grouped by config fields with a mean +- sd band over the runs of each group. matplotlib is imported
inside :func:`plot` (its object API, no pyplot: no global state, no display)."""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fednest_mpi.errors import UsageError
from fednest_mpi.post.load import check_columns, group_runs, read_runs
from fednest_mpi.post.stats import finite, group_mean_sd, running_mean

__all__ = ["X_AXES", "plot"]

logger = logging.getLogger(__name__)

#: Suggested x-axes of :func:`plot` (any monotone column of the run files is accepted).
X_AXES = ("iteration", "comm_rounds", "wall_time")

_AXIS_LABELS = {
    "iteration": "outer iteration",
    "comm_rounds": "communication rounds",
    "comm_bytes": "communicated bytes per rank [B]",
    "comm_seconds": "time in Allreduce [s]",
    "wall_time": "wall time [s]",
}
_PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def _auto_log(metric: str, arrays: list[np.ndarray]) -> bool:
    """Log scale for errors/norms (non-negative by nature) whose positive values span more than 2 decades."""
    name = metric.lower()
    if not any(word in name for word in ("error", "norm", "gap", "residual")):
        return False
    values = np.concatenate([finite(a) for a in arrays]) if arrays else np.empty(0)
    if values.size == 0 or values.min() <= 0:
        return False
    return values.max() / values.min() > 100.0


def plot(
    paths,
    out,
    metric: str | Sequence[str] = "x_error",
    x_axis: str = "iteration",
    group_by: str | Sequence[str] | None = None,
    logy: bool | None = None,
    smooth: int = 1,
) -> Path:
    """Draw ``metric`` against ``x_axis`` for several runs; write ``out`` (.png, .pdf or .svg); return its path.

    Parameters
    ----------
    paths : run files (a directory stands for its ``*.h5``).
    out : output image; its format follows the suffix; its directory is created.
    metric : a recorded column, or a list of them (one subplot each).
    x_axis : ``iteration``, ``comm_rounds``, ``wall_time`` (or any other non-decreasing column).
    group_by : dotted config field(s) (``algorithm.name``): runs with the same values are drawn as
        one line, the mean over them, with a +- 1 sd band; None: one line per run.
    logy : log y-axis; None: automatic (errors and norms whose values span more than 2 decades).
    smooth : trailing running mean over this many recorded iterations (:func:`running_mean`), per
        run, before the statistics (the paper's accuracy curves are 5-iteration running means).
    """
    from matplotlib.figure import Figure  # no pyplot: no global state, no display; savefig picks Agg/PDF by suffix

    runs = read_runs(paths)
    metrics = [metric] if isinstance(metric, str) else list(metric)
    if not metrics:
        raise UsageError("plot: no metric given; name at least one recorded column, e.g. x_error")
    out = Path(out)
    if out.suffix.lower() not in _PLOT_SUFFIXES:
        raise UsageError(f"plot output {str(out)!r}: use a file name ending in {', '.join(_PLOT_SUFFIXES)}")
    check_columns(runs, [x_axis], "x_axis")
    check_columns(runs, metrics, "metric")
    fields, groups = group_runs(runs, group_by)

    ncols = min(len(metrics), 2)
    nrows = math.ceil(len(metrics) / ncols)
    fig = Figure(figsize=(6.4 * ncols, 4.4 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)

    colors = [f"C{i % 10}" for i in range(max(len(groups) if fields else len(runs), 1))]
    for ax, m in zip(axes, metrics):
        arrays = [running_mean(r.data[m], smooth) for r in runs]
        series = {id(r): {x_axis: r.data[x_axis], m: a} for r, a in zip(runs, arrays)}
        if not any(finite(a).size for a in arrays):
            raise UsageError(
                f"metric {m!r} has no finite value in any of the runs (NaN throughout); choose another metric"
            )
        empty = [r.name for r, a in zip(runs, arrays) if not finite(a).size]
        if empty:
            logger.warning("metric %s has no finite value in %s; not drawn", m, ", ".join(empty))
        use_log = _auto_log(m, arrays) if logy is None else bool(logy)
        floor = min((finite(a)[finite(a) > 0].min() for a in arrays if (finite(a) > 0).any()), default=None)
        # lines join the finite values only: a metric recorded every k iterations (run.train_eval_every)
        # is NaN in between and would otherwise be drawn as isolated dashes
        if not fields:
            for r, color in zip(runs, colors):
                x, y = np.asarray(r.data[x_axis], dtype=float), series[id(r)][m]
                ok = np.isfinite(y)
                ax.plot(x[ok], y[ok], color=color, lw=1.5, label=r.name)
        else:
            for (value, members), color in zip(groups, colors):
                stats = group_mean_sd([series[id(r)] for r in members], m, x_axis)
                ok = np.isfinite(stats.mean)
                label = f"{value} ({len(members)} run{'s' if len(members) > 1 else ''})"
                ax.plot(stats.x[ok], stats.mean[ok], color=color, lw=1.8, label=label)
                if len(members) > 1:
                    lower, upper = stats.mean - stats.sd, stats.mean + stats.sd
                    if use_log and floor is not None:
                        lower = np.maximum(lower, floor)
                    ax.fill_between(stats.x[ok], lower[ok], upper[ok], color=color, alpha=0.2, lw=0)
        if use_log:
            ax.set_yscale("log")
        ax.set_xlabel(_AXIS_LABELS.get(x_axis, x_axis))
        ax.set_ylabel(m)
        if len(metrics) > 1:
            ax.set_title(m)
        ax.grid(True, which="major", alpha=0.3)
        n_entries = len(groups) if fields else len(runs)
        ax.legend(
            title=", ".join(fields) or None, fontsize="small", title_fontsize="small", ncols=1 if n_entries <= 8 else 2
        )

    problems = ", ".join(sorted({r.problem for r in runs}))
    how = (
        f"mean \u00b1 sd over the runs of each {', '.join(fields)} value"
        if fields
        else f"{len(runs)} run{'s' if len(runs) > 1 else ''}"
    )
    if smooth > 1:
        how += f", {smooth}-iteration running mean"
    fig.suptitle(textwrap.fill(f"{problems}: {how}", 60 * ncols), fontsize="medium")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out
