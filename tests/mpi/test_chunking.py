"""Chunked block execution (``run.chunk_clients``): a rank evaluates its members of a round chunk by
chunk, and with the default ``federation.reduction = "exact"`` (and with ``"ordered"``) the run is
bitwise the same for chunk sizes 1, 7 and "all" (0) and for any number of ranks; with the exact
reduction also under summation groups of several clients (``federation.group_clients``: rows summed in
floating point within a group, a factored form by its own product, the groups exactly). Run under
``mpiexec -n 1``, ``-n 2`` and ``-n 4``.
"""

import dataclasses

import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank
from shared_data import DATA, requires, small_fairness_config
from small_configs import register_test_plugins, small_problem_section, small_synthetic

from fednest_mpi import config
from fednest_mpi.runner import simulate

register_test_plugins()
#: every registered algorithm that runs on the quadratic problem, the test plugins included
ALGORITHMS = sorted(entry.name for entry in config.ALGORITHMS.load_all() if entry.accepts("quadratic"))


def _config(
    name: str, chunk: int, problem: str = "quadratic", reduction: str = "exact", group: int = 0
) -> config.RunConfig:
    problems = {
        "quadratic": {
            "name": "quadratic",
            "n_clients": 40,
            "dim_x": 3,
            "dim_y": 5,
            "gradient_noise": 0.1,
            "lower_level": "local" if config.ALGORITHMS[name].stateful else "global",  # FedBiO: y_i*(x)
        },
        "minimax": {"name": "minimax", "n_clients": 40, "dim": 4, "heterogeneity": 10.0},
        # float32, ragged clients: fused head steps, feature blocks, generated data
        "synthetic": small_synthetic(n_clients=60, hidden=8, n_inputs=10, n_classes=10, batch_size=2),
    }
    return config.from_dict(
        {
            "seed": 11,
            "problem": problems[problem],
            "algorithm": config.algorithm_fields(
                name,
                {  # the fields of a union of algorithms that `name` has
                    "name": name,
                    "outer_iterations": 3,
                    "clients_per_round": 23,
                    "inner_rounds": 2,
                    "inner_local_steps": 3,
                    "inner_lr": 0.05,
                    "outer_lr": 0.05,
                    "outer_local_steps": 2,
                    "neumann_steps": 3,
                    "neumann_scale": 0.05 if problem == "synthetic" else 0.25,
                    "ihgp_mode": "randomized",
                },
            ),
            "federation": {"reduction": reduction, "group_clients": group},
            "run": {"chunk_clients": chunk, "dtype": "float32" if problem == "synthetic" else "float64"},
        }
    )


def _same(a, b) -> None:
    assert_histories_match(a.history, b.history)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


@pytest.mark.mpi
@pytest.mark.parametrize("reduction, group", [("exact", 0), ("ordered", 0), ("exact", 4)])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_runs_are_bitwise_the_same_for_every_chunk_size_and_rank_count(name, reduction, group):
    reference = simulate_on_one_rank(_config(name, 0, reduction=reduction, group=group))
    for chunk in (1, 7, 0):
        _same(simulate(_config(name, chunk, reduction=reduction, group=group), MPI.COMM_WORLD), reference)


def _problem_config(name: str, chunk: int) -> config.RunConfig:
    section = small_problem_section(name)
    return config.from_dict(
        {
            "seed": 4,
            "problem": section,
            "algorithm": {"name": "fednest", "outer_iterations": 2, "clients_per_round": 5, "inner_local_steps": 2},
            "run": {"chunk_clients": chunk},
        }
    )


@pytest.mark.mpi
@pytest.mark.problem_invariance
@pytest.mark.parametrize("name", sorted(config.PROBLEMS))
def test_every_registered_problem_is_bitwise_the_same_for_every_chunk_size_and_rank_count(name):
    """Every entry of the problem registry (plugins registered by the tests included), under FedNest."""
    reference = simulate_on_one_rank(_problem_config(name, 0))
    for chunk in (1, 3):
        _same(simulate(_problem_config(name, chunk), MPI.COMM_WORLD), reference)


