"""Small C libraries of the package, compiled on first use (no build step at install; no MPI, no torch here).

:func:`build` compiles one C source with the C compiler ``$CC`` (default ``cc``) into
``$XDG_CACHE_HOME/fednest-mpi`` (else a temporary folder), once per source, flags, compiler and CPU (the flags may
say ``-march=native``: the cache key holds the CPU's flags, so nodes of another CPU build their own); ranks that
build at once each write their own file and rename it into place. Without a compiler the caller falls back to
what it does without the library (:func:`fednest_mpi.exactsum.kernel`, :mod:`fednest_mpi.failure`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fednest-mpi"


def _cpu_key() -> bytes:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace").split("\n\n")[0]
    except OSError:
        text = ""
    keep = [line for line in text.splitlines() if line.startswith(("vendor_id", "model name", "flags"))]
    return "\n".join([platform.machine(), *keep]).encode()


def build(source: Path, flags: tuple[str, ...], what: str) -> ctypes.CDLL | None:
    """The shared library of the C file ``source`` compiled with ``flags`` (``-shared`` and ``-fPIC`` among them),
    loaded; None, with one log line naming ``what`` does without it, when no compiler is found or it fails."""
    compiler = os.environ.get("CC", "cc")
    try:
        text = source.read_bytes()
        version = subprocess.run([compiler, "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        logger.info("%s: no C compiler (%s)", what, exc)
        return None
    key = hashlib.sha256(b"\0".join([text, version, " ".join(flags).encode(), _cpu_key()])).hexdigest()
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / "fednest-mpi"):
        target = folder / f"{source.stem}-{key[:20]}.so"
        try:
            if not target.exists():
                folder.mkdir(parents=True, exist_ok=True)
                part = folder / f".{target.name}.{os.getpid()}"
                cmd = [compiler, *flags, "-o", str(part), str(source), "-lm"]
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                if done.returncode != 0:
                    logger.info("%s: %s failed (%s)", what, compiler, done.stderr[-300:])
                    return None
                os.replace(part, target)
            return ctypes.CDLL(str(target))
        except (OSError, subprocess.SubprocessError):
            continue
    return None
