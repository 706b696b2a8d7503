"""Optional writers of a run to TensorBoard and MLflow: two :mod:`~fednest_mpi.callbacks` that copy what the
run file records, iteration by iteration, to a tracking tool.

* :class:`TensorBoardWriter`: event files in a folder; every value of the run file's ``/iterations`` row
  (the problem's metrics, the algorithm's diagnostics, the counted rounds and bytes, oracle counts, times) as
  a float64 scalar at step = outer iteration k, the config as text and as hparams.
* :class:`MLflowWriter`: one MLflow run; the flattened config as params, the same values as metrics at
  step k, the run file as an artifact at the end, and the run's status (FINISHED, KILLED when stopped
  by a signal, FAILED).

Both write on rank 0 only (the rows are the same on every rank), so a script may give them to every rank.
Their packages are extras, not dependencies: importing fednest-mpi imports neither; a writer imports its
package when it is built, and a missing one is a :class:`~fednest_mpi.errors.UsageError` naming the extra
(``pip install 'fednest-mpi[tensorboard]'``). A config switches them on with ``run.tensorboard_dir`` and
``run.mlflow_uri`` (:func:`from_config`, built by the session on rank 0). No MPI, no HDF5 here.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from fednest_mpi import __version__
from fednest_mpi.callbacks import Callback
from fednest_mpi.config import RunConfig, flatten_config
from fednest_mpi.errors import UsageError
from fednest_mpi.runner import TRAINING_COLUMNS

logger = logging.getLogger(__name__)


def _require(module: str, extra: str, who: str):
    """``module``, imported; a :class:`UsageError` naming the extra to install when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(
            f"{who} needs the optional package {extra!r}, which cannot be imported ({exc}); "
            f"install it with: pip install 'fednest-mpi[{extra}]'"
        ) from None


def tags_of(sim) -> dict[str, str]:
    """The name under which a writer records each column of ``sim``'s rows (``iteration`` is the step):
    ``metrics/NAME`` for the problem's metrics (and the training-set columns), ``diagnostics/NAME`` for the
    algorithm's, ``run/NAME`` for the rest (``run/comm_rounds``, ``run/comm_bytes``, oracle counts, times)."""
    metrics = set(sim.problem.metric_info()) | set(TRAINING_COLUMNS)
    diagnostics = set(type(sim.algorithm).diagnostics)
    tags = {}
    for name in sim.columns():
        group = "metrics" if name in metrics else "diagnostics" if name in diagnostics else "run"
        tags[name] = f"{group}/{name}"
    del tags["iteration"]
    return tags


def _values(tags: dict[str, str], row: dict) -> dict[str, float]:
    """tag -> value of a row's columns, the NaNs left out (a training-set column between its evaluations)."""
    return {tags[name]: float(value) for name, value in row.items() if name in tags and math.isfinite(value)}


