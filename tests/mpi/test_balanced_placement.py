"""Balanced placement (federation.placement = "balanced"): even per-rank participant counts, and the
same run as on 1 rank -- bitwise where the oracles are per-row products (quadratic), to rounding
where a rank's block goes through one GEMM (synthetic, MNIST). Problems with stored data hold every
client's samples on every rank. Run under ``mpiexec -n 1, 2, 4`` (``make test-mpi``)."""

import numpy as np
import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank
from shared_data import requires, small_mnist_config
from small_configs import make_config, small_synthetic

from fednest_mpi import config
from fednest_mpi.federation import Federation
from fednest_mpi.runner import simulate


@pytest.mark.mpi
@pytest.mark.parametrize("size", [1, 5, 10, 13])
def test_every_rank_gets_within_one_client_of_the_same_count(size):
    comm = MPI.COMM_WORLD
    fed = Federation(comm, 100, placement="balanced")
    block = Federation(comm, 100)
    for key in range(20):
        S = fed.sample(key, size)
        counts = comm.allgather(S.local_slots.size)
        slots = np.concatenate(comm.allgather(S.local_slots))
        assert max(counts) - min(counts) <= 1
        assert np.array_equal(np.sort(slots), np.arange(size))  # every member exactly once
        # members leave their home rank only when it has more than its share: as few moves as possible
        at_home = block.sample(key, size).local_slots
        home = comm.allgather(at_home.size)
        stay = comm.allreduce(np.intersect1d(S.local_slots, at_home).size)
        assert size - stay == sum(max(0, h - c) for h, c in zip(home, counts))


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["fednest", "lfednest_nonalt"])
def test_balanced_placement_is_rank_count_invariant(name):
    cfg = config.from_dict(
        {
            "seed": 2,
            "problem": small_synthetic(batch_size=4),
            "algorithm": {
                "name": name,
                "outer_iterations": 3,
                "clients_per_round": 7,
                "inner_local_steps": 3,
                "neumann_steps": 2,
            },
            "federation": {"placement": "balanced", "reduction": "ordered"},
            "run": {"dtype": "float64"},
        }
    )
    world, single = simulate(cfg, MPI.COMM_WORLD), simulate_on_one_rank(cfg)
    # not bitwise: a rank's block of clients goes through one GEMM whose row results may depend on the
    # number of rows (BLAS blocking), so only rounding differs between rank counts
    torch.testing.assert_close(world.x, single.x, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(world.y, single.y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(world.history["test_loss"], single.history["test_loss"], rtol=1e-10)


@pytest.mark.mpi
def test_balanced_quadratic_run_is_bitwise_the_one_rank_block_run():
    """Per-row oracles: neither the placement nor the rank count changes a single bit."""
    cfg = make_config(algorithm={"clients_per_round": 7}, federation={"placement": "balanced", "reduction": "ordered"})
    block = make_config(algorithm={"clients_per_round": 7}, federation={"reduction": "ordered"})
    world, single = simulate(cfg, MPI.COMM_WORLD), simulate_on_one_rank(block)
    assert torch.equal(world.x, single.x) and torch.equal(world.y, single.y)
    assert_histories_match(world.history, single.history)


@pytest.mark.mpi
@pytest.mark.problem_invariance
@requires("mnist")
@pytest.mark.parametrize("name", ["hyper_representation", "loss_tuning"])
def test_balanced_mnist_run_is_rank_count_invariant(name):
    """Every rank holds all clients' images; participants are dealt evenly; training sums
    (train_eval_every) still count each client once."""
    small = (
        small_mnist_config(name, hidden=8, n_clients=200)  # ~300 images a client
        if name == "hyper_representation"
        else small_mnist_config(name, hidden1=8, hidden2=6)
    )
    cfg = config.from_dict(
        {
            "seed": 1,
            "problem": small.to_dict()["problem"],
            "algorithm": {"outer_iterations": 2, "clients_per_round": 7, "inner_local_steps": 3, "neumann_steps": 2},
            "federation": {"placement": "balanced", "reduction": "ordered"},
            "run": {"dtype": "float64", "train_eval_every": 1},
        }
    )
    world, single = simulate(cfg, MPI.COMM_WORLD), simulate_on_one_rank(cfg)
    torch.testing.assert_close(world.x, single.x, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(world.y, single.y, rtol=1e-10, atol=1e-12)
    assert_histories_match(world.history, single.history, rtol=1e-10, atol=1e-12)
