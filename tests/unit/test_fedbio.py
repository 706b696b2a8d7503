"""FedBiO / FedBiOAcc on the local-lower-level quadratic: closed-form x*_loc, local y^(m), checkpoints."""

import numpy as np
import pytest
import torch
from mpi4py import MPI
from shared_data import DATA, requires

from fednest_mpi import config
from fednest_mpi.algorithms import build_algorithm
from fednest_mpi.errors import ConfigError
from fednest_mpi.federation import Federation
from fednest_mpi.problems import build_problem
from fednest_mpi.runner import Simulation

NAMES = ["fedbio", "fedbioacc"]


def _config(small_config, problem=None, **algorithm):
    base = {
        "name": "fedbio",
        "clients_per_round": 12,
        "inner_lr": 0.2,
        "outer_lr": 0.1,
        "neumann_steps": 40,
        "neumann_scale": 0.25,
        "sync_period": 1,
        "outer_iterations": 100,
    }
    return small_config(algorithm=base | algorithm, problem={"lower_level": "local"} | (problem or {}))


def _setup(cfg):
    fed = Federation(MPI.COMM_SELF, cfg.problem.n_clients, cfg.federation.reduction)
    prob = build_problem(cfg.problem, cfg.seed, fed.block)
    return prob, fed, build_algorithm(cfg.algorithm, prob, fed, cfg.seed)


def _run(alg, prob, k_from, k_to, x, y):
    for k in range(k_from, k_to + 1):
        x, y, _ = alg.step(k, x, y)
    return x, y


def test_local_and_global_lower_level_problems_differ_unless_clients_agree(small_config):
    prob, _, _ = _setup(_config(small_config))
    x_loc, x_glob = prob.local_solution(), prob.solution()
    assert float((x_loc - x_glob).norm()) > 1e-2
    # x*_loc is where the closed-form gradient of h vanishes, and h is minimal there
    assert float(prob.local_hypergradient(x_loc).norm()) < 1e-12
    assert float(prob.local_outer_objective(x_loc)) < float(prob.local_outer_objective(x_loc + 0.01))
    same, _, _ = _setup(_config(small_config, problem={"heterogeneity": 0.0}))
    torch.testing.assert_close(same.local_solution(), same.solution(), rtol=1e-10, atol=1e-12)


