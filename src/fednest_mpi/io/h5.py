"""The only module that touches HDF5: run-file schema, streaming writer and reader.

Schema ``fednest-mpi/run`` version :data:`SCHEMA_VERSION` (documented in ``docs/hdf5.md``)::

    /                      attrs: format, schema_version, package_version, git_commit, created_utc,
                                  hostname, mpi_size, seed, problem, algorithm, config_json,
                                  resumes (JSON; only in a run continued with --resume)
    /iterations/<column>   1-D, extendable, chunked; one entry per completed outer iteration
                           (entry 0 is the initial point); attrs: description, units.
                           /iterations/iteration is the dimension scale of all the others.

Written by rank 0 only (the values are already identical on every rank), in SWMR mode: every
completed iteration is flushed, and a reader may open the file with ``swmr=True`` while the run
goes on.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import h5py
import numpy as np

from fednest_mpi import __version__, atomic, failure, lock
from fednest_mpi.errors import UsageError
from fednest_mpi.io.safe import open_checked, reading
from fednest_mpi.io.schema import (  # names live in one module
    COLUMN_INFO,
    FORMAT,
    GROUP,
    HIGHER_IS_BETTER,
    RANKS,
    SCALE,
    SCHEMA_VERSION,
    SNAPSHOT_SCALE,
    SNAPSHOTS,
    STOPPED,
)
from fednest_mpi.pathkind import not_a_file

_CHUNK = 256


def git_commit() -> str:
    """The source tree's commit, or '' when not run from a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


MIN_FREE_BYTES = 1 << 20  # a file system with less free space is refused before the run starts


def check_directory(path: str | Path, field: str, min_free: int = MIN_FREE_BYTES) -> None:
    """Refuse a folder ``path`` (or its nearest existing parent, where it would be created) that
    is not a writable folder or has less than ``min_free`` bytes free. No I/O beyond stat."""
    existing = Path(path) if str(path) else Path(".")
    while not os.path.exists(existing) and existing != existing.parent:
        if os.path.lexists(existing):  # a link to nothing or a loop: no folder can be made or used there
            raise UsageError(
                f"{field}: {str(existing)!r} {not_a_file(existing)}; make it a folder, or choose another path"
            )
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{field}: {str(existing)!r} is a file, not a folder; choose another path")
    kind = _pseudo_file_system(existing)
    if kind:
        raise UsageError(
            f"{field}: {str(existing)!r} is on the kernel's {kind} file system, which holds no files; "
            "choose a folder on a disk"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{field}: directory {str(existing)!r} is not writable; choose a path you can write to")
    free = shutil.disk_usage(existing).free
    if free < min_free:
        raise UsageError(
            f"{field}: the file system of {str(existing)!r} is full ({free} bytes free, at least {min_free} "
            "needed); free some space or choose another path"
        )


_PSEUDO = frozenset(
    {
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "devpts",
        "debugfs",
        "tracefs",
        "securityfs",
        "pstore",
        "bpf",
        "configfs",
        "efivarfs",
        "fusectl",
        "mqueue",
        "binfmt_misc",
    }
)


def _pseudo_file_system(folder: Path) -> str:
    """The type of the kernel pseudo file system (proc, sysfs, ...) ``folder`` is on, or ''."""
    real = os.path.realpath(folder)
    best, kind = "", ""
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) >= 3:
                    point = parts[1].replace("\\040", " ")
                    inside = real == point or real.startswith(point.rstrip("/") + "/")
                    if inside and len(point) >= len(best):
                        best, kind = point, parts[2]
    except OSError:
        top = Path(real).parts[1] if len(Path(real).parts) > 1 else ""
        return {"proc": "proc", "sys": "sysfs"}.get(top, "")
    return kind if kind in _PSEUDO else ""


