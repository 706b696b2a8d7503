"""The benchmark table (docs/benchmarks.md): algorithms side by side on the field's tasks, in communication
rounds and bytes, over seeds.

A *benchmark file* (TOML, e.g. ``jobs/benchmarks/table.toml``) lists the tasks; each names the folder of
its run files (one sweep per task), the metric, the target and the budget of rounds::

    [[task]]
    name = "quadratic"                       # the row label of the task
    runs = "runs/benchmarks/quadratic"       # its run files (a folder, relative to the benchmark file's folder
                                             # unless absolute)
    metric = "x_error"                       # a recorded column; its direction is what the run files declare
    target = 1e-6                            # "reached" = first iteration at or beyond it
    budget_rounds = 300                      # the value at the last iteration within this many rounds

For every task the runs are grouped by ``algorithm.name`` and by every other config field (seeds
aside) that differs between the runs of one algorithm (a tuning grid shows one row per setting).
Each row gives mean ± sd over its runs (seeds) of: the rounds and bytes at which the metric first
reaches the target (over the runs that reach it, with their count), and the metric at the budget
(the last iteration within it; a run that stopped short of the budget, e.g. diverged, has none: the cell
counts the runs that have one, '-' if none);
and the configs of the row written as JSON files beside the table, so each cell links the config
that produced it (``fednest-mpi run CONFIG.json --set seed=S``).
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fednest_mpi.errors import UsageError
from fednest_mpi.post.load import Run, check_columns, read_runs
from fednest_mpi.post.stats import higher_is_better
from fednest_mpi.post.tables import format_mean_sd, format_number
from fednest_mpi.text import format_bytes

__all__ = ["BenchmarkTask", "TaskRow", "benchmark_table", "read_benchmark_file", "task_rows"]

#: what may differ between the runs (seeds) of one row
SEED_FIELDS = ("seed", "run.output", "run.checkpoint_dir", "run.overwrite", "mpi_size")


@dataclass(frozen=True)
class BenchmarkTask:
    """One task of a benchmark file."""

    name: str
    runs: Path
    metric: str
    target: float
    budget_rounds: int


def read_benchmark_file(path: str | Path) -> list[BenchmarkTask]:
    """The tasks of a benchmark file, checked (:class:`UsageError` naming the field and the fix)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"--benchmark: {str(p)!r} does not exist; pass a benchmark file such as jobs/benchmarks/table.toml"
        ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"--benchmark: {str(p)!r} is not a readable TOML file ({exc})") from None
    tasks = data.get("task")
    if not isinstance(tasks, list) or not tasks:
        raise UsageError(f"{p}: no [[task]] tables; each task needs name, runs, metric, target, budget_rounds")
    out = []
    kinds: dict[str, type | tuple[type, ...]] = {
        "name": str,
        "runs": str,
        "metric": str,
        "target": (int, float),
        "budget_rounds": int,
    }
    for i, task in enumerate(tasks):
        for key, kind in kinds.items():
            value = task.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise UsageError(
                    f"{p}: task {i + 1}: {key}: expected a {getattr(kind, '__name__', 'number')}, got {value!r}"
                )
        unknown = sorted(set(task) - set(kinds))
        if unknown:
            raise UsageError(
                f"{p}: task {task['name']!r}: unknown field(s) {', '.join(unknown)}; known: {', '.join(kinds)}"
            )
        runs = Path(task["runs"])
        out.append(
            BenchmarkTask(
                task["name"],
                runs if runs.is_absolute() else p.parent / runs,
                task["metric"],
                float(task["target"]),
                task["budget_rounds"],
            )
        )
    return out


@dataclass
class TaskRow:
    """One row of a task: an algorithm (and setting) with its runs and their numbers."""

    algorithm: str
    setting: dict  # the fields that set this row apart from the algorithm's other rows
    runs: list[Run]
    rounds_to_target: list[float]  # per run; NaN where the target is not reached
    bytes_to_target: list[float]
    value_at_budget: list[float]


def _reached(values: np.ndarray, target: float, up: bool) -> np.ndarray:
    return values >= target if up else values <= target


def _numbers(run: Run, task: BenchmarkTask) -> tuple[float, float, float]:
    values = np.asarray(run.data[task.metric], dtype=float)
    rounds = np.asarray(run.data["comm_rounds"], dtype=float)
    nbytes = np.asarray(run.data["comm_bytes"], dtype=float)
    up = higher_is_better(task.metric, run.higher_is_better(task.metric))
    hit = np.flatnonzero(_reached(values, task.target, up) & np.isfinite(values))
    first = int(hit[0]) if hit.size else None
    within = np.flatnonzero(rounds <= task.budget_rounds)
    at_budget = float(values[within[-1]]) if within.size and rounds[-1] >= task.budget_rounds else math.nan
    return (
        float(rounds[first]) if first is not None else math.nan,
        float(nbytes[first]) if first is not None else math.nan,
        at_budget,
    )


