"""SimFBO, ShroFBO, FedMSA and FedMBO on the quadratic problem: convergence to the closed-form x*
(x_error against rounds), exact rounds and bytes per iteration, the behaviours their papers claim."""

import numpy as np
import pytest
import torch
from mpi4py import MPI

from fednest_mpi import config
from fednest_mpi.algorithms import build_algorithm, implementation
from fednest_mpi.federation import Federation
from fednest_mpi.problems import build_problem
from fednest_mpi.runner import simulate

#: a configuration of each algorithm under which it should reach x* on heterogeneous clients
CONVERGING = {
    "simfbo": {"local_steps": 1, "server_lr_y": 0.5, "server_lr_v": 0.5, "server_lr_x": 0.1},
    "shrofbo": {"local_steps": 1, "server_lr_y": 0.5, "server_lr_v": 0.5, "server_lr_x": 0.1},
    "fedmsa": {"local_steps": 3, "inner_lr": 0.1, "v_lr": 0.1, "outer_lr": 0.1},
    "fedmbo": {
        "inner_rounds": 2,
        "inner_lr": 0.2,
        "outer_lr": 0.2,
        "hypergradient_estimator": "cg",
        "neumann_steps": 6,
    },
}


def _config(small_config, name, iterations, heterogeneity=1.0, **algorithm):
    fields = {**CONVERGING[name], **algorithm}
    return small_config(
        problem={"n_clients": 20, "heterogeneity": heterogeneity},
        algorithm={"name": name, "clients_per_round": 20, "outer_iterations": iterations, **fields},
    )


def _bytes_per_iteration(cfg) -> int:
    a, dx, dy = cfg.algorithm, cfg.problem.dim_x, cfg.problem.dim_y
    if a.name in ("simfbo", "shrofbo"):
        return 8 * (2 * dy + dx)  # (q_y, q_v, q_x), one round
    if a.name == "fedmsa":
        return 2 * 8 * (2 * dy + dx)  # the anchor directions, then (x, y, v)
    R = 1 + a.neumann_steps if a.hypergradient_estimator in ("neumann", "cg") else 1
    return 8 * (a.inner_rounds * dy + R * dy + dx)  # T inner gradients, the estimator's vectors, h


@pytest.mark.parametrize("name", sorted(CONVERGING))
def test_converges_to_the_closed_form_solution_on_heterogeneous_clients(small_config, name):
    h = simulate(_config(small_config, name, 150), MPI.COMM_SELF).history
    start, final = h["x_error"][0], h["x_error"][-1]
    assert final < 1e-6 * start
    assert h["x_error"][75] > final  # still improving at mid-run: convergence, not a lucky start


@pytest.mark.parametrize("name", sorted(CONVERGING))
def test_rounds_and_bytes_per_iteration_are_counted_exactly(small_config, name):
    cfg = _config(small_config, name, 3)
    expected = {"simfbo": 1, "shrofbo": 1, "fedmsa": 2, "fedmbo": 2 + 7 + 1}[name]
    spec = config.ALGORITHMS.resolve(name)
    assert implementation(name).rounds_per_iteration(cfg.algorithm, **spec.options) == expected
    h = simulate(cfg, MPI.COMM_SELF).history
    assert np.diff(h["comm_rounds"]).tolist() == [expected] * 3
    assert np.diff(h["comm_bytes"]).tolist() == [_bytes_per_iteration(cfg)] * 3


def test_fedmbo_rounds_follow_its_estimator(small_config):
    cfg = _config(small_config, "fedmbo", 2, hypergradient_estimator="neumann", neumann_steps=4, inner_rounds=3)
    h = simulate(cfg, MPI.COMM_SELF).history
    assert np.diff(h["comm_rounds"]).tolist() == [3 + 5 + 1] * 2
    assert np.diff(h["comm_bytes"]).tolist() == [_bytes_per_iteration(cfg)] * 2


def test_simfbo_local_steps_drift_on_heterogeneous_clients_only(small_config):
    local = {"local_steps": 5, "inner_lr": 0.05, "v_lr": 0.05, "server_lr_y": 0.1, "server_lr_v": 0.1}
    same = simulate(_config(small_config, "simfbo", 150, heterogeneity=0.0, **local), MPI.COMM_SELF).history
    assert same["x_error"][-1] < 1e-6 * same["x_error"][0]  # identical clients: local steps are exact
    differ = simulate(_config(small_config, "simfbo", 150, **local), MPI.COMM_SELF).history["x_error"]
    assert differ[-1] > 1e-2 * differ[0]  # client drift: a bias ...
    assert abs(differ[-1] - differ[-30]) < 1e-6 * differ[0]  # ... at a plateau


