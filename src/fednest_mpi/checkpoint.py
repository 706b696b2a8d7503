"""Checkpoint and restart: everything a run needs to continue bitwise (``docs/reliability.md``).

A checkpoint lives in one folder shared by all ranks (``run.checkpoint_dir``; by default the
output path with ``.ckpt`` appended)::

    state.pt                        the manifest: iteration k, x, y, communication counters, oracle
                                    totals, wall time, output rows and a digest of each, config, the algorithm's
                                    replicated state and which client files hold which client ids
                                    (written by rank 0)
    clients-k<k>-r<rank>.pt         per-client state of the clients a rank hosted at iteration k
                                    (only for algorithms with such state; written by that rank)

Randomness needs no saving: every stream is keyed by ``(seed, purpose, k, ...)``
(:mod:`fednest_mpi.rng`), so the iteration counter *is* the position of every random stream.

Every file starts with a line ``fednest-mpi/checkpoint VERSION SHA256`` (the digest of the rest),
and the manifest records the SHA-256 of every client file and the identity of the run (the
config's digest, the iteration, the rank count; each client file repeats them with its rank), so
a resume refuses a damaged file, a file of another run, iteration or rank, and a missing one,
naming it (:func:`load`, :func:`check_client_files`), before any collective; and a row of the
output's /iterations changed since the checkpoint, naming the row
(:func:`fednest_mpi.io.h5.check_resumable_output`).

Every file is written atomically (a unique temporary name in the same folder, created
exclusively, fsync, ``os.replace``: :mod:`fednest_mpi.atomic`).
The manifest is the commit point: it is replaced only once every client file of the new
checkpoint is complete, and the client files of older checkpoints are deleted only after that,
so a crash at any moment leaves the previous checkpoint whole. Client files are keyed by client
id, not by rank: a restart on any number of ranks reads the files holding the ids it hosts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fednest_mpi import atomic, config
from fednest_mpi.errors import UsageError

FORMAT = "fednest-mpi/checkpoint"
# 2: a header line with the payload's SHA-256; the manifest records every client file's SHA-256;
# 3: the manifest records a digest of every row of /iterations it covers
VERSION = 3
MANIFEST = "state.pt"
# config fields a resumed run may change: they do not enter the iterates or the recorded values
RESUMABLE_CHANGES = frozenset(
    {
        "algorithm.outer_iterations",
        "run.log_every",
        "run.progress",
        "run.overwrite",
        "run.checkpoint_every",
        "run.stop_timeout",
        "run.round_timeout",
        "run.round_timeout_factor",
        "run.idle_timeout",
        "run.check_consistency",  # reads the iterates, changes none
        "run.tensorboard_dir",  # the writers (fednest_mpi.writers) copy the rows
        "run.mlflow_uri",
        "run.mlflow_experiment",
    }
)

PATH_FIELDS = ("run.output", "run.checkpoint_dir")  # compared as the files they name
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
    client_digests: dict[str, str] = field(default_factory=dict)  # file name -> SHA-256 of the whole file
    # a 64-bit digest of each of the output's first output_rows rows of /iterations (io.h5.row_digests);
    # empty for a run without an output file
    row_digests: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    # a 64-bit digest of each attribute of the output file (io.h5.attr_digests); empty for a run without an output
    # file, and in checkpoints written before them (OPTIONAL: such a checkpoint still resumes, unchecked)
    attr_digests: dict[str, int] = field(default_factory=dict)
    # a 64-bit digest of each iteration of the per-client series, over every client (io.clients.column_digests,
    # as int64); empty without them (OPTIONAL, as attr_digests)
    client_series_digests: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    # and of each iteration of the output's /ranks and /snapshots (io.clients.main_digests, as int64; OPTIONAL)
    main_digests: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))


#: fields a checkpoint of this version may lack (written before they were added): their defaults then
OPTIONAL = frozenset({"attr_digests", "client_series_digests", "main_digests"})


def folder_of(cfg) -> Path:
    """The checkpoint folder of a run config."""
    return Path(cfg.run.checkpoint_dir or cfg.run.output + ".ckpt")


# ----------------------------------------------------------------------------------------------
# files: a header line with the SHA-256 of the payload, then the payload (torch.save bytes)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config_digest(config_json: str) -> str:
    """The identity of a run's config: the SHA-256 of its canonical JSON."""
    return digest(config_json.encode())


def _encode(obj) -> bytes:
    """``obj`` as checkpoint file bytes: ``fednest-mpi/checkpoint VERSION SHA256\n`` and ``torch.save(obj)``."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getvalue()
    return f"{FORMAT} {VERSION} {digest(payload)}\n".encode() + payload


def atomic_save(obj, path: Path) -> str:
    """Save ``obj`` to ``path`` such that ``path`` is either its old or its new content (through a
    temporary name no planted link redirects, :mod:`fednest_mpi.atomic`); the file's SHA-256."""
    data = _encode(obj)
    atomic.write_bytes(path, data)
    return digest(data)


