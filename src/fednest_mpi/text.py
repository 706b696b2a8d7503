"""Small text helpers shared by every layer: suggestions in error messages and readable byte counts.

Standard library only, so that any module (config, jobs, memory checks, post-processing) can use
them without pulling in numpy, torch or MPI.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean", "format_bytes"]


def did_you_mean(word: str, options: Iterable[str], cutoff: float = 0.6) -> str:
    """``" (did you mean 'x_error'?)"`` for the option closest to ``word``, or ``""`` when none is close.

    ``cutoff`` is :func:`difflib.get_close_matches`'s similarity threshold (0..1).
    """
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


def format_bytes(n: float | None, binary: bool = False) -> str:
    """A byte count with a readable unit, '-' for None/NaN.

    Decimal (default): '0 B', '950 B', '44.8 kB', '1.2 MB', '3.4 GB'. ``binary``: powers of 1024,
    '512 B', '1.5 KiB', '2 GiB' (memory sizes).
    """
    if n is None or n != n:  # NaN
        return "-"
    n = float(n)
    base, units = (
        (1024.0, ("B", "KiB", "MiB", "GiB", "TiB", "PiB")) if binary else (1000.0, ("B", "kB", "MB", "GB", "TB"))
    )
    for unit in units:
        if abs(n) < base - 0.5 or unit == units[-1]:  # - 0.5: '1 kB' rather than '1e+03 B'
            digits = f"{n:.0f}" if unit == "B" or abs(n) >= 999.5 else f"{n:.3g}"  # never '1e+03'
            return f"{digits} {unit}"
        n /= base
    raise AssertionError  # unreachable: the last unit always returns