@pytest.mark.mpi
@pytest.mark.problem_invariance
@pytest.mark.parametrize("group", [0, 5])
@pytest.mark.parametrize("name", ["fednest", "lfednest", "fedbioacc", "fedavg", "simfbo", "fedmsa", "fedmbo"])
def test_synthetic_float32_runs_are_bitwise_the_same_for_every_chunk_size_and_rank_count(name, group):
    reference = simulate_on_one_rank(_config(name, 0, problem="synthetic", group=group))
    for chunk in (1, 7, 0):
        _same(simulate(_config(name, chunk, problem="synthetic", group=group), MPI.COMM_WORLD), reference)


@pytest.mark.mpi
def test_synthetic_runs_keeping_clients_are_bitwise_the_runs_without():
    """problem.kept_clients_memory (clients kept across sets, least recently used out) changes no bit, on any
    number of ranks and chunk size: 1 MiB holds every client of this small population."""
    reference = simulate_on_one_rank(_config("fednest", 0, problem="synthetic"))
    for chunk in (1, 7, 0):
        cfg = _config("fednest", chunk, problem="synthetic")
        cfg = dataclasses.replace(cfg, problem=dataclasses.replace(cfg.problem, kept_clients_memory=1))
        _same(simulate(cfg, MPI.COMM_WORLD), reference)


@pytest.mark.mpi
def test_fedavg_s_chunks_are_bitwise_the_same():
    reference = simulate_on_one_rank(_config("fedavg_s", 0, problem="minimax"))
    for chunk in (1, 7):
        _same(simulate(_config("fedavg_s", chunk, problem="minimax"), MPI.COMM_WORLD), reference)


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["fednest", "lfednest_nonalt", "fedbioacc"])
def test_sum_reduction_chunks_agree_to_rounding(name):
    reference = simulate_on_one_rank(_config(name, 0, reduction="sum"))
    for chunk in (1, 7):
        run = simulate(_config(name, chunk, reduction="sum"), MPI.COMM_WORLD)
        assert_histories_match(run.history, reference.history, rtol=1e-12, atol=1e-13)


def _mnist_config(
    problem: dict, name: str, chunk: int, group: int = 0, heterogeneity=None, per_round: int = 9
) -> config.RunConfig:
    return config.from_dict(
        {
            "seed": 5,
            "problem": {"data_dir": str(DATA), "n_clients": 20, "batch_size": 4, **problem},
            "algorithm": config.algorithm_fields(
                name,
                {
                    "name": name,
                    "outer_iterations": 2,
                    "clients_per_round": per_round,
                    "inner_local_steps": 3,
                    "neumann_steps": 2,
                    "inner_lr": 0.05,
                    "outer_lr": 0.05,
                },
            ),
            "federation": {"group_clients": group},
            "heterogeneity": heterogeneity or {},
            "run": {"chunk_clients": chunk, "dtype": "float32"},
        }
    )


RAGGED_MNIST = {  # clients of different sizes (the padding must not depend on the chunk or the rank)
    "hyperrep_dirichlet": {
        "name": "hyper_representation",
        "partition": "dirichlet",
        "dirichlet_alpha": 0.3,
        "hidden": 16,
        "n_clients": 200,  # ~300 images a client (20 clients: ~3,000, and FedBiOAcc's full-batch steps took 42 s)
    },
    "loss_tuning_long_tail": {"name": "loss_tuning", "hidden1": 12, "hidden2": 8, "max_per_class": 300},
}