def task_rows(task: BenchmarkTask) -> list[TaskRow]:
    """The rows of one task, in the order of algorithm name then setting."""
    if not task.runs.exists():
        raise UsageError(
            f"task {task.name!r}: runs: {str(task.runs)!r} does not exist; run the task's sweep "
            "first (docs/benchmarks.md)"
        )
    runs = read_runs(task.runs)
    check_columns(runs, [task.metric, "comm_rounds", "comm_bytes"], "metric")
    by_algorithm: dict[str, list[Run]] = {}
    for run in runs:
        by_algorithm.setdefault(str(run.config.get("algorithm.name")), []).append(run)
    rows = []
    for algorithm in sorted(by_algorithm):
        members = by_algorithm[algorithm]
        varying = sorted(
            key
            for key in set().union(*(r.config for r in members))
            if key not in SEED_FIELDS
            and len({json.dumps(r.config.get(key), sort_keys=True, default=str) for r in members}) > 1
        )
        settings: dict[str, list[Run]] = {}
        for run in members:
            settings.setdefault(json.dumps([run.config.get(k) for k in varying], default=str), []).append(run)
        for key in sorted(settings):
            group = sorted(settings[key], key=lambda r: r.config.get("seed", 0))
            numbers = [_numbers(r, task) for r in group]
            rows.append(
                TaskRow(
                    algorithm,
                    {k: group[0].config.get(k) for k in varying},
                    group,
                    [n[0] for n in numbers],
                    [n[1] for n in numbers],
                    [n[2] for n in numbers],
                )
            )
    return rows


def _reach(values: Sequence[float], fmt=format_number) -> str:
    n_hit = sum(math.isfinite(x) for x in values)
    if not n_hit:
        return f"not reached (0/{len(values)})"
    return f"{format_mean_sd(values, fmt)} ({n_hit}/{len(values)})"


def _at_budget(values: Sequence[float]) -> str:
    """mean ± sd at the budget, with the count of the runs that ran it when some stopped short (diverged)."""
    n_ran = sum(math.isfinite(x) for x in values)
    cell = format_mean_sd(values)
    return cell if n_ran in (0, len(values)) else f"{cell} ({n_ran}/{len(values)})"


def _config_file(row: TaskRow, task: BenchmarkTask, folder: Path) -> Path:
    """The config of the row's first run (seed 0's, say), as JSON: ``--set seed=S`` gives the others."""
    stem = "_".join([task.name, row.algorithm, *(f"{k.rsplit('.', 1)[-1]}-{v}" for k, v in row.setting.items())])
    path = folder / f"{stem.replace('/', '-').replace(' ', '')}.json"
    cfg = json.loads(json.dumps(row.runs[0].attrs.get("config", {})))
    cfg.get("run", {}).pop("output", None)
    cfg.get("run", {}).pop("checkpoint_dir", None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def chosen_rows(rows: Sequence[TaskRow], task: BenchmarkTask) -> set[int]:
    """The index of each algorithm's chosen row (the rule of docs/benchmarks.md): the best mean metric at the
    budget (max where the runs declare higher is better, else min); ties, then rows without a value at the
    budget, by the fewest mean rounds to the target."""
    chosen: dict[str, tuple[tuple[float, float], int]] = {}
    for i, row in enumerate(rows):
        at = np.asarray(row.value_at_budget, dtype=float)
        up = higher_is_better(task.metric, row.runs[0].higher_is_better(task.metric))
        value = float(np.mean(at)) if at.size and np.isfinite(at).all() else math.inf
        rounds = np.asarray(row.rounds_to_target, dtype=float)
        key = (
            -value if up and math.isfinite(value) else value,
            float(np.mean(rounds)) if np.isfinite(rounds).all() else math.inf,
        )
        if row.algorithm not in chosen or key < chosen[row.algorithm][0]:
            chosen[row.algorithm] = (key, i)
    return {i for _, i in chosen.values()}


def benchmark_table(
    path: str | Path, configs_dir: str | Path | None = None, link_base: str | Path | None = None
) -> str:
    """The Markdown table of the benchmark file ``path``: one section per task, one row per algorithm
    (and setting). With ``configs_dir``, each row's config is written there as JSON and linked (relative
    to ``link_base``, the folder of the Markdown file that will hold the table)."""
    tasks = read_benchmark_file(path)
    lines: list[str] = []
    folder = Path(configs_dir) if configs_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        rows = task_rows(task)
        seeds = sorted({int(r.config.get("seed", 0)) for row in rows for r in row.runs})
        lines += [
            f"### {task.name}",
            "",
            f"{task.metric}: target {format_number(task.target)}, budget {task.budget_rounds} rounds; "
            f"mean ± sd over seeds {', '.join(map(str, seeds))} (runs in `{os.path.relpath(task.runs)}`); "
            "(chosen): each algorithm's setting by the rule of docs/benchmarks.md.",
            "",
            "| algorithm | setting | runs | rounds to target | bytes to target (per rank) "
            f"| {task.metric} at {task.budget_rounds} rounds | config |",
            "|---|---|---|---|---|---|---|",
        ]
        chosen = chosen_rows(rows, task)
        for i, row in enumerate(rows):
            setting = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in row.setting.items()) or "-"
            if i in chosen and len(row.setting):
                setting = f"**{setting}** (chosen)"
            link = "-"
            if folder is not None:
                cfg = _config_file(row, task, folder)
                rel = cfg.relative_to(link_base) if link_base is not None else cfg
                link = f"[json]({rel.as_posix()})"
            lines.append(
                f"| {row.algorithm} | {setting} | {len(row.runs)} | {_reach(row.rounds_to_target)} "
                f"| {_reach(row.bytes_to_target, format_bytes)} | {_at_budget(row.value_at_budget)} | {link} |"
            )
        lines.append("")
    return "\n".join(lines)
