"""One writer per output: a lock file next to the run file and next to its checkpoint folder.

``RUN.h5.lock`` (and ``CHECKPOINT_DIR.lock``) is created with ``O_CREAT | O_EXCL``, which is atomic
on every file system a cluster uses for shared data (NFS v3+, Lustre, GPFS, BeeGFS), and holds
JSON naming its writer: host, pid, start time (UTC), the command line and the SLURM job (if any).
The writer also holds a POSIX ``lockf`` lock on it where the file system supports one. The lock is
taken by rank 0 before the run's first collective and removed when the run ends (also after a
NaN stop, a usage error, SIGTERM or an exception on rank 0); a run killed by SIGKILL, ``MPI_Abort``
or a node failure leaves it behind.

A second writer (with or without ``--overwrite``, or ``--resume``) that finds the lock is refused
(``UsageError``) naming the holder. A lock whose writer is provably gone is **stale**: written on
this host by a pid that no longer runs (or whose ``lockf`` lock is free), or by an earlier start of
the same SLURM job (a requeued job: ``SLURM_JOB_ID`` equal, ``SLURM_RESTART_COUNT`` larger now).
``--resume``, ``--overwrite`` and ``fednest-mpi recover`` take a stale lock over (they are the ways
to continue, redo or repair a killed run); a new run without them is refused with the one command
that clears every stale lock of the run (:func:`acquire_all`: the output's and the checkpoint
folder's together, so one retry needs one removal). A lock written on another host cannot be
checked from here and counts as live.

No MPI and no HDF5 here.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fednest_mpi.errors import UsageError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]


_HELD: dict = {}  # lock files this process holds (never re-opened: closing any descriptor drops a lockf lock)


def lock_path(path: str | Path) -> Path:
    """The lock file of an output file or checkpoint folder: the path with ``.lock`` appended."""
    return Path(str(path).rstrip("/") + ".lock")


@dataclass
class Holder:
    """What a lock file says about its writer, and whether that writer still runs."""

    path: Path
    info: dict
    state: str  # "live", "stale" or "unknown" (another host: cannot be checked, counts as live)

    def describe(self) -> str:
        i = self.info
        job = f", SLURM job {i['slurm_job_id']}" if i.get("slurm_job_id") else ""
        return f"host {i.get('host', '?')}, pid {i.get('pid', '?')}, started {i.get('started_utc', '?')}{job}"


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True
    return True


def _lockf_free(path: Path) -> bool | None:
    """True when nobody holds a lockf lock on ``path``; None when it cannot be told."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return True
    except OSError as exc:
        return False if exc.errno in (11, 13) else None  # EAGAIN / EACCES: held
    finally:
        os.close(fd)


def _read_info(path: Path) -> dict | None:
    """The JSON of a lock file; {} when it exists but is empty or unreadable, None when it is gone."""
    for _ in range(20):  # a writer may be between creating and filling it
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except OSError:
            return {}
        try:
            info = json.loads(text)
            if isinstance(info, dict):
                return info
        except json.JSONDecodeError:
            pass
        time.sleep(0.05)
    return {}


def holder(path: str | Path) -> Holder | None:
    """The holder of the lock of ``path`` (an output file or checkpoint folder), or None when unlocked."""
    lp = lock_path(path)
    mine = _HELD.get(os.path.abspath(lp))
    if mine is not None:  # not re-opened here: that would drop this process's lockf lock
        return Holder(lp, mine.info, "live")
    info = _read_info(lp)
    if info is None:
        return None
    return Holder(lp, info, _state(lp, info))


def _state(lp: Path, info: dict) -> str:
    job = os.environ.get("SLURM_JOB_ID")
    if job and info.get("slurm_job_id") == job:
        try:
            if int(os.environ.get("SLURM_RESTART_COUNT", "0")) > int(info.get("slurm_restart_count") or 0):
                return "stale"  # an earlier start of this requeued job
        except ValueError:
            pass
    if info.get("host") != socket.gethostname():
        return "unknown"
    if not _pid_alive(info.get("pid")) or _lockf_free(lp) is True:
        return "stale"
    return "live"


def held_here(path: str | Path) -> bool:
    """Whether this process holds the lock of ``path``."""
    return os.path.abspath(lock_path(path)) in _HELD


class Lock:
    """An acquired lock file (remove it with :meth:`release`)."""

    def __init__(self, path: Path, fd: int, info: dict):
        self.path, self.info = path, info
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is None:
            return
        _HELD.pop(os.path.abspath(self.path), None)
        try:
            if _read_info(self.path) == self.info:
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self.fd)
            self.fd = None


