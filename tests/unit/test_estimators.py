"""The estimators of p = [nabla^2_yy g]^-1 nabla_y f (algorithms/estimators.py) on the quadratic problem:
each against the exact p (error against rounds), and their rounds and bytes per outer iteration."""

import numpy as np
import pytest
import torch
from mpi4py import MPI
from shared_data import DATA, need

from fednest_mpi import config
from fednest_mpi.algorithms import ESTIMATORS, build_algorithm, implementation
from fednest_mpi.federation import Federation
from fednest_mpi.problems import build_problem
from fednest_mpi.problems.losstuning import LossTuningProblem
from fednest_mpi.problems.representation import RepresentationProblem
from fednest_mpi.runner import simulate


def _setup(cfg):
    fed = Federation(MPI.COMM_SELF, cfg.problem.n_clients, cfg.federation.reduction)
    prob = build_problem(cfg.problem, cfg.seed, fed.block)
    return prob, fed, build_algorithm(cfg.algorithm, prob, fed, cfg.seed)


def _at_a_point(small_config, estimator, heterogeneity=1.0, **algorithm):
    """(problem, federation, algorithm, x, y, v = mean_i grad_y f_i, exact p = H^-1 v), all 12 clients."""
    cfg = small_config(
        problem={"heterogeneity": heterogeneity},
        algorithm={"clients_per_round": 12, "hypergradient_estimator": estimator, **algorithm},
    )
    prob, fed, alg = _setup(cfg)
    x = torch.linspace(-1.0, 1.0, cfg.problem.dim_x, dtype=torch.float64)
    y = torch.linspace(0.5, -0.5, cfg.problem.dim_y, dtype=torch.float64)
    ids = np.arange(12)
    v = prob.grad_y_outer(ids, x.expand(12, -1), y.expand(12, -1), None).mean(0)
    return prob, fed, alg, x, y, v, torch.linalg.solve(prob.global_hessian, v)


def _estimate(fed, alg, k, x, y):
    """(p, rounds, bytes) of one call of the algorithm's estimator."""
    rounds, nbytes = fed.stats.rounds, fed.stats.bytes
    p = alg.estimator.estimate(k, x, y, alg.sample_clients(2, k))
    return p, fed.stats.rounds - rounds, fed.stats.bytes - nbytes


@pytest.mark.parametrize(
    "algorithm, field",
    [
        ({"name": "lfednest", "hypergradient_estimator": "cg"}, "algorithm.hypergradient_estimator: 'cg'"),
        ({"hypergradient_estimator": "warm_start", "ihgp_mode": "randomized"}, "algorithm.ihgp_mode: 'randomized'"),
        ({"name": "fedmbo", "hypergradient_estimator": "cg", "ihgp_mode": "randomized"}, "algorithm.ihgp_mode"),
    ],
)
def test_estimators_that_do_not_fit_are_refused_in_one_line(small_config, algorithm, field):
    with pytest.raises(config.ConfigError) as info:
        small_config(algorithm=algorithm)
    assert str(info.value).startswith(field) and "\n" not in str(info.value)


def test_the_config_choices_are_the_estimators():
    field = config.FedNestConfig.__dataclass_fields__["hypergradient_estimator"]
    assert tuple(field.metadata["choices"]) == tuple(ESTIMATORS)
    assert field.default == "neumann"


@pytest.mark.parametrize("n_steps", [0, 2, 6, 12])
def test_conjugate_gradient_is_within_its_bound_and_exact_after_d_y_products(small_config, n_steps):
    prob, fed, alg, x, y, v, exact = _at_a_point(small_config, "cg", neumann_steps=n_steps)
    p, rounds, nbytes = _estimate(fed, alg, 1, x, y)
    assert (rounds, nbytes) == (1 + n_steps, 8 * 6 * (1 + n_steps))
    H = prob.global_hessian
    eig = torch.linalg.eigvalsh(H)
    kappa = float(eig.max() / eig.min())

    def h_norm(e):
        return float(e @ H @ e) ** 0.5

    rate = (kappa**0.5 - 1) / (kappa**0.5 + 1)
    assert h_norm(p - exact) <= 2 * rate**n_steps * h_norm(exact) * (1 + 1e-9)
    if n_steps >= 6:  # d_y = 6: Krylov space exhausted
        assert float((p - exact).norm()) < 1e-10 * float(exact.norm())
    elif n_steps > 0:  # not an exact solve in disguise
        assert float((p - exact).norm()) > 1e-6 * float(exact.norm())


