"""System heterogeneity ([heterogeneity]: dropouts, heterogeneous local work) keeps every run bitwise the same on
1 rank and on every rank of COMM_WORLD, for chunk sizes 1, 3 and all, with the ordered reduction; and a run
checkpointed on all ranks resumes on one rank (and the other way) equal to the uninterrupted run.

Run under ``mpiexec -n 1``, ``-n 2`` and ``-n 4`` (``make test-mpi``).
"""

import shutil
import tempfile

import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank
from shared_data import DATA, requires

from fednest_mpi import checkpoint, config
from fednest_mpi.runner import Simulation, simulate

HETEROGENEITY = {
    "drop_probability": 0.3,
    "local_work": "uniform",
    "local_work_min": 0.3,
    "local_work_draw": "iteration",
}
CASES = {  # algorithm -> (problem fields, heterogeneity): FedBiO(Acc) runs the same local work on every client
    "fednest": ({}, HETEROGENEITY),
    "lfednest_nonalt": ({}, HETEROGENEITY),
    "fedavg": ({}, HETEROGENEITY),
    "fedbioacc": ({"lower_level": "local"}, {"drop_probability": 0.3}),
    "shrofbo": ({}, HETEROGENEITY),
    "fedmsa": ({}, {"drop_probability": 0.3}),
}


def _config(name: str, chunk: int = 0, iterations: int = 3, **run) -> config.RunConfig:
    problem, heterogeneity = CASES[name]
    return config.from_dict(
        {
            "seed": 13,
            "problem": {"name": "quadratic", "n_clients": 30, "dim_x": 3, "dim_y": 4, "gradient_noise": 0.1, **problem},
            "algorithm": config.algorithm_fields(
                name,
                {
                    "name": name,
                    "outer_iterations": iterations,
                    "clients_per_round": 17,
                    "inner_rounds": 2,
                    "inner_local_steps": 5,
                    "outer_local_steps": 3,
                    "inner_lr": 0.05,
                    "outer_lr": 0.05,
                    "neumann_steps": 3,
                    "local_steps": 4,
                },
            ),
            "federation": {"reduction": "ordered"},
            "heterogeneity": heterogeneity,
            "run": {"chunk_clients": chunk, **run},
        }
    )


@pytest.mark.mpi
@pytest.mark.parametrize("name", sorted(CASES))
def test_heterogeneous_runs_are_bitwise_the_same_for_every_chunk_size_and_rank_count(name):
    reference = simulate_on_one_rank(_config(name))
    assert sum(reference.history["clients_dropped"]) > 0
    for chunk in (1, 3, 0):
        run = simulate(_config(name, chunk), MPI.COMM_WORLD)
        assert_histories_match(run.history, reference.history)
        assert torch.equal(run.x, reference.x) and torch.equal(run.y, reference.y)


@pytest.fixture
def folder():
    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="fednest-hetero-") if comm.rank == 0 else None, root=0)
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["fednest", "fedbioacc"])
def test_resume_on_another_rank_count_equals_the_uninterrupted_run(folder, name):
    comm = MPI.COMM_WORLD
    whole = simulate_on_one_rank(_config(name, iterations=6))
    first = Simulation(_config(name, iterations=3, checkpoint_every=2), comm).run(checkpoint_dir=folder)
    if comm.rank == 0:  # the rest on one rank
        second = Simulation(_config(name, iterations=6, checkpoint_every=2), MPI.COMM_SELF).run(
            checkpoint_dir=folder, resume=checkpoint.load(folder)
        )
        joined = {key: first.history[key] + second.history[key] for key in whole.history}
        assert_histories_match(joined, whole.history)
        assert torch.equal(second.x, whole.x) and torch.equal(second.y, whole.y)


@pytest.mark.mpi
@pytest.mark.problem_invariance
@requires("mnist")
@pytest.mark.parametrize("name", ["fednest", "fedavg"])
def test_mnist_float32_with_fused_local_steps_of_different_lengths_is_bitwise_invariant(name):
    """Hyper-representation's fused local SGD (factored rows) run once per group of equal step counts."""

    def cfg(chunk):
        return config.from_dict(
            {
                "seed": 5,
                "problem": {
                    "name": "hyper_representation",
                    "data_dir": str(DATA),
                    "n_clients": 200,  # ~300 images a client
                    "batch_size": 4,
                    "partition": "dirichlet",
                    "hidden": 16,
                },
                "algorithm": config.algorithm_fields(
                    name,
                    {"name": name, "outer_iterations": 2, "clients_per_round": 9, "inner_local_steps": 4},
                ),
                "federation": {"reduction": "ordered"},
                "heterogeneity": HETEROGENEITY,
                "run": {"chunk_clients": chunk, "dtype": "float32"},
            }
        )

    reference = simulate_on_one_rank(cfg(0))
    for chunk in (1, 3, 0):
        run = simulate(cfg(chunk), MPI.COMM_WORLD)
        assert_histories_match(run.history, reference.history)
        assert torch.equal(run.x, reference.x) and torch.equal(run.y, reference.y)
