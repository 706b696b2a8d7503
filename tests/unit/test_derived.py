"""Oracles derived from the losses of one client (problems/derived.py): against the quadratic problem's
closed forms, against the hand-written oracles of hyper-representation and loss tuning (float64, the same
numbers to rounding: relative error below 1e-12), and by finite differences of the losses on random
problems (float64)."""

import dataclasses
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_data import requires, small_mnist_config
from small_configs import make_config
from torch import nn

from fednest_mpi import config
from fednest_mpi.comm import SerialComm
from fednest_mpi.problems import build_problem
from fednest_mpi.problems.base import ORACLES, Sample, shared_rows
from fednest_mpi.problems.clientdata import ClientSplit
from fednest_mpi.problems.derived import ClientSamples, LossProblem, ModuleParameters
from fednest_mpi.problems.models import ModelHyperRepresentation, ModelLossTuning
from fednest_mpi.runner import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
config.PROBLEMS.resolve("derived_plugins:LossQuadratic")

SECOND = ("hvp_yy_inner", "jvp_xy_inner")


def _blocks(problem, x, y, gen, B=4):
    """(shared x, y rows; per-client rows) of B clients, and directions v (B, d2)."""
    X = x + 0.1 * torch.randn(B, x.numel(), generator=gen, dtype=x.dtype)
    Y = y + 0.1 * torch.randn(B, y.numel(), generator=gen, dtype=y.dtype)
    V = torch.randn(B, y.numel(), generator=gen, dtype=y.dtype)
    return ((shared_rows(x, B), shared_rows(y, B)), (X, Y)), V


def _compare(derived, reference, ids, sample, rtol):
    x, y = reference.initial_point()
    gen = torch.Generator().manual_seed(4)
    rows, V = _blocks(reference, x, y, gen, len(ids))
    for X, Y in rows:
        for oracle in ORACLES:
            args = (X, Y, V) if oracle in SECOND else (X, Y)
            want = getattr(reference, oracle)(ids, *args, sample)
            got = getattr(derived, oracle)(ids, *args, sample)
            assert got.shape == want.shape and got.dtype == want.dtype, oracle
            scale = float(want.abs().max())
            assert float((got - want).abs().max()) <= rtol * max(scale, 1e-300), (oracle, scale)


# -- the quadratic problem ---------------------------------------------------------------------------
def _quadratics():
    cfg = make_config(problem={"n_clients": 9, "dim_x": 3, "dim_y": 5})
    loss_cfg = make_config(problem={"n_clients": 9, "dim_x": 3, "dim_y": 5, "name": "derived_plugins:LossQuadratic"})
    closed = build_problem(cfg.problem, 3, range(9))
    derived = build_problem(loss_cfg.problem, 3, range(9))
    return closed, derived


def test_quadratic_as_losses_has_the_closed_form_oracles_and_values():
    closed, derived = _quadratics()
    assert isinstance(derived, LossProblem)
    ids = np.array([0, 4, 5, 8])
    _compare(derived, closed, ids, Sample(9, 2), rtol=1e-13)
    x, y = closed.initial_point()
    for value in ("inner_value", "outer_value"):
        torch.testing.assert_close(
            getattr(derived, value)(ids, shared_rows(x, 4), shared_rows(y, 4)),
            getattr(closed, value)(ids, shared_rows(x, 4), shared_rows(y, 4)),
            rtol=1e-13,
            atol=1e-13,
        )


def test_fednest_on_the_derived_quadratic_reaches_the_closed_form_solution():
    """x_error is ||x - x*|| against the closed-form x*: the derived run follows the closed-form run."""
    sections = {"algorithm": {"outer_iterations": 30, "clients_per_round": 12}, "problem": {"n_clients": 12}}
    closed = simulate(make_config(**sections), SerialComm())
    sections["problem"]["name"] = "derived_plugins:LossQuadratic"
    derived = simulate(make_config(**sections), SerialComm())
    assert derived.history["x_error"][-1] < 0.05 * derived.history["x_error"][0]
    np.testing.assert_allclose(derived.history["x_error"], closed.history["x_error"], rtol=1e-9)


