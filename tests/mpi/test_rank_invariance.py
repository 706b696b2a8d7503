"""One seed, the same run on 1 rank (COMM_SELF) and on every rank of COMM_WORLD.

Run under ``mpiexec -n 1``, ``-n 2`` and ``-n 4`` (``make test-mpi``).
"""

import numpy as np
import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank

from fednest_mpi import config
from fednest_mpi.federation import Federation, block_range
from fednest_mpi.runner import simulate

#: every registered algorithm of the global-lower-level quadratic (FedBiO's local one: tests/mpi/test_fedbio_ranks.py)
NAMES = sorted(s.name for s in config.ALGORITHMS.load_all() if s.accepts("quadratic") and not s.stateful)


def _compare(world, single, exact):
    assert_histories_match(world, single, rtol=None if exact else 1e-12, atol=1e-13)


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_ordered_reduction_is_bitwise_rank_count_invariant(small_config, name):
    fields = config.ALGORITHMS[name].params.__dataclass_fields__
    randomized = {"ihgp_mode": "randomized"} if "ihgp_mode" in fields else {}
    cfg = small_config(
        algorithm={"name": name, **randomized},
        federation={"reduction": "ordered"},
        problem={"gradient_noise": 0.1},
    )
    world = simulate(cfg, MPI.COMM_WORLD)
    single = simulate_on_one_rank(cfg)
    _compare(world.history, single.history, exact=True)
    assert torch.equal(world.x, single.x) and torch.equal(world.y, single.y)


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_sum_reduction_is_rank_count_invariant_to_rounding(small_config, name):
    cfg = small_config(algorithm={"name": name}, problem={"gradient_noise": 0.1})
    _compare(simulate(cfg, MPI.COMM_WORLD).history, simulate_on_one_rank(cfg).history, exact=False)


@pytest.mark.mpi
def test_every_rank_holds_the_same_iterate(small_config):
    cfg = small_config()
    result = simulate(cfg, MPI.COMM_WORLD)
    gathered = MPI.COMM_WORLD.allgather(torch.cat([result.x, result.y]).numpy())
    for other in gathered:
        np.testing.assert_array_equal(other, gathered[0])


@pytest.mark.mpi
@pytest.mark.parametrize("reduction", ["sum", "ordered", "exact"])
def test_mean_with_ranks_that_hold_no_client(reduction):
    comm = MPI.COMM_WORLD
    n_clients = max(1, comm.Get_size() - 1)  # one client fewer than ranks: the last rank holds nobody
    fed = Federation(comm, n_clients, reduction)
    S = fed.sample(7, n_clients)
    assert comm.Get_size() == 1 or comm.allreduce(len(S.local_ids) == 0, op=MPI.LOR)
    values = torch.arange(n_clients * 2, dtype=torch.float64).reshape(n_clients, 2) + 1.0
    local = values[torch.as_tensor(S.local_ids)]
    weights = np.arange(1.0, n_clients + 1.0)
    (mean,) = fed.mean(S, [local], weights)
    expected = (values * torch.tensor(weights)[:, None]).sum(0) / weights.sum()
    torch.testing.assert_close(mean, expected, rtol=1e-15, atol=0)
    assert fed.stats.rounds == 1


@pytest.mark.mpi
def test_blocks_cover_every_client_once():
    size = MPI.COMM_WORLD.Get_size()
    for n in [1, 3, 4, 10, 101]:
        ids = [i for r in range(size) for i in block_range(n, size, r)]
        assert ids == list(range(n))


@pytest.mark.mpi
def test_ordered_reduction_is_bitwise_with_single_client_blocks(small_config):
    # 3 of 12 clients per round: on 2, 3 or 4 ranks some rank evaluates a block of one client, whose
    # oracle rows must round exactly as inside a larger block
    cfg = small_config(
        algorithm={"clients_per_round": 3, "outer_iterations": 8},
        federation={"reduction": "ordered"},
        problem={"dim_x": 10, "dim_y": 20},
    )
    world = simulate(cfg, MPI.COMM_WORLD)
    single = simulate_on_one_rank(cfg)
    _compare(world.history, single.history, exact=True)
    assert torch.equal(world.x, single.x) and torch.equal(world.y, single.y)
