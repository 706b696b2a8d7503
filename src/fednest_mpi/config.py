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
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fednest_mpi import numerics
from fednest_mpi.errors import ConfigError
from fednest_mpi.registry import Registry
from fednest_mpi.text import did_you_mean


def spec(default, help: str, *, choices=None, low=None, high=None, low_open=False):
    """A dataclass field with its documentation and its allowed values."""
    meta = {"help": help, "choices": choices, "low": low, "high": high, "low_open": low_open}
    return field(default=default, metadata=meta)


# ----------------------------------------------------------------------------------------------
# Problems


@dataclass(frozen=True)
class QuadraticConfig:
    """Heterogeneous quadratic bilevel problem with closed-form solution (tests, quickstart)."""

    name: str = spec("quadratic", "problem kind", choices=("quadratic",))
    n_clients: int = spec(100, "number of clients M", low=1)
    dim_x: int = spec(10, "outer dimension d1", low=1)
    dim_y: int = spec(20, "inner dimension d2", low=1)
    strong_convexity: float = spec(
        1.0, "lower bound mu of every client's inner Hessian eigenvalues", low=0.0, low_open=True
    )
    smoothness: float = spec(
        4.0, "upper bound L of every client's inner Hessian eigenvalues (>= strong_convexity)", low=0.0, low_open=True
    )
    heterogeneity: float = spec(
        1.0, "scale of client-to-client differences in g_i and f_i (0 = identical clients)", low=0.0
    )
    gradient_noise: float = spec(
        0.0, "std of the additive Gaussian noise of every stochastic gradient oracle (0 = exact)", low=0.0
    )
    outer_regularization: float = spec(1.0, "weight of the (lambda/2)||x||^2 term in every f_i", low=0.0)
    lower_level: str = spec(
        "global",
        "global: one lower level y*(x) = argmin mean_i g_i (FedNest eq. (1)); local: every client its own "
        "y*_i(x) = argmin g_i (FedBiO eq. (7)); sets x* and the metrics",
        choices=("global", "local"),
    )

    def stored_numbers_per_client(self) -> int:
        """G, P (dim_y^2 each), B (dim_y x dim_x), c, a (dim_y), e (dim_x): the memory check (memory.py)."""
        return 2 * self.dim_y**2 + self.dim_y * self.dim_x + 2 * self.dim_y + self.dim_x


@dataclass(frozen=True)
class DataSetSpec:
    """A real data set: its folder under a data root and its name in messages."""

    folder: str
    title: str
    images: bool  # IDX images, for the MNIST problems' problem.dataset


#: The real data sets by name, for ``problem.dataset``, ``fednest-mpi download`` and the data layer's folders.
DATASETS = {
    "mnist": DataSetSpec("mnist", "MNIST", images=True),
    "fashion": DataSetSpec("fashion-mnist", "Fashion-MNIST", images=True),
    "adult": DataSetSpec("adult", "Adult", images=False),
}
IMAGE_DATASETS = tuple(name for name, d in DATASETS.items() if d.images)


@dataclass(frozen=True)
class ImageClientsConfig:
    """Fields shared by the MNIST problems: data, clients and their local splits, minibatches."""

    name: str = spec("", "problem kind")
    dataset: str = spec("mnist", "image data set (same IDX format)", choices=IMAGE_DATASETS)
    data_dir: str = spec("", "data directory; empty: the FEDNEST_DATA environment variable")
    data_file: str = spec(
        "",
        "your own data: a federated data-set file (docs/data.md; `fednest-mpi data convert`) of 784 features "
        "and 10 classes, whose clients replace dataset and partition; empty: the data set split by partition",
    )
    n_clients: int = spec(100, "number of clients M", low=1)
    partition: str = spec(
        "shards",
        "iid; shards: McMahan non-iid (label-sorted shards); dirichlet: label skew",
        choices=("iid", "shards", "dirichlet"),
    )
    shards_per_client: int = spec(
        2, "shards per client (partition = shards; n_clients * shards_per_client shards)", low=1
    )
    dirichlet_alpha: float = spec(
        0.5, "Dirichlet concentration (partition = dirichlet; small = skewed)", low=0.0, low_open=True
    )
    val_fraction: float = spec(
        0.2, "fraction of each client's samples in its outer (validation) split", low=0.0, low_open=True, high=0.95
    )
    batch_size: int = spec(64, "minibatch size of the inner (FedInn) local steps", low=1)
    hypergradient_batch_size: int = spec(
        0, "minibatch of the outer/second-order oracles; 0 = the client's whole split (authors' code)", low=0
    )
    inner_regularization: float = spec(
        0.001, "lambda of the squared L2 term (lambda/2)||y||^2 in g_i (strong convexity)", low=0.0
    )


@dataclass(frozen=True)
class HyperRepresentationConfig(ImageClientsConfig):
    """Hyper-representation learning on MNIST (paper section 4.1): x = hidden layer, y = linear head."""

    name: str = spec("hyper_representation", "problem kind", choices=("hyper_representation",))
    hidden: int = spec(200, "width H of the hidden layer (x has 785 H numbers, y 10 H + 10)", low=1)
    dropout: float = spec(
        0.0, "dropout probability before the ReLU in training oracles (authors' code: 0.5)", low=0.0, high=0.9
    )


