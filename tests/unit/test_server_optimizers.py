"""Server optimisers of x (FedOpt, Reddi et al. 2021, Alg. 2; fednest_mpi.algorithms.server): the formulas,
a server-Adam FedNest in two lines of config, rounds unchanged, state checkpointed and resumed bitwise."""

import numpy as np
import pytest
import torch
from small_configs import make_config

from fednest_mpi import checkpoint
from fednest_mpi.algorithms.server import KINDS, ServerOptimizer
from fednest_mpi.api import SerialComm, Simulation, simulate
from fednest_mpi.errors import ConfigError


def _reference(kind, x, deltas, lr=0.1, b1=0.9, b2=0.99, tau=1e-3):
    """Reddi et al.'s Algorithm 2 written out in numpy (Delta = x_k - proposal)."""
    m, v = np.zeros_like(x), np.full_like(x, tau**2)
    for d in deltas:
        if kind == "sgd":
            m = b1 * m + d
            x = x - lr * m
            continue
        if kind == "adagrad":
            v = v + d * d
            x = x - lr * d / (np.sqrt(v) + tau)
            continue
        m = b1 * m + (1 - b1) * d
        v = b2 * v + (1 - b2) * d * d if kind == "adam" else v - (1 - b2) * d * d * np.sign(v - d * d)
        x = x - lr * m / (np.sqrt(v) + tau)
    return x


@pytest.mark.parametrize("kind", ["sgd", "adam", "yogi", "adagrad"])
def test_each_optimiser_follows_reddi_et_al(kind):
    gen = np.random.default_rng(0)
    x0, deltas = gen.normal(size=5), gen.normal(size=(4, 5))
    opt, x = ServerOptimizer(kind, lr=0.1), torch.tensor(x0)
    for d in deltas:
        x = opt.step(x, x - torch.tensor(d))
    np.testing.assert_allclose(x.numpy(), _reference(kind, x0, deltas), rtol=1e-13, atol=1e-15)


def test_none_keeps_the_algorithms_x_bit_for_bit():
    x, proposed = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    assert ServerOptimizer().step(x, proposed) is proposed and ServerOptimizer().state() == {}
    assert KINDS[0] == "none"


def _adam(**algorithm):
    # the two lines of config: server_optimizer = "adam", server_lr = 0.02
    return make_config(algorithm={"server_optimizer": "adam", "server_lr": 0.02, **algorithm})


def test_server_adam_fednest_in_two_lines_of_config_converges_with_the_same_rounds():
    plain = simulate(make_config(algorithm={"outer_iterations": 30}), SerialComm()).history
    adam = simulate(_adam(outer_iterations=30), SerialComm()).history
    assert adam["comm_rounds"] == plain["comm_rounds"] and adam["comm_bytes"] == plain["comm_bytes"]
    assert adam["x_error"] != plain["x_error"]
    assert adam["x_error"][-1] < 0.3 * adam["x_error"][0]  # measured 0.171 from 0.617 (plain FedNest: 0.307)


def test_the_server_state_is_checkpointed_and_resumed_bitwise(tmp_path):
    whole = simulate(_adam(outer_iterations=6), SerialComm())
    Simulation(_adam(outer_iterations=3), SerialComm()).run(checkpoint_dir=tmp_path)
    saved = checkpoint.load(tmp_path)
    assert set(saved.algorithm_state) == {"server_m", "server_v"}
    second = Simulation(_adam(outer_iterations=6), SerialComm()).run(checkpoint_dir=tmp_path, resume=saved)
    assert torch.equal(second.x, whole.x) and torch.equal(second.y, whole.y)
    assert second.history["x_error"] == whole.history["x_error"][4:]


def test_an_unknown_optimiser_is_one_line():
    with pytest.raises(ConfigError, match="algorithm.server_optimizer"):
        make_config(algorithm={"server_optimizer": "rmsprop"})