def derived_paths(output: str | Path, checkpoint_dir: str | Path | None = None) -> dict[str, Path]:
    """Every path a run writing ``output`` makes from it (what each is -> the path; a temporary name
    stands for all of its kind), ``checkpoint_dir`` defaulting to the output with ``.ckpt`` appended."""
    from fednest_mpi.io.schema import client_dir

    folder = Path(checkpoint_dir) if checkpoint_dir else Path(str(output) + ".ckpt")
    return {
        "the output": Path(output),
        "its lock file": lock.lock_path(output),
        "its temporary file": atomic.temp_name(output),
        "its failure folder": failure.folder_of(output),
        "its client-file folder": client_dir(output),
        "its checkpoint folder": folder,
        "the checkpoint folder's lock file": lock.lock_path(folder),
    }


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system of ``folder`` (or its nearest existing parent) takes."""
    while not os.path.exists(folder) and folder != folder.parent:  # os.path.exists: never raises
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _check_names_a_file(output: str | Path) -> None:
    """Refuse an output path that is empty or whose last part names a folder whatever exists ('.', '..', a
    trailing '/'): pathlib would read '' and './' as '.', and 'x/..' would be renamed onto a folder at the end."""
    raw = os.fspath(output)
    if raw == "":
        raise UsageError("run.output: the path is empty; give the path of a file, such as 'runs/run.h5'")
    if os.path.basename(raw) in ("", ".", ".."):
        raise UsageError(
            f"run.output: {raw!r} is a folder; give the path of a file, such as {os.path.join(raw, 'run.h5')!r}"
        )


def _path_max() -> int:
    """The longest path (bytes, with its final NUL) the kernel takes in one call (PATH_MAX)."""
    try:
        return os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        return 4096


#: the longest name (with its '/') a run makes inside each of its folders: a checkpoint's client file being written,
#: a client file being written, a rank's traceback log
INNER_NAMES = {
    "its checkpoint folder": len("/.clients-k000000000-r00000.pt.0123456789ab.tmp"),
    "its client-file folder": len("/.rank00000.h5.0123456789ab.partial"),
    "its failure folder": len("/traceback-rank00000.log"),
}


def _check_path_lengths(field: str, what: str, p: Path) -> None:
    """Refuse a path the kernel refuses whatever exists (ENAMETOOLONG): a folder name over NAME_MAX bytes, or
    the whole path (as given, which is what the run passes to the kernel; for a folder, with the longest name the
    run makes in it) of PATH_MAX bytes or more."""
    limit = _name_max(p.parent)
    for part in p.parent.parts:
        size = len(os.fsencode(part))
        if size > limit:
            raise UsageError(
                f"{field}: the folder name {part[:40]!r}... in {what} is {size} bytes long, over the "
                f"{limit} bytes a file name may have; shorten it"
            )
    size, limit = len(os.fsencode(p)), _path_max()
    inside = INNER_NAMES.get(what, 0)
    if size + inside >= limit:
        files = f" (and {inside} bytes more for the files in it)" if inside else ""
        raise UsageError(
            f"{field}: {what} would be a path of {size} bytes{files}, over the {limit - 1} bytes a "
            f"path may have; choose a shorter path (by at least {size + inside - limit + 1} bytes)"
        )


def check_names(output: str | Path, checkpoint_dir: str | Path | None = None) -> None:
    """Refuse an output path whose bytes or derived names (:func:`derived_paths`) the file system cannot
    take -- a NUL byte, a character with no bytes (a lone surrogate), a name over NAME_MAX bytes, a path over
    PATH_MAX, two of them the same path (an output named ``x.clients`` would be its own client-file folder) --
    so that a run never fails on them after it started. No I/O beyond stat."""
    _check_names_a_file(output)
    over = []  # (bytes over the limit, field, what, path, its name's bytes, the limit)
    seen: dict[str, str] = {}  # absolute path -> what it is
    for what, p in derived_paths(output, checkpoint_dir).items():
        field = "run.checkpoint_dir" if "checkpoint" in what and checkpoint_dir else "run.output"
        if "\0" in str(p):
            raise UsageError(f"{field}: {str(p)!r} holds a NUL byte; give a path without it")
        try:
            name = os.fsencode(p.name)
            os.fsencode(p)
        except UnicodeEncodeError as exc:
            raise UsageError(
                f"{field}: {str(p)!r} holds {exc.object[exc.start : exc.end]!r}, a character no file name can hold "
                "(a lone surrogate, e.g. from a JSON escape); give the path as it is on disk"
            ) from None
        _check_path_lengths(field, what, p)
        same = seen.setdefault(os.path.normpath(os.path.abspath(p)), what)
        if same != what:
            raise UsageError(
                f"{field}: {str(p)!r} would be both {same} and {what}; choose another name (a run file's name "
                "should end in .h5)"
            )
        limit = _name_max(p.parent)
        if len(name) > limit:
            over.append((len(name) - limit, field, what, p, len(name), limit))
    if over:  # the worst one: shortening by its excess fits every name
        excess, field, what, p, size, limit = max(over, key=lambda item: item[0])
        raise UsageError(
            f"{field}: {what} would be named {p.name[:40]!r}... ({size} bytes), over the {limit} bytes a file "
            f"name may have here; shorten the last name of {field} by at least {excess} bytes"
        )


def check_output_path(path: str | Path, overwrite: bool) -> None:
    """Refuse a path whose derived names cannot exist (:func:`check_names`), an existing output unless
    ``overwrite``, an unwritable or full directory. No I/O beyond stat."""
    p = Path(path)
    check_names(path)
    if p.is_dir():
        raise UsageError(
            f"run.output: {str(path)!r} is a folder; give the path of a file, such as {str(p / 'run.h5')!r}"
        )
    if p.is_symlink() or (p.exists() and not p.is_file()):
        what = "a symbolic link" if p.is_symlink() else "not a regular file (a device, FIFO or socket)"
        raise UsageError(
            f"run.output: {str(p)!r} is {what}, which a run never replaces; give the path of a regular file"
        )
    if p.exists() and not overwrite:
        raise UsageError(
            f"run.output: {str(p)!r} already exists; choose another path or pass --overwrite (run.overwrite = true), "
            "or continue it from its checkpoint with --resume"
        )
    check_directory(p.parent, "run.output")


def row_digests(columns, rows: range) -> list[int]:
    """A 64-bit BLAKE2b digest of each row ``rows`` of /iterations, over every column (by name) as
    stored (int64 or float64 bytes): what a checkpoint records of the rows it covers, so that a row
    changed since is found at ``--resume`` (:func:`check_resumable_output`)."""
    names = sorted(columns)
    out = []
    for i in rows:
        h = hashlib.blake2b(digest_size=8)
        for name in names:
            h.update(name.encode() + b"\0" + np.ascontiguousarray(columns[name][i : i + 1]).tobytes())
        out.append(int.from_bytes(h.digest(), "little", signed=True))
    return out


#: file attributes of the run's record in an experiment tracker (:mod:`fednest_mpi.writers`): the id of its
#: MLflow run, which a resume reopens; the value a resume writes replaces the one the file held (a run that
#: could not be reopened is a new one)
TRACKING_ATTRS = frozenset({"mlflow_run_id"})
#: file attributes that change without a checkpoint: a resume appends to ``resumes`` (and may be stopped before
#: its first checkpoint), ``fednest-mpi recover`` adds its record, a resume may record another tracking run
_UNCHECKED_ATTRS = frozenset({"resumes", "recovered", STOPPED}) | TRACKING_ATTRS


def mark_stopped(path: str | Path, by: str, iteration: int) -> None:
    """Record in the closed run file ``path`` that its run was stopped by ``by`` (a signal) after ``iteration``,
    before its last one: a reader then knows the file as an interrupted run, to be continued with ``--resume``,
    not a result that ended there (a diverged run also ends early, and is one): the attribute ``stopped``, JSON
    ``{"by": SIGNAL, "iteration": K, "utc": TIME}``, which the resume that continues the run drops. Rank 0, holding
    the output's lock."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with h5py.File(path, "r+") as f:
        f.attrs[STOPPED] = json.dumps({"by": by, "iteration": int(iteration), "utc": now})


