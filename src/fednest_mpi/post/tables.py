"""Tables of runs: the plain-text :func:`report` (final/best metrics, time and communication per run)
and the Markdown :func:`checkpoint_table` (a metric at chosen iterations, mean +- sd per group),
with the number formats they use."""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fednest_mpi.errors import UsageError
from fednest_mpi.io.schema import DEFAULT_METRICS, METRICS, PRIMARY_METRIC
from fednest_mpi.post.load import (
    check_columns,
    common_primary_metrics,
    config_label,
    differences,
    group_runs,
    group_values,
    read_runs,
)
from fednest_mpi.post.stats import best, final, median_per_iteration, running_mean
from fednest_mpi.text import format_bytes

__all__ = [
    "DEFAULT_METRICS",
    "checkpoint_table",
    "format_bytes",
    "format_mean_sd",
    "format_number",
    "format_seconds",
    "report",
]


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


def _shown_differences(runs) -> tuple[dict[str, list], list[str]]:
    """The config fields that :func:`report` shows, and those it leaves out: a field that only some runs
    have (another algorithm's or problem's own field) is shown only where it takes more than one value
    among the runs that have it; else their ``algorithm.name`` / ``problem.name`` already tells the runs apart."""
    shown, hidden = {}, []
    for field, values in differences(runs).items():
        present = {json.dumps(v, sort_keys=True, default=str) for v in values if v is not None}
        if len(present) > 1 or len(present) == len(values):
            shown[field] = values
        else:
            hidden.append(field)
    return shown, hidden


def _config_groups(fields_values: dict[str, list]) -> list[_Group]:
    """One column per config field, under its section's title (``algorithm``: ``name``, ``outer_lr``)."""
    groups: list[_Group] = []
    for field, values in fields_values.items():
        section, _, name = field.rpartition(".")
        cells = [config_label(v) for v in values]
        right = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None)
        if groups and groups[-1].title == section and section:
            groups[-1].cols.append(_Col(name, cells, right))
        else:
            groups.append(_Group(section, [_Col(name, cells, right)]))
    return groups


def sample_sd(v: np.ndarray) -> float:
    """The sample standard deviation of the finite ``v`` (2 or more), without numpy's overflow warning where their
    squares overflow (a diverging run's 1e200): then computed on ``v`` scaled by its largest magnitude."""
    with np.errstate(over="ignore", invalid="ignore"):
        sd = float(v.std(ddof=1))
        if not math.isfinite(sd):
            scale = float(np.abs(v).max())
            sd = scale * float((v / scale).std(ddof=1))
    return sd


