"""Hyper-representation oracles against autograd, batching, and a short learning run on real MNIST."""

import numpy as np
import pytest
import torch
from mpi4py import MPI
from shared_data import DATA, assert_row_independent_of_block, requires, small_mnist_config

from fednest_mpi import config, rng
from fednest_mpi.problems import build_problem
from fednest_mpi.problems.base import Sample
from fednest_mpi.problems.hyperrep import N_PIXELS

pytestmark = requires("mnist")


def _cfg(**problem):
    return small_mnist_config("hyper_representation", **{"hidden": 6, **problem})


@pytest.fixture(scope="module")
def problem():
    cfg = _cfg()
    return build_problem(cfg.problem, 0, range(4, 12), dtype=torch.float64), cfg


def _losses(prob, cfg, client, x, y, sample, batch_size, split):
    """f_i or g_i of one client written with torch.nn.functional, for autograd."""
    s = prob._forward(split, np.array([client]), x[None], y[None], sample, batch_size)
    h = cfg.problem.hidden
    W1, b1 = x[: h * N_PIXELS].reshape(h, N_PIXELS), x[h * N_PIXELS :]
    W2, b2 = y[: 10 * h].reshape(10, h), y[10 * h :]
    logits = torch.relu(s["A"][0] @ W1.T + b1) @ W2.T + b2
    ce = torch.nn.functional.cross_entropy(logits, s["E"][0].argmax(1), reduction="none")
    return (ce * s["w"][0]).sum()


def test_oracles_match_autograd(problem):
    prob, cfg = problem
    ids = np.array([4, 7, 11])
    gen = torch.Generator().manual_seed(0)
    X = 0.1 * torch.randn(3, prob.dim_x, dtype=torch.float64, generator=gen)
    Y = 0.3 * torch.randn(3, prob.dim_y, dtype=torch.float64, generator=gen)
    V = torch.randn(3, prob.dim_y, dtype=torch.float64, generator=gen)
    lam = cfg.problem.inner_regularization
    for sample in [None, Sample(rng.key(5), 3)]:
        gy_in = prob.grad_y_inner(ids, X, Y, sample)
        gy_out = prob.grad_y_outer(ids, X, Y, sample)
        gx_out = prob.grad_x_outer(ids, X, Y, sample)
        hvp = prob.hvp_yy_inner(ids, X, Y, V, sample)
        jvp = prob.jvp_xy_inner(ids, X, Y, V, sample)
        for b, c in enumerate(ids):
            x, y = X[b].clone().requires_grad_(), Y[b].clone().requires_grad_()
            g = _losses(prob, cfg, c, x, y, sample, cfg.problem.batch_size, prob.inner) + 0.5 * lam * y @ y
            (dy,) = torch.autograd.grad(g, y, create_graph=True)
            torch.testing.assert_close(gy_in[b], dy.detach())
            hv = torch.autograd.grad(dy @ V[b], (y, x))
            # second-order oracles use the whole split (hypergradient_batch_size = 0)
            g_full = _losses(prob, cfg, c, x, y, None, 0, prob.inner) + 0.5 * lam * y @ y
            (dy_full,) = torch.autograd.grad(g_full, y, create_graph=True)
            hy, hx = torch.autograd.grad(dy_full @ V[b], (y, x))
            torch.testing.assert_close(hvp[b], hy)
            torch.testing.assert_close(jvp[b], hx)
            f = _losses(prob, cfg, c, x, y, None, 0, prob.outer)
            fx, fy = torch.autograd.grad(f, (x, y))
            torch.testing.assert_close(gx_out[b], fx)
            torch.testing.assert_close(gy_out[b], fy)
            del hv