def stored_attributes(path: str | Path, names) -> dict[str, str]:
    """The attributes ``names`` that the run file ``path`` holds (text; those it lacks left out): what a resume
    gives the writers of :mod:`fednest_mpi.writers` (:data:`TRACKING_ATTRS`) before it rewrites the file."""
    p = Path(path)
    with open_run(p, unclosed="read") as f, reading(p, "run file"):
        return {name: _text(f.attrs[name]) for name in names if name in f.attrs}


def attr_digests(attrs) -> dict[str, int]:
    """A 64-bit BLAKE2b digest of each file attribute of a run file (its name -> digest; the value's dtype and
    bytes as stored; not ``resumes`` and ``recovered``, nor the parts :func:`read_run` adds; bytes decoded as it
    does): what a checkpoint records of the file's attributes, so that one changed since is found at ``--resume``."""
    out = {}
    for name, value in attrs.items():
        if name in _UNCHECKED_ATTRS or name in ("config", COLUMN_INFO):
            continue
        stored = np.asarray(value.decode() if isinstance(value, bytes) else value)
        h = hashlib.blake2b(digest_size=8)
        h.update(stored.dtype.str.encode() + b"\0" + stored.tobytes())
        out[str(name)] = int.from_bytes(h.digest(), "little", signed=True)
    return out


