"""bench/: the sequential baseline computes the batched oracles' numbers (autograd, one client at a
time); the plain loop's steps are the algorithm's math; the floor formulas and the cost model's fits
on hand-computed and synthetic numbers; a tiny run of the harness writes and reads its HDF5 table.
No timing assertions."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import floors, model  # noqa: E402
from bench.plain import PlainLoop  # noqa: E402
from bench.sequential import SequentialProblem  # noqa: E402
from fednest_mpi import config, rng  # noqa: E402
from fednest_mpi.problems import build_problem  # noqa: E402
from fednest_mpi.problems.base import Sample  # noqa: E402


@pytest.fixture(scope="module")
def problems():
    cfg = config.from_dict(
        {
            "problem": {
                "name": "synthetic",
                "n_clients": 30,
                "hidden": 5,
                "n_inputs": 8,
                "n_classes": 4,
                "samples_per_client": 20,
                "size_distribution": "lognormal",
                "size_sigma": 0.5,
                "batch_size": 6,
                "eval_clients": 3,
                "eval_samples": 5,
            },
            "algorithm": {"clients_per_round": 5},
            "run": {"dtype": "float64"},
        }
    )
    batched = build_problem(cfg.problem, 1, range(0), dtype=torch.float64)
    return batched, SequentialProblem(batched)


@pytest.mark.parametrize("sample", [None, Sample(int(rng.key(3)), 2)])
def test_sequential_baseline_matches_the_batched_oracles(problems, sample):
    batched, seq = problems
    ids = np.array([2, 9, 21])
    gen = torch.Generator().manual_seed(1)
    X, Y, V = (
        scale * torch.randn(3, dim, dtype=torch.float64, generator=gen)
        for scale, dim in ((0.3, batched.dim_x), (0.3, batched.dim_y), (1.0, batched.dim_y))
    )
    for name in ("grad_x_outer", "grad_y_outer", "grad_y_inner"):
        torch.testing.assert_close(
            getattr(seq, name)(ids, X, Y, sample), getattr(batched, name)(ids, X, Y, sample), msg=name
        )
    for name in ("hvp_yy_inner", "jvp_xy_inner"):
        torch.testing.assert_close(
            getattr(seq, name)(ids, X, Y, V, sample), getattr(batched, name)(ids, X, Y, V, sample), msg=name
        )


@pytest.mark.slow
def test_harness_smoke_run_writes_its_table(tmp_path, capsys):
    from bench.run import COLUMNS, main
    from fednest_mpi.io.bench import read_bench

    spec = tmp_path / "tiny.toml"
    spec.write_text(f'''
iterations = 1
warmup = 0
output = "{tmp_path / "tiny.h5"}"
copy_mib = 8
sequential_max_clients = 3
[[case]]
name = "tiny"
family = "many"
clients_per_round = [3]
plain = true
[case.config.problem]
name = "synthetic"
n_clients = 20
hidden = 4
samples_per_client = 10
eval_clients = 2
[case.config.algorithm]
inner_local_steps = 2
neumann_steps = 1
''')
    assert main([str(spec)]) == 0
    attrs, rows = read_bench(tmp_path / "tiny.h5")
    assert attrs["format"] == "fednest-mpi/bench" and set(rows[0]) == set(COLUMNS)
    assert [r["mode"] for r in rows] == ["plain", "sequential", "single"]
    plain, seq, single = rows
    assert single["speedup_vs_sequential"] == seq["alg_s"] / single["alg_s"]
    assert single["speedup_vs_plain"] == plain["alg_s"] / single["alg_s"]
    assert single["flop_floor"] == plain["flop_floor"] > 0 and single["x_flop_floor"] > 0
    assert single["allreduce_calls"] >= 1 and single["proc_maxrss_mb"] >= single["peak_rss_mb"] * 0.5
    assert single["user_s"] > 0 and plain["proc_user_s"] > 0
    assert attrs["gemm_flops"] > 0 and attrs["copy_bandwidth"] > 0 and attrs["normal_seconds"] > 0
    floor = (single["generation_floor_s"] + single["flop_floor"] / attrs["gemm_flops"]) / single["ranks"]
    assert single["x_generation_flop_floor"] == single["alg_s"] / floor
    out = capsys.readouterr().out
    assert "x plain" in out and "GFLOP" in out


# -- the floors: hand-counted FLOP and bytes ------------------------------------------------------
def test_fedavg_floor_is_the_hand_count():
    s = floors.RoundShape(
        algorithm="fedavg",
        clients=1000,
        widths=(784, 200, 10),
        x_layers=0,
        dim_x=20,
        n_inner=4.0,
        n_outer=1.0,
        batch=4,
        tau=5,
    )
    gemm0, gemm1 = 2 * 4 * 784 * 200, 2 * 4 * 200 * 10
    per_step = 2 * (gemm0 + gemm1) + gemm1  # fwd + weight gradients + the input gradient of layer 2 only
    flop, traffic = floors.floors(s)
    assert flop == 1000 * 5 * per_step
    assert s.dim_y == 784 * 200 + 200 + 200 * 10 + 10
    assert traffic == 4 * 1000 * 5 * (2 * s.dim_y + 4 * 784)


def test_loss_tuning_floor_counts_every_fednest_oracle():
    s = floors.RoundShape(
        algorithm="fednest",
        clients=1,
        widths=(784, 200, 100, 10),
        x_layers=0,
        dim_x=20,
        n_inner=4.0,
        n_outer=1.0,
        batch=3,
        tau=5,
        neumann=5,
        x_in_outer=False,
    )
    g = lambda r: r * (2 * 2 * (784 * 200 + 200 * 100 + 100 * 10) + 2 * (200 * 100 + 100 * 10))  # noqa: E731
    expected = g(4) + 2 * 5 * g(3) + g(1) + 5 * 2 * g(4) + 2 * g(4)  # anchor, SVRG pairs, nabla_y f, N HVPs, Jacobian
    assert floors.flop_per_client(s) == expected
    assert 55e6 < expected < 70e6  # issue 16's estimate: about 60 MFLOP per client
    sgd = floors.RoundShape(**{**s.__dict__, "algorithm": "fednest_sgd"})
    assert floors.flop_per_client(s) - floors.flop_per_client(sgd) == g(4) + 5 * g(3)


def test_hyperrep_floor_forms_the_features_once_per_client_and_split():
    kw = dict(
        algorithm="fednest_sgd",
        clients=1,
        widths=(784, 200, 10),
        x_layers=1,
        dim_x=784 * 200 + 200,
        n_inner=4.0,
        n_outer=2.0,
        batch=3,
        tau=5,
        neumann=0,
    )
    wide, narrow = floors.RoundShape(**kw), floors.RoundShape(**{**kw, "tau": 50})
    head = 2 * 2 * 3 * 200 * 10  # one head gradient on 3 rows: fwd + weight gradient, no pass through the features
    assert floors.flop_per_client(narrow) - floors.flop_per_client(wide) == 45 * head
    assert wide.dim_y == 2010


def test_synthetic_generation_floor_counts_every_set_of_a_fednest_round():
    data = {
        "problem": {"name": "synthetic", "n_inputs": 6, "n_classes": 3, "hidden": 4},
        "algorithm": {"name": "fednest", "inner_rounds": 2, "neumann_steps": 3, "clients_per_round": 5},
    }
    shape = floors.shape_of(config.from_dict(data), 8.0, 2.0)
    per_set = 10 * 6 + 6 + 2  # the samples' n_i d, then the mean v_i and B_i (the teacher's labels are kept)
    assert shape.generated_normals == (2 + 3 + 2) * per_set  # FedInn's T sets, FedIHGP's S_0 ... S_3, FedOut's
    assert floors.generation_seconds(shape, 1e-9) == pytest.approx(5 * 7 * per_set * 1e-9)
    data["problem"] = {"name": "hyper_representation"}
    assert floors.shape_of(config.from_dict(data), 8.0, 2.0).generated_normals == 0  # hosted data


# -- the cost model on synthetic numbers ------------------------------------------------------------
def test_alpha_beta_fit_recovers_the_constants():
    n = np.array([4.0**k for k in range(1, 12)])
    net = model.fit_alpha_beta(n, 2e-6 + 5e-10 * n)
    assert net.alpha == pytest.approx(2e-6, rel=1e-6) and net.beta == pytest.approx(5e-10, rel=1e-6)
    assert net.allreduce(1, 10, 1e6) == 0.0
    assert net.allreduce(2, 10, 1e6) == pytest.approx(10 * 2e-6 + 1e6 * 5e-10)
    assert net.allreduce(4096, 1, 1e6) == pytest.approx(12 * 2e-6 + 2 * 4095 / 4096 * 1e6 * 5e-10)


def test_model_fit_predicts_rows_made_by_a_known_model():
    net = model.Network(3e-6, 1e-9)
    rows = []
    for clients, ranks in ((100, 1), (1000, 1), (10000, 1), (1000, 2), (10000, 2)):
        t = 0.05 + 2e-3 * -(-clients // ranks) + net.allreduce(ranks, 7, 4e5)
        rows.append(
            {
                "case": "c",
                "mode": "single" if ranks == 1 else "strong",
                "ranks": ranks,
                "clients_per_round": clients,
                "alg_s": t,
                "allreduce_calls": 7.0,
                "allreduce_bytes": 4e5,
            }
        )
    rows.append(
        {
            "case": "c",
            "mode": "plain",
            "ranks": 1,
            "clients_per_round": 100,
            "alg_s": 0.3,
            "allreduce_calls": float("nan"),
            "allreduce_bytes": float("nan"),
        }
    )
    m = model.fit(rows, net)
    assert m.compute[("c", "project")].a == pytest.approx(0.05) and m.compute[("c", "project")].b == pytest.approx(2e-3)
    assert m.compute[("c", "plain")] == model.Compute(0.0, 0.003, 1)
    text, points = model.report(m, rows, 4096, 10**6, "test")
    assert all(pred == pytest.approx(meas) for _, meas, pred, _ in points)
    assert f"{0.05 + 2e-3 * 245 + net.allreduce(4096, 7, 4e5):9.3f} s per round" in text


def test_model_command_refuses_a_bad_argument(tmp_path, capsys):
    assert model.main([str(tmp_path / "missing.h5"), "nodez=3"]) == 2
    assert "unknown argument" in capsys.readouterr().err


# -- the plain loop does the algorithm's math -------------------------------------------------------
@pytest.fixture(scope="module")
def plain_cfg():
    problem = {
        "name": "synthetic",
        "n_clients": 6,
        "hidden": 4,
        "n_inputs": 5,
        "n_classes": 3,
        "samples_per_client": 10,
        "batch_size": 8,
    }
    return config.from_dict(
        {
            "seed": 3,
            "problem": problem,
            "algorithm": {"name": "fedavg", "clients_per_round": 6, "inner_local_steps": 1, "inner_lr": 0.1},
            "run": {"dtype": "float64"},
        }
    )


def test_plain_fedavg_round_is_one_averaged_sgd_step(plain_cfg):
    loop = PlainLoop(plain_cfg)
    x, y = loop.x, [w.clone() for w in loop.y]
    loop.gen.manual_seed(11)
    loop.sampler = np.random.default_rng(5)
    loop.step()
    after = loop.y
    loop.gen.manual_seed(11)
    loop.sampler = np.random.default_rng(5)
    expected = [torch.zeros_like(w) for w in y]
    for c in loop.sample().tolist():  # one step on each client's minibatch of 8 (its first permutation)
        A, t, _, _ = loop.data(c)
        idx = torch.randperm(len(t), generator=loop.gen)[:8]
        yy = [w.clone().requires_grad_() for w in y]
        grads = torch.autograd.grad(loop.inner_loss(x, yy, A[idx], t[idx]), yy)
        expected = [e + (w - 0.1 * g) / 6 for e, w, g in zip(expected, y, grads)]
    for a, b in zip(after, expected):
        torch.testing.assert_close(a, b)


def test_plain_hessian_product_is_the_hessian(plain_cfg):
    fednest = config.FedNestConfig(clients_per_round=6, inner_local_steps=1, inner_lr=0.1)  # FedIHGP's (I - eta H) r
    loop = PlainLoop(dataclasses.replace(plain_cfg, algorithm=fednest))
    A, t, _, _ = loop.data(2)
    r = [torch.randn(w.shape, dtype=torch.float64) for w in loop.y]
    out = loop.hvp(loop.x, loop.y, r, A, t)
    flat = torch.cat([w.reshape(-1) for w in loop.y])
    shapes = [w.shape for w in loop.y]

    def g(v):
        parts = list(torch.split(v, [s.numel() for s in shapes]))
        return loop.inner_loss(loop.x, [p.reshape(s) for p, s in zip(parts, shapes)], A, t)

    H = torch.autograd.functional.hessian(g, flat)
    rv = torch.cat([w.reshape(-1) for w in r])
    torch.testing.assert_close(torch.cat([o.reshape(-1) for o in out]), rv - loop.a.neumann_scale * H @ rv)
