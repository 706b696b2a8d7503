"""Opening HDF5 files that may be damaged, truncated or still open for writing: fail fast, never wait.

Every reader of run files and per-rank client files opens them through :func:`open_checked`:

1. **The header is checked first, without HDF5**: the file must be non-empty and start with the HDF5
   signature, and when its superblock (version 2 or 3, what ``libver="latest"`` writes) records the
   end-of-file address, the file must be at least that long. A file cut short at any offset is
   refused here, with both sizes.
2. **A file that was closed** (superblock status flags 0) is opened in plain read mode: HDF5 then
   verifies the end of file and every metadata checksum, and a damaged byte in the metadata fails
   the read at once.
3. **A file still marked open for writing** (a live run, or one that was killed) can only be read in
   SWMR mode, where HDF5 normally re-reads metadata whose checksum fails up to 100 times with
   growing sleeps (minutes on a damaged file). It is opened with **one** metadata read attempt
   (``H5Pset_metadata_read_attempts``, called through the loaded HDF5 library, as h5py does not wrap
   it), so damage fails the read at once there too. When that function cannot be found, an
   unclosed file is refused rather than read without a bound.

Errors raised while reading an open file are turned into one-line :class:`UsageError` messages by
:func:`reading`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import h5py

from fednest_mpi.errors import UsageError
from fednest_mpi.pathkind import not_a_file

SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: errors HDF5 and h5py raise on a damaged file (checksums, bad addresses, undecodable attributes)
READ_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError, IndexError, UnicodeDecodeError)


@dataclass(frozen=True)
class Header:
    """What the superblock at offset 0 says (version >= 2 only; else ``flags`` and ``stored_eof`` are None)."""

    size: int  # bytes on disk
    version: int
    flags: int | None  # file consistency flags: nonzero while a writer has the file open (or was killed)
    stored_eof: int | None  # end-of-file address recorded by the writer


def read_header(path: str | Path, what: str = "file") -> Header:
    """Check the HDF5 header of ``path`` without HDF5; UsageError naming the problem."""
    p = Path(path)
    instead = not_a_file(p)  # a FIFO would block the open for ever
    if instead is not None:
        raise UsageError(f"{what} {str(p)!r} {instead}; restore the file or name another")
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(48)
    except OSError as exc:
        raise UsageError(f"{what} {str(p)!r} cannot be read ({exc.strerror or exc})") from None
    if size == 0:
        raise UsageError(f"{what} {str(p)!r} is not a readable HDF5 file: it is empty (0 bytes)")
    if not head.startswith(SIGNATURE):
        raise UsageError(
            f"{what} {str(p)!r} is not a readable HDF5 file (no HDF5 signature at its start): damaged or another format"
        )
    if len(head) < 12:
        raise UsageError(f"{what} {str(p)!r} is truncated ({size} bytes, shorter than the HDF5 superblock)")
    version, offsets = head[8], head[9]
    if version < 2:
        return Header(size, version, None, None)
    if offsets != 8 or len(head) < 12 + 4 * 8:
        raise UsageError(f"{what} {str(p)!r} has a damaged or truncated HDF5 superblock ({size} bytes)")
    flags = head[11]
    base, _, eof, _ = struct.unpack("<4Q", head[12:44])
    if base + eof > size:
        raise UsageError(
            f"{what} {str(p)!r} is truncated: {size} bytes on disk, its HDF5 superblock says "
            f"{base + eof}; "
            "it was cut short (copy interrupted, disk full, damaged file system)"
        )
    return Header(size, version, flags, eof)


def _hdf5_library():
    """The HDF5 C library h5py has loaded (ctypes handle), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libhdf5" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = os.path.basename(path)
        if name.startswith("libhdf5") and not name.startswith("libhdf5_hl"):
            try:
                lib = ctypes.CDLL(path)
                lib.H5Pset_metadata_read_attempts.argtypes = [ctypes.c_int64, ctypes.c_uint]
                return lib
            except (OSError, AttributeError):
                continue
    return None


_LIB: list = []


def _bounded_swmr_fapl():
    """A file-access property list for SWMR reading with one metadata read attempt, or None."""
    if not _LIB:
        _LIB.append(_hdf5_library())
    lib = _LIB[0]
    if lib is None:
        return None
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    if lib.H5Pset_metadata_read_attempts(fapl.id, 1) < 0:
        return None
    return fapl


def open_checked(
    path: str | Path, what: str = "file", unclosed: str = "refuse", hint: str = ""
) -> tuple[h5py.File, bool]:
    """(open h5py file, whether it is still marked open for writing), after :func:`read_header`
    and :func:`precheck`.

    ``unclosed``: what to do with a file a writer has not closed (a live or a killed run):
    ``"refuse"`` (UsageError ending with ``hint``) or ``"read"`` (open it in SWMR mode, bounded).
    """
    precheck([path], what, unclosed, hint)
    return _open(path, what, unclosed, hint)


