"""The committed reference results (tests/reference_runs.py, tests/data/references.json) reproduced bitwise.

Each mode runs in a fresh process: a process's numerical mode is fixed at its first computation. A CPU
class without recorded results is skipped with its name and the command that records it, never passed.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from shared_data import DATA, need

SCRIPT = Path(__file__).resolve().parents[1] / "reference_runs.py"


def check(mode: str, *args: str, **env) -> subprocess.CompletedProcess:
    need(DATA / "mnist")
    full_env = {**os.environ, "FEDNEST_DATA": str(DATA), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--mode", mode, *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reproducible", "portable", "native"])
def test_reference_runs_give_the_recorded_bits(mode):
    done = check(mode)
    if done.returncode == 3:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


@pytest.mark.slow
def test_another_code_path_is_caught_and_named():
    """The check can fail: the runs of mode portable (MKL's vendor-independent branch) compared with the results
    recorded on an Intel machine in its mode reproducible (MKL's AVX2 branch, another rounding of the float64
    quadratic run) differ, and the message names case and class."""
    done = check("portable", "--against", "GenuineIntel; MKL AVX2,STRICT; ATen AVX2")
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "DIFFERENT: quadratic_fednest_float64 in mode 'portable' on CPU class 'any x86-64; MKL COMPATIBLE" in (
        done.stdout
    )
