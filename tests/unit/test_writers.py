"""The TensorBoard and MLflow writers (fednest_mpi.writers): a small quadratic run written by each, read back
with the tool's own reader (tensorboard's EventAccumulator, MLflow's client on a file: store) and compared with
the run file; the status of an MLflow run that failed or was stopped; a run resumed (after a failure or a SIGKILL
past its checkpoint, or continued when finished) as one MLflow run (its id in the run file) and one TensorBoard
curve, each step once; a stored MLflow run it cannot reopen; the one line of a missing package."""

import dataclasses
import json
import signal
import sys

import numpy as np
import pytest
from test_checkpoint import _cli_config, run_cli

from fednest_mpi import config
from fednest_mpi.api import MLflowWriter, SerialComm, Session, Simulation, TensorBoardWriter, read_run, simulate
from fednest_mpi.cli import main
from fednest_mpi.errors import RunFailed, UsageError
from fednest_mpi.runner import FAULT_ENV
from fednest_mpi.writers import tags_of

EXTRA = "the {} extra is not installed: `make install` puts requirements-writers.txt in .venv"
MlflowClient = pytest.importorskip("mlflow.tracking", reason=EXTRA.format("mlflow")).MlflowClient
EventAccumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator", reason=EXTRA.format("tensorboard")
).EventAccumulator
from tensorboard.backend.event_processing.plugin_event_accumulator import (  # noqa: E402 (once the check passed)
    EventAccumulator as PluginEventAccumulator,  # TensorBoard's own reader: it purges a resume's stale steps
)
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

ITERATIONS = 4


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    """An MLflow tracking URI of a file store in tmp_path (MLflow 3 needs MLFLOW_ALLOW_FILE_STORE for it)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def _session_run(small_config, tmp_path, **run):
    """A 1-rank session of a small quadratic run; its config, tags and run file's columns."""
    cfg = small_config(algorithm={"outer_iterations": ITERATIONS}, run={"output": str(tmp_path / "run.h5"), **run})
    assert Session(cfg, SerialComm()).run_to_file() == 0
    return cfg, tags_of(Simulation(cfg, SerialComm())), read_run(tmp_path / "run.h5")[1]


def _finite(values) -> dict[int, float]:
    """step -> value of a run file's column, its NaNs left out (as the writers leave them out)."""
    return {k: float(v) for k, v in enumerate(values) if np.isfinite(v)}


def test_tensorboard_holds_the_run_files_values_at_their_iterations(small_config, tmp_path, capsys):
    cfg, tags, data = _session_run(small_config, tmp_path, tensorboard_dir=str(tmp_path / "tb"))
    events = EventAccumulator(str(tmp_path / "tb" / "run"), size_guidance={"tensors": 0})  # the run file's name
    events.Reload()
    scalars = {tag for tag in events.Tags()["tensors"] if tag != "config/text_summary"}
    assert scalars == set(tags.values()) and len(tags) == len(data) - 1  # every column but the step
    assert {"metrics/x_error", "metrics/outer_loss", "run/comm_rounds", "run/comm_bytes"} <= scalars
    for name, tag in tags.items():
        written = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)}
        assert written == _finite(data[name]), name  # float64, the same bits
    assert sorted(_finite(data["hypergradient_estimate_norm"])) == [1, 2, 3, 4]  # no estimate at k = 0: NaN
    (text,) = events.Tensors("config/text_summary")
    shown = tensor_util.make_ndarray(text.tensor_proto).item().decode()
    assert json.loads(shown.removeprefix("```json\n").removesuffix("\n```")) == cfg.to_dict()
    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    assert hparams["algorithm.outer_lr"].number_value == cfg.algorithm.outer_lr
    assert hparams["problem.name"].string_value == "quadratic"
    assert capsys.readouterr().err == ""


