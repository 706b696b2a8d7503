"""Fused local SGD from shared weights (problems/shared_start.py) equals the plain loop of gradient
steps: against autograd on random MLPs, and on the loss-tuning problem against its own oracles."""

import numpy as np
import pytest
import torch
from shared_data import requires, small_mnist_config
from small_configs import small_synthetic

from fednest_mpi import exactsum, federation
from fednest_mpi.federation import dense
from fednest_mpi.problems import build_problem
from fednest_mpi.problems.base import Sample
from fednest_mpi.problems.shared_start import shared_start_sgd, worthwhile

F64 = torch.float64


def _plain_loop(weights, biases, data, steps, lr, decay):
    """Per-client autograd SGD on private copies (the reference)."""
    rows = []
    for c in range(data[0][0].shape[0]):
        params = [p.clone().requires_grad_() for pair in zip(weights, biases) for p in pair]
        for nu in range(steps):
            A, t, w = (d[c] for d in data[nu])
            h = A
            for j in range(len(weights)):
                h = torch.nn.functional.linear(h, params[2 * j], params[2 * j + 1])
                if j < len(weights) - 1:
                    h = torch.relu(h)
            loss = (w * torch.nn.functional.cross_entropy(h, t, reduction="none")).sum()
            loss = loss + 0.5 * decay * sum((p * p).sum() for p in params)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= lr * g
        rows.append(torch.cat([p.detach().reshape(-1) for p in params]))
    return torch.stack(rows)


@pytest.mark.parametrize("widths", [(6, 3), (6, 5, 3), (7, 5, 4, 3)])
@pytest.mark.parametrize("steps", [1, 4])
def test_shared_start_sgd_equals_per_client_autograd_sgd(widths, steps, monkeypatch):
    gen = torch.Generator().manual_seed(len(widths) * 10 + steps)
    C, b, lr, decay = 5, 3, 0.3, 0.1
    weights = [torch.randn(o, i, generator=gen, dtype=F64) for i, o in zip(widths[:-1], widths[1:])]
    biases = [torch.randn(o, generator=gen, dtype=F64) for o in widths[1:]]
    data = []
    for _ in range(steps):
        w = torch.rand(C, b, generator=gen, dtype=F64)
        w[0, -1] = 0.0  # a padded sample
        data.append(
            (
                torch.randn(C, b, widths[0], generator=gen, dtype=F64),
                torch.randint(widths[-1], (C, b), generator=gen),
                w / w.sum(1, keepdim=True),
            )
        )

    def batch(nu):
        A, t, w = data[nu]

        def residual(z):
            G = torch.softmax(z, -1) - torch.nn.functional.one_hot(t, widths[-1])
            return G * w[..., None]

        return A, residual

    rows = shared_start_sgd(list(zip(weights, biases)), batch, steps, lr, decay)
    reference = _plain_loop(weights, biases, data, steps, lr, decay)
    torch.testing.assert_close(rows.dense(), reference, rtol=1e-12, atol=1e-12)
    w = torch.rand(C, generator=gen, dtype=F64)
    torch.testing.assert_close(rows.weighted_sum(w), w @ reference, rtol=1e-12, atol=1e-12)
    whole = rows.dense()
    assert torch.equal(torch.cat([rows.dense(lo, lo + 2) for lo in range(0, C, 2)]), whole)
    one_tile, by_rows = (exactsum.BinnedSum(whole.shape[1], exactsum.bins_for(F64)) for _ in range(2))
    one_tile.add(whole, weights=w)
    monkeypatch.setattr(federation, "_EXACT_TILE_BYTES", 1)  # two rows per tile
    monkeypatch.setattr(federation, "_EXACT_TILE_ROWS", 2)
    deposits = federation._ExactDeposits(by_rows, None)
    deposits.add([rows], w, np.arange(C), np.arange(C))
    deposits.flush()
    assert torch.equal(by_rows.value(), one_tile.value())
    # a summation group's sum from its factors (one GEMM of its history rows): the plain sum of its
    # rows to rounding, and the same bits from the group's own part (another block, other offsets)
    group, part = torch.empty(whole.shape[1], dtype=F64), torch.empty(whole.shape[1], dtype=F64)
    rows.group_sum(1, 4, w[1:4], group)
    rows.part(1, 4).group_sum(0, 3, w[1:4].clone(), part)
    torch.testing.assert_close(group, w[1:4] @ reference[1:4], rtol=1e-12, atol=1e-12)
    assert torch.equal(group, part)


