"""Synthetic(alpha, beta) generator (FedProx section 5.1) and the hyper-representation problem on it."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from mpi4py import MPI

from fednest_mpi import config, rng
from fednest_mpi.data import synthetic as synthetic_data
from fednest_mpi.data.synthetic import KnownLabels, SyntheticSpec, client_model, generate, sample_counts
from fednest_mpi.problems import build_problem, synthetic
from fednest_mpi.problems.base import Sample


def _cfg(problem=None, **sections):
    data = {
        "problem": {
            "name": "synthetic",
            "n_clients": 50,
            "hidden": 5,
            "n_inputs": 7,
            "n_classes": 4,
            "samples_per_client": 30,
            "batch_size": 8,
            "eval_clients": 10,
            "eval_samples": 20,
            **(problem or {}),
        },
        "algorithm": {"clients_per_round": 6},
        "run": {"dtype": "float64"},
    }
    data.update(sections)
    return config.from_dict(data)


# -- generator ----------------------------------------------------------------------------------
def test_a_clients_data_depend_only_on_seed_and_id():
    spec = SyntheticSpec(size_distribution="lognormal", samples_per_client=20, max_samples=200)
    many, labels, counts = generate(spec, 4, [3, 9, 17])
    alone, alone_labels, _ = generate(spec, 4, [9])
    start = counts[0]
    torch.testing.assert_close(many[start : start + counts[1]], alone, rtol=0, atol=0)
    assert torch.equal(labels[start : start + counts[1]], alone_labels)
    other_seed, _, _ = generate(spec, 5, [9], counts[1:2])
    assert not torch.equal(other_seed, alone)


def test_known_labels_give_the_generated_bits_and_spare_the_teachers():
    spec = SyntheticSpec(n_inputs=7, n_classes=4, size_distribution="lognormal", samples_per_client=12, max_samples=40)
    known = KnownLabels(slots=5, width=40, classes=4)
    calls = []
    real = synthetic_data._models
    for ids in ([3, 9, 17, 20], [9, 17, 8, 3], [0, 3, 9, 45, 20, 46], [], [9, 20], [3, 8, 0, 20, 45]):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(
                synthetic_data,
                "_models",
                lambda spec, seed, clients: calls.append(clients.tolist()) or real(spec, seed, clients),
            )
            got = generate(spec, 4, ids, pad_to=40, known=known)
        want = generate(spec, 4, ids, pad_to=40)
        assert all(torch.equal(g, w) for g, w in zip(got[:2], want[:2])) and np.array_equal(got[2], want[2])
    # only the clients whose slot does not hold them draw their teachers (slot = id mod 5; of two new clients
    # sharing a slot, the first keeps it)
    assert calls == [[3, 9, 17, 20], [8], [0, 3, 45, 46], [], [20], [8, 0, 45]]
    assert known.owner.tolist() == [0, 46, 17, 8, 9]
    with pytest.raises(ValueError, match="width 40"):
        generate(spec, 4, [1], pad_to=50, known=known)


def test_input_means_alone_are_the_models():
    spec = SyntheticSpec(alpha=0.5, beta=2.0)
    clients = np.array([5, 1, 77])
    assert torch.equal(synthetic_data._input_means(spec, 3, clients), synthetic_data._models(spec, 3, clients)[2])


def test_labels_are_the_teacher_argmax_and_inputs_have_the_stated_moments():
    spec = SyntheticSpec(alpha=0.5, beta=0.5)
    n = 20000
    a, t, _ = generate(spec, 1, [7], [n])
    W, b, v = client_model(spec, 1, 7)
    assert torch.equal(t, torch.argmax(torch.addmm(b, a, W.T), dim=1))
    a, v = a.double(), v.double()
    j = torch.arange(1, spec.n_inputs + 1, dtype=torch.float64)
    var = j**-1.2
    # sample mean within 5 standard errors of v_i, sample variance within 5 % of j^-1.2
    assert torch.all((a.mean(0) - v).abs() < 5 * (var / n).sqrt())
    torch.testing.assert_close(a.var(0), var, rtol=0.05, atol=0)


@pytest.mark.parametrize("alpha", [0.0, 3.0])
def test_alpha_sets_the_spread_of_the_client_teachers(alpha):
    spec = SyntheticSpec(alpha=alpha, beta=0.0)
    means = np.array([float(client_model(spec, 0, i)[0].mean()) for i in range(400)])
    # mean of W_i's 600 entries = u_i + N(0, 1/600): its spread over clients is sqrt(alpha^2 + 1/600)
    expected = np.sqrt(alpha**2 + 1.0 / 600)
    assert abs(means.std() / expected - 1) < 0.15


def test_sample_counts_fixed_and_lognormal():
    ids = np.arange(20000)
    assert np.all(sample_counts(SyntheticSpec(samples_per_client=37), 0, ids) == 37)
    counts = sample_counts(
        SyntheticSpec(size_distribution="lognormal", samples_per_client=40, size_sigma=1.0, max_samples=500), 0, ids
    )
    assert counts.min() >= 2 and counts.max() <= 500
    assert abs(np.median(counts) / 40 - 1) < 0.05
    # P(n > 40 e) = P(z > 1) = 0.159 for the uncapped lognormal
    assert abs(np.mean(counts > 40 * np.e) - 0.1587) < 0.01


# -- problem --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def problem():
    cfg = _cfg({"size_distribution": "lognormal", "size_sigma": 0.5})
    return build_problem(cfg.problem, 0, range(0), dtype=torch.float64), cfg


def test_splits_partition_each_clients_samples(problem):
    prob, cfg = problem
    ids = np.array([2, 11, 40])
    cs, rows = prob.client_set(ids)
    counts = sample_counts(prob.spec, 0, ids)
    n_out = cs.outer.count[rows]
    assert np.array_equal(cs.inner.count[rows] + n_out, counts)
    np.testing.assert_allclose(n_out, np.clip(np.rint(cfg.problem.val_fraction * counts), 1, counts - 1))


def test_a_client_row_does_not_depend_on_its_block_or_the_cache(problem):
    prob, _ = problem
    x, y = prob.initial_point()
    s = Sample(rng.key(9), 3)
    batched = prob.grad_x_outer(np.array([4, 7, 30]), x.expand(3, -1), y.expand(3, -1), s)
    for other in ([1, 2], [5, 6, 8], [10]):  # evict the set holding client 7
        prob.client_set(np.array(other))
    alone = prob.grad_x_outer(np.array([7]), x.expand(1, -1), y.expand(1, -1), s)
    torch.testing.assert_close(alone[0], batched[1], rtol=1e-12, atol=1e-14)


def test_memory_holds_only_the_recent_client_sets_within_the_budget(problem, monkeypatch):
    prob, _ = problem
    last_two = sum(synthetic._nbytes(prob._generate(np.arange(a, a + 5))) for a in (30, 35))
    monkeypatch.setattr(synthetic, "DATA_BUDGET_BYTES", last_two)
    for start in range(0, 40, 5):
        prob.client_set(np.arange(start, start + 5))
    assert len(prob._sets) == 2
    prob.client_set(np.array([36, 38]))  # a subset of the last set: no new generation
    assert len(prob._sets) == 2 and list(prob._sets.values())[-1].ids.tolist() == list(range(35, 40))


def test_kept_clients_give_the_generated_bits_and_stay_within_their_budget():
    cfg = _cfg({"size_distribution": "lognormal", "samples_per_client": 12, "max_samples": 60})
    fresh = build_problem(cfg.problem, cfg.seed, None, dtype=torch.float64)
    one_client = 60 * (cfg.problem.n_inputs * 4 + 8)  # the largest client's inputs (float32) and labels (int64)
    kept = build_problem(replace(cfg.problem, kept_clients_memory=1), cfg.seed, None, dtype=torch.float64)
    kept.kept.budget = 3 * one_client  # a few clients (MiB are too coarse for a test)
    used: list[int] = []  # the clients in the order of their last use
    for ids in ([3, 9, 17, 20], [9, 17, 41], [0, 3, 9, 44, 45, 46, 47], [9, 20], []):
        used = [i for i in used if i not in ids] + ids
        got, want = kept._generate(np.array(ids)), fresh._generate(np.array(ids))
        assert torch.equal(got.inputs, want.inputs) and torch.equal(got.targets, want.targets)
        assert np.array_equal(got.inner.count, want.inner.count) and np.array_equal(got.outer.count, want.outer.count)
        assert kept.kept.held_bytes <= kept.kept.budget
    held = list(kept.kept._held)
    assert 2 <= len(held) < len(used) and held == used[-len(held) :]  # the most recent kept, the oldest evicted


def test_a_run_keeping_clients_is_bitwise_the_run_without():
    from fednest_mpi.runner import simulate

    base = _cfg(algorithm={"clients_per_round": 6, "outer_iterations": 3, "inner_local_steps": 2, "neumann_steps": 2})
    runs = [
        simulate(replace(base, problem=replace(base.problem, kept_clients_memory=m)), MPI.COMM_SELF) for m in (0, 1)
    ]
    assert torch.equal(runs[0].x, runs[1].x) and torch.equal(runs[0].y, runs[1].y)
    assert runs[0].history["test_accuracy"] == runs[1].history["test_accuracy"]


def test_fednest_learns_on_synthetic_data():
    from fednest_mpi.runner import simulate

    cfg = _cfg(
        {
            "alpha": 0.0,
            "beta": 0.0,
            "hidden": 16,
            "n_inputs": 60,
            "n_classes": 10,
            "samples_per_client": 100,
            "eval_clients": 50,
        },
        algorithm={
            "clients_per_round": 10,
            "outer_iterations": 15,
            "inner_local_steps": 20,
            "inner_lr": 0.5,
            "outer_lr": 0.5,
            "neumann_scale": 0.1,
        },
    )
    acc = simulate(cfg, MPI.COMM_SELF).history["test_accuracy"]
    # the initial point is near chance (10 %); the last iterations must beat it clearly
    assert np.mean(acc[-5:]) > acc[0] + 12.0


def test_shared_x_feature_cache_gives_the_oracles_of_unshared_rows(problem):
    """Whole-split oracles with a shared x (stride 0) reuse cached features; the numbers must be
    those of the same x given as ordinary rows (no cache), for every oracle, hit or miss."""
    prob, _ = problem
    x, y = prob.initial_point()
    ids = np.array([1, 8, 19, 33])
    shared, rows = x.expand(4, -1), x.expand(4, -1).clone()
    Y = y.expand(4, -1)
    V = torch.randn(4, prob.dim_y, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for sample in (None, Sample(rng.key(6), 1)):
        for _ in range(2):  # the second pass hits the cache
            for name in ("grad_x_outer", "grad_y_outer", "grad_y_inner"):
                torch.testing.assert_close(
                    getattr(prob, name)(ids, shared, Y, sample), getattr(prob, name)(ids, rows, Y, sample)
                )
            for name in ("hvp_yy_inner", "jvp_xy_inner"):
                torch.testing.assert_close(
                    getattr(prob, name)(ids, shared, Y, V, sample), getattr(prob, name)(ids, rows, Y, V, sample)
                )
    assert prob._cached_features(prob.inner, ids, shared) is not None
    assert prob._cached_features(prob.inner, ids, (x + 0).expand(4, -1)) is None  # same values, other storage


@pytest.mark.parametrize("budget", [0, 2**30])
def test_feature_blocks_assemble_overlapping_sets_exactly(problem, monkeypatch, budget):
    """Client sets that overlap earlier ones (in another order, with new clients) are assembled from
    the stored blocks; with no budget beyond the newest block, nothing a set needs is lost."""
    from fednest_mpi.problems import representation

    monkeypatch.setattr(representation, "FEATURE_BUDGET_BYTES", budget)
    prob, _ = problem
    x, y = prob.initial_point()
    x = x + 0.0  # a storage of its own: a fresh store
    for ids in ([3, 9, 14], [14, 2, 9, 30], [30, 3, 41, 2, 9], [41]):
        ids = np.array(ids)
        shared, rows, Y = x.expand(ids.size, -1), x.expand(ids.size, -1).clone(), y.expand(ids.size, -1)
        for name in ("grad_y_inner", "grad_x_outer"):
            torch.testing.assert_close(
                getattr(prob, name)(ids, shared, Y, None), getattr(prob, name)(ids, rows, Y, None)
            )
    assert len(prob._features.blocks) == (1 if budget == 0 else 6)  # inner and outer: [3, 9, 14], [2, 30], [41]
