"""System heterogeneity (heterogeneity.py, issue 25): keyed local work and unavailability, and the federation's
aggregation over the members that answered. End-to-end runs: tests/unit/test_heterogeneity_runs.py."""

import numpy as np
import pytest
import torch

from fednest_mpi import config, rng
from fednest_mpi.comm import SerialComm
from fednest_mpi.config import HeterogeneityConfig as Heterogeneity
from fednest_mpi.errors import UsageError
from fednest_mpi.federation import Federation
from fednest_mpi.heterogeneity import SystemModel


def _binomial_ok(hits: int, n: int, p: float, sds: float = 5.0) -> bool:
    return abs(hits / n - p) <= sds * np.sqrt(p * (1 - p) / n)


def test_the_drop_probability_is_the_empirical_rate_independently_over_rounds():
    p, m = 0.3, 2000
    model = SystemModel(Heterogeneity(drop_probability=p), seed=4, n_clients=m)
    ids = np.arange(m)
    answers = np.stack([model.answers(ids, r) for r in range(1, 101)])  # (rounds, clients)
    assert _binomial_ok(int((~answers).sum()), answers.size, p)
    both = ~answers[:-1] & ~answers[1:]  # a client dropping two rounds in a row: p^2 if independent
    assert _binomial_ok(int(both.sum()), both.size, p * p)
    per_client = (~answers).mean(0)  # no client is systematically unavailable
    assert per_client.std() == pytest.approx(np.sqrt(p * (1 - p) / answers.shape[0]), rel=0.15)


def test_answers_are_keyed_by_client_round_and_seed_not_by_the_set_asked():
    model = SystemModel(Heterogeneity(drop_probability=0.5), seed=4, n_clients=100)
    ids = np.arange(100)
    whole = model.answers(ids, 7)
    for part in (ids[::3], ids[50:], ids[[5, 93, 2]]):
        np.testing.assert_array_equal(model.answers(part, 7), whole[part])
    assert not np.array_equal(model.answers(ids, 8), whole)
    other_seed = SystemModel(Heterogeneity(drop_probability=0.5), seed=5, n_clients=100)
    assert not np.array_equal(other_seed.answers(ids, 7), whole)


def test_local_work_is_uniform_over_its_range_and_fixed_per_client_or_redrawn_per_iteration():
    m, tau = 5000, 8
    model = SystemModel(Heterogeneity(local_work="uniform", local_work_min=0.5), seed=2, n_clients=m)
    ids = np.arange(m)
    steps = model.local_steps(ids, 1, tau)
    counts = np.bincount(steps, minlength=tau + 1)
    assert counts[:4].sum() == 0 and counts[4:].sum() == m  # {ceil(0.5 tau), ..., tau}
    assert all(_binomial_ok(int(c), m, 1 / 5) for c in counts[4:])
    np.testing.assert_array_equal(model.local_steps(ids, 9, tau), steps)  # drawn once per client
    np.testing.assert_array_equal(model.local_steps(ids[::-7], 1, tau), steps[::-7])
    slow = np.argsort(steps)[:10]  # a slow client is slow in every phase: its uniform draw serves all
    assert (model.local_steps(slow, 1, 100) <= np.median(model.local_steps(ids, 1, 100))).all()
    redrawn = SystemModel(
        Heterogeneity(local_work="uniform", local_work_min=0.5, local_work_draw="iteration"), seed=2, n_clients=m
    )
    assert not np.array_equal(redrawn.local_steps(ids, 1, tau), redrawn.local_steps(ids, 2, tau))
    assert (model.local_steps(ids, 1, 1) == 1).all()  # one step stays one step
    full = SystemModel(Heterogeneity(), seed=2, n_clients=m)
    assert (full.local_steps(ids, 1, tau) == tau).all() and not full.drops and not full.varies_work


