"""One rule for a layer that switches ``problem.name`` or ``algorithm.name`` (a file over its ``base``,
``--set``, a sweep's values): the layers below keep only the fields the named problem or algorithm has,
plus fields of no problem (algorithm) at all, which validation then names (docs/config.md)."""

from pathlib import Path

import pytest

from fednest_mpi import config, jobs
from fednest_mpi.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
QUADRATIC = ROOT / "configs" / "quadratic.toml"  # [problem] quadratic with dim_x, smoothness, ...; fednest fields


def test_set_switches_the_problem_and_leaves_the_old_problems_fields_behind():
    cfg = config.load(QUADRATIC, ['problem.name="minimax"'])
    assert cfg.problem.name == "minimax" and cfg.problem.n_clients == 20  # shared field kept from the file
    assert cfg.problem.heterogeneity == 1.0 and not hasattr(cfg.problem, "dim_x")
    cfg = config.load(QUADRATIC, ['problem.name="minimax"', "problem.dim=3", 'algorithm.name="fedavg_s"'])
    assert (cfg.problem.dim, cfg.algorithm.name) == (3, "fedavg_s")


def test_set_switches_the_algorithm_by_the_same_rule():
    cfg = config.load(QUADRATIC, ['algorithm.name="fedbio"'])
    assert cfg.algorithm.name == "fedbio" and cfg.algorithm.outer_lr == 0.2  # shared field kept


def test_a_file_over_its_base_switches_the_problem(tmp_path):
    (tmp_path / "child.toml").write_text(f'base = "{QUADRATIC}"\n[problem]\nname = "compositional"\n')
    cfg = config.load(tmp_path / "child.toml")
    assert cfg.problem.name == "compositional" and cfg.problem.n_clients == 20


def test_unknown_fields_survive_a_switch_and_are_named(tmp_path):
    (tmp_path / "typo.toml").write_text(QUADRATIC.read_text().replace("dim_y = 20", "dimy = 20"))
    with pytest.raises(ConfigError, match=r"problem.dimy: unknown field"):
        config.load(tmp_path / "typo.toml", ['problem.name="minimax"'])
    (tmp_path / "typo.toml").write_text(QUADRATIC.read_text().replace("neumann_steps = 30", "neuman_steps = 30"))
    with pytest.raises(ConfigError, match=r"algorithm.neuman_steps: unknown field"):
        config.load(tmp_path / "typo.toml", ['algorithm.name="fedbio"'])


def test_in_one_layer_another_problems_field_is_named_like_another_algorithms():
    with pytest.raises(
        ConfigError,
        # (plugins registered by other test modules may follow in the list of owners)
        match=r"problem.dim_x: does not apply to problem 'minimax'; it is a field of quadratic, compositional[^;]*; "
        r"remove it \(did you mean 'dim'\?\)",
    ):
        config.from_dict({"problem": {"name": "minimax", "dim_x": 3}})
    config.from_dict({"problem": {"name": "minimax", "dim_x": 10}})  # the quadratic's default: changes nothing
    with pytest.raises(ConfigError, match=r"algorithm.sync_period: does not apply to algorithm 'fednest'"):
        config.from_dict({"algorithm": {"name": "fednest", "sync_period": 3}})


def test_a_sweep_over_problems_validates(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'config = "{QUADRATIC}"\n[grid]\nproblem.name = ["quadratic", "minimax", "compositional"]\n')
    tasks = jobs.expand(jobs.load_sweep(sweep))
    jobs.check_tasks(tasks, tmp_path)
    assert len(tasks) == 3
