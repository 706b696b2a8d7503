"""Plots of runs: metric(s) against iteration, communication rounds or wall time; runs overlaid, or
grouped by config fields with a mean +- sd band over the runs of each group. Labels come from the run
files (column descriptions and units, config values in words: :mod:`.labels`); every one can be set.
matplotlib is imported when :func:`plot` makes a figure (its object API, no pyplot: no global state, no display)."""

from __future__ import annotations

import dataclasses
import logging
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fednest_mpi.errors import UsageError
from fednest_mpi.post.labels import axis_label, group_label, problem_label
from fednest_mpi.post.load import (
    Run,
    check_columns,
    check_group_by,
    common_primary_metrics,
    differences,
    group_values,
    read_runs,
)
from fednest_mpi.post.stats import finite, group_mean_sd, running_mean

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PLOT_SUFFIXES", "X_AXES", "plot"]

logger = logging.getLogger(__name__)

#: Suggested x-axes of :func:`plot` (any monotone column of the run files is accepted).
X_AXES = ("iteration", "comm_rounds", "wall_time")
#: Output formats of :func:`plot`, by the file name's suffix.
PLOT_SUFFIXES = (".png", ".pdf", ".svg")
_LINESTYLES = ("-", "--", ":", "-.")
_LEGENDS = ("best", "right", "below", "none")


def _auto_log(metric: str, arrays: list[np.ndarray]) -> bool:
    """Log scale for errors/norms (non-negative by nature) whose positive values span more than 2 decades."""
    name = metric.lower()
    if not any(word in name for word in ("error", "norm", "gap", "residual")):
        return False
    values = np.concatenate([finite(a) for a in arrays]) if arrays else np.empty(0)
    if values.size == 0 or values.min() <= 0:
        return False
    return values.max() / values.min() > 100.0


def _column_info(runs: Sequence[Run], column: str) -> dict:
    """The stored attributes (description, units) of ``column`` in the first run that has them."""
    for r in runs:
        info = r.attrs.get("columns", {}).get(column)
        if info:
            return info
    return {}


def _styles(fields: list[str], keys: list[tuple]) -> list[tuple[str, str]]:
    """(colour, line style) per group: with two or more fields and at most 4 values of the last one, the
    colour follows the other fields (the algorithm) and the line style the last (the partition)."""
    last = list(dict.fromkeys(k[-1] for k in keys))
    heads = list(dict.fromkeys(k[:-1] for k in keys))
    if len(fields) >= 2 and len(last) <= len(_LINESTYLES) and len(heads) <= 10 and len(heads) < len(keys):
        return [(f"C{heads.index(k[:-1])}", _LINESTYLES[last.index(k[-1])]) for k in keys]
    return [(f"C{i % 10}", "-") for i in range(len(keys))]


def _how(runs: Sequence[Run], fields: list[str], groups, smooth: int) -> tuple[str, bool]:
    """The title's account of what is drawn, and whether legend entries must carry their run counts."""
    counts = {len(members) for _, members in groups}
    per_entry = len(counts) > 1
    if not fields and len(runs) == 1:  # the run itself in words; no legend needed
        how = group_label(
            ["algorithm.name", "seed"], (runs[0].config.get("algorithm.name"), runs[0].config.get("seed"))
        )
    elif not fields:
        how = f"{len(runs)} runs"
    elif per_entry:
        how = "mean \u00b1 sd over the runs of each group"
    elif counts == {1}:
        how = "one run per group"
    else:
        (n,) = counts
        seeds_only = all(set(differences(members)) <= {"seed"} for _, members in groups)
        how = f"mean \u00b1 sd over {n} {'seeds' if seeds_only else 'runs'}"
    if smooth > 1:
        how += f", {smooth}-iteration running mean"
    return how, per_entry


def _constant_runs(runs, items: Sequence[str]):
    """A predicate: is this run drawn as a constant (``plot(constant=...)``)? Checks every ``FIELD=VALUE``."""
    wanted = []
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or not field:
            raise UsageError(f"constant: expected FIELD=VALUE, e.g. problem.tune_loss=false, got {item!r}")
        check_group_by(runs, field)
        wanted.append((field, value.strip().lower()))
    return lambda r: bool(wanted) and all(str(r.config[f]).lower() == v for f, v in wanted)


