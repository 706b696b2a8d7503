"""The run session API: what ``fednest-mpi run`` does, from Python, on the serial communicator."""

import dataclasses

import numpy as np
import pytest
from histories import TIMING

from fednest_mpi.comm import SerialComm
from fednest_mpi.errors import UsageError
from fednest_mpi.io.h5 import read_run
from fednest_mpi.runner import simulate
from fednest_mpi.session import Session


def test_a_session_writes_the_run_that_simulate_computes(small_config, tmp_path, capsys):
    cfg = small_config(run={"output": str(tmp_path / "run.h5")})
    assert Session(cfg, SerialComm()).run_to_file() == 0
    assert capsys.readouterr().out.strip() == f"output: {tmp_path / 'run.h5'}"
    _, data = read_run(tmp_path / "run.h5")
    expected = simulate(cfg, SerialComm()).history
    for name, values in expected.items():
        if name not in TIMING:
            np.testing.assert_array_equal(data[name], values, err_msg=name)
    # a second session on the same output is a usage error (raised; the command line exits 2), the file untouched
    with pytest.raises(UsageError, match="already exists"):
        Session(cfg, SerialComm()).run_to_file()
    assert capsys.readouterr().err == ""
    again = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, overwrite=True))
    assert Session(again, SerialComm()).run_to_file() == 0
