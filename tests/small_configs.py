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