@dataclass(frozen=True)
class LossTuningConfig(ImageClientsConfig):
    """VS-loss tuning on long-tail MNIST (paper section 4.2): x = logit adjustments, y = a 3-layer MLP."""

    name: str = spec("loss_tuning", "problem kind", choices=("loss_tuning",))
    imbalance_ratio: float = spec(
        100.0, "size ratio of the largest to the smallest class of the long-tail training set", low=1.0
    )
    max_per_class: int = spec(6000, "size of the largest class before the exponential decay", low=1)
    hidden1: int = spec(200, "width of the first hidden layer of the MLP y; 0 drops the layer", low=0)
    hidden2: int = spec(
        100,
        "width of the second hidden layer of the MLP y; 0 drops the layer (both 0: multinomial "
        "logistic regression, convex in y)",
        low=0,
    )
    tune_loss: bool = spec(
        True, "tune the VS-loss x; false: plain cross-entropy with x fixed at 0 (the untuned baseline)"
    )


@dataclass(frozen=True)
class MinimaxConfig:
    """Federated saddle-point problem of paper section 4.3 / Figure 4 (g_i = -f_i, closed-form saddle point)."""

    name: str = spec("minimax", "problem kind", choices=("minimax",))
    n_clients: int = spec(1000, "number of clients M", low=1)
    dim: int = spec(10, "dimension d of x and of y", low=1)
    heterogeneity: float = spec(1.0, "s: b'_i ~ N(0, s^2 I) before centring across clients", low=0.0)
    coupling_max: float = spec(0.1, "A_i = t_i I with t_i ~ U(0, coupling_max)", low=0.0)
    outer_regularization: float = spec(
        10.0, "lambda of the (lambda/2)||x||^2 term in every f_i (paper text: 10)", low=0.0, low_open=True
    )
    initial_value: float = spec(10.0, "every coordinate of x0 and y0 (authors' notebook: 10)")

    def stored_numbers_per_client(self) -> int:
        """t_i and b_i (dim): the memory check (memory.py)."""
        return 1 + self.dim


@dataclass(frozen=True)
class CompositionalConfig:
    """Federated compositional problem (paper eq. (2.1), section 3.2): linear r_i, quadratic f_i, known x*."""

    name: str = spec("compositional", "problem kind", choices=("compositional",))
    n_clients: int = spec(20, "number of clients M", low=1)
    dim_x: int = spec(5, "outer dimension d1", low=1)
    dim_y: int = spec(10, "inner dimension d2 (>= dim_x, so that x* is unique)", low=1)
    heterogeneity: float = spec(
        1.0, "scale of client-to-client differences in r_i and f_i (0 = identical clients)", low=0.0
    )

    def stored_numbers_per_client(self) -> int:
        """R (dim_y x dim_x), c, a, p (dim_y): the memory check (memory.py)."""
        return self.dim_y * self.dim_x + 3 * self.dim_y


@dataclass(frozen=True)
class SyntheticConfig:
    """Hyper-representation (x = representation layer, y = linear head) on FedProx's Synthetic(alpha, beta) data,
    generated per client from (seed, client id): any number of clients (scaling runs)."""

    name: str = spec("synthetic", "problem kind", choices=("synthetic",))
    n_clients: int = spec(1000, "number of clients M (data are generated on demand, so 10^6 costs no memory)", low=1)
    alpha: float = spec(1.0, "model heterogeneity: u_i ~ N(0, alpha^2), W_i, b_i ~ N(u_i, 1)", low=0.0)
    beta: float = spec(
        1.0, "input heterogeneity: B_i ~ N(0, beta^2), v_i ~ N(B_i, 1), a ~ N(v_i, diag(j^-1.2))", low=0.0
    )
    n_inputs: int = spec(60, "input dimension d", low=1)
    n_classes: int = spec(10, "number of classes C", low=2)
    samples_per_client: int = spec(100, "samples per client (fixed), or their median (lognormal)", low=2)
    size_distribution: str = spec(
        "fixed",
        "fixed: every client has samples_per_client; lognormal: heavy-tailed sizes",
        choices=("fixed", "lognormal"),
    )
    size_sigma: float = spec(2.0, "sigma of the lognormal sample counts (FedProx: 2)", low=0.0)
    max_samples: int = spec(
        1000, "cap on a client's sample count (lognormal); clients are padded to the largest of a round", low=2
    )
    val_fraction: float = spec(
        0.2, "fraction of each client's samples in its outer (validation) split", low=0.0, low_open=True, high=0.95
    )
    hidden: int = spec(64, "width H of the representation layer (x has (d + 1) H numbers, y C H + C)", low=1)
    dropout: float = spec(0.0, "dropout probability before the ReLU in training oracles", low=0.0, high=0.9)
    batch_size: int = spec(16, "minibatch size of the inner (FedInn) local steps", low=1)
    hypergradient_batch_size: int = spec(
        0, "minibatch of the outer/second-order oracles; 0 = the client's whole split", low=0
    )
    inner_regularization: float = spec(
        0.001, "lambda of the squared L2 term (lambda/2)||y||^2 in g_i (strong convexity)", low=0.0
    )
    eval_clients: int = spec(100, "evaluation: clients 0..eval_clients-1 ...", low=1)
    eval_samples: int = spec(100, "... each with this many fresh samples (a separate stream)", low=1)


