"""Federated bilevel algorithms, written against :mod:`fednest_mpi.federation` and the problem oracles."""

from fednest_mpi.algorithms.fednest import VARIANTS, FedNestFamily, Variant, neumann_series, rounds_per_iteration
from fednest_mpi.algorithms.fedbio import FedBiO
from fednest_mpi.algorithms.minimax import FedAvgS
from fednest_mpi.algorithms.singlelevel import SINGLE_LEVEL, SingleLevel

ALGORITHMS = ({name: FedNestFamily for name in VARIANTS} | {"fedavg_s": FedAvgS, "fedbio": FedBiO, "fedbioacc": FedBiO}
              | {name: SingleLevel for name in SINGLE_LEVEL})

__all__ = ["ALGORITHMS", "VARIANTS", "FedAvgS", "FedBiO", "SingleLevel", "FedNestFamily", "Variant", "neumann_series", "rounds_per_iteration"]


def build_algorithm(cfg, problem, fed, seed: int):
    """The algorithm named by ``cfg.name``."""
    return ALGORITHMS[cfg.name](cfg, problem, fed, seed)
