"""The public API of fednest-mpi, in one module: everything a problem, an algorithm or a script needs, and
nothing else (docs/extending.md, "Public names", lists exactly these names; a test keeps the two equal).
Every other name of the package is private and may change.

    from fednest_mpi.api import BilevelProblem, FedNest, State, spec
"""

# ruff: noqa: F401 -- every import is a re-export; __all__ is computed from SECTIONS below

from fednest_mpi import rng
from fednest_mpi.algorithms import (
    ESTIMATORS,
    Algorithm,
    ClientStore,
    Estimator,
    FedBiO,
    FedNest,
    GlobalHypergradient,
    InnerLevel,
    LocalHypergradient,
    SingleLevel,
    State,
)
from fednest_mpi.callbacks import Callback
from fednest_mpi.comm import SerialComm, world
from fednest_mpi.config import (
    ALGORITHMS,
    PROBLEMS,
    AlgorithmSpec,
    FedBiOConfig,
    FedNestConfig,
    ImageClientsConfig,
    ProblemSpec,
    QuadraticConfig,
    RunConfig,
    SingleLevelConfig,
    from_dict,
    load,
    spec,
)
from fednest_mpi.contract import PluginError, probe_problem
from fednest_mpi.errors import ConfigError, DataError, RanksDisagree, RunFailed, UsageError
from fednest_mpi.federation import Federation, Participants
from fednest_mpi.io.h5 import read_run
from fednest_mpi.problems import BilevelProblem, QuadraticProblem
from fednest_mpi.problems.base import ORACLES, Sample, is_shared, shared_rows
from fednest_mpi.problems.clientdata import ClientSplit
from fednest_mpi.problems.derived import Y_ONLY, ClientSamples, LossProblem, ModuleParameters
from fednest_mpi.problems.kernels import binary_cross_entropy_with_logits, rowwise_linear, sigmoid, softplus
from fednest_mpi.registry import GROUPS, Registry
from fednest_mpi.rng import Purpose
from fednest_mpi.runner import Simulation, simulate
from fednest_mpi.session import Session
from fednest_mpi.writers import MLflowWriter, TensorBoardWriter

#: the public names by topic (docs/extending.md and docs/api.md list them in this order)
SECTIONS: dict[str, tuple[str, ...]] = {
    "problems": (
        "BilevelProblem",
        "ORACLES",
        "Sample",
        "shared_rows",
        "is_shared",
        "QuadraticProblem",
        "LossProblem",
        "ClientSamples",
        "ClientSplit",
        "ModuleParameters",
        "Y_ONLY",
        "sigmoid",
        "softplus",
        "binary_cross_entropy_with_logits",
        "rowwise_linear",
    ),
    "algorithms": (
        "Algorithm",
        "State",
        "ClientStore",
        "FedNest",
        "InnerLevel",
        "LocalHypergradient",
        "GlobalHypergradient",
        "Estimator",
        "ESTIMATORS",
        "FedBiO",
        "SingleLevel",
        "Federation",
        "Participants",
    ),
    "randomness": ("rng", "Purpose"),
    "configs and registries": (
        "spec",
        "RunConfig",
        "load",
        "from_dict",
        "FedNestConfig",
        "FedBiOConfig",
        "SingleLevelConfig",
        "QuadraticConfig",
        "ImageClientsConfig",
        "PROBLEMS",
        "ALGORITHMS",
        "ProblemSpec",
        "AlgorithmSpec",
        "Registry",
        "GROUPS",
    ),
    "running and reading": (
        "Session",
        "Simulation",
        "simulate",
        "Callback",
        "TensorBoardWriter",
        "MLflowWriter",
        "SerialComm",
        "world",
        "read_run",
    ),
    "errors and the boundary": (
        "UsageError",
        "ConfigError",
        "DataError",
        "PluginError",
        "RunFailed",
        "RanksDisagree",
        "probe_problem",
    ),
}
__all__ = [name for names in SECTIONS.values() for name in names]