def test_local_hypergradient_matches_finite_differences(small_config):
    prob, _, _ = _setup(_config(small_config))
    x = torch.linspace(-1, 1, prob.dim_x, dtype=torch.float64)
    eps = 1e-6
    fd = torch.tensor(
        [
            float(prob.local_outer_objective(x + eps * e) - prob.local_outer_objective(x - eps * e)) / (2 * eps)
            for e in torch.eye(prob.dim_x, dtype=torch.float64)
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(prob.local_hypergradient(x), fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_reaches_the_local_lower_level_solution_and_keeps_y_local(small_config, name):
    cfg = _config(small_config, name=name)
    prob, _, alg = _setup(cfg)
    x, y = _run(alg, prob, 1, cfg.algorithm.outer_iterations, *prob.initial_point())
    # Neumann truncation with Q = 40, eta mu >= 0.25: relative bias (0.75)^41 ~ 1e-5
    assert float((x - prob.local_solution()).norm()) < 1e-5
    ids = np.arange(cfg.problem.n_clients)
    y_clients = alg.store.get("y", ids)
    torch.testing.assert_close(y_clients, prob.client_inner_solutions(ids, x), rtol=0, atol=1e-5)
    # y^(m) was never averaged: the clients' inner variables are far apart
    assert float((y_clients - y_clients.mean(0)).norm(dim=1).min()) > 0.1
    # the runner's y is their mean, which solves no global lower level
    torch.testing.assert_close(y, prob.local_inner_solution_mean(x), rtol=0, atol=1e-5)
    assert float((y - prob.inner_solution(x)).norm()) > 1e-2


@pytest.mark.parametrize("name", NAMES)
def test_local_steps_are_exact_for_identical_clients_and_drift_otherwise(small_config, name):
    """With I = 5 local iterations per round, identical clients still reach x* (up to the Neumann
    truncation); heterogeneous ones stop at a client-drift bias (local-SGD behaviour), which
    I = 1 does not have (previous test)."""
    errors = []
    for heterogeneity in (0.0, 1.0):
        cfg = _config(
            small_config, problem={"heterogeneity": heterogeneity}, name=name, sync_period=5, outer_iterations=20
        )
        prob, _, alg = _setup(cfg)
        x, _ = _run(alg, prob, 1, 20, *prob.initial_point())
        errors.append(float((x - prob.local_solution()).norm()))
    assert errors[0] < 1e-5
    assert errors[1] > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_restore_continues_bitwise(small_config, name):
    cfg = _config(
        small_config,
        name=name,
        clients_per_round=5,
        sync_period=3,
        problem={"gradient_noise": 0.1},
        step_schedule="storm",
    )
    prob, _, alg = _setup(cfg)
    x, y = _run(alg, prob, 1, 4, *prob.initial_point())
    saved, clients = alg.checkpoint_state(), alg.client_states()
    x_ref, y_ref = _run(alg, prob, 5, 8, x, y)
    prob2, _, alg2 = _setup(cfg)
    alg2.restore(saved, clients)
    x2, y2 = _run(alg2, prob2, 5, 8, x, y)
    assert torch.equal(x2, x_ref) and torch.equal(y2, y_ref)
    seen = clients["y"][0]
    assert 0 < seen.size < cfg.problem.n_clients  # sampling: some clients have not taken part yet
    if name == "fedbioacc":
        assert set(saved) == {"x_prev", "nu"} and set(clients) == {"y", "y_prev", "omega"}


def test_runner_records_one_round_per_outer_iteration(small_config):
    cfg = _config(small_config, name="fedbioacc", outer_iterations=3, sync_period=4)
    sim = Simulation(cfg, MPI.COMM_SELF)
    h = sim.run().history
    assert h["comm_rounds"] == [0, 1, 2, 3]
    # the population mean of y that reports the iterate is declared evaluation-only, tallied apart
    dim_y = cfg.problem.dim_y
    assert (sim.fed.evaluation_stats.rounds, sim.fed.evaluation_stats.bytes) == (3, 3 * 8 * dim_y)
    # two hypergradients (new and old point) per local iteration after the first
    assert h["oracle_grad_x_outer"][-1] == 12 * (2 * 4 * 3 - 1)


def test_balanced_placement_is_rejected_for_stateful_algorithms():
    with pytest.raises(ConfigError, match="federation.placement"):
        config.from_dict(
            {
                "problem": {"name": "quadratic", "n_clients": 4},
                "algorithm": {"name": "fedbio", "clients_per_round": 2},
                "federation": {"placement": "balanced"},
            }
        )


@requires("mnist")
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("problem", ["hyper_representation", "loss_tuning"])
def test_runs_on_the_mnist_problems_with_client_state_by_id(name, problem):
    sizes = (
        {"hidden": 6} if problem == "hyper_representation" else {"hidden1": 8, "hidden2": 6, "imbalance_ratio": 10.0}
    )
    cfg = config.from_dict(
        {
            "problem": {
                "name": problem,
                "data_dir": str(DATA),
                "n_clients": 20,
                "partition": "shards",
                "batch_size": 16,
            }
            | sizes,
            "algorithm": {
                "name": name,
                "outer_iterations": 2,
                "clients_per_round": 4,
                "sync_period": 2,
                "inner_lr": 0.1,
                "outer_lr": 0.01,
                "neumann_steps": 2,
                "neumann_scale": 0.01,
            },
            "run": {"dtype": "float32"},
        }
    )
    prob, fed, alg = _setup(cfg)
    x0, y0 = prob.initial_point()
    x, y = _run(alg, prob, 1, 2, x0, y0)
    assert bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all()) and not torch.equal(x, x0)
    ids = np.arange(20)
    took_part = alg.store.seen(ids)
    rows = alg.store.get("y", ids)
    assert 4 <= took_part.sum() <= 8
    assert all(torch.equal(rows[i], y0) for i in ids[~took_part])  # clients not sampled keep y0
    moved = rows[took_part]
    assert len({tuple(r[:5].tolist()) for r in moved}) == len(moved)  # each its own inner variable
    torch.testing.assert_close(y, rows.mean(0))
    assert np.isfinite(prob.evaluate(x, y)["test_accuracy"])


@pytest.mark.parametrize("name", NAMES)
def test_sampled_clients_resume_their_stale_rows(small_config, name):
    """Client sampling (beyond the paper): a round reads and writes the rows of its members only, so
    a client outside S keeps its y^(m) (y_{t-1}^(m), omega^(m)) bitwise, and a returning client's round
    starts from its stored, stale rows (FedBiOAcc: its first STORM difference at its old y_{t-1}^(m))."""
    from fednest_mpi.algorithms.fednest import P

    cfg = _config(small_config, name=name, clients_per_round=4, sync_period=2)
    prob, _, alg = _setup(cfg)
    n = cfg.problem.n_clients
    ids = np.arange(n)
    x, y = _run(alg, prob, 1, 3, *prob.initial_point())
    members = alg.sample_clients(P.OUTER_CLIENTS, 4).ids
    returning = [i for i in members if alg.store.seen(np.array([i]))[0]]
    outside = np.setdiff1d(ids, members)
    assert returning and outside.size  # the seed gives both kinds
    names = list(alg.store.initial)
    before = {k: alg.store.get(k, ids).clone() for k in names}
    x_ref, _, _ = alg.step(4, x, y)
    for k in names:  # the rows of clients outside S stayed as they were
        torch.testing.assert_close(alg.store.get(k, outside), before[k][outside], rtol=0, atol=0)
        assert not torch.equal(alg.store.get(k, members), before[k][members])

    def rerun(client, row):  # round 4 again from the state after round 3, one stored row changed
        prob2, _, alg2 = _setup(cfg)
        _run(alg2, prob2, 1, 3, *prob2.initial_point())
        stale = alg2.store.get(row, np.array([client]))
        alg2.store.put(np.array([client]), **{row: stale + 1.0})
        return alg2.step(4, x, y)[0]

    row = "y_prev" if name == "fedbioacc" else "y"
    assert torch.equal(rerun(int(outside[0]), row), x_ref)  # a non-member's row is not read
    assert not torch.equal(rerun(int(returning[0]), row), x_ref)  # a returning member's stale row is
