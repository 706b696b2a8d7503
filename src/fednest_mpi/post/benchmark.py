"""The benchmark table (docs/benchmarks.md): algorithms side by side on the field's tasks, in communication
rounds and bytes, over seeds, each algorithm tuned by one protocol.

A *benchmark file* (TOML, e.g. ``jobs/benchmarks/table.toml``) lists the tasks; each names the folder of
its run files (one sweep per algorithm and task), the metric, the target and the budget of rounds::

    [[task]]
    name = "quadratic"                       # the row label of the task
    runs = "runs/benchmarks/quadratic"       # its run files (a folder, relative to the benchmark file's folder
                                             # unless absolute)
    metric = "x_error"                       # a recorded column; its direction is what the run files declare
    target = 1e-6                            # "reached" = first iteration at or beyond it
    budget_rounds = 300                      # the value at the last iteration within this many rounds
    tune_seeds = [100, 101, 102]             # (default) the seeds that choose each algorithm's setting
    report_seeds = [0, 1, 2]                 # (default) the seeds the table reports; none in tune_seeds
    tie_tolerance = 0.0                      # (default) metric values this close tie (besides relative 1e-9)

and, at the top of the file, optionally, the folder of the committed benchmark records (:mod:`.records`)::

    records = "../../docs/benchmarks/records"   # relative to the benchmark file's folder; task T's in records/T

For every task the runs are grouped by ``algorithm.name`` and by every other config field (seeds
aside) that differs between the runs of one algorithm (a tuning grid shows one row per setting).
Each row gives, on the tuning seeds and, separately, on the reported seeds, mean ± sd of: the rounds
and bytes at which the metric first reaches the target (over the runs that reach it, with their
count), and the metric at the budget (the last iteration within it; a run that stopped short of the
budget, e.g. diverged, has none: the cell counts the runs that have one, '-' if none); runs on
other seeds are not read. Each algorithm's setting is chosen on the tuning seeds only
(:func:`chosen_rows`, the rule of docs/benchmarks.md) and marked "edge of grid" where a tuned value
is the smallest or largest tried (:func:`grid_edges`). The configs of the rows are written as JSON
files beside the table, so each cell links the config that produced it (``fednest-mpi run
CONFIG.json --set seed=S``).

A run whose file is absent from the task's runs folder is read from the task's benchmark records, if the
benchmark file names a ``records`` folder (:func:`archive` writes them, :mod:`.records`): the table, and the
follow-up sweeps, come out the same from the records as from the run files.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fednest_mpi.bitwise import first_difference
from fednest_mpi.errors import UsageError
from fednest_mpi.numerics import cpu_class
from fednest_mpi.post import records as records_io
from fednest_mpi.post.load import IGNORED_FIELDS, Run, check_columns, read_runs
from fednest_mpi.post.stats import higher_is_better
from fednest_mpi.post.tables import format_mean_sd, format_number
from fednest_mpi.text import format_bytes

__all__ = [
    "Archived",
    "BenchmarkTask",
    "Numbers",
    "TaskRow",
    "archive",
    "benchmark_table",
    "chosen_rows",
    "follow_up_sweeps",
    "grid_edges",
    "has_runs",
    "read_benchmark_file",
    "cpu_class_of",
    "records_to_verify",
    "series_difference",
    "task_rows",
    "task_runs",
    "ties",
]

#: what may differ between the runs (seeds) of one row
SEED_FIELDS = ("seed", "run.output", "run.checkpoint_dir", "run.overwrite", "mpi_size")


#: the seeds that choose each algorithm's setting, and the seeds the table reports (docs/benchmarks.md)
TUNE_SEEDS = (100, 101, 102)
REPORT_SEEDS = (0, 1, 2)
#: two values tie when they differ by at most this fraction of the larger one (or the task's tie_tolerance)
TIE_RTOL = 1e-9
#: each algorithm's local step count (FedInn's tau, the single-round methods' tau, FedBiO's I): the protocol's third
#: kind of hyper-parameter, tuned by a line at the chosen step sizes (half and twice the count, at least 1)
LOCAL_STEP_FIELDS = ("algorithm.inner_local_steps", "algorithm.local_steps", "algorithm.sync_period")


@dataclass(frozen=True)
class BenchmarkTask:
    """One task of a benchmark file."""

    name: str
    runs: Path
    metric: str
    target: float
    budget_rounds: int
    tune_seeds: tuple[int, ...] = TUNE_SEEDS
    report_seeds: tuple[int, ...] = REPORT_SEEDS
    tie_tolerance: float = 0.0
    records: Path | None = None  # the folder of the task's benchmark records (None: the file names none)


def _seeds(where: str, key: str, value) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in value)
        or len(set(value)) != len(value)
    ):
        raise UsageError(f"{where}: {key}: expected a list of distinct integer seeds such as [0, 1, 2], got {value!r}")
    return tuple(value)


def _beside(path: Path, value: str) -> Path:
    """``value``, a path relative to the folder of the file ``path`` unless absolute."""
    return Path(value) if Path(value).is_absolute() else path.parent / value


def _records_folder(path: Path, data: dict, task: str) -> Path | None:
    """The folder of ``task``'s records in the benchmark file's ``records`` folder (None: it names none)."""
    value = data.get("records")
    if value is not None and not isinstance(value, str):
        raise UsageError(f"{path}: records: expected the path of a folder (a string), got {value!r}")
    return None if value is None else _beside(path, value) / task


#: the fields every [[task]] table has, and their TOML types
_TASK_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "runs": str,
    "metric": str,
    "target": (int, float),
    "budget_rounds": int,
}
_TASK_OPTIONAL = ("tune_seeds", "report_seeds", "tie_tolerance")


def read_benchmark_file(path: str | Path) -> list[BenchmarkTask]:
    """The tasks of a benchmark file, checked (:class:`UsageError` naming the field and the fix)."""
    p = Path(path)
    data = _benchmark_toml(p)
    tasks = data.get("task")
    if not isinstance(tasks, list) or not tasks:
        raise UsageError(f"{p}: no [[task]] tables; each task needs name, runs, metric, target, budget_rounds")
    return [_benchmark_task(p, data, i, task) for i, task in enumerate(tasks)]


def _benchmark_toml(p: Path) -> dict:
    """The benchmark file's TOML, or the UsageError that says why it cannot be read."""
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"--benchmark: {str(p)!r} does not exist; pass a benchmark file such as jobs/benchmarks/table.toml"
        ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"--benchmark: {str(p)!r} is not a readable TOML file ({exc})") from None


