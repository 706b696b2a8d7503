"""Checkpoints taken on one number of ranks resume on another, bitwise (``federation.reduction =
"ordered"``), also for algorithms with per-client state (FedBiOAcc keeps y_i, y_prev_i, omega_i on
the rank hosting client i; the checkpoint files are keyed by client id).

Run under ``mpiexec -n 1``, ``-n 2`` and ``-n 4`` (``make test-mpi``). The first part of a run
stops at iteration 3 (``outer_iterations = 3``; a resumed run may raise it), the rest continues
from the checkpoint on half the ranks, or on all ranks after a 1-rank start; both are compared
with an uninterrupted 1-rank run.
"""

import shutil
import tempfile

import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank

from fednest_mpi import checkpoint
from fednest_mpi.runner import Simulation

CASES = {
    "fednest": ({"name": "fednest", "ihgp_mode": "randomized"}, {}),
    "fedbioacc": (
        {"name": "fedbioacc", "sync_period": 2, "step_schedule": "storm", "neumann_steps": 3},
        {"lower_level": "local"},
    ),
    # replicated state beyond x and y: the warm-started v of an estimator, SimFBO's v, FedMSA's momentum
    "fednest_warm_start": ({"name": "fednest", "hypergradient_estimator": "warm_start"}, {}),
    "simfbo": ({"name": "simfbo", "local_steps": 2}, {}),
    "fedmsa": ({"name": "fedmsa", "local_steps": 2, "momentum": 0.5}, {}),
}


@pytest.fixture
def folder():
    """A folder every rank sees (made by rank 0)."""
    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="fednest-resume-") if comm.rank == 0 else None, root=0)
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def _configs(small_config, case, reduction="ordered"):
    algorithm, problem = CASES[case]
    common = {
        "problem": {"gradient_noise": 0.1} | problem,
        "federation": {"reduction": reduction},
        "run": {"checkpoint_every": 2},
    }
    return (
        small_config(algorithm=algorithm | {"outer_iterations": 3}, **common),
        small_config(algorithm=algorithm | {"outer_iterations": 7}, **common),
    )


def _check(first, second, whole, exact=True):
    joined = {name: first.history[name] + second.history[name] for name in whole.history}
    assert_histories_match(joined, whole.history, rtol=None if exact else 1e-12, atol=1e-13)
    if exact:
        assert torch.equal(second.x, whole.x) and torch.equal(second.y, whole.y)


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("start", ["all ranks", "rank 0 alone"])
def test_resume_on_another_number_of_ranks(small_config, folder, case, start):
    """Started on every rank and resumed on half of them, or started on rank 0 alone and resumed on every rank."""
    comm = MPI.COMM_WORLD
    short, full = _configs(small_config, case)
    whole = simulate_on_one_rank(full)
    if start == "all ranks":
        first = Simulation(short, comm).run(checkpoint_dir=folder)
        resume_comm = comm.Split(0 if comm.rank < max(1, comm.size // 2) else MPI.UNDEFINED, comm.rank)
    else:
        first = Simulation(short, MPI.COMM_SELF).run(checkpoint_dir=folder) if comm.rank == 0 else None
        first = comm.bcast(first, root=0)  # after rank 0's checkpoint is complete
        resume_comm = comm
    saved = checkpoint.load(folder)
    assert saved.iteration == 3 and saved.mpi_size == (comm.size if start == "all ranks" else 1)
    assert bool(saved.client_files) == (case == "fedbioacc")
    if resume_comm != MPI.COMM_NULL:
        second = Simulation(full, resume_comm).run(checkpoint_dir=folder, resume=saved)
        _check(first, second, whole)
        if resume_comm != comm:
            resume_comm.Free()


@pytest.mark.mpi
def test_resume_with_sum_reduction_agrees_to_rounding(small_config, folder):
    """federation.reduction = "sum": the rank count enters only through summation order."""
    comm = MPI.COMM_WORLD
    short, full = _configs(small_config, "fednest", reduction="sum")
    whole = simulate_on_one_rank(full)
    first = Simulation(short, comm).run(checkpoint_dir=folder)
    if comm.rank == 0:  # the rest on one rank
        second = Simulation(full, MPI.COMM_SELF).run(checkpoint_dir=folder, resume=checkpoint.load(folder))
        _check(first, second, whole, exact=False)