def _this_process() -> dict:
    """What a lock file says of its holder, this process: host, pid, start, command line, SLURM job."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"),
    }


def _create(lp: Path, path: str | Path, field: str, take_stale: bool) -> int | None:
    """The lock file ``lp`` of ``path`` created exclusively, its descriptor; None where it existed and is gone
    now (released, or a stale one taken over with ``take_stale``): try again. A lock held is refused."""
    try:
        return os.open(lp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        held = holder(path)
        if held is None:
            return None  # released meanwhile
        if held.state == "stale" and take_stale:
            if _read_info(lp) == held.info:
                lp.unlink(missing_ok=True)
            return None
        raise UsageError(_refusal(field, path, held)) from None
    except OSError as exc:
        raise UsageError(
            f"{field}: cannot create the lock file {str(lp)!r} ({exc.strerror or exc}); "
            "choose a folder you can write to"
        ) from None


def _write_info(fd: int, lp: Path, info: dict) -> None:
    """Hold the new lock file ``lp`` (a POSIX lock where the file system has them) and write ``info`` into it;
    on any failure the file is closed and removed."""
    try:
        if fcntl is not None:  # before the JSON: a reader who sees the JSON also sees the lockf lock
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pass  # the file system has no POSIX locks: the lock file alone says it
        os.write(fd, json.dumps(info).encode())
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        lp.unlink(missing_ok=True)
        raise


def acquire(path: str | Path, field: str, take_stale: bool = False) -> Lock:
    """Lock ``path`` (an output file or checkpoint folder) for this process; UsageError naming the holder."""
    lp = lock_path(path)
    info = _this_process()
    try:
        lp.parent.mkdir(parents=True, exist_ok=True)  # a new output folder (run.output = out/x.h5)
    except OSError:
        pass  # reported below, with the lock file's name
    for _ in range(3):
        fd = _create(lp, path, field, take_stale)
        if fd is None:
            continue
        _write_info(fd, lp, info)
        acquired = _HELD[os.path.abspath(lp)] = Lock(lp, fd, info)
        return acquired
    raise UsageError(
        f"{field}: the lock file {str(lp)!r} keeps changing: another run is starting on the same path; "
        "choose another path"
    )


def acquire_all(targets, take_stale: bool = False) -> list[Lock]:
    """Lock every ``(path, field)`` of ``targets`` (a run's output and checkpoint folder), or none. A live
    or damaged lock is refused naming its holder (:func:`acquire`); stale locks that are not taken over
    are refused together, with one ``rm`` that clears all of them."""
    targets = list(targets)
    found = [(path, field, held) for path, field in targets if (held := holder(path)) is not None]
    for path, field, held in found:  # a running writer first: its lock must not be removed
        if held.state != "stale" or not held.info:
            raise UsageError(_refusal(field, path, held))
    if found and not take_stale:
        path, field, held = found[0]
        files = " ".join(_quote(h.path) for _, _, h in found)
        raise UsageError(
            f"{field}: {str(path)!r} has a stale lock of a run that no longer runs ({held.describe()}); continue "
            f"that run with --resume, start it again with --overwrite, or clear the "
            f"lock{'s' if len(found) > 1 else ''}: rm {files}"
        )
    locks: list[Lock] = []
    try:
        for path, field in targets:
            locks.append(acquire(path, field, take_stale=take_stale))
    except BaseException:
        for taken in reversed(locks):
            taken.release()
        raise
    return locks


def _refusal(field: str, path, held: Holder) -> str:
    if not held.info:
        return (
            f"{field}: {str(path)!r} is locked by {str(held.path)!r}, which is empty or damaged; "
            f"if no run is writing "
            f"{str(path)!r}, remove it: rm {_quote(held.path)}"
        )
    if held.state == "stale":
        return (
            f"{field}: {str(path)!r} has a stale lock of a run that no longer runs ({held.describe()}); "
            "continue that run "
            f"with --resume, start it again with --overwrite, or clear the lock: rm {_quote(held.path)}"
        )
    return (
        f"{field}: {str(path)!r} is being written by another run ({held.describe()}); wait for it to end or choose "
        f"another path; if that run is no longer running (its node failed), clear the lock: rm {_quote(held.path)}"
    )


def _quote(path: Path) -> str:
    return shlex.quote(str(path))
