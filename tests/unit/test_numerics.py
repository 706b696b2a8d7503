"""The default numerical mode without traps (fednest_mpi.numerics): ``import fednest_mpi`` leaves the environment
alone, a program that imports numpy and torch first gets the same bits as one that imports fednest_mpi first, a
program that computed with torch before its run still runs (one warning), and errors of the Python API raise.

Each case runs in a fresh process: MKL's mode is fixed for a process at its first computation."""

import json
import os
import subprocess
import sys

import pytest

from fednest_mpi.comm import SerialComm
from fednest_mpi.errors import UsageError
from fednest_mpi.session import Session

RUN = """
import hashlib, json
from fednest_mpi import config, numerics
from fednest_mpi.comm import SerialComm
from fednest_mpi.runner import simulate
cfg = config.from_dict({"seed": 3, "problem": {"name": "quadratic", "n_clients": 9, "dim_x": 3, "dim_y": 5},
                        "algorithm": {"name": "fednest", "outer_iterations": 3, "clients_per_round": 4}})
r = simulate(cfg, SerialComm())
h = hashlib.sha256(r.x.numpy().tobytes() + r.y.numpy().tobytes()).hexdigest()
print(json.dumps({"digest": h, "mkl": numerics.in_force()["mkl"]}))
"""


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FEDNEST_NUMERICS", "MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    return subprocess.run(
        [sys.executable, "-c", code], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )


def _result(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_leaves_the_environment_alone():
    done = _python(
        "import os; before = dict(os.environ)\n"
        "import fednest_mpi, fednest_mpi.cli, fednest_mpi.runner\n"
        "print(os.environ == before)"
    )
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stdout + done.stderr


def test_importing_numpy_and_torch_first_gives_the_same_bits():
    first = _result(_python(RUN))
    numpy_first = _result(_python("import numpy, torch\n" + RUN))
    assert first["mkl"] == numpy_first["mkl"] and first["mkl"].endswith(",STRICT")
    assert numpy_first["digest"] == first["digest"]


def test_a_program_that_computed_before_still_runs_with_one_warning():
    """MKL's mode cannot change after its first computation: the run goes on and says what that costs."""
    done = _python(
        "import os\nos.environ['FEDNEST_NUMERICS'] = 'native'\nimport torch, fednest_mpi\n"
        "torch.ones(64, 64) @ torch.ones(64, 64)\nos.environ.pop('FEDNEST_NUMERICS')\n" + RUN
    )
    result = _result(done)
    assert result["mkl"] == "OFF"
    assert done.stderr.count("MKL already computed in CNR mode OFF") == 1, done.stderr


def test_portable_in_a_process_that_computed_is_a_usage_error_naming_the_field(tmp_path):
    done = _python(
        "import torch\ntorch.ones(64, 64) @ torch.ones(64, 64)\n"
        + RUN.replace('"clients_per_round": 4}', '"clients_per_round": 4}, "run": {"numerics": "portable"}')
    )
    assert done.returncode == 1 and "ConfigError: run.numerics: 'portable' needs" in done.stderr, done.stderr[-2000:]


def test_the_python_api_raises_a_usage_error_instead_of_printing(small_config, tmp_path, capsys):
    (tmp_path / "run.h5").write_bytes(b"a file that is not a run")
    cfg = small_config(run={"output": str(tmp_path / "run.h5")})
    with pytest.raises(UsageError, match="run.output"):
        Session(cfg, SerialComm()).run_to_file()
    assert capsys.readouterr().err == ""
