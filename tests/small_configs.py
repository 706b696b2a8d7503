"""Small configs of the quadratic problem for tests (a module of its own, not conftest.py: with
tests/cluster/conftest.py beside it, ``from conftest import ...`` would find that one)."""

from __future__ import annotations

from fednest_mpi import config


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