def _open(path: str | Path, what: str, unclosed: str, hint: str) -> tuple[h5py.File, bool]:
    p = Path(path)
    header = read_header(p, what)
    try:
        if not header.flags:
            return h5py.File(p, "r"), False
        if unclosed != "read":
            raise UsageError(f"{what} {str(p)!r} was not closed by the run that wrote it{hint}")
        fapl = _bounded_swmr_fapl()
        if fapl is None:
            raise UsageError(
                f"{what} {str(p)!r} is still marked open for writing and this HDF5 library cannot read it "
                f"with a time bound{hint}"
            )
        fid = h5py.h5f.open(os.fsencode(p), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl=fapl)
        return h5py.File(fid), True
    except READ_ERRORS as exc:
        raise UsageError(f"{what} {str(p)!r} is damaged: HDF5 cannot open it ({_short(exc)})") from None


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:200] + "...") if len(text) > 200 else text


@contextlib.contextmanager
def reading(path: str | Path, what: str = "file"):
    """Turn any error raised while reading ``path`` into a one-line UsageError naming it."""
    try:
        yield
    except UsageError:
        raise
    except READ_ERRORS as exc:
        raise UsageError(
            f"{what} {str(path)!r} is damaged: {type(exc).__name__} while reading it ({_short(exc)})"
        ) from None


# ----------------------------------------------------------------------------------------------
# a time bound on HDF5 itself

PRECHECK_SECONDS = 10.0  # a file's metadata that HDF5 cannot read in this time is damaged
_CHECKED: dict[str, tuple] = {}  # path -> (size, mtime) of files that passed the precheck in this process


def _stamp(path) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def precheck(paths, what: str = "file", unclosed: str = "refuse", hint: str = "") -> None:
    """Read the metadata of every file of ``paths`` (every attribute, the shape of every dataset, its
    first and last entry, small ones whole) in a forked child process that is killed after
    :data:`PRECHECK_SECONDS`: some damage (bytes of an attribute heap, which carries no checksum)
    makes HDF5 loop forever in C, where no signal or thread of this process could stop it. UsageError
    naming the file when the child finds damage or does not finish. Files that passed unchanged
    are not read again; without ``os.fork`` (Windows) nothing is checked here."""
    todo = [Path(p) for p in paths if _CHECKED.get(os.path.abspath(p)) != _stamp(p) or not _stamp(p)]
    if not todo or not hasattr(os, "fork"):
        return
    for p in todo:
        read_header(p, what)  # cheap checks first, in this process
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no MPI, no flushing of the parent's buffers, _exit only
        _precheck_child(r, w, todo, what, unclosed, hint)
    os.close(w)
    out = _child_report(r, pid, todo, what)
    if b"!" in out:
        raise UsageError(out.split(b"!", 1)[1].decode(errors="replace"))
    for p in todo:
        _CHECKED[os.path.abspath(p)] = _stamp(p)


def _precheck_child(r: int, w: int, todo: list[Path], what: str, unclosed: str, hint: str) -> NoReturn:
    """The forked child of :func:`precheck`: reads the metadata of each file of ``todo`` in turn, writing its
    index to ``w`` before and ``!`` with the error after a damaged one; ends with ``os._exit``, never returns."""
    status = 0
    try:
        os.close(r)
        for i, p in enumerate(todo):
            os.write(w, f"{i}\n".encode())
            _walk(p, what, unclosed, hint)
    except UsageError as exc:
        _write_all(w, ("!" + str(exc)).encode())
    except BaseException as exc:  # noqa: BLE001
        text = f"!{what} is damaged: {type(exc).__name__} while reading its metadata ({_short(exc)})"
        _write_all(w, text.encode())
    finally:
        os._exit(status)


def _child_report(r: int, pid: int, todo: list[Path], what: str) -> bytes:
    """What the child ``pid`` of :func:`precheck` writes to ``r`` until it ends; killed after
    :data:`PRECHECK_SECONDS`, when a UsageError names the file it was reading."""
    out = b""
    deadline = time.monotonic() + PRECHECK_SECONDS
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                started = [int(line) for line in out.split(b"!")[0].split()]
                bad = todo[started[-1]] if started else todo[0]
                raise UsageError(
                    f"{what} {str(bad)!r} is damaged: HDF5 did not finish reading its metadata within "
                    f"{PRECHECK_SECONDS:.0f} s (damaged structures make it loop)"
                )
            chunk = os.read(r, 65536)
            if not chunk:
                return out
            out += chunk
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _walk(path: Path, what: str, unclosed: str, hint: str) -> None:
    f, _ = _open(path, what, unclosed, hint)
    with f, reading(path, what):

        def visit(name, obj) -> None:
            for key in obj.attrs:
                obj.attrs[key]
            if isinstance(obj, h5py.Dataset) and not obj.is_virtual and obj.size:
                if obj.size <= 1 << 20:
                    obj[()]
                else:
                    obj[(0,) * obj.ndim]
                    obj[tuple(n - 1 for n in obj.shape)]

        visit("/", f)
        f.visititems(visit)
