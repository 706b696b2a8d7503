"""Fair FL on UCI Adult: data split, oracles against autograd, metrics against hand counts, a short run."""

import numpy as np
import pytest
import torch
from mpi4py import MPI
from oracle_check import assert_oracles_match_autograd
from shared_data import DATA, requires

from fednest_mpi import config
from fednest_mpi.errors import ConfigError
from fednest_mpi.problems import build_problem
from fednest_mpi.problems.fairness import FairnessProblem
from fednest_mpi.runner import simulate

pytestmark = requires("adult")


def _cfg(problem=None, **algorithm):
    return config.from_dict(
        {
            "seed": 1,
            "problem": {
                "name": "fairness",
                "n_clients": 6,
                "data_dir": str(DATA),
                "val_per_cell": 30,
                "weight_cells": "group_label",
                "hypergradient_batch_size": 64,
            }
            | (problem or {}),
            "algorithm": config.algorithm_fields(
                algorithm.get("name", "fedbio"),
                {  # the fields the named algorithm has
                    "name": "fedbio",
                    "outer_iterations": 2,
                    "clients_per_round": 6,
                    "inner_lr": 0.5,
                    "outer_lr": 1.0,
                    "neumann_steps": 3,
                    "neumann_scale": 0.5,
                    "sync_period": 2,
                    "inner_local_steps": 3,
                }
                | algorithm,
            ),
            "run": {"output": "unused.h5"},
        }
    )


def _problem(**problem):
    cfg = _cfg(
        problem, name="fednest"
    )  # the problem does not depend on the algorithm; FedOut allows every outer objective
    return build_problem(cfg.problem, cfg.seed, range(cfg.problem.n_clients))


def _client_data(prob: FairnessProblem, i, split):
    pos = split.index[i - prob._first][: split.count[i - prob._first]]
    return prob.inputs[pos], prob.targets[pos], prob.inv_size[pos]