def test_conjugate_gradient_stops_at_its_tolerance(small_config):
    prob, fed, alg, x, y, v, exact = _at_a_point(small_config, "cg", neumann_steps=30, cg_tolerance=1e-4)
    p, rounds, _ = _estimate(fed, alg, 1, x, y)
    H = prob.global_hessian
    # the same iteration in the test: the first n with ||v - H p_n|| <= 1e-4 ||v||
    q, r, d, n = torch.zeros_like(v), v.clone(), v.clone(), 0
    while float(r.norm()) > 1e-4 * float(v.norm()):
        alpha = float(r @ r) / float(d @ H @ d)
        q, r_new = q + alpha * d, r - alpha * (H @ d)
        d, r, n = r_new + float(r_new @ r_new) / float(r @ r) * d, r_new, n + 1
    assert 0 < n < 6 and rounds == 1 + n
    torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    assert float((v - H @ p).norm()) <= 1e-4 * float(v.norm())


@pytest.mark.parametrize("n_steps", [0, 3, 10])
def test_local_neumann_converges_to_the_mean_of_local_inverses_in_one_round(small_config, n_steps):
    prob, fed, alg, x, y, v, exact = _at_a_point(small_config, "local_neumann", neumann_steps=n_steps)
    p, rounds, nbytes = _estimate(fed, alg, 1, x, y)
    assert (rounds, nbytes) == (1, 8 * 6)
    ids = np.arange(12)
    b = prob.grad_y_outer(ids, x.expand(12, -1), y.expand(12, -1), None)
    G = prob._data["G"]
    local = torch.linalg.solve(G, b).mean(0)
    eta = alg.cfg.neumann_scale
    mu = min(float(torch.linalg.eigvalsh(G[i]).min()) for i in ids)
    bound = (1 - eta * mu) ** (n_steps + 1) * float(b.norm(dim=1).max()) / mu
    assert float((p - local).norm()) <= bound * (1 + 1e-9)
    # a biased estimate of the global p on heterogeneous clients
    assert float((local - exact).norm()) > 1e-2 * float(exact.norm())


@pytest.mark.parametrize("n_steps", [1, 5])
def test_authors_neumann_is_their_published_1_over_k_local_series_not_an_inverse(small_config, n_steps):
    """The opt-in ``authors_neumann`` (their global_batch FedIHGP, reference notes section 1.4):
    eta [v + sum_{k=1..N} (1/k) mean_i (I - eta G_i)^k v] with the global v and each client's own G_i."""
    prob, fed, alg, x, y, v, exact = _at_a_point(small_config, "authors_neumann", neumann_steps=n_steps)
    p, rounds, _ = _estimate(fed, alg, 1, x, y)
    assert rounds == 2
    G, eta = prob._data["G"], alg.cfg.neumann_scale
    eye = torch.eye(G.shape[1], dtype=G.dtype)
    terms = [torch.linalg.matrix_power(eye - eta * G, k).mean(0) @ v / k for k in range(1, n_steps + 1)]
    torch.testing.assert_close(p, eta * (v + sum(terms)), rtol=1e-12, atol=1e-14)
    correct, _, _ = _estimate(*_at_a_point(small_config, "neumann", neumann_steps=n_steps)[1:3], 1, x, y)
    if n_steps > 1:  # the 1/k weights shrink the series: further from H^-1 v than the correct one
        assert float((p - exact).norm()) > float((correct - exact).norm())