# -- against the hand-written oracles of hyper-representation and loss tuning ------------------------
@pytest.mark.needs_data("mnist")
@pytest.mark.parametrize(
    "name, fields, cls",
    [
        ("hyper_representation", {"hidden": 8, "partition": "dirichlet"}, ModelHyperRepresentation),
        ("loss_tuning", {"hidden1": 6, "hidden2": 5, "max_per_class": 100}, ModelLossTuning),
        ("loss_tuning", {"hidden1": 0, "hidden2": 0, "max_per_class": 100, "tune_loss": False}, ModelLossTuning),
    ],
)
def test_derived_oracles_equal_the_hand_written_ones(name, fields, cls):
    p = small_mnist_config(name, batch_size=2, hypergradient_batch_size=2, **fields).problem
    reference = build_problem(p, 3, range(p.n_clients), dtype=torch.float64)
    derived = build_problem(dataclasses.replace(p, derived_oracles=True), 3, range(p.n_clients), dtype=torch.float64)
    assert type(derived) is cls
    x, y = reference.initial_point()
    x2, y2 = derived.initial_point()
    assert torch.equal(x, x2) and torch.equal(y, y2)
    ids = np.array([0, 3, 11])
    for sample in (None, Sample(77, 3)):
        _compare(derived, reference, ids, sample, rtol=1e-12)
    assert derived.evaluate(x, y) == pytest.approx(reference.evaluate(x, y), rel=1e-12)
    X, Y = shared_rows(x, 3), shared_rows(y, 3)
    for a, b in zip(derived.correct_counts(ids, X, Y), reference.correct_counts(ids, X, Y)):
        assert torch.equal(a, b)
    torch.testing.assert_close(derived.inner_value(ids, X, Y), reference.inner_value(ids, X, Y), rtol=1e-12, atol=0)


