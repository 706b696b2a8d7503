"""Where the tests find the real data sets: $FEDNEST_DATA, else ../shared/data beside the checkout."""

import os
from pathlib import Path

import pytest

DATA = Path(os.environ.get("FEDNEST_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


def requires(folder: str):
    """Skip a test module or test when DATA/folder is absent (a machine without the shared data)."""
    return pytest.mark.skipif(not (DATA / folder).is_dir(), reason=f"{folder} not found under {DATA}; set FEDNEST_DATA")


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
