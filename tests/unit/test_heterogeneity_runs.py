"""Runs with system heterogeneity ([heterogeneity], heterogeneity.py) on the quadratic problem: defaults that
change nothing, convergence with dropouts and heterogeneous local work against the closed-form x*, the answered
/ dropped counts in the run file (per iteration and per client), rounds nobody answers, and a resumed run equal to
an uninterrupted one. 1 vs 2 ranks and chunk sizes: tests/mpi/test_heterogeneity_ranks.py."""

import numpy as np
import pytest
from histories import assert_histories_match

from fednest_mpi import checkpoint
from fednest_mpi.callbacks import Recorder
from fednest_mpi.comm import SerialComm
from fednest_mpi.io.clients import read_clients
from fednest_mpi.io.h5 import RunWriter, read_run
from fednest_mpi.runner import Simulation, simulate
from fednest_mpi.series import RunSeries, series_layout


def _run(small_config, heterogeneity, problem=None, **algorithm):
    cfg = small_config(
        problem={"n_clients": 10, **(problem or {})},
        algorithm={
            "clients_per_round": 10,
            "outer_iterations": 60,
            "inner_local_steps": 10,
            "neumann_steps": 20,
            **algorithm,
        },
        heterogeneity=heterogeneity,
    )
    return simulate(cfg, SerialComm()).history


def test_the_defaults_add_no_column_and_change_nothing(small_config):
    plain = simulate(small_config(), SerialComm()).history
    stated = simulate(
        small_config(heterogeneity={"drop_probability": 0.0, "local_work": "full", "local_work_min": 0.2}),
        SerialComm(),
    ).history
    assert "clients_dropped" not in plain and "clients_answered" not in plain
    assert_histories_match(stated, plain)


def test_identical_clients_converge_to_x_star_whatever_answers(small_config):
    """Identical clients (problem.heterogeneity = 0): the mean over any members that answered is the mean over
    all, so FedNest reaches its no-dropout error floor; the counts follow the drop probability."""
    p = 0.3
    reference = _run(small_config, {}, {"heterogeneity": 0.0}, outer_iterations=40)
    h = _run(small_config, {"drop_probability": p}, {"heterogeneity": 0.0}, outer_iterations=40)
    assert reference["x_error"][-1] < 1e-3 * reference["x_error"][0]  # the floor of N = 20 Neumann terms
    assert h["x_error"][-1] == pytest.approx(reference["x_error"][-1], rel=1e-6)
    answered, dropped = np.sum(h["clients_answered"]), np.sum(h["clients_dropped"])
    n = answered + dropped
    assert n == 10 * h["comm_rounds"][-1]  # every member of every round is counted once
    assert abs(dropped / n - p) < 5 * np.sqrt(p * (1 - p) / n)
    assert h["clients_dropped"][0] == 0


def test_fednest_gets_close_to_x_star_with_dropouts_on_heterogeneous_clients(small_config):
    """Heterogeneous clients: a round's mean over a random subset is a sampled mean, so x_error has a
    sampling-noise floor, as with partial participation (tests/unit/test_algorithms.py uses the same bar)."""
    h = _run(small_config, {"drop_probability": 0.3, "local_work": "uniform"})
    assert min(h["x_error"][-10:]) < 0.25 * h["x_error"][0]


def test_heterogeneous_local_work_keeps_fednest_exact(small_config):
    """FedInn's SVRG correction removes the drift of any number of local steps: the fixed point is still x*
    (the heterogeneity bias of the variants without it is above 1e-3 of the start: test_algorithms.py)."""
    h = _run(small_config, {"local_work": "uniform", "local_work_min": 0.2})
    assert h["x_error"][-1] < 1e-5 * h["x_error"][0]


