"""The numerical mode of a run: which code paths of the three math libraries compute it.

The bits of a run depend on the code path each library picks for the CPU it runs on:

* **MKL** (torch's BLAS: every ``matmul``/``bmm``/``addmm``) dispatches by instruction set and, on
  some CPUs, blocks a product by cache size and operand alignment: on an AMD EPYC (Zen 4) its default
  path rounds a row of a product differently depending on where the row sits in memory, which breaks
  the chunk-size and rank-count invariance (issue 23). Its *conditional numerical reproducibility*
  (CNR) mode pins a code branch; ``STRICT`` also makes it independent of alignment.
* **ATen** (torch's own vectorised kernels: exp, softmax, sums) dispatches by vector width
  (``ATEN_CPU_CAPABILITY``: AVX2 or AVX-512 lanes sum in a different order).
* **OpenBLAS** (numpy's BLAS and LAPACK) dispatches by core type (``OPENBLAS_CORETYPE``: SkylakeX
  kernels on AVX-512 CPUs, Haswell kernels elsewhere; the two give other bits for the same QR), so the
  package computes nothing of a run with it (the quadratic problem's QR and solves go through torch)
  and pins it only for the users' own numpy code.

:data:`MODES` names what ``run.numerics`` pins; :func:`establish` puts a mode in force (MKL through
``mkl_cbwr_set``, which works until MKL's first computation, ATen and OpenBLAS through their variables,
read at their first use) and :func:`in_force` says what is in force, for the run file and CI.
``import fednest_mpi`` establishes the default mode's variables, so every entry point (command line,
``Session``, ``runner.simulate``, tests, ``bench/``, job scripts) starts in it before any library
initialises; a run then checks and, where still possible, switches to its own ``run.numerics``.
What each mode guarantees across machines: docs/design.md, "Reproducible across machines".
"""

from __future__ import annotations

import ctypes
import glob
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

#: Variable that, for tests of the other CPU class, replaces the MKL branch a mode asks for (e.g. ``AUTO``:
#: the branch MKL falls back to on a non-Intel CPU, where it refuses ``AVX2``).
MKL_BRANCH_OVERRIDE = "FEDNEST_MKL_BRANCH"


@dataclass(frozen=True)
class Mode:
    """What one value of ``run.numerics`` pins (None: the library's own choice for this CPU)."""

    mkl_branch: str | None  #: MKL CNR branch on an Intel CPU
    mkl_branch_elsewhere: str | None  #: on other vendors (MKL refuses the Intel-only branches there)
    strict: bool  #: MKL strict CNR (results independent of operand alignment)
    aten: str | None  #: ATEN_CPU_CAPABILITY
    openblas: str | None  #: OPENBLAS_CORETYPE
    summary: str


MODES = {
    "reproducible": Mode(
        "AVX2",
        "AUTO",
        True,
        "avx2",
        "Haswell",
        "chunk- and rank-count invariant on every x86-64 CPU; the same bits on every Intel CPU with AVX2 and on "
        "every AMD CPU of one MKL branch",
    ),
    "portable": Mode(
        "COMPATIBLE",
        "COMPATIBLE",
        False,
        "avx2",
        "Haswell",
        "also the same bits on Intel and AMD alike (MKL's vendor-independent SSE2 branch: slower products)",
    ),
    "native": Mode(None, None, False, None, None, "each library's fastest path for this CPU: no guarantee across CPUs"),
}
DEFAULT = "reproducible"
#: Variable naming the mode that ``import fednest_mpi`` establishes (default :data:`DEFAULT`): a program
#: that runs only ``run.numerics = 'native'`` sets it so that numpy's and ATen's paths are free too.
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


def _intel() -> bool:
    return cpu_info()["vendor"] == "GenuineIntel"


def _wanted_mkl(mode: Mode) -> str | None:
    branch = mode.mkl_branch if _intel() else mode.mkl_branch_elsewhere
    if branch is not None:
        branch = os.environ.get(MKL_BRANCH_OVERRIDE, branch)
    return branch


def _cbwr_value(mode: Mode) -> str | None:
    branch = _wanted_mkl(mode)
    return None if branch is None else branch + (",STRICT" if mode.strict else "")


def set_environment(name: str) -> None:
    """Put mode ``name`` into the variables the libraries read at their first use (torch not yet computing,
    numpy not yet imported): done by ``import fednest_mpi`` for the default mode."""
    mode = MODES[name]
    for var, value in (
        ("MKL_CBWR", _cbwr_value(mode)),
        ("ATEN_CPU_CAPABILITY", mode.aten),
        ("OPENBLAS_CORETYPE", mode.openblas),
    ):
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


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
    """Put mode ``name`` (a key of :data:`MODES`) in force and return :func:`in_force`. The variables of a
    library not yet loaded are set (:func:`set_environment`), MKL is switched with ``mkl_cbwr_set``; a
    :class:`ConfigError` naming ``run.numerics`` when a pinning mode finds a library already computing on
    another path (a program that used torch or numpy before the run). ``native`` pins nothing and takes
    what is in force."""
    mode = MODES[name]
    if "numpy" not in sys.modules or "torch" not in sys.modules:
        set_environment(name)
    wanted = _cbwr_value(mode)
    fns = _mkl()
    if fns is not None:
        branch, _, strict = (wanted or "OFF").partition(",")
        code = _CBWR_CODES[branch] | (_CBWR_STRICT if strict else 0)
        if fns[0](_CBWR_ALL) != code and fns[1](code) != 0 and wanted is not None:
            raise ConfigError(
                f"run.numerics: {name!r} needs MKL in CNR mode {wanted}, but MKL already computed in mode "
                f"{_mkl_setting()}; import fednest_mpi before the first torch computation (or set MKL_CBWR={wanted} "
                "before starting Python), or set run.numerics = 'native'"
            )
    if mode.aten is not None:
        os.environ["ATEN_CPU_CAPABILITY"] = mode.aten
    paths = in_force()
    for lib, var, wanted_path in (
        ("aten", "ATEN_CPU_CAPABILITY", mode.aten),
        ("openblas", "OPENBLAS_CORETYPE", mode.openblas),
    ):
        if (
            wanted_path is not None
            and paths[lib] not in ("not loaded", "unknown")
            and (paths[lib].lower() != wanted_path.lower())
        ):
            raise ConfigError(
                f"run.numerics: {name!r} needs {var}={wanted_path}, but {lib} already runs {paths[lib]}; import "
                f"fednest_mpi before torch and numpy (or set {var}={wanted_path} before starting Python), or set "
                "run.numerics = 'native'"
            )
    return paths


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
