"""HDF5 file of a benchmark (``bench/``): one table, one row per measurement.

Schema ``fednest-mpi/bench`` version 1::

    /            attrs: format, schema_version, package_version, git_commit, created_utc, hostname,
                        plus the harness's own (spec_json, cpu_count, machine note)
    /results/<column>   1-D, one entry per measurement; numbers as float64 (NaN = not measured),
                        text as UTF-8 strings; attrs: description, units
"""

from __future__ import annotations

import datetime
import socket
from pathlib import Path

import h5py
import numpy as np

from fednest_mpi import __version__, atomic
from fednest_mpi.io.h5 import git_commit

FORMAT = "fednest-mpi/bench"
SCHEMA_VERSION = 1
GROUP = "results"


def write_bench(path: str | Path, rows: list[dict], columns: dict[str, tuple[str, str]], attrs: dict) -> None:
    """Write ``rows`` (dicts keyed by the names of ``columns``: name -> (description, units))."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic.temp_name(path)  # unique, created exclusively: never through a planted link
    with h5py.File(tmp, "x") as f:
        f.attrs.update(
            {
                "format": FORMAT,
                "schema_version": SCHEMA_VERSION,
                "package_version": __version__,
                "git_commit": git_commit(),
                "hostname": socket.gethostname(),
                "created_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            }
        )
        f.attrs.update(attrs)
        group = f.create_group(GROUP)
        for name, (description, units) in columns.items():
            values = [row.get(name) for row in rows]
            if any(isinstance(v, str) for v in values):
                data = np.array(["" if v is None else str(v) for v in values], dtype=h5py.string_dtype())
            else:
                data = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
            d = group.create_dataset(name, data=data)
            d.attrs["description"] = description
            d.attrs["units"] = units
    tmp.replace(path)


def read_bench(path: str | Path) -> tuple[dict, list[dict]]:
    """(file attributes, rows) of a bench file."""
    with h5py.File(path, "r") as f:
        if f.attrs.get("format") != FORMAT:
            raise ValueError(f"{path}: not a {FORMAT} file")
        attrs = dict(f.attrs)
        cols = {name: [v.decode() if isinstance(v, bytes) else v for v in f[GROUP][name][()]] for name in f[GROUP]}
    n = len(next(iter(cols.values()))) if cols else 0
    return attrs, [{name: values[i] for name, values in cols.items()} for i in range(n)]
