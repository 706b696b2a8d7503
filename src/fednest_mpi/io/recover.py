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

from pathlib import Path

from fednest_mpi import lock
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


def _recover(p: Path) -> str:
    attrs, data = read_run(p, unclosed="read")
    rows = len(data[S.SCALE])
    with open_run(p, "read") as f, reading(p, "run file"):
        group = f[S.GROUP]
        columns = {
            name: (str(group[name].attrs.get("description", "")), str(group[name].attrs.get("units", "")))
            for name in [S.SCALE] + [c for c in f[S.GROUP] if c != S.SCALE]
        }
        lengths = {name: f[S.GROUP][name].shape[0] for name in f[S.GROUP]}
        size = f[S.RANKS][S.RANK_SCALE].shape[0] if S.RANKS in f else 0
        if S.RANKS in f:
            rows = min([rows] + [f[S.RANKS][name].shape[1] for name in S.RANK_SERIES if name in f[S.RANKS]])
        snapshots = S.SNAPSHOTS in f
        dims = (0, 0, "float64")
        if snapshots:
            dims = (f[S.SNAPSHOTS]["x"].shape[1], f[S.SNAPSHOTS]["y"].shape[1], str(f[S.SNAPSHOTS]["x"].dtype))
        n_clients = f[S.CLIENTS][S.CLIENT_SCALE].shape[0] if S.CLIENTS in f else 0
    blocks: list[range] = []
    if n_clients:
        files = check_client_files(p, 0, unclosed="read", n_clients=n_clients)
        try:
            rows = min([rows] + [g[S.CLIENTS][name].shape[1] for _, g in files for name in S.CLIENT_SERIES])
            blocks = [ids for ids, _ in sorted(files, key=lambda item: item[0].start)]
        finally:
            for _, g in files:
                g.close()
    if rows < 1:
        raise UsageError(f"recover: {str(p)!r} holds no complete iteration; start the run again")
    unclosed = bool(read_header(p, "run file").flags) or any(
        read_header(q, "client file").flags for q in sorted(S.client_dir(p).glob("rank*.h5"))
    )
    dropped = {name: n - rows for name, n in lengths.items() if n > rows}
    if not unclosed and not dropped:
        return f"{p}: closed and complete already ({rows} iterations, 0..{rows - 1}); nothing changed"
    cfg = attrs.get("config", {})
    blocks += [range(0)] * max(0, size - len(blocks))
    layout = SeriesLayout(
        run_path=p,
        n_clients=n_clients,
        blocks=tuple(blocks),
        client_series=bool(n_clients),
        snapshot_every=int(snapshots),
        dim_x=dims[0],
        dim_y=dims[1],
        dtype=dims[2],
        keep_rows=rows,
    )
    record = {
        "iterations_kept": rows,
        "last_iteration": int(data[S.SCALE][rows - 1]),
        "rows_dropped": int(max(dropped.values(), default=0)),
        "was_unclosed": unclosed,
    }
    writer = RunWriter(p, {}, columns, keep_rows=rows, extend=layout.create, recovered=record)
    writer.close()
    folder = Path(cfg.get("run", {}).get("checkpoint_dir") or str(p) + ".ckpt")
    stale = lock.holder(folder)
    if stale is not None and stale.state == "stale":
        stale.path.unlink(missing_ok=True)
    clients = f", per-client series of {n_clients} clients in {len(blocks)} files" if n_clients else ""
    return (
        f"recovered {p}: kept iterations 0..{rows - 1} ({rows} rows{clients}), dropped "
        f"{record['rows_dropped']} incomplete row(s); the file is closed and marked with the attribute 'recovered'"
        + (f"; continue the run with --resume (checkpoint folder {folder})" if (folder / "state.pt").is_file() else "")
    )
