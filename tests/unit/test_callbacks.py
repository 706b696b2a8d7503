"""Callbacks of a run (fednest_mpi.callbacks): the points, in order, on an in-process run; an exception."""

import pytest
from small_configs import make_config

from fednest_mpi.api import Callback, SerialComm, simulate


class Log(Callback):
    def __init__(self):
        self.calls = []

    def on_start(self, sim, k):
        self.calls.append(("start", k, sim.primary_metric))

    def on_evaluation(self, k, metrics):
        self.calls.append(("evaluation", k, sorted(metrics)))

    def on_iteration(self, k, row):
        self.calls.append(("iteration", k, row["x_error"]))

    def on_checkpoint(self, k, folder):
        self.calls.append(("checkpoint", k, folder))

    def on_end(self, result):
        self.calls.append(("end", len(result.history["iteration"]), None))


class OnlyIterations:  # any object with some of the methods is a callback
    def __init__(self):
        self.k = []

    def on_iteration(self, k, row):
        self.k.append(k)


def test_the_five_points_in_order(tmp_path):
    cfg = make_config(algorithm={"outer_iterations": 4}, run={"checkpoint_every": 2})
    log, only = Log(), OnlyIterations()
    result = simulate(cfg, SerialComm(), [log, only], checkpoint_dir=tmp_path)
    metrics = sorted(["outer_objective", "outer_loss", "inner_loss", "x_error", "y_error", "hypergradient_norm"])
    assert log.calls[0] == ("start", 0, "outer_objective") and log.calls[1] == ("evaluation", 0, metrics)
    kinds = [(kind, k) for kind, k, _ in log.calls]
    assert kinds == [
        ("start", 0),
        ("evaluation", 0),
        ("iteration", 0),
        ("checkpoint", 0),
        ("evaluation", 1),
        ("iteration", 1),
        ("evaluation", 2),
        ("iteration", 2),
        ("checkpoint", 2),
        ("evaluation", 3),
        ("iteration", 3),
        ("evaluation", 4),
        ("iteration", 4),
        ("checkpoint", 4),
        ("end", 5),
    ]
    assert [x for kind, _, x in log.calls if kind == "iteration"] == result.history["x_error"]
    assert only.k == [0, 1, 2, 3, 4]


class Raises:
    def on_iteration(self, k, row):
        if k == 2:
            raise KeyboardInterrupt


class Ends(Callback):
    def __init__(self):
        self.errors, self.ended = [], False

    def on_error(self, error):
        self.errors.append(type(error).__name__)

    def on_end(self, result):
        self.ended = True


class FailsToo:
    def on_error(self, error):
        raise OSError("the tracking server is down")


def test_an_exception_is_told_to_every_callback_then_raised(caplog):
    """``on_error`` instead of ``on_end``: every callback hears of any exception (a KeyboardInterrupt too), also
    after one whose ``on_error`` raises (logged): the run's exception is the one raised."""
    ends = Ends()
    with pytest.raises(KeyboardInterrupt):
        simulate(make_config(algorithm={"outer_iterations": 4}), SerialComm(), [Raises(), FailsToo(), ends])
    assert ends.errors == ["KeyboardInterrupt"] and not ends.ended
    assert "FailsToo.on_error failed" in caplog.text and "the tracking server is down" in caplog.text
