"""What a path is, in words, for messages that must say what is wrong with a file the user named:
``None`` for a regular file, else "does not exist", "is a folder", "is a FIFO (named pipe)", "is a
character device", "is a symbolic link loop", ... (docs/reliability.md)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "is a folder"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), which would block the read for ever"),
    (stat.S_ISCHR, "is a character device (such as /dev/zero), not a file"),
    (stat.S_ISBLK, "is a block device, not a file"),
    (stat.S_ISSOCK, "is a socket, not a file"),
)


def not_a_file(path: str | os.PathLike) -> str | None:
    """None when ``path`` is (a link to) a regular file; else what it is instead, as a phrase."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except ValueError:  # a NUL byte, or a lone surrogate (a JSON escape) that no file name can hold
        return "holds a NUL byte or a character that no file name can hold; give the path as it is on disk"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic link loop (following its links leads back to one of them)"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR) and os.path.islink(p):
            return f"is a symbolic link to {os.readlink(p)!r}, which does not exist"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "does not exist"
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    for test, words in _KINDS:
        if test(mode):
            return words
    return "is not a regular file"