@dataclass(frozen=True)
class FairnessConfig:
    """Fair federated learning on UCI Adult (FedBiOAcc paper's application): x = group weights, y = a classifier."""

    name: str = spec("fairness", "problem kind", choices=("fairness",))
    data_dir: str = spec("", "data directory holding adult/; empty: the FEDNEST_DATA environment variable")
    n_clients: int = spec(20, "number of clients M", low=1)
    sensitive: str = spec("sex", "sensitive attribute defining the groups", choices=("sex", "race"))
    weight_cells: str = spec(
        "group",
        "what x weights: group (one weight per sensitive group) or group_label "
        "(one per (group, label) cell); the validation set is balanced over the same cells",
        choices=("group", "group_label"),
    )
    dirichlet_alpha: float = spec(
        0.5,
        "Dirichlet concentration of the split of the training set over clients, "
        "by (group, label) cell (small = skewed)",
        low=0.0,
        low_open=True,
    )
    val_per_cell: int = spec(
        100,
        "samples per weighted cell in the group-balanced validation set (taken from adult.data, "
        "dealt round-robin to the clients)",
        low=1,
    )
    outer_objective: str = spec(
        "balanced",
        "outer loss: balanced (f_i = mean over the weighted cells of the cell's mean loss on the "
        "client's validation split) or worst_group (tau logsumexp over the weighted cells of the pooled "
        "cell loss / tau, tau = worst_group_temperature: a smooth worst-group loss; fednest and fednest_sgd "
        "only, one extra round per outer iteration)",
        choices=("balanced", "worst_group"),
    )
    worst_group_temperature: float = spec(
        0.05, "tau of outer_objective = worst_group (-> 0: the max over groups)", low=0.0, low_open=True
    )
    initial_weights: str = spec(
        "",
        "cell weights at the start, as NAME=W pairs separated by commas (NAME: a group, or GROUP_le50K / "
        "GROUP_gt50K with weight_cells = group_label; unnamed cells 1; rescaled to mean 1); empty: all 1. "
        "With algorithm fedavg (x fixed) this retrains the classifier with given, e.g. tuned, weights",
    )
    group_feature: bool = spec(
        True,
        "whether the classifier sees the sensitive attribute (its one-hot columns); false: "
        "'fairness through unawareness', the groups share one intercept and the weights decide the compromise",
    )
    model: str = spec(
        "logistic", "classifier y: logistic regression or a one-hidden-layer MLP", choices=("logistic", "mlp")
    )
    hidden: int = spec(16, "hidden width of the MLP (model = mlp)", low=1)
    batch_size: int = spec(64, "minibatch size of the inner local steps", low=1)
    hypergradient_batch_size: int = spec(
        0,
        "minibatch of the second-order oracles (training split); 0 = the client's whole split; "
        "the outer loss always uses the client's whole (small) validation split",
        low=0,
    )
    inner_regularization: float = spec(0.01, "mu of the (mu/2)||y||^2 term in g_i (strong convexity)", low=0.0)

    @property
    def pooled_outer_objective(self) -> bool:
        """Whether f is a function of the pooled validation set (needs an algorithm that can pool it)."""
        return self.outer_objective == "worst_group"


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

# ----------------------------------------------------------------------------------------------
# Algorithms: one frozen parameter class per algorithm class (the [algorithm] section is a union
# on ``name``, like [problem]); the fields shared by several classes are made by one function each.


def _outer_iterations():
    return spec(
        100, "outer iterations K of Algorithm 1 (one communication round for fedbio, fedbioacc, fedavg_s)", low=1
    )


def _clients_per_round():
    return spec(10, "clients |S| sampled (uniformly, without replacement) per round", low=1)


def _inner_rounds():
    return spec(1, "FedInn rounds T per outer iteration", low=1)


def _inner_lr():
    return spec(
        0.01,
        "local inner step size beta_i of FedInn (Alg. 4/6); fedbio, fedbioacc: beta (y steps); fedavg_s: the y step",
        low=0.0,
        low_open=True,
    )


def _outer_lr():
    return spec(
        0.01,
        "local outer step size alpha_i of FedOut (Alg. 2/5); fedbio, fedbioacc: alpha (x steps); fedavg_s: the x step",
        low=0.0,
        low_open=True,
    )


def _inner_local_steps():
    return spec(40, "local steps tau_i of FedInn per round (fedavg_s: its simultaneous local steps)", low=1)


def _neumann_steps():
    return spec(
        5,
        "N: Hessian-vector rounds of FedIHGP (Alg. 3), terms of the local Neumann series (Alg. 5; "
        "fedbio, fedbioacc: Q)",
        low=0,
    )


def _neumann_scale():
    return spec(0.01, "eta = 1/l_{g,1}: scale of the Neumann series (I - eta H)^k", low=0.0, low_open=True)


def _ihgp_mode():
    return spec(
        "truncated",
        "truncated: eta * sum_{k=0..N} (I - eta H)^k v (N rounds, deterministic); "
        "randomized: N eta (I - eta H)^{N'} v with N' ~ U{0..N-1} (paper eq. (10b), N' rounds)",
        choices=("truncated", "randomized"),
    )


def _hypergradient():
    return spec(
        "implicit",
        "implicit: direct minus indirect gradient through FedIHGP / local Neumann series (eq. (8), "
        "(10)); direct: the minimax specialisation of eq. (9), nabla_x f_i only, no FedIHGP (saddle-point "
        "problems only)",
        choices=("implicit", "direct"),
    )


