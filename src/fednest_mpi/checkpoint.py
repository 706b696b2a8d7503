"""Checkpoint and restart: everything a run needs to continue bitwise (``docs/reliability.md``).

A checkpoint lives in one folder shared by all ranks (``run.checkpoint_dir``; by default the
output path with ``.ckpt`` appended)::

    state.pt                        the manifest: iteration k, x, y, communication counters, oracle
                                    totals, wall time, output rows, config, the algorithm's
                                    replicated state and which client files hold which client ids
                                    (written by rank 0)
    clients-k<k>-r<rank>.pt         per-client state of the clients a rank hosted at iteration k
                                    (only for algorithms with such state; written by that rank)

Randomness needs no saving: every stream is keyed by ``(seed, purpose, k, ...)``
(:mod:`fednest_mpi.rng`), so the iteration counter *is* the position of every random stream.

Every file is written atomically (a temporary file in the same folder, fsync, ``os.replace``).
The manifest is the commit point: it is replaced only once every client file of the new
checkpoint is complete, and the client files of older checkpoints are deleted only after that,
so a crash at any moment leaves the previous checkpoint whole. Client files are keyed by client
id, not by rank: a restart on any number of ranks reads the files holding the ids it hosts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fednest_mpi import config
from fednest_mpi.errors import UsageError

FORMAT = "fednest-mpi/checkpoint"
VERSION = 1
MANIFEST = "state.pt"
# config fields a resumed run may change: they do not enter the iterates or the recorded values
RESUMABLE_CHANGES = frozenset(
    {"algorithm.outer_iterations", "run.log_every", "run.progress", "run.overwrite", "run.checkpoint_every"}
)

ClientStates = dict[str, tuple[np.ndarray, torch.Tensor]]


@dataclass
class Checkpoint:
    """The replicated part of a checkpoint: the state after outer iteration ``iteration``."""

    iteration: int
    x: torch.Tensor
    y: torch.Tensor
    comm_rounds: int
    comm_bytes: int
    comm_seconds: float
    oracle_totals: torch.Tensor  # cumulative oracle calls summed over ranks, in the order of problems.ORACLES
    wall_time: float
    output_rows: int  # rows of /iterations in the output file that belong to this checkpoint (k + 1)
    config_json: str
    mpi_size: int
    algorithm_state: dict[str, torch.Tensor] = field(default_factory=dict)
    client_files: dict[str, torch.Tensor] = field(default_factory=dict)  # file name -> the client ids it holds


def folder_of(cfg) -> Path:
    """The checkpoint folder of a run config."""
    return Path(cfg.run.checkpoint_dir or cfg.run.output + ".ckpt")


# ----------------------------------------------------------------------------------------------
# files


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` such that ``path`` is either its old or its new content."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def _load(path: Path) -> dict:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(
            f"checkpoint file '{path}' is missing: the checkpoint folder was changed by hand; "
            "restore the file or start the run again without --resume"
        ) from None
    except Exception as exc:  # noqa: BLE001 -- torch.load raises many kinds for a damaged file
        raise UsageError(
            f"checkpoint file '{path}' cannot be read ({type(exc).__name__}: {exc}); "
            "start the run again without --resume"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(f"'{path}' is not a fednest-mpi checkpoint file")
    if data.get("version") != VERSION:
        raise UsageError(
            f"checkpoint '{path}' has format version {data.get('version')}, this fednest-mpi reads "
            f"version {VERSION}; resume it with the fednest-mpi version that wrote it"
        )
    return data


def save(comm, folder: str | Path, ckpt: Checkpoint, client_states: ClientStates) -> None:
    """Write ``ckpt`` and every rank's ``client_states`` (name -> (ids, rows)) to ``folder``.

    **Collective** over ``comm`` (a gather of file names to rank 0, then a barrier: every rank
    returns once the checkpoint is complete). Rank 0's ``ckpt`` is saved; ``ckpt.client_files``
    is filled in here.
    """
    folder = Path(folder)
    rank = comm.Get_rank()
    folder.mkdir(parents=True, exist_ok=True)
    mine = None
    if client_states:
        name = f"clients-k{ckpt.iteration:09d}-r{rank:05d}.pt"
        states = {
            key: (torch.as_tensor(np.asarray(ids), dtype=torch.int64), rows.detach().cpu())
            for key, (ids, rows) in client_states.items()
        }
        atomic_save({"format": FORMAT, "version": VERSION, "states": states}, folder / name)
        mine = (name, torch.unique(torch.cat([ids for ids, _ in states.values()])))
    written = comm.gather(mine, root=0)
    if rank == 0:
        _commit(folder, ckpt, written)
    comm.Barrier()


def _commit(folder: Path, ckpt: Checkpoint, written: list) -> None:
    """Rank 0: write the manifest naming the client files just ``written``, then drop older ones."""
    ckpt.client_files = dict(item for item in written if item is not None)
    record = {f.name: getattr(ckpt, f.name) for f in dataclasses.fields(ckpt)}
    record["x"], record["y"] = ckpt.x.detach().cpu(), ckpt.y.detach().cpu()
    record["algorithm_state"] = {key: value.detach().cpu() for key, value in ckpt.algorithm_state.items()}
    atomic_save({"format": FORMAT, "version": VERSION, **record}, folder / MANIFEST)
    # the new checkpoint is complete: the client files of older (or unfinished) ones can go
    for stale in [*folder.glob("clients-*.pt"), *folder.glob(".*.tmp*")]:
        if stale.name not in ckpt.client_files:
            stale.unlink(missing_ok=True)


def load(folder: str | Path) -> Checkpoint:
    """The latest checkpoint in ``folder`` (its replicated part); UsageError when there is none."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise UsageError(
            f"--resume: no checkpoint in '{folder}' (no {MANIFEST}); run without --resume to start "
            "the run, or set run.checkpoint_dir to the folder of the run you want to continue"
        )
    data = _load(path)
    names = {f.name for f in dataclasses.fields(Checkpoint)}
    return Checkpoint(**{k: v for k, v in data.items() if k in names})


