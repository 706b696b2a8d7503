"""The only module that touches HDF5: run-file schema, streaming writer and reader.

Schema ``fednest-mpi/run`` version :data:`SCHEMA_VERSION` (documented in ``docs/hdf5.md``)::

    /                      attrs: format, schema_version, package_version, git_commit, created_utc,
                                  hostname, mpi_size, seed, problem, algorithm, config_json
    /iterations/<column>   1-D, extendable, chunked; one entry per completed outer iteration
                           (entry 0 is the initial point); attrs: description, units.
                           /iterations/iteration is the dimension scale of all the others.

Written by rank 0 only (the values are already identical on every rank), in SWMR mode: every
completed iteration is flushed, and a reader may open the file with ``swmr=True`` while the run
goes on.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
from pathlib import Path

import h5py
import numpy as np

from fednest_mpi import __version__
from fednest_mpi.errors import UsageError

FORMAT = "fednest-mpi/run"
SCHEMA_VERSION = 1
GROUP = "iterations"
SCALE = "iteration"
_CHUNK = 256


def git_commit() -> str:
    """The source tree's commit, or '' when not run from a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def check_output_path(path: str | Path, overwrite: bool) -> None:
    """Refuse an existing output unless ``overwrite``; refuse an unwritable directory. No I/O beyond stat."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise UsageError(f"run.output: {str(p)!r} already exists; choose another path or pass --overwrite (run.overwrite = true)")
    parent = p.parent if str(p.parent) else Path(".")
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not os.access(existing, os.W_OK):
        raise UsageError(f"run.output: directory {str(existing)!r} is not writable; choose an output path you can write to")


class RunWriter:
    """Streams one row per outer iteration to ``path`` (rank 0 only).

    Parameters
    ----------
    path : output file; its directory is created.
    attrs : file attributes (config, seed, ...), added to the fixed provenance attributes.
    columns : name -> (description, units) for every per-iteration column, ``iteration`` first.
    """

    def __init__(self, path: str | Path, attrs: dict, columns: dict[str, tuple[str, str]]):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        self.path = path
        self.file = h5py.File(tmp, "w", libver="latest")
        f = self.file
        f.attrs.update(
            {
                "format": FORMAT,
                "schema_version": SCHEMA_VERSION,
                "package_version": __version__,
                "git_commit": git_commit(),
                "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "hostname": socket.gethostname(),
            }
        )
        f.attrs.update(attrs)
        group = f.create_group(GROUP)
        self.columns = list(columns)
        for name, (description, units) in columns.items():
            dtype = np.int64 if name == SCALE else np.float64
            d = group.create_dataset(name, shape=(0,), maxshape=(None,), chunks=(_CHUNK,), dtype=dtype)
            d.attrs["description"] = description
            d.attrs["units"] = units
        group[SCALE].make_scale(SCALE)
        for name in self.columns:
            if name != SCALE:
                group[name].dims[0].attach_scale(group[SCALE])
        f.swmr_mode = True
        # the file appears under its name only once its structure is complete and readers may open it
        os.replace(tmp, path)

    def append(self, row: dict[str, float]) -> None:
        """Add one iteration's values (missing columns are NaN) and flush."""
        group = self.file[GROUP]
        # the scale is extended last, so a concurrent reader never sees an iteration without its values
        for name in [c for c in self.columns if c != SCALE] + [SCALE]:
            d = group[name]
            n = d.shape[0]
            d.resize((n + 1,))
            d[n] = row.get(name, np.nan)
        for name in self.columns:
            group[name].flush()
        self.file.flush()

    def close(self) -> None:
        if self.file.id.valid:
            self.file.close()


def read_run(path: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(attributes, {column: array}) of a run file; works on a file that is still being written."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{str(p)!r} does not exist; pass the path of a run file written by `fednest-mpi run`")
    try:
        f = h5py.File(p, "r", libver="latest", swmr=True)
    except OSError as exc:
        raise UsageError(f"{str(p)!r} is not a readable HDF5 file ({exc})") from None
    with f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        if attrs.get("format") != FORMAT:
            raise UsageError(f"{str(p)!r} is not a fednest-mpi run file (format attribute {attrs.get('format')!r})")
        if int(attrs.get("schema_version", -1)) != SCHEMA_VERSION:
            raise UsageError(
                f"{str(p)!r} has schema version {attrs.get('schema_version')}, this fednest-mpi {__version__} reads version "
                f"{SCHEMA_VERSION}; read it with the fednest-mpi version named in its package_version attribute"
            )
        group = f[GROUP]
        n = min(group[name].shape[0] for name in group)
        data = {name: group[name][:n] for name in group}
    attrs["config"] = json.loads(attrs.get("config_json", "{}"))
    return attrs, data
