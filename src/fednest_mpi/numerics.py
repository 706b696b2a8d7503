"""The numerical mode of a run: which code paths of the math libraries compute it.

A run is bitwise the same for every chunk size and rank count by the project's own structure:

* the sums over clients are exact (:mod:`fednest_mpi.exactsum`, ``federation.reduction = "exact"``, the
  default), so how the members of a round are grouped into chunks and ranks cannot show;
* every row of an oracle is computed by the same kernel whatever the block it sits in: shared-weight
  products go through fixed-shape tiles (:func:`fednest_mpi.problems.kernels.rowwise_linear`), a block of
  one client is evaluated as two (``problems.base``), element-wise kernels are position independent
  (``problems.kernels``), and the small Gram matrices of the shared-start local steps are the project's own
  fixed-order dot products (:func:`fednest_mpi.problems.kernels.gram`), whatever the BLAS or its mode.

One library fact is left: **MKL** (torch's BLAS: every ``matmul``/``bmm``/``addmm``, also inside autograd)
rounds a batched product differently depending on where each matrix of the batch sits in memory (measured on
an AMD EPYC, Zen 4: a ``bmm`` writing client 1 at byte offset 360 of its row gives other bits than at offset
0). Its *strict* conditional numerical reproducibility (``mkl_cbwr_set(AUTO | STRICT)``) removes exactly that
and keeps MKL on its own fastest branch for the CPU. ``import fednest_mpi`` switches it on when torch is already
loaded (a library call, no environment variable), and every run does so before its first computation
(:func:`establish`). When a program computed with torch before that, MKL can no longer switch: the run goes on
with one warning that names the consequence (:func:`establish`), it never stops.

:data:`MODES` names what ``run.numerics`` asks for:

* ``reproducible`` (default): strict MKL on its own branch, ATen and numpy on theirs. Bitwise invariant to chunk
  size and rank count on every x86-64 CPU; the same bits on machines of one CPU class (:func:`cpu_class`).
  Cost against ``native``: docs/performance.md.
* ``portable``: MKL's vendor-independent ``COMPATIBLE`` branch and ATen's AVX2 kernels: also the same bits on
  Intel and AMD (one known exception, docs/design.md). ATen's path is read at its first use, so this mode
  needs a process in which torch has not computed yet (else a :class:`ConfigError` says so).
* ``native``: each library's own choice, MKL not strict: no guarantee, the baseline of the cost tables.

numpy's OpenBLAS computes nothing of a run (the quadratic problem's QR and solves go through torch), so no
mode touches it. :func:`in_force` says what is in force, for the run file and CI. Nothing here changes
``os.environ`` at import; only :func:`establish` for ``portable`` sets ``ATEN_CPU_CAPABILITY`` (read by torch
at its first computation).
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import platform
import sys
from dataclasses import dataclass
from functools import cache

from fednest_mpi.errors import ConfigError

# mkl_cbwr.h
_CBWR_BRANCH = 1
_CBWR_ALL = -1
_CBWR_STRICT = 0x10000
_CBWR_BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 8: "SSE4_2", 9: "AVX", 10: "AVX2", 12: "AVX512"}
_CBWR_CODES = {name: code for code, name in _CBWR_BRANCHES.items()}
_CBWR_MODE_CHANGE_FAILURE = -8

#: Variable that, for tests of another code path, replaces the MKL branch a mode asks for (e.g. ``COMPATIBLE``).
MKL_BRANCH_OVERRIDE = "FEDNEST_MKL_BRANCH"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mode:
    """What one value of ``run.numerics`` asks of the libraries (None: the library's own choice for this CPU)."""

    mkl_branch: str | None  #: MKL CNR branch (``AUTO``: MKL's own branch for the CPU)
    strict: bool  #: MKL strict CNR (results independent of operand alignment)
    aten: str | None  #: ATEN_CPU_CAPABILITY
    summary: str


MODES = {
    "reproducible": Mode(
        "AUTO",
        True,
        None,
        "chunk- and rank-count invariant on every x86-64 CPU at each library's own speed; the same bits on the "
        "machines of one CPU class",
    ),
    "portable": Mode(
        "COMPATIBLE",
        False,
        "avx2",
        "also the same bits on Intel and AMD alike (MKL's vendor-independent branch, ATen's AVX2 kernels: slower)",
    ),
    "native": Mode(None, False, None, "each library's fastest path for this CPU: no guarantee, the cost baseline"),
}
DEFAULT = "reproducible"
#: Variable naming the mode that ``import fednest_mpi`` prepares (default :data:`DEFAULT`; read, never written).
MODE_VARIABLE = "FEDNEST_NUMERICS"


def environment_mode() -> str:
    """The mode named by ``FEDNEST_NUMERICS``, or :data:`DEFAULT` (an unknown name is ignored here: the
    run's own ``run.numerics`` is validated with the config)."""
    name = os.environ.get(MODE_VARIABLE, DEFAULT)
    return name if name in MODES else DEFAULT


def cpu_info() -> dict[str, str]:
    """vendor, model name and the vector flags that select code paths, from /proc/cpuinfo."""
    info = {"vendor": platform.machine(), "model": platform.processor() or platform.machine(), "flags": ""}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return info
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    info["vendor"] = fields.get("vendor_id", info["vendor"])
    info["model"] = fields.get("model name", info["model"])
    info["flags"] = " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
    return info


def _cbwr_value(mode: Mode) -> str | None:
    branch = mode.mkl_branch
    if branch is not None:
        branch = os.environ.get(MKL_BRANCH_OVERRIDE, branch)
    return None if branch is None else branch + (",STRICT" if mode.strict else "")


def _set_mkl(wanted: str | None) -> bool:
    """Put MKL's CNR mode to ``wanted`` (None: OFF). False when MKL already computed in another mode (it can
    switch only before its first computation); True when in force or there is no MKL."""
    fns = _mkl()
    if fns is None:
        return True
    branch, _, strict = (wanted or "OFF").partition(",")
    code = _CBWR_CODES[branch] | (_CBWR_STRICT if strict else 0)
    return fns[0](_CBWR_ALL) == code or fns[1](code) == 0


def prepare_at_import() -> None:
    """Called by ``import fednest_mpi`` and by :mod:`fednest_mpi.problems` (the first of the package to load
    torch, so an oracle evaluated outside a run is covered too): when torch is loaded, put the MKL setting of the
    default mode (or of ``FEDNEST_NUMERICS``) in force now, before the program's first torch computation can fix
    MKL's mode (the environment is untouched). Without torch loaded nothing is loaded here (reading a config
    needs no torch): every run puts its mode in force before its first computation (:func:`establish`).
    ``portable`` also needs ATen's path, which :func:`establish` sets and checks."""
    if "torch" not in sys.modules:  # reading configs stays free of torch; the run itself sets MKL first
        return
    mode = MODES[environment_mode()]
    if mode.aten is None:
        _set_mkl(_cbwr_value(mode))


@cache
def _mkl():
    """(get, set) of MKL's CNR functions inside torch's CPU library, or None (no MKL: another BLAS)."""
    import torch

    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        lib = ctypes.CDLL(path)
        get, put = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_set
    except (OSError, AttributeError):
        return None
    get.argtypes, get.restype, put.argtypes, put.restype = [ctypes.c_int], ctypes.c_int, [ctypes.c_int], ctypes.c_int
    return get, put


def _mkl_setting() -> str:
    fns = _mkl()
    if fns is None:
        return "no MKL"
    every = fns[0](_CBWR_ALL)
    branch = _CBWR_BRANCHES.get(every & 0xFFFF, str(every & 0xFFFF))
    return branch + (",STRICT" if every & _CBWR_STRICT else "")


def _openblas_core() -> str:
    if "numpy" not in sys.modules:
        return "not loaded"
    import numpy

    libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__) + ".libs", "libscipy_openblas*.so"))
    try:
        get = ctypes.CDLL(libs[0]).scipy_openblas_get_corename64_
    except (IndexError, OSError, AttributeError):
        return "unknown"
    get.restype = ctypes.c_char_p
    return get().decode()


