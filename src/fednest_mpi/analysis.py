"""Analysis of run files: tables, sweeps, text reports and plots.

Everything here reads run files through :func:`fednest_mpi.io.h5.read_run` and
:mod:`fednest_mpi.io.clients` (the only HDF5 code is in :mod:`fednest_mpi.io`) and is a pure
function of the files it is given. pandas and
matplotlib are imported inside the functions that need them, so importing this module is cheap.

* :func:`load_run`           -- one run as a DataFrame (one row per iteration, ``df.attrs`` = file attributes).
* :func:`load_clients`, :func:`load_ranks` -- its per-client series and per-rank phase times, long format.
* :func:`load_sweep`         -- several runs stacked, with a ``run`` column and one column per
  config field that differs between the runs (dotted names, e.g. ``algorithm.name``).
* :func:`config_differences` -- those differing fields and their value in every run.
* :func:`report`             -- a plain-text table of final/best metrics, time and communication per run.
* :func:`plot`               -- metric(s) against iteration, communication rounds or wall time; runs
  overlaid, or grouped by a config field with a mean +- sd band over the runs of each group.

A user's mistake (missing file, unknown metric, unknown config field, ...) raises
:class:`~fednest_mpi.errors.UsageError` with a message that names the fix.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from fednest_mpi.errors import UsageError

__all__ = [
    "DEFAULT_METRICS",
    "IGNORED_FIELDS",
    "X_AXES",
    "GroupStats",
    "config_differences",
    "flatten_config",
    "format_bytes",
    "format_number",
    "format_seconds",
    "group_mean_sd",
    "higher_is_better",
    "load_clients",
    "load_ranks",
    "load_run",
    "load_sweep",
    "plot",
    "report",
    "run_names",
]

logger = logging.getLogger(__name__)

#: Metrics shown by :func:`report` by default, those of them that a run has.
DEFAULT_METRICS = ("x_error", "outer_objective", "hypergradient_norm", "test_accuracy", "test_loss")

#: Config fields that do not change the numbers a run produces; never reported as differences.
IGNORED_FIELDS = frozenset({"run.output", "run.overwrite", "run.progress", "run.log_every", "run.client_series", "run.snapshot_every"})

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


# ----------------------------------------------------------------------------------------------
# Reading


@dataclass
class _Run:
    path: Path
    name: str
    attrs: dict
    config: dict  # flattened
    data: dict  # column -> numpy array

    @property
    def problem(self) -> str:
        return str(self.attrs.get("problem", self.config.get("problem.name", "?")))


def _as_paths(paths) -> list[Path]:
    """Normalise ``paths`` (one path, or an iterable of paths; a directory stands for its ``*.h5``)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(p.glob("*.h5"))
            if not found:
                raise UsageError(f"directory {str(p)!r} holds no *.h5 run files; pass run files written by `fednest-mpi run`")
            out.extend(found)
        else:
            out.append(p)
    if not out:
        raise UsageError("no run files given; pass one or more .h5 files written by `fednest-mpi run`")
    return out


def run_names(paths) -> list[str]:
    """Short, unique display names of run files: the file stem, with parent folders added where stems collide."""
    paths = [Path(p) for p in paths]
    parts = [p.with_suffix("").parts if p.suffix == ".h5" else p.parts for p in paths]
    depth = [1] * len(paths)
    while True:
        names = ["/".join(pp[-d:]) for pp, d in zip(parts, depth)]
        clash = [i for i, n in enumerate(names) if names.count(n) > 1 and depth[i] < len(parts[i])]
        if not clash:
            return names
        for i in clash:
            depth[i] += 1


def _read_runs(paths) -> list[_Run]:
    from fednest_mpi.io.h5 import read_run

    paths = _as_paths(paths)
    runs = []
    for path, name in zip(paths, run_names(paths)):
        attrs, data = read_run(path)
        flat = flatten_config(attrs.get("config", {}))
        if "mpi_size" in attrs:  # not a config field, but it matters for timings: treated as one
            flat.setdefault("mpi_size", int(attrs["mpi_size"]))
        runs.append(_Run(path=path, name=name, attrs=attrs, config=flat, data=data))
    return runs


def flatten_config(config: dict, prefix: str = "") -> dict[str, object]:
    """Nested config dict -> ``{"algorithm.outer_lr": 0.2, ..., "seed": 0}`` (lists become tuples, so values are hashable)."""
    flat: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_config(value, name + "."))
        elif isinstance(value, list):
            flat[name] = tuple(value)
        else:
            flat[name] = value
    return flat


