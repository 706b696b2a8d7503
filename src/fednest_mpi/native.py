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


#: the flags of the numeric kernels (exact sum, keyed normals): no fused multiply-add and no reassociation, so every
#: operation is the IEEE one of the Python path beside it. 256-bit vectors (gcc's choice for -march=native on
#: AVX-512 CPUs, stated): 512-bit ones deposit 1,000 rows a third faster on the Intel Xeon here, yet made the paper
#: setting's iterations 1.09x instead of 1.02-1.05x of the fastest setting's (the core's lower clock under 512-bit
#: work, docs/lab/issue31.md); :func:`numeric_kernel` adds the width. Vector width changes no bit of element-wise
#: IEEE operations.
NUMERIC_FLAGS = (
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fno-math-errno",
    "-fPIC",
    "-shared",
)


def numeric_kernel(
    source: Path, switch: str, what: str, signatures: dict, vector_bits: int = 256
) -> ctypes.CDLL | None:
    """The numeric kernel ``source`` built with :data:`NUMERIC_FLAGS` (:func:`build`), each function of
    ``signatures`` (name -> (argtypes, restype)) declared; None when the environment variable ``switch`` is
    ``off`` or it cannot be built (then the caller's Python path computes the same bits). ``vector_bits``: the
    preferred vector width (512 for a kernel that runs alone between large products, where the clock concern of
    :data:`NUMERIC_FLAGS` does not arise; no bit depends on it)."""
    if os.environ.get(switch, "auto") == "off":
        return None
    lib = build(source, (*NUMERIC_FLAGS, f"-mprefer-vector-width={vector_bits}"), what)
    if lib is None:
        return None
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib
