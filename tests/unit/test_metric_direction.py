"""Each metric declares whether higher is better (BilevelProblem.metric_info); the run file stores it and
"best" uses it instead of guessing from the name (issue 24 item 4, issue 26 item 3)."""

import numpy as np
from small_configs import make_config

from fednest_mpi import post
from fednest_mpi.comm import SerialComm
from fednest_mpi.io.h5 import RunWriter, read_run
from fednest_mpi.post.load import read_runs
from fednest_mpi.post.stats import best
from fednest_mpi.session import Session


def test_the_declared_direction_is_stored_and_used_by_best(tmp_path):
    path = tmp_path / "r.h5"
    columns = {
        "iteration": ("k", "1"),
        "group_accuracy_gap": ("highest minus lowest accuracy", "%", False),  # "acc" in the name, lower is better
        "detection_auc": ("AUC", "1", True),  # no "acc" in the name, higher is better
        "x_error": ("||x - x*||", "1"),  # undeclared: lower is better
    }
    w = RunWriter(path, {"config_json": "{}"}, columns)
    for k, row in enumerate(([5.0, 0.6, 3.0], [1.0, 0.9, 2.0], [3.0, 0.7, 4.0])):
        w.append({"iteration": k, **dict(zip(list(columns)[1:], row))})
    w.close()
    attrs, data = read_run(path)
    assert attrs["columns"]["group_accuracy_gap"]["higher_is_better"] is False
    assert "higher_is_better" not in attrs["columns"]["x_error"]
    (run,) = read_runs([path])
    assert best(data["group_accuracy_gap"], "group_accuracy_gap", run.higher_is_better("group_accuracy_gap")) == 1.0
    assert best(data["detection_auc"], "detection_auc", run.higher_is_better("detection_auc")) == 0.9
    assert best(data["x_error"], "x_error", run.higher_is_better("x_error")) == 2.0


def test_a_run_records_its_primary_metric_and_report_shows_it_first(tmp_path):
    out = tmp_path / "q.h5"
    cfg = make_config(run={"output": str(out), "progress": "never"})
    assert Session(cfg, SerialComm()).run_to_file() == 0
    attrs, _ = read_run(out)
    assert attrs["primary_metric"] == "outer_objective"  # the quadratic problem's first metric
    assert post.primary_metrics([out]) == ["outer_objective"]
    header = post.report([out]).splitlines()[0]
    assert header.index("outer_objective") < header.index("x_error")
    np.testing.assert_equal(attrs["columns"]["outer_objective"].get("higher_is_better"), None)