def _frame(data: dict):
    import pandas as pd

    order = (["iteration"] if "iteration" in data else []) + [c for c in data if c != "iteration"]
    return pd.DataFrame({c: data[c] for c in order})


def load_run(path) -> "pandas.DataFrame":  # noqa: F821
    """One run file as a DataFrame: one row per recorded iteration, one column per recorded value.

    ``df.attrs`` holds the file attributes (``seed``, ``problem``, ``mpi_size``, ...) and, under
    ``"config"``, the run's config as a nested dict.
    """
    if isinstance(path, (list, tuple)):
        raise UsageError("load_run reads one run file; use load_sweep for several")
    (run,) = _read_runs([path])
    df = _frame(run.data)
    df.attrs = dict(run.attrs)
    return df


def _long_frame(arrays: dict[str, np.ndarray], row_name: str, keep=None):
    """{series: (rows, iterations)} -> one DataFrame row per (row, iteration), rows where ``keep`` (same shape) holds."""
    import pandas as pd

    first = next(iter(arrays.values()))
    rows, its = np.indices(first.shape)
    mask = np.ones(first.shape, dtype=bool) if keep is None else keep
    return pd.DataFrame({row_name: rows[mask], "iteration": its[mask], **{k: v[mask] for k, v in arrays.items()}})


def load_clients(path, participants_only: bool = True) -> "pandas.DataFrame":  # noqa: F821
    """The per-client series of one run file, long format: columns ``client``, ``iteration``,
    ``participation`` (role bitmask: 1 FedInn, 2 FedIHGP, 4 FedOut), ``inner_loss``, ``outer_loss``,
    ``inner_gradient_norm``, ``local_hypergradient_norm``; one row per client and iteration in
    which it took part (``participants_only``), or per client and iteration. The arrays
    (clients x iterations) are :func:`fednest_mpi.io.clients.read_clients`."""
    from fednest_mpi.io.clients import read_clients

    data = read_clients(path)
    return _long_frame(data, "client", data["participation"] > 0 if participants_only else None)


def load_ranks(path) -> "pandas.DataFrame":  # noqa: F821
    """Per-rank phase times of one run file, long format: columns ``rank``, ``iteration``,
    ``compute_seconds``, ``wait_seconds``, ``transfer_seconds`` (:func:`fednest_mpi.io.clients.read_ranks`)."""
    from fednest_mpi.io.clients import read_ranks

    return _long_frame(read_ranks(path), "rank")


def _differences(runs: Sequence[_Run], ignore=IGNORED_FIELDS) -> dict[str, list]:
    keys: list[str] = []
    for run in runs:
        keys.extend(k for k in run.config if k not in keys)
    diffs = {}
    for key in sorted(keys):
        if key in ignore:
            continue
        values = [run.config.get(key) for run in runs]
        encoded = {json.dumps(v, sort_keys=True, default=str) for v in values}
        if len(encoded) > 1:
            diffs[key] = values
    return diffs


def config_differences(paths, ignore: Iterable[str] = IGNORED_FIELDS) -> dict[str, list]:
    """``{dotted field: [value in each run]}`` for every config field whose value is not the same in all runs.

    A field missing from some runs (runs of different problems) counts as differing, with value
    None there. The number of MPI ranks (file attribute ``mpi_size``) is treated as a field. Fields in ``ignore`` (by default those that do not change the results, such as
    ``run.output``) are left out.
    """
    return _differences(_read_runs(paths), frozenset(ignore))


def load_sweep(paths, ignore: Iterable[str] = IGNORED_FIELDS) -> "pandas.DataFrame":  # noqa: F821
    """Several runs stacked into one DataFrame, ready for ``groupby``.

    Columns: ``run`` (the path, as given), one column per config field that differs between the
    runs (dotted names, see :func:`config_differences`), then the recorded columns. A column that
    only some runs record is NaN in the others. ``df.attrs["differences"]`` is the list of the
    config columns, ``df.attrs["runs"]`` the list of paths.
    """
    import pandas as pd

    runs = _read_runs(paths)
    diffs = _differences(runs, frozenset(ignore))
    frames = []
    for i, run in enumerate(runs):
        df = _frame(run.data)
        n = len(df)
        head = {"run": pd.Series([str(run.path)] * n, index=df.index, dtype=object)}
        for key, values in diffs.items():
            col = key if key not in df.columns else f"config.{key}"
            head[col] = pd.Series([values[i]] * n, index=df.index, dtype=object)
        frames.append(pd.concat([pd.DataFrame(head), df], axis=1))
    out = pd.concat(frames, ignore_index=True)
    # numeric config fields (learning rates, seeds) as numbers, so they sort and aggregate as such
    for key in diffs:
        col = key if key in out.columns else f"config.{key}"
        values = [v for v in diffs[key] if v is not None]
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[col] = pd.to_numeric(out[col])
    out.attrs = {"runs": [str(r.path) for r in runs], "differences": list(diffs)}
    return out