def _steps(alg, prob, K):
    x, y = prob.initial_point()
    for k in range(1, K + 1):
        x, y, _ = alg.step(k, x, y)
    return x, y


def _build(cfg, name, local_steps=None):
    fed = Federation(MPI.COMM_SELF, cfg.problem.n_clients, cfg.federation.reduction)
    prob = build_problem(cfg.problem, cfg.seed, fed.block)
    if local_steps is None:
        return prob, build_algorithm(cfg.algorithm, prob, fed, cfg.seed)
    return prob, implementation(name)(cfg.algorithm, prob, fed, cfg.seed, local_steps=local_steps)


def test_shrofbo_is_simfbo_when_every_client_takes_the_same_number_of_steps(small_config):
    local = {"local_steps": 3, "inner_lr": 0.05, "v_lr": 0.05}
    sim_prob, sim = _build(_config(small_config, "simfbo", 5, **local), "simfbo")
    shro_prob, shro = _build(_config(small_config, "shrofbo", 5, **local), "shrofbo")
    (xa, ya), (xb, yb) = _steps(sim, sim_prob, 5), _steps(shro, shro_prob, 5)
    torch.testing.assert_close(xb, xa, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(yb, ya, rtol=1e-12, atol=1e-14)
    assert not torch.equal(xb, xa)  # a different computation (normalised, rescaled), the same result


def test_shrofbo_removes_the_objective_inconsistency_of_heterogeneous_step_counts(small_config):
    def counts(k, ids):  # clients of odd id take 4 local steps, the others 1
        return np.where(np.asarray(ids) % 2 == 1, 4, 1)

    errors = {}
    for name in ("simfbo", "shrofbo"):
        for lr in (0.01, 0.002):
            local = {"local_steps": 1, "inner_lr": lr, "v_lr": lr, "server_lr_y": 0.15, "server_lr_v": 0.15}
            prob, alg = _build(_config(small_config, name, 150, server_lr_x=0.05, **local), name, local_steps=counts)
            x, y = _steps(alg, prob, 150)
            errors[name, lr] = prob.evaluate(x, y)["x_error"]
    # SimFBO solves the problem with client i weighted by its step count: a bias that no step size removes
    assert min(errors["simfbo", 0.01], errors["simfbo", 0.002]) > 0.1
    assert errors["simfbo", 0.002] > 0.9 * errors["simfbo", 0.01]
    # ShroFBO solves the problem itself, up to the O(eta) drift of local steps
    assert errors["shrofbo", 0.01] < 0.05 * errors["simfbo", 0.01]
    assert errors["shrofbo", 0.002] < 0.3 * errors["shrofbo", 0.01]


def test_a_step_count_below_one_is_refused(small_config):
    def none(k, ids):
        return np.zeros(len(ids))

    prob, alg = _build(_config(small_config, "shrofbo", 1), "shrofbo", local_steps=none)
    x, y = prob.initial_point()
    with pytest.raises(ValueError, match="local_steps"):
        alg.step(1, x, y)


def test_fedmsa_local_steps_have_no_client_drift_and_momentum_keeps_the_fixed_point(small_config):
    for local_steps, momentum in ((5, 1.0), (3, 0.5)):
        cfg = _config(small_config, "fedmsa", 150, local_steps=local_steps, momentum=momentum)
        h = simulate(cfg, MPI.COMM_SELF).history
        assert h["x_error"][-1] < 1e-6 * h["x_error"][0]


@pytest.mark.parametrize("name", sorted(CONVERGING))
def test_state_is_checkpointed_and_restored(small_config, name):
    cfg = _config(small_config, name, 3, **({"momentum": 0.5} if name == "fedmsa" else {}))
    prob, alg = _build(cfg, name)
    x, y = _steps(alg, prob, 2)
    saved = alg.checkpoint_state()
    _, fresh = _build(cfg, name)
    fresh.restore(saved, {})
    a, b = alg.step(3, x, y), fresh.step(3, x, y)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_the_built_ins_are_loaded_only_when_named_and_their_fields_are_known_before():
    """In a fresh interpreter: reading a config stays free of torch until it names one of these
    algorithms, and a layer naming FedNest over a SimFBO layer leaves SimFBO's fields behind."""
    import subprocess
    import sys

    code = (
        "import sys; from fednest_mpi import config; "
        "cfg = config.from_dict({'problem': {'name': 'quadratic'}, 'algorithm': {'name': 'fednest'}}); "
        "print('torch' in sys.modules, 'simfbo' in config.ALGORITHMS, 'simfbo' in config.ALGORITHMS.names()); "
        "kept = config.algorithm_fields('fednest', {'name': 'simfbo', 'server_lr_x': 0.1, 'inner_lr': 0.2}); "
        "print(sorted(kept), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "False False True"
    assert out[1] == "['inner_lr', 'name'] True"