def _local_gradient_descent_fixed_point(prob, b, eta, steps):
    """The fixed point of v -> mean_i [v_i after `steps` steps of v_i <- v_i - eta (G_i v_i - b_i)]."""
    G = prob._data["G"]
    eye = torch.eye(G.shape[1], dtype=G.dtype)
    A = torch.linalg.matrix_power(eye - eta * G, steps)  # (M, d, d)
    c = torch.linalg.solve(G, b[..., None])[..., 0]  # each client's own minimiser
    # v_i(steps) = A_i v + (I - A_i) c_i
    return torch.linalg.solve(eye - A.mean(0), ((eye - A) @ c[..., None])[..., 0].mean(0))


def test_warm_start_is_gradient_descent_on_the_global_quadratic_across_iterations(small_config):
    prob, fed, alg, x, y, v, exact = _at_a_point(small_config, "warm_start", neumann_steps=1)
    eta = alg.cfg.neumann_scale
    mu = float(torch.linalg.eigvalsh(prob.global_hessian).min())
    errors = []
    for k in range(1, 41):
        p, rounds, nbytes = _estimate(fed, alg, k, x, y)
        assert (rounds, nbytes) == (1, 8 * 6)
        errors.append(float((p - exact).norm()))
    for k, err in enumerate(errors, start=1):  # from v = 0: e_k = (I - eta H)^k (-p*)
        assert err <= (1 - eta * mu) ** k * float(exact.norm()) * (1 + 1e-9)
    assert errors[-1] < 1e-3 * errors[0]


@pytest.mark.parametrize("heterogeneity", [0.0, 1.0])
def test_warm_start_with_local_steps_converges_to_the_local_steps_fixed_point(small_config, heterogeneity):
    prob, fed, alg, x, y, v, exact = _at_a_point(small_config, "warm_start", heterogeneity, neumann_steps=4)
    for k in range(1, 81):
        p, _, _ = _estimate(fed, alg, k, x, y)
    ids = np.arange(12)
    b = prob.grad_y_outer(ids, x.expand(12, -1), y.expand(12, -1), None)
    fixed = _local_gradient_descent_fixed_point(prob, b, alg.cfg.neumann_scale, 4)
    torch.testing.assert_close(p, fixed, rtol=1e-9, atol=1e-9)
    drift = float((fixed - exact).norm())
    assert drift < 1e-12 if heterogeneity == 0.0 else drift > 1e-3 * float(exact.norm())


def test_warm_start_state_is_checkpointed_and_restored(small_config):
    cfg = small_config(algorithm={"hypergradient_estimator": "warm_start", "outer_iterations": 3})
    prob, fed, alg = _setup(cfg)
    x, y = prob.initial_point()
    assert alg.checkpoint_state() == {}
    for k in (1, 2):
        x, y, _ = alg.step(k, x, y)
    saved = alg.checkpoint_state()
    assert set(saved) == {"estimator_v"}
    _, _, fresh = _setup(cfg)
    fresh.restore(saved, {})
    a, b = alg.step(3, x, y), fresh.step(3, x, y)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


ROUNDS = {
    "neumann": lambda n: 1 + n,
    "local_neumann": lambda n: 1,
    "cg": lambda n: 1 + n,
    "warm_start": lambda n: 1,
    "authors_neumann": lambda n: 2,
}


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
@pytest.mark.parametrize("name", ["fednest", "fednest_sgd"])
def test_rounds_and_bytes_per_outer_iteration_with_each_estimator(small_config, name, estimator):
    T, N = 2, 3
    cfg = small_config(
        algorithm={
            "name": name,
            "inner_rounds": T,
            "neumann_steps": N,
            "outer_iterations": 3,
            "hypergradient_estimator": estimator,
        }
    )
    dx, dy = cfg.problem.dim_x, cfg.problem.dim_y
    inner = 2 * T if name == "fednest" else T  # FedInn SVRG: q and y; LFedInn: y
    R = ROUNDS[estimator](N)
    assert implementation(name).rounds_per_iteration(cfg.algorithm, **config.ALGORITHMS[name].options) == inner + R + 2
    h = simulate(cfg, MPI.COMM_SELF).history
    assert np.diff(h["comm_rounds"]).tolist() == [inner + R + 2] * 3
    assert np.diff(h["comm_bytes"]).tolist() == [8 * (inner * dy + R * dy + 2 * dx)] * 3