def test_an_availability_trace_is_read_per_round_cyclically_and_combined_with_the_drop_probability(tmp_path):
    table = np.array([[1, 0, 1], [0, 0, 1]])
    path = tmp_path / "trace.csv"
    np.savetxt(path, table, fmt="%d", delimiter=",")
    model = SystemModel(Heterogeneity(availability_trace=str(path)), seed=0, n_clients=3)
    for r in range(1, 6):
        np.testing.assert_array_equal(model.answers(np.arange(3), r), table[(r - 1) % 2].astype(bool))
    np.save(tmp_path / "trace.npy", table)
    both = SystemModel(
        Heterogeneity(availability_trace=str(tmp_path / "trace.npy"), drop_probability=0.5), seed=0, n_clients=3
    )
    coin = SystemModel(Heterogeneity(drop_probability=0.5), seed=0, n_clients=3)
    for r in range(1, 20):
        ids = np.arange(3)
        np.testing.assert_array_equal(both.answers(ids, r), coin.answers(ids, r) & model.answers(ids, r))


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "no file"),
        ("1,0\n0,1\n", "one column per client"),
        ("1,0,2\n", "other than 0 and 1"),
        ("1,x,0\n", "cannot read"),
    ],
)
def test_a_bad_trace_is_one_message_naming_the_field(tmp_path, content, words):
    path = tmp_path / "trace.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match="heterogeneity.availability_trace") as err:
        SystemModel(Heterogeneity(availability_trace=str(path)), seed=0, n_clients=3)
    assert words in str(err.value)


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"drop_probability": 1.5}, "drop_probability"),
        ({"local_work_min": 0.0}, "local_work_min"),
        ({"local_work": "poisson"}, "local_work"),
        ({"local_work_draw": "round"}, "local_work_draw"),
        ({"drop_rate": 0.1}, "drop_rate"),
    ],
)
def test_values_out_of_range_name_their_field(small_config, fields, name):
    with pytest.raises(config.ConfigError, match=f"heterogeneity.{name}"):
        small_config(heterogeneity=fields)


def test_an_algorithm_that_cannot_vary_the_local_work_refuses_it(small_config):
    with pytest.raises(config.ConfigError, match="heterogeneity.local_work: 'fedbio' runs the same local steps"):
        small_config(algorithm={"name": "fedbio"}, heterogeneity={"local_work": "uniform"})
    small_config(algorithm={"name": "fedbio"}, heterogeneity={"drop_probability": 0.2})  # dropouts it handles


def _federation(reduction, **fields) -> Federation:
    fed = Federation(SerialComm(), 50, reduction)
    fed.system = SystemModel(Heterogeneity(**fields), seed=9, n_clients=50)
    return fed


@pytest.mark.parametrize("reduction", ["sum", "ordered"])
def test_a_round_is_the_weighted_mean_over_the_members_that_answered(reduction):
    fed = _federation(reduction, drop_probability=0.4)
    S = fed.sample(rng.key(1, 2, 3), 20)
    weights = 1.0 + np.arange(20)
    answered = fed.answering(S)
    assert 0 < answered.sum() < 20  # this key drops some and keeps some
    values = torch.as_tensor(S.ids, dtype=torch.float64)[:, None] ** 2
    evaluated = []

    def rows(piece):
        evaluated.extend(piece.local_ids.tolist())
        return [values[piece.local_slots]]

    (mean,) = fed.mean_over(S, rows, weights=weights)
    assert sorted(evaluated) == sorted(S.ids[answered].tolist())  # a member that does not answer computes nothing
    w = np.where(answered, weights, 0.0)
    assert float(mean) == pytest.approx(float((w * S.ids.astype(float) ** 2).sum() / w.sum()), rel=1e-14)
    assert fed.take_answer_counts() == (int(answered.sum()), int(20 - answered.sum()))
    assert fed.take_answer_counts() == (0, 0) and fed.stats.rounds == 1
    answered2 = fed.answering(S)  # the next round draws its own answers
    (direct,) = fed.mean(S, [values], weights=weights)
    w2 = np.where(answered2, weights, 0.0)
    assert float(direct) == pytest.approx(float((w2 * S.ids.astype(float) ** 2).sum() / w2.sum()), rel=1e-14)


def test_a_round_nobody_answers_counts_and_keeps_the_fallback(tmp_path):
    np.save(tmp_path / "off.npy", np.zeros((1, 50)))
    fed = _federation("sum", availability_trace=str(tmp_path / "off.npy"))
    S = fed.sample(rng.key(1), 10)
    keep = torch.tensor([3.0, 4.0])
    rows = lambda piece: [torch.ones(piece.local_slots.size, 2, dtype=torch.float64)]  # noqa: E731
    assert torch.equal(fed.mean_over(S, rows, fallback=[keep])[0], keep)
    assert torch.equal(fed.mean_over(S, rows)[0], torch.zeros(2, dtype=torch.float64))  # no fallback: zero
    assert fed.stats.rounds == 2 and fed.take_answer_counts() == (0, 20)
