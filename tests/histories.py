"""Comparing the per-iteration histories of two runs (1 rank vs N ranks, resumed vs uninterrupted)."""

import numpy as np

TIMING = {"wall_time", "algorithm_time", "evaluation_time", "comm_seconds"}  # machine-dependent columns


def assert_histories_match(actual: dict, expected: dict, rtol: float | None = None, atol: float = 0.0) -> None:
    """Every non-timing column of ``expected`` equals ``actual``'s: bitwise when ``rtol`` is None,
    else to (rtol, atol)."""
    for key, values in expected.items():
        if key in TIMING:
            continue
        a, b = np.asarray(actual[key]), np.asarray(values)
        if rtol is None:
            np.testing.assert_array_equal(a, b, err_msg=key)
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=key)