@pytest.mark.parametrize("estimator", ["cg", "warm_start"])
def test_fednest_converges_with_the_new_estimators(small_config, estimator):
    cfg = small_config(
        problem={"n_clients": 20, "heterogeneity": 1.0},
        algorithm={
            "clients_per_round": 20,
            "outer_iterations": 150,
            "inner_local_steps": 20,
            "neumann_steps": 6 if estimator == "cg" else 1,
            "hypergradient_estimator": estimator,
        },
    )
    h = simulate(cfg, MPI.COMM_SELF).history
    assert h["x_error"][-1] < 1e-6 * h["x_error"][0]


def test_minus_scaled_computes_in_a_fresh_output_with_the_same_bits():
    """(I - eta H) r in Hr's memory where the problem promises fresh outputs (and Hr is dense): the same bits as
    in a new tensor; otherwise Hr is left as it was (a problem may keep it); stride-0 rows never in place."""
    from fednest_mpi.algorithms.estimators import minus_scaled

    gen = torch.Generator().manual_seed(7)
    Hr, r = torch.randn(5, 9, generator=gen, dtype=torch.float64), torch.randn(9, generator=gen, dtype=torch.float64)
    expected = Hr.mul(-0.37).add_(r)
    kept = Hr.clone()
    out = minus_scaled(Hr, 0.37, r, fresh=False)
    assert torch.equal(out, expected) and out.data_ptr() != Hr.data_ptr() and torch.equal(Hr, kept)
    out = minus_scaled(Hr, 0.37, r, fresh=True)
    assert torch.equal(out, expected) and out.data_ptr() == Hr.data_ptr()
    shared = kept[0].expand(5, -1)  # one row for every client: not dense
    out = minus_scaled(shared, 0.37, r, fresh=True)
    assert torch.equal(out, kept[0].expand(5, -1).mul(-0.37).add_(r)) and torch.equal(kept[0], shared[0])


def _fresh_and_not(cfg, monkeypatch):
    """The histories of ``cfg`` run without and with FedIHGP computing in the problem's fresh outputs."""
    from fednest_mpi.problems.base import BilevelProblem

    runs = []
    for fresh in (False, True):
        monkeypatch.setattr(BilevelProblem, "fresh_outputs", fresh)
        for cls in (LossTuningProblem, RepresentationProblem):
            monkeypatch.delattr(cls, "fresh_outputs")  # the base class's value, set just above
        runs.append(simulate(cfg, MPI.COMM_SELF).history)
        monkeypatch.undo()
    return runs


@pytest.mark.parametrize("name", ["quadratic", "loss_tuning", "hyper_representation"])
def test_a_run_computing_in_fresh_outputs_has_the_bits_of_one_that_does_not(name, small_config, monkeypatch):
    """FedIHGP's (I - eta H) r in Hr's memory and the hypergradient direction in nabla_x f's (fresh_outputs)
    change no bit of a whole run."""
    if name == "quadratic":
        cfg = small_config(algorithm={"outer_iterations": 4})
    else:
        need(DATA / "mnist")
        problem = {"name": name, "data_dir": str(DATA), "n_clients": 20, "partition": "shards"}
        problem.update({"hidden1": 7} if name == "loss_tuning" else {"hidden": 16})
        cfg = config.from_dict(
            {
                "problem": problem,
                "algorithm": {"clients_per_round": 5, "outer_iterations": 3},
                "run": {"dtype": "float64"},
            }
        )
    plain, fresh = _fresh_and_not(cfg, monkeypatch)
    assert plain.keys() == fresh.keys()
    for column in plain:
        if not column.endswith("_time"):
            assert np.array_equal(np.asarray(plain[column]), np.asarray(fresh[column]), equal_nan=True), column
