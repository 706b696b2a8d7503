"""Tables of runs: the plain-text :func:`report` (final/best metrics, time and communication per run)
and the Markdown :func:`checkpoint_table` (a metric at chosen iterations, mean +- sd per group),
with the number formats they use."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fednest_mpi.errors import UsageError
from fednest_mpi.post.load import check_columns, config_label, differences, group_runs, read_runs
from fednest_mpi.post.stats import best, final, median_per_iteration, running_mean
from fednest_mpi.text import format_bytes

__all__ = ["DEFAULT_METRICS", "checkpoint_table", "format_bytes", "format_number", "format_seconds", "report"]

#: Metrics shown by :func:`report` by default, those of them that a run has.
DEFAULT_METRICS = ("x_error", "outer_objective", "hypergradient_norm", "test_accuracy", "test_loss")


def format_number(value) -> str:
    """A metric value as shown in reports: 4 significant digits, '-' for missing/NaN."""
    if value is None:
        return "-"
    value = float(value)
    if math.isnan(value):
        return "-"
    return f"{value:.4g}"


def format_seconds(s) -> str:
    """A duration with a readable unit: '850 ns', '12.3 us', '4.56 ms', '1.23 s', '2.5 min'."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    s = float(s)
    if s == 0:
        return "0 s"
    s = float(f"{s:.3g}")  # round first, so that 0.9996 s reads '1 s', not '1e+03 ms'
    if abs(s) < 1e-6:
        return f"{s * 1e9:.3g} ns"
    if abs(s) < 1e-3:
        return f"{s * 1e6:.3g} us"
    if abs(s) < 1:
        return f"{s * 1e3:.3g} ms"
    if abs(s) < 120:
        return f"{s:.3g} s"
    return f"{s / 60:.3g} min"


# ----------------------------------------------------------------------------------------------
# Text report


@dataclass
class _Col:
    title: str
    cells: list[str]
    right: bool = True


@dataclass
class _Group:
    title: str
    cols: list[_Col]

    def widths(self) -> list[int]:
        w = [max([len(c.title)] + [len(s) for s in c.cells]) for c in self.cols]
        inner = sum(w) + 2 * (len(w) - 1)
        if len(self.title) > inner:  # a long group title widens its last column
            w[-1] += len(self.title) - inner
        return w

    def width(self) -> int:
        w = self.widths()
        return sum(w) + 2 * (len(w) - 1)


def _render(groups: list[_Group], n_rows: int) -> list[str]:
    widths = [g.widths() for g in groups]
    top = "  ".join(g.title.center(g.width()) if len(g.cols) > 1 else g.title.ljust(g.width()) for g in groups)
    mid = "  ".join(
        "  ".join((c.title.rjust(w) if c.right else c.title.ljust(w)) for c, w in zip(g.cols, ws))
        for g, ws in zip(groups, widths)
    )
    lines = [top.rstrip()] if top.strip() else []
    lines += [mid.rstrip(), "-" * len(mid)]
    for i in range(n_rows):
        row = "  ".join(
            "  ".join((c.cells[i].rjust(w) if c.right else c.cells[i].ljust(w)) for c, w in zip(g.cols, ws))
            for g, ws in zip(groups, widths)
        )
        lines.append(row.rstrip())
    return lines


def _blocks(key: _Group, groups: list[_Group], width: int) -> list[list[_Group]]:
    """Pack groups left to right into blocks of at most ``width`` characters, each starting with ``key``."""
    budget = width - key.width() - 2
    pieces: list[_Group] = []
    for g in groups:  # a group too wide for one block is cut between its columns, each piece keeping the title
        chunk: list[_Col] = []
        for col in g.cols:
            if chunk and _Group(g.title, chunk + [col]).width() > budget:
                pieces.append(_Group(g.title, chunk))
                chunk = []
            chunk.append(col)
        pieces.append(_Group(g.title, chunk))
    blocks, block, used = [], [key], key.width()
    for g in pieces:
        w = g.width() + 2
        if used + w > width and len(block) > 1:
            blocks.append(block)
            block, used = [key], key.width()
        block.append(g)
        used += w
    blocks.append(block)
    return blocks