def format_mean_sd(values: Sequence[float], fmt=format_number) -> str:
    """The finite ``values`` as 'm' (one), 'm ± sd' (several; sample sd) or '-' (none), numbers in ``fmt``."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if not v.size:
        return "-"
    if v.size == 1:
        return fmt(v[0])
    return f"{fmt(v.mean())} ± {fmt(sample_sd(v))}"


def _iterations_done(r) -> tuple[int | None, object]:
    it = r.data.get("iteration")
    return (int(it[-1]) if it is not None and len(it) else None), r.config.get("algorithm.outer_iterations")


def _report_metrics(runs, metrics: Sequence[str] | str | None) -> list[str]:
    """The metrics :func:`report` shows: those named (recorded by every run), else the runs' primary metrics,
    then those their problems declare, then those of :data:`DEFAULT_METRICS`, each one that some run records."""
    if isinstance(metrics, str):
        metrics = [metrics]
    if metrics is None:
        primary = [r.attrs[PRIMARY_METRIC] for r in runs if PRIMARY_METRIC in r.attrs]
        declared = [m for r in runs for m in json.loads(r.attrs.get(METRICS, "[]"))]
        candidates = dict.fromkeys([*primary, *declared, *DEFAULT_METRICS])
        return [m for m in candidates if any(m in r.data for r in runs)]
    metrics = list(metrics)
    if not metrics:
        raise UsageError(
            "report: metrics is empty; name at least one recorded column, or leave it unset for the defaults"
        )
    check_columns(runs, metrics, "metric")
    return metrics


def _key_and_config(runs, diffs: dict[str, list], fields: list[str], grouped) -> tuple[_Group, list[_Group]]:
    """The columns that name a row (the run, or the group's values and its run count), and the differing config
    fields ``diffs`` shown beside them: per run, or per group those constant within every group."""
    if not fields:
        return _Group("", [_Col("run", [r.name for r in runs], right=False)]), _config_groups(diffs)
    rows = [members for _, members in grouped]
    key_fields = {f: [values[i] for values, _ in grouped] for i, f in enumerate(fields)}
    key = _Group("", [_Col(f, [config_label(v) for v in vs], right=False) for f, vs in key_fields.items()])
    key.cols.append(_Col("runs", [str(len(members)) for members in rows]))
    per_group = {
        f: [v[runs.index(m[0])] for m in rows]
        for f, v in diffs.items()
        if f not in fields and all(len({json.dumps(v[runs.index(r)], default=str) for r in m}) == 1 for m in rows)
    }
    return key, _config_groups(per_group)


def _iterations_cell(members) -> str:
    """Iterations done by a row's runs (a range where they differ), ``k/K`` when short of the planned ``K``."""
    done = sorted({d for d, _ in map(_iterations_done, members) if d is not None})
    planned = {str(k) for _, k in map(_iterations_done, members) if k is not None}
    text = "-" if not done else str(done[0]) if len(done) == 1 else f"{done[0]}-{done[-1]}"
    return text if len(planned) != 1 or text == next(iter(planned)) else f"{text}/{next(iter(planned))}"


def _metric_group(metric: str, rows, smooth: int) -> _Group:
    """The final and best values of ``metric`` (of its ``smooth``-iteration running mean), mean ± sd per row."""
    finals, bests = [], []
    for members in rows:
        have = [r for r in members if metric in r.data]
        series = [(r, running_mean(r.data[metric], smooth)) for r in have]
        if not have:
            finals.append("-")
            bests.append("-")
            continue
        finals.append(format_mean_sd([final(y) for _, y in series]))
        bests.append(format_mean_sd([best(y, metric, r.higher_is_better(metric)) for r, y in series]))
    return _Group(metric, [_Col("final", finals), _Col("best", bests)])


def _median_of(members, column: str) -> float:
    """The median over a row's runs of each one's median ``column`` per iteration (NaN: none has one)."""
    values = [median_per_iteration(r.data, column) for r in members]
    values = [v for v in values if math.isfinite(v)]
    return float(np.median(values)) if values else math.nan


def _final_of(members, column: str) -> float:
    """The mean over a row's runs of the final value of ``column`` (NaN: none records it)."""
    values = [final(r.data[column]) for r in members if column in r.data and len(r.data[column])]
    return float(np.mean(values)) if values else math.nan


def _cost_groups(rows) -> list[_Group]:
    """Time per iteration (median of algorithm and evaluation) and communication (final rounds and bytes)."""
    times = _Group(
        "time/iteration",
        [
            _Col("algorithm", [format_seconds(_median_of(members, "algorithm_time")) for members in rows]),
            _Col("evaluation", [format_seconds(_median_of(members, "evaluation_time")) for members in rows]),
        ],
    )
    rounds = [format_number(_final_of(members, "comm_rounds")) for members in rows]
    nbytes = [format_bytes(v) if math.isfinite(v := _final_of(members, "comm_bytes")) else "-" for members in rows]
    return [times, _Group("communication", [_Col("rounds", rounds), _Col("bytes", nbytes)])]


def _footer(runs, fields: list[str], n_rows: int, smooth: int, hidden: list[str]) -> str:
    """The report's closing sentences: what was run, how the columns are computed, what is not shown."""
    problems = sorted({r.problem for r in runs})
    footer = f"{len(runs)} run(s) of {', '.join(problems)}"
    if fields:
        footer += f" in {n_rows} group(s) of {', '.join(fields)}; metrics: mean ± sd over each group's runs"
    footer += (
        "; best = max over iterations where the problem declares higher is better, else min"
        + (f", of the {smooth}-iteration running mean" if smooth > 1 else "")
        + "; time/iteration = median over iterations 1..K (algorithm on rank 0); "
        "communication = final totals, bytes per rank" + (", mean over the group" if fields else "") + "."
    )
    stopped = [f"{r.name} (by {r.stopped_by})" for r in runs if r.stopped_by]
    if stopped:
        footer += (
            f" Stopped by a signal, to be continued with --resume (interrupted, not ended): {', '.join(stopped)}."
        )
    if hidden:
        footer += (
            f" Not shown: {len(hidden)} config field(s) that only some of the runs have, with one value among "
            "them (their algorithm.name / problem.name tells the runs apart)."
        )
    return footer


def report(
    paths,
    metrics: Sequence[str] | str | None = None,
    width: int = 100,
    group_by: str | Sequence[str] | None = None,
    smooth: int = 1,
) -> str:
    """A plain-text table, one line per run (in the order given), or with ``group_by`` one line per
    group of runs (the config fields' values; mean ± sd over the group's runs, e.g. seeds).

    Columns: run name (or the group's values and its run count); the config fields that differ between
    the runs (a field that only some runs have is shown where it takes several values among them);
    iterations done (``k/K`` when the run stopped before its ``outer_iterations``; one a signal stopped, to be
    continued with ``--resume``, is named in the footer); final and best value
    of each metric (best = max where the run file declares higher is better, else min), of its trailing
    ``smooth``-iteration running mean; median ``algorithm_time`` and ``evaluation_time`` per iteration;
    final ``comm_rounds`` and ``comm_bytes`` (per rank). Tables wider than ``width`` characters are
    split into blocks that each start with the run name (the group's values).

    ``metrics`` defaults to the runs' primary metrics, then every metric their problems declare (the
    ``metrics`` attribute), then those of :data:`DEFAULT_METRICS` that the runs record (a run lacking
    one shows '-'); metrics named explicitly must be recorded by every run.
    """
    runs = read_runs(paths)
    metrics = _report_metrics(runs, metrics)
    fields, grouped = group_values(runs, group_by)
    rows = [members for _, members in grouped] if fields else [[r] for r in runs]
    diffs, hidden = _shown_differences(runs)
    key, groups = _key_and_config(runs, diffs, fields, grouped)
    groups.append(_Group("", [_Col("iters", [_iterations_cell(members) for members in rows])]))
    groups += [_metric_group(m, rows, smooth) for m in metrics]
    groups += _cost_groups(rows)
    lines: list[str] = []
    for i, block in enumerate(_blocks(key, groups, width)):
        if i:
            lines.append("")
        lines.extend(_render(block, len(rows)))
    footer = _footer(runs, fields, len(rows), smooth, hidden)
    lines += ["", *textwrap.wrap(footer, width, break_on_hyphens=False)]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Checkpoint table


def checkpoint_table(
    paths, metric: str | None, at: Sequence[int], group_by: str | Sequence[str] | None = None, smooth: int = 1
) -> str:
    """A Markdown table of ``metric`` (None: the runs' primary metric; optionally a trailing running mean)
    at the iterations ``at``: one row per group (mean +- sd over its runs, e.g. seeds) or per run, with
    the run count and the median wall time per iteration. An iteration that some runs of a row do not reach
    shows what the others have, marked ``(2 of 3)``, so that a short run cannot drop out of a mean unseen ('-'
    where none of a row's runs does); one that no run reaches is a UsageError."""
    runs = read_runs(paths)
    if metric is None:
        metric = common_primary_metrics(runs)[0]
    check_columns(runs, [metric], "metric")
    last = max(int(np.max(r.data["iteration"])) if len(r.data["iteration"]) else 0 for r in runs)
    beyond = [k for k in at if k > last]
    if beyond and len(beyond) == len(at):
        which = "this iteration" if len(beyond) == 1 else "these iterations"
        raise UsageError(
            f"--at {', '.join(map(str, beyond))}: no run reaches {which}; the runs end by iteration {last}: "
            f"choose iterations up to {last}"
        )
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
            short = f" ({values.size} of {len(members)})" if 0 < values.size < len(members) else ""
            if not values.size:
                cells.append(" - ")
            elif values.size == 1:
                cells.append(f" {format_number(values[0])}{short} ")
            else:
                cells.append(f" {format_number(values.mean())} ± {format_number(sample_sd(values))}{short} ")
        per_it = [
            float(np.nanmedian(np.diff(np.asarray(r.data["wall_time"], dtype=float))))
            for r in members
            if "wall_time" in r.data and len(r.data["wall_time"]) > 1
        ]
        seconds = format_seconds(np.median(per_it)) if per_it else "-"
        rows.append("|".join(["", f" {label} ", f" {len(members)} "] + cells + [f" {seconds} ", ""]))
    return "\n".join(head + rows)
