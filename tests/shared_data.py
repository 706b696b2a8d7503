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
