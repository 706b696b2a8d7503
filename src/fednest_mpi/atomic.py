"""Files that appear whole under their name, written through temporary names no planted link redirects.

A file is written to a temporary name in its own folder and renamed over its name when complete
(``os.replace``, then the folder is fsynced). The temporary name is unique (random, like
:func:`tempfile.mkstemp`) and created with ``O_CREAT | O_EXCL``, which fails on anything already
there -- a symbolic link included, dangling or not -- so a link planted at a predictable name
(``RUN.h5.partial``) can never make a run write through it into another file of the user's. HDF5
files are created the same way with h5py's mode ``"x"`` (``H5F_ACC_EXCL``) at :func:`temp_name`.
No MPI and no HDF5 here.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def temp_name(path: str | Path, suffix: str = ".partial") -> Path:
    """A fresh name in ``path``'s folder for the file that will become ``path``: ``.NAME.RANDOM.partial``
    (hidden; create it exclusively)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}{suffix}")


def create_exclusive(path: str | Path, suffix: str = ".tmp") -> tuple[int, Path]:
    """(fd, name): a new file at a :func:`temp_name` of ``path``, opened for writing, created
    exclusively (never through an existing file or link)."""
    for _ in range(16):
        tmp = temp_name(path, suffix)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {str(path)!r}")


def fsync_folder(folder: str | Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace(tmp: str | Path, path: str | Path) -> None:
    """Rename the complete ``tmp`` over ``path`` and make the rename durable."""
    os.replace(tmp, path)
    fsync_folder(Path(path).parent)


def write_bytes(path: str | Path, data: bytes) -> None:
    """``path`` holds either its old content or ``data``, never a part (fsynced)."""
    fd, tmp = create_exclusive(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
