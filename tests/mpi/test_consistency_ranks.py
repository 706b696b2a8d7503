"""``run.check_consistency`` (src/fednest_mpi/consistency.py): a plugin that moves x on rank 1 only stops the run
on every rank with one line naming the iteration and the rank; with the check on and every rank in step,
the run is bitwise the run without it, on 1 rank and on all of COMM_WORLD.

Run under ``mpiexec -n 2`` and ``-n 4`` (``make test-mpi``); the tests of a disagreement need 2 ranks or more.
"""

from pathlib import Path

import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank

from fednest_mpi import config
from fednest_mpi.errors import RanksDisagree, RunFailed
from fednest_mpi.io.h5 import read_run
from fednest_mpi.runner import simulate
from fednest_mpi.session import Session

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
ALGORITHM = "faulty_plugins:FaultyFedNest"
TWO_RANKS = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() < 2, reason="a disagreement needs 2 ranks")
REASON = (
    "a plugin computed something rank-dependent (randomness outside the keyed streams sample.key / rng.key, data or "
    "state of its own rank); `fednest-mpi check CONFIG` compares its runs on 1 and 2 ranks"
)


@pytest.fixture(autouse=True)
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    yield
    config.ALGORITHMS.pop(ALGORITHM, None)  # registered by the config naming it; the other tests' plugins stay


def _config(small_config, every, fault="", **run):
    return small_config(
        algorithm={"name": ALGORITHM, "fault": fault, "fault_rank": 1, "fault_at": 3},
        run={"check_consistency": every, **run},
    )


@pytest.mark.mpi
@TWO_RANKS
@pytest.mark.parametrize(
    "every, where",
    [
        (1, "at iteration 3 (rank 1 differs from rank 0)"),
        (2, "at iteration 4 (rank 1 differs from rank 0; checked every 2 iterations, equal at iteration 2)"),
    ],
)
def test_x_moved_on_rank_1_stops_every_rank_naming_the_iteration_and_the_rank(small_config, every, where):
    with pytest.raises(RanksDisagree) as caught:
        simulate(_config(small_config, every, "rank_x"), MPI.COMM_WORLD)
    assert str(caught.value) == f"run.check_consistency: x and y differ between ranks {where}: {REASON}"


@pytest.mark.mpi
@TWO_RANKS
def test_unchecked_the_same_fault_goes_unnoticed(small_config):
    result = simulate(_config(small_config, 0, "rank_x"), MPI.COMM_WORLD)
    gathered = MPI.COMM_WORLD.allgather(result.x)
    assert not torch.equal(gathered[0], gathered[1])  # what the check is for


@pytest.mark.mpi
@TWO_RANKS
def test_the_session_fails_on_every_rank_and_closes_the_run_file_at_the_iterations_before(small_config, folder):
    cfg = _config(small_config, 1, "rank_x", output=str(folder / "o.h5"))
    with pytest.raises(RunFailed) as caught:
        Session(cfg, MPI.COMM_WORLD).run_to_file()
    assert str(caught.value) == (
        "run failed: run.check_consistency: x and y differ between ranks at iteration 3 (rank 1 differs from rank 0): "
        f"{REASON}; the output file holds the iterations before"
    )
    MPI.COMM_WORLD.Barrier()
    _, data = read_run(folder / "o.h5", unclosed="refuse")  # closed: plain HDF5 reads it
    assert data["iteration"].tolist() == [0, 1, 2]


@pytest.mark.mpi
@pytest.mark.parametrize("every", [1, 3])
def test_the_check_changes_no_bit_of_the_run_on_any_number_of_ranks(small_config, every):
    checked = _config(small_config, every)
    plain = _config(small_config, 0)
    world, single = simulate(checked, MPI.COMM_WORLD), simulate_on_one_rank(checked)
    reference = simulate_on_one_rank(plain)
    for result in (world, single):
        assert_histories_match(result.history, reference.history)  # comm_rounds and comm_bytes included
        assert torch.equal(result.x, reference.x) and torch.equal(result.y, reference.y)