@pytest.mark.parametrize("name", ["fedbioacc", "lfednest"])
def test_a_round_nobody_answers_keeps_the_iterate(small_config, tmp_path, name):
    """An availability trace with everybody away in round 2: one-round-per-iteration algorithms leave x (and
    FedBiOAcc's momentum state) as they were in iteration 2, and go on from there."""
    trace = np.ones((4, 10))
    trace[1] = 0  # round 2 = iteration 2 (one round per iteration)
    np.save(tmp_path / "trace.npy", trace)
    cfg = small_config(
        problem={"n_clients": 10, "lower_level": "local" if name == "fedbioacc" else "global"},
        algorithm={"name": name, "clients_per_round": 10, "outer_iterations": 4},
        heterogeneity={"availability_trace": str(tmp_path / "trace.npy")},
    )
    h = simulate(cfg, SerialComm()).history
    if name == "lfednest":  # two rounds per iteration: rounds 1-2 in iteration 1, only FedInn's y round 2 lost
        assert h["comm_rounds"][1] == 2 and h["clients_dropped"][1:] == [10, 0, 10, 0]
        return
    assert h["clients_dropped"][1:] == [0, 10, 0, 0]
    assert h["x_error"][2] == h["x_error"][1] and h["x_error"][3] != h["x_error"][2]


def test_answered_and_dropped_rounds_per_client_in_the_run_file(small_config, tmp_path):
    path = tmp_path / "run.h5"
    cfg = small_config(
        run={"output": str(path)},
        algorithm={"outer_iterations": 4},
        heterogeneity={"drop_probability": 0.4},
    )
    sim = Simulation(cfg, SerialComm())
    writer = RunWriter(
        path, {"mpi_size": 1, "config_json": cfg.to_json()}, sim.columns(), extend=series_layout(sim).create
    )
    series = RunSeries(sim, writer)
    sim.run([Recorder(writer)], series=series)
    series.close()
    writer.close()
    clients, (_, run) = read_clients(path), read_run(path)
    np.testing.assert_array_equal(clients["dropped_rounds"].sum(0), run["clients_dropped"])
    np.testing.assert_array_equal(clients["answered_rounds"].sum(0), run["clients_answered"])
    assert run["clients_dropped"][1:].min() > 0


def test_resume_equals_the_uninterrupted_run(small_config, tmp_path):
    def cfg(iterations):
        return small_config(
            problem={"gradient_noise": 0.1},
            algorithm={"outer_iterations": iterations, "inner_local_steps": 6},
            heterogeneity={"drop_probability": 0.3, "local_work": "uniform", "local_work_draw": "iteration"},
            run={"checkpoint_every": 2},
        )

    whole = simulate(cfg(7), SerialComm())
    first = Simulation(cfg(3), SerialComm()).run(checkpoint_dir=str(tmp_path))
    second = Simulation(cfg(7), SerialComm()).run(checkpoint_dir=str(tmp_path), resume=checkpoint.load(str(tmp_path)))
    joined = {name: first.history[name] + second.history[name] for name in whole.history}
    assert_histories_match(joined, whole.history)
    assert (second.x == whole.x).all() and (second.y == whole.y).all()


def test_shrofbo_takes_its_step_counts_from_the_heterogeneity_section(small_config):
    """local_work = uniform gives SimFBO / ShroFBO per-client step counts through Federation.local_steps: SimFBO
    then solves the problem with client i weighted by tau_i (a bias), ShroFBO's normalisation removes it."""
    errors = {}
    for name in ("simfbo", "shrofbo"):
        cfg = small_config(
            problem={"n_clients": 20, "heterogeneity": 1.0},
            algorithm={
                "name": name,
                "clients_per_round": 20,
                "outer_iterations": 150,
                "local_steps": 4,
                "inner_lr": 0.01,
                "v_lr": 0.01,
                "server_lr_y": 0.15,
                "server_lr_v": 0.15,
                "server_lr_x": 0.05,
            },
            heterogeneity={"local_work": "uniform", "local_work_min": 0.25},
        )
        errors[name] = simulate(cfg, SerialComm()).history["x_error"][-1]
    assert errors["simfbo"] > 0.1
    assert errors["shrofbo"] < 0.05 * errors["simfbo"]


def test_fedmsa_keeps_its_iterates_in_a_round_nobody_answers(small_config, tmp_path):
    trace = np.ones((6, 10))
    trace[2:4] = 0  # both rounds of iteration 2 (the anchor, then the local iterates)
    np.save(tmp_path / "trace.npy", trace)
    cfg = small_config(
        problem={"n_clients": 10},
        algorithm={"name": "fedmsa", "clients_per_round": 10, "outer_iterations": 3},
        heterogeneity={"availability_trace": str(tmp_path / "trace.npy")},
    )
    h = simulate(cfg, SerialComm()).history
    assert h["clients_dropped"][1:] == [0, 20, 0]
    assert h["x_error"][2] == h["x_error"][1] and h["x_error"][3] != h["x_error"][2]