def _benchmark_task(p: Path, data: dict, i: int, task: dict) -> BenchmarkTask:
    """Task ``i`` (0-based) of the benchmark file ``p`` (its TOML ``data``), checked field by field."""
    for key, kind in _TASK_FIELDS.items():
        value = task.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UsageError(
                f"{p}: task {i + 1}: {key}: expected a {getattr(kind, '__name__', 'number')}, got {value!r}"
            )
    unknown = sorted(set(task) - set(_TASK_FIELDS) - set(_TASK_OPTIONAL))
    if unknown:
        raise UsageError(
            f"{p}: task {task['name']!r}: unknown field(s) {', '.join(unknown)}; known: "
            f"{', '.join([*_TASK_FIELDS, *_TASK_OPTIONAL])}"
        )
    where = f"{p}: task {task['name']!r}"
    tune = _seeds(where, "tune_seeds", task.get("tune_seeds", list(TUNE_SEEDS)))
    report = _seeds(where, "report_seeds", task.get("report_seeds", list(REPORT_SEEDS)))
    if set(tune) & set(report):
        raise UsageError(
            f"{where}: tune_seeds and report_seeds share seed(s) {sorted(set(tune) & set(report))}; "
            "tune on seeds the table does not report"
        )
    tolerance = task.get("tie_tolerance", 0.0)
    if not isinstance(tolerance, (int, float)) or isinstance(tolerance, bool) or not tolerance >= 0:
        raise UsageError(
            f"{where}: tie_tolerance: expected a number >= 0 (0: ties at relative 1e-9 only), got {tolerance!r}"
        )
    return BenchmarkTask(
        task["name"],
        _beside(p, task["runs"]),
        task["metric"],
        float(task["target"]),
        task["budget_rounds"],
        tune,
        report,
        float(tolerance),
        _records_folder(p, data, task["name"]),
    )


@dataclass
class Numbers:
    """A row's runs on one set of seeds (in seed order) and their numbers, one per run."""

    runs: list[Run]
    rounds_to_target: list[float]  # NaN where the target is not reached
    bytes_to_target: list[float]
    value_at_budget: list[float]  # NaN where the run stopped short of the budget


@dataclass
class TaskRow:
    """One row of a task: an algorithm (and setting) with its runs on the tuning and on the reported seeds."""

    algorithm: str
    setting: dict  # the fields that set this row apart from the algorithm's other rows
    tuning: Numbers  # the task's tune_seeds: what chooses the setting
    report: Numbers  # the task's report_seeds: what the table reports


def _reached(values: np.ndarray, target: float, up: bool) -> np.ndarray:
    return values >= target if up else values <= target