def in_force() -> dict[str, str]:
    """The code paths now in force: the MKL CNR setting, ATen's capability, OpenBLAS's core and the CPU."""
    import torch

    cpu = cpu_info()
    return {
        "mkl": _mkl_setting(),
        "aten": torch.backends.cpu.get_cpu_capability(),
        "openblas": _openblas_core(),
        "cpu_vendor": cpu["vendor"],
        "cpu_model": cpu["model"],
        "cpu_flags": cpu["flags"],
    }


def cpu_class(paths: dict[str, str]) -> str:
    """The class of machines that give the same bits as this one: vendor, MKL setting and ATen path (the
    CPU model does not enter: a code path is the same on every model that runs it; OpenBLAS computes
    nothing of a run)."""
    vendor = "any x86-64" if paths["mkl"].startswith("COMPATIBLE") else paths["cpu_vendor"]
    return f"{vendor}; MKL {paths['mkl']}; ATen {paths['aten']}"


def establish(name: str) -> dict[str, str]:
    """Put mode ``name`` (a key of :data:`MODES`) in force, as far as the libraries still allow, and return
    :func:`in_force`. ``reproducible`` never stops a run: when MKL already computed without strict CNR it logs
    one warning (once per process) saying that the chunk- and rank-count invariance is then not guaranteed.
    ``portable`` raises a :class:`ConfigError` naming ``run.numerics`` when MKL or ATen already computed on
    another path (its promise, the same bits across vendors, could not be kept). ``native`` asks nothing."""
    mode = MODES[name]
    wanted = _cbwr_value(mode)
    if mode.aten is not None and "ATEN_CPU_CAPABILITY" not in os.environ:
        os.environ["ATEN_CPU_CAPABILITY"] = mode.aten  # read by torch at its first computation, not before
    mkl_ok = _set_mkl(wanted)
    paths = in_force()
    aten_ok = mode.aten is None or paths["aten"].lower() == mode.aten
    if name == "portable" and not (mkl_ok and aten_ok):
        raise ConfigError(
            f"run.numerics: 'portable' needs MKL in CNR mode {wanted} and ATen {mode.aten}, but torch already "
            f"computed with MKL {paths['mkl']} and ATen {paths['aten']}; run it in a fresh process (fednest-mpi run, "
            "or import fednest_mpi and start the run before any torch computation), or set run.numerics = "
            "'reproducible'"
        )
    if not mkl_ok and name == "reproducible":
        _warn_once(
            f"run.numerics 'reproducible': MKL already computed in CNR mode {paths['mkl']} before this run could make "
            f"it {wanted}, so results may differ in the last bits between chunk sizes and rank counts; start runs "
            "in a fresh process, or import fednest_mpi before the program's first torch computation"
        )
    return paths


@cache
def _warn_once(message: str) -> None:
    logger.warning(message)


def describe(name: str = DEFAULT) -> str:
    """Lines that say where a program runs: the CPU, the libraries and the code paths of mode ``name`` (CI's
    summary; ``python -c "from fednest_mpi import numerics; print(numerics.describe())"``)."""
    import numpy
    import torch

    paths = establish(name)
    paths = in_force()  # numpy is loaded now: OpenBLAS's core is known
    return "\n".join(
        (
            f"CPU: {paths['cpu_model']} ({paths['cpu_vendor']}; {paths['cpu_flags']})",
            f"libraries: torch {torch.__version__} (MKL: {torch.backends.mkl.is_available()}), "
            f"numpy {numpy.__version__}",
            f"numerical mode {name!r}: MKL CNR {paths['mkl']}, ATen {paths['aten']} "
            f"(numpy's OpenBLAS: {paths['openblas']})",
            f"CPU class: {cpu_class(paths)}",
        )
    )
