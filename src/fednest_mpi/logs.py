"""Rank-aware logging: every line says ``rank/size``; rank 0 logs at INFO, the others only warnings."""

from __future__ import annotations

import logging
import sys


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