def _numbers(runs: list[Run], task: BenchmarkTask) -> Numbers:
    out = Numbers(sorted(runs, key=lambda r: r.config.get("seed", 0)), [], [], [])
    for run in out.runs:
        values = np.asarray(run.data[task.metric], dtype=float)
        rounds = np.asarray(run.data["comm_rounds"], dtype=float)
        nbytes = np.asarray(run.data["comm_bytes"], dtype=float)
        up = higher_is_better(task.metric, run.higher_is_better(task.metric))
        # the target counts only within the budget: an algorithm whose last iteration overshoots the budget
        # (outer_iterations rounded up) must not reach it on rounds the others did not get
        within_budget = rounds <= task.budget_rounds
        hit = np.flatnonzero(_reached(values, task.target, up) & np.isfinite(values) & within_budget)
        within = np.flatnonzero(within_budget)
        ran = within.size and rounds[-1] >= task.budget_rounds
        out.rounds_to_target.append(float(rounds[hit[0]]) if hit.size else math.nan)
        out.bytes_to_target.append(float(nbytes[hit[0]]) if hit.size else math.nan)
        out.value_at_budget.append(float(values[within[-1]]) if ran else math.nan)
    return out


def _order(value) -> tuple:
    """Sort key of a setting's value: numbers by size, before anything else (by its JSON)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, json.dumps(value, sort_keys=True, default=str))


def _run_files(task: BenchmarkTask) -> list[Path]:
    return sorted(task.runs.glob("*.h5")) if task.runs.is_dir() else []


def _records(task: BenchmarkTask) -> list[Run]:
    return records_io.read_records(task.records, task.runs, task.name) if task.records is not None else []


def has_runs(task: BenchmarkTask) -> bool:
    """Whether the task has runs: its runs folder exists, or its records folder holds records."""
    return task.runs.exists() or (
        task.records is not None and task.records.is_dir() and any(task.records.glob("*" + records_io.SUFFIX))
    )


def task_runs(task: BenchmarkTask) -> list[Run]:
    """The task's runs, in file-name order: its run files, and the records (:mod:`.records`) of the run files
    that are absent. A run file that a signal stopped (:attr:`~fednest_mpi.post.load.Run.stopped_by`) is not a
    result: it stands for no run (its record, if any, stands instead) until ``--resume`` has continued it."""
    files = _run_files(task)
    records = _records(task)
    if not files and not records:
        if not task.runs.exists():
            raise UsageError(
                f"task {task.name!r}: runs: {str(task.runs)!r} does not exist; run the task's sweep "
                "first (docs/benchmarks.md)"
            )
        return read_runs(task.runs)  # the error that says the folder holds no run files
    results = [run for run in (read_runs(files) if files else []) if not run.stopped_by]
    present = {run.path.name for run in results}
    runs = results + [r for r in records if r.path.name not in present]
    return sorted(runs, key=lambda r: r.path.name)


def task_rows(task: BenchmarkTask) -> list[TaskRow]:
    """The rows of one task, in the order of algorithm name then setting (numbers by size)."""
    runs = task_runs(task)
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
            and key not in IGNORED_FIELDS  # run files of other versions may differ there: not a setting
            and len({json.dumps(r.config.get(key), sort_keys=True, default=str) for r in members}) > 1
        )
        settings: dict[str, list[Run]] = {}
        for run in members:
            settings.setdefault(json.dumps([run.config.get(k) for k in varying], default=str), []).append(run)
        groups = sorted(settings.values(), key=lambda g: [_order(g[0].config.get(k)) for k in varying])
        for group in groups:
            tuning = [r for r in group if r.config.get("seed", 0) in task.tune_seeds]
            report = [r for r in group if r.config.get("seed", 0) in task.report_seeds]
            if tuning or report:
                rows.append(
                    TaskRow(
                        algorithm,
                        {k: group[0].config.get(k) for k in varying},
                        _numbers(tuning, task),
                        _numbers(report, task),
                    )
                )
    return rows


def ties(a: float, b: float, tolerance: float = 0.0) -> bool:
    """Whether ``a`` and ``b`` are equal at numerical precision: within ``tolerance`` (absolute) or within
    :data:`TIE_RTOL` of the larger magnitude."""
    return abs(a - b) <= max(tolerance, TIE_RTOL * max(abs(a), abs(b)))


def _mean(values: Sequence[float]) -> float:
    """The mean, or +inf unless every value is finite (a run without the number counts as the worst)."""
    v = np.asarray(values, dtype=float)
    return float(v.mean()) if v.size and np.isfinite(v).all() else math.inf


def _best(pool: list[int], score, tolerance: float) -> list[int]:
    """The members of ``pool`` whose score (lower is better, +inf the worst) ties with the lowest."""
    scores = {i: score(i) for i in pool}
    low = min(scores.values())
    if not math.isfinite(low):
        return pool
    return [i for i in pool if math.isfinite(scores[i]) and ties(scores[i], low, tolerance)]


def chosen_rows(rows: Sequence[TaskRow], task: BenchmarkTask) -> set[int]:
    """The index of each algorithm's chosen row, by the rule of docs/benchmarks.md on the tuning seeds only
    (an algorithm without a row run on every tuning seed has none chosen):

    1. the rows whose every tuning run reaches the target, by the fewest mean rounds to the target, ties
       by the fewest mean bytes, ties by the best mean metric at the budget;
    2. if no row reaches the target in every tuning run: the best mean metric at the budget (a run
       without a value there, e.g. diverged, makes its row the worst), ties by the most runs that reach
       the target, ties by their fewest mean rounds.

    Two numbers tie when :func:`ties` says so (relative 1e-9, or the task's ``tie_tolerance`` for the
    metric); rows still tied after every criterion go to the first in the table's order."""
    by_algorithm: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_algorithm.setdefault(row.algorithm, []).append(i)
    chosen = set()
    for members in by_algorithm.values():
        pool = [i for i in members if _tuned(rows[i], task)]
        if not pool:
            continue
        up = higher_is_better(task.metric, rows[pool[0]].tuning.runs[0].higher_is_better(task.metric))

        def metric(i: int) -> float:
            value = _mean(rows[i].tuning.value_at_budget)
            return -value if up and math.isfinite(value) else value

        def rounds(i: int) -> float:
            hit = [x for x in rows[i].tuning.rounds_to_target if math.isfinite(x)]
            return float(np.mean(hit)) if hit else math.inf

        reach = [i for i in pool if _mean(rows[i].tuning.rounds_to_target) < math.inf]
        if reach:
            stages = [
                (rounds, 0.0),
                (lambda i: _mean(rows[i].tuning.bytes_to_target), 0.0),
                (metric, task.tie_tolerance),
            ]
            pool = reach
        else:

            def missed(i: int) -> float:
                return float(sum(not math.isfinite(x) for x in rows[i].tuning.rounds_to_target))

            stages = [(metric, task.tie_tolerance), (missed, 0.0), (rounds, 0.0)]
        for score, tolerance in stages:
            pool = _best(pool, score, tolerance)
        chosen.add(pool[0])
    return chosen