# -- finite differences on random problems -------------------------------------------------------------
class RandomLosses(LossProblem):
    """Clients of 3 to 7 samples (padded to 7): smooth non-quadratic losses coupling x and y,

    g_i = sum_j w_j softplus(a_j . y + (x . b_j) (y . c_j)) + (mu/2) ||y||^2 + sum_j w_j (x . b_j)^2 tanh(y . c_j)
    f_i = sum_j w_j tanh(a_j . y - x . b_j)^2 + ||x||^2 / 2
    """

    def __init__(self, seed, n_clients=5, d1=3, d2=4):
        super().__init__()
        self.cfg = types.SimpleNamespace(batch_size=2, hypergradient_batch_size=0)
        self.dim_x, self.dim_y, self.n_clients = d1, d2, n_clients
        self.dtype, self.device = torch.float64, torch.device("cpu")
        gen = torch.Generator().manual_seed(seed)
        counts = torch.randint(3, 8, (n_clients,), generator=gen).numpy()
        n = int(counts.sum())
        tensors = {
            k: torch.randn(n, d, generator=gen, dtype=torch.float64) for k, d in (("a", d2), ("b", d1), ("c", d2))
        }
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        split = ClientSplit.contiguous(starts, counts, 7)
        self.samples = ClientSamples(tensors, {"inner": split, "outer": split}, 0, torch.float64)

    def inner_loss(self, x, y, batch):
        w, a, b, c = batch["weight"], batch["a"], batch["b"], batch["c"]
        u = a @ y + (b @ x) * (c @ y)
        return (w * (nn.functional.softplus(u) + (b @ x) ** 2 * torch.tanh(c @ y))).sum() + 0.25 * (y @ y)

    def outer_loss(self, x, y, batch):
        w, a, b = batch["weight"], batch["a"], batch["b"]
        return (w * torch.tanh(a @ y - b @ x) ** 2).sum() + 0.5 * (x @ x)

    def initial_point(self):
        return torch.zeros(self.dim_x, dtype=torch.float64), torch.zeros(self.dim_y, dtype=torch.float64)

    def evaluate(self, x, y):
        return {}

    def metric_info(self):
        return {}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_derived_oracles_match_finite_differences_of_the_losses(seed):
    p = RandomLosses(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    ids = np.array([0, 2, 3, 4])
    B, eps = ids.size, 1e-4
    X = torch.randn(B, p.dim_x, generator=gen, dtype=torch.float64)
    Y = torch.randn(B, p.dim_y, generator=gen, dtype=torch.float64)
    V = torch.randn(B, p.dim_y, generator=gen, dtype=torch.float64)
    U = torch.randn(B, p.dim_y, generator=gen, dtype=torch.float64)
    Ux = torch.randn(B, p.dim_x, generator=gen, dtype=torch.float64)

    def g(X, Y):
        return p.inner_value(ids, X, Y)

    def f(X, Y):
        return p.outer_value(ids, X, Y)

    def check(analytic, numeric):
        torch.testing.assert_close(analytic, numeric, rtol=1e-5, atol=1e-7)

    # first order: u . grad ~ central differences of the whole-split losses
    check((p.grad_y_inner(ids, X, Y, None) * U).sum(1), (g(X, Y + eps * U) - g(X, Y - eps * U)) / (2 * eps))
    check((p.grad_y_outer(ids, X, Y, None) * U).sum(1), (f(X, Y + eps * U) - f(X, Y - eps * U)) / (2 * eps))
    check((p.grad_x_outer(ids, X, Y, None) * Ux).sum(1), (f(X + eps * Ux, Y) - f(X - eps * Ux, Y)) / (2 * eps))
    # second order: u^T H v ~ mixed second differences (no oracle inside the reference; truncation ~ e^2)
    e = 2e-4

    def mixed(dx1, dy1, dx2, dy2):
        return (
            g(X + dx1 + dx2, Y + dy1 + dy2)
            - g(X + dx1 - dx2, Y + dy1 - dy2)
            - g(X - dx1 + dx2, Y - dy1 + dy2)
            + g(X - dx1 - dx2, Y - dy1 - dy2)
        ) / (4 * e * e)

    zx, zy = torch.zeros_like(X), torch.zeros_like(Y)
    check((p.hvp_yy_inner(ids, X, Y, V, None) * U).sum(1), mixed(zx, e * U, zx, e * V))
    check((p.jvp_xy_inner(ids, X, Y, V, None) * Ux).sum(1), mixed(e * Ux, zy, zx, e * V))


def test_minibatches_are_drawn_as_the_built_ins_draw_them_and_rows_do_not_depend_on_the_block():
    p = RandomLosses(5, n_clients=6)
    x, y = torch.randn(3, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    s = Sample(31, 4)
    block = p.grad_y_inner(np.array([1, 4, 5]), shared_rows(x, 3), shared_rows(y, 3), s)
    alone = p.grad_y_inner(np.array([4]), shared_rows(x, 1), shared_rows(y, 1), s)
    assert torch.equal(block[1], alone[0])
    batch = p.client_batch("inner", np.array([1, 4]), s, 2)
    cols, weights = p.samples.splits["inner"].batch(np.array([1, 4]), np.array([1, 4]), s, 2)
    np.testing.assert_array_equal(batch["weight"].numpy(), weights)
    assert p.oracle_counts["grad_y_inner"] == 4


def test_empty_blocks_give_empty_rows():
    p = RandomLosses(0)
    ids = np.zeros(0, dtype=np.int64)
    x, y = p.initial_point()
    X, Y, V = shared_rows(x, 0), shared_rows(y, 0), torch.zeros(0, p.dim_y, dtype=torch.float64)
    for oracle, width in zip(ORACLES, (p.dim_x, p.dim_y, p.dim_y, p.dim_y, p.dim_x)):
        args = (X, Y, V) if oracle in SECOND else (X, Y)
        assert getattr(p, oracle)(ids, *args, Sample(1, 0)).shape == (0, width)


# -- the parameters of a module ---------------------------------------------------------------------------
def test_module_parameters_split_into_x_and_y_and_call_the_module_functionally():
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 3)).double()
    split = ModuleParameters(net, x_names=["0"])
    assert [n for n, _ in split.x_shapes] == ["0.weight", "0.bias"]
    assert [n for n, _ in split.y_shapes] == ["3.weight", "3.bias"]
    assert (split.dim_x, split.dim_y) == (2 * 9 + 2, 3 * 32 + 3)
    x = torch.cat([p.detach().flatten() for p in net[0].parameters()])
    y = torch.cat([p.detach().flatten() for p in net[3].parameters()])
    inputs = torch.randn(5, 1, 6, 6, dtype=torch.float64)
    torch.testing.assert_close(split.call(x, y, inputs), net(inputs), rtol=0, atol=0)
    a, b = split.initial(7, 1, "x"), split.initial(7, 1, "x")
    assert torch.equal(a, b) and a.shape == (split.dim_x,)
    assert float(a[:18].abs().max()) <= 1 / 3 and float(a[:18].abs().max()) > 0.2  # U(+-1/sqrt(9))
    with pytest.raises(ValueError, match="buffers"):
        ModuleParameters(nn.BatchNorm1d(3))


