"""Reading run files: one run or a sweep as DataFrames, the config fields that differ between runs,
and the checks and grouping that the tables and plots share.

Run files are read through :func:`fednest_mpi.io.h5.read_run` and :mod:`fednest_mpi.io.clients`
(the only HDF5 code is in :mod:`fednest_mpi.io`); pandas and the io modules are imported inside
the functions that need them, so importing this module is cheap.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fednest_mpi.config import differing_fields, flatten_config
from fednest_mpi.errors import UsageError
from fednest_mpi.text import did_you_mean

if TYPE_CHECKING:
    import pandas

__all__ = [
    "ADDED_FIELDS",
    "IGNORED_FIELDS",
    "Run",
    "check_columns",
    "check_group_by",
    "common_primary_metrics",
    "config_differences",
    "config_label",
    "differences",
    "flatten_config",
    "group_runs",
    "group_values",
    "load_clients",
    "load_ranks",
    "run_config",
    "load_run",
    "load_sweep",
    "read_runs",
    "run_names",
]

logger = logging.getLogger(__name__)

#: Config fields that do not change the numbers a run produces; never reported as differences.
IGNORED_FIELDS = frozenset(
    {
        "run.output",
        "run.overwrite",
        "run.progress",
        "run.log_every",
        "run.client_series",
        "run.snapshot_every",
        "run.tensorboard_dir",
        "run.mlflow_uri",
        "run.mlflow_experiment",
        "run.checkpoint_every",
        "run.stop_timeout",
        "run.round_timeout",
        "run.round_timeout_factor",
        "run.idle_timeout",
        "run.check_consistency",
    }
)

#: Config fields added after run files were first written, with the value that reproduces a run written before
#: them: a run whose config lacks the field ran as that value does. federation.group_clients: no summation
#: groups then; 0 (automatic) is 1 below 32 clients per round (the MNIST benchmark records have 10), and wider
#: rounds of those versions (the quadratic tasks' up to 100 clients, the minimax figure's 1,000) have rows
#: narrower than 4,096 numbers, summed client by client in any case.
ADDED_FIELDS = {"federation.group_clients": 0}

_SUGGEST = 0.5  # did-you-mean similarity cutoff for column and field names (short, underscored)


@dataclass
class Run:
    """One run file as read: its display name, file attributes, flattened config and recorded columns."""

    path: Path
    name: str
    attrs: dict
    config: dict  # flattened (dotted names)
    data: dict  # column -> numpy array

    def higher_is_better(self, column: str) -> bool | None:
        """What the run file declares of ``column`` (None: nothing)."""
        return self.attrs.get("columns", {}).get(column, {}).get("higher_is_better")

    @property
    def problem(self) -> str:
        return str(self.attrs.get("problem", self.config.get("problem.name", "?")))

    @property
    def stopped_by(self) -> str | None:
        """``"SIGTERM after iteration K"`` for a run stopped by a signal before its last iteration (the file
        attribute ``stopped``: an interrupted run, which ``--resume`` continues, not a result), else None."""
        from fednest_mpi.io.schema import STOPPED

        note = self.attrs.get(STOPPED)
        if not note:
            return None
        info = json.loads(note)
        return f"{info.get('by', 'a signal')} after iteration {info.get('iteration', '?')}"


def _as_paths(paths) -> list[Path]:
    """Normalise ``paths`` (one path, or an iterable of paths; a directory stands for its ``*.h5``)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        if os.fspath(p) == "":  # Path("") is the current folder: an empty argument must not read it unasked
            raise UsageError(
                "a run path is empty; pass a run file (.h5) written by `fednest-mpi run`, or '.' for a folder"
            )
        p = Path(p)
        if os.path.isdir(p):  # never raises (a name too long: the reader says so)
            found = sorted(p.glob("*.h5"))
            if not found:
                raise UsageError(
                    f"directory {str(p)!r} holds no *.h5 run files; pass run files written by `fednest-mpi run`"
                )
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


def primary_metrics(paths) -> list[str]:
    """The primary metrics of the problems of the run files ``paths`` (each run file's ``primary_metric``
    attribute; x_error for a file written before runs stored it), in order, without repeats."""
    return list(dict.fromkeys(r.attrs.get("primary_metric", "x_error") for r in read_runs(paths)))


def common_primary_metrics(runs: Sequence[Run]) -> list[str]:
    """The primary metrics of ``runs`` (:func:`primary_metrics`) that every one of them records: what
    ``plot`` and ``report --at`` show by default; UsageError when there is none."""
    primary = list(dict.fromkeys(r.attrs.get("primary_metric", "x_error") for r in runs))
    common = [m for m in primary if all(m in r.data for r in runs)]
    if not common:
        shared = set.intersection(*(set(r.data) for r in runs)) - {"iteration"}
        raise UsageError(
            f"the runs' primary metrics ({', '.join(primary)}) are not recorded by all of them (the runs mix "
            f"problems {', '.join(sorted({r.problem for r in runs}))}); name a metric that all of them record "
            f"with --metric: {', '.join(sorted(shared)) or 'none'}"
        )
    return common