@dataclass(frozen=True)
class FedNestConfig:
    """FedNest family (paper Table 2, appendix H.1) and its step sizes; defaults are the paper's appendix H."""

    name: str = spec("fednest", "algorithm")
    outer_iterations: int = _outer_iterations()
    inner_rounds: int = _inner_rounds()
    clients_per_round: int = _clients_per_round()
    inner_lr: float = _inner_lr()
    outer_lr: float = _outer_lr()
    inner_local_steps: int = _inner_local_steps()
    outer_local_steps: int = spec(1, "local steps tau_i of FedOut per round", low=1)
    neumann_steps: int = _neumann_steps()
    neumann_scale: float = _neumann_scale()
    ihgp_mode: str = _ihgp_mode()
    ihgp_resample_clients: bool = spec(
        True, "draw a fresh client set S_n for every FedIHGP round (paper) instead of reusing FedOut's set"
    )
    hypergradient: str = _hypergradient()


@dataclass(frozen=True)
class FedBiOConfig:
    """FedBiO and FedBiOAcc (Li, Huang & Huang): local lower level, sync_period local iterations per round."""

    name: str = spec("fedbio", "algorithm")
    outer_iterations: int = _outer_iterations()
    clients_per_round: int = _clients_per_round()
    inner_lr: float = _inner_lr()
    outer_lr: float = _outer_lr()
    neumann_steps: int = _neumann_steps()
    neumann_scale: float = _neumann_scale()
    ihgp_mode: str = _ihgp_mode()
    hypergradient: str = _hypergradient()
    sync_period: int = spec(
        5,
        "I, local iterations (a y step and an x step each) per round; the round averages x "
        "(fedbio) or x, x_prev and the momentum nu (fedbioacc)",
        low=1,
    )
    local_update_order: str = spec(
        "simultaneous",
        "fedbio: simultaneous (y and x steps both from (x_t, y_t)) or inner_first (the x step uses the new y_{t+1})",
        choices=("simultaneous", "inner_first"),
    )
    step_schedule: str = spec(
        "constant",
        "step sizes at local iteration t: constant (outer_lr, inner_lr) or storm: "
        "scaled by ((u + 1) / (u + t))^(1/3) (MRBO/STORM), u = schedule_offset",
        choices=("constant", "storm"),
    )
    schedule_offset: float = spec(10.0, "u of step_schedule = storm", low=0.0)
    momentum_outer: float = spec(
        0.5,
        "fedbioacc: STORM weight a_1 of the fresh hypergradient in nu at t = 1; "
        "a_t = min(1, a_1 (alpha_t / alpha_1)^2)",
        low=0.0,
        low_open=True,
        high=1.0,
    )
    momentum_inner: float = spec(
        0.5,
        "fedbioacc: STORM weight b_1 of the fresh inner gradient in omega; b_t likewise",
        low=0.0,
        low_open=True,
        high=1.0,
    )


@dataclass(frozen=True)
class FedAvgSConfig:
    """FedAvg-S, the simultaneous saddle-point baseline of section 4.3: inner_local_steps steps with inner_lr on y
    and outer_lr on x, one round."""

    name: str = spec("fedavg_s", "algorithm")
    outer_iterations: int = _outer_iterations()
    clients_per_round: int = _clients_per_round()
    inner_lr: float = _inner_lr()
    outer_lr: float = _outer_lr()
    inner_local_steps: int = _inner_local_steps()


@dataclass(frozen=True)
class SingleLevelConfig:
    """Single-level FL on g(x0, .) with x fixed: inner_rounds rounds of LFedInn (Alg. 6, fedavg) or FedInn
    (Alg. 4, fedsvrg) per outer iteration."""

    name: str = spec("fedavg", "algorithm")
    outer_iterations: int = _outer_iterations()
    inner_rounds: int = _inner_rounds()
    clients_per_round: int = _clients_per_round()
    inner_lr: float = _inner_lr()
    inner_local_steps: int = _inner_local_steps()


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

    def accepts(self, problem: str) -> bool:
        return self.problems is None or problem in self.problems


_FEDNEST = "fednest_mpi.algorithms.fednest:FedNest"