def test_mlflow_holds_the_config_the_values_and_the_run_file(small_config, tmp_path, file_store):
    cfg, tags, data = _session_run(small_config, tmp_path, mlflow_uri=file_store, mlflow_experiment="tests")
    client = MlflowClient(file_store)
    (run,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params == {key: str(v) for key, v in config.flatten_config(cfg.to_dict()).items()}
    assert run.data.tags["fednest_mpi.algorithm"] == "fednest" and run.data.tags["fednest_mpi.mpi_size"] == "1"
    assert set(run.data.metrics) == set(tags.values())
    for name, tag in tags.items():
        written = {m.step: m.value for m in client.get_metric_history(run.info.run_id, tag)}
        assert written == _finite(data[name]), name
    (artifact,) = client.list_artifacts(run.info.run_id)
    local = client.download_artifacts(run.info.run_id, artifact.path, str(tmp_path / "back"))
    assert artifact.path == "run.h5" and open(local, "rb").read() == (tmp_path / "run.h5").read_bytes()


def test_a_finished_run_continued_is_the_same_mlflow_run_and_event_folder(small_config, tmp_path, file_store):
    first, _, _ = _session_run(small_config, tmp_path, tensorboard_dir=str(tmp_path / "tb"), mlflow_uri=file_store)
    more = dataclasses.replace(first, algorithm=dataclasses.replace(first.algorithm, outer_iterations=ITERATIONS + 2))
    assert Session(more, SerialComm(), skip_finished=True).run_to_file() == 0  # continues the shorter finished run
    attrs, data = read_run(tmp_path / "run.h5")
    events = EventAccumulator(str(tmp_path / "tb" / "run"), size_guidance={"tensors": 0})
    events.Reload()  # two event files, one per session
    x_error = data["x_error"].tolist()
    assert [float(tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors("metrics/x_error")] == x_error
    client = MlflowClient(file_store)
    (run,) = client.search_runs([client.get_experiment_by_name("fednest-mpi").experiment_id])
    assert attrs["mlflow_run_id"] == run.info.run_id and run.info.status == "FINISHED"
    assert run.data.tags["fednest_mpi.resumed_after"] == str(ITERATIONS)
    assert run.data.params["algorithm.outer_iterations"] == str(ITERATIONS)  # MLflow keeps a param's first value
    history = client.get_metric_history(run.info.run_id, "metrics/x_error")
    assert [(m.step, m.value) for m in history] == list(enumerate(x_error))


#: the columns that are times: another value in every run
TIMES = {"run/wall_time", "run/algorithm_time", "run/evaluation_time", "run/comm_seconds"}


def _failed_and_resumed(small_config, tmp_path, monkeypatch, uri, **run):
    """A run of 9 iterations with checkpoints every 3 that fails in iteration 8 (the steps 0..7 written to the
    writers, the checkpoint at 6), resumed: its config and run file."""
    cfg = small_config(
        algorithm={"outer_iterations": 8},
        run={"output": str(tmp_path / "run.h5"), "checkpoint_every": 3, "mlflow_uri": uri, **run},
    )
    monkeypatch.setenv(FAULT_ENV, "0:8:raise")
    with pytest.raises(RunFailed, match="fault injected"):
        Session(cfg, SerialComm()).run_to_file()
    assert read_run(tmp_path / "run.h5", unclosed="read")[1]["iteration"].tolist() == list(range(8))
    monkeypatch.delenv(FAULT_ENV)
    assert Session(cfg, SerialComm(), resume=True).run_to_file() == 0
    return cfg, read_run(tmp_path / "run.h5")


def _history(client, run_id, tags) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(m.step, m.value) for m in client.get_metric_history(run_id, tag)] for tag in tags}


