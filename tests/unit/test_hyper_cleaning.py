"""Data hyper-cleaning (src/fednest_mpi/problems/hyper_cleaning.py), a built-in written on the public problem
API: its closed-form oracles and per-client values against autograd of f_i and g_i written with
torch.nn.functional (tests/unit/oracle_check.py, and on minibatches), its keyed label corruption, the detection
AUC and its direction, and FedNest runs through runner.simulate.
1 vs 2 ranks: tests/mpi/test_hyper_cleaning_ranks.py."""

import numpy as np
import pytest
import torch
from oracle_check import assert_oracles_match_autograd
from shared_data import DATA, requires

from fednest_mpi import config, rng
from fednest_mpi.comm import SerialComm
from fednest_mpi.problems.base import Sample
from fednest_mpi.problems.hyper_cleaning import HyperCleaning, detection_auc
from fednest_mpi.runner import simulate

pytestmark = requires("mnist")
NAME = "hyper_cleaning"


def _cfg(**algorithm):
    problem = {"name": NAME, "data_dir": str(DATA), "n_samples": 3000, "n_clients": 10}
    fields = {"seed": 0, "problem": {**problem, "partition": "iid", "batch_size": 16}, "run": {"dtype": "float64"}}
    return config.from_dict({**fields, "algorithm": {"clients_per_round": 5, **algorithm}})


@pytest.fixture
def problem():
    cfg = _cfg().problem
    return HyperCleaning(cfg, 0, range(3, 8), dtype=torch.float64), cfg


def _losses(prob, clients, x, y, sample, size, inner):
    """g_i without its regulariser (inner) or f_i of each client, from torch.nn.functional."""
    split = prob.inner if inner else prob.outer
    rows = clients - prob._first
    cols, w = split.batch(rows, clients, sample, size)
    pos = torch.as_tensor(split.positions(rows, cols))
    logits = prob.inputs[pos] @ y.reshape(len(clients), 10, 785).transpose(1, 2)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 10), prob.targets[pos].reshape(-1), reduction="none")
    weight = torch.as_tensor(w)
    if inner:
        weight = weight * torch.sigmoid(torch.gather(x, 1, torch.as_tensor(prob.offsets[clients][:, None] + cols)))
    return (weight * ce.reshape(weight.shape)).sum(1)


def test_oracles_match_autograd(problem):
    prob, cfg = problem
    ids = np.array([3, 5, 7])
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(3, prob.dim_x, dtype=torch.float64, generator=gen)
    Y, V = (0.1 * torch.randn(3, prob.dim_y, dtype=torch.float64, generator=gen) for _ in range(2))
    lam = cfg.inner_regularization
    for sample in (None, Sample(rng.key(5), 3)):
        x, y = X.clone().requires_grad_(), Y.clone().requires_grad_()
        g = _losses(prob, ids, x, y, sample, cfg.batch_size, True).sum() + 0.5 * lam * (y * y).sum()
        (gy,) = torch.autograd.grad(g, y)
        torch.testing.assert_close(prob.grad_y_inner(ids, X, Y, sample), gy)
        g2 = _losses(prob, ids, x, y, sample, cfg.hypergradient_batch_size, True).sum() + 0.5 * lam * (y * y).sum()
        (gy2,) = torch.autograd.grad(g2, y, create_graph=True)
        hv, jv = torch.autograd.grad((gy2 * V).sum(), (y, x))
        torch.testing.assert_close(prob.hvp_yy_inner(ids, X, Y, V, sample), hv)
        torch.testing.assert_close(prob.jvp_xy_inner(ids, X, Y, V, sample), jv)
        (fy,) = torch.autograd.grad(_losses(prob, ids, x, y, sample, cfg.hypergradient_batch_size, False).sum(), y)
        torch.testing.assert_close(prob.grad_y_outer(ids, X, Y, sample), fy)
        assert not prob.grad_x_outer(ids, X, Y, sample).any()


