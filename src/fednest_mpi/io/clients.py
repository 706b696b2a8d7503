"""The 2-D groups of a run file: per-client series, per-rank phase times, snapshots of x and y.

* ``/clients/<series>`` (clients x iterations) are **not** gathered to rank 0: every rank writes the
  rows of the clients it hosts to its own file ``RUN.clients/rankNNNNN.h5`` (SWMR, flushed every
  iteration), and the run file holds one virtual dataset per series that joins the per-rank files
  (HDF5 VDS, with an unlimited iteration axis, so a reader of the run file sees the rows live).
* ``/ranks/<phase>`` (ranks x iterations) and ``/snapshots/{iteration,x,y}`` are written by rank 0
  into the run file (the phase times reach rank 0 with the per-iteration bookkeeping reduction).

Parallel HDF5 (h5py built with MPI, ``h5py.get_config().mpi``) would let every rank write its rows
of one shared dataset directly; this h5py is not built with MPI, so that path is not implemented
(``docs/hdf5.md`` says how it would be chosen). Names come from :mod:`fednest_mpi.io.schema`.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from fednest_mpi import atomic, failure
from fednest_mpi.errors import UsageError
from fednest_mpi.io import schema as S
from fednest_mpi.io.h5 import RECOVER_HINT, file_identity, lost_file, open_run, read_run, unclosed_policy
from fednest_mpi.io.safe import open_checked, reading

_CLIENT_CHUNK = (256, 8)  # clients x iterations per chunk: only chunks holding participants are allocated
_RANK_CHUNK = 64  # iterations per chunk of /ranks
_SNAPSHOT_CHUNK = 1 << 22  # numbers per chunk of a snapshot row


def parallel_hdf5() -> bool:
    """Whether h5py is built against MPI-parallel HDF5 (then one shared file could replace the per-rank files)."""
    return bool(h5py.get_config().mpi)


@dataclass(frozen=True)
class SeriesLayout:
    """What the 2-D groups of a run hold; the same on every rank."""

    run_path: Path
    n_clients: int
    blocks: tuple[range, ...]  # client ids of every rank
    client_series: bool
    snapshot_every: int
    dim_x: int
    dim_y: int
    dtype: str  # numpy dtype of the snapshots (the run's float type)
    keep_rows: int | None = None  # resuming: keep iterations 0..keep_rows-1 of the existing run
    cpu_classes: tuple[str, ...] = ()  # numerics.cpu_class of every rank (/ranks/cpu_class)

    @property
    def size(self) -> int:
        return len(self.blocks)

    def create(self, f: h5py.File) -> None:
        """Create the 2-D groups in the new run file ``f`` (rank 0, before SWMR mode; needs
        /iterations/iteration). When resuming, the existing run file is still at ``run_path``: the
        kept iterations of its phase times and snapshots are copied, and the per-rank client
        files are cut back (and re-partitioned for a new number of ranks) by :func:`truncate_client_files`."""
        old = _read_head(self.run_path, self.keep_rows, self.size) if self.keep_rows is not None else {}
        iteration = f[S.GROUP][S.SCALE]
        self._create_ranks(f, iteration, old)
        if self.client_series:
            if self.keep_rows is not None:  # first: the virtual datasets open their sources
                truncate_client_files(self.run_path, self.keep_rows, self.blocks)
            else:  # files of an overwritten run
                _remove_rank_files(self.run_path)
            self._create_virtual(f, iteration)
        if self.snapshot_every > 0:
            self._create_snapshots(f, old)

    def _create_ranks(self, f: h5py.File, iteration, old: dict) -> None:
        """The /ranks group: each rank's CPU class and per-iteration times (compute, wait, transfer), holding the kept
        iterations of ``old`` when resuming."""
        group = f.create_group(S.RANKS)
        group.create_dataset(S.RANK_SCALE, data=np.arange(self.size, dtype=np.int64)).make_scale(S.RANK_SCALE)
        if self.cpu_classes:
            d = group.create_dataset(S.RANK_CPU_CLASS, data=np.array(self.cpu_classes, dtype=h5py.string_dtype()))
            d.attrs["description"] = "the rank's CPU class: vendor and the MKL, ATen and OpenBLAS code paths in force"
        for name, (description, units) in S.RANK_SERIES.items():
            d = group.create_dataset(
                name,
                shape=(self.size, 0),
                maxshape=(self.size, None),
                dtype=np.float64,
                chunks=(min(self.size, 1024), _RANK_CHUNK),
                fillvalue=np.nan,
                fletcher32=True,
            )
            _describe(d, description, units, group[S.RANK_SCALE], iteration)
            if self.keep_rows is not None:  # NaN where the resumed run had another number of ranks
                d.resize((self.size, self.keep_rows))
                if name in old:
                    d[...] = old[name]

    def _create_snapshots(self, f: h5py.File, old: dict) -> None:
        """The /snapshots group: x and y every ``snapshot_every`` iterations, holding the kept ones of ``old``."""
        snap = f.create_group(S.SNAPSHOTS)
        scale = snap.create_dataset(
            S.SNAPSHOT_SCALE, shape=(0,), maxshape=(None,), chunks=(64,), dtype=np.int64, fletcher32=True
        )
        scale.make_scale(S.SNAPSHOT_SCALE)
        scale.attrs.update(description="outer iteration of each snapshot", units="1")
        for name, dim in (("x", self.dim_x), ("y", self.dim_y)):
            d = snap.create_dataset(
                name,
                shape=(0, dim),
                maxshape=(None, dim),
                dtype=self.dtype,
                chunks=(1, min(dim, _SNAPSHOT_CHUNK)),
                fletcher32=True,
            )
            d.attrs.update(description=S.SNAPSHOT_SERIES[name], units="1")
            d.dims[0].attach_scale(scale)
        for name in (S.SNAPSHOT_SCALE, "x", "y"):
            if "snapshot_" + name in old:
                snap[name].resize(len(old["snapshot_" + name]), axis=0)
                snap[name][...] = old["snapshot_" + name]

    def _create_virtual(self, f: h5py.File, iteration) -> None:
        """One virtual dataset per client series, mapping each rank's block of rows (all iterations) to its file."""
        group = f.create_group(S.CLIENTS)
        group.create_dataset(S.CLIENT_SCALE, data=np.arange(self.n_clients, dtype=np.int64)).make_scale(S.CLIENT_SCALE)
        folder = S.client_dir(self.run_path).name  # relative: HDF5 looks next to the run file
        for name, (dtype, fill, description, units) in S.CLIENT_SERIES.items():
            layout = h5py.VirtualLayout(shape=(self.n_clients, 1), dtype=dtype, maxshape=(self.n_clients, None))
            for rank, rows in enumerate(self.blocks):
                if len(rows):
                    source = h5py.VirtualSource(  # HDF5 reads '%b' in the name as the run file's, '%%' as '%'
                        f"{folder}/{S.rank_file(rank)}".replace("%", "%%"),
                        f"{S.CLIENTS}/{name}",
                        shape=(len(rows), 1),
                        maxshape=(len(rows), None),
                        dtype=dtype,
                    )
                    layout[rows.start : rows.stop, : h5py.h5s.UNLIMITED] = source[:, : h5py.h5s.UNLIMITED]
            d = group.create_virtual_dataset(name, layout, fillvalue=fill)
            _describe(d, description, units, group[S.CLIENT_SCALE], iteration)


