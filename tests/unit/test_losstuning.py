"""Loss-function tuning on long-tail MNIST: data, batched oracles against an unbatched autograd
reference, the untuned baseline, and the outer weights' unbiasedness."""

import math

import numpy as np
import pytest
import torch
from shared_data import DATA, assert_row_independent_of_block, requires, small_mnist_config

from fednest_mpi import rng
from fednest_mpi.data import load_mnist
from fednest_mpi.problems import build_problem
from fednest_mpi.problems.base import Sample

pytestmark = requires("mnist")


def _cfg(**problem):
    return small_mnist_config("loss_tuning", **{"hidden1": 7, "hidden2": 5, **problem})


@pytest.fixture(scope="module")
def problem():
    cfg = _cfg()
    return build_problem(cfg.problem, 0, range(4, 12), dtype=torch.float64), cfg


def _mlp(y, a, widths):
    """Unbatched reference network written with F.linear."""
    at, h = 0, a
    for j, (inp, out) in enumerate(zip(widths[:-1], widths[1:])):
        W = y[at : at + out * inp].reshape(out, inp)
        at += out * inp
        h = torch.nn.functional.linear(h, W, y[at : at + out])
        at += out
        if j < len(widths) - 2:
            h = torch.relu(h)
    return h


def _client_batch(prob, split, client, sample, batch_size):
    rows = np.array([client - prob._first])
    cols, w = split.batch(rows, np.array([client]), sample, batch_size)
    keep = w[0] > 0
    pos = torch.as_tensor(split.positions(rows, cols)[0][keep])
    return prob.inputs[pos], prob.targets[pos], torch.as_tensor(w[0][keep])


def _g(prob, cfg, client, x, y, sample, batch_size):
    a, t, w = _client_batch(prob, prob.inner, client, sample, batch_size)
    z = _mlp(y, a, prob.widths) * (2 * torch.sigmoid(x[:10])) + x[10:]
    ce = torch.nn.functional.cross_entropy(z, t, reduction="none")
    return (w * ce).sum() + 0.5 * cfg.problem.inner_regularization * y @ y


def _f(prob, client, y):
    a, t, w = _client_batch(prob, prob.outer, client, None, 0)
    ce = torch.nn.functional.cross_entropy(_mlp(y, a, prob.widths), t, reduction="none")
    return (w * prob.class_weights[t] * ce).sum()


def test_long_tail_class_sizes_follow_the_exponential_profile(problem):
    prob, cfg = problem
    labels = load_mnist(DATA / "mnist").train_y.numpy()
    available = np.bincount(labels, minlength=10)
    mu = 100.0 ** (-1 / 9)
    expected = [min(math.ceil(6000 * mu**c), available[c]) for c in range(10)]
    assert prob.class_sizes.tolist() == expected
    assert 95 < prob.class_sizes[0] / prob.class_sizes[9] <= 100


