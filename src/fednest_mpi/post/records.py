"""Benchmark records: the part of each finished benchmark run that the benchmark table reads, kept in a small
committed file so that the table (and the tuning protocol's next sweeps) survive the loss of the run files.

The run files of a benchmark (``runs/``, hours of one-core runs) are not committed; a session that ends loses
them. ``fednest-mpi report --benchmark FILE --archive`` (:func:`fednest_mpi.post.benchmark.archive`) writes,
for every task of FILE and every algorithm with closed run files, one gzip-compressed JSON Lines file
``RECORDS/TASK/ALGORITHM.jsonl.gz`` (``RECORDS``: the benchmark file's ``records`` folder). Its first line is a
header (format, version, task, metric); then one line per run file, in file-name order::

    {"file": "fedbio_outer_lr0.2_inner_lr0.4_seed0.h5",  # the run file's name in the task's runs folder
     "algorithm": "fedbio", "seed": 0,
     "config_digest": "<SHA-256 of config_json>",        # the run's identity (fednest_mpi.checkpoint)
     "config_json": "{...}",                             # the run file's config, as stored there
     "mpi_size": 1, "problem": "quadratic", "primary_metric": "outer_objective",
     "status": "finished",                               # or "stopped": fewer iterations than outer_iterations
                                                         # (diverged; never a run a signal stopped: not archived)
     "iterations": 300, "outer_iterations": 300,         # the last recorded iteration, the config's count
     "columns": {"x_error": {"description": ..., "units": ..., ...}, ...},   # as the run file declares them
     "dtypes": {"x_error": "float64", ...},
     "data": {"comm_rounds": [...], "comm_bytes": [...], "x_error": [...]},  # every recorded iteration
     "numerics": "{...}", "git_commit": "..."}  # where it ran: the run file's code paths (CPU class) and commit

``numerics`` and ``git_commit`` (records archived from 2026-12-07 on; absent before) say where the run ran, so that
``report --verify`` can tell a difference between CPU classes (expected in the default mode, whose bits are a
class's own: docs/design.md) from one on the same class. ``data`` holds exactly the columns the table reads
(``comm_rounds``, ``comm_bytes`` and the task's metric), at every recorded iteration, as JSON numbers (Python's
shortest round-trip repr of each float64, ``NaN`` and ``Infinity`` included), so a record read back is the same
numbers, bit for bit. The files are written deterministically (sorted keys, a gzip header without time or name):
archiving unchanged runs again rewrites nothing. :func:`read_records` gives the records back as
:class:`~fednest_mpi.post.load.Run` objects, which :func:`fednest_mpi.post.benchmark.task_rows` takes wherever a
task's run file of the same name is absent.

No HDF5 here: the run files are read by :mod:`fednest_mpi.post.load` (through :mod:`fednest_mpi.io`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from fednest_mpi import atomic
from fednest_mpi.errors import UsageError
from fednest_mpi.post.load import Run, run_config

__all__ = ["FORMAT", "SUFFIX", "VERSION", "read_records", "record_of", "records_text", "write_records"]

FORMAT = "fednest-mpi/benchmark-records"
VERSION = 1
#: the name of an algorithm's records file in its task's records folder: ALGORITHM + SUFFIX
SUFFIX = ".jsonl.gz"
#: the columns every record holds besides the task's metric
COUNTERS = ("comm_rounds", "comm_bytes")


def _digest(config_json: str) -> str:
    """The identity of a run's config: the SHA-256 of its JSON (as :func:`fednest_mpi.checkpoint.config_digest`)."""
    return hashlib.sha256(config_json.encode()).hexdigest()


def record_of(run: Run, metric: str) -> dict:
    """The record of one run file, read (:func:`fednest_mpi.post.load.read_runs`): its file name, config and
    the columns ``comm_rounds``, ``comm_bytes`` and ``metric`` at every recorded iteration."""
    config_json = str(run.attrs.get("config_json", json.dumps(run.attrs.get("config", {}))))
    columns = [*COUNTERS, metric]
    if run.stopped_by:
        raise UsageError(
            f"stopped by {run.stopped_by}: an interrupted run, not a result; continue it with the same command "
            "and --resume (jobs/benchmarks/protocol.sh does), then archive"
        )
    missing = [c for c in columns if c not in run.data]
    if missing:
        raise UsageError(f"{str(run.path)!r} does not record {', '.join(missing)}; it is not a run of this task")
    last = int(run.data["iteration"][-1]) if "iteration" in run.data and len(run.data["iteration"]) else -1
    planned = run.config.get("algorithm.outer_iterations")
    info = run.attrs.get("columns", {})
    return {
        "file": run.path.name,
        "algorithm": str(run.config.get("algorithm.name")),
        "seed": run.config.get("seed"),
        "config_digest": _digest(config_json),
        "config_json": config_json,
        "mpi_size": int(run.attrs["mpi_size"]) if "mpi_size" in run.attrs else None,
        "problem": str(run.attrs.get("problem", run.config.get("problem.name", "?"))),
        "primary_metric": run.attrs.get("primary_metric"),
        "status": "finished" if planned is None or last >= int(planned) else "stopped",
        "iterations": last,
        "outer_iterations": planned,
        "columns": {c: info[c] for c in columns if c in info},
        "dtypes": {c: np.asarray(run.data[c]).dtype.str for c in columns},
        "data": {c: np.asarray(run.data[c]).tolist() for c in columns},
        "numerics": run.attrs.get("numerics"),
        "git_commit": run.attrs.get("git_commit"),
    }