# -- a user's network: the example's LeNet as the body of hyper-representation -------------------------
@pytest.mark.needs_data("mnist")
def test_a_cnn_body_gets_per_client_oracles_equal_to_plain_autograd_on_the_module():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "cnn_hyperrep"))
    p = small_mnist_config(
        "hyper_representation",
        model="fednest_cnn_hyperrep:LeNet",
        n_clients=300,
        batch_size=3,
        hypergradient_batch_size=4,
    ).problem
    problem = build_problem(p, 3, range(p.n_clients), dtype=torch.float64)
    assert isinstance(problem, ModelHyperRepresentation) and problem.hidden == 84
    x, y = problem.initial_point()
    net = problem.network
    ids, s = np.array([2, 5, 9]), Sample(8, 1)
    gen = torch.Generator().manual_seed(0)
    (shared, (X, Y)), V = _blocks(problem, x, y, gen, 3)
    rows = {o: getattr(problem, o)(ids, X, Y, *((V,) if o in SECOND else ()), s) for o in ORACLES}
    for o, out in rows.items():  # empty blocks, one-client blocks
        assert getattr(problem, o)(ids[:0], X[:0], Y[:0], *((V[:0],) if o in SECOND else ()), s).shape[0] == 0
        alone = getattr(problem, o)(ids[1:2], X[1:2], Y[1:2], *((V[1:2],) if o in SECOND else ()), s)
        torch.testing.assert_close(alone[0], out[1], rtol=1e-12, atol=1e-14)
    b = 1  # client 5 by plain autograd on the module's own parameters (no torch.func)
    module = net.module.double()
    for param, value in zip(module.parameters(), net.parameters(X[b], None).values()):
        param.data.copy_(value)
    yl = Y[b].clone().requires_grad_()
    params = list(module.parameters())

    def loss(split, size, inner):
        batch = problem.client_batch(split, ids[b : b + 1], s, size)
        z = problem._head(yl, module(batch["inputs"][0]))
        ce = (batch["weight"][0] * nn.functional.cross_entropy(z, batch["targets"][0], reduction="none")).sum()
        return ce + (0.5 * p.inner_regularization * (yl * yl).sum() if inner else 0.0)

    f = loss("outer", 4, False)
    gx = torch.autograd.grad(f, params)
    torch.testing.assert_close(rows["grad_x_outer"][b], torch.cat([g.flatten() for g in gx]), rtol=1e-10, atol=1e-12)
    g = loss("inner", 4, True)
    gy = torch.autograd.grad(g, yl, create_graph=True)[0]
    hv = torch.autograd.grad(gy @ V[b], [yl, *params])
    torch.testing.assert_close(rows["hvp_yy_inner"][b], hv[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        rows["jvp_xy_inner"][b], torch.cat([h.flatten() for h in hv[1:]]), rtol=1e-10, atol=1e-12
    )


@requires("mnist")  # the config checks problem.data_dir before the model
def test_a_bad_model_is_one_clear_line():
    with pytest.raises(config.ConfigError, match=r"problem.model: 'LeNet' is not of the form 'module:Class'"):
        small_mnist_config("hyper_representation", model="LeNet")
    with pytest.raises(config.ConfigError, match="problem.dropout: the derived oracles"):
        small_mnist_config("hyper_representation", derived_oracles=True, dropout=0.5)


@requires("mnist")  # the model is imported when the problem is built, after its data are read
def test_a_model_that_cannot_be_imported_is_one_clear_line():
    p = small_mnist_config("loss_tuning", model="no_such_module_here:Net").problem
    with pytest.raises(config.ConfigError, match="problem.model: cannot import module 'no_such_module_here'"):
        build_problem(p, 0, range(0))


@pytest.mark.parametrize("anchored", [False, True])
def test_fused_local_steps_equal_the_oracle_loop(anchored):
    """local_sgd (one vmap call per step, the SVRG pair stacked) against FedInn's step-by-step oracle loop."""
    p = RandomLosses(3, n_clients=6)
    ids = np.array([0, 2, 5])
    gen = torch.Generator().manual_seed(9)
    x, y = torch.randn(3, generator=gen, dtype=torch.float64), torch.randn(4, generator=gen, dtype=torch.float64)
    q = torch.randn(4, generator=gen, dtype=torch.float64) if anchored else None
    fused = p.local_sgd(ids, x, y, 4, 0.1, 17, anchor=q)
    X, Y0 = shared_rows(x, 3), shared_rows(y, 3)
    Y = Y0
    for nu in range(4):
        d = p.grad_y_inner(ids, X, Y, Sample(17, nu))
        if anchored:
            d = d - p.grad_y_inner(ids, X, Y0, Sample(17, nu)) + q
        Y = Y - 0.1 * d
    torch.testing.assert_close(fused, Y, rtol=1e-13, atol=1e-14)
    assert p.oracle_counts["grad_y_inner"] == 3 * 4 * (2 if anchored else 1) * 2  # fused and loop alike
