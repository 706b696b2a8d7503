"""The parameter classes of the built-in algorithms (the ``[algorithm]`` section, chosen by ``name``).

One frozen class per algorithm class; the fields shared by several classes are made by one function each,
so their meaning is written once (the ``Params`` of algorithms that live next to their classes, e.g.
:class:`~fednest_mpi.algorithms.fedmbo.FedMBO`'s, take them from here too). A ``check`` method holds the
checks that involve several fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from fednest_mpi.config.fields import spec
from fednest_mpi.errors import ConfigError


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


def _ihgp_resample_clients():
    return spec(True, "draw a fresh client set S_n for every FedIHGP round (paper) instead of reusing FedOut's set")


def _hypergradient_estimator():
    return spec(
        "neumann",
        "FedOut's estimate of [nabla^2_yy g]^-1 nabla_y f (algorithms/estimators.py): neumann (FedIHGP, Alg. 3: "
        "1 + N rounds), local_neumann (each client's own series, Alg. 5, averaged: 1 round), cg (conjugate "
        "gradient, one aggregated Hessian-vector product per iteration: 1 + at most N rounds), warm_start (v kept "
        "across iterations, N local steps on 1/2 v^T H v - v^T grad_y f: 1 round), authors_neumann (NOT an "
        "inverse: the authors' published FedIHGP, eta [v + sum_{k=1..N} (1/k) mean_i (I - eta H_i)^k v], its 1/k "
        "weights and local Hessian powers kept to show how much of their curves they explain: 2 rounds)",
        choices=("neumann", "local_neumann", "cg", "warm_start", "authors_neumann"),
    )


def _cg_tolerance():
    return spec(
        0.0, "hypergradient_estimator = cg: stop once ||r|| <= cg_tolerance ||r_0|| (0: always N iterations)", low=0.0
    )


def _server_optimizer():
    return spec(
        "none",
        "server optimiser of x (FedOpt, Reddi et al. 2021, Alg. 2) on the pseudo-gradient Delta = x_k - x_{k+1} of "
        "the algorithm's own update: none (x_{k+1} as the algorithm computes it), sgd (heavy ball: m <- beta1 m + "
        "Delta, x_k - server_lr m), adam, yogi, adagrad (x_k - server_lr m / (sqrt(v) + server_tau)); no round added",
        choices=("none", "sgd", "adam", "yogi", "adagrad"),
    )


def _server_lr():
    return spec(1.0, "server_optimizer's step size eta", low=0.0, low_open=True)


def _server_beta1():
    return spec(0.9, "server_optimizer's momentum beta1 (sgd, adam, yogi)", low=0.0, high=0.9999)


def _server_beta2():
    return spec(0.99, "server_optimizer's second-moment decay beta2 (adam, yogi)", low=0.0, high=0.9999)


def _server_tau():
    return spec(
        1e-3, "server_optimizer's adaptivity tau (adam, yogi, adagrad; v starts at tau^2)", low=0.0, low_open=True
    )


def _check_randomized_neumann(params) -> None:
    """The randomized FedIHGP (eq. (10b)) needs N >= 1; it is a Neumann series' truncation (CG and the
    warm start have none)."""
    if params.ihgp_mode == "randomized" and params.neumann_steps < 1:
        raise ConfigError("algorithm.neumann_steps: the randomized FedIHGP draws N' from {0..N-1}, so N must be >= 1")
    estimator = getattr(params, "hypergradient_estimator", "neumann")
    if params.ihgp_mode == "randomized" and estimator in ("cg", "warm_start", "authors_neumann"):
        raise ConfigError(
            f"algorithm.ihgp_mode: 'randomized' truncates a Neumann series, which hypergradient_estimator = "
            f"{estimator!r} does not use; set ihgp_mode = 'truncated' or hypergradient_estimator = 'neumann'"
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
    ihgp_resample_clients: bool = _ihgp_resample_clients()
    hypergradient: str = _hypergradient()
    hypergradient_estimator: str = _hypergradient_estimator()
    cg_tolerance: float = _cg_tolerance()
    server_optimizer: str = _server_optimizer()
    server_lr: float = _server_lr()
    server_beta1: float = _server_beta1()
    server_beta2: float = _server_beta2()
    server_tau: float = _server_tau()

    check = _check_randomized_neumann


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
    server_optimizer: str = _server_optimizer()
    server_lr: float = _server_lr()
    server_beta1: float = _server_beta1()
    server_beta2: float = _server_beta2()
    server_tau: float = _server_tau()

    check = _check_randomized_neumann


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
    server_optimizer: str = _server_optimizer()
    server_lr: float = _server_lr()
    server_beta1: float = _server_beta1()
    server_beta2: float = _server_beta2()
    server_tau: float = _server_tau()


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