def _tuned(row: TaskRow, task: BenchmarkTask) -> bool:
    """Whether the row ran every tuning seed (a diverged run counts: its file is there)."""
    return {r.config.get("seed", 0) for r in row.tuning.runs} == set(task.tune_seeds)


def _tried(rows: Sequence[TaskRow], row: TaskRow, task: BenchmarkTask) -> list[TaskRow]:
    """The rows of ``row``'s algorithm that ran every tuning seed: what its grid tried (a setting run on some
    tuning seeds only, e.g. an interrupted extension, brackets nothing)."""
    return [r for r in rows if r.algorithm == row.algorithm and _tuned(r, task)]


def grid_edges(rows: Sequence[TaskRow], index: int, task: BenchmarkTask) -> dict[str, str]:
    """The fields of row ``index``'s setting (numbers) whose value is the smallest or the largest that its
    algorithm's rows tried on every tuning seed, each with 'smallest' or 'largest': the grid does not bracket
    that value."""
    row = rows[index]
    out = {}
    for key, value in row.setting.items():
        if _order(value)[0]:
            continue
        tried = {r.setting[key] for r in _tried(rows, row, task) if not _order(r.setting.get(key))[0]}
        if len(tried) > 1 and value in (min(tried), max(tried)):
            if key in LOCAL_STEP_FIELDS and value == min(tried) == 1:
                continue  # one local step: there is none fewer
            out[key] = "smallest" if value == min(tried) else "largest"
    return out


def _edges_text(edges: dict[str, str]) -> str:
    return "edge of grid: " + ", ".join(f"{k.rsplit('.', 1)[-1]} {side}" for k, side in edges.items())


def _beyond(tried: Sequence[float], value: float) -> float | int:
    """The next value past ``value``, an end of the sorted ``tried``, at the grid's ratio (or step) there."""
    low = value == tried[0]
    inner = tried[1] if low else tried[-2]
    if value > 0 and inner > 0:
        nxt = value * (value / inner)
    else:
        nxt = value + (value - inner)
    if isinstance(value, int) and isinstance(inner, int):  # a count stays a count
        return max(1, round(nxt))
    return float(f"{nxt:.12g}")