def _constant_line(ax, arrays, label: str) -> None:
    """A black dashed line at the mean over ``arrays`` of each one's last finite value."""
    finals = [finite(a)[-1] for a in arrays if finite(a).size]
    if finals:
        ax.axhline(float(np.mean(finals)), color="k", ls="--", lw=1.5, label=f"{label} (final value)")


def _metrics_of(runs: Sequence[Run], metric: str | Sequence[str] | None) -> list[str]:
    """The metrics to draw: those named, else the runs' common primary metrics."""
    metrics = common_primary_metrics(runs) if metric is None else [metric] if isinstance(metric, str) else list(metric)
    if not metrics:
        raise UsageError("plot: no metric given; name at least one recorded column, e.g. x_error")
    return metrics


def _checked_options(out, metrics: list[str], ylabel, size, legend: str) -> tuple[Path | None, list]:
    """The output path and one y label per metric, after checking them, ``size`` and ``legend``."""
    if out is not None:
        out = Path(out)
        if out.suffix.lower() not in PLOT_SUFFIXES:
            raise UsageError(f"plot output {str(out)!r}: use a file name ending in {', '.join(PLOT_SUFFIXES)}")
    ylabels = [ylabel] * len(metrics) if ylabel is None or isinstance(ylabel, str) else list(ylabel)
    if len(ylabels) != len(metrics):
        raise UsageError(f"ylabel: {len(ylabels)} labels for {len(metrics)} metrics; give one per metric")
    if size is not None and not (len(size) == 2 and all(math.isfinite(s) and 0 < s <= 100 for s in size)):
        raise UsageError(f"size: expected (width, height) in inches, each in (0, 100], got {size!r}")
    if legend not in _LEGENDS:
        raise UsageError(f"legend: {legend!r} is not one of {', '.join(_LEGENDS)}")
    return out, ylabels


