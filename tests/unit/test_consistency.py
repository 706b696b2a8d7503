"""``run.check_consistency`` without MPI: the field's check, the digest's moments and what they tell, the line.
The runs on several ranks: tests/mpi/test_consistency_ranks.py."""

import numpy as np
import pytest
import torch
from histories import assert_histories_match
from test_checkpoint import _cli_config

from fednest_mpi import config, consistency
from fednest_mpi.cli import main
from fednest_mpi.comm import SerialComm
from fednest_mpi.errors import ConfigError
from fednest_mpi.io.h5 import read_run
from fednest_mpi.runner import simulate


def test_a_negative_period_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as caught:
        config.from_dict({"run": {"check_consistency": -1}})
    assert str(caught.value) == "run.check_consistency: must be >= 0, got -1"


def test_the_check_is_off_by_default():
    assert config.from_dict({}).run.check_consistency == 1  # on by default: every iteration


def _summed(digests):
    return np.sum([consistency.moments(d) for d in digests], axis=0)


def test_equal_digests_agree_and_any_difference_is_seen():
    rng = np.random.default_rng(7)
    same = int(rng.integers(0, 2**63)) * 2 + 1
    assert consistency.agree(_summed([same] * 5), 5)
    for bit in range(64):  # one bit flipped on one rank of five
        assert not consistency.agree(_summed([same] * 4 + [same ^ (1 << bit)]), 5), bit


def test_digests_of_equal_sums_but_other_pieces_disagree():
    # pieces (1, 3) and (2, 2): the same sum, so a SUM of the digests alone would not tell
    assert not consistency.agree(_summed([1, 3]), 2)
    assert consistency.agree(_summed([2, 2]), 2)


def test_the_moments_are_exact_in_float64():
    top = 2**64 - 1  # every piece 0xFFFF
    summed = _summed([top] * 1000)
    assert summed[consistency.PIECES] == 1000 * 0xFFFF**2 and consistency.agree(summed, 1000)


def test_the_digest_follows_every_bit_of_x_and_y():
    x, y = torch.arange(4, dtype=torch.float64), torch.ones(6, dtype=torch.float64)
    moved = x.clone()
    moved[2] = torch.nextafter(moved[2], torch.tensor(10.0, dtype=torch.float64))
    assert consistency.digest(x, y) == consistency.digest(x.clone(), y.clone())
    assert consistency.digest(moved, y) != consistency.digest(x, y)
    assert consistency.digest(y[:4], x) != consistency.digest(x, y)


def test_the_line_names_every_differing_rank():
    line = consistency.disagreement(6, [5, 5, 7, 8], 3, 3)
    assert line.startswith(
        "run.check_consistency: x and y differ between ranks at iteration 6 (ranks 2, 3 differ from rank 0; checked "
        "every 3 iterations, equal at iteration 3): a plugin computed something rank-dependent"
    )


def test_a_checked_run_on_one_rank_is_the_unchecked_run(small_config):
    checked = simulate(small_config(run={"check_consistency": 1}), SerialComm())
    plain = simulate(small_config(run={"check_consistency": 0}), SerialComm())
    assert_histories_match(checked.history, plain.history)


def test_a_resumed_run_may_turn_the_check_on(tmp_path, capsys):
    cfg = _cli_config(tmp_path, iterations=4)
    assert main(["run", str(cfg), "-q", "--set", "run.check_consistency=0"]) == 0
    more = ["--set", "algorithm.outer_iterations=6", "--set", "run.check_consistency=1"]
    assert main(["run", str(cfg), "-q", "--resume", *more]) == 0, capsys.readouterr().err
    assert read_run(tmp_path / "out.h5")[1]["iteration"].tolist() == list(range(7))
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.inner_lr=0.07"]) == 2
    assert (
        capsys.readouterr()
        .err.rstrip()
        .endswith(
            "Resume with the config of the interrupted run (only algorithm.outer_iterations, run.check_consistency, "
            "run.checkpoint_every, run.idle_timeout, run.log_every, run.mlflow_experiment, run.mlflow_uri, "
            "run.overwrite, run.progress, run.round_timeout, run.round_timeout_factor, run.stop_timeout, "
            "run.tensorboard_dir may change)"
        )
    )