def _line(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def _header(task: str, metric: str) -> dict:
    return {"format": FORMAT, "version": VERSION, "task": task, "metric": metric}


def records_text(task: str, metric: str, records: Iterable[dict]) -> bytes:
    """The bytes of a records file: the header line and one line per record, in file-name order, gzipped
    without a time stamp or a name in the gzip header (the same records give the same bytes)."""
    lines = [_header(task, metric), *sorted(records, key=lambda r: r["file"])]
    text = "".join(_line(line) + "\n" for line in lines)
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as f:
        f.write(text.encode())
    return buffer.getvalue()


def _load(path: Path) -> tuple[dict, list[dict]]:
    """(header, records) of a records file; UsageError naming the file when it is not one."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{str(path)!r} is not a readable benchmark records file ({exc})") from None
    if not lines or lines[0].get("format") != FORMAT:
        raise UsageError(f"{str(path)!r} is not a benchmark records file (no {FORMAT!r} header line)")
    if lines[0].get("version") != VERSION:
        raise UsageError(
            f"{str(path)!r} holds benchmark records of version {lines[0].get('version')}; this fednest-mpi reads "
            f"version {VERSION}"
        )
    for record in lines[1:]:
        if record.get("config_digest") != _digest(record.get("config_json", "")):
            raise UsageError(
                f"{str(path)!r}: the record of {record.get('file')!r} does not match its config digest (edited or "
                "damaged); archive it again from its run file or remove it"
            )
    return lines[0], lines[1:]


def write_records(path: str | Path, task: str, metric: str, records: Iterable[dict]) -> tuple[int, int, bool]:
    """Add ``records`` to the records file ``path`` (task ``task``, metric ``metric``): a record replaces the one
    of the same file name, the others are kept (their run files may be gone). Returns (records in the file,
    records new or changed, whether the file was written)."""
    path = Path(path)
    old: dict[str, dict] = {}
    if path.exists():
        header, kept = _load(path)
        if (header.get("task"), header.get("metric")) != (task, metric):
            raise UsageError(
                f"{str(path)!r} holds records of task {header.get('task')!r} (metric {header.get('metric')!r}), "
                f"not of {task!r} ({metric!r}); give each task its own folder"
            )
        old = {r["file"]: r for r in kept}
    new = {r["file"]: r for r in records}
    changed = sum(name not in old or _line(old[name]) != _line(r) for name, r in new.items())
    data = records_text(task, metric, {**old, **new}.values())
    if path.exists() and path.read_bytes() == data:
        return len({**old, **new}), 0, False
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(path, data)
    return len({**old, **new}), changed, True


def _run(record: dict, runs: Path) -> Run:
    """A record as the :class:`Run` its run file would give the benchmark table (path: the absent run file)."""
    config = json.loads(record["config_json"])
    attrs: dict = {
        "config_json": record["config_json"],
        "config": config,
        "columns": record.get("columns", {}),
        "problem": record.get("problem"),
        "seed": record.get("seed"),
        "record": True,
    }
    for key in ("numerics", "git_commit"):
        if record.get(key) is not None:
            attrs[key] = record[key]
    if record.get("primary_metric") is not None:
        attrs["primary_metric"] = record["primary_metric"]
    flat = run_config(config)
    if record.get("mpi_size") is not None:
        attrs["mpi_size"] = record["mpi_size"]
        flat.setdefault("mpi_size", int(record["mpi_size"]))
    dtypes = record.get("dtypes", {})
    data = {c: np.asarray(v, dtype=np.dtype(dtypes.get(c, "<f8"))) for c, v in record["data"].items()}
    path = runs / record["file"]
    return Run(path=path, name=path.stem, attrs=attrs, config=flat, data=data)


def read_records(folder: str | Path, runs: str | Path, task: str | None = None) -> list[Run]:
    """The records of every ``*.jsonl.gz`` file in ``folder`` (none if it does not exist) as :class:`Run`
    objects, each with the path its run file would have in ``runs``, in file-name order. With ``task``, a
    file of another task is a UsageError."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    out: list[Run] = []
    for path in sorted(folder.glob("*" + SUFFIX)):
        header, records = _load(path)
        if task is not None and header.get("task") != task:
            raise UsageError(f"{str(path)!r} holds records of task {header.get('task')!r}, not of {task!r}")
        out.extend(_run(r, Path(runs)) for r in records)
    return sorted(out, key=lambda r: r.path.name)