def _read_regular(path: Path) -> bytes:
    """The bytes of the regular file ``path``; a FIFO, device or folder is refused without blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UsageError(
            f"checkpoint file '{path}' is missing: the checkpoint folder was changed by hand; "
            "restore the file or start the run again without --resume"
        ) from None
    except OSError as exc:
        raise UsageError(f"checkpoint file '{path}' cannot be opened ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(
                f"checkpoint file '{path}' is not a regular file (a FIFO, device or folder); "
                "restore the file or start the run again without --resume"
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def _load(path: Path, expected_digest: str | None = None) -> dict:
    """The payload of checkpoint file ``path``, after checking its header, its own digest and (if
    given) that the whole file's SHA-256 is ``expected_digest`` (the manifest's record of it)."""
    data = _read_regular(path)
    if expected_digest is not None and digest(data) != expected_digest:
        raise UsageError(
            f"checkpoint file '{path}' is not the one its checkpoint's {MANIFEST} recorded (SHA-256 differs: "
            f"damaged, or copied from another run, rank or iteration){_identity_of(data)}; restore it or start "
            "the run again without --resume"
        )
    head, newline, payload = data.partition(b"\n")
    fields = head.decode("ascii", "replace").split(" ")
    if not newline or fields[0] != FORMAT or len(fields) != 3:
        raise UsageError(f"'{path}' is not a fednest-mpi checkpoint file (of this version); start the run again")
    if fields[1] != str(VERSION):
        raise UsageError(
            f"checkpoint '{path}' has format version {fields[1]}, this fednest-mpi reads "
            f"version {VERSION}; resume it with the fednest-mpi version that wrote it"
        )
    if digest(payload) != fields[2]:
        raise UsageError(
            f"checkpoint file '{path}' is damaged (its SHA-256 differs from the one written with it); "
            "start the run again without --resume"
        )
    try:
        obj = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- torch.load raises many kinds for a damaged file
        raise UsageError(
            f"checkpoint file '{path}' cannot be read ({type(exc).__name__}: {exc}); "
            "start the run again without --resume"
        ) from None
    if not isinstance(obj, dict):
        raise UsageError(f"'{path}' is not a fednest-mpi checkpoint file")
    return obj


def _identity_of(data: bytes) -> str:
    """What a client file says it is (for the message about a foreign file), or ''."""
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of damaged bytes
            warnings.simplefilter("ignore")
            obj = torch.load(io.BytesIO(data.partition(b"\n")[2]), map_location="cpu", weights_only=True)
        who = obj["identity"]
        return (
            f" (it holds rank {who['rank']}'s clients at iteration {who['iteration']} of a run with config "
            f"{who['config_sha256'][:12]})"
        )
    except Exception:  # noqa: BLE001 -- any damage: nothing to add
        return ""


def save(comm, folder: str | Path, ckpt: Checkpoint, client_states: ClientStates, series_digests=None) -> None:
    """Write ``ckpt`` and every rank's ``client_states`` (name -> (ids, rows)) to ``folder``.

    **Collective** over ``comm`` (a gather of file names to rank 0, then a barrier: every rank
    returns once the checkpoint is complete). Rank 0's ``ckpt`` is saved; ``ckpt.client_files``
    and ``ckpt.client_digests`` are filled in here, and ``ckpt.client_series_digests``: the sum over the ranks
    of their ``series_digests`` (uint64, :func:`fednest_mpi.io.clients.column_digests` of the clients each
    records; None: none), which rides in the same gather.
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
        identity = {
            "config_sha256": config_digest(ckpt.config_json),
            "iteration": ckpt.iteration,
            "rank": rank,
            "mpi_size": ckpt.mpi_size,
        }
        sha = atomic_save({"identity": identity, "states": states}, folder / name)
        mine = (name, torch.unique(torch.cat([ids for ids, _ in states.values()])), sha)
    gathered = comm.gather((mine, series_digests), root=0)
    if rank == 0:
        parts = [np.asarray(d, dtype=np.uint64) for _, d in gathered if d is not None]
        if parts:
            with np.errstate(over="ignore"):
                total = np.sum(parts, axis=0, dtype=np.uint64)
            ckpt.client_series_digests = torch.from_numpy(total.view(np.int64).copy())
        _commit(folder, ckpt, [w for w, _ in gathered])
    comm.Barrier()


def _commit(folder: Path, ckpt: Checkpoint, written: list) -> None:
    """Rank 0: write the manifest naming the client files just ``written``, then drop older ones."""
    ckpt.client_files = {name: ids for name, ids, _ in (w for w in written if w is not None)}
    ckpt.client_digests = {name: sha for name, _, sha in (w for w in written if w is not None)}
    record = {f.name: getattr(ckpt, f.name) for f in dataclasses.fields(ckpt)}
    record["x"], record["y"] = ckpt.x.detach().cpu(), ckpt.y.detach().cpu()
    record["algorithm_state"] = {key: value.detach().cpu() for key, value in ckpt.algorithm_state.items()}
    record["config_sha256"] = config_digest(ckpt.config_json)
    atomic_save(record, folder / MANIFEST)
    # the new checkpoint is complete: the client files of older (or unfinished) ones can go
    for stale in [*folder.glob("clients-*.pt"), *folder.glob(".*.tmp")]:
        if stale.name not in ckpt.client_files:
            stale.unlink(missing_ok=True)


