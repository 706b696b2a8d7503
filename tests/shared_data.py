"""Where the tests find the real data sets: $FEDNEST_DATA, else ../shared/data beside the checkout.

A test that needs a data set is marked ``@requires("mnist")`` (or calls :func:`need`). Where the data
are missing it is skipped, with the reason -- unless ``FEDNEST_REQUIRE_DATA=1`` (CI sets it), where it
fails with the same message, so that a machine without the data cannot pass the suite silently.
"""

import os
from pathlib import Path

import pytest

DATA = Path(os.environ.get("FEDNEST_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
REQUIRE_ENV = "FEDNEST_REQUIRE_DATA"


def need(path: Path) -> None:
    """Skip (fail under ``FEDNEST_REQUIRE_DATA=1``) the calling test when ``path`` does not exist."""
    if path.exists():
        return
    message = f"{path} not found; set FEDNEST_DATA to the data folder"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_ENV}=1: data tests must run)", pytrace=False)
    pytest.skip(message)


def requires(folder: str):
    """Mark a test or module as needing DATA/folder (checked by :func:`need` in conftest.py)."""
    return pytest.mark.needs_data(folder)


def small_mnist_config(name: str, **problem):
    """A small float64 config of an MNIST problem (20 clients on shards, 5 per round, batch 16) for
    oracle tests; ``problem`` adds or replaces problem fields."""
    from fednest_mpi import config

    fields = {"name": name, "data_dir": str(DATA), "n_clients": 20, "partition": "shards", "batch_size": 16, **problem}
    return config.from_dict({"problem": fields, "algorithm": {"clients_per_round": 5}, "run": {"dtype": "float64"}})


def assert_row_independent_of_block(problem, sample):
    """A client's inner gradient is the same alone and inside a block of three (the rank-count
    invariance of batched oracles)."""
    import numpy as np
    import torch

    x, y = problem.initial_point()
    alone = problem.grad_y_inner(np.array([7]), x.expand(1, -1), y.expand(1, -1), sample)
    batched = problem.grad_y_inner(np.array([4, 7, 11]), x.expand(3, -1), y.expand(3, -1), sample)
    torch.testing.assert_close(alone[0], batched[1], rtol=1e-12, atol=1e-14)


def small_fairness_config(name="fednest", objective="balanced", cells="group", reduction="exact", chunk=0):
    """A small fair-FL run on UCI Adult (8 clients by race, 5 per round, 3 outer iterations) of
    algorithm ``name`` with the given outer objective, weighted cells, reduction and chunk size."""
    from fednest_mpi import config

    algorithm = {
        "name": name,
        "outer_iterations": 3,
        "clients_per_round": 5,
        "inner_lr": 0.5,
        "outer_lr": 5.0,
        "neumann_steps": 3,
        "neumann_scale": 0.5,
        "inner_local_steps": 3,
    }
    return config.from_dict(
        {
            "seed": 2,
            "problem": {
                "name": "fairness",
                "n_clients": 8,
                "data_dir": str(DATA),
                "sensitive": "race",
                "val_per_cell": 40,
                "weight_cells": cells,
                "outer_objective": objective,
                "worst_group_temperature": 0.1,
                "hypergradient_batch_size": 64,
            },
            "algorithm": config.algorithm_fields(name, algorithm),
            "federation": {"reduction": reduction},
            "run": {"output": "unused.h5", "chunk_clients": chunk},
        }
    )
