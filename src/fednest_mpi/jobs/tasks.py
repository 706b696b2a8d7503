"""A sweep's runs: :func:`expand` makes the :class:`Task` s, :func:`write_tasks_file` the ``<name>.tasks`` file
the array and workstation scripts read."""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fednest_mpi.errors import UsageError
from fednest_mpi.jobs.sweep import Sweep
from fednest_mpi.jobs.values import _label, toml_value
from fednest_mpi.text import did_you_mean


@dataclass(frozen=True)
class Task:
    """One run of a sweep."""

    index: int  #: position in the sweep (the array task id)
    name: str  #: stable, from the varying values, e.g. ``fednest_seed1``
    config: str  #: base config path
    overrides: tuple[str, ...]  #: ``section.field=<TOML value>``, for ``--set``
    output: str  #: HDF5 output path
    ranks: int  #: MPI ranks
    values: Mapping[str, Any] = field(default_factory=dict)  #: the varying values (and ranks)
    sweep: str = ""
    overwrite: bool = False

    @property
    def job_name(self) -> str:
        return f"{self.sweep}-{self.name}" if self.sweep else self.name

    def args(self) -> list[str]:
        """Arguments of ``fednest-mpi run CONFIG`` after the config."""
        out: list[str] = []
        for o in self.overrides:
            out += ["--set", o]
        out += ["--output", self.output]
        return out + (["--overwrite"] if self.overwrite else [])

    def command(self, program: Sequence[str] = ("fednest-mpi",)) -> list[str]:
        return [*program, "run", self.config, *self.args()]


def _values_label(key: str, values: Sequence) -> Callable[[Any], str]:
    if all(isinstance(v, str) for v in values):
        return _label
    short = key.rsplit(".", 1)[-1]
    return lambda v: short + _label(v)


def _format_name(pattern: str, values: Mapping[str, Any], where: str) -> str:
    def sub(m):
        key = m.group(1)
        if key not in values:
            raise UsageError(
                f"{where}name_pattern: {{{key}}} is not a value of the sweep"
                + did_you_mean(key, values)
                + f"; known: {', '.join(values)}"
            )
        return _label(values[key])

    return _label(re.sub(r"\{([^{}]*)\}", sub, pattern))


def expand(sweep: Sweep) -> list[Task]:
    """All runs of ``sweep`` in a deterministic order: rank counts (scaling), then the grid in
    file order (the first field varies slowest), then the zip lists."""
    where = f"{sweep.path or sweep.name}: "
    grid_keys, zip_keys = list(sweep.grid), list(sweep.zip)
    zip_rows = list(zip(*sweep.zip.values())) if sweep.zip else [()]
    rank_list = sweep.scaling.ranks if sweep.scaling else (sweep.resources.ranks,)
    labels = {k: _values_label(k, v) for k, v in {**sweep.grid, **sweep.zip}.items()}
    tasks: list[Task] = []
    for ranks in rank_list:
        for combo in itertools.product(*sweep.grid.values(), zip_rows):
            varying = dict(zip(grid_keys, combo[:-1])) | dict(zip(zip_keys, combo[-1]))
            tasks.append(_task(sweep, len(tasks), ranks, varying, labels, len(str(max(rank_list))), where))
    _check_unique_names(tasks, where)
    return tasks


def _task(sweep: Sweep, index: int, ranks: int, varying: dict, labels: dict, width: int, where: str) -> Task:
    """Run ``index`` of ``sweep``: ``ranks`` ranks, the grid/zip values ``varying`` (and the weak-scaling
    values derived from the rank count), named by the sweep's name_pattern or by its varying values."""
    derived = {}
    if sweep.scaling and sweep.scaling.kind == "weak":
        derived = {k: v * ranks for k, v in sweep.scaling.per_rank.items()}
    values = {**sweep.set, **varying, **derived}
    if sweep.scaling:
        values["ranks"] = ranks
    if sweep.name_pattern:
        name = _format_name(sweep.name_pattern, {**values, "index": index, "sweep": sweep.name}, where)
    else:
        parts = [f"ranks{ranks:0{width}d}"] if sweep.scaling else []
        parts += [labels[k](v) for k, v in varying.items()]
        name = "_".join(parts) or sweep.name
    overrides = tuple(f"{k}={toml_value(v)}" for k, v in {**sweep.set, **varying, **derived}.items())
    return Task(
        index=index,
        name=name,
        config=sweep.config,
        overrides=overrides,
        output=str(Path(sweep.output_dir) / f"{name}.h5") if sweep.output_dir else f"{name}.h5",
        ranks=ranks,
        values={**varying, **derived, **({"ranks": ranks} if sweep.scaling else {})},
        sweep=sweep.name,
        overwrite=sweep.overwrite,
    )


def _check_unique_names(tasks: list[Task], where: str) -> None:
    seen: dict[str, Task] = {}
    for t in tasks:
        if t.name in seen:
            raise UsageError(
                f"{where}tasks {seen[t.name].index} and {t.index} are both named {t.name!r}; "
                "add the fields that tell them apart to name_pattern"
            )
        seen[t.name] = t


def check_tasks(tasks: Sequence[Task], workdir: str | Path = ".") -> None:
    """Validate every task's config as ``fednest-mpi run`` would (field names, values, ranks
    against clients), with paths relative to ``workdir``: a typo fails here, not in the queue."""
    from fednest_mpi import config as configuration

    for t in tasks:
        path = Path(t.config)
        if not path.is_absolute():
            path = Path(workdir) / path
        try:
            cfg = configuration.load(path, list(t.overrides))
            configuration.validate_world(cfg, t.ranks)
        except UsageError as exc:
            raise UsageError(f"task {t.index} ({t.name}): {exc}") from None


def task_line(task: Task) -> str:
    """One line of a tasks file: ``NAME RANKS ARGS...``, shell-quoted (read back with ``eval set --``)."""
    return shlex.join([task.name, str(task.ranks), *task.args()])


def write_tasks_file(tasks: Sequence[Task], path: str | Path) -> Path:
    """Write the tasks file: line ``i`` (0-based: the array task id) is task ``i`` as
    ``NAME RANKS --set F=V ... --output PATH``, every word shell-quoted. No header, no comments."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(task_line(t) + "\n" for t in tasks))
    return p


def describe(tasks: Sequence[Task]) -> str:
    """A text table of the tasks: id, name, ranks, output, overrides."""
    rows = [("id", "name", "ranks", "output", "overrides")]
    rows += [(str(t.index), t.name, str(t.ranks), t.output, " ".join(t.overrides)) for t in tasks]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] + "\n" for r in rows)