@pytest.mark.parametrize("shared", [True, False])
def test_factored_hypergradient_rows_are_the_oracles_difference_and_sum_by_groups(problem, shared):
    """hypergradient_rows (the summation groups' path of FedOut): its rows are grad_x_outer - jvp_xy_inner to
    rounding, a group's sum is one product of its factors equal to the rows' weighted sum, a client's factors
    have the same bits alone or in a block, and the oracles are counted."""
    from fednest_mpi.problems.base import shared_rows

    prob = build_problem(_cfg(hidden=16, hypergradient_batch_size=2).problem, 0, range(4, 12), dtype=torch.float64)
    ids = np.array([4, 5, 7, 11])
    gen = torch.Generator().manual_seed(1)
    if shared:
        X, Y, V = (
            shared_rows(0.2 * torch.randn(d, dtype=torch.float64, generator=gen), 4)
            for d in (prob.dim_x, prob.dim_y, prob.dim_y)
        )
    else:
        X, Y, V = (
            0.2 * torch.randn(4, d, dtype=torch.float64, generator=gen) for d in (prob.dim_x, prob.dim_y, prob.dim_y)
        )
    s_out, s_jvp = Sample(rng.key(3), 0), Sample(rng.key(4), 2)
    before = dict(prob.oracle_counts)
    rows = prob.hypergradient_rows(ids, X, Y, V, s_out, s_jvp)
    assert prob.oracle_counts["grad_x_outer"] - before.get("grad_x_outer", 0) == 4
    assert prob.oracle_counts["jvp_xy_inner"] - before.get("jvp_xy_inner", 0) == 4
    plain = prob.grad_x_outer(ids, X, Y, s_out) - prob.jvp_xy_inner(ids, X, Y, V, s_jvp)
    torch.testing.assert_close(rows.dense(), plain, rtol=1e-12, atol=1e-12)
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    out = torch.empty(prob.dim_x, dtype=torch.float64)
    rows.group_sum(1, 3, w[1:3], out)
    torch.testing.assert_close(out, w[1:3] @ plain[1:3], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rows.weighted_sum(w), w @ plain, rtol=1e-12, atol=1e-12)
    alone = prob.hypergradient_rows(ids[2:3], X[2:3], Y[2:3], V[2:3], s_out, s_jvp)  # computed as two copies
    assert torch.equal(alone.G, rows.G[2:3]) and torch.equal(alone.inputs, rows.inputs[2:3])
    assert torch.equal(alone.dense(), rows.dense(2, 3))
    from fednest_mpi.recorder import row_norms  # the per-client series from the factors: the dense rows' norms

    torch.testing.assert_close(row_norms(rows), row_norms(rows.dense()), rtol=1e-10, atol=1e-12)
    assert torch.equal(row_norms(alone), row_norms(rows)[2:3])
    narrow = problem[0]  # 6 hidden units, whole splits: the factors are not the smaller, so dense rows
    Xn, Yn, Vn = (r[:, :d].contiguous() for r, d in ((X, narrow.dim_x), (Y, narrow.dim_y), (V, narrow.dim_y)))
    got = narrow.hypergradient_rows(ids, Xn, Yn, Vn, s_out, s_jvp)
    assert isinstance(got, torch.Tensor)
    plain = narrow.grad_x_outer(ids, Xn, Yn, s_out) - narrow.jvp_xy_inner(ids, Xn, Yn, Vn, s_jvp)
    torch.testing.assert_close(got, plain, rtol=1e-12, atol=1e-12)


def test_a_subclass_with_its_own_oracle_gets_no_factored_rows(problem):
    prob, _ = problem

    class Own(type(prob)):
        def _grad_x_outer(self, clients, x, y, sample):
            return super()._grad_x_outer(clients, x, y, sample)

    own = Own.__new__(Own)
    own.__dict__.update(prob.__dict__)
    X = torch.zeros(2, prob.dim_x, dtype=torch.float64)
    Y = torch.zeros(2, prob.dim_y, dtype=torch.float64)
    assert own.hypergradient_rows(np.array([4, 5]), X, Y, Y, Sample(rng.key(3), 0), Sample(rng.key(4), 2)) is None


def test_a_client_row_does_not_depend_on_its_batch(problem):
    assert_row_independent_of_block(problem[0], Sample(rng.key(9), 2))


