"""The checks that involve several sections (a problem and the algorithm run on it, the federation, the MPI
world). Checks within one section are its parameter class's ``check`` method. Pure functions of the config,
so every rank reaches the same verdict before any collective."""

from __future__ import annotations

from fednest_mpi.config.registries import ALGORITHMS, PROBLEMS, AlgorithmSpec, ProblemSpec
from fednest_mpi.config.run_params import RunConfig
from fednest_mpi.errors import ConfigError


def validate_relations(cfg: RunConfig) -> None:
    """The checks that involve several sections, after each section's own ``check()`` (a parameter class
    may define one: the built-ins' and the plugins' alike)."""
    p, a = cfg.problem, cfg.algorithm
    alg, prob = ALGORITHMS[a.name], PROBLEMS[p.name]
    _check_sizes(cfg, alg)
    for params in (p, a):
        check = getattr(params, "check", None)  # the checks among one section's own fields
        if check is not None:
            check()
    _check_problem_fit(cfg, alg, prob)
    _check_algorithm_abilities(cfg, alg)


def _check_sizes(cfg: RunConfig, alg: AlgorithmSpec) -> None:
    """Clients per round within the clients, and the sums of a round within the exact reduction's reach."""
    p, a = cfg.problem, cfg.algorithm
    if a.clients_per_round > p.n_clients:
        raise ConfigError(
            f"algorithm.clients_per_round: {a.clients_per_round} is more than problem.n_clients = {p.n_clients}; "
            "lower it or add clients"
        )
    summands = p.n_clients if alg.stateful else a.clients_per_round  # FedBiO also sums all M clients' own y
    if cfg.federation.reduction == "exact" and summands > 1 << 20:  # reading a config stays free of torch below
        from fednest_mpi.exactsum import MAX_SUMMANDS

        if summands > MAX_SUMMANDS:
            raise ConfigError(
                f"federation.reduction: 'exact' adds at most {MAX_SUMMANDS} rows exactly, this run sums {summands}; "
                "use reduction = 'sum' (invariant only to rounding) or fewer clients per round"
            )


def _check_problem_fit(cfg: RunConfig, alg: AlgorithmSpec, prob: ProblemSpec) -> None:
    """The algorithm and its hypergradient suit the problem: ``direct`` only for minimax problems, an algorithm
    made for certain problems only with them, another estimator than Neumann only with FedOut's global one."""
    p, a = cfg.problem, cfg.algorithm
    if not prob.saddle_point and getattr(a, "hypergradient", None) == "direct":
        raise ConfigError(
            "algorithm.hypergradient: 'direct' drops the indirect gradient, which is zero only for minimax problems "
            "(g = -f); "
            f"use 'implicit' for problem {p.name!r}"
        )
    if not alg.accepts(p.name):
        fits = [s.name for s in ALGORITHMS.with_builtins() if s.accepts(p.name)]
        raise ConfigError(
            f"algorithm.name: {a.name!r} is {alg.kind} for problem {' or '.join(map(repr, alg.problems or ()))}; "
            f"choose one of {', '.join(fits)} for problem {p.name!r}"
        )
    estimator = getattr(a, "hypergradient_estimator", "neumann")
    if estimator != "neumann" and alg.options.get("global_outer") is False:
        raise ConfigError(
            f"algorithm.hypergradient_estimator: {estimator!r} estimates FedOut's global [nabla^2_yy g]^-1 nabla_y f, "
            f"but {a.name!r} uses each client's own Neumann series (LFedOut, Alg. 5); use algorithm.name = 'fednest' "
            "or 'fednest_sgd', or hypergradient_estimator = 'neumann'"
        )


def _check_algorithm_abilities(cfg: RunConfig, alg: AlgorithmSpec) -> None:
    """What the config asks of the algorithm it can do: clients' inner variables kept by block placement,
    local work that varies, a pooled outer objective."""
    p, a = cfg.problem, cfg.algorithm
    if alg.stateful and cfg.federation.placement != "block":
        raise ConfigError(
            f"federation.placement: {a.name!r} keeps every client's inner variable on the rank hosting the client; "
            "use placement = 'block'"
        )
    if cfg.heterogeneity.local_work != "full" and not alg.varies_local_work:
        varying = ", ".join(repr(s.name) for s in ALGORITHMS.values() if s.varies_local_work)
        raise ConfigError(
            f"heterogeneity.local_work: {a.name!r} runs the same local steps on every client; use local_work = "
            f"'full' with it, or one of {varying}"
        )
    if getattr(p, "pooled_outer_objective", False) and not alg.pools_outer_objective:
        pooling = " or ".join(repr(s.name) for s in ALGORITHMS.with_builtins() if s.pools_outer_objective)
        raise ConfigError(
            f"problem.outer_objective: {p.outer_objective!r} is a loss of the pooled validation set, which only "
            f"FedOut's global hypergradient can pool (one extra round); use algorithm.name = {pooling}, "
            f"or outer_objective = 'balanced' with {a.name!r}"
        )


def validate_world(cfg: RunConfig, world_size: int) -> None:
    """Checks that depend on the MPI world; identical on every rank."""
    if world_size > cfg.problem.n_clients:
        raise ConfigError(
            f"problem.n_clients: {cfg.problem.n_clients} clients cannot fill {world_size} MPI ranks; "
            f"use at most {cfg.problem.n_clients} ranks (mpiexec -n) or more clients"
        )
