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


def test_the_comparison_of_digests_by_vendor(capsys):
    """compare(): a digest recorded on one vendor only is NOT YET COMPARED (not a failure) on a vendor listed as
    such, confirmed when equal, and a failure on every other vendor; a known vendor difference passes only with
    its recorded digest."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("reference_runs", SCRIPT)
    refs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(refs)
    recorded = {"a": "1" * 64, "b": "2" * 64}
    known = {
        "a": {"not_yet_compared": ["GenuineIntel"], "why": "new bits"},
        "b": {"AuthenticAMD": "3" * 64, "why": "x"},
    }

    def run(got, vendor):
        code = refs.compare(got, recorded, known, "portable", "any", {"cpu_vendor": vendor, "cpu_model": "m"})
        return code, capsys.readouterr().out

    code, out = run({"a": "9" * 64, "b": "2" * 64}, "GenuineIntel")
    assert code == 0 and "NOT YET COMPARED: a on GenuineIntel" in out and "got 9999" in out
    code, out = run({"a": "1" * 64, "b": "2" * 64}, "GenuineIntel")
    assert code == 0 and "confirmed on this vendor" in out and "same bits: 2 reference runs" in out
    code, out = run({"a": "9" * 64, "b": "2" * 64}, "AuthenticAMD")
    assert code == 1 and "DIFFERENT: a" in out
    code, out = run({"a": "1" * 64, "b": "3" * 64}, "AuthenticAMD")
    assert code == 0 and "KNOWN VENDOR DIFFERENCE: b on AuthenticAMD" in out
    code, out = run({"a": "1" * 64, "b": "4" * 64}, "AuthenticAMD")
    assert code == 1 and "DIFFERENT: b" in out
