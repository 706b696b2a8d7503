"""Small configs of the quadratic problem for tests (a module of its own, not conftest.py: with
tests/cluster/conftest.py beside it, ``from conftest import ...`` would find that one)."""

from __future__ import annotations

import sys
from pathlib import Path

from shared_data import DATA, need

from fednest_mpi import config

TESTS = Path(__file__).resolve().parent


def make_config(**sections) -> config.RunConfig:
    """A small quadratic run; keyword arguments are sections as dicts (``algorithm={...}``)."""
    data = {
        "seed": 3,
        "problem": {"name": "quadratic", "n_clients": 12, "dim_x": 4, "dim_y": 6, "heterogeneity": 1.0},
        "algorithm": {
            "outer_iterations": 5,
            "clients_per_round": 6,
            "inner_local_steps": 5,
            "inner_lr": 0.05,
            "outer_lr": 0.2,
            "neumann_steps": 4,
            "neumann_scale": 0.25,
        },
        "run": {"output": "unused.h5"},
    }
    for name, values in sections.items():
        if name == "algorithm" and "name" in values:  # a layer naming an algorithm keeps only its fields
            data["algorithm"] = config.algorithm_fields(values["name"], data["algorithm"])
        if isinstance(values, dict):
            data.setdefault(name, {}).update(values)
        else:
            data[name] = values
    return config.from_dict(data)


def small_synthetic(**fields) -> dict:
    """The problem section of a small Synthetic run with clients of different sizes (40 clients of
    lognormal sizes around 12, d = 9, H = 6, 4 classes); ``fields`` add or replace fields."""
    return {
        "name": "synthetic",
        "n_clients": 40,
        "hidden": 6,
        "n_inputs": 9,
        "n_classes": 4,
        "samples_per_client": 12,
        "size_distribution": "lognormal",
        "size_sigma": 0.5,
        "eval_clients": 5,
        "eval_samples": 10,
        **fields,
    }


#: a small problem section per registered problem, plugins included (an entry without one runs with its defaults)
SMALL_PROBLEMS = {
    "quadratic": {"n_clients": 6, "dim_x": 3, "dim_y": 4, "gradient_noise": 0.1},
    "hyper_representation": {"n_clients": 200, "hidden": 8, "batch_size": 4},  # ~300 images a client
    "loss_tuning": {"n_clients": 20, "hidden1": 6, "hidden2": 5, "batch_size": 4, "max_per_class": 100},
    "minimax": {"n_clients": 6, "dim": 3},
    "compositional": {"n_clients": 6, "dim_x": 2, "dim_y": 3},
    "synthetic": small_synthetic(n_clients=12),
    "fairness": {"n_clients": 6},
    "hyper_cleaning": {"n_clients": 6, "n_samples": 300, "batch_size": 4, "partition": "iid"},
    "fednest_ridge_tuning:RidgeTuning": {"n_clients": 6, "dim": 5, "train_samples": 3, "val_samples": 2},
    "derived_plugins:LossQuadratic": {"n_clients": 6, "dim_x": 3, "dim_y": 4},
}
#: the data set (a folder of DATA) a problem reads
PROBLEM_DATA = {
    "hyper_representation": "mnist",
    "loss_tuning": "mnist",
    "fairness": "adult",
    "hyper_cleaning": "mnist",
}
#: plugins registered by the tests (tests/plugins, examples/), checked by every registry-wide test like a built-in
TEST_PLUGINS = {
    "problem": [
        "tiny_plugins:TinyQuadratic",
        "fednest_ridge_tuning:RidgeTuning",
        "derived_plugins:LossQuadratic",
        "feature_weights:FeatureWeights",
    ],
    "algorithm": ["fednest_server_momentum:FedNestMomentum"],
}


def register_test_plugins() -> None:
    """Put the test plugins' folders on ``sys.path`` and register them, as a user's config naming them would;
    load every built-in that is provided by name (loaded only when first named), so that the registries hold
    every entry."""
    for folder in (
        TESTS / "plugins",
        TESTS.parent / "examples" / "ridge_tuning",
        TESTS.parent / "examples" / "server_momentum",
    ):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    for name in TEST_PLUGINS["problem"]:
        config.PROBLEMS.resolve(name)
    for name in TEST_PLUGINS["algorithm"]:
        config.ALGORITHMS.resolve(name)
    for registry in (config.PROBLEMS, config.ALGORITHMS):
        for name in list(registry.provided):
            registry.resolve(name)


def small_problem_section(name: str) -> dict:
    """The small [problem] section of registered problem ``name`` (its data folder checked by ``need``)."""
    section = {**SMALL_PROBLEMS.get(name, {}), "name": name}
    if name in PROBLEM_DATA:
        need(DATA / PROBLEM_DATA[name])
        section["data_dir"] = str(DATA)
    return section


def write_run(path, cfg: config.RunConfig) -> None:
    """A real run file of ``cfg`` written as `fednest-mpi run` does (1 rank, in process)."""
    from mpi4py import MPI

    from fednest_mpi.callbacks import Recorder
    from fednest_mpi.io.h5 import RunWriter
    from fednest_mpi.runner import Simulation

    sim = Simulation(cfg, MPI.COMM_SELF)
    attrs = {
        "mpi_size": 1,
        "seed": cfg.seed,
        "problem": cfg.problem.name,
        "algorithm": cfg.algorithm.name,
        "config_json": cfg.to_json(),
    }
    writer = RunWriter(path, attrs, sim.columns())
    try:
        sim.run([Recorder(writer)])
    finally:
        writer.close()