# ----------------------------------------------------------------------------------------------
# Metric selection and validation


def higher_is_better(metric: str) -> bool:
    """True for accuracies (best = max); False for losses, errors, norms, objectives (best = min)."""
    return "acc" in metric.lower()


def _did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_columns(runs: Sequence[_Run], names: Sequence[str], what: str) -> None:
    """Every name must be a recorded column of every run; else a UsageError naming runs and alternatives."""
    common = set.intersection(*(set(r.data) for r in runs))
    everywhere = set.union(*(set(r.data) for r in runs))
    for name in names:
        if name in common:
            continue
        available = ", ".join(sorted(common - {"iteration"}))
        if name not in everywhere:
            raise UsageError(f"{what} {name!r} is not recorded in the run files{_did_you_mean(name, common)}; available: {available}")
        have = [r for r in runs if name in r.data]
        lack = [r for r in runs if name not in r.data]
        problems = sorted({r.problem for r in runs})
        mixed = f" (the runs mix problems {', '.join(map(repr, problems))})" if len(problems) > 1 else ""
        raise UsageError(
            f"{what} {name!r} is recorded by {', '.join(r.name + ' [' + r.problem + ']' for r in have)} but not by "
            f"{', '.join(r.name + ' [' + r.problem + ']' for r in lack)}{mixed}; pass only runs that record it, "
            f"or a {what} that all of them record: {available}"
        )


def _check_group_by(runs: Sequence[_Run], field: str) -> None:
    known = set().union(*(r.config for r in runs))
    if field not in known:
        raise UsageError(
            f"group_by {field!r} is not a config field of these runs{_did_you_mean(field, known)}; "
            f"use a dotted name such as 'algorithm.name' or 'seed'; fields that differ between them: "
            f"{', '.join(_differences(runs)) or 'none'}"
        )
    lack = [r.name for r in runs if field not in r.config]
    if lack:
        raise UsageError(f"group_by {field!r} is not a config field of {', '.join(lack)}; pass only runs that have it")


# ----------------------------------------------------------------------------------------------
# Text report


def format_number(value) -> str:
    """A metric value as shown in reports: 4 significant digits, '-' for missing/NaN."""
    if value is None:
        return "-"
    value = float(value)
    if math.isnan(value):
        return "-"
    return f"{value:.4g}"


