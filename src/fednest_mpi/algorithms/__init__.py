"""Federated bilevel algorithms, written against :mod:`fednest_mpi.federation` and the problem oracles.

Which names exist, their parameter classes and their traits are the entries of
:data:`fednest_mpi.config.ALGORITHMS`; :func:`build_algorithm` instantiates the entry's implementation.
"""

from fednest_mpi import config
from fednest_mpi.algorithms.base import Algorithm, ClientStore, State
from fednest_mpi.algorithms.estimators import ESTIMATORS, Estimator, neumann_series
from fednest_mpi.algorithms.fedbio import FedBiO
from fednest_mpi.algorithms.fednest import (
    FedNest,
    GlobalHypergradient,
    InnerLevel,
    LocalHypergradient,
    Variant,
    rounds_per_iteration,
)
from fednest_mpi.algorithms.minimax import FedAvgS
from fednest_mpi.algorithms.singlelevel import SingleLevel
from fednest_mpi.registry import import_class

__all__ = [
    "ESTIMATORS",
    "Algorithm",
    "ClientStore",
    "Estimator",
    "FedAvgS",
    "FedBiO",
    "FedNest",
    "GlobalHypergradient",
    "InnerLevel",
    "LocalHypergradient",
    "SingleLevel",
    "State",
    "Variant",
    "build_algorithm",
    "implementation",
    "neumann_series",
    "rounds_per_iteration",
]


def implementation(name: str) -> type[Algorithm]:
    """The class of the algorithm named ``name`` (its registry entry's ``implementation``)."""
    spec = config.ALGORITHMS.resolve(name)
    if spec is None:
        raise config.ConfigError(f"algorithm.name: unknown algorithm {name!r}")
    return import_class(spec.implementation)


def build_algorithm(cfg, problem, fed, seed: int) -> Algorithm:
    """The algorithm named by ``cfg.name``, with its registry entry's options."""
    return implementation(cfg.name)(cfg, problem, fed, seed, **config.ALGORITHMS[cfg.name].options)