class TensorBoardWriter(Callback):
    """TensorBoard event files of a run in ``log_dir`` (rank 0): each row's values as float64 scalars at step
    k (:func:`tags_of`), the config as text (``config``) and as hparams with the problem's metrics. A run resumed
    after iteration k adds an event file to the same folder that purges the steps past k (``purge_step``: those a
    stopped session logged after its checkpoint) and continues at step k + 1, so that each step is there once
    (in TensorBoard, which honours a session's start once the folder holds an earlier one).
    Needs ``pip install 'fednest-mpi[tensorboard]'``."""

    def __init__(self, log_dir: str | Path):
        self.log_dir = Path(log_dir)
        self._tb = _require("torch.utils.tensorboard", "tensorboard", "the TensorBoard writer")
        self.writer: Any = None  # torch.utils.tensorboard.SummaryWriter, on rank 0 from the start on
        self.tags: dict[str, str] = {}

    def on_start(self, sim, k: int) -> None:
        if sim.fed.rank != 0:
            return
        self.tags = tags_of(sim)
        # a session start at step k + 1 (SessionLog.START): TensorBoard drops the events of the folder's earlier
        # sessions at steps past k (those a stopped session logged after its checkpoint); the first is no purge
        self.writer = self._tb.SummaryWriter(log_dir=str(self.log_dir), purge_step=k + 1)
        if k == 0:  # not again when resumed (k > 0): its first session wrote them
            config = json.dumps(sim.cfg.to_dict(), indent=2)
            self.writer.add_text("config", f"```json\n{config}\n```", 0)
            metrics = {tag: math.nan for tag in self.tags.values() if tag.startswith("metrics/")}
            summary = importlib.import_module("torch.utils.tensorboard.summary")
            for part in summary.hparams(flatten_config(sim.cfg.to_dict()), metrics):
                self.writer.file_writer.add_summary(part)

    def on_iteration(self, k: int, row: dict[str, float]) -> None:
        if self.writer is not None:
            for tag, value in _values(self.tags, row).items():
                self.writer.add_scalar(tag, value, k, new_style=True, double_precision=True)

    def on_checkpoint(self, k: int, folder) -> None:
        if self.writer is not None:
            self.writer.flush()

    def on_end(self, result) -> None:
        self.close()

    def on_error(self, error: BaseException) -> None:
        self.close()

    def close(self) -> None:
        """Flush and close the event file (rank 0; again: nothing)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


RUN_ID_ATTR = "mlflow_run_id"  # the run file's attribute holding the MLflow run's id (io.h5.TRACKING_ATTRS)
MLFLOW_BATCH = 100  # params (and metrics) per log_batch call: MLflow's limit for params is 100


class MLflowWriter(Callback):
    """A run in MLflow at ``tracking_uri`` (rank 0), in ``experiment`` (created when missing), named
    ``run_name`` (default: the run file's name without its suffix): the flattened config as params, each
    row's values as metrics at step k (:func:`tags_of`), the file ``artifact`` (the run file) logged at the
    end, and the status: FINISHED, KILLED (stopped by a signal, resumable) or FAILED (an exception; the
    error as the tag ``fednest_mpi.error``). In a session, the run's id is stored in the run file (the attribute
    ``mlflow_run_id``, :meth:`run_file_attributes`) and a resumed run reopens that MLflow run: it logs from step
    k + 1 on, but not the steps a stopped session logged past its checkpoint again (recomputed bit for bit), so
    that each step is there once; a stored id the store cannot reopen (another tracking URI, a deleted run) is
    one warning and a new run, whose id is stored. Needs ``pip install 'fednest-mpi[mlflow]'`` (mlflow-skinny)."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str = "fednest-mpi",
        run_name: str | None = None,
        artifact: str | Path | None = None,
    ):
        self.experiment, self.run_name = experiment, run_name
        self.artifact = Path(artifact) if artifact is not None else None
        tracking, self._entities, errors = (
            _require(f"mlflow.{module}", "mlflow", "the MLflow writer")
            for module in ("tracking", "entities", "exceptions")
        )
        try:  # the store of the URI, checked now (MLflow 3 refuses file: stores unless MLFLOW_ALLOW_FILE_STORE)
            self.client = tracking.MlflowClient(tracking_uri)
        except errors.MlflowException as exc:
            raise UsageError(f"MLflow refuses the tracking URI {tracking_uri!r}: {exc}") from None
        self.run_id: str | None = None
        self._errors = errors
        self.tags: dict[str, str] = {}
        self._reopened = False
        self._params: dict[str, str] = {}  # those of a reopened run
        self._logged: dict[str, set[int]] = {}  # tag -> steps past the resumed iteration a reopened run holds

    def run_file_attributes(self, sim, stored: dict[str, str]) -> dict[str, str]:
        """Asked by a session on rank 0 before it writes the run file: open the MLflow run (reopen the one whose
        id ``stored`` holds, the file's ``mlflow_run_id`` when resumed, else create one) and store its id."""
        self.run_id = self._reopen(stored.get(RUN_ID_ATTR)) or self._create(sim.cfg)
        return {RUN_ID_ATTR: self.run_id}

    def _reopen(self, run_id: str | None) -> str | None:
        """``run_id``, set running again; None (and one warning) when there is none or the store lacks it."""
        if not run_id:
            return None
        try:
            run = self.client.get_run(run_id)
            why = None if run.info.lifecycle_stage == "active" else "it was deleted"
        except self._errors.MlflowException as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if why is not None:
            logger.warning(
                "the MLflow run %s that the run file records cannot be reopened at %s (%s); starting a new one",
                run_id,
                self.client.tracking_uri,
                why,
            )
            return None
        self.client.update_run(run_id, status="RUNNING")
        self._reopened, self._params = True, dict(run.data.params)
        return run_id

    def _create(self, cfg: RunConfig) -> str:
        """A new MLflow run of ``cfg`` in :attr:`experiment`; its id."""
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(self.experiment)
        tags = {
            "fednest_mpi.version": __version__,
            "fednest_mpi.problem": cfg.problem.name,
            "fednest_mpi.algorithm": cfg.algorithm.name,
        }
        name = self.run_name or Path(cfg.run.output).stem
        return self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id

    def on_start(self, sim, k: int) -> None:
        if sim.fed.rank != 0:
            return
        self.tags = tags_of(sim)
        if self.run_id is None:  # not opened by a session (simulate, Simulation.run)
            self.run_id = self._create(sim.cfg)
        self.client.set_tag(self.run_id, "fednest_mpi.mpi_size", str(sim.fed.size))
        self.client.set_tag(self.run_id, "fednest_mpi.resumed_after", str(k))
        params = flatten_config(sim.cfg.to_dict())  # a reopened run keeps those it has (MLflow refuses changes)
        self._log(params=[self._entities.Param(key, str(v)) for key, v in params.items() if key not in self._params])
        self._logged = {}
        if k > 0 and self._reopened:  # reopened: the steps a stopped session logged past its checkpoint
            for tag in self.tags.values():
                self._logged[tag] = {m.step for m in self.client.get_metric_history(self.run_id, tag) if m.step > k}

    def _log(self, metrics=(), params=()) -> None:
        for start in range(0, max(len(metrics), len(params)), MLFLOW_BATCH):
            end = start + MLFLOW_BATCH
            self.client.log_batch(self.run_id, metrics=list(metrics[start:end]), params=list(params[start:end]))

    def on_iteration(self, k: int, row: dict[str, float]) -> None:
        if self.run_id is not None:
            stamp, Metric = int(1000 * time.time()), self._entities.Metric
            values = {tag: v for tag, v in _values(self.tags, row).items() if k not in self._logged.get(tag, ())}
            self._log(metrics=[Metric(tag, value, stamp, k) for tag, value in values.items()])

    def on_end(self, result) -> None:
        if self.run_id is None:
            return
        if self.artifact is not None and self.artifact.is_file():
            self.client.log_artifact(self.run_id, str(self.artifact))
        self._terminate("KILLED" if result.stopped_by else "FINISHED")

    def on_error(self, error: BaseException) -> None:
        if self.run_id is not None:
            line = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            self.client.set_tag(self.run_id, "fednest_mpi.error", line[:5000])
            self._terminate("FAILED")

    def _terminate(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)
        self.run_id = None


def from_config(cfg: RunConfig) -> list:
    """The writers ``cfg``'s ``[run]`` section switches on: ``run.tensorboard_dir`` (its subfolder named after
    the run file, so that the runs of a sweep are TensorBoard runs of one folder) and ``run.mlflow_uri`` (the
    run file as the artifact); a missing package is a :class:`UsageError` naming the field and the extra."""
    run = cfg.run
    wanted = {
        "run.tensorboard_dir": (
            run.tensorboard_dir,
            lambda: TensorBoardWriter(Path(run.tensorboard_dir) / Path(run.output).stem),
        ),
        "run.mlflow_uri": (
            run.mlflow_uri,
            lambda: MLflowWriter(run.mlflow_uri, run.mlflow_experiment, artifact=run.output),
        ),
    }
    writers = []
    for field, (value, build) in wanted.items():
        if value:
            try:
                writers.append(build())
            except UsageError as exc:
                raise UsageError(f"{field} = {value!r}: {exc}") from None
    return writers