def _figure(n: int, size: tuple[float, float] | None) -> tuple[Figure, np.ndarray, int, int]:
    """A figure of ``n`` subplots, two per row (6.4 x 4.4 inches each unless ``size`` is given), those left over
    hidden: the figure, its axes, its number of columns and the characters of a y label's line."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display; savefig picks Agg/PDF by suffix

    ncols = min(n, 2)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=size or (6.4 * ncols, 4.4 * nrows), layout="constrained")
    wrap = max(20, int(10.5 * fig.get_size_inches()[1] / nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes, ncols, wrap


def _band(ax, stats, arrays: list[np.ndarray], color: str, use_log: bool) -> None:
    """The +- 1 sd band around a group's mean, kept within the values its runs took (``arrays``): an accuracy's
    band does not dip below the worst run, nor below zero on a log axis."""
    ok = np.isfinite(stats.mean)
    own = np.concatenate([finite(a) for a in arrays])
    low, high = own.min(), own.max()
    if use_log and (own > 0).any():
        low = max(low, own[own > 0].min())
    lower = np.clip(stats.mean - stats.sd, low, high)
    upper = np.clip(stats.mean + stats.sd, low, high)
    ax.fill_between(stats.x[ok], lower[ok], upper[ok], color=color, alpha=0.15, lw=0)


@dataclass
class _Subplots:
    """What every subplot of :func:`plot` shares: the runs, their groups (no ``fields``: one line per run),
    the lines' styles and legend entries, the axes' options."""

    runs: Sequence[Run]
    x_axis: str
    fields: list[str]
    groups: list
    labels: dict[str, str]
    is_constant: Callable[[Run], bool]
    counts_in_legend: bool
    smooth: int
    logy: bool | None
    logx: bool
    xlabel: str | None
    legend: str
    wrap: int
    #: (colour, line style) of each group's line, or of each run's without groups
    styles: list[tuple[str, str]] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        if self.fields:
            self.styles = _styles(self.fields, [values for values, _ in self.groups])
        else:
            self.styles = [(f"C{i % 10}", "-") for i in range(len(self.runs))]

    def draw(self, ax, metric: str, ylabel: str | None) -> None:
        """``metric`` against the x axis on ``ax``, with its scales, labels and legend."""
        arrays = [running_mean(r.data[metric], self.smooth) for r in self.runs]
        if not any(finite(a).size for a in arrays):
            raise UsageError(
                f"metric {metric!r} has no finite value in any of the runs (NaN throughout); choose another metric"
            )
        empty = [r.name for r, a in zip(self.runs, arrays) if not finite(a).size]
        if empty:
            logger.warning("metric %s has no finite value in %s; not drawn", metric, ", ".join(empty))
        use_log = _auto_log(metric, arrays) if self.logy is None else bool(self.logy)
        series = {id(r): {self.x_axis: r.data[self.x_axis], metric: a} for r, a in zip(self.runs, arrays)}
        if self.fields:
            self._group_lines(ax, metric, series, use_log)
        else:
            self._run_lines(ax, metric, series)
        self._decorate(ax, metric, ylabel, use_log)

    def _run_lines(self, ax, metric: str, series: dict) -> None:
        """One line per run (or a constant: :func:`_constant_line`). Lines join the finite values only: a metric
        recorded every k iterations (run.train_eval_every) is NaN in between and would otherwise be drawn as
        isolated dashes."""
        for r, (color, style) in zip(self.runs, self.styles):
            y, label = series[id(r)][metric], self.labels.get(r.name, r.name)
            if self.is_constant(r):
                _constant_line(ax, [y], label)
                continue
            x, ok = np.asarray(r.data[self.x_axis], dtype=float), np.isfinite(y)
            ax.plot(x[ok], y[ok], color=color, ls=style, lw=1.5, label=label)

    def _group_lines(self, ax, metric: str, series: dict, use_log: bool) -> None:
        """One line per group, the mean over its runs (of their finite values), with the +- 1 sd band (or a
        constant)."""
        for (values, members), (color, style) in zip(self.groups, self.styles):
            arrays = [series[id(r)][metric] for r in members]
            label = group_label(self.fields, values, self.labels)
            if all(self.is_constant(r) for r in members):
                _constant_line(ax, arrays, label)
                continue
            stats = group_mean_sd([series[id(r)] for r in members], metric, self.x_axis)
            ok = np.isfinite(stats.mean)
            if self.counts_in_legend:
                label += f" ({len(members)} run{'s' if len(members) > 1 else ''})"
            ax.plot(stats.x[ok], stats.mean[ok], color=color, ls=style, lw=1.8, label=label)
            if len(members) > 1:
                _band(ax, stats, arrays, color, use_log)

    def _decorate(self, ax, metric: str, ylabel: str | None, use_log: bool) -> None:
        """Scales, axis labels (from the columns' descriptions unless given), grid and the legend in the axes."""
        if use_log:
            ax.set_yscale("log")
        if self.logx:
            ax.set_xscale("log")
        if self.xlabel is not None:
            ax.set_xlabel(self.xlabel)
        else:
            ax.set_xlabel(axis_label(self.x_axis, _column_info(self.runs, self.x_axis)))
        if ylabel is None:
            ylabel = textwrap.fill(axis_label(metric, _column_info(self.runs, metric)), self.wrap)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        n_entries = len(self.groups) if self.fields else len(self.runs)
        if n_entries == 1 and not self.fields and not self.labels and self.legend == "best":
            pass  # one line: the title says what it is
        elif self.legend == "best":
            ax.legend(fontsize="small", ncols=1 if n_entries <= 8 else 2, framealpha=0.8)


def _outside_legend(fig: Figure, ax, legend: str) -> None:
    """One legend for all subplots, ``right`` of or ``below`` them (the layout makes room), with the entries of
    ``ax``."""
    handles, texts = ax.get_legend_handles_labels()
    where = "outside right upper" if legend == "right" else "outside lower center"
    entry = 0.065 * max(map(len, texts), default=1) + 0.6  # inches of one entry in the small font
    ncols = 1 if legend == "right" else max(1, min(len(texts), int(fig.get_size_inches()[0] / entry)))
    # the "outside ..." locations (constrained layout) are not in matplotlib's type stubs
    fig.legend(handles, texts, loc=where, ncols=ncols, fontsize="small", frameon=False)  # type: ignore[call-overload]


def plot(
    paths,
    out=None,
    metric: str | Sequence[str] | None = None,
    x_axis: str = "iteration",
    group_by: str | Sequence[str] | None = None,
    logy: bool | None = None,
    smooth: int = 1,
    *,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | Sequence[str] | None = None,
    size: tuple[float, float] | None = None,
    logx: bool = False,
    labels: Mapping[str, str] | None = None,
    legend: str = "best",
    dpi: float = 150,
    constant: Sequence[str] = (),
) -> Figure:
    """Draw ``metric`` against ``x_axis`` for several runs and return the matplotlib Figure (edit it, or
    save it with ``fig.savefig(path)``); with ``out`` it is also written there (.png, .pdf or .svg, by
    the suffix; its folder is created).

    Parameters
    ----------
    paths : run files (a directory stands for its ``*.h5``).
    out : image file to write, or None.
    metric : a recorded column, or a list of them (one subplot each); None: the runs' primary metric
        (each run file's ``primary_metric``, those that every run records).
    x_axis : ``iteration``, ``comm_rounds``, ``wall_time`` (or any other non-decreasing column).
    group_by : dotted config field(s) (``algorithm.name``): runs with the same values are drawn as
        one line, the mean over them, with a +- 1 sd band (kept within the range of the group's
        values); None: one line per run. With two or more fields the colour follows the first
        ones and the line style the last (e.g. algorithm and partition).
    logy : log y-axis; None: automatic (errors and norms whose values span more than 2 decades).
    smooth : trailing running mean over this many recorded iterations (:func:`running_mean`), per
        run, before the statistics (the paper's accuracy curves are 5-iteration running means).
    title : the figure's title; None: the problem and what is drawn ("Hyper-representation, MNIST:
        mean ± sd over 3 seeds"); "": none.
    xlabel, ylabel : axis labels (``ylabel``: one, or one per metric); None: from the columns'
        stored description and units.
    size : figure size (width, height) in inches; None: 6.4 x 4.4 per subplot.
    logx : log x-axis.
    labels : legend entries by a group's plain label (``"fednest, iid"``), a config value
        (``"fednest"``) or a run's name; None: config values in words (:mod:`.labels`).
    legend : ``best`` (inside the axes, where it covers least), ``right`` or ``below`` the axes (for
        small figures and many lines), or ``none``.
    dpi : resolution of a PNG.
    constant : ``FIELD=VALUE`` items (``problem.tune_loss=false``): the runs whose config has that value
        (every one of them, for several items) are drawn as a constant, a black dashed horizontal line at
        their final value (mean over the line's runs of each run's last finite value, after ``smooth``):
        a baseline such as the paper's Fig. 3 untuned accuracy.
    """
    runs = read_runs(paths)
    metrics = _metrics_of(runs, metric)
    out, ylabels = _checked_options(out, metrics, ylabel, size, legend)
    check_columns(runs, [x_axis], "x_axis")
    check_columns(runs, metrics, "metric")
    fields, groups = group_values(runs, group_by)
    how, counts_in_legend = _how(runs, fields, groups, smooth)
    fig, axes, ncols, wrap = _figure(len(metrics), size)
    subplots = _Subplots(
        runs=runs,
        x_axis=x_axis,
        fields=fields,
        groups=groups,
        labels=dict(labels or {}),
        is_constant=_constant_runs(runs, constant),
        counts_in_legend=counts_in_legend,
        smooth=smooth,
        logy=logy,
        logx=logx,
        xlabel=xlabel,
        legend=legend,
        wrap=wrap,
    )
    for ax, m, label_y in zip(axes, metrics, ylabels):
        subplots.draw(ax, m, label_y)
    if legend in ("right", "below"):
        _outside_legend(fig, axes[0], legend)
    if title is None:  # 80 characters per column of subplots
        problems = " / ".join(dict.fromkeys(problem_label(r.config) for r in runs))
        title = textwrap.fill(f"{problems}: {how}", 80 * ncols)
    if title:
        fig.suptitle(title, fontsize="medium")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=dpi)
    return fig
