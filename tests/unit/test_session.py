"""The run session API: what ``fednest-mpi run`` does, from Python, on the serial communicator."""

import dataclasses
import json

import numpy as np
import pytest
from histories import TIMING

from fednest_mpi.comm import SerialComm
from fednest_mpi.errors import UsageError
from fednest_mpi.io.h5 import read_run
from fednest_mpi.runner import simulate
from fednest_mpi.session import Session, prior_run


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


def _sized(cfg, iterations, **run):
    """``cfg`` with ``outer_iterations`` and ``run`` fields replaced."""
    algorithm = dataclasses.replace(cfg.algorithm, outer_iterations=iterations)
    return dataclasses.replace(cfg, algorithm=algorithm, run=dataclasses.replace(cfg.run, **run))


def _values(path):
    _, data = read_run(path)
    return {name: values for name, values in data.items() if name not in TIMING}


def test_skip_finished_keeps_a_finished_run_and_extends_a_shorter_one(small_config, tmp_path, capsys):
    """`run --skip-finished` (the figure scripts' default): a finished run is not run again, a shorter one
    continues from its checkpoint to the longer budget (the same values as a run of that length from the
    start), another config starts again."""
    out = tmp_path / "run.h5"
    short = small_config(run={"output": str(out)})
    assert prior_run(short)[0] == "start"  # no file yet
    assert Session(short, SerialComm(), skip_finished=True).run_to_file() == 0
    capsys.readouterr()
    state, why = prior_run(short)
    assert state == "finished" and f"this config's {short.algorithm.outer_iterations} iterations" in why
    before = out.stat()
    # the same config, only logging and checkpoint fields changed: finished, the file untouched
    again = _sized(short, short.algorithm.outer_iterations, log_every=3, checkpoint_every=2, overwrite=True)
    assert Session(again, SerialComm(), skip_finished=True).run_to_file() == 0
    assert "(finished earlier: " in capsys.readouterr().out
    after = out.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)

    # a longer budget: resumed from the final checkpoint, not recomputed
    longer = _sized(short, short.algorithm.outer_iterations + 4)
    assert prior_run(longer)[0] == "resume"
    assert Session(longer, SerialComm(), skip_finished=True).run_to_file() == 0
    attrs, data = read_run(out)
    assert [r["iteration"] for r in json.loads(attrs["resumes"])] == [short.algorithm.outer_iterations]
    assert data["iteration"].tolist() == list(range(longer.algorithm.outer_iterations + 1))
    whole = tmp_path / "whole.h5"
    whole_cfg = _sized(longer, longer.algorithm.outer_iterations, output=str(whole))
    assert Session(whole_cfg, SerialComm()).run_to_file() == 0
    extended, direct = _values(out), _values(whole)
    assert extended.keys() == direct.keys()
    for name, values in direct.items():
        np.testing.assert_array_equal(extended[name], values, err_msg=name)
    assert prior_run(longer)[0] == "finished"

    # a run longer than asked, or another config: started again (replacing the file only with --overwrite)
    assert prior_run(short)[0] == "start"
    other = dataclasses.replace(longer, seed=longer.seed + 1)
    state, why = prior_run(other)
    assert state == "start" and "another config (seed: file" in why
    with pytest.raises(UsageError, match="already exists"):
        Session(other, SerialComm(), skip_finished=True).run_to_file()
    redo = _sized(other, other.algorithm.outer_iterations, overwrite=True)
    assert Session(redo, SerialComm(), skip_finished=True).run_to_file() == 0
    attrs, _ = read_run(out)
    assert attrs["config"]["seed"] == other.seed and "resumes" not in attrs