def test_oracles_and_values_match_autograd_on_the_whole_local_data(problem):
    """tests/unit/oracle_check.py: every oracle and g_i, f_i (outer_value, inner_value) at random (x, y)."""
    prob, cfg = problem
    lam = cfg.inner_regularization

    def f_g(i, x, y):
        def split_loss(split, inner):
            row = i - prob._first
            pos = torch.as_tensor(split.index[row, : split.count[row]])
            logits = prob.inputs[pos] @ y.reshape(10, 785).T
            ce = torch.nn.functional.cross_entropy(logits, prob.targets[pos], reduction="none")
            weight = torch.sigmoid(x[prob.offsets[i] : prob.offsets[i + 1]]) if inner else torch.ones(len(pos))
            return (weight * ce).mean()

        return split_loss(prob.outer, False), split_loss(prob.inner, True) + 0.5 * lam * (y * y).sum()

    assert_oracles_match_autograd(prob, [3, 6, 7], f_g)


def test_empty_blocks_give_empty_rows(problem):
    prob, _ = problem
    none, x, y = np.zeros(0, np.int64), torch.zeros(0, prob.dim_x), torch.zeros(0, prob.dim_y)
    x, y = x.double(), y.double()
    for sample in (None, Sample(rng.key(2), 1)):
        assert prob.grad_x_outer(none, x, y, sample).shape == prob.jvp_xy_inner(none, x, y, y, sample).shape == x.shape
        for rows in (prob.grad_y_outer(none, x, y, sample), prob.grad_y_inner(none, x, y, sample)):
            assert rows.shape == y.shape
        assert prob.hvp_yy_inner(none, x, y, y, sample).shape == y.shape


def test_jvp_touches_only_the_clients_own_samples(problem):
    prob, _ = problem
    gen = torch.Generator().manual_seed(1)
    y, v = (torch.randn(1, prob.dim_y, dtype=torch.float64, generator=gen) for _ in range(2))
    rows = prob.jvp_xy_inner(np.array([5]), prob.initial_point()[0].expand(1, -1), y, v, None)[0]
    own = np.zeros(prob.dim_x, dtype=bool)
    own[prob.offsets[5] : prob.offsets[6]] = True
    assert rows[own].abs().min() > 0 and not rows[~own].any()


def test_corruption_keyed_by_sample_and_at_its_rate():
    cfg = _cfg().problem
    a, b = HyperCleaning(cfg, 0, range(0, 4)), HyperCleaning(cfg, 0, range(4, 10))
    np.testing.assert_array_equal(a.clean, b.clean)  # the same on every rank
    assert a.dim_x == len(a.clean) == cfg.n_samples - 10 * int(np.ceil(0.2 * cfg.n_samples / 10))
    rate, n = 1 - a.clean.mean(), len(a.clean)
    assert abs(rate - cfg.corruption) < 4 * np.sqrt(cfg.corruption * (1 - cfg.corruption) / n)
    assert not np.array_equal(HyperCleaning(cfg, 1, range(0, 4)).clean, a.clean)


def test_data_file_is_refused():
    with pytest.raises(config.ConfigError, match="problem.data_file: hyper_cleaning draws its clients from MNIST"):
        HyperCleaning(_cfg().problem.__class__(data_file="own.h5"), 0, range(2))


def test_metrics_declare_their_direction():
    info = HyperCleaning.metric_info(None)
    assert info["detection_auc"][2] is True and info["test_accuracy"][2] is True and info["test_loss"][2] is False
    assert HyperCleaning.primary_metric == "test_accuracy"


def test_auc_against_all_pairs():
    gen = np.random.default_rng(0)
    scores, positive = gen.integers(0, 5, 200).astype(float), gen.random(200) < 0.3
    pairs = scores[positive][:, None] - scores[~positive][None, :]
    assert detection_auc(scores, positive) == pytest.approx(((pairs > 0) + 0.5 * (pairs == 0)).mean())
    assert detection_auc(np.zeros(5), np.arange(5) < 2) == 0.5


def test_fednest_run_detects_the_corrupted_labels():
    cfg = _cfg(name="fednest", outer_iterations=8, inner_lr=0.1, outer_lr=100.0, inner_local_steps=10)
    history = simulate(cfg, SerialComm()).history
    assert history["detection_auc"][0] == 0.5  # x0 = 0: every weight ties
    assert history["detection_auc"][-1] > 0.7 and history["test_accuracy"][-1] > 50.0