def read_runs(paths, unclosed: str = "live") -> list[Run]:
    """The run files ``paths`` (a directory stands for its ``*.h5``) as :class:`Run` records (``unclosed``: a
    file its writer has not closed, as :func:`fednest_mpi.io.h5.open_run`: "live" reads it while a run writes
    it, "refuse" never)."""
    from fednest_mpi.io.h5 import read_run

    paths = _as_paths(paths)
    runs = []
    for path, name in zip(paths, run_names(paths)):
        attrs, data = read_run(path, unclosed)
        flat = run_config(attrs.get("config", {}))
        if "mpi_size" in attrs:  # not a config field, but it matters for timings: treated as one
            flat.setdefault("mpi_size", int(attrs["mpi_size"]))
        runs.append(Run(path=path, name=name, attrs=attrs, config=flat, data=data))
    return runs


def run_config(config: dict) -> dict:
    """A run file's (or record's) nested config, flattened (dotted names), with the :data:`ADDED_FIELDS` it
    predates, so that runs of this version and of earlier ones compare as the same setting where they are."""
    flat = flatten_config(config)
    if any(key.startswith("federation.") for key in flat):
        for name, value in ADDED_FIELDS.items():
            flat.setdefault(name, value)
    return flat


def _frame(data: dict) -> pandas.DataFrame:
    import pandas as pd

    order = (["iteration"] if "iteration" in data else []) + [c for c in data if c != "iteration"]
    return pd.DataFrame({c: data[c] for c in order})


def load_run(path) -> pandas.DataFrame:
    """One run file as a DataFrame: one row per recorded iteration, one column per recorded value.

    ``df.attrs`` holds the file attributes (``seed``, ``problem``, ``mpi_size``, ...) and, under
    ``"config"``, the run's config as a nested dict.
    """
    if isinstance(path, (list, tuple)):
        raise UsageError("load_run reads one run file; use load_sweep for several")
    (run,) = read_runs([path])
    df = _frame(run.data)
    df.attrs = dict(run.attrs)
    return df


def _long_frame(arrays: dict[str, np.ndarray], row_name: str, keep=None) -> pandas.DataFrame:
    """{series: (rows, iterations)} -> one DataFrame row per (row, iteration) where ``keep`` (same shape) holds."""
    import pandas as pd

    first = next(iter(arrays.values()))
    index = np.indices(first.shape)  # index[0]: row, index[1]: iteration
    mask = np.ones(first.shape, dtype=bool) if keep is None else keep
    return pd.DataFrame(
        {row_name: index[0][mask], "iteration": index[1][mask], **{k: v[mask] for k, v in arrays.items()}}
    )


def load_clients(path, participants_only: bool = True) -> pandas.DataFrame:
    """The per-client series of one run file, long format: columns ``client``, ``iteration``,
    ``participation`` (role bitmask: 1 FedInn, 2 FedIHGP, 4 FedOut), ``inner_loss``, ``outer_loss``,
    ``inner_gradient_norm``, ``local_hypergradient_norm``, ``answered_rounds``, ``dropped_rounds``; one
    row per client and iteration in which it was a member of a round (``participants_only``: it took part,
    answered or dropped), or per client and iteration. The arrays (clients x iterations) are
    :func:`fednest_mpi.io.clients.read_clients`."""
    from fednest_mpi.io.clients import read_clients

    data = read_clients(path)
    member = (data["participation"] > 0) | (data["answered_rounds"] > 0) | (data["dropped_rounds"] > 0)
    return _long_frame(data, "client", member if participants_only else None)


def load_ranks(path) -> pandas.DataFrame:
    """Per-rank phase times of one run file, long format: columns ``rank``, ``iteration``,
    ``compute_seconds``, ``wait_seconds``, ``transfer_seconds`` (:func:`fednest_mpi.io.clients.read_ranks`)."""
    from fednest_mpi.io.clients import read_ranks

    return _long_frame(read_ranks(path), "rank")


def differences(runs: Sequence[Run], ignore: Iterable[str] = IGNORED_FIELDS) -> dict[str, list]:
    """:func:`config_differences` of runs already read."""
    return differing_fields([run.config for run in runs], ignore)