def load_client_states(folder: str | Path, ckpt: Checkpoint, clients) -> ClientStates:
    """The saved per-client state of the client ids in ``clients`` (this rank's), read only from
    the files that hold some of them; name -> (ids in increasing order, rows). Names of which
    none of ``clients`` was saved are left out."""
    wanted = np.asarray(clients, dtype=np.int64)
    parts: dict[str, list] = {}
    for name, ids in ckpt.client_files.items():
        if not np.isin(ids.numpy(), wanted).any():
            continue
        for key, (ids_k, rows) in _load(Path(folder) / name)["states"].items():
            keep = torch.from_numpy(np.isin(ids_k.numpy(), wanted))
            parts.setdefault(key, []).append((ids_k[keep], rows[keep]))
    out = {}
    for key, pieces in parts.items():
        ids = torch.cat([i for i, _ in pieces])
        rows = torch.cat([r for _, r in pieces])
        order = torch.argsort(ids)
        out[key] = (ids[order].numpy(), rows[order])
    return out


# ----------------------------------------------------------------------------------------------
# resume checks


def config_differences(saved_json: str, cfg) -> list[str]:
    """The fields (other than :data:`RESUMABLE_CHANGES`) in which ``cfg`` differs from the
    checkpoint's config, as ``field: checkpoint VALUE, now VALUE``. Saved [algorithm] fields that
    ``cfg``'s algorithm does not have are not compared (checkpoints written before the algorithm
    section became a union hold every algorithm's fields)."""
    saved = json.loads(saved_json)
    if isinstance(saved.get("algorithm"), dict):
        saved["algorithm"] = config.algorithm_fields(cfg.algorithm.name, saved["algorithm"])
    flat = [config.flatten_config(c, hashable=False) for c in (saved, json.loads(cfg.to_json()))]
    return [
        f"{key}: checkpoint {then!r}, now {now!r}"
        for key, (then, now) in config.differing_fields(flat, ignore=RESUMABLE_CHANGES).items()
    ]


def check_resumable(ckpt: Checkpoint, cfg) -> None:
    """UsageError unless ``cfg`` may continue ``ckpt`` (same config up to :data:`RESUMABLE_CHANGES`)."""
    diffs = config_differences(ckpt.config_json, cfg)
    if diffs:
        raise UsageError(
            "--resume: the config differs from the checkpoint's in "
            + "; ".join(diffs)
            + ". Resume with the config of the interrupted run (only algorithm.outer_iterations and "
            "the logging and checkpoint_every fields may change)"
        )
    if ckpt.iteration > cfg.algorithm.outer_iterations:
        raise UsageError(
            f"--resume: the checkpoint is at iteration {ckpt.iteration}, beyond algorithm.outer_iterations "
            f"= {cfg.algorithm.outer_iterations}; raise outer_iterations to at least {ckpt.iteration}"
        )


# ----------------------------------------------------------------------------------------------
# signals


class StopSignals:
    """While active, SIGTERM and SIGUSR1 (what SLURM sends before a time limit with ``--signal``)
    only set a flag; the runner checks it once per iteration. A context manager."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.received is not None

    def _handler(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        self._previous = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