def algorithm_spec_of(name: str, cls: type) -> AlgorithmSpec:
    """The registry entry of a plugin algorithm class: its ``Params`` and its trait attributes ``summary``
    (default: the docstring's first line), ``kind``, ``options``, ``stateful``, ``pools_outer_objective``
    and ``problems`` (docs/extending.md)."""
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
    ),
    AlgorithmSpec(
        "fednest_sgd",
        FedNestConfig,
        _FEDNEST,
        "FedOut (Alg. 2+3) with LFedInn SGD (Alg. 6): T + N + 3 rounds",
        "a FedNest variant",
        {"inner_variance_reduction": False, "global_outer": True},
        pools_outer_objective=True,
    ),
    AlgorithmSpec(
        "lfednest",
        FedNestConfig,
        _FEDNEST,
        "LFedOut (Alg. 5) with LFedInn SGD (Alg. 6): T + 1 rounds",
        "a FedNest variant",
        {"inner_variance_reduction": False, "global_outer": False},
    ),
    AlgorithmSpec(
        "lfednest_svrg",
        FedNestConfig,
        _FEDNEST,
        "LFedOut (Alg. 5) with FedInn SVRG (Alg. 4): 2T + 1 rounds",
        "a FedNest variant",
        {"inner_variance_reduction": True, "global_outer": False},
    ),
    AlgorithmSpec(
        "lfednest_nonalt",
        FedNestConfig,
        _FEDNEST,
        "appendix H.1: LFedOut on each client's local y, y and x averaged in one round: T rounds",
        "a FedNest variant",
        {"inner_variance_reduction": False, "global_outer": False, "alternating": False},
    ),
    AlgorithmSpec(
        "fedavg_s",
        FedAvgSConfig,
        "fednest_mpi.algorithms.minimax:FedAvgS",
        "simultaneous local descent-ascent on x and y, one round (section 4.3)",
        "a saddle-point method",
        problems=("minimax",),
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
    ),
    AlgorithmSpec(
        "fedsvrg",
        SingleLevelConfig,
        "fednest_mpi.algorithms.singlelevel:SingleLevel",
        "FedSVRG = FedInn (Alg. 4) on g(x0, .), x fixed: 2T rounds",
        "a single-level method",
        {"inner_variance_reduction": True},
    ),
):
    ALGORITHMS.register(_entry)


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def algorithm_fields(name: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of an [algorithm] table that algorithm ``name`` has; entries that are fields of no
    algorithm stay (validation names them), as does everything when ``name`` is unknown.

    A config layer that names an algorithm (a file over its ``base``, ``--set algorithm.name=...`` over
    the file, a sweep's values) keeps only these from the layers below it: another algorithm's fields
    are left behind with that algorithm."""
    spec_ = ALGORITHMS.resolve(name) if isinstance(name, str) else None
    if spec_ is None:
        return dict(table)
    own = _fields(spec_.params)
    every = set().union(*(_fields(s.params) for s in ALGORITHMS.values()))
    return {k: v for k, v in table.items() if k in own or k not in every}


# ----------------------------------------------------------------------------------------------
# Federation, run


@dataclass(frozen=True)
class FederationConfig:
    """How aggregation is done across ranks."""

    reduction: str = spec(
        "sum",
        "sum: one Allreduce of the weighted local sums (fastest; rank-count invariant to ~1e-15 relative); "
        "ordered: one Allreduce of per-participant slots summed in client order (bitwise rank-count invariant, "
        "|S| times more bytes)",
        choices=("sum", "ordered"),
    )
    wait: str = spec(
        "auto",
        "how ranks wait in a collective: block (MPI's busy-poll), poll (test and yield the core), "
        "auto (poll when a node has more ranks than cores)",
        choices=("auto", "block", "poll"),
    )
    placement: str = spec(
        "block",
        "which rank evaluates which client: block (contiguous blocks of client ids, a rank hosts their data); "
        "balanced (each round's participants split evenly, every rank within one client of the same count; "
        "every rank then holds every client's data -- synthetic generates it from the client id -- and no per-client "
        "records are written)",
        choices=("block", "balanced"),
    )


@dataclass(frozen=True)
class RunSection:
    """Where and how the run executes."""

    output: str = spec("runs/run.h5", "HDF5 output path")
    overwrite: bool = spec(False, "replace an existing output file")
    device: str = spec("cpu", "torch device", choices=("cpu", "cuda"))
    dtype: str = spec("float64", "floating-point precision of iterates and oracles", choices=("float32", "float64"))
    torch_threads: int = spec(1, "torch intra-op threads per rank (ranks x threads <= cores)", low=1)
    numerics: str = spec(
        numerics.DEFAULT,
        "which code paths of MKL, ATen and OpenBLAS compute the run: reproducible = chunk- and rank-count "
        "invariant on every x86-64 CPU, the same bits on every Intel CPU with AVX2; portable = also the same "
        "bits on Intel and AMD (slower products); native = each library's fastest path, no guarantee across "
        "CPUs (docs/design.md)",
        choices=tuple(numerics.MODES),
    )
    chunk_clients: int = spec(
        0,
        "clients a rank evaluates at once; a round's members are processed chunk by chunk, so memory "
        "per rank is bounded by the chunk (0: automatic from run.block_memory; results do not depend "
        "on it: bitwise with federation.reduction = ordered, docs/performance.md)",
        low=0,
    )
    block_memory: int = spec(
        512,
        "working-set budget of one chunk per rank in MiB, for the automatic run.chunk_clients "
        "(the problem estimates its bytes per client)",
        low=1,
    )
    log_every: int = spec(10, "one summary log line every k outer iterations (batch logs)", low=1)
    progress: str = spec(
        "auto", "progress bar on rank 0: auto (only on a terminal), always, never", choices=("auto", "always", "never")
    )
    checkpoint_every: int = spec(
        100,
        "write a checkpoint every k outer iterations; one is also written at iteration 0, at the end "
        "and on SIGTERM/SIGUSR1 (0: only then); see docs/reliability.md",
        low=0,
    )
    checkpoint_dir: str = spec(
        "", "checkpoint folder (shared by all ranks); empty: the output path with '.ckpt' appended"
    )
    client_series: bool = spec(
        True,
        "record per-client series (participation, local losses, gradient norms; clients x iterations, "
        "one file per rank joined by virtual datasets, docs/hdf5.md); needs federation.placement = block",
    )
    train_eval_every: int = spec(
        0,
        "every k outer iterations also evaluate on the training data of all clients: "
        "outer_loss = mean_i f_i(x, y), inner_loss = mean_i g_i(x, y) and train_accuracy "
        "where the problem classifies (NaN in between; 0: never)",
        low=0,
    )
    snapshot_every: int = spec(
        0, "store x and y in /snapshots every k outer iterations and at the last one (0: never)", low=0
    )


@dataclass(frozen=True)
class RunConfig:
    """A whole run."""

    seed: int = spec(0, "seed of every random stream (sampling, minibatches, data, init)", low=0)
    problem: Any = field(default_factory=QuadraticConfig, metadata={"help": "problem section; see the problem kinds"})
    algorithm: Any = field(default_factory=FedNestConfig, metadata={"help": "algorithm section; see the algorithms"})
    federation: FederationConfig = field(default_factory=FederationConfig, metadata={"help": "federation section"})
    run: RunSection = field(default_factory=RunSection, metadata={"help": "run section"})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


SECTIONS = {"federation": FederationConfig, "run": RunSection}


# ----------------------------------------------------------------------------------------------
# Loading and validation


INT_LIMIT = 2**63  # integer fields are int64 in numpy and torch
SEED_MAX = 2**64 - 1  # the seed is a uint64 key (rng.py)


def _coerce(path: str, value: Any, typ: Any) -> Any:
    """Check ``value`` against the annotated type; ints are accepted where floats are expected."""
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -INT_LIMIT <= value <= (SEED_MAX if path == "seed" else INT_LIMIT - 1):
                raise ConfigError(f"{path}: {value} does not fit in a 64-bit integer; choose a smaller value")
            return value
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(f"{path}: expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{path}: expected a number, got {value!r}")
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path}: expected a string, got {value!r}")
    raise TypeError(f"unsupported config type {typ!r}")


def _check_range(path: str, value: Any, meta: Mapping) -> None:
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(
            f"{path}: {value!r} is not one of {', '.join(map(repr, choices))}" + did_you_mean(str(value), choices)
        )
    low, high = meta.get("low"), meta.get("high")
    if low is not None:
        if meta.get("low_open") and not value > low:
            raise ConfigError(f"{path}: must be > {low}, got {value!r}")
        if not meta.get("low_open") and not value >= low:
            raise ConfigError(f"{path}: must be >= {low}, got {value!r}")
    if high is not None and not value <= high:
        raise ConfigError(f"{path}: must be <= {high}, got {value!r}")


def _build(cls: type, data: Any, path: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of fields, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        if name not in fields:
            raise ConfigError(
                f"{path}.{name}: unknown field" + did_you_mean(name, fields) + f"; known fields: {', '.join(fields)}"
            )
    values = {}
    for name, f in fields.items():
        if name not in data:
            continue
        where = f"{path}.{name}"
        values[name] = _coerce(where, data[name], hints[name])
        if name != "name":  # a section's name was resolved by its registry (a plugin's may be 'module:Class')
            _check_range(where, values[name], f.metadata)
    return cls(**values)


def _build_problem(data: Any):
    if not isinstance(data, dict):
        raise ConfigError(f"problem: expected a table of fields, got {data!r}")
    name = data.get("name", "quadratic")
    spec_ = PROBLEMS.resolve(name) if isinstance(name, str) else None
    if spec_ is None:
        raise ConfigError(
            f"problem.name: unknown problem {name!r}"
            + did_you_mean(str(name), PROBLEMS.names())
            + f"; choose from {', '.join(PROBLEMS.names())}, or name a plugin class as 'module:Class'"
        )
    return _build(spec_.params, data, "problem")


def _build_algorithm(data: Any):
    """The parameter object of the algorithm named in ``data``. A field of another algorithm is an
    error naming both, unless it states that field's default (it then changes nothing: a sweep may zip
    a field over algorithms that lack it)."""
    if not isinstance(data, dict):
        raise ConfigError(f"algorithm: expected a table of fields, got {data!r}")
    name = data.get("name", "fednest")
    spec_ = ALGORITHMS.resolve(name) if isinstance(name, str) else None
    if spec_ is None:
        raise ConfigError(
            f"algorithm.name: {name!r} is not one of {', '.join(map(repr, ALGORITHMS.names()))}"
            + did_you_mean(str(name), ALGORITHMS.names())
            + ", or name a plugin class as 'module:Class'"
        )
    own, kept = _fields(spec_.params), {}
    for key, value in data.items():
        owners = [s for s in ALGORITHMS.values() if key not in own and key in _fields(s.params)]
        if not owners:
            kept[key] = value
            continue
        f = _fields(owners[0].params)[key]
        where = f"algorithm.{key}"
        if _coerce(where, value, typing.get_type_hints(owners[0].params)[key]) != f.default:
            raise ConfigError(
                f"{where}: does not apply to algorithm {name!r} ({spec_.kind}); it is a field of "
                f"{', '.join(s.name for s in owners)}; remove it"
            )
    return _build(spec_.params, kept, "algorithm")


def from_dict(data: dict) -> RunConfig:
    """Build and validate a :class:`RunConfig` from plain data (TOML/JSON tables)."""
    if not isinstance(data, dict):
        raise ConfigError("config: expected a table at the top level")
    known = {f.name for f in dataclasses.fields(RunConfig)}
    for name in data:
        if name not in known:
            raise ConfigError(
                f"{name}: unknown section or field" + did_you_mean(name, known) + f"; known: {', '.join(sorted(known))}"
            )
    kwargs = {}
    if "seed" in data:
        kwargs["seed"] = _coerce("seed", data["seed"], int)
        _check_range("seed", kwargs["seed"], {"low": 0, "high": SEED_MAX})
    if "problem" in data:
        kwargs["problem"] = _build_problem(data["problem"])
    if "algorithm" in data:
        kwargs["algorithm"] = _build_algorithm(data["algorithm"])
    for name, cls in SECTIONS.items():
        if name in data:
            kwargs[name] = _build(cls, data[name], name)
    cfg = RunConfig(**kwargs)
    validate_relations(cfg)
    return cfg


def validate_relations(cfg: RunConfig) -> None:
    """Checks that involve several fields."""
    p, a = cfg.problem, cfg.algorithm
    alg, prob = ALGORITHMS[a.name], PROBLEMS[p.name]
    if a.clients_per_round > p.n_clients:
        raise ConfigError(
            f"algorithm.clients_per_round: {a.clients_per_round} is more than problem.n_clients = {p.n_clients}; "
            "lower it or add clients"
        )
    if (
        isinstance(p, HyperRepresentationConfig)
        and not p.data_file
        and p.partition == "shards"
        and 60000 % (p.n_clients * p.shards_per_client)
    ):
        raise ConfigError(
            f"problem.shards_per_client: {p.n_clients} clients x {p.shards_per_client} shards "
            "does not divide the 60000 "
            "training images into equal shards; choose n_clients * shards_per_client dividing 60000"
        )
    if isinstance(p, QuadraticConfig) and p.smoothness < p.strong_convexity:
        raise ConfigError(
            f"problem.smoothness: {p.smoothness} is below problem.strong_convexity = {p.strong_convexity}; "
            "the Hessian spectrum needs mu <= L"
        )
    if not prob.saddle_point and getattr(a, "hypergradient", None) == "direct":
        raise ConfigError(
            "algorithm.hypergradient: 'direct' drops the indirect gradient, which is zero only for minimax problems "
            "(g = -f); "
            f"use 'implicit' for problem {p.name!r}"
        )
    if not alg.accepts(p.name):
        fits = [s.name for s in ALGORITHMS.values() if s.accepts(p.name)]
        raise ConfigError(
            f"algorithm.name: {a.name!r} is {alg.kind} for problem {' or '.join(map(repr, alg.problems or ()))}; "
            f"choose one of {', '.join(fits)} for problem {p.name!r}"
        )
    if isinstance(p, CompositionalConfig) and p.dim_y < p.dim_x:
        raise ConfigError(
            f"problem.dim_y: {p.dim_y} is below problem.dim_x = {p.dim_x}; "
            "the compositional x* is unique only for dim_y >= dim_x"
        )
    if alg.stateful and cfg.federation.placement != "block":
        raise ConfigError(
            f"federation.placement: {a.name!r} keeps every client's inner variable on the rank hosting the client; "
            "use placement = 'block'"
        )
    if getattr(p, "pooled_outer_objective", False) and not alg.pools_outer_objective:
        pooling = " or ".join(repr(s.name) for s in ALGORITHMS.values() if s.pools_outer_objective)
        raise ConfigError(
            f"problem.outer_objective: {p.outer_objective!r} is a loss of the pooled validation set, which only "
            f"FedOut's global hypergradient can pool (one extra round); use algorithm.name = {pooling}, "
            f"or outer_objective = 'balanced' with {a.name!r}"
        )
    if getattr(a, "ihgp_mode", None) == "randomized" and a.neumann_steps < 1:
        raise ConfigError("algorithm.neumann_steps: the randomized FedIHGP draws N' from {0..N-1}, so N must be >= 1")


def validate_world(cfg: RunConfig, world_size: int) -> None:
    """Checks that depend on the MPI world; identical on every rank."""
    if world_size > cfg.problem.n_clients:
        raise ConfigError(
            f"problem.n_clients: {cfg.problem.n_clients} clients cannot fill {world_size} MPI ranks; "
            f"use at most {cfg.problem.n_clients} ranks (mpiexec -n) or more clients"
        )


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value); the value is read as TOML (bare words become strings)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.field=value, e.g. --set algorithm.outer_lr=0.05")
    keypath, raw = text.split("=", 1)
    keys = [k.strip() for k in keypath.split(".")]
    if not all(keys):
        raise ConfigError(f"--set {text!r}: empty field name in {keypath!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return keys, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Return a copy of ``data`` with every ``--set`` override applied. Overrides that name an algorithm
    leave the fields of ``data``'s algorithm that the named one lacks behind (:func:`algorithm_fields`)."""
    data = json.loads(json.dumps(data))
    named = {}
    for text in overrides:
        keys, value = parse_override(text)
        if keys == ["algorithm", "name"]:
            named = {"name": value}
    data = _named_algorithm(data, named)
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {k!r} is a field, not a section")
        node[keys[-1]] = value
    return data


def _named_algorithm(lower: dict, upper_algorithm: Any) -> dict:
    """``lower`` with its [algorithm] table cut to the fields of the algorithm that an upper layer names
    in ``upper_algorithm`` (its [algorithm] table), if it names one (:func:`algorithm_fields`)."""
    table = lower.get("algorithm")
    if not isinstance(upper_algorithm, dict) or "name" not in upper_algorithm or not isinstance(table, dict):
        return lower
    return lower | {"algorithm": algorithm_fields(upper_algorithm["name"], table)}


def _merge(base: dict, top: dict) -> dict:
    """``top`` over ``base``, table by table (``base``'s other algorithm's fields left behind)."""
    out = _named_algorithm(dict(base), top.get("algorithm"))
    for name, value in top.items():
        out[name] = _merge(out[name], value) if isinstance(value, dict) and isinstance(out.get(name), dict) else value
    return out


def read_file(path: str | Path, _seen: tuple = ()) -> dict:
    """The plain data of a TOML (or JSON) config file, with its ``base`` chain resolved.

    A top-level ``base = "other.toml"`` (relative to the file) names a config whose values this
    file overrides, table by table, so a family of configs shares one base and each member states
    only what differs (``configs/mnist/``).
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(
            f"config file {str(p)!r} is a folder; pass the path of a TOML file, such as configs/quadratic.toml"
        )
    if not p.is_file():
        raise ConfigError(
            f"config file {str(p)!r} does not exist; pass the path of a TOML file such as configs/quadratic.toml"
        )
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            "save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"config file {str(p)!r} is not valid {'JSON' if p.suffix == '.json' else 'TOML'}: {exc}"
        ) from None
    if not _seen and data == {}:
        raise ConfigError(
            f"config file {str(p)!r} is empty; a config needs at least the sections [problem] and [algorithm] "
            "(every other field has a default), e.g. a copy of configs/quadratic.toml"
        )
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{p}: base: expected the path of a config file, got {base!r}")
    base_path = (p.parent / base).resolve()
    if base_path in _seen or base_path == p.resolve():
        raise ConfigError(f"{p}: base: {base!r} leads back to itself; remove the cycle")
    return _merge(read_file(base_path, _seen + (p.resolve(),)), data)


def load(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a TOML (or JSON) config (and its ``base`` chain), apply overrides, validate."""
    data = read_file(path) if path is not None else {}
    return from_dict(apply_overrides(data, list(overrides)))


# ----------------------------------------------------------------------------------------------
# Flat views: dotted field names


def flatten_config(data: Mapping[str, Any], prefix: str = "", hashable: bool = True) -> dict[str, Any]:
    """Nested config dict -> ``{"algorithm.outer_lr": 0.2, ..., "seed": 0}`` (dotted names, as in ``--set``).

    ``hashable``: lists become tuples, so that values can be grouped and compared as keys.
    """
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, name + ".", hashable))
        elif hashable and isinstance(value, list):
            flat[name] = tuple(value)
        else:
            flat[name] = value
    return flat


