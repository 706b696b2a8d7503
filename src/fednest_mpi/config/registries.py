"""The registries of problem and algorithm kinds (:data:`PROBLEMS`, :data:`ALGORITHMS`): a config name ->
its frozen parameter class, its implementation (``"module:Class"``, imported only when a run builds it, so
the config layer stays free of torch) and the traits validation reads. The built-ins enter them by
:meth:`~fednest_mpi.registry.Registry.register`, the same function as the plugins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fednest_mpi.config.algorithm_params import FedAvgSConfig, FedBiOConfig, FedNestConfig, SingleLevelConfig
from fednest_mpi.config.fields import fields_of
from fednest_mpi.config.problem_params import (
    CompositionalConfig,
    FairnessConfig,
    HyperRepresentationConfig,
    LossTuningConfig,
    MinimaxConfig,
    QuadraticConfig,
    SyntheticConfig,
)
from fednest_mpi.errors import ConfigError
from fednest_mpi.registry import Registry


@dataclass(frozen=True)
class ProblemSpec:
    """One entry of :data:`PROBLEMS`: a problem kind, its parameter class, its implementation and its traits."""

    name: str
    params: type  #: frozen parameter class of the [problem] section
    implementation: str  #: "module:Class", imported only when a run builds it
    saddle_point: bool = False  #: g_i = -f_i, so the direct hypergradient (eq. (9)) is exact


def problem_spec_of(name: str, cls: type) -> ProblemSpec:
    """The registry entry of a plugin problem class: its ``Params`` and its ``saddle_point`` trait
    (docs/extending.md)."""
    return ProblemSpec(
        name,
        _params_of("problem", name, cls),
        f"{cls.__module__}:{cls.__qualname__}",
        saddle_point=bool(getattr(cls, "saddle_point", False)),
    )


def _params_of(kind: str, name: str, cls: type) -> type:
    missing = sorted(method.lstrip("_") for method in getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise ConfigError(
            f"{kind}.name: {name!r}: class {cls.__qualname__} does not define {', '.join(missing)}; define "
            f"{'it' if len(missing) == 1 else 'them'} (docs/extending.md: the contract of a {kind})"
        )
    params = getattr(cls, "Params", None)
    if params is None:
        raise ConfigError(
            f"{kind}.name: {name!r}: class {cls.__qualname__} has no Params; give it its parameter class as the "
            "class attribute Params (a frozen dataclass)"
        )
    return params


#: The problems by config name: the built-ins below, the plugins as they are named (registry.Registry).
PROBLEMS: Registry[ProblemSpec] = Registry("problem", problem_spec_of, ("name", "n_clients"))
for _spec in (
    ProblemSpec("quadratic", QuadraticConfig, "fednest_mpi.problems.quadratic:QuadraticProblem"),
    ProblemSpec(
        "hyper_representation",
        HyperRepresentationConfig,
        "fednest_mpi.problems.hyperrep:HyperRepresentationProblem",
    ),
    ProblemSpec("loss_tuning", LossTuningConfig, "fednest_mpi.problems.losstuning:LossTuningProblem"),
    ProblemSpec("minimax", MinimaxConfig, "fednest_mpi.problems.minimax:MinimaxProblem", saddle_point=True),
    ProblemSpec("compositional", CompositionalConfig, "fednest_mpi.problems.compositional:CompositionalProblem"),
    ProblemSpec("synthetic", SyntheticConfig, "fednest_mpi.problems.synthetic:SyntheticProblem"),
    ProblemSpec("fairness", FairnessConfig, "fednest_mpi.problems.fairness:FairnessProblem"),
):
    PROBLEMS.register(_spec)
# written on the public problem API, its parameters its class's Params: found the way a plugin is
PROBLEMS.provide("hyper_cleaning", "fednest_mpi.problems.hyper_cleaning:HyperCleaning")


@dataclass(frozen=True)
class AlgorithmSpec:
    """One entry of :data:`ALGORITHMS`: a name, its parameter class, its implementation and its traits.

    Validation, ``fednest-mpi config-doc`` and :func:`fednest_mpi.algorithms.build_algorithm` read these
    entries and nothing else, so an algorithm is added by its module, its parameter class and one entry here.
    """

    name: str
    params: type  #: frozen parameter class of the [algorithm] section
    implementation: str  #: "module:Class", imported only when a run builds it (config stays free of torch)
    summary: str  #: one line for config-doc
    kind: str  #: what it is, in error messages: "a FedNest variant", "a saddle-point method", ...
    options: Mapping[str, Any] = field(default_factory=dict)  #: keyword arguments of the class (a variant's switches)
    stateful: bool = False  #: per-client state lives across rounds on the rank hosting the client (placement = block)
    pools_outer_objective: bool = False  #: can pool an outer objective f = phi(mean_S u_i) (one extra round)
    problems: tuple[str, ...] | None = None  #: problem kinds it accepts (None: every kind)
    #: runs each client's own number of local steps (heterogeneity.local_work; Federation.local_steps)
    varies_local_work: bool = False

    def accepts(self, problem: str) -> bool:
        return self.problems is None or problem in self.problems


_FEDNEST = "fednest_mpi.algorithms.fednest:FedNest"


def algorithm_spec_of(name: str, cls: type) -> AlgorithmSpec:
    """The registry entry of a plugin algorithm class: its ``Params`` and its trait attributes ``summary``
    (default: the docstring's first line), ``kind``, ``options``, ``stateful``, ``pools_outer_objective``,
    ``problems`` and ``varies_local_work`` (docs/extending.md)."""
    summary = getattr(cls, "summary", None) or (cls.__doc__ or name).strip().splitlines()[0]
    return AlgorithmSpec(
        name,
        _params_of("algorithm", name, cls),
        f"{cls.__module__}:{cls.__qualname__}",
        summary,
        getattr(cls, "kind", "a plugin algorithm"),
        dict(getattr(cls, "options", {})),
        stateful=bool(getattr(cls, "stateful", False)),
        pools_outer_objective=bool(getattr(cls, "pools_outer_objective", False)),
        problems=getattr(cls, "problems", None),
        varies_local_work=bool(getattr(cls, "varies_local_work", False)),
    )


#: The algorithms by config name: the built-ins below, the plugins as they are named (registry.Registry).
ALGORITHMS: Registry[AlgorithmSpec] = Registry(
    "algorithm", algorithm_spec_of, ("name", "outer_iterations", "clients_per_round")
)
for _entry in (
    AlgorithmSpec(
        "fednest",
        FedNestConfig,
        _FEDNEST,
        "FedOut (Alg. 2+3) with FedInn SVRG (Alg. 4): 2T + N + 3 rounds",
        "a FedNest variant",
        {"inner_variance_reduction": True, "global_outer": True},
        pools_outer_objective=True,
        varies_local_work=True,
    ),
    AlgorithmSpec(
        "fednest_sgd",
        FedNestConfig,
        _FEDNEST,
        "FedOut (Alg. 2+3) with LFedInn SGD (Alg. 6): T + N + 3 rounds",
        "a FedNest variant",
        {"inner_variance_reduction": False, "global_outer": True},
        pools_outer_objective=True,
        varies_local_work=True,
    ),
    AlgorithmSpec(
        "lfednest",
        FedNestConfig,
        _FEDNEST,
        "LFedOut (Alg. 5) with LFedInn SGD (Alg. 6): T + 1 rounds",
        "a FedNest variant",
        {"inner_variance_reduction": False, "global_outer": False},
        varies_local_work=True,
    ),
    AlgorithmSpec(
        "lfednest_svrg",
        FedNestConfig,
        _FEDNEST,
        "LFedOut (Alg. 5) with FedInn SVRG (Alg. 4): 2T + 1 rounds",
        "a FedNest variant",
        {"inner_variance_reduction": True, "global_outer": False},
        varies_local_work=True,
    ),
    AlgorithmSpec(
        "lfednest_nonalt",
        FedNestConfig,
        _FEDNEST,
        "appendix H.1: LFedOut on each client's local y, y and x averaged in one round: T rounds",
        "a FedNest variant",
        {"inner_variance_reduction": False, "global_outer": False, "alternating": False},
        varies_local_work=True,
    ),
    AlgorithmSpec(
        "fedavg_s",
        FedAvgSConfig,
        "fednest_mpi.algorithms.minimax:FedAvgS",
        "simultaneous local descent-ascent on x and y, one round (section 4.3)",
        "a saddle-point method",
        problems=("minimax",),
        varies_local_work=True,
    ),
    AlgorithmSpec(
        "fedbio",
        FedBiOConfig,
        "fednest_mpi.algorithms.fedbio:FedBiO",
        "FedBiO (Li, Huang & Huang, Alg. 2): every client keeps its own y, one round",
        "a local-lower-level method",
        {"accelerated": False},
        stateful=True,
    ),
    AlgorithmSpec(
        "fedbioacc",
        FedBiOConfig,
        "fednest_mpi.algorithms.fedbio:FedBiO",
        "FedBiOAcc (Alg. 3): FedBiO with STORM momentum on x and y, one round",
        "a local-lower-level method",
        {"accelerated": True},
        stateful=True,
    ),
    AlgorithmSpec(
        "fedavg",
        SingleLevelConfig,
        "fednest_mpi.algorithms.singlelevel:SingleLevel",
        "FedAvg = LFedInn (Alg. 6) on g(x0, .), x fixed: T rounds",
        "a single-level method",
        {"inner_variance_reduction": False},
        varies_local_work=True,
    ),
    AlgorithmSpec(
        "fedsvrg",
        SingleLevelConfig,
        "fednest_mpi.algorithms.singlelevel:SingleLevel",
        "FedSVRG = FedInn (Alg. 4) on g(x0, .), x fixed: 2T rounds",
        "a single-level method",
        {"inner_variance_reduction": True},
        varies_local_work=True,
    ),
):
    ALGORITHMS.register(_entry)
#: built-ins whose parameter classes live next to their classes (modules that import torch): loaded and
#: registered by the same ALGORITHMS.register when a config names them or config-doc lists them all
for _name, _target in (
    ("simfbo", "fednest_mpi.algorithms.simfbo:SimFBO"),
    ("shrofbo", "fednest_mpi.algorithms.simfbo:ShroFBO"),
    ("fedmsa", "fednest_mpi.algorithms.fedmsa:FedMSA"),
    ("fedmbo", "fednest_mpi.algorithms.fedmbo:FedMBO"),
):
    ALGORITHMS.provide(_name, _target)


def section_fields(section: str, name: Any, table: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a [problem] or [algorithm] table (``section``) that the problem or algorithm ``name``
    has; entries that are fields of no registered problem (algorithm) stay, so that validation names
    them, as does everything when ``name`` is unknown.

    A config layer that names a problem or an algorithm (a file over its ``base``, ``--set
    problem.name=...`` or ``--set algorithm.name=...`` over the file, a sweep's values) keeps only these
    from the layers below it: another problem's or algorithm's fields are left behind with it."""
    registry = NAMED_SECTIONS[section]
    spec_ = registry.resolve(name) if isinstance(name, str) else None
    if spec_ is None:
        return dict(table)
    own = fields_of(spec_.params)
    every = set().union(*(fields_of(s.params) for s in registry.values()))
    if not set(table) <= every:  # perhaps fields of a provided built-in not loaded yet: load those
        every = set().union(*(fields_of(s.params) for s in registry.with_builtins()))
    return {k: v for k, v in table.items() if k in own or k not in every}


def algorithm_fields(name: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`section_fields` of an [algorithm] table."""
    return section_fields("algorithm", name, table)


#: The sections chosen by their ``name`` field, and the registry of each.
NAMED_SECTIONS: dict[str, Registry] = {"problem": PROBLEMS, "algorithm": ALGORITHMS}