def format_bytes(n) -> str:
    """Decimal byte count: '0 B', '950 B', '44.8 kB', '1.2 MB', '3.4 GB'."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 999.5 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000.0
    raise AssertionError  # unreachable


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


def _format_config_value(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _finite(a) -> np.ndarray:
    a = np.asarray(a, dtype=float)
    return a[np.isfinite(a)]


def _final(a):
    a = np.asarray(a, dtype=float)
    return float(a[-1]) if a.size else math.nan


def _best(a, metric: str):
    f = _finite(a)
    if not f.size:
        return math.nan
    return float(f.max() if higher_is_better(metric) else f.min())


def _median_per_iteration(run: _Run, column: str):
    """Median of a per-iteration time over iterations 1..K (iteration 0 is the initial point, no step)."""
    if column not in run.data:
        return math.nan
    values = np.asarray(run.data[column], dtype=float)
    it = np.asarray(run.data.get("iteration", np.arange(values.size)))
    f = _finite(values[it >= 1])
    return float(np.median(f)) if f.size else math.nan


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
    mid = "  ".join("  ".join((c.title.rjust(w) if c.right else c.title.ljust(w)) for c, w in zip(g.cols, ws))
                    for g, ws in zip(groups, widths))
    lines = [top.rstrip()] if top.strip() else []
    lines += [mid.rstrip(), "-" * len(mid)]
    for i in range(n_rows):
        row = "  ".join("  ".join((c.cells[i].rjust(w) if c.right else c.cells[i].ljust(w)) for c, w in zip(g.cols, ws))
                        for g, ws in zip(groups, widths))
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
    runs = _read_runs(paths)
    if isinstance(metrics, str):
        metrics = [metrics]
    if metrics is None:
        metrics = [m for m in DEFAULT_METRICS if any(m in r.data for r in runs)]
    else:
        metrics = list(metrics)
        if not metrics:
            raise UsageError("report: metrics is empty; name at least one recorded column, or leave it unset for the defaults")
        _check_columns(runs, metrics, "metric")
    diffs = _differences(runs)

    key = _Group("", [_Col("run", [r.name for r in runs], right=False)])
    groups: list[_Group] = []
    for field, values in diffs.items():
        section, _, name = field.rpartition(".")
        cells = [_format_config_value(v) for v in values]
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
        final = [format_number(_final(r.data[m])) if m in r.data else "-" for r in runs]
        best = [format_number(_best(r.data[m], m)) if m in r.data else "-" for r in runs]
        groups.append(_Group(m, [_Col("final", final), _Col("best", best)]))

    groups.append(_Group("time/iteration", [
        _Col("algorithm", [format_seconds(_median_per_iteration(r, "algorithm_time")) for r in runs]),
        _Col("evaluation", [format_seconds(_median_per_iteration(r, "evaluation_time")) for r in runs]),
    ]))
    rounds = [format_number(_final(r.data["comm_rounds"])) if "comm_rounds" in r.data else "-" for r in runs]
    nbytes = [format_bytes(_final(r.data["comm_bytes"])) if "comm_bytes" in r.data and len(r.data["comm_bytes"]) else "-"
              for r in runs]
    groups.append(_Group("communication", [_Col("rounds", rounds), _Col("bytes", nbytes)]))

    lines: list[str] = []
    for i, block in enumerate(_blocks(key, groups, width)):
        if i:
            lines.append("")
        lines.extend(_render(block, len(runs)))
    problems = sorted({r.problem for r in runs})
    lines += [
        "",
        f"{len(runs)} run(s) of {', '.join(problems)}; best = min over iterations (max for accuracies); time/iteration =",
        "median over iterations 1..K (algorithm on rank 0); communication = final totals, bytes per rank.",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Grouping and plots


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
    stopped early, e.g. diverged, counts up to its last iteration; ``n`` says how many). Otherwise (``wall_time``, random round
    counts) every run is linearly interpolated onto the union of the x values inside the range
    that all runs cover. NaN values are left out of the statistics (``n`` counts the runs used).
    """
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
    longest = max(xs, key=lambda x: x.size)
    if all(np.array_equal(x, longest[:x.size]) for x in xs):
        # shared x values; a shorter run (stopped, diverged) leaves the statistics where it ends
        grid = longest
        Y = np.full((len(ys), grid.size), np.nan)
        for row, y in zip(Y, ys):
            row[:y.size] = y
    else:
        for i, x in enumerate(xs):
            if np.any(np.diff(x) < 0):
                raise UsageError(f"x_axis {x_axis!r} decreases within run {i}; use a monotone column (iteration, comm_rounds, wall_time)")
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
        Y = np.vstack(rows)
    n = np.isfinite(Y).sum(axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)  # all-NaN columns -> NaN
        mean = np.nanmean(Y, axis=0)
        sd = np.nanstd(Y, axis=0, ddof=1)
    sd = np.where(n >= 2, sd, np.nan)
    return GroupStats(x=grid, mean=mean, sd=sd, n=n)


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


def _group_fields(group_by) -> list[str]:
    if group_by is None:
        return []
    return [group_by] if isinstance(group_by, str) else list(group_by)


def _groups(runs: Sequence[_Run], fields: Sequence[str]) -> list[tuple[str, list[_Run]]]:
    """Runs with equal values of ``fields``: [(label, runs)], sorted by the values."""
    if not fields:
        return []
    by_value: dict[str, tuple[tuple, list[_Run]]] = {}
    for r in runs:
        values = tuple(r.config[f] for f in fields)
        by_value.setdefault(json.dumps(values, sort_keys=True, default=str), (values, []))[1].append(r)
    groups = list(by_value.values())
    try:
        groups.sort(key=lambda g: g[0])
    except TypeError:  # values of mixed types: order of first appearance
        pass
    for values, members in groups:
        mixed = [k for k in _differences(members) if k not in fields and k != "seed"]
        if mixed:
            logger.warning("group %s averages runs that also differ in %s, not only in seed",
                           ", ".join(f"{f}={_format_config_value(v)}" for f, v in zip(fields, values)), ", ".join(mixed))
    return [(", ".join(_format_config_value(v) for v in values), members) for values, members in groups]