def test_outer_weights_make_the_long_tail_mean_a_balanced_mean(problem):
    prob, _ = problem
    # sum_c n_c omega_c / n = 1 and every class carries the same total weight n_c omega_c
    mass = torch.as_tensor(prob.class_sizes, dtype=torch.float64) * prob.class_weights
    torch.testing.assert_close(mass / mass.sum(), torch.full((10,), 0.1, dtype=torch.float64))
    torch.testing.assert_close(mass.sum() / prob.class_sizes.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_batched_oracles_match_unbatched_autograd(problem):
    prob, cfg = problem
    gen = torch.Generator().manual_seed(1)
    clients = np.array([5, 9, 4])
    X = 0.3 * torch.randn(3, prob.dim_x, generator=gen, dtype=torch.float64)
    Y = prob.initial_point()[1] + 0.05 * torch.randn(3, prob.dim_y, generator=gen, dtype=torch.float64)
    V = torch.randn(3, prob.dim_y, generator=gen, dtype=torch.float64)
    s = Sample(rng.key(7), 3)
    gy_in = prob.grad_y_inner(clients, X, Y, s)
    gy_out = prob.grad_y_outer(clients, X, Y, s)
    hvp = prob.hvp_yy_inner(clients, X, Y, V, s)
    jvp = prob.jvp_xy_inner(clients, X, Y, V, s)
    assert torch.count_nonzero(prob.grad_x_outer(clients, X, Y, s)) == 0  # f does not depend on x
    for b, c in enumerate(clients):
        x, y = X[b].clone().requires_grad_(), Y[b].clone().requires_grad_()
        (dy,) = torch.autograd.grad(_g(prob, cfg, c, x, y, s, cfg.problem.batch_size), y)
        torch.testing.assert_close(gy_in[b], dy)
        # second-order products use the whole split (hypergradient_batch_size = 0)
        _, hy = torch.autograd.functional.vhp(lambda yy: _g(prob, cfg, c, X[b], yy, None, 0), Y[b], V[b])
        torch.testing.assert_close(hvp[b], hy)
        jx = torch.autograd.functional.jacobian(
            lambda xx: torch.autograd.grad(_g(prob, cfg, c, xx, y, None, 0), y, create_graph=True)[0] @ V[b], X[b]
        )
        torch.testing.assert_close(jvp[b], jx)
        (fy,) = torch.autograd.grad(_f(prob, c, y), y)
        torch.testing.assert_close(gy_out[b], fy)


def test_a_client_row_does_not_depend_on_its_batch(problem):
    assert_row_independent_of_block(problem[0], Sample(rng.key(2), 1))


def test_untuned_baseline_is_plain_cross_entropy_with_frozen_x():
    cfg = _cfg(tune_loss=False)
    prob = build_problem(cfg.problem, 0, range(0, 3), dtype=torch.float64)
    x, y = prob.initial_point()
    assert torch.count_nonzero(x) == 0
    X = torch.ones(2, prob.dim_x, dtype=torch.float64)  # ignored when the loss is not tuned
    ids = np.array([0, 2])
    v = torch.randn(2, prob.dim_y, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.count_nonzero(prob.jvp_xy_inner(ids, X, y.expand(2, -1), v, None)) == 0
    tuned = build_problem(_cfg().problem, 0, range(0, 3), dtype=torch.float64)
    # at x = 0 the VS-loss is plain cross-entropy: tuned and untuned inner gradients agree
    torch.testing.assert_close(
        prob.grad_y_inner(ids, X, y.expand(2, -1), None),
        tuned.grad_y_inner(ids, torch.zeros_like(X), y.expand(2, -1), None),
    )


def test_non_iid_clients_see_few_classes_and_keep_the_rarest_class(problem):
    prob, _ = problem
    labels = [
        np.unique(prob.targets[torch.as_tensor(prob.inner.index[r, : prob.inner.count[r]])].numpy()) for r in range(8)
    ]
    assert np.mean([len(lab) <= 3 for lab in labels]) >= 0.75
    cfg = _cfg(n_clients=100)
    everyone = build_problem(cfg.problem, 0, range(100), dtype=torch.float64)
    assert int((everyone.targets == 9).sum()) == everyone.class_sizes[9]  # no sample dropped by the shards


@pytest.mark.parametrize("hidden", [(0, 0), (0, 6), (6, 0)])
def test_zero_width_drops_the_layer(hidden):
    """H1 = H2 = 0 is multinomial logistic regression z = W a + b; one 0 leaves one hidden layer."""
    cfg = _cfg(hidden1=hidden[0], hidden2=hidden[1], tune_loss=False, inner_regularization=0.0)
    prob = build_problem(cfg.problem, 0, range(0, 2), dtype=torch.float64)
    kept = [h for h in hidden if h > 0]
    assert prob.widths == (784, *kept, 10)
    assert prob.dim_y == sum(o * i + o for i, o in zip(prob.widths[:-1], prob.widths[1:]))
    if kept:
        return
    y = prob.initial_point()[1] + 0.01 * torch.randn(
        prob.dim_y, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    W, b = y[:7840].reshape(10, 784), y[7840:]
    a, t, w = _client_batch(prob, prob.inner, 1, None, 0)
    p = torch.softmax(a @ W.T + b, dim=1)
    p[torch.arange(len(t)), t] -= 1.0  # d CE / d z = softmax - onehot
    closed = torch.cat([((w[:, None] * p).T @ a).reshape(-1), (w[:, None] * p).sum(0)])
    torch.testing.assert_close(
        prob.grad_y_inner(np.array([1]), torch.zeros(1, prob.dim_x, dtype=torch.float64), y[None], None)[0], closed
    )


@pytest.mark.parametrize("hidden", [(7, 5), (6, 0), (0, 0)])
def test_closed_form_oracles_at_the_shared_y_match_unbatched_autograd(hidden):
    # y and v shared by the block (Tensor.expand: FedInn's anchor, FedIHGP, FedOut) take the closed
    # form of problems/mlp.py (R-operator second order); x per client
    cfg = _cfg(hidden1=hidden[0], hidden2=hidden[1], hypergradient_batch_size=6)
    prob = build_problem(cfg.problem, 0, range(4, 12), dtype=torch.float64)
    gen = torch.Generator().manual_seed(4)
    clients = np.array([5, 9, 4, 11])
    X = 0.3 * torch.randn(4, prob.dim_x, generator=gen, dtype=torch.float64)
    y = prob.initial_point()[1] + 0.05 * torch.randn(prob.dim_y, generator=gen, dtype=torch.float64)
    v = torch.randn(prob.dim_y, generator=gen, dtype=torch.float64)
    Y, V = y.expand(4, -1), v.expand(4, -1)
    s = Sample(rng.key(7), 2)
    got = {
        "gy_in": prob.grad_y_inner(clients, X, Y, s),
        "gy_out": prob.grad_y_outer(clients, X, Y, s),
        "hvp": prob.hvp_yy_inner(clients, X, Y, V, s),
        "jvp": prob.jvp_xy_inner(clients, X, Y, V, s),
    }
    for b, c in enumerate(clients):
        x, yy = X[b].clone().requires_grad_(), y.clone().requires_grad_()
        (dy,) = torch.autograd.grad(_g(prob, cfg, c, x, yy, s, cfg.problem.batch_size), yy)
        torch.testing.assert_close(got["gy_in"][b], dy, rtol=1e-10, atol=1e-12)
        _, hy = torch.autograd.functional.vhp(lambda w: _g(prob, cfg, c, X[b], w, s, 6), y, v)
        torch.testing.assert_close(got["hvp"][b], hy, rtol=1e-10, atol=1e-12)
        jx = torch.autograd.functional.jacobian(
            lambda xx: torch.autograd.grad(_g(prob, cfg, c, xx, yy, s, 6), yy, create_graph=True)[0] @ v, X[b]
        )
        torch.testing.assert_close(got["jvp"][b], jx, rtol=1e-10, atol=1e-12)
        a, t, w = _client_batch(prob, prob.outer, c, s, 6)
        fy = torch.autograd.grad(
            (
                w
                * prob.class_weights[t]
                * torch.nn.functional.cross_entropy(_mlp(yy, a, prob.widths), t, reduction="none")
            ).sum(),
            yy,
        )[0]
        torch.testing.assert_close(got["gy_out"][b], fy, rtol=1e-10, atol=1e-12)


def _shared_point(seed: int, **problem):
    """A float64 loss-tuning problem hosting clients 4..11, four of them, and x, y (near the start) and r drawn from
    ``seed``, also as shared (4, d) rows, the way the algorithms pass the global iterates."""
    from fednest_mpi.problems.base import shared_rows

    prob = build_problem(_cfg(**problem).problem, 0, range(4, 12), dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    x = 0.3 * torch.randn(prob.dim_x, generator=gen, dtype=torch.float64)
    y = prob.initial_point()[1] + 0.05 * torch.randn(prob.dim_y, generator=gen, dtype=torch.float64)
    r = torch.randn(prob.dim_y, generator=gen, dtype=torch.float64)
    return prob, np.array([5, 9, 4, 11]), (x, y, r), tuple(shared_rows(a, 4) for a in (x, y, r))


@pytest.mark.parametrize("hidden", [(7, 5), (0, 0)])
def test_factored_hessian_vector_rows_equal_the_oracle_and_sum_by_groups(hidden):
    """hvp_rows (FedIHGP's path under summation groups): its rows are hvp_yy_inner's to rounding, also after
    FedIHGP's r - eta Hr (plus_scaled); a group's sum is its rows' weighted sum; a client's factors have the same
    bits alone or in a block; counted as the oracle; None at rows that are not shared."""
    # factors smaller than rows
    prob, clients, (x, y, r), (X, Y, R) = _shared_point(
        5, hidden1=hidden[0], hidden2=hidden[1], hypergradient_batch_size=2
    )
    s = Sample(rng.key(7), 2)
    before = prob.oracle_counts["hvp_yy_inner"]
    rows = prob.hvp_rows(clients, X, Y, R, s)
    assert prob.oracle_counts["hvp_yy_inner"] - before == 4
    plain = prob.hvp_yy_inner(clients, X, Y, R, s)
    torch.testing.assert_close(rows.dense(), plain, rtol=1e-12, atol=1e-12)
    step = rows.plus_scaled(r, -0.3)
    torch.testing.assert_close(step.dense(), r - 0.3 * plain, rtol=1e-12, atol=1e-12)
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    out = torch.empty(prob.dim_y, dtype=torch.float64)
    step.group_sum(1, 4, w[1:4], out)
    torch.testing.assert_close(out, w[1:4] @ (r - 0.3 * plain)[1:4], rtol=1e-12, atol=1e-12)
    alone = prob.hvp_rows(clients[2:3], X[:1], Y[:1], R[:1], s)  # computed as two copies
    assert all(torch.equal(a, b[2:3]) for fa, fb in zip(alone.factors, rows.factors) for a, b in zip(fa, fb))
    assert torch.equal(alone.dense(), rows.dense(2, 3))
    assert prob.hvp_rows(clients, X, Y, R.clone(), s) is None  # v not shared: the oracle's own path
    wide = build_problem(
        _cfg(hidden1=hidden[0], hidden2=hidden[1], hypergradient_batch_size=64).problem,
        0,
        range(4, 12),
        dtype=torch.float64,
    )  # more samples than the rows are wide: made dense
    dense_rows = wide.hvp_rows(clients, X, Y, R, s)
    assert isinstance(dense_rows, torch.Tensor)
    torch.testing.assert_close(dense_rows, wide.hvp_yy_inner(clients, X, Y, R, s), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("oracle", ["grad_y_inner", "grad_y_outer"])
@pytest.mark.parametrize("tune_loss", [True, False])
def test_factored_gradient_rows_equal_the_oracle_and_sum_by_groups(oracle, tune_loss):
    """gradient_rows (FedInn's anchor and FedIHGP's right-hand side under summation groups): its rows are the
    oracle's to rounding; a group's sum is its rows' weighted sum; a client's factors have the same bits alone
    or in a block; counted as the oracle; None at a y that is not shared."""
    # factors smaller than rows
    prob, clients, _, (X, Y, _) = _shared_point(6, tune_loss=tune_loss, hypergradient_batch_size=2, batch_size=2)
    s = Sample(rng.key(8), 1)
    before = prob.oracle_counts[oracle]
    rows = prob.gradient_rows(oracle, clients, X, Y, s)
    assert prob.oracle_counts[oracle] - before == 4
    plain = getattr(prob, oracle)(clients, X, Y, s)
    torch.testing.assert_close(rows.dense(), plain, rtol=1e-12, atol=1e-12)
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    out = torch.empty(prob.dim_y, dtype=torch.float64)
    rows.group_sum(1, 4, w[1:4], out)
    torch.testing.assert_close(out, w[1:4] @ plain[1:4], rtol=1e-12, atol=1e-12)
    alone = prob.gradient_rows(oracle, clients[2:3], X[:1], Y[:1], s)  # computed as two copies
    assert all(torch.equal(a, b[2:3]) for fa, fb in zip(alone.factors, rows.factors) for a, b in zip(fa, fb))
    assert torch.equal(alone.dense(), rows.dense(2, 3))
    assert prob.gradient_rows(oracle, clients, X, Y.clone(), s) is None  # y not shared: the oracle's own path


def test_factored_rows_norms_equal_the_dense_rows_norms():
    """The per-client series of norms (recorder.row_norms) from GradientRows' factors: the norms of the dense
    rows to rounding, with and without a shared row and a scale (FedIHGP's r - eta Hr); a client alone gives
    the bits it has in a block."""
    from fednest_mpi.recorder import row_norms

    prob, clients, (_, _, r), (X, Y, R) = _shared_point(9, hypergradient_batch_size=2, batch_size=2)
    s = Sample(rng.key(3), 1)
    for rows in (
        prob.gradient_rows("grad_y_inner", clients, X, Y, s),
        prob.gradient_rows("grad_y_outer", clients, X, Y, s),
        prob.hvp_rows(clients, X, Y, R, s).plus_scaled(r, -0.3),
    ):
        torch.testing.assert_close(row_norms(rows), row_norms(rows.dense()), rtol=1e-10, atol=1e-12)
        assert torch.equal(row_norms(rows[2:3]), row_norms(rows)[2:3])