def _changed_attribute(path: Path, attrs: dict, recorded: dict) -> str | None:
    """The line refusing a resume into ``path`` whose attributes ``attrs`` differ from the ``recorded``
    :func:`attr_digests`, or None (also when nothing was recorded: a checkpoint written before them)."""
    if not recorded:
        return None
    found = attr_digests(attrs)
    changed = sorted(name for name in found.keys() | recorded.keys() if found.get(name) != recorded.get(name))
    if not changed:
        return None
    name = changed[0]
    how = "removed" if name not in found else "added" if name not in recorded else "changed"
    more = f" (and {len(changed) - 1} more attribute(s))" if len(changed) > 1 else ""
    return (
        f"--resume: the attribute {name!r} of {str(path)!r}{more} was {how} since the checkpoint recorded it; "
        "restore the file, or recompute it: the same command with --overwrite in place of --resume"
    )


def _check_row_digests(p: Path, data: dict, rows: int, digests) -> None:
    """Refuse rows of /iterations in ``data`` (of the file ``p``) whose :func:`row_digests` differ from the
    ``digests`` a checkpoint recorded, naming the first."""
    recorded = [int(d) for d in digests]
    found = row_digests(data, range(min(len(recorded), rows)))
    changed = [i for i, (a, b) in enumerate(zip(found, recorded)) if a != b]
    if changed:
        more = f" (and {len(changed) - 1} more row(s))" if len(changed) > 1 else ""
        raise UsageError(
            f"--resume: row {changed[0]} of /{GROUP} in {str(p)!r} (iteration {int(data[SCALE][changed[0]])}){more} "
            "was changed since the checkpoint recorded it; restore the file, or recompute it: the same command with "
            "--overwrite in place of --resume (the checkpoint holds digests of the rows, not the rows)"
        )


def _check_main_digests(p: Path, rows: int, main) -> None:
    """Refuse /ranks and /snapshots of the run file ``p`` whose first ``rows`` iterations differ from the
    digests ``main`` a checkpoint recorded (:func:`fednest_mpi.io.clients.main_digests`; empty: not checked)."""
    from fednest_mpi.io.clients import main_digests  # clients imports this module

    recorded = np.asarray(main, dtype=np.int64).view(np.uint64)[:rows]
    if not recorded.size:
        return
    with open_run(p, "read") as f, reading(p, "run file"):
        found = main_digests(f, recorded.size)
    changed = np.flatnonzero(found != recorded)
    if changed.size:
        raise UsageError(
            f"--resume: iteration {int(changed[0])} of /{RANKS} or /{SNAPSHOTS} in {str(p)!r} was changed since the "
            "checkpoint recorded it; restore the file, or recompute it: the same command with --overwrite in place "
            "of --resume"
        )