def config_differences(paths, ignore: Iterable[str] = IGNORED_FIELDS) -> dict[str, list]:
    """``{dotted field: [value in each run]}`` for every config field whose value is not the same in all runs.

    A field missing from some runs (runs of different problems) counts as differing, with value
    None there. The number of MPI ranks (file attribute ``mpi_size``) is treated as a field. Fields
    in ``ignore`` (by default those that do not change the results, such as ``run.output``) are left out.
    """
    return differences(read_runs(paths), ignore)


def load_sweep(paths, ignore: Iterable[str] = IGNORED_FIELDS) -> pandas.DataFrame:
    """Several runs stacked into one DataFrame, ready for ``groupby``.

    Columns: ``run`` (the path, as given), one column per config field that differs between the
    runs (dotted names, see :func:`config_differences`), then the recorded columns. A column that
    only some runs record is NaN in the others. ``df.attrs["differences"]`` is the list of the
    config columns, ``df.attrs["runs"]`` the list of paths.
    """
    import pandas as pd

    runs = read_runs(paths)
    diffs = differences(runs, ignore)
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
# Checks and grouping shared by the tables and the plots


def check_columns(runs: Sequence[Run], names: Sequence[str], what: str) -> None:
    """Every name must be a recorded column of every run; else a UsageError naming runs and alternatives."""
    common = set.intersection(*(set(r.data) for r in runs))
    everywhere = set.union(*(set(r.data) for r in runs))
    for name in names:
        if name in common:
            continue
        available = ", ".join(sorted(common - {"iteration"}))
        if name not in everywhere:
            raise UsageError(
                f"{what} {name!r} is not recorded in the run files{did_you_mean(name, common, _SUGGEST)}; "
                f"available: {available}"
            )
        have = [r for r in runs if name in r.data]
        lack = [r for r in runs if name not in r.data]
        problems = sorted({r.problem for r in runs})
        mixed = f" (the runs mix problems {', '.join(map(repr, problems))})" if len(problems) > 1 else ""
        raise UsageError(
            f"{what} {name!r} is recorded by {', '.join(r.name + ' [' + r.problem + ']' for r in have)} but not by "
            f"{', '.join(r.name + ' [' + r.problem + ']' for r in lack)}{mixed}; pass only runs that record it, "
            f"or a {what} that all of them record: {available}"
        )


def check_group_by(runs: Sequence[Run], field: str) -> None:
    """``field`` must be a config field of every run; else a UsageError naming the fields that differ."""
    known = set().union(*(r.config for r in runs))
    if field not in known:
        raise UsageError(
            f"group_by {field!r} is not a config field of these runs{did_you_mean(field, known, _SUGGEST)}; "
            f"use a dotted name such as 'algorithm.name' or 'seed'; fields that differ between them: "
            f"{', '.join(differences(runs)) or 'none'}"
        )
    lack = [r.name for r in runs if field not in r.config]
    if lack:
        raise UsageError(f"group_by {field!r} is not a config field of {', '.join(lack)}; pass only runs that have it")


def config_label(value) -> str:
    """A config value as shown in tables and legends: '-' for missing, floats in ``%g``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def group_values(
    runs: Sequence[Run], group_by: str | Sequence[str] | None
) -> tuple[list[str], list[tuple[tuple, list[Run]]]]:
    """``(fields, groups)``: ``group_by`` (None, one dotted config field or several) as a list, each
    checked with :func:`check_group_by`, and the runs with equal values of those fields as
    ``[(values, runs)]``, sorted by the values ([] without fields).

    Logs a warning for a group whose runs also differ in fields other than ``fields`` and the seed."""
    fields = [] if group_by is None else [group_by] if isinstance(group_by, str) else list(group_by)
    for f in fields:
        check_group_by(runs, f)
    if not fields:
        return fields, []
    by_value: dict[str, tuple[tuple, list[Run]]] = {}
    for r in runs:
        values = tuple(r.config[f] for f in fields)
        by_value.setdefault(json.dumps(values, sort_keys=True, default=str), (values, []))[1].append(r)
    groups = list(by_value.values())
    try:
        groups.sort(key=lambda g: g[0])
    except TypeError:  # values of mixed types: order of first appearance
        pass
    for values, members in groups:
        mixed = [k for k in differences(members) if k not in fields and k != "seed"]
        if mixed:
            logger.warning(
                "group %s averages runs that also differ in %s, not only in seed",
                ", ".join(f"{f}={config_label(v)}" for f, v in zip(fields, values)),
                ", ".join(mixed),
            )
    return fields, groups


def group_runs(
    runs: Sequence[Run], group_by: str | Sequence[str] | None
) -> tuple[list[str], list[tuple[str, list[Run]]]]:
    """:func:`group_values` with each group's values as one plain label (``"fednest, iid"``)."""
    fields, groups = group_values(runs, group_by)
    return fields, [(", ".join(config_label(v) for v in values), members) for values, members in groups]