def _toml(value) -> str:
    return json.dumps(value)  # numbers, strings and booleans of a setting read the same in TOML


def _sweep_text(task: BenchmarkTask, row: TaskRow, config_file: Path, grid: dict, what: str, points=None) -> str:
    """A sweep of ``row``'s config over ``grid`` (a cartesian product) and, when given, ``points`` (a ``[zip]``:
    field -> values that vary together, laid over every combination of the grid)."""
    fields = [k for k in {**grid, **(points or {})} if k != "seed"]
    pattern = "_".join([row.algorithm, *(f"{k.rsplit('.', 1)[-1]}{{{k}}}" for k in fields), "seed{seed}"])
    lines = [
        f"# Written by fednest-mpi report --benchmark --follow-up (docs/benchmarks.md): task {task.name}, "
        f"{row.algorithm}: {what}",
        f'description = "benchmark {task.name}: {row.algorithm}, {what}"',
        f"config = {_toml(str(config_file.resolve()))}",
        f"output_dir = {_toml(str(task.runs.resolve()))}",
        f"name_pattern = {_toml(pattern)}",
        "overwrite = true",
        "",
        "[grid]",
        *(f"{key} = [{', '.join(_toml(v) for v in values)}]" for key, values in grid.items()),
        *(["", "[zip]"] if points else []),
        *(f"{key} = [{', '.join(_toml(v) for v in values)}]" for key, values in (points or {}).items()),
        "",
        "[resources]",
        'time = "00:10:00"',
    ]
    return "\n".join(lines) + "\n"


def _beyond_edge(rows: Sequence[TaskRow], row: TaskRow, task: BenchmarkTask, key: str) -> float | int:
    """The value one step past ``row``'s value of ``key``, an edge of what its algorithm tried."""
    return _beyond(sorted({r.setting[key] for r in _tried(rows, row, task)}), row.setting[key])


def _extension(rows: Sequence[TaskRow], row: TaskRow, task: BenchmarkTask, edges: dict[str, str]) -> dict:
    """The settings that extend ``row``'s grid past **every** field at an edge at once, as ``[zip]`` lists (field
    -> values), leaving out what its algorithm has tried. The step sizes form a grid at the chosen local step
    count: each one at an edge gets its next value (:func:`_beyond_edge`), and the extended grid is the product of
    each step size's values tried at that count and its new value: with one step size at an edge, the new value
    with every tried value of the others; with two, both new values with every tried value of the other, and the
    corner. The local step count is a line, not a grid axis: at its edge it gets its next value at the chosen step
    sizes alone (so a count that moved after the grid is not crossed with the whole grid again)."""
    tried = _tried(rows, row, task)
    chosen = {k: [v] for k, v in row.setting.items()}
    counts = [k for k in row.setting if k in LOCAL_STEP_FIELDS]
    parts = []
    if any(k not in LOCAL_STEP_FIELDS for k in edges):
        here = [r for r in tried if all(r.setting[k] == row.setting[k] for k in counts)]
        grid = {k: sorted({r.setting[k] for r in here}, key=_order) for k in row.setting}
        for key in grid:
            if key in LOCAL_STEP_FIELDS:
                grid[key] = chosen[key]
            elif key in edges:
                grid[key] = sorted([*grid[key], _beyond_edge(rows, row, task, key)], key=_order)
        parts.append(grid)
    parts += [chosen | {k: [_beyond_edge(rows, row, task, k)]} for k in edges if k in LOCAL_STEP_FIELDS]
    done = {json.dumps([r.setting[k] for k in row.setting], default=str) for r in tried}
    points = [p for part in parts for p in itertools.product(*part.values())]
    points = [p for p in dict.fromkeys(points) if json.dumps(list(p), default=str) not in done]
    return {k: [p[j] for p in points] for j, k in enumerate(row.setting)}