def check_resumable_output(path: str | Path, rows: int, digests=(), attributes=None, series=(), main=()) -> None:
    """Refuse to resume into ``path`` unless it is a readable run file holding at least ``rows``
    iterations, whose first rows have the ``digests`` a checkpoint recorded (:func:`row_digests`) and
    whose attributes the digests ``attributes`` (:func:`attr_digests`; None or empty: not checked),
    with every per-rank client file it refers to (see :func:`fednest_mpi.io.clients.check_client_files`),
    whose per-client series have the digests ``series`` (:func:`fednest_mpi.io.clients.column_digests`) and its
    /ranks and /snapshots the digests ``main`` (:func:`fednest_mpi.io.clients.main_digests`)."""
    from fednest_mpi.io.clients import check_client_files, check_series_digests  # clients imports this module

    p = Path(path)
    if (p.exists() or p.is_symlink()) and not p.is_file():
        raise UsageError(
            f"--resume: the output {str(p)!r} of the checkpointed run is not a regular file (a FIFO, device, "
            "folder or dangling link); restore the run file or run without --resume to start again"
        )
    if not p.is_file():
        raise UsageError(
            f"--resume: the output file {str(p)!r} of the checkpointed run does not exist; "
            "run without --resume to start again"
        )
    attrs, data = read_run(p, unclosed="read")
    if len(data.get(SCALE, ())) < rows:
        raise UsageError(
            f"--resume: {str(p)!r} holds {len(data.get(SCALE, ()))} iterations, fewer than the {rows} of the "
            "checkpoint (rows deleted, or another run's file); restore the file, or start again: the same command "
            "with --overwrite in place of --resume"
        )
    _check_row_digests(p, data, rows, digests)
    changed_attribute = _changed_attribute(p, attrs, dict(attributes or {}))
    if changed_attribute:
        raise UsageError(changed_attribute)
    _check_main_digests(p, rows, main)
    files = check_client_files(p, rows, unclosed="read", what="--resume: ")
    try:
        check_series_digests(p, files, rows, series)
    finally:
        for _, g in files:
            g.close()
    check_directory(p.parent, "run.output")


def _write_attrs(f, attrs: dict, now: str, kept_attrs: dict, keep_rows: int | None, recovered: dict | None) -> None:
    """The run file's attributes: the format's (version, commit, host, time ``now``), the caller's ``attrs``,
    and on a rewrite (``keep_rows``) those kept from the old file, its list of resumes with this one appended
    (a recovery instead: the attribute ``recovered``, the record ``recovered`` with its time)."""
    f.attrs.update(
        {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "package_version": __version__,
            "git_commit": git_commit(),
            "created_utc": now,
            "hostname": socket.gethostname(),
        }
    )
    f.attrs.update(attrs)
    if keep_rows is None:
        return
    resumes = json.loads(kept_attrs.pop("resumes", "[]"))
    if recovered is None:  # a resume: the run goes on, no longer a stopped one (a recovered file stays as it was)
        kept_attrs.pop(STOPPED, None)
    for name in TRACKING_ATTRS & attrs.keys():  # the resume's record in the tracker, not the file's old one
        kept_attrs.pop(name, None)
    if recovered is None:
        resumes.append({"iteration": keep_rows - 1, "mpi_size": attrs.get("mpi_size"), "utc": now})
    f.attrs.update(kept_attrs)
    if resumes:
        f.attrs["resumes"] = json.dumps(resumes)
    if recovered is not None:
        f.attrs["recovered"] = json.dumps({**recovered, "utc": now})