def differing_fields(flat_configs: Sequence[Mapping[str, Any]], ignore: Iterable[str] = ()) -> dict[str, list]:
    """``{dotted field: [value in each config]}`` for the fields of flattened configs whose values are
    not all the same (compared as JSON, sorted by name); a field missing from a config is None there."""
    ignore = frozenset(ignore)
    keys = set().union(*(set(c) for c in flat_configs)) - ignore
    diffs = {}
    for key in sorted(keys):
        values = [c.get(key) for c in flat_configs]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1:
            diffs[key] = values
    return diffs


def _traits(spec_: AlgorithmSpec) -> str:
    out = ["per-client state (placement = block)"] if spec_.stateful else []
    out += ["can pool an outer objective"] if spec_.pools_outer_objective else []
    out += [f"problems: {', '.join(spec_.problems)}"] if spec_.problems is not None else []
    return "; ".join(out)


def reference_markdown() -> str:
    """The config reference as Markdown, generated from the field metadata and the registries (the
    installed plugins included)."""
    list(PROBLEMS.load_all())
    list(ALGORITHMS.load_all())
    lines = [
        "# Configuration reference",
        "",
        "Generated by `fednest-mpi config-doc` from `src/fednest_mpi/config.py`; do not edit by hand.",
        "",
    ]

    def table(cls, title, names=()):
        lines.extend([f"## `{title}`", "", (cls.__doc__ or "").strip(), ""])
        if names:
            lines.extend(["| name | algorithm | traits |", "|---|---|---|"])
            lines.extend(f"| `{n}` | {ALGORITHMS[n].summary} | {_traits(ALGORITHMS[n])} |" for n in names)
            lines.append("")
        lines.extend(["| field | default | allowed | meaning |", "|---|---|---|---|"])
        for f in dataclasses.fields(cls):
            m = f.metadata
            allowed = ", ".join(map(repr, m["choices"] or names)) if m.get("choices") or f.name == "name" else ""
            if m.get("low") is not None:
                allowed = f"{'>' if m.get('low_open') else '>='} {m['low']}"
            if m.get("high") is not None:
                allowed += f", <= {m['high']}"
            default = f.default if f.default is not dataclasses.MISSING else ""
            meaning = m.get("help", "").replace("|", "\\|")
            lines.append(f"| `{f.name}` | `{json.dumps(default)}` | {allowed} | {meaning} |")
        lines.append("")

    lines.append(
        "## top level\n\n| field | default | allowed | meaning |\n|---|---|---|---|\n"
        "| `seed` | `0` | >= 0 | seed of every random stream |\n"
    )
    for name, spec_ in PROBLEMS.items():
        table(spec_.params, f'[problem] name = "{name}"')
    lines.extend(
        [
            "The `[algorithm]` section is one of the tables below, chosen by `name`. A field of another algorithm "
            "is an error naming the field and the algorithm, unless it states that field's default; a config "
            "layer that names an algorithm (a file over its `base`, `--set algorithm.name=...`, a sweep) leaves "
            "the fields of the layers below that the named algorithm lacks behind.",
            "",
        ]
    )
    for cls in dict.fromkeys(s.params for s in ALGORITHMS.values()):
        names = tuple(n for n, s in ALGORITHMS.items() if s.params is cls)
        table(cls, "[algorithm] name = " + " | ".join(f'"{n}"' for n in names), names)
    for name, cls in SECTIONS.items():
        table(cls, f"[{name}]")
    return "\n".join(lines)
