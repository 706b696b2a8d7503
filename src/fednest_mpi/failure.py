"""Ending a job after an exception on any rank with every file closed and in step.

An exception on one rank leaves the others blocked in a collective the failed rank never joins;
``MPI_Abort`` ends them (with SIGKILL under MPICH's launcher and SLURM), so they cannot close their
files themselves, and the run file would lose rows still in flight on rank 0. So before aborting,
the failed rank tells every rank through the file system they share (the output's folder), where a
thread on every rank watches:

1. the failed rank creates the folder ``RUN.h5.failed/`` (its message in ``failed-rankR``);
2. every rank's watcher (polling every :data:`POLL_SECONDS`) or the failed rank itself takes the I/O
   guard (so no write is half done), closes its files and writes ``closed-rankR``. Rank 0 first cuts
   the run file to the rows it has written (R, every column, ``/ranks`` and ``/snapshots`` to match)
   and writes R into its note; the other ranks wait for it (at most :data:`ACK_SECONDS`) and cut
   their client files to the same R iterations (they can only be ahead of rank 0, never behind);
3. the failed rank waits until every rank has closed (at most :data:`ACK_SECONDS`), then aborts.

A run ended at once (a second stop signal, ``run.stop_timeout``, the watchdog: :mod:`fednest_mpi.stop`)
uses the same folder without an abort: the ending rank writes ``end-rankR`` (exit code and message)
instead of ``failed-rankR``, every rank closes its files as above, waits until every rank has closed
(at most :data:`END_ACK_SECONDS`: a stopped rank never does) and exits by itself with that code
(``on_end``), so the launcher sees every rank end normally.

After the guard has closed the files, a write from the main thread waits for the abort instead of
failing a second time. The folder of an earlier run is removed by rank 0 when it takes the output's
lock (:mod:`fednest_mpi.lock`). No MPI and no HDF5 here.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import os
import shutil
import threading
import time
from pathlib import Path
from typing import IO

from fednest_mpi import atomic

POLL_SECONDS = 0.5  # how often the watcher looks for a failure (one stat)
ACK_SECONDS = 10.0  # how long the failed rank waits for every rank to close its files
END_ACK_SECONDS = 5.0  # how long a rank ending at once waits for the others to close theirs
GUARD_SECONDS = 5.0  # how long closing waits for a write in progress (a write blocked on I/O: files left as they are)
_GUARD = threading.RLock()
_CLOSED = threading.Event()


def folder_of(output: str | Path) -> Path:
    """The folder through which the ranks of a run writing ``output`` learn of a failure."""
    return Path(str(output) + ".failed")


def clear(output: str | Path) -> None:
    """Remove the failure folder of an earlier run (rank 0, holding the output's lock)."""
    shutil.rmtree(folder_of(output), ignore_errors=True)


class guard:
    """Context manager around every write to a run's HDF5 files: excludes closing them meanwhile,
    and once they were closed after a failure, waits to be aborted (at most a minute, then exits)."""

    def __enter__(self):
        _GUARD.acquire()
        if _CLOSED.is_set():
            _GUARD.release()
            time.sleep(60.0)
            os._exit(1)
        return self

    def __exit__(self, *exc):
        _GUARD.release()


class Watch:
    """One rank's part: a thread watching for another rank's failure, and :meth:`fail` for its own.

    ``close(rows)`` closes this rank's files, cutting them to ``rows`` iterations (None: as many as
    this rank completed), and returns the rows kept (rank 0: those of the run file). ``on_end(code,
    message)`` ends this rank after another rank's :meth:`end` (it must not return)."""

    def __init__(self, output: str | Path, rank: int, size: int, close, on_end=None):
        self.folder, self.rank, self.size, self.close = folder_of(output), rank, size, close
        self.on_end = on_end
        self._done = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fednest-failure-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and wait for it (the run is over). It must not outlive the run: a daemon
        thread still running at interpreter exit is terminated where it stands, and if the cyclic
        garbage collector was freeing an h5py object in it, h5py's global lock stays taken and the
        exit hangs."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            if self.folder.is_dir() and any(self.folder.glob("failed-rank*")):
                self._close_files()
                return
            ends = sorted(self.folder.glob("end-rank*")) if self.folder.is_dir() else []
            if ends and self.on_end is not None:
                code, _, message = _read(ends[0]).partition("\n")
                self._close_files()
                self._wait_closed(END_ACK_SECONDS)
                self.on_end(int(code or 1), message)
                return

    def _close_files(self) -> None:
        with self._done:
            if self._closed:
                return
            self._closed = True
            kept = None
            if _GUARD.acquire(timeout=GUARD_SECONDS):
                try:
                    rows = None if self.rank == 0 else self._rank0_rows()
                    try:
                        kept = self.close(rows)
                    except Exception:  # noqa: BLE001 -- a broken file must not stop the others from closing
                        kept = None
                    _CLOSED.set()
                finally:
                    _GUARD.release()
            _write(self.folder / f"closed-rank{self.rank:05d}", "" if kept is None else str(kept))

    def _rank0_rows(self) -> int | None:
        deadline = time.monotonic() + ACK_SECONDS / 2
        note = self.folder / "closed-rank00000"
        while time.monotonic() < deadline:
            try:
                text = note.read_text().strip()
                return int(text) if text else None
            except (OSError, ValueError):
                time.sleep(0.05)
        return None

    def fail(self, message: str) -> None:
        """This rank failed: tell the others, close this rank's files, wait until all are closed."""
        self.folder.mkdir(parents=True, exist_ok=True)
        _write(self.folder / f"failed-rank{self.rank:05d}", message)
        self._close_files()
        self._wait_closed(ACK_SECONDS)
        self.stop()

    def end(self, code: int, message: str) -> None:
        """End the run at once (no abort): tell the others, close this rank's files and wait until
        every rank has closed (at most :data:`END_ACK_SECONDS`)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        _write(self.folder / f"end-rank{self.rank:05d}", f"{code}\n{message}")
        self._close_files()
        self._wait_closed(END_ACK_SECONDS)

    def printed(self) -> None:
        """The rank that prints the job's line of a run ended at once has printed it (:meth:`wait_printed`)."""
        _write(self.folder / "printed", "")

    def wait_printed(self, seconds: float) -> None:
        """Wait (at most ``seconds``) until the job's line is printed: a rank that exits before it would end the
        job (the launcher stops every rank when one exits with an error) before the line is out."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (self.folder / "printed").exists():
            time.sleep(0.05)

    def closed(self, rank: int) -> bool:
        """Whether ``rank`` has closed its files after a failure or an end."""
        return (self.folder / f"closed-rank{rank:05d}").exists()

    def _wait_closed(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(list(self.folder.glob("closed-rank*"))) < self.size:
            time.sleep(0.05)


#: the compiled fatal-signal line (fatal_line.c) while a run is on: None without a C compiler or between runs
_FATAL_LINE: ctypes.CDLL | None = None
_HOOKS: list[bytes] = []  # the plugin hooks this rank is in, innermost last (hook_entered / hook_left)


def hook_entered(name: str) -> None:
    """This rank now runs plugin hook ``name`` (``problem 'p' hook grad_x_outer``): the line of a fatal signal
    names it (:class:`FatalLog`). A C function call; nothing while no run is on."""
    if _FATAL_LINE is not None:
        _HOOKS.append(name.encode(errors="replace"))
        _FATAL_LINE.fatal_line_hook(_HOOKS[-1], len(_HOOKS[-1]))


def hook_left() -> None:
    """The hook of the last :func:`hook_entered` returned (or raised)."""
    if _FATAL_LINE is not None and _HOOKS:
        _HOOKS.pop()
        name = _HOOKS[-1] if _HOOKS else b""
        _FATAL_LINE.fatal_line_hook(name, len(name))


class FatalLog:
    """What a rank that dies of a fatal signal (a C-level ``abort()`` in a plugin, a segmentation fault) leaves.
    No Python code runs in that signal's handler, so a compiled one (``fatal_line.c``, built by
    :func:`fednest_mpi.native.build`; none without a C compiler) writes the rank's one line at once, naming the
    signal and the plugin hook it was in (:func:`hook_entered`): ``fednest-mpi: rank 1/2: run failed: killed by
    SIGABRT (an abort) in problem 'm:P' hook grad_x_outer (its Python stack: RUN.h5.failed/fatal-rank00001.log;
    fednest-mpi recover RUN.h5 names the function)``; then :mod:`faulthandler` writes the last Python stack to
    ``RUN.h5.failed/fatal-rankR.log``, and ``fednest-mpi recover`` names the function it died in
    (:func:`fatal_note`). :meth:`close` at the run's end removes the empty file and the handlers. Where
    faulthandler is enabled already (``PYTHONFAULTHANDLER``, ``python -X faulthandler``, pytest) the stack goes
    where it was chosen to go."""

    def __init__(self, output: str | Path, rank: int, size: int = 1):
        self.path = folder_of(output) / f"fatal-rank{rank:05d}.log"
        self.file: IO[str] | None = None
        if not faulthandler.is_enabled():  # else someone chose where the stack goes: left so
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.file = open(self.path, "w")  # noqa: SIM115 -- open for the run, closed by close()
                faulthandler.enable(file=self.file, all_threads=False)
            except OSError:
                self.file = None
        where = f"its Python stack: {self.path}; " if self.file is not None else ""
        self._line(
            f"fednest-mpi: rank {rank}/{size}: run failed: killed by ",
            f" ({where}fednest-mpi recover {output} names the function)",
        )

    @staticmethod
    def _line(prefix: str, suffix: str) -> None:
        global _FATAL_LINE
        lib = _fatal_line_library()
        if (
            lib is not None
            and lib.fatal_line_install(prefix.encode(errors="replace"), suffix.encode(errors="replace")) == 0
        ):
            _FATAL_LINE = lib

    def close(self) -> None:
        global _FATAL_LINE
        if _FATAL_LINE is not None:
            _FATAL_LINE.fatal_line_uninstall()
            _FATAL_LINE = None
            _HOOKS.clear()
        if self.file is None:
            return
        faulthandler.disable()
        self.file.close()
        self.file = None
        try:
            if not self.path.stat().st_size:
                self.path.unlink()
            self.path.parent.rmdir()  # only when empty: another rank's notes stay
        except OSError:
            pass


@functools.cache
def _fatal_line_library() -> ctypes.CDLL | None:
    from fednest_mpi import native

    lib = native.build(Path(__file__).with_name("fatal_line.c"), ("-O2", "-fPIC", "-shared"), "fatal-signal line")
    if lib is not None:
        lib.fatal_line_install.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        lib.fatal_line_install.restype = ctypes.c_int
        lib.fatal_line_hook.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.fatal_line_hook.restype = None
        lib.fatal_line_uninstall.restype = None
    return lib


def fatal_note(output: str | Path) -> str | None:
    """``rank R died of a fatal signal (Fatal Python error: Aborted) in File "m.py", line 9 in grad_y_inner
    (RUN.h5.failed/fatal-rankR.log)`` for the first rank whose :class:`FatalLog` holds a dump, or None."""
    for path in sorted(folder_of(output).glob("fatal-rank*.log")):
        lines = [line.strip() for line in _read(path).splitlines() if line.strip()]
        if not lines:
            continue
        frames = [line for line in lines if line.startswith("File ")]
        where = f" in {frames[0]}" if frames else ""
        return f"rank {int(path.stem[len('fatal-rank') :])} died of a fatal signal ({lines[0]}){where} ({path})"
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    try:
        atomic.write_bytes(path, text.encode())
    except OSError:
        pass
