"""Compiled kernels against their Python paths: a test computes the same thing on both and compares bits."""

from __future__ import annotations

import pytest


def on_both_paths(monkeypatch, variable: str, kernel, compute) -> list:
    """``compute()`` with the compiled kernel (``variable`` = auto) and with the Python path that must give the same
    bits (``variable`` = off), in that order; ``kernel`` is the cached loader that reads ``variable``. Skips the test
    where no kernel can be built (no C compiler). Leaves ``variable`` at auto."""
    results = []
    for path in ("auto", "off"):
        monkeypatch.setenv(variable, path)
        kernel.cache_clear()
        if path == "auto" and kernel() is None:
            pytest.skip("no C compiler here: the compiled kernel cannot be built")
        results.append(compute())
    monkeypatch.setenv(variable, "auto")
    kernel.cache_clear()
    return results
