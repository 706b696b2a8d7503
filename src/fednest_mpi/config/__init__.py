"""Run configuration: typed, documented, validated before any collective.

A config is a TOML file (or a dict) with the sections of :class:`RunConfig`. The ``[problem]`` and
``[algorithm]`` sections are unions chosen by their ``name``: one registry per kind (:data:`PROBLEMS`,
:data:`ALGORITHMS`) maps a name to its frozen parameter class, its implementation and its traits
(stateful, can pool an outer objective, which problems it accepts, ...); validation reads the traits,
never lists of names. Command-line overrides ``--set section.field=value`` are applied before validation.

Every field carries its meaning, default and allowed values in its metadata, so the reference
table in ``docs/config.md`` is generated from this module (``fednest-mpi config-doc``) and
cannot drift. Validation is a pure function of the config, so every MPI rank reaches the same
verdict and raises the same :class:`~fednest_mpi.errors.ConfigError` before any communication.

The package is split by job: :mod:`~fednest_mpi.config.fields` (documented fields and their checks),
:mod:`~fednest_mpi.config.problem_params` and :mod:`~fednest_mpi.config.algorithm_params` (the built-ins'
parameter classes), :mod:`~fednest_mpi.config.run_params` (``[federation]``, ``[heterogeneity]``, ``[run]``,
:class:`RunConfig`),
:mod:`~fednest_mpi.config.registries`, :mod:`~fednest_mpi.config.loading` (files, layers, overrides),
:mod:`~fednest_mpi.config.validation` (checks across sections) and :mod:`~fednest_mpi.config.reference`.
"""

from fednest_mpi.config.algorithm_params import FedAvgSConfig, FedBiOConfig, FedNestConfig, SingleLevelConfig
from fednest_mpi.config.fields import spec
from fednest_mpi.config.loading import (
    apply_overrides,
    differing_fields,
    flatten_config,
    from_dict,
    load,
    merge_layers,
    parse_override,
    read_file,
)
from fednest_mpi.config.problem_params import (
    DATASETS,
    CompositionalConfig,
    FairnessConfig,
    HyperRepresentationConfig,
    ImageClientsConfig,
    LossTuningConfig,
    MinimaxConfig,
    QuadraticConfig,
    SyntheticConfig,
)
from fednest_mpi.config.reference import reference_markdown
from fednest_mpi.config.registries import (
    ALGORITHMS,
    PROBLEMS,
    AlgorithmSpec,
    ProblemSpec,
    algorithm_fields,
    algorithm_spec_of,
    problem_spec_of,
)
from fednest_mpi.config.run_params import FederationConfig, HeterogeneityConfig, RunConfig, RunSection
from fednest_mpi.config.validation import validate_relations, validate_world
from fednest_mpi.errors import ConfigError

__all__ = [
    "ALGORITHMS",
    "DATASETS",
    "PROBLEMS",
    "AlgorithmSpec",
    "CompositionalConfig",
    "ConfigError",
    "FairnessConfig",
    "FedAvgSConfig",
    "FedBiOConfig",
    "FedNestConfig",
    "FederationConfig",
    "HeterogeneityConfig",
    "HyperRepresentationConfig",
    "ImageClientsConfig",
    "LossTuningConfig",
    "MinimaxConfig",
    "ProblemSpec",
    "QuadraticConfig",
    "RunConfig",
    "RunSection",
    "SingleLevelConfig",
    "SyntheticConfig",
    "algorithm_fields",
    "algorithm_spec_of",
    "apply_overrides",
    "differing_fields",
    "flatten_config",
    "from_dict",
    "load",
    "merge_layers",
    "parse_override",
    "problem_spec_of",
    "read_file",
    "reference_markdown",
    "spec",
    "validate_relations",
    "validate_world",
]
