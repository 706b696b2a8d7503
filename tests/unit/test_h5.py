"""HDF5 run files: round trip, schema versions, reading while a run writes, a SIGKILLed run's file."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from fednest_mpi.errors import UsageError
from fednest_mpi.io.h5 import SCHEMA_VERSION, RunWriter, check_output_path, read_run

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = {"iteration": ("k", "1"), "x_error": ("||x - x*||", "1"), "wall_time": ("time", "s")}
READER = "import sys; from fednest_mpi.io.h5 import read_run; print(len(read_run(sys.argv[1])[1]['iteration']))"


def _write(path, n):
    w = RunWriter(path, {"seed": 1, "config_json": json.dumps({"a": 1})}, COLUMNS)
    for k in range(n):
        w.append({"iteration": k, "x_error": 1.0 / (k + 1), "wall_time": 0.1 * k})
    return w


def test_round_trip_of_every_dataset_and_attribute(tmp_path):
    _write(tmp_path / "r.h5", 4).close()
    attrs, data = read_run(tmp_path / "r.h5")
    assert attrs["schema_version"] == SCHEMA_VERSION and attrs["seed"] == 1 and attrs["config"] == {"a": 1}
    assert attrs["format"] == "fednest-mpi/run" and attrs["created_utc"] and attrs["package_version"]
    assert data["iteration"].tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(data["x_error"], [1.0, 0.5, 1 / 3, 0.25])
    with h5py.File(tmp_path / "r.h5", "r") as f:
        d = f["iterations/x_error"]
        assert d.attrs["description"] == "||x - x*||" and d.attrs["units"] == "1"
        assert d.dims[0][0].name == "/iterations/iteration" and d.maxshape == (None,)
        assert f["iterations/wall_time"].attrs["units"] == "s"


def test_missing_column_values_are_nan(tmp_path):
    w = RunWriter(tmp_path / "r.h5", {}, COLUMNS)
    w.append({"iteration": 0})
    w.close()
    assert np.isnan(read_run(tmp_path / "r.h5")[1]["x_error"][0])


def test_other_schema_versions_and_foreign_files_are_refused(tmp_path):
    _write(tmp_path / "r.h5", 1).close()
    with h5py.File(tmp_path / "r.h5", "a") as f:
        f.attrs["schema_version"] = 0
    with pytest.raises(UsageError, match="has schema version 0"):
        read_run(tmp_path / "r.h5")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = 1
    with pytest.raises(UsageError, match="not a fednest-mpi run file"):
        read_run(tmp_path / "other.h5")
    (tmp_path / "text.h5").write_text("hello")
    with pytest.raises(UsageError, match="not a readable HDF5 file"):
        read_run(tmp_path / "text.h5")


def test_a_reader_sees_every_completed_iteration_while_the_writer_runs(tmp_path):
    path = tmp_path / "live.h5"
    w = _write(path, 3)
    seen = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True, text=True, timeout=60)
    assert seen.stdout.strip() == "3", seen.stderr
    w.append({"iteration": 3, "x_error": 0.2, "wall_time": 0.3})
    seen = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True, text=True, timeout=60)
    assert seen.stdout.strip() == "4", seen.stderr
    w.close()


def test_a_sigkilled_run_leaves_a_readable_file_with_its_completed_iterations(tmp_path):
    path = tmp_path / "killed.h5"
    cmd = [
        sys.executable,
        "-m",
        "fednest_mpi",
        "run",
        str(ROOT / "configs" / "quadratic.toml"),
        "--output",
        str(path),
        "--quiet",
        "--set",
        "algorithm.outer_iterations=100000",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        n = 0
        while n < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
            if path.exists():
                try:
                    n = len(read_run(path)[1]["iteration"])
                except (UsageError, OSError, KeyError):
                    n = 0
        assert n >= 5, "the run did not reach 5 iterations"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(UsageError, match="was not closed by the run that wrote it.*fednest-mpi recover"):
        read_run(path)
    res = subprocess.run(
        [sys.executable, "-m", "fednest_mpi", "recover", str(path)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and "recovered" in res.stdout, res.stderr
    with h5py.File(path, "r") as f:  # plain read mode: closed
        assert json.loads(f.attrs["recovered"])["iterations_kept"] == len(f["iterations/iteration"])
    attrs, data = read_run(path)
    k = len(data["iteration"])
    assert k >= n and data["iteration"].tolist() == list(range(k))
    assert np.all(np.isfinite(data["x_error"]))


def test_output_path_checks(tmp_path, monkeypatch):
    (tmp_path / "exists.h5").write_text("x")
    with pytest.raises(UsageError, match="already exists"):
        check_output_path(tmp_path / "exists.h5", overwrite=False)
    check_output_path(tmp_path / "exists.h5", overwrite=True)
    check_output_path(tmp_path / "new" / "dir" / "r.h5", overwrite=False)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root writes anywhere: make the check see what another user would
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != ro)
    with pytest.raises(UsageError, match="not writable"):
        check_output_path(ro / "r.h5", overwrite=False)


def test_a_run_file_whose_building_fails_leaves_no_partial_file_and_no_lock(tmp_path):
    """An error while the new file's structure is made (here in ``extend``, where the client groups are added:
    HDF5 refused a '%' in a source name this way) leaves neither the hidden ``.NAME.RANDOM.partial`` file nor the
    writer's lock behind, and raises the error itself."""

    def broken(f):
        raise RuntimeError("no such layout")

    with pytest.raises(RuntimeError, match="no such layout"):
        RunWriter(tmp_path / "r.h5", {}, COLUMNS, extend=broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    RunWriter(tmp_path / "r.h5", {}, COLUMNS).close()  # the path is free
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]