@pytest.mark.parametrize(
    "problem",
    [
        {"weight_cells": "group_label"},
        {"weight_cells": "group", "sensitive": "race", "model": "mlp", "hidden": 3},
        {"sensitive": "race", "outer_objective": "worst_group", "worst_group_temperature": 0.1},
    ],
)
def test_oracles_match_autograd_of_the_written_out_losses(problem):
    prob = _problem(**problem)
    mu = prob.cfg.inner_regularization

    def f_g(i, x, y):
        A, t, inv = _client_data(prob, i, prob.inner)
        cell = t if prob.by_label else t // 2
        w = prob.dim_x * torch.softmax(x, 0)
        z = prob._logits(A[None], y[None])[0]
        lab = (t % 2).to(z.dtype)
        loss = -(lab * torch.nn.functional.logsigmoid(z) + (1 - lab) * torch.nn.functional.logsigmoid(-z))
        g = (w[cell] * loss).mean() + 0.5 * mu * y @ y
        A, t, inv = _client_data(prob, i, prob.outer)
        z = prob._logits(A[None], y[None])[0]
        lab = (t % 2).to(z.dtype)
        loss = -(lab * torch.nn.functional.logsigmoid(z) + (1 - lab) * torch.nn.functional.logsigmoid(-z))
        if (
            prob.cfg.outer_objective == "worst_group"
        ):  # tau log sum_s exp(mean loss of cell s / tau), cells present only
            tau, cell = prob.cfg.worst_group_temperature, (t if prob.by_label else t // 2)
            cell_means = torch.stack([loss[cell == s].mean() for s in range(prob.dim_x) if bool((cell == s).any())])
            return tau * torch.log(torch.exp(cell_means / tau).sum()), g
        f = (inv * loss).sum() / inv.sum()
        return f, g

    assert_oracles_match_autograd(prob, [0, 3, 5], f_g)


def test_validation_pool_is_cell_balanced_and_disjoint_from_training():
    prob = _problem()
    n_val, n_train, cells_seen = 0, 0, np.zeros(prob.dim_x)
    for i in range(prob.n_clients):
        _, t_val, inv = _client_data(prob, i, prob.outer)
        _, t_train, _ = _client_data(prob, i, prob.inner)
        n_val, n_train = n_val + len(t_val), n_train + len(t_train)
        np.add.at(cells_seen, t_val.numpy(), 1)
        assert len(t_train) >= prob.cfg.batch_size
    # 30 samples of each of the 4 (sex, label) cells, every sample of adult.data used once
    np.testing.assert_array_equal(cells_seen, [30, 30, 30, 30])
    assert n_val + n_train == 32561
    # the Dirichlet split gives the clients different (group, label) mixes
    shares = np.array(
        [
            np.bincount(_client_data(prob, i, prob.inner)[1].numpy(), minlength=4) / prob.inner.count[i]
            for i in range(prob.n_clients)
        ]
    )
    assert np.ptp(shares, axis=0).max() > 0.2


def test_metrics_of_the_all_negative_classifier_are_the_hand_counts():
    prob = _problem()
    x, y = prob.initial_point()  # y = 0: every logit is 0, every prediction "<=50K"
    m = prob.evaluate(x, y)
    t, g = prob.test_labels.numpy(), prob.test_groups.numpy()
    assert m["test_accuracy"] == pytest.approx(100 * np.mean(t == 0))
    group_acc = [100 * np.mean(t[g == s] == 0) for s in (0, 1)]
    assert m["worst_group_accuracy"] == pytest.approx(min(group_acc))
    assert m["group_accuracy_gap"] == pytest.approx(max(group_acc) - min(group_acc))
    assert m["dp_gap"] == 0.0 and m["eo_gap"] == 0.0
    assert m["test_loss"] == pytest.approx(np.log(2))
    assert m["worst_cell_accuracy"] == 0.0  # every ">50K" cell is wrong
    assert m["worst_cell_test_loss"] == pytest.approx(np.log(2))
    assert all(m[f"weight_{name}"] == pytest.approx(1.0) for name in prob.cell_names())


def test_metrics_of_a_group_dependent_classifier():
    prob = _problem()
    x, _ = prob.initial_point()
    y = torch.zeros(prob.dim_y, dtype=torch.float64)
    y[list(_feature_names()).index("sex=Male")] = 10.0  # predicts ">50K" for men only
    m = prob.evaluate(x, y)
    t, g = prob.test_labels.numpy(), prob.test_groups.numpy()
    assert m["dp_gap"] == pytest.approx(100.0) and m["eo_gap"] == pytest.approx(100.0)
    assert m["worst_group_accuracy"] == pytest.approx(100 * np.mean(t[g == 1] == 1))
    assert m["worst_cell_accuracy"] == 0.0  # (Female, >50K) and (Male, <=50K) are all wrong


def test_without_the_group_feature_the_classifier_cannot_see_the_group():
    names = list(_feature_names())
    aware, unaware = _problem(), _problem(group_feature=False)
    assert unaware.n_features == aware.n_features - 2 and unaware.dim_y == aware.dim_y - 2
    kept = [k for k, n in enumerate(names) if not n.startswith("sex=")]
    torch.testing.assert_close(unaware.test_inputs, aware.test_inputs[:, kept])
    torch.testing.assert_close(unaware.inputs, aware.inputs[:, kept])


def _feature_names():
    from fednest_mpi.problems.fairness import _adult

    return _adult(str(DATA)).feature_names


@pytest.mark.parametrize("name", ["fedbio", "fedbioacc", "fednest", "fedavg"])
def test_short_runs_record_the_fairness_metrics(name):
    h = simulate(_cfg(name=name), MPI.COMM_SELF).history
    for key in ("test_accuracy", "dp_gap", "eo_gap", "worst_group_accuracy"):
        assert len(h[key]) == 3 and all(np.isfinite(h[key]))
    assert h["test_accuracy"][-1] > h["test_accuracy"][0]  # training moved away from the all-negative start
    moved = any(abs(h[f"weight_{c}"][-1] - 1.0) > 1e-6 for c in ("Female_le50K", "Male_gt50K"))
    assert moved == (name != "fedavg")  # FedAvg trains the unweighted model only


def test_batch_larger_than_a_client_is_a_config_error():
    with pytest.raises(ConfigError, match="problem.hypergradient_batch_size"):
        _problem(hypergradient_batch_size=10**6)


@pytest.mark.parametrize("weight_cells", ["group", "group_label"])
def test_pooled_worst_group_gradient_is_the_gradient_of_the_pooled_smooth_maximum(weight_cells):
    """Inside outer_linearised(mean of outer_statistics over S), mean_S grad_y f_i equals the autograd
    gradient of tau logsumexp_s(L_s / tau), L_s the mean loss of weighted cell s over the pooled validation set of S."""
    prob = _problem(
        sensitive="race", weight_cells=weight_cells, outer_objective="worst_group", worst_group_temperature=0.1
    )
    tau = prob.cfg.worst_group_temperature
    S = np.array([0, 2, 3, 5])
    x = torch.zeros(len(S), prob.dim_x, dtype=torch.float64)
    y = 0.3 * torch.randn(prob.dim_y, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    Y = y.expand(len(S), -1)
    with prob.outer_linearised(prob.outer_statistics(S, x, Y).mean(0)):
        pooled_grad = prob.grad_y_outer(S, x, Y, None).mean(0)
    assert prob._cell_factor is None  # the linearisation ends with the context

    A = torch.cat([_client_data(prob, i, prob.outer)[0] for i in S])
    t = torch.cat([_client_data(prob, i, prob.outer)[1] for i in S])
    yy = y.clone().requires_grad_(True)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        prob._logits(A[None], yy[None])[0], (t % 2).to(torch.float64), reduction="none"
    )
    cell = t if prob.by_label else t // 2
    present = [s for s in range(prob.dim_x) if bool((cell == s).any())]
    smooth_max = tau * torch.logsumexp(torch.stack([loss[cell == s].mean() for s in present]) / tau, 0)
    (expected,) = torch.autograd.grad(smooth_max, yy)
    torch.testing.assert_close(pooled_grad, expected)


def test_worst_group_run_pools_once_per_outer_iteration():
    base = simulate(_cfg({"sensitive": "race", "weight_cells": "group"}, name="fednest"), MPI.COMM_SELF).history
    pooled = simulate(
        _cfg({"sensitive": "race", "weight_cells": "group", "outer_objective": "worst_group"}, name="fednest"),
        MPI.COMM_SELF,
    ).history
    assert np.diff(pooled["comm_rounds"]).tolist() == (np.diff(base["comm_rounds"]) + 1).tolist()
    assert all(np.isfinite(pooled["worst_group_test_loss"]))
    assert any(abs(pooled[f"weight_{c}"][-1] - 1.0) > 1e-6 for c in ("White", "Black"))


@pytest.mark.parametrize("name", ["fedbio", "lfednest"])
def test_worst_group_needs_fedout(name):
    with pytest.raises(ConfigError, match="problem.outer_objective"):
        _cfg({"outer_objective": "worst_group"}, name=name)


def test_initial_weights_set_x0_and_bad_names_or_values_are_config_errors():
    prob = _problem(sensitive="race", weight_cells="group", initial_weights="White=0.5, Asian-Pac-Islander=2")
    x, _ = prob.initial_point()
    w = prob.cell_weights(x)
    expected = torch.tensor(
        [0.5 if n == "White" else 2.0 if n == "Asian-Pac-Islander" else 1.0 for n in prob.cell_names()],
        dtype=torch.float64,
    )
    torch.testing.assert_close(w, expected / expected.mean())
    with pytest.raises(ConfigError, match="problem.initial_weights: 'Whte' is not a cell"):
        _problem(sensitive="race", weight_cells="group", initial_weights="Whte=2")
    with pytest.raises(ConfigError, match="problem.initial_weights: the weight of Black must be a positive number"):
        _problem(sensitive="race", weight_cells="group", initial_weights="Black=-1")