def report(paths, metrics: Sequence[str] | str | None = None, width: int = 100) -> str:
    """A plain-text table, one line per run (in the order given).

    Columns: run name; the config fields that differ between the runs; iterations done (``k/K``
    when the run stopped before its ``outer_iterations``); final and best value of each metric
    (best = min, or max for accuracies); median ``algorithm_time`` and ``evaluation_time`` per
    iteration; final ``comm_rounds`` and ``comm_bytes`` (per rank). Tables wider than ``width``
    characters are split into blocks that each start with the run name.

    ``metrics`` defaults to those of :data:`DEFAULT_METRICS` that the runs record (a run lacking
    one shows '-'); metrics named explicitly must be recorded by every run.
    """
    runs = read_runs(paths)
    if isinstance(metrics, str):
        metrics = [metrics]
    if metrics is None:
        primary = [r.attrs["primary_metric"] for r in runs if "primary_metric" in r.attrs]
        metrics = [m for m in dict.fromkeys([*primary, *DEFAULT_METRICS]) if any(m in r.data for r in runs)]
    else:
        metrics = list(metrics)
        if not metrics:
            raise UsageError(
                "report: metrics is empty; name at least one recorded column, or leave it unset for the defaults"
            )
        check_columns(runs, metrics, "metric")
    diffs = differences(runs)

    key = _Group("", [_Col("run", [r.name for r in runs], right=False)])
    groups: list[_Group] = []
    for field, values in diffs.items():
        section, _, name = field.rpartition(".")
        cells = [config_label(v) for v in values]
        right = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None)
        if groups and groups[-1].title == section and section:
            groups[-1].cols.append(_Col(name, cells, right))
        else:
            groups.append(_Group(section, [_Col(name, cells, right)]))

    iters = []
    for r in runs:
        it = r.data.get("iteration")
        done = str(int(it[-1])) if it is not None and len(it) else "-"
        planned = r.config.get("algorithm.outer_iterations")
        iters.append(done if planned is None or done == str(planned) else f"{done}/{planned}")
    groups.append(_Group("", [_Col("iters", iters)]))

    for m in metrics:
        finals = [format_number(final(r.data[m])) if m in r.data else "-" for r in runs]
        bests = [format_number(best(r.data[m], m, r.higher_is_better(m))) if m in r.data else "-" for r in runs]
        groups.append(_Group(m, [_Col("final", finals), _Col("best", bests)]))

    groups.append(
        _Group(
            "time/iteration",
            [
                _Col("algorithm", [format_seconds(median_per_iteration(r.data, "algorithm_time")) for r in runs]),
                _Col("evaluation", [format_seconds(median_per_iteration(r.data, "evaluation_time")) for r in runs]),
            ],
        )
    )
    rounds = [format_number(final(r.data["comm_rounds"])) if "comm_rounds" in r.data else "-" for r in runs]
    nbytes = [
        format_bytes(final(r.data["comm_bytes"])) if "comm_bytes" in r.data and len(r.data["comm_bytes"]) else "-"
        for r in runs
    ]
    groups.append(_Group("communication", [_Col("rounds", rounds), _Col("bytes", nbytes)]))

    lines: list[str] = []
    for i, block in enumerate(_blocks(key, groups, width)):
        if i:
            lines.append("")
        lines.extend(_render(block, len(runs)))
    problems = sorted({r.problem for r in runs})
    footer = (
        f"{len(runs)} run(s) of {', '.join(problems)}; best = max over iterations where the problem declares "
        "higher is better, else min; time/iteration = median over iterations 1..K (algorithm on rank 0); "
        "communication = final totals, bytes per rank."
    )
    lines += ["", *textwrap.wrap(footer, width, break_on_hyphens=False)]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Checkpoint table


def checkpoint_table(
    paths, metric: str, at: Sequence[int], group_by: str | Sequence[str] | None = None, smooth: int = 1
) -> str:
    """A Markdown table of ``metric`` (optionally a trailing running mean) at the iterations ``at``:
    one row per group (mean +- sd over its runs, e.g. seeds) or per run, with the run count and
    the median wall time per iteration."""
    runs = read_runs(paths)
    check_columns(runs, [metric], "metric")
    fields, groups = group_runs(runs, group_by)
    groups = groups or [(r.name, [r]) for r in runs]
    head = ["|".join(["", ", ".join(fields) or "run", "runs"] + [f" {k} " for k in at] + [" s/iteration", ""])]
    head.append("|".join([""] + ["---"] * (len(at) + 3) + [""]))
    rows = []
    smoothed = {id(r): (np.asarray(r.data["iteration"]), running_mean(r.data[metric], smooth)) for r in runs}
    for label, members in groups:
        cells = []
        for k in at:
            values = np.asarray(
                [y[it == k][0] for it, y in (smoothed[id(r)] for r in members) if (it == k).any()], dtype=float
            )
            if not values.size:
                cells.append(" - ")
            elif values.size == 1:
                cells.append(f" {format_number(values[0])} ")
            else:
                cells.append(f" {format_number(values.mean())} ± {format_number(values.std(ddof=1))} ")
        per_it = [
            float(np.nanmedian(np.diff(np.asarray(r.data["wall_time"], dtype=float))))
            for r in members
            if "wall_time" in r.data and len(r.data["wall_time"]) > 1
        ]
        seconds = format_seconds(np.median(per_it)) if per_it else "-"
        rows.append("|".join(["", f" {label} ", f" {len(members)} "] + cells + [f" {seconds} ", ""]))
    return "\n".join(head + rows)