def test_frozen_x_feature_cache_gives_the_same_oracles(problem):
    prob, _ = problem
    x, y = prob.initial_point()
    ids = np.array([3, 5, 6])
    X, Y = x.expand(3, -1), y.expand(3, -1)
    samples = [Sample(rng.key(4), 0), Sample(rng.key(4), 7), None]
    plain = [prob.grad_y_inner(ids, X, Y, s) for s in samples]
    with prob.outer_fixed(ids, x):
        assert prob._cached_features(prob.inner, ids, X) is not None
        cached = [prob.grad_y_inner(ids, X, Y, s) for s in samples]
        other_x = (x + 1).expand(3, -1)  # a different x must not hit the cache
        assert prob._cached_features(prob.inner, ids, other_x) is None
    for a, b in zip(plain, cached):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_minibatches_cover_each_epoch_once(problem):
    prob, cfg = problem
    rows, clients = np.array([0, 1]), np.array([4, 5])
    count = prob.inner.count[rows]
    steps = -(-count // cfg.problem.batch_size)
    for r in range(2):
        seen = []
        for step in range(steps[r]):
            cols, w = prob.inner.batch(rows, clients, Sample(rng.key(1), step), cfg.problem.batch_size)
            seen.extend(prob.inner.positions(rows, cols)[r][w[r] > 0].tolist())
        assert sorted(seen) == sorted(prob.inner.index[rows[r], : count[r]].tolist())


def test_shards_give_mostly_two_labels_per_client(problem):
    prob, _ = problem
    labels = [
        np.unique(prob.targets[torch.as_tensor(prob.inner.index[r, : prob.inner.count[r]])].numpy()) for r in range(8)
    ]
    assert np.mean([len(lab) <= 2 for lab in labels]) >= 0.75


@pytest.mark.slow
def test_fednest_learns_mnist_representation():
    from fednest_mpi.runner import simulate

    cfg = config.from_dict(
        {
            "problem": {"name": "hyper_representation", "data_dir": str(DATA), "partition": "iid", "val_fraction": 0.5},
            "algorithm": {"outer_iterations": 8, "inner_local_steps": 25, "neumann_steps": 5},
            "run": {"dtype": "float32"},
        }
    )
    acc = simulate(cfg, MPI.COMM_SELF).history["test_accuracy"]
    assert acc[-1] > 60.0 and acc[-1] > acc[0] + 40.0


def test_factored_head_rows_equal_the_y_side_oracles_and_sum_by_groups():
    """gradient_rows and hvp_rows (the summation groups' y side: the head's logit terms against the features,
    lambda y or lambda v shared): the oracles' rows to rounding, a group's sum, the per-client norms, a client
    alone with the bits it has in a block, counted; None at a y that is not shared and where the factors are not
    the smaller (a head narrower than a client's samples)."""
    from fednest_mpi.problems.base import shared_rows
    from fednest_mpi.recorder import row_norms

    tiny = dict(n_clients=10000, batch_size=3, hypergradient_batch_size=0)  # clients of about 6 images
    prob = build_problem(_cfg(hidden=64, **tiny).problem, 0, range(4, 12), dtype=torch.float64)
    ids = np.array([4, 5, 7, 11])
    gen = torch.Generator().manual_seed(2)
    x, y, v = (0.2 * torch.randn(d, dtype=torch.float64, generator=gen) for d in (prob.dim_x, prob.dim_y, prob.dim_y))
    X, Y, V = shared_rows(x, 4), shared_rows(y, 4), shared_rows(v, 4)
    s = Sample(rng.key(5), 1)
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    cases = [
        ("grad_y_inner", prob.gradient_rows("grad_y_inner", ids, X, Y, s), lambda: prob.grad_y_inner(ids, X, Y, s)),
        (
            "grad_y_inner",
            prob.gradient_rows("grad_y_inner", ids, X, Y, None),
            lambda: prob.grad_y_inner(ids, X, Y, None),
        ),
        ("grad_y_outer", prob.gradient_rows("grad_y_outer", ids, X, Y, s), lambda: prob.grad_y_outer(ids, X, Y, s)),
        ("hvp_yy_inner", prob.hvp_rows(ids, X, Y, V, s), lambda: prob.hvp_yy_inner(ids, X, Y, V, s)),
    ]
    for name, rows, oracle in cases:
        before = prob.oracle_counts[name]
        plain = oracle()
        assert prob.oracle_counts[name] - before == 4
        torch.testing.assert_close(rows.dense(), plain, rtol=1e-12, atol=1e-12)
        out = torch.empty(prob.dim_y, dtype=torch.float64)
        rows.group_sum(1, 4, w[1:4], out)
        torch.testing.assert_close(out, w[1:4] @ plain[1:4], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(row_norms(rows), row_norms(plain), rtol=1e-10, atol=1e-12)
    alone = prob.hvp_rows(ids[2:3], X[:1], Y[:1], V[:1], s)  # computed as two copies
    assert torch.equal(alone.dense(), cases[3][1].dense(2, 3))
    assert prob.gradient_rows("grad_y_inner", ids, X, Y.clone(), s) is None
    narrow = build_problem(_cfg(hidden=2, **tiny).problem, 0, range(4, 12), dtype=torch.float64)  # 32 numbers a row
    Xn, Yn = shared_rows(x[: narrow.dim_x].clone(), 4), shared_rows(y[: narrow.dim_y].clone(), 4)
    assert narrow.gradient_rows("grad_y_inner", ids, Xn, Yn, None) is None