def _create_columns(group, columns: dict[str, tuple], kept: dict, keep_rows: int | None) -> None:
    """One growing, checksummed dataset per column of ``columns`` (name -> (description, units[,
    higher_is_better])) in ``group``, holding the ``keep_rows`` rows ``kept`` of a rewritten file."""
    for name, (description, units, *direction) in columns.items():  # direction: [higher_is_better] or []
        dtype = np.int64 if name == SCALE else np.float64
        d = group.create_dataset(name, shape=(0,), maxshape=(None,), chunks=(_CHUNK,), dtype=dtype, fletcher32=True)
        d.attrs["description"] = description
        d.attrs["units"] = units
        if direction:  # declared by the problem (BilevelProblem.metric_info)
            d.attrs[HIGHER_IS_BETTER] = bool(direction[0])
        if name in kept:
            d.resize((keep_rows,))
            d[:] = kept[name]


class RunWriter:
    """Streams one row per outer iteration to ``path`` (rank 0 only).

    Parameters
    ----------
    path : output file; its directory is created.
    attrs : file attributes (config, seed, ...), added to the fixed provenance attributes.
    columns : name -> (description, units) for every per-iteration column, ``iteration`` first.
    keep_rows : resume an existing run file at ``path``: the new file keeps its attributes and the
        first ``keep_rows`` entries of every column (a checkpoint's iterations; later ones are
        dropped), records the resume in the ``resumes`` attribute (JSON list of iteration,
        mpi_size, time) and is then appended to. The old file is replaced only once the new one is
        complete, so a crash meanwhile leaves it as it was.
    extend : callable given the open file before it switches to SWMR mode (the last moment new
        groups may be created): :meth:`fednest_mpi.io.clients.SeriesLayout.create` adds the 2-D groups.
    recovered : with ``keep_rows``, rebuild the file for ``fednest-mpi recover``
        (:mod:`fednest_mpi.io.recover`): this dict is stored as the JSON attribute ``recovered``
        instead of a ``resumes`` entry.
    """

    def __init__(
        self,
        path: str | Path,
        attrs: dict,
        columns: dict[str, tuple],
        keep_rows: int | None = None,
        extend=None,
        recovered: dict | None = None,
    ):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = atomic.temp_name(path)  # unique, created exclusively below: never through a planted link
        self.path = path
        # one writer per file: the command line took the lock already; a writer made directly takes its own
        self._lock = None
        if not lock.held_here(path):
            self._lock = lock.acquire(path, "run.output", take_stale=keep_rows is not None)
        try:
            kept_attrs, kept = _read_head(path, keep_rows, columns) if keep_rows is not None else ({}, {})
        except BaseException:
            self.release()
            raise
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.file = h5py.File(tmp, "x", libver="latest")
        try:
            self._build(tmp, attrs, now, kept_attrs, kept, columns, keep_rows, extend, recovered)
        except BaseException:  # the half-built file goes, the old one (a resume's) stays as it was
            self.file.close()
            tmp.unlink(missing_ok=True)
            self.release()
            raise
        self._identity = file_identity(path)

    def _build(self, tmp: Path, attrs, now, kept_attrs, kept, columns, keep_rows, extend, recovered) -> None:
        """Write the new file's structure at ``tmp`` and rename it to :attr:`path` once it is complete."""
        f = self.file
        _write_attrs(f, attrs, now, kept_attrs, keep_rows, recovered)
        self.attr_digests = attr_digests(dict(f.attrs))  # what a checkpoint records of them
        group = f.create_group(GROUP)
        self.columns = list(columns)
        _create_columns(group, columns, kept, keep_rows)
        self._digests = row_digests({name: group[name][:] for name in self.columns}, range(keep_rows or 0))
        self._main_digests: list[int] = []  # main_digests of iterations 0, 1, ... already read back
        group[SCALE].make_scale(SCALE)
        for name in self.columns:
            if name != SCALE:
                group[name].dims[0].attach_scale(group[SCALE])
        if extend is not None:  # more groups (fednest_mpi.io.clients), while the file may still change structure
            extend(f)
        f.swmr_mode = True
        # the file appears under its name only once its structure is complete and readers may open it
        os.replace(tmp, self.path)

    def lost(self) -> str | None:
        """Why the file under :attr:`path` is no longer the one being written (deleted, replaced), or None."""
        return lost_file(self.path, self._identity)

    def append(self, row: dict[str, float]) -> None:
        """Add one iteration's values (missing columns are NaN) and flush."""
        with failure.guard():
            self._append(row)

    def row_digests(self, rows: int) -> list[int]:
        """The :func:`row_digests` of the first ``rows`` rows written (a checkpoint's record of them)."""
        return self._digests[:rows]

    def main_digests(self, rows: int):
        """:func:`fednest_mpi.io.clients.main_digests` of the first ``rows`` iterations of this file's /ranks and
        /snapshots (what a checkpoint records of them): the iterations not digested at an earlier checkpoint are
        read back, each once (they are written once)."""
        from fednest_mpi.io.clients import main_digests  # clients imports this module

        done = len(self._main_digests)
        if rows > done:
            self._main_digests += main_digests(self.file, rows, done).tolist()
        return np.asarray(self._main_digests[:rows], dtype=np.uint64)

    def _append(self, row: dict[str, float]) -> None:
        group = self.file[GROUP]
        stored = {name: np.asarray([row.get(name, np.nan)], dtype=group[name].dtype) for name in self.columns}
        # the scale is extended last, so a concurrent reader never sees an iteration without its values
        for name in [c for c in self.columns if c != SCALE] + [SCALE]:
            d = group[name]
            n = d.shape[0]
            d.resize((n + 1,))
            d[n] = stored[name][0]
        self._digests += row_digests(stored, range(1))
        for name in self.columns:
            group[name].flush()
        self.file.flush()

    def close(self) -> int | None:
        """Close the file, first cutting every part to the rows of /iterations (:meth:`cut`); the rows kept."""
        rows = None
        if self.file.id.valid:
            try:
                rows = self.cut()
            finally:
                self.file.close()
        self.release()
        return rows

    def cut(self) -> int:
        """Cut every column, ``/ranks`` and ``/snapshots`` to the iterations of ``/iterations/iteration``
        (a failure may have left a row half written); the number of rows. Nothing changes when they agree."""
        f = self.file
        n = f[GROUP][SCALE].shape[0]
        for name in self.columns:
            if f[GROUP][name].shape[0] > n:
                f[GROUP][name].resize((n,))
        for d in f[RANKS].values() if RANKS in f else ():
            if d.ndim == 2 and d.shape[1] > n:
                d.resize((d.shape[0], n))
        if SNAPSHOTS in f:
            keep = int(np.searchsorted(f[SNAPSHOTS][SNAPSHOT_SCALE][:], n))
            for d in f[SNAPSHOTS].values():
                if d.shape[0] > keep:
                    d.resize((keep,) + d.shape[1:])
        return n

    def release(self) -> None:
        """Remove the lock this writer took itself (none when the command line holds it)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def file_identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def lost_file(path: Path, identity: tuple[int, int]) -> str | None:
    """Why ``path`` is no longer the file of ``identity`` (device, inode): deleted or replaced; None if it is."""
    try:
        now = file_identity(path)
    except FileNotFoundError:
        return f"{str(path)!r} was deleted while the run wrote it"
    except OSError as exc:
        return f"{str(path)!r} can no longer be reached ({exc.strerror or exc})"
    return None if now == identity else f"{str(path)!r} was replaced by another file while the run wrote it"


RECOVER_HINT = (
    "; the run was killed or failed before closing it: run `fednest-mpi recover {path}` to close it at its "
    "last complete iteration"
)


def unclosed_policy(path: str | Path, unclosed: str) -> str:
    """ "read" or "refuse" for a run file that its writer has not closed: ``unclosed`` = "live" reads
    it only while a run holds its lock (:mod:`fednest_mpi.lock`), i.e. while it is being written."""
    if unclosed != "live":
        return unclosed
    held = lock.holder(path)
    return "read" if held is not None and held.state != "stale" else "refuse"


def open_run(path: str | Path, unclosed: str = "live") -> h5py.File:
    """The run file ``path``, open for reading after :func:`fednest_mpi.io.safe.open_checked`.

    ``unclosed``: "live" (default: a file not closed by its writer is read only while the run
    writing it holds its lock; else UsageError naming ``fednest-mpi recover``), "read" (read it
    in any case: resume, recover) or "refuse"."""
    p = Path(path)
    what = not_a_file(p)  # also a name too long, a link loop: stat() raised those
    if what is not None:
        raise UsageError(f"{str(p)!r} {what}; pass the path of a run file written by `fednest-mpi run`")
    f, _ = open_checked(p, "run file", unclosed_policy(p, unclosed), RECOVER_HINT.format(path=shlex.quote(str(p))))
    return f


def read_run(path: str | Path, unclosed: str = "live") -> tuple[dict, dict[str, np.ndarray]]:
    """(attributes, {column: array}) of a run file; works on a file that is still being written.

    Every column is cut to the iterations present in all of them. A damaged, truncated or unclosed
    file (see :func:`open_run` for ``unclosed``) raises UsageError naming it, at once."""
    p = Path(path)
    f = open_run(p, unclosed)
    with f, reading(p, "run file"):
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        if attrs.get("format") != FORMAT:
            raise UsageError(f"{str(p)!r} is not a fednest-mpi run file (format attribute {attrs.get('format')!r})")
        if int(attrs.get("schema_version", -1)) != SCHEMA_VERSION:
            raise UsageError(
                f"{str(p)!r} has schema version {attrs.get('schema_version')}, "
                f"this fednest-mpi {__version__} reads version "
                f"{SCHEMA_VERSION}; read it with the fednest-mpi version named in its package_version attribute"
            )
        if GROUP not in f or SCALE not in f[GROUP]:
            raise UsageError(f"run file {str(p)!r} is damaged: it has no /{GROUP}/{SCALE}")
        group = f[GROUP]
        n = min(group[name].shape[0] for name in group)
        data = {name: group[name][:n] for name in group}
        attrs[COLUMN_INFO] = {name: column_info(group[name].attrs) for name in group}
        attrs["config"] = json.loads(attrs.get("config_json", "{}"))
    return attrs, data


def column_info(attrs) -> dict:
    """{description, units[, higher_is_better]} of a column from its HDF5 attributes."""
    info: dict[str, str | bool] = {key: _text(attrs.get(key, "")) for key in ("description", "units")}
    if HIGHER_IS_BETTER in attrs:
        info[HIGHER_IS_BETTER] = bool(attrs[HIGHER_IS_BETTER])
    return info


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_head(path: Path, rows: int, columns) -> tuple[dict, dict[str, np.ndarray]]:
    """(attributes, {column: first ``rows`` entries}) of an existing run file with the same columns."""
    attrs, data = read_run(path, unclosed="read")
    attrs.pop("config")
    attrs.pop(COLUMN_INFO)
    if set(data) != set(columns):
        raise UsageError(
            f"--resume: {str(path)!r} has the columns {sorted(data)}, this run records {sorted(columns)}; "
            "it was written by another fednest-mpi version or problem; start again: the same command with "
            "--overwrite in place of --resume"
        )
    if len(data[SCALE]) < rows:
        raise UsageError(
            f"--resume: {str(path)!r} holds {len(data[SCALE])} iterations, fewer than the checkpoint's {rows}"
        )
    return attrs, {name: values[:rows] for name, values in data.items()}
