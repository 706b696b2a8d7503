"""Post-processing of run files: DataFrames, sweeps, text reports, tables and plots.

This package reads the files that a run wrote and is a pure function of them. It is separate from
the run path: it imports nothing of the simulation (runner, federation, algorithms, problems,
torch, MPI), and nothing on the run path imports it; importing it loads neither pandas nor
matplotlib (each function imports what it needs), so ``import fednest_mpi.post`` is cheap.

* :mod:`.load`     -- reading: :func:`load_run` (one run as a DataFrame, one row per iteration,
  ``df.attrs`` = file attributes), :func:`load_clients` and :func:`load_ranks` (per-client series
  and per-rank phase times, long format), :func:`load_sweep` (several runs stacked, with a ``run``
  column and one column per config field that differs between them, dotted names such as
  ``algorithm.name``), :func:`config_differences` (those fields and their value in every run).
* :mod:`.tables`   -- :func:`report` (plain-text table of final/best metrics, time and communication
  per run), :func:`checkpoint_table` (Markdown: a metric at chosen iterations, mean +- sd per group)
  and the ``format_*`` helpers.
* :mod:`.stats`    -- :func:`group_mean_sd` (mean +- sd over runs on a common x grid),
  :func:`running_mean`, :func:`higher_is_better`.
* :mod:`.benchmark` -- :func:`benchmark_table` (docs/benchmarks.md: per task and algorithm, rounds and bytes to a
  target and the metric at a budget of rounds, mean +- sd over seeds, each row's config written beside it).
* :mod:`.plotting` -- :func:`plot`: metric(s) against iteration, communication rounds or wall time;
  runs overlaid, or grouped by config fields with a mean +- sd band over the runs of each group.

A user's mistake (missing file, unknown metric, unknown config field, ...) raises
:class:`~fednest_mpi.errors.UsageError` with a message that names the fix.
"""

from fednest_mpi.post.benchmark import benchmark_table, read_benchmark_file
from fednest_mpi.post.load import (
    IGNORED_FIELDS,
    config_differences,
    flatten_config,
    load_clients,
    load_ranks,
    load_run,
    load_sweep,
    primary_metrics,
    run_names,
)
from fednest_mpi.post.plotting import X_AXES, plot
from fednest_mpi.post.stats import GroupStats, group_mean_sd, higher_is_better, running_mean
from fednest_mpi.post.tables import (
    DEFAULT_METRICS,
    checkpoint_table,
    format_bytes,
    format_number,
    format_seconds,
    report,
)

__all__ = [
    "DEFAULT_METRICS",
    "IGNORED_FIELDS",
    "X_AXES",
    "GroupStats",
    "benchmark_table",
    "checkpoint_table",
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
    "primary_metrics",
    "read_benchmark_file",
    "report",
    "run_names",
    "running_mean",
]