def _describe(d, description: str, units: str, row_scale, iteration_scale) -> None:
    d.attrs.update(description=description, units=units)
    d.dims[0].attach_scale(row_scale)
    d.dims[1].attach_scale(iteration_scale)


def _extend_columns(d, k: int) -> None:
    """Make column k the last of a (rows, iterations) dataset."""
    d.resize((d.shape[0], k + 1))


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _bits(values: np.ndarray) -> np.ndarray:
    """The stored bits of ``values`` as uint64 (floats bit for bit, NaN payloads included)."""
    a = np.ascontiguousarray(values)
    if a.dtype.kind == "f":
        return a.view(f"u{a.dtype.itemsize}").astype(np.uint64)
    return a.astype(np.int64).view(np.uint64)


def column_digests(first_client: int, columns: dict[str, np.ndarray], start: int = 0) -> np.ndarray:
    """A 64-bit digest of each iteration (column) of a block of clients' series (``columns``: series -> (clients,
    iterations) as stored, clients ``first_client``, ...; the first column is iteration ``start``): the sum over
    its clients and series of a hash of (client id, series, iteration, value), so that the digests of the blocks
    of any partition of the clients add up (mod 2**64) to the same numbers. What a checkpoint records of the
    per-client series, so that a value changed since is found at ``--resume`` (:func:`check_series_digests`)."""
    names = sorted(S.CLIENT_SERIES)
    width = next(iter(columns.values())).shape[1] if columns else 0
    out = np.zeros(width, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name, values in columns.items():
            n = values.shape[0]
            ids = np.arange(first_client, first_client + n, dtype=np.uint64)[:, None]
            its = np.arange(start, start + width, dtype=np.uint64)[None, :]
            key = _mix(_mix(ids) + np.uint64(names.index(name) + 1) * np.uint64(0x9E3779B97F4A7C15) + its)
            out += _mix(key ^ _bits(values)).sum(axis=0, dtype=np.uint64)
    return out


_DIGEST_BLOCK = 1 << 20  # entries read and hashed at once: bounded memory for any number of clients and iterations


def stored_digests(first_client: int, group, columns: int) -> np.ndarray:
    """:func:`column_digests` of the first ``columns`` iterations of the series in the HDF5 group ``group`` (a
    client file's /clients) of the clients ``first_client``, ..., read a block of iterations at a time."""
    out = np.zeros(columns, dtype=np.uint64)
    n = max(1, group[next(iter(S.CLIENT_SERIES))].shape[0])
    step = max(1, _DIGEST_BLOCK // n)
    for lo in range(0, columns, step):
        hi = min(columns, lo + step)
        out[lo:hi] = column_digests(first_client, {name: group[name][:, lo:hi] for name in S.CLIENT_SERIES}, lo)
    return out


def main_digests(f: h5py.File, columns: int, start: int = 0) -> np.ndarray:
    """A 64-bit digest of each iteration ``start``, ..., ``columns`` - 1 of the 2-D parts of the run file ``f`` that
    rank 0 writes: every rank's phase times (/ranks) and the snapshot of x and y taken at that iteration
    (/snapshots), as :func:`column_digests` hashes the client series. What a checkpoint records of them, so that a
    value changed since is found at ``--resume``. An iteration's digest reads that iteration alone, so a writer
    digests each iteration once (``start``: the first not digested yet)."""
    out = np.zeros(max(0, columns - start), dtype=np.uint64)
    golden = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        names = sorted(name for name in S.RANK_SERIES if S.RANKS in f and name in f[S.RANKS])
        for index, name in enumerate(names, 1):
            values = f[S.RANKS][name][:, start:columns]
            ranks = np.arange(values.shape[0], dtype=np.uint64)[:, None] + np.uint64(1 << 40)
            its = np.arange(start, start + values.shape[1], dtype=np.uint64)[None, :]
            key = _mix(_mix(ranks) + np.uint64(index) * golden + its)
            out[: values.shape[1]] += _mix(key ^ _bits(values)).sum(axis=0, dtype=np.uint64)
        taken = f[S.SNAPSHOTS][S.SNAPSHOT_SCALE][()] if S.SNAPSHOTS in f else np.zeros(0, dtype=np.int64)
        for row in np.flatnonzero((taken >= start) & (taken < columns)):
            k = int(taken[row])
            for index, name in enumerate(("x", "y"), len(names) + 1):
                values = f[S.SNAPSHOTS][name][row]
                coords = np.arange(values.size, dtype=np.uint64) + np.uint64(1 << 41)
                key = _mix(_mix(coords) + np.uint64(index) * golden + np.uint64(k))
                out[k - start] += _mix(key ^ _bits(values)).sum(dtype=np.uint64)
    return out


class ClientFile:
    """One rank's per-client rows (the clients ``hosted``), streamed to ``RUN.clients/rankNNNNN.h5``.

    ``append=True`` continues an existing file (a resumed run, after :func:`truncate_client_files`).
    """

    def __init__(self, run_path: str | Path, rank: int, hosted: range, append: bool = False):
        path = S.client_dir(run_path) / S.rank_file(rank)
        if append and path.exists():
            self.file = h5py.File(path, "a", libver="latest")
        else:
            self.file = _create_client_file(path, rank, hosted)
            os.replace(self.file.filename, path)  # created at a fresh name: never through a planted link
        self.file.swmr_mode = True
        self.datasets = {name: self.file[S.CLIENTS][name] for name in S.CLIENT_SERIES}
        self.path = path
        self._identity = file_identity(path)
        self.first = hosted.start
        # the digests of the columns written (column_digests): those of a resumed file read back once
        columns = self.datasets["participation"].shape[1]
        self.digests = list(stored_digests(self.first, self.file[S.CLIENTS], columns))

    def lost(self) -> str | None:
        """Why the file under :attr:`path` is no longer the one being written (deleted, replaced), or None."""
        return lost_file(self.path, self._identity)

    def append(self, k: int, records: dict[str, np.ndarray]) -> None:
        """Column k (iteration k) of every series, flushed. Only the participants' entries are written
        (the others keep the fill value, and chunks without participants are never allocated): one
        slice from the first to the last participant when they are dense, else entry by entry."""
        member = [records[name] > 0 for name in ("participation", "answered_rounds", "dropped_rounds")]
        rows = np.flatnonzero(np.logical_or.reduce(member))  # took part, answered or did not answer a round
        dense = rows.size and 2 * rows.size >= rows[-1] - rows[0] + 1
        stored = {}  # column k as the file will hold it: the fill value, and the entries written
        with failure.guard():
            for name, d in self.datasets.items():
                _extend_columns(d, k)
                stored[name] = np.full((d.shape[0], 1), S.CLIENT_SERIES[name][1], dtype=d.dtype)
                if dense:  # the entries between participants already hold the fill value
                    d[rows[0] : rows[-1] + 1, k] = records[name][rows[0] : rows[-1] + 1]
                    stored[name][rows[0] : rows[-1] + 1, 0] = records[name][rows[0] : rows[-1] + 1]
                elif rows.size:
                    d[rows, k] = records[name][rows]
                    stored[name][rows, 0] = records[name][rows]
            self.file.flush()
        del self.digests[k:]
        self.digests += list(column_digests(self.first, stored, start=k))

    def close(self, columns: int | None = None) -> None:
        """Close the file, first cutting it to ``columns`` iterations (None: as it is): the
        iterations the run completed, after a NaN stop or a failure."""
        if self.file.id.valid:
            try:
                for d in self.datasets.values() if columns is not None else ():
                    if d.shape[1] > columns:
                        d.resize((d.shape[0], columns))
            finally:
                self.file.close()


def _create_client_file(path: Path, rank: int, hosted: range) -> h5py.File:
    """A new, empty per-rank client file (open, not yet in SWMR mode) that will become ``path``: created
    exclusively at a fresh name next to it (:func:`fednest_mpi.atomic.temp_name`; rename it when ready)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = h5py.File(atomic.temp_name(path), "x", libver="latest")
    f.attrs.update(
        format=S.FORMAT + "/clients",
        schema_version=S.SCHEMA_VERSION,
        rank=rank,
        first_client=hosted.start,
        n_hosted=len(hosted),
    )
    group = f.create_group(S.CLIENTS)
    n = len(hosted)
    for name, (dtype, fill, description, units) in S.CLIENT_SERIES.items():
        d = group.create_dataset(
            name,
            shape=(n, 0),
            maxshape=(n, None),
            dtype=dtype,
            chunks=(min(n, _CLIENT_CHUNK[0]), _CLIENT_CHUNK[1]),
            fillvalue=fill,
            fletcher32=True,
        )
        d.attrs.update(description=description, units=units)
    return f


class MainSeries:
    """Rank 0's writer of ``/ranks`` and ``/snapshots`` in the open run file ``f`` (created by
    :meth:`SeriesLayout.create`)."""

    def __init__(self, f: h5py.File):
        self.f = f
        self.phases = {name: f[S.RANKS][name] for name in S.RANK_SERIES}

    def append(self, k: int, phases: dict[str, np.ndarray], snapshot=None) -> None:
        """Column k of every phase series and, if ``snapshot`` = (x, y) is given, one snapshot row.

        Call before the run file's per-iteration row is appended (which flushes the file)."""
        with failure.guard():
            self._append(k, phases, snapshot)

    def _append(self, k: int, phases: dict[str, np.ndarray], snapshot) -> None:
        for name, d in self.phases.items():
            _extend_columns(d, k)
            d[:, k] = phases[name]
        if snapshot is not None:
            group = self.f[S.SNAPSHOTS]
            n = group[S.SNAPSHOT_SCALE].shape[0]
            for name, value in zip(("x", "y"), snapshot):
                group[name].resize((n + 1, group[name].shape[1]))
                group[name][n] = value.detach().cpu().numpy()
            group[S.SNAPSHOT_SCALE].resize((n + 1,))
            group[S.SNAPSHOT_SCALE][n] = k


# ----------------------------------------------------------------------------------------------
# Reading and truncation


def _open_checked(path: str | Path, unclosed: str = "live") -> tuple[h5py.File, int]:
    """(open run file, number of completed iterations); validates the file like :func:`~fednest_mpi.io.h5.read_run`."""
    _, data = read_run(path, unclosed)
    return open_run(path, unclosed), len(data[S.SCALE])


def read_clients(path: str | Path) -> dict[str, np.ndarray]:
    """{series: (clients, completed iterations) array} of a run file (also while the run writes it).

    Read from the per-rank client files directly (each validated like the run file: a damaged,
    truncated or missing one raises UsageError naming it), not through the virtual datasets, which
    would show a missing source as fill values. Raises UsageError when the run was written without
    per-client series.
    """
    f, n = _open_checked(path)
    with f, reading(path, "run file"):
        if S.CLIENTS not in f:
            raise UsageError(
                f"{str(path)!r} holds no per-client series (written with run.client_series = false); "
                "rerun with run.client_series = true"
            )
        n_clients = f[S.CLIENTS][S.CLIENT_SCALE].shape[0]
    out = {name: np.full((n_clients, n), fill, dtype=dtype) for name, (dtype, fill, _, _) in S.CLIENT_SERIES.items()}
    files = check_client_files(path, n, unclosed=unclosed_policy(path, "live"), n_clients=n_clients)
    try:
        for rows, g in files:
            with reading(g.filename, "client file"):
                for name in S.CLIENT_SERIES:
                    out[name][rows.start : rows.stop] = g[S.CLIENTS][name][:, :n]
    finally:
        for _, g in files:
            g.close()
    return out


def check_client_files(
    run_path: str | Path, rows: int, unclosed: str = "live", what: str = "", n_clients: int | None = None
) -> list[tuple[range, h5py.File]]:
    """(client ids, open file) of every per-rank client file of a run, after checking that each is
    a readable client file holding at least ``rows`` iterations and that together they hold every
    client (``n_clients``; default: read from the run file's /clients). A run file without
    /clients needs none (returns []). UsageError, prefixed ``what``, naming the first bad file."""
    if n_clients is None:
        f = open_run(run_path, "read" if unclosed == "read" else "live")
        with f, reading(run_path, "run file"):
            if S.CLIENTS not in f:
                return []
            n_clients = f[S.CLIENTS][S.CLIENT_SCALE].shape[0]
    folder = S.client_dir(run_path)
    fix = f"restore {str(folder)!r} next to the run file (it holds the per-client series)"
    found = _rank_files(run_path, unclosed)
    covered = np.full(n_clients, -1)  # the file (its index in found) holding each client
    for index, (ids, g) in enumerate(found):
        filename = g.filename  # named after the files are closed
        defect = _shape_defect(ids, g, rows)
        clash = _range_clash(ids, covered, found) if not defect else ""
        if clash:
            defect = (
                f"holds clients {ids.start}..{ids.stop - 1} (its attributes first_client and n_hosted), {clash}: "
                "it was edited or belongs to another run"
            )
        if defect:
            for _, h in found:
                h.close()
            raise UsageError(f"{what}client file {filename!r} {defect}; {fix}")
        covered[ids.start : ids.stop] = index
    if (covered < 0).any():
        for _, h in found:
            h.close()
        missing = int(np.flatnonzero(covered < 0)[0])
        state = "is missing" if not folder.is_dir() else f"holds no file with client {missing}"
        raise UsageError(
            f"{what}the per-client series of {str(run_path)!r} are incomplete: {str(folder)!r} {state}; {fix}"
        )
    return found


def _shape_defect(ids: range, g: h5py.File, rows: int) -> str:
    """What is wrong with the series of the client file ``g`` of the clients ``ids`` for ``rows`` iterations, or ''."""
    for name in S.CLIENT_SERIES:
        shape = g[S.CLIENTS][name].shape if name in g.get(S.CLIENTS, {}) else None
        if shape is None or shape[0] != len(ids) or shape[1] < rows:
            held = "no such series" if shape is None else f"shape {shape}"
            return (
                f"is damaged or too short: /{S.CLIENTS}/{name} has {held}, expected {len(ids)} clients x at least "
                f"{rows} iterations"
            )
    return ""


def _range_clash(ids: range, covered: np.ndarray, found: list) -> str:
    """Why the clients ``ids`` of a client file cannot be the run's (``covered``: the index in ``found`` of the
    file holding each client so far, -1 for none): beyond the run's clients, or held by another file; '' if not."""
    if ids.stop > covered.size:
        return f"the run has {covered.size}"
    twice = covered[ids.start : ids.stop]
    if (twice >= 0).any():
        return f"so does {found[int(twice[twice >= 0][0])][1].filename!r}"
    return ""


def check_series_digests(run_path: str | Path, files, rows: int, recorded) -> None:
    """Refuse (UsageError naming the iteration) per-client series whose first ``rows`` iterations in the client
    ``files`` (:func:`check_client_files`) differ from the digests a checkpoint ``recorded``
    (:func:`column_digests`; empty: not checked, a checkpoint written before them)."""
    recorded = np.asarray(recorded, dtype=np.int64).view(np.uint64)[:rows]
    if not recorded.size:
        return
    found = np.zeros(recorded.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for ids, g in files:
            with reading(g.filename, "client file"):
                found += stored_digests(ids.start, g[S.CLIENTS], recorded.size)
    changed = np.flatnonzero(found != recorded)
    if changed.size:
        more = f" (and {changed.size - 1} more iteration(s))" if changed.size > 1 else ""
        raise UsageError(
            f"--resume: iteration {int(changed[0])} of the per-client series (/{S.CLIENTS}, in "
            f"{str(S.client_dir(run_path))!r}){more} was changed since the checkpoint recorded it; restore the "
            "files, or recompute them: the same command with --overwrite in place of --resume"
        )


def read_ranks(path: str | Path) -> dict[str, np.ndarray]:
    """{phase: (ranks, completed iterations) array} of a run file."""
    f, n = _open_checked(path)
    with f:
        return {name: f[S.RANKS][name][:, :n] for name in S.RANK_SERIES}


def read_snapshots(path: str | Path) -> dict[str, np.ndarray]:
    """{"iteration": (s,), "x": (s, d1), "y": (s, d2)} of a run file; empty arrays when it has no snapshots."""
    f, n = _open_checked(path)
    with f:
        if S.SNAPSHOTS not in f:
            return {"iteration": np.zeros(0, dtype=np.int64), "x": np.zeros((0, 0)), "y": np.zeros((0, 0))}
        group = f[S.SNAPSHOTS]
        it = group[S.SNAPSHOT_SCALE][:]
        keep = int(np.searchsorted(it, n))  # snapshots of completed iterations only
        return {"iteration": it[:keep], "x": group["x"][:keep], "y": group["y"][:keep]}


def _remove_rank_files(run_path, pattern: str = "rank*.h5*") -> None:
    folder = S.client_dir(run_path)
    globs = (pattern, ".rank*.partial") if pattern == "rank*.h5*" else (pattern,)  # all: with unfinished new ones
    for path in [p for glob in globs for p in folder.glob(glob)] if folder.is_dir() else ():
        path.unlink(missing_ok=True)


def _rank_files(run_path, unclosed: str = "read") -> list[tuple[range, h5py.File]]:
    """(client ids, open file) of every existing per-rank client file of a run, each validated
    (:func:`fednest_mpi.io.safe.open_checked`; ``unclosed`` as there)."""
    folder = S.client_dir(run_path)
    out: list = []
    try:
        for path in sorted(folder.glob("rank*.h5")) if folder.is_dir() else ():
            g, _ = open_checked(path, "client file", unclosed, RECOVER_HINT.format(path=shlex.quote(str(run_path))))
            out.append((None, g))
            with reading(path, "client file"):
                if g.attrs.get("format") != S.FORMAT + "/clients" or S.CLIENTS not in g:
                    raise UsageError(
                        f"client file {str(path)!r} is not a fednest-mpi client file (format attribute "
                        f"{g.attrs.get('format')!r})"
                    )
                first, n = int(g.attrs["first_client"]), int(g.attrs["n_hosted"])
            if first < 0 or n < 0:
                raise UsageError(f"client file {str(path)!r} is damaged: it says it holds {n} clients from {first}")
            out[-1] = (range(first, first + n), g)
    except BaseException:
        for _, g in out:
            g.close()
        raise
    return out


def truncate_client_files(run_path: str | Path, n_iterations: int, blocks: tuple[range, ...] | None = None) -> None:
    """Cut the per-rank client files of a run back to iterations 0..n_iterations-1 (a resumed run
    continues at iteration ``n_iterations``).

    The files are rewritten, partitioned by ``blocks`` (client ids of every rank of the resumed
    run; default: as they are): the new files are written next to the old ones, which are only
    read (validated; in bounded SWMR mode when not closed, so also the files of a killed run), and
    replace them once all are complete. Not collective: rank 0 calls it before any rank opens
    its file for appending.
    """
    existing = _rank_files(run_path)
    try:
        if blocks is None:
            blocks = tuple(rows for rows, _ in existing)
        folder = S.client_dir(run_path)
        fresh = {}
        for rank, rows in enumerate(blocks):
            if not len(rows):
                continue
            target = _create_client_file(folder / S.rank_file(rank), rank, rows)
            fresh[rank] = target.filename
            with target:
                for old_rows, f in existing:
                    lo, hi = max(rows.start, old_rows.start), min(rows.stop, old_rows.stop)
                    if lo >= hi:
                        continue
                    with reading(f.filename, "client file"):
                        for name in S.CLIENT_SERIES:
                            src, dst = f[S.CLIENTS][name], target[S.CLIENTS][name]
                            n = min(src.shape[1], n_iterations)
                            if dst.shape[1] < n:
                                dst.resize((dst.shape[0], n))
                            dst[lo - rows.start : hi - rows.start, :n] = src[
                                lo - old_rows.start : hi - old_rows.start, :n
                            ]
    finally:
        for _, f in existing:
            f.close()
    _remove_rank_files(run_path, "rank*.h5")
    for rank, name in fresh.items():
        os.replace(name, folder / S.rank_file(rank))


def _read_head(run_path, rows: int, size: int) -> dict[str, np.ndarray]:
    """The first ``rows`` iterations of the phase times (if the run had ``size`` ranks) and snapshots of a run file."""
    out = {}
    with open_run(run_path, "read") as f, reading(run_path, "run file"):
        for name in S.RANK_SERIES if S.RANKS in f and f[S.RANKS][S.RANK_SCALE].shape[0] == size else ():
            out[name] = f[S.RANKS][name][:, :rows]
        if S.SNAPSHOTS in f:
            group = f[S.SNAPSHOTS]
            keep = int(np.searchsorted(group[S.SNAPSHOT_SCALE][:], rows))
            out.update({"snapshot_" + name: group[name][:keep] for name in (S.SNAPSHOT_SCALE, "x", "y")})
    return out