def checkpoint_table(paths, metric: str, at: Sequence[int], group_by: str | Sequence[str] | None = None,
                     smooth: int = 1) -> str:
    """A Markdown table of ``metric`` (optionally a trailing running mean) at the iterations ``at``:
    one row per group (mean +- sd over its runs, e.g. seeds) or per run, with the run count and
    the median wall time per iteration."""
    runs = _read_runs(paths)
    _check_columns(runs, [metric], "metric")
    fields = _group_fields(group_by)
    for f in fields:
        _check_group_by(runs, f)
    groups = _groups(runs, fields) or [(r.name, [r]) for r in runs]
    head = ["|".join(["", ", ".join(fields) or "run", "runs"] + [f" {k} " for k in at] + [" s/iteration", ""])]
    head.append("|".join([""] + ["---"] * (len(at) + 3) + [""]))
    rows = []
    smoothed = {id(r): (np.asarray(r.data["iteration"]), running_mean(r.data[metric], smooth)) for r in runs}
    for label, members in groups:
        cells = []
        for k in at:
            values = np.asarray([y[it == k][0] for it, y in (smoothed[id(r)] for r in members) if (it == k).any()], dtype=float)
            if not values.size:
                cells.append(" - ")
            elif values.size == 1:
                cells.append(f" {format_number(values[0])} ")
            else:
                cells.append(f" {format_number(values.mean())} ± {format_number(values.std(ddof=1))} ")
        per_it = [float(np.nanmedian(np.diff(np.asarray(r.data["wall_time"], dtype=float)))) for r in members
                  if "wall_time" in r.data and len(r.data["wall_time"]) > 1]
        rows.append("|".join(["", f" {label} ", f" {len(members)} "] + cells + [f" {format_seconds(np.median(per_it)) if per_it else '-'} ", ""]))
    return "\n".join(head + rows)


def _auto_log(metric: str, arrays: list[np.ndarray]) -> bool:
    """Log scale for errors/norms (non-negative by nature) whose positive values span more than 2 decades."""
    name = metric.lower()
    if not any(word in name for word in ("error", "norm", "gap", "residual")):
        return False
    values = np.concatenate([_finite(a) for a in arrays]) if arrays else np.empty(0)
    if values.size == 0 or values.min() <= 0:
        return False
    return values.max() / values.min() > 100.0


def plot(paths, out, metric: str | Sequence[str] = "x_error", x_axis: str = "iteration",
         group_by: str | Sequence[str] | None = None, logy: bool | None = None, smooth: int = 1) -> Path:
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

    runs = _read_runs(paths)
    metrics = [metric] if isinstance(metric, str) else list(metric)
    if not metrics:
        raise UsageError("plot: no metric given; name at least one recorded column, e.g. x_error")
    out = Path(out)
    if out.suffix.lower() not in _PLOT_SUFFIXES:
        raise UsageError(f"plot output {str(out)!r}: use a file name ending in {', '.join(_PLOT_SUFFIXES)}")
    _check_columns(runs, [x_axis], "x_axis")
    _check_columns(runs, metrics, "metric")
    fields = _group_fields(group_by)
    for f in fields:
        _check_group_by(runs, f)
    groups = _groups(runs, fields)

    ncols = min(len(metrics), 2)
    nrows = math.ceil(len(metrics) / ncols)
    fig = Figure(figsize=(6.4 * ncols, 4.4 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(metrics):]:
        ax.set_visible(False)

    colors = [f"C{i % 10}" for i in range(max(len(groups) if fields else len(runs), 1))]
    for ax, m in zip(axes, metrics):
        arrays = [running_mean(r.data[m], smooth) for r in runs]
        series = {id(r): {x_axis: r.data[x_axis], m: a} for r, a in zip(runs, arrays)}
        if not any(_finite(a).size for a in arrays):
            raise UsageError(f"metric {m!r} has no finite value in any of the runs (NaN throughout); choose another metric")
        empty = [r.name for r, a in zip(runs, arrays) if not _finite(a).size]
        if empty:
            logger.warning("metric %s has no finite value in %s; not drawn", m, ", ".join(empty))
        use_log = _auto_log(m, arrays) if logy is None else bool(logy)
        floor = min((_finite(a)[_finite(a) > 0].min() for a in arrays if (_finite(a) > 0).any()), default=None)
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
        ax.legend(title=", ".join(fields) or None, fontsize="small", title_fontsize="small",
                  ncols=1 if n_entries <= 8 else 2)

    problems = ", ".join(sorted({r.problem for r in runs}))
    how = (f"mean \u00b1 sd over the runs of each {', '.join(fields)} value" if fields else f"{len(runs)} run{'s' if len(runs) > 1 else ''}")
    if smooth > 1:
        how += f", {smooth}-iteration running mean"
    fig.suptitle(textwrap.fill(f"{problems}: {how}", 60 * ncols), fontsize="medium")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out
