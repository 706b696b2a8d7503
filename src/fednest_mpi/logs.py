"""Rank-aware logging: every line says ``rank/size``; rank 0 logs at INFO, the others only warnings.
A rank's failure is one line on stderr, its traceback in a per-rank log file (:func:`log_failure`)."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path


def setup_logging(rank: int, size: int, level: int = logging.INFO) -> logging.Logger:
    """Configure the ``fednest_mpi`` logger for this rank (called by the command line only)."""
    logger = logging.getLogger("fednest_mpi")
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {rank}/{size} %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    logger.addHandler(handler)
    logger.setLevel(level if rank == 0 else logging.WARNING)
    logger.propagate = False
    return logger


def write_line(text: str) -> None:
    """``text`` as one line on stderr in a single write: lines of several ranks (short of the pipe's
    atomic size, 4 KiB) never run into each other in what mpiexec forwards."""
    sys.stderr.flush()
    data = (" ".join(text.split()) + "\n").encode(errors="surrogateescape")
    while data:
        data = data[os.write(2, data) :]


def log_failure(exc: BaseException, message: str, folder: str | Path, rank: int) -> str:
    """This rank failed with ``exc``: its full traceback goes to ``folder/traceback-rankRRRRR.log``,
    and ``message`` with that file's name to stderr as one line (:func:`write_line`); the line.
    Where the log cannot be written, the traceback follows the line on stderr."""
    path = Path(folder) / f"traceback-rank{rank:05d}.log"
    trace = "".join(traceback.format_exception(exc))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{message}\n\n{trace}", errors="surrogateescape")
        line = f"{message} (traceback: {path})"
    except OSError as err:
        line = f"{message} (traceback not written to {path}: {err.strerror or err})"
        trace = "\n" + trace
    else:
        trace = ""
    write_line(line)
    if trace:
        os.write(2, trace.encode(errors="surrogateescape"))
    return " ".join(line.split())