def test_a_failed_and_resumed_run_is_one_mlflow_run_with_each_step_once(
    small_config, tmp_path, monkeypatch, file_store
):
    cfg, (attrs, data) = _failed_and_resumed(small_config, tmp_path, monkeypatch, file_store)
    client = MlflowClient(file_store)
    (run,) = client.search_runs([client.get_experiment_by_name("fednest-mpi").experiment_id])
    assert attrs["mlflow_run_id"] == run.info.run_id and run.info.status == "FINISHED"
    tags = tags_of(Simulation(cfg, SerialComm()))
    history = _history(client, run.info.run_id, tags.values())
    for name, tag in tags.items():
        steps = [step for step, _ in sorted(history[tag])]
        assert steps == sorted(set(steps)) == sorted(_finite(data[name])), tag  # each step once
    again = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, output=str(tmp_path / "whole.h5")))
    assert Session(again, SerialComm()).run_to_file() == 0  # uninterrupted, its own MLflow run
    whole = [r for r in client.search_runs([run.info.experiment_id]) if r.info.run_id != run.info.run_id]
    expected = _history(client, whole[0].info.run_id, tags.values())
    assert {t: sorted(h) for t, h in history.items() if t not in TIMES} == {
        t: sorted(h) for t, h in expected.items() if t not in TIMES
    }


def test_a_failed_and_resumed_runs_tensorboard_scalars_have_each_step_once(
    small_config, tmp_path, monkeypatch, file_store
):
    tb = str(tmp_path / "tb")
    cfg, (_, data) = _failed_and_resumed(small_config, tmp_path, monkeypatch, file_store, tensorboard_dir=tb)
    events = PluginEventAccumulator(str(tmp_path / "tb" / "run"), size_guidance={"tensors": 0})
    events.Reload()
    for name, tag in tags_of(Simulation(cfg, SerialComm())).items():
        written = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
        assert written == sorted(_finite(data[name]).items()), tag  # each step once, the resumed session's values


@pytest.mark.slow
def test_a_killed_and_resumed_command_line_run_is_one_record_in_each_tool(tmp_path, file_store):
    cfg = _cli_config(tmp_path)  # 10 iterations, checkpoints every 3: SIGKILL in iteration 8, resumed after 6
    uri, tb = file_store, tmp_path / "tb"  # the fixture sets MLFLOW_ALLOW_FILE_STORE, for the commands too
    fields = ["--set", f"run.mlflow_uri={uri}", "--set", f"run.tensorboard_dir={tb}"]
    assert run_cli("run", cfg, "-q", *fields, env={FAULT_ENV: "0:8:kill"}).returncode == -signal.SIGKILL
    res = run_cli("run", cfg, "-q", "--resume", *fields)
    assert res.returncode == 0, res.stderr
    attrs, data = read_run(tmp_path / "out.h5")
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("fednest-mpi").experiment_id])
    assert attrs["mlflow_run_id"] == run.info.run_id and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "metrics/x_error")
    assert [(m.step, m.value) for m in history] == list(enumerate(data["x_error"].tolist()))
    events = PluginEventAccumulator(str(tb / "out"), size_guidance={"tensors": 0})
    events.Reload()
    written = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors("metrics/x_error")]
    assert written == list(enumerate(data["x_error"].tolist()))


@pytest.mark.parametrize("lost", ["deleted", "another store"])
def test_an_mlflow_run_it_cannot_reopen_is_one_warning_and_a_new_run(small_config, tmp_path, file_store, caplog, lost):
    first, _, _ = _session_run(small_config, tmp_path, mlflow_uri=file_store)
    client, old = MlflowClient(file_store), read_run(tmp_path / "run.h5")[0]["mlflow_run_id"]
    uri = file_store
    if lost == "deleted":
        client.delete_run(old)
    else:
        uri = (tmp_path / "other").as_uri()
    more = dataclasses.replace(
        first,
        algorithm=dataclasses.replace(first.algorithm, outer_iterations=ITERATIONS + 2),
        run=dataclasses.replace(first.run, mlflow_uri=uri),
    )
    with caplog.at_level("WARNING", logger="fednest_mpi.writers"):
        assert Session(more, SerialComm(), resume=True).run_to_file() == 0
    (line,) = [r.getMessage() for r in caplog.records if r.name == "fednest_mpi.writers"]
    assert line.startswith(f"the MLflow run {old} that the run file records cannot be reopened at {uri} (")
    assert line.endswith("); starting a new one") and "\n" not in line
    new = MlflowClient(uri)
    (run,) = new.search_runs([new.get_experiment_by_name("fednest-mpi").experiment_id])
    assert run.info.run_id != old and read_run(tmp_path / "run.h5")[0]["mlflow_run_id"] == run.info.run_id
    steps = [m.step for m in new.get_metric_history(run.info.run_id, "metrics/x_error")]
    assert steps == [ITERATIONS + 1, ITERATIONS + 2] and run.data.tags["fednest_mpi.resumed_after"] == str(ITERATIONS)


