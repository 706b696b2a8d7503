"""``fednest-mpi recover RUN.h5``: close the files of a run that was killed (SIGKILL, node loss, ``MPI_Abort``).

A killed writer leaves its run file and per-rank client files flushed up to the last completed
iteration but still marked open for writing, so plain HDF5 readers refuse them (SWMR readers
accept them). :func:`recover` rebuilds them as a resume would (``RunWriter(keep_rows=...)``, which
replaces the old file only once the new one is complete), keeping the iterations complete in
every part of the run (``/iterations`` rows, ``/clients`` columns in every client file, ``/ranks``
columns), and closes them. The run file gets the attribute ``recovered`` (JSON: iterations kept,
what was dropped, time). The run's lock must be free or stale (:mod:`fednest_mpi.lock`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fednest_mpi import failure, lock
from fednest_mpi.errors import UsageError
from fednest_mpi.io import schema as S
from fednest_mpi.io.clients import SeriesLayout, check_client_files
from fednest_mpi.io.h5 import RunWriter, open_run, read_run
from fednest_mpi.io.safe import read_header, reading


def recover(path: str | Path) -> str:
    """Close and trim the run file ``path`` (and its client files); a one-line summary of what it kept."""
    p = Path(path)
    held = lock.acquire(p, "recover", take_stale=True)
    try:
        return _recover(p)
    finally:
        held.release()


@dataclass
class _Parts:
    """What the files of a killed run hold: the run file's columns, the rows complete in every part, the
    layout of its per-rank and per-client parts."""

    columns: dict[str, tuple[str, str]]  # /iterations: name -> (description, units), the scale first
    lengths: dict[str, int]  # rows written of each /iterations column
    rows: int  # iterations complete in every part
    size: int  # ranks of the run (/ranks), 0 without
    dims: tuple[int, int, str] | None  # (dim x, dim y, dtype) of /snapshots, None without
    n_clients: int  # clients of the per-client series, 0 without
    blocks: list[range] = field(default_factory=list)  # each client file's clients, in order

    def rank_blocks(self) -> tuple[range, ...]:
        """Each rank's clients: those of its client file, none for a rank without one."""
        return tuple(self.blocks + [range(0)] * max(0, self.size - len(self.blocks)))


def _run_file_parts(p: Path, rows: int) -> _Parts:
    """The parts of the run file ``p`` whose ``/iterations`` scale has ``rows`` rows (fewer where the ``/ranks``
    series stop earlier)."""
    with open_run(p, "read") as f, reading(p, "run file"):
        group = f[S.GROUP]
        columns = {
            name: (str(group[name].attrs.get("description", "")), str(group[name].attrs.get("units", "")))
            for name in [S.SCALE] + [c for c in group if c != S.SCALE]
        }
        lengths = {name: group[name].shape[0] for name in group}
        size = f[S.RANKS][S.RANK_SCALE].shape[0] if S.RANKS in f else 0
        if S.RANKS in f:
            rows = min([rows] + [f[S.RANKS][name].shape[1] for name in S.RANK_SERIES if name in f[S.RANKS]])
        dims = None
        if S.SNAPSHOTS in f:
            dims = (f[S.SNAPSHOTS]["x"].shape[1], f[S.SNAPSHOTS]["y"].shape[1], str(f[S.SNAPSHOTS]["x"].dtype))
        n_clients = f[S.CLIENTS][S.CLIENT_SCALE].shape[0] if S.CLIENTS in f else 0
    return _Parts(columns, lengths, rows, size, dims, n_clients)


def _read_client_files(p: Path, parts: _Parts) -> None:
    """Cut ``parts.rows`` to the iterations complete in every client file, and note the files' client blocks."""
    files = check_client_files(p, 0, unclosed="read", n_clients=parts.n_clients)
    try:
        parts.rows = min([parts.rows] + [g[S.CLIENTS][name].shape[1] for _, g in files for name in S.CLIENT_SERIES])
        parts.blocks = [ids for ids, _ in sorted(files, key=lambda item: item[0].start)]
    finally:
        for _, g in files:
            g.close()


def _unclosed(p: Path) -> bool:
    """Whether the run file or one of its client files is still marked open for writing."""
    return bool(read_header(p, "run file").flags) or any(
        read_header(q, "client file").flags for q in sorted(S.client_dir(p).glob("rank*.h5"))
    )


def _rewrite(p: Path, parts: _Parts, record: dict) -> None:
    """Rebuild the run file and its client files with their first ``parts.rows`` iterations, as a resume
    would, the run file marked with ``record``."""
    dim_x, dim_y, dtype = parts.dims or (0, 0, "float64")
    layout = SeriesLayout(
        run_path=p,
        n_clients=parts.n_clients,
        blocks=parts.rank_blocks(),
        client_series=bool(parts.n_clients),
        snapshot_every=int(parts.dims is not None),
        dim_x=dim_x,
        dim_y=dim_y,
        dtype=dtype,
        keep_rows=parts.rows,
    )
    writer = RunWriter(p, {}, parts.columns, keep_rows=parts.rows, extend=layout.create, recovered=record)
    writer.close()


def _recover(p: Path) -> str:
    """:func:`recover` under the run's lock: the rows complete in every part kept, the files rebuilt and closed
    (unless closed and complete already), the checkpoint folder's stale lock removed."""
    attrs, data = read_run(p, unclosed="read")
    parts = _run_file_parts(p, len(data[S.SCALE]))
    if parts.n_clients:
        _read_client_files(p, parts)
    rows = parts.rows
    if rows < 1:
        raise UsageError(f"recover: {str(p)!r} holds no complete iteration; start the run again")
    unclosed = _unclosed(p)
    dropped = {name: n - rows for name, n in parts.lengths.items() if n > rows}
    if not unclosed and not dropped:
        return f"{p}: closed and complete already ({rows} iterations, 0..{rows - 1}); nothing changed"
    record = {
        "iterations_kept": rows,
        "last_iteration": int(data[S.SCALE][rows - 1]),
        "rows_dropped": int(max(dropped.values(), default=0)),
        "was_unclosed": unclosed,
    }
    _rewrite(p, parts, record)
    folder = Path(attrs.get("config", {}).get("run", {}).get("checkpoint_dir") or str(p) + ".ckpt")
    stale = lock.holder(folder)
    if stale is not None and stale.state == "stale":
        stale.path.unlink(missing_ok=True)
    n_clients, n_files = parts.n_clients, len(parts.rank_blocks())
    clients = f", per-client series of {n_clients} clients in {n_files} files" if n_clients else ""
    fatal = failure.fatal_note(p)
    return (
        f"recovered {p}: kept iterations 0..{rows - 1} ({rows} rows{clients}), dropped "
        f"{record['rows_dropped']} incomplete row(s); the file is closed and marked with the attribute 'recovered'"
        + (f"; continue the run with --resume (checkpoint folder {folder})" if (folder / "state.pt").is_file() else "")
        + (f"; {fatal}" if fatal else "")
    )