@pytest.mark.mpi
@pytest.mark.problem_invariance
@requires("mnist")
@pytest.mark.parametrize("problem", sorted(RAGGED_MNIST))
@pytest.mark.parametrize("name", ["fednest", "lfednest", "fedbioacc", "fedavg", "simfbo", "fedmsa"])
def test_ragged_mnist_float32_runs_are_bitwise_the_same_for_every_chunk_size_and_rank_count(problem, name):
    reference = simulate_on_one_rank(_mnist_config(RAGGED_MNIST[problem], name, 0))
    for chunk in (1, 7, 0):
        _same(simulate(_mnist_config(RAGGED_MNIST[problem], name, chunk), MPI.COMM_WORLD), reference)


@pytest.mark.mpi
@pytest.mark.problem_invariance
@requires("mnist")
@pytest.mark.parametrize("problem", sorted(RAGGED_MNIST))
@pytest.mark.parametrize("name", ["fednest", "lfednest", "fedavg"])
def test_ragged_mnist_summation_groups_are_bitwise_the_same_for_every_chunk_size_and_rank_count(problem, name):
    """Groups of 4 client ids (about 2 members of a round each): dense rows and the low-rank local models
    of loss tuning (a client alone in its chunk, computed as two copies, stays factored)."""
    reference = simulate_on_one_rank(_mnist_config(RAGGED_MNIST[problem], name, 0, group=4))
    for chunk in (1, 7, 0):
        _same(simulate(_mnist_config(RAGGED_MNIST[problem], name, chunk, group=4), MPI.COMM_WORLD), reference)


@pytest.mark.mpi
@pytest.mark.problem_invariance
@requires("mnist")
def test_automatic_summation_groups_of_a_wide_round_are_bitwise_the_same_for_every_chunk_size_and_rank_count():
    """From federation.GROUP_FROM_CLIENTS clients per round the automatic size groups clients (here 130 of 260:
    16 client ids, about 8 members, a group; 17 groups) and the factored forms are summed by their groups' products."""
    from fednest_mpi.federation import summation_group

    problem = {**RAGGED_MNIST["hyperrep_dirichlet"], "n_clients": 260}
    assert summation_group(0, 260, 130) == 16
    reference = simulate_on_one_rank(_mnist_config(problem, "fednest", 0, per_round=130))
    for chunk in (1, 7, 0):
        _same(simulate(_mnist_config(problem, "fednest", chunk, per_round=130), MPI.COMM_WORLD), reference)


@pytest.mark.mpi
@pytest.mark.problem_invariance
@requires("adult")
@pytest.mark.parametrize("name, objective", [("fednest", "worst_group"), ("fedbioacc", "balanced")])
def test_fairness_runs_are_bitwise_the_same_for_every_chunk_size_and_rank_count(name, objective):
    """Per-client classifiers through autograd (FedBiOAcc) and the pooled worst-group loss: the
    logistic loss and its sigmoid must not depend on an element's place in the block."""
    cells = "group_label" if objective == "worst_group" else "group"
    reference = simulate_on_one_rank(small_fairness_config(name, objective, cells))
    for chunk in (1, 2, 0):
        _same(simulate(small_fairness_config(name, objective, cells, chunk=chunk), MPI.COMM_WORLD), reference)


@pytest.mark.mpi
@pytest.mark.problem_invariance
@requires("mnist")
@pytest.mark.parametrize("name", ["fednest", "fedavg"])
def test_summation_groups_with_uneven_work_and_dropped_clients_are_bitwise_the_same(name):
    """Uneven local work: a chunk may hold one step count or several, and the local models must take one form
    (dense) in every chunk under groups; dropped clients: zero weights inside a group."""
    het = {"local_work": "uniform", "drop_probability": 0.3}
    problem = RAGGED_MNIST["loss_tuning_long_tail"]
    reference = simulate_on_one_rank(_mnist_config(problem, name, 0, group=4, heterogeneity=het))
    for chunk in (1, 7, 0):
        _same(simulate(_mnist_config(problem, name, chunk, group=4, heterogeneity=het), MPI.COMM_WORLD), reference)