class Boom:
    def on_iteration(self, k, row):
        if k == 2:
            raise RuntimeError("boom at 2")


class StopAt:
    """A stop request (runner's ``stop``) made at iteration 2: the run stops after it, with a checkpoint."""

    received, requested = "SIGTERM", False

    def on_iteration(self, k, row):
        self.requested = k >= 1

    def reached(self):
        pass


def test_an_mlflow_run_that_raised_is_failed_and_one_stopped_is_killed(small_config, tmp_path, file_store):
    cfg = small_config(algorithm={"outer_iterations": ITERATIONS})
    with pytest.raises(RuntimeError, match="boom at 2"):
        simulate(cfg, SerialComm(), [Boom(), MLflowWriter(file_store, run_name="failed")])
    stop = StopAt()
    Simulation(cfg, SerialComm()).run([stop, MLflowWriter(file_store, run_name="stopped")], stop=stop)
    client = MlflowClient(file_store)
    runs = {
        r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("fednest-mpi").experiment_id])
    }
    failed, stopped = runs["failed"], runs["stopped"]
    assert failed.info.status == "FAILED" and failed.data.tags["fednest_mpi.error"] == "RuntimeError: boom at 2"
    assert [m.step for m in client.get_metric_history(failed.info.run_id, "metrics/x_error")] == [0, 1]
    assert stopped.info.status == "KILLED"
    assert [m.step for m in client.get_metric_history(stopped.info.run_id, "metrics/x_error")] == [0, 1, 2]
    assert client.list_artifacts(stopped.info.run_id) == []  # simulate writes no run file


@pytest.mark.parametrize(
    "field, value, blocked, extra",
    [
        ("run.tensorboard_dir", "tb", ("torch.utils.tensorboard",), "tensorboard"),
        ("run.mlflow_uri", "http://127.0.0.1:9", ("mlflow", "mlflow.tracking", "mlflow.entities"), "mlflow"),
    ],
)
def test_a_missing_package_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys, field, value, blocked, extra):
    for module in blocked:  # as if it were not installed: the import of a None entry fails
        monkeypatch.setitem(sys.modules, module, None)
    cfg = tmp_path / "q.toml"
    cfg.write_text('[problem]\nname = "quadratic"\n[algorithm]\nouter_iterations = 2\n')
    out = tmp_path / "out.h5"
    assert main(["run", str(cfg), "-q", "--output", str(out), "--set", f"{field}={value}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"fednest-mpi: error: {field} = {value!r}: the ")
    assert line.endswith(f"install it with: pip install 'fednest-mpi[{extra}]'")
    assert not out.exists()
    writer = TensorBoardWriter if extra == "tensorboard" else MLflowWriter
    with pytest.raises(UsageError, match=rf"pip install 'fednest-mpi\[{extra}\]'"):
        writer(str(tmp_path / "x"))


def test_an_mlflow_store_it_refuses_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(UsageError, match="MLflow refuses the tracking URI 'file:.*MLFLOW_ALLOW_FILE_STORE") as caught:
        MLflowWriter((tmp_path / "mlruns").as_uri())
    assert "\n" not in str(caught.value)