def load(folder: str | Path) -> Checkpoint:
    """The latest checkpoint in ``folder`` (its replicated part), its manifest checked (digest, fields,
    config); UsageError when there is none or it is damaged."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.exists() and not path.is_symlink():
        raise UsageError(
            f"--resume: no checkpoint in '{folder}' (no {MANIFEST}); run without --resume to start "
            "the run, or set run.checkpoint_dir to the folder of the run you want to continue"
        )
    data = _load(path)
    names = {f.name for f in dataclasses.fields(Checkpoint)}
    missing = sorted(names - set(data) - OPTIONAL)
    if missing:
        raise UsageError(f"checkpoint file '{path}' lacks {', '.join(missing)}; start the run again without --resume")
    ckpt = Checkpoint(**{k: v for k, v in data.items() if k in names})
    try:
        saved = json.loads(ckpt.config_json)
        assert isinstance(saved, dict) and config_digest(ckpt.config_json) == data.get("config_sha256")
        assert set(ckpt.client_files) == set(ckpt.client_digests)
    except Exception:  # noqa: BLE001 -- any inconsistency of the manifest
        raise UsageError(
            f"checkpoint file '{path}' holds a damaged config or file list; start the run again without --resume"
        ) from None
    return ckpt


def check_client_files(folder: str | Path, ckpt: Checkpoint) -> None:
    """Refuse (UsageError naming the file) unless every client file ``ckpt`` names is there, is the
    very file its manifest recorded (SHA-256) and belongs to this run and iteration. No MPI."""
    for name in sorted(ckpt.client_files):
        if not re.fullmatch(rf"clients-k{ckpt.iteration:09d}-r\d{{5}}\.pt", name):
            raise UsageError(
                f"checkpoint file '{Path(folder) / MANIFEST}' names a client file {name!r} of another iteration"
            )
        _load(Path(folder) / name, ckpt.client_digests[name])


def load_client_states(folder: str | Path, ckpt: Checkpoint, clients) -> ClientStates:
    """The saved per-client state of the client ids in ``clients`` (this rank's), read only from
    the files that hold some of them; name -> (ids in increasing order, rows). Names of which
    none of ``clients`` was saved are left out."""
    wanted = np.asarray(clients, dtype=np.int64)
    parts: dict[str, list] = {}
    for name, ids in ckpt.client_files.items():
        if not np.isin(ids.numpy(), wanted).any():
            continue
        path = Path(folder) / name
        content = _load(path, ckpt.client_digests[name])
        try:
            states = content["states"]
            found = torch.unique(torch.cat([ids_k for ids_k, _ in states.values()]))
            complete = torch.equal(found, torch.unique(ids))
        except Exception:  # noqa: BLE001 -- a file of another layout
            complete = False
        if not complete:
            raise UsageError(
                f"checkpoint file '{path}' does not hold the clients its manifest lists; start the run again"
            )
        for key, (ids_k, rows) in states.items():
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
    for key in PATH_FIELDS:  # the same file however it is spelled (./runs/x.h5, runs/x.h5, /abs/runs/x.h5)
        values = [f.get(key) for f in flat]
        if all(isinstance(v, str) and v for v in values) and len({os.path.realpath(str(v)) for v in values}) == 1:
            for f in flat:
                f.pop(key)
    return [
        f"{key}: checkpoint {then!r}, now {now!r}"
        for key, (then, now) in config.differing_fields(flat, ignore=RESUMABLE_CHANGES).items()
    ]


def check_resumable(ckpt: Checkpoint, cfg) -> None:
    """UsageError unless ``cfg`` may continue ``ckpt`` (same config up to :data:`RESUMABLE_CHANGES`)."""
    try:
        diffs = config_differences(ckpt.config_json, cfg)
    except Exception as exc:  # noqa: BLE001 -- a config of another shape inside the checkpoint
        raise UsageError(
            f"--resume: the config inside the checkpoint cannot be compared with this one ({type(exc).__name__}: "
            f"{exc}); start the run again without --resume"
        ) from None
    if diffs:
        raise UsageError(
            "--resume: the config differs from the checkpoint's in "
            + "; ".join(diffs)
            + ". Resume with the config of the interrupted run (only "
            + ", ".join(sorted(RESUMABLE_CHANGES))
            + " may change)"
        )
    if ckpt.iteration > cfg.algorithm.outer_iterations:
        raise UsageError(
            f"--resume: the checkpoint is at iteration {ckpt.iteration}, beyond algorithm.outer_iterations "
            f"= {cfg.algorithm.outer_iterations}; raise outer_iterations to at least {ckpt.iteration}"
        )