def _local_steps_line(rows: Sequence[TaskRow], row: TaskRow, task: BenchmarkTask) -> tuple[str, list[int]] | None:
    """(the local-step field of ``row``'s algorithm, its line: half (at least 1) and twice the chosen count), or
    None when the algorithm has no such field or its rows have tried more than one count on every tuning seed
    (after the line, the count moves on only by the extensions of an edge, as a step size does)."""
    first = (row.tuning.runs or row.report.runs)[0].config
    field = next((k for k in LOCAL_STEP_FIELDS if isinstance(first.get(k), int)), None)
    if field is None or len({r.setting.get(field) for r in _tried(rows, row, task)}) > 1:
        return None
    count = first[field]
    return field, [c for c in dict.fromkeys((max(1, (count + 1) // 2), 2 * count)) if c != count]


def _next_sweep(rows: Sequence[TaskRow], i: int, task: BenchmarkTask, extend: bool, local_steps: bool):
    """(kind, grid, points, what) of the next sweep of row ``i``'s algorithm (see :func:`follow_up_sweeps`), or
    None when its protocol is complete."""
    row = rows[i]
    edges = grid_edges(rows, i, task) if extend else {}
    line = _local_steps_line(rows, row, task) if local_steps and not edges else None
    if line:
        field, counts = line
        grid = {k: [v] for k, v in row.setting.items() if k != field} | {field: counts, "seed": list(task.tune_seeds)}
        return "local_steps", grid, None, f"local steps {field} at {counts}, the other fields chosen, tuning seeds"
    if edges:
        beyond = ", ".join(f"{k} to {_beyond_edge(rows, row, task, k)}" for k in edges)
        what = f"extended past the edge of its grid: {beyond}, tuning seeds"
        return "extend", {"seed": list(task.tune_seeds)}, _extension(rows, row, task, edges), what
    missing = [s for s in task.report_seeds if s not in {r.config.get("seed", 0) for r in row.report.runs}]
    if not missing:
        return None
    grid = {k: [v] for k, v in row.setting.items()} | {"seed": missing}
    return "report", grid, None, "the chosen setting on the reported seeds"


def follow_up_sweeps(
    path: str | Path, folder: str | Path, extend: bool = True, local_steps: bool = True, task_name: str | None = None
) -> list[Path]:
    """The sweep files that carry the tuning protocol of docs/benchmarks.md on from the runs of the benchmark
    file ``path`` (tasks whose runs folder does not exist yet are skipped), written to ``folder``; none when
    it is complete. For each algorithm with a chosen row: with ``extend``, where tuned values are at an edge
    of the grid (:func:`grid_edges`), the next value beyond each (the grid's ratio there) in one sweep, every
    setting of the grid so extended that was not tried (:func:`_extension`), on the tuning seeds; else, with
    ``local_steps``, the line of the algorithm's local step count not yet run at the chosen setting
    (:func:`_local_steps_line`); otherwise the chosen setting on the reported seeds it has not run. Each sweep
    runs the chosen row's own config (written beside it as JSON). ``task_name``: that task of the file only."""
    tasks = read_benchmark_file(path)
    if task_name is not None and task_name not in {t.name for t in tasks}:
        raise UsageError(f"--task {task_name}: not a task of {path} ({', '.join(t.name for t in tasks)})")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for task in tasks:
        if not has_runs(task) or task_name not in (None, task.name):
            continue
        rows = task_rows(task)
        for i in sorted(chosen_rows(rows, task)):
            following = _next_sweep(rows, i, task, extend, local_steps)
            if following is None:
                continue
            kind, grid, points, what = following
            stem = f"{task.name}_{rows[i].algorithm}"
            config_file = folder / f"{stem}.json"
            _write_config(rows[i].tuning.runs[0], config_file)
            sweep = folder / f"{stem}_{kind}.toml"
            sweep.write_text(_sweep_text(task, rows[i], config_file, grid, what, points), encoding="utf-8")
            out.append(sweep)
    return out


def _reach(values: Sequence[float], fmt=format_number) -> str:
    n_hit = sum(math.isfinite(x) for x in values)
    if not values:
        return "-"
    if not n_hit:
        return f"not reached (0/{len(values)})"
    return f"{format_mean_sd(values, fmt)} ({n_hit}/{len(values)})"


def _at_budget(values: Sequence[float]) -> str:
    """mean ± sd at the budget, with the count of the runs that ran it when some stopped short (diverged)."""
    n_ran = sum(math.isfinite(x) for x in values)
    cell = format_mean_sd(values)
    return cell if n_ran in (0, len(values)) else f"{cell} ({n_ran}/{len(values)})"


def _write_config(run: Run, path: Path) -> Path:
    """The config of ``run`` as JSON at ``path``, without its output paths: ``--set seed=S`` gives the others."""
    cfg = json.loads(json.dumps(run.attrs.get("config", {})))
    cfg.get("run", {}).pop("output", None)
    cfg.get("run", {}).pop("checkpoint_dir", None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def _config_file(row: TaskRow, task: BenchmarkTask, folder: Path) -> Path:
    """The config of the row's first reported run (seed 0's, say; else its first tuning run), as JSON."""
    stem = "_".join([task.name, row.algorithm, *(f"{k.rsplit('.', 1)[-1]}-{v}" for k, v in row.setting.items())])
    return _write_config(
        (row.report.runs or row.tuning.runs)[0], folder / f"{stem.replace('/', '-').replace(' ', '')}.json"
    )


def _setting_text(row: TaskRow) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in row.setting.items()) or "-"


def _where(task: BenchmarkTask) -> str:
    """Where the task's runs are, for the table's words (the same whether the run files are there or not)."""
    records = "" if task.records is None else f" (where absent, their records in `{os.path.relpath(task.records)}`)"
    return f"runs in `{os.path.relpath(task.runs)}`{records}"


def benchmark_table(
    path: str | Path, configs_dir: str | Path | None = None, link_base: str | Path | None = None
) -> str:
    """The Markdown table of the benchmark file ``path``: one section per task, one row per algorithm
    (and setting), then each algorithm's chosen row. With ``configs_dir``, each row's config is written
    there as JSON and linked (relative to ``link_base``, the folder of the Markdown file that will hold
    the table)."""
    tasks = read_benchmark_file(path)
    lines: list[str] = []
    folder = Path(configs_dir) if configs_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    if not any(has_runs(task) for task in tasks):
        task_rows(tasks[0])  # the error that names the sweep to run
    for task in tasks:
        if not has_runs(task):
            lines += [f"### {task.name}", "", f"Not run here yet: `bash jobs/benchmarks/run.sh {task.name}`.", ""]
            continue
        rows = task_rows(task)
        chosen = chosen_rows(rows, task)
        lines += _task_head(task)
        notes = _edge_notes(rows, chosen, task)
        lines += [_row_line(row, i, chosen, notes, task, folder, link_base) for i, row in enumerate(rows)]
        lines += _chosen_lines(rows, chosen, notes, task)
    return "\n".join(lines)


def _at_text(task: BenchmarkTask) -> str:
    return f"{task.metric} at {task.budget_rounds}"


def _task_head(task: BenchmarkTask) -> list[str]:
    """A task's heading, the words on how it was tuned and reported, and its table's head."""
    tune, report = (", ".join(map(str, s)) for s in (task.tune_seeds, task.report_seeds))
    at = _at_text(task)
    tie = f"an absolute {format_number(task.tie_tolerance)} or relative" if task.tie_tolerance else "relative"
    return [
        f"### {task.name}",
        "",
        f"{task.metric}: target {format_number(task.target)}, budget {task.budget_rounds} rounds; "
        f"{_where(task)}. Each algorithm's setting is chosen on seeds {tune} "
        "(the `tuning` columns) by the rule of docs/benchmarks.md (rounds to target first; the metric at the "
        f"budget among settings that miss it; ties within {tie} {TIE_RTOL:g} of the metric); the other "
        f"columns report seeds {report}, mean ± sd. 'edge of grid': the chosen value is the smallest or "
        "largest tried.",
        "",
        f"| algorithm | setting | tuning: rounds to target | tuning: {at} | rounds to target "
        f"| bytes to target (per rank) | {at} rounds | config |",
        "|---|---|---|---|---|---|---|---|",
    ]


def _edge_notes(rows: list[TaskRow], chosen, task: BenchmarkTask) -> dict[int, str]:
    """For each chosen row with a setting: the words on its grid's edges ('' where it is bracketed)."""
    notes = {}
    for i in chosen:
        if len(rows[i].setting):
            edges = grid_edges(rows, i, task)
            notes[i] = _edges_text(edges) if edges else ""
    return notes


def _row_line(row: TaskRow, i: int, chosen, notes, task, folder: Path | None, link_base) -> str:
    """Row ``i`` of a task's table: its setting (bold where chosen), tuning and reported numbers, its config."""
    setting = _setting_text(row)
    if i in notes:
        setting = f"**{setting}** (chosen{'; ' + notes[i] if notes[i] else ''})"
    link = "-"
    if folder is not None:
        cfg = _config_file(row, task, folder)
        rel = cfg.relative_to(link_base) if link_base is not None else cfg
        link = f"[json]({rel.as_posix()})"
    return (
        f"| {row.algorithm} | {setting} | {_reach(row.tuning.rounds_to_target)} "
        f"| {_at_budget(row.tuning.value_at_budget) if row.tuning.runs else '-'} "
        f"| {_reach(row.report.rounds_to_target)} | {_reach(row.report.bytes_to_target, format_bytes)} "
        f"| {_at_budget(row.report.value_at_budget) if row.report.runs else '-'} | {link} |"
    )


def _chosen_lines(rows: list[TaskRow], chosen, notes: dict[int, str], task: BenchmarkTask) -> list[str]:
    """The table of each algorithm's chosen row on the reported seeds."""
    report = ", ".join(map(str, task.report_seeds))
    lines = [
        "",
        f"Chosen rows of {task.name} (seeds {report}):",
        "",
        f"| algorithm | setting | rounds to target | bytes to target (per rank) | {_at_text(task)} rounds | note |",
        "|---|---|---|---|---|---|",
    ]
    for algorithm in sorted({row.algorithm for row in rows}):
        members = [i for i, row in enumerate(rows) if row.algorithm == algorithm]
        picked = [i for i in members if i in chosen]
        if len(members) == 1:
            i, note = members[0], "one setting, not tuned"
        elif picked:
            i, note = picked[0], notes.get(picked[0], "") or "bracketed"
        else:
            lines.append(f"| {algorithm} | - | - | - | - | not chosen: no setting ran every tuning seed |")
            continue
        row = rows[i]
        lines.append(
            f"| {algorithm} | {_setting_text(row)} | {_reach(row.report.rounds_to_target)} "
            f"| {_reach(row.report.bytes_to_target, format_bytes)} | {_at_budget(row.report.value_at_budget)} "
            f"| {note} |"
        )
    lines.append("")
    return lines


@dataclass(frozen=True)
class Archived:
    """What :func:`archive` did with one records file (or, with ``skipped``, the run files of a task it left)."""

    path: Path
    runs: int  # records in the file
    changed: int  # records new or changed by this call
    written: bool
    skipped: tuple[str, ...] = ()  # run files not archived (not closed, damaged), each with why


def archive(path: str | Path) -> list[Archived]:
    """Write the benchmark records (:mod:`.records`) of the run files of every task of the benchmark file
    ``path`` that has run files: one file per task and algorithm in the file's ``records`` folder, the records
    of run files that are gone kept. A run file that is not closed (a run still writing it, or killed) or
    cannot be read is skipped and named."""
    p = Path(path)
    out = []
    tasks = read_benchmark_file(p)
    if any(task.records is None for task in tasks):
        raise UsageError(
            f"--archive: {str(p)!r} names no records folder; add a top-level line such as "
            'records = "../../docs/benchmarks/records" (relative to the benchmark file)'
        )
    for task in tasks:
        assert task.records is not None
        by_algorithm: dict[str, list[dict]] = {}
        skipped = []
        for file in _run_files(task):
            try:
                (run,) = read_runs([file], unclosed="refuse")
                record = records_io.record_of(run, task.metric)
            except UsageError as exc:
                skipped.append(f"{file}: {exc}")
                continue
            by_algorithm.setdefault(record["algorithm"], []).append(record)
        for algorithm in sorted(by_algorithm):
            target = task.records / f"{algorithm}{records_io.SUFFIX}"
            n, changed, written = records_io.write_records(target, task.name, task.metric, by_algorithm[algorithm])
            out.append(Archived(target, n, changed, written))
        if skipped:
            out.append(Archived(task.records, 0, 0, False, tuple(skipped)))
    return out


def records_to_verify(path: str | Path, which: str) -> list[Run]:
    """The records of ``which`` = TASK or TASK/ALGORITHM of the benchmark file ``path`` on the task's reported
    seeds (the runs behind the table's numbers), to be run again from their configs and compared bit for bit
    (``fednest-mpi report --benchmark FILE --verify TASK[/ALGORITHM]``)."""
    name, _, algorithm = which.partition("/")
    tasks = {t.name: t for t in read_benchmark_file(path)}
    if name not in tasks:
        raise UsageError(f"--verify: {path} has no task {name!r}; its tasks: {', '.join(tasks)}")
    task = tasks[name]
    chosen = [
        r
        for r in _records(task)
        if r.attrs.get("seed") in task.report_seeds and (not algorithm or r.config.get("algorithm.name") == algorithm)
    ]
    if not chosen:
        what = f"algorithm {algorithm!r} of task {name!r}" if algorithm else f"task {name!r}"
        raise UsageError(
            f"--verify: no records of {what} on its reported seeds {list(task.report_seeds)} in {task.records}; "
            "archive its runs first (--archive)"
        )
    return chosen


def cpu_class_of(run: Run) -> str | None:
    """The CPU class (:func:`fednest_mpi.numerics.cpu_class`) a run file or record says it ran on, or None (a record
    archived before records kept it)."""
    try:
        return cpu_class(json.loads(run.attrs["numerics"]))
    except (KeyError, TypeError, ValueError):
        return None


def series_difference(record: Run, rerun: Run) -> str | None:
    """Where ``rerun`` (a run file) first differs from ``record`` in the columns the record holds, bit for bit
    (:func:`fednest_mpi.bitwise.first_difference`: "column at iteration k (the record's value vs the new one)",
    NaN equal to NaN), or None when every value is the same."""
    return first_difference(dict(sorted(record.data.items())), rerun.data)
