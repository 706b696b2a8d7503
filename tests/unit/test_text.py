"""Shared message helpers (fednest_mpi.text): suggestions and byte counts, used by config, jobs,
memory checks and post-processing alike."""

import math

import pytest

from fednest_mpi.text import did_you_mean, format_bytes


def test_did_you_mean_suggests_the_closest_option_or_nothing():
    assert did_you_mean("outer_lrr", ["outer_lr", "inner_lr", "seed"]) == " (did you mean 'outer_lr'?)"
    assert did_you_mean("zzz", ["outer_lr", "seed"]) == ""
    # a lower cutoff accepts looser matches
    assert did_you_mean("error", ["x_error_norm"]) == ""  # similarity 10/17 = 0.59
    assert did_you_mean("error", ["x_error_norm"], cutoff=0.5) == " (did you mean 'x_error_norm'?)"


@pytest.mark.parametrize(
    "n, binary, text",
    [
        (0, False, "0 B"),
        (950, False, "950 B"),
        (999.6, False, "1 kB"),
        (44800, False, "44.8 kB"),
        (1234567, False, "1.23 MB"),
        (512, True, "512 B"),
        (1000, True, "1000 B"),
        (1536, True, "1.5 KiB"),
        (1010 * 1024, True, "1010 KiB"),
        (2 * 1024**3, True, "2 GiB"),
        (None, False, "-"),
        (math.nan, True, "-"),
    ],
)
def test_format_bytes_decimal_and_binary(n, binary, text):
    assert format_bytes(n, binary=binary) == text


def test_format_bytes_never_prints_an_exponent():
    for binary in (False, True):
        for exponent in range(0, 16):
            for mantissa in (1.0, 9.99, 999.4, 999.6, 1023.4, 1023.6):
                assert "e+" not in format_bytes(mantissa * 10**exponent, binary=binary)