def _oracle_loop(prob, ids, X, Y0, steps, lr, key, anchor):
    """The reference: the problem's gradient oracle step by step (SVRG-corrected with an anchor)."""
    Y = Y0
    for nu in range(steps):
        d = prob.grad_y_inner(ids, X, Y, Sample(key, nu))
        if anchor is not None:
            d = d - prob.grad_y_inner(ids, X, Y0, Sample(key, nu)) + anchor
        Y = Y - lr * d
    return Y


@requires("mnist")
@pytest.mark.parametrize("tune_loss", [True, False])
@pytest.mark.parametrize("hidden", [(7, 5), (0, 0)])
def test_loss_tuning_local_sgd_equals_its_gradient_oracle_loop(tune_loss, hidden):
    cfg = small_mnist_config("loss_tuning", hidden1=hidden[0], hidden2=hidden[1], tune_loss=tune_loss, batch_size=4)
    prob = build_problem(cfg.problem, 0, range(20), dtype=torch.float64)
    x, y = prob.initial_point()
    x = x + 0.3 * torch.sin(torch.arange(x.numel(), dtype=x.dtype)) if tune_loss else x
    ids = np.array([2, 5, 11, 17])
    steps, lr, key = 3, 0.2, 1234
    X, Y0 = x.expand(ids.size, -1), y.expand(ids.size, -1)
    q = prob.grad_y_inner(ids, X, Y0, None).mean(0)  # an SVRG anchor
    for anchor in (None, q):
        prob.oracle_counts.clear()
        fused = prob.local_sgd(ids, x, y, steps, lr, key, anchor=anchor)
        assert prob.oracle_counts["grad_y_inner"] == steps * ids.size * (1 if anchor is None else 2)
        torch.testing.assert_close(
            dense(fused), _oracle_loop(prob, ids, X, Y0, steps, lr, key, anchor), rtol=1e-10, atol=1e-12
        )


@requires("mnist")
@pytest.mark.parametrize("anchored", [False, True])
def test_long_local_runs_use_private_weights_equal_to_the_oracle_loop(anchored):
    # 40 steps of batch 4 (x 2 with the anchor): a history longer than MAX_HISTORY, so the rows come
    # from private_weights_sgd, which must match the oracle loop like the low-rank form does
    cfg = small_mnist_config("loss_tuning", hidden1=7, hidden2=5, batch_size=4)
    prob = build_problem(cfg.problem, 0, range(20), dtype=torch.float64)
    x, y = prob.initial_point()
    ids, steps, lr, key = np.array([1, 2, 9]), 40, 0.1, 5
    assert not worthwhile(steps, 4, anchored)
    X, Y0 = x.expand(ids.size, -1), y.expand(ids.size, -1)
    anchor = prob.grad_y_inner(ids, X, Y0, None).mean(0) if anchored else None
    fused = prob.local_sgd(ids, x, y, steps, lr, key, anchor=anchor)
    assert isinstance(fused, torch.Tensor)
    torch.testing.assert_close(fused, _oracle_loop(prob, ids, X, Y0, steps, lr, key, anchor), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("sizes", ["fixed", "lognormal"])
@pytest.mark.parametrize("regularization", [0.0, 0.05])
def test_representation_head_local_sgd_equals_its_gradient_oracle_loop(sizes, regularization):
    """The fused head steps of hyper-representation learning (representation.py) on Synthetic data:
    SGD and FedInn's SVRG, equal to the oracle loop; ragged clients (lognormal sizes) padded."""
    from fednest_mpi import config

    cfg = config.from_dict(
        {
            "problem": small_synthetic(
                samples_per_client=20,
                size_distribution=sizes,
                size_sigma=0.6,
                batch_size=3,
                inner_regularization=regularization,
            ),
            "run": {"dtype": "float64"},
        }
    )
    prob = build_problem(cfg.problem, 0, range(0), dtype=F64)
    x, y = prob.initial_point()
    y = y + 0.2 * torch.cos(torch.arange(y.numel(), dtype=F64))
    ids, steps, lr, key = np.array([3, 8, 21, 22, 39]), 12, 0.3, 77
    X, Y0 = x.expand(ids.size, -1), y.expand(ids.size, -1)
    q = prob.grad_y_inner(ids, X, Y0, None).mean(0)
    for anchor in (None, q):
        prob.oracle_counts.clear()
        fused = prob.local_sgd(ids, x, y, steps, lr, key, anchor=anchor)
        assert prob.oracle_counts["grad_y_inner"] == steps * ids.size * (1 if anchor is None else 2)
        torch.testing.assert_close(
            fused, _oracle_loop(prob, ids, X, Y0, steps, lr, key, anchor), rtol=1e-10, atol=1e-12
        )
