"""Plugins from outside the package: by 'module:Class' in a config and by entry point, through the same
registry path as the built-ins; every registration error is one ConfigError line (exit 2 on every rank)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fednest_mpi import config
from fednest_mpi.comm import SerialComm
from fednest_mpi.errors import ConfigError, UsageError
from fednest_mpi.io.h5 import read_run
from fednest_mpi.runner import simulate

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
MOMENTUM = ROOT / "examples" / "server_momentum"
MOMENTUM_CLASS = "fednest_server_momentum:FedNestMomentum"


@pytest.fixture
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.syspath_prepend(str(MOMENTUM))
    yield
    for name in [n for n in config.PROBLEMS if ":" in n] + [n for n in config.ALGORITHMS if ":" in n]:
        (config.PROBLEMS if name in config.PROBLEMS else config.ALGORITHMS).pop(name)


def momentum_config(beta=0.5, **run):
    return config.from_dict(
        {
            "seed": 1,
            "problem": {"name": "quadratic", "n_clients": 20},
            "algorithm": {
                "name": MOMENTUM_CLASS,
                "outer_iterations": 60,
                "clients_per_round": 20,
                "inner_local_steps": 20,
                "outer_lr": 0.1,
                "inner_lr": 0.05,
                "neumann_steps": 30,
                "neumann_scale": 0.25,
                "server_momentum": beta,
            },
            "run": {"output": "unused.h5", **run},
        }
    )


def test_a_plugin_algorithm_converges_counts_its_rounds_and_reports_its_diagnostic(plugin_path):
    cfg = momentum_config()
    spec = config.ALGORITHMS[MOMENTUM_CLASS]
    assert spec.kind == "a FedNest variant" and spec.params.__name__ == "MomentumParams"
    h = simulate(cfg, SerialComm()).history
    assert h["x_error"][-1] < 1e-6 * h["x_error"][0]  # the closed-form x* of the quadratic problem
    assert np.all(np.diff(h["comm_rounds"]) == 2 * 1 + 30 + 2)  # rounds_per_iteration: 2T + N + 2
    assert math.isnan(h["momentum_norm"][0]) and h["momentum_norm"][-1] > 0
    plain = simulate(momentum_config(beta=0.0), SerialComm()).history  # beta = 0: FedNest without momentum
    assert plain["x_error"][-1] > 100 * h["x_error"][-1]


def test_an_undeclared_diagnostic_fails_the_run_with_its_name(plugin_path, monkeypatch):
    from fednest_mpi.algorithms import implementation

    cls = implementation(momentum_config().algorithm.name)
    monkeypatch.setattr(cls, "diagnostics", {k: v for k, v in cls.diagnostics.items() if k != "momentum_norm"})
    with pytest.raises(UsageError) as caught:
        simulate(momentum_config(), SerialComm())
    assert str(caught.value) == (
        "algorithm 'fednest_server_momentum:FedNestMomentum' hook step: expected the diagnostics "
        "FedNestMomentum.diagnostics declares, got also 'momentum_norm'; add name -> (description, units) to "
        "FedNestMomentum.diagnostics"
    )


def test_a_plugin_problem_by_module_class_runs_as_the_builtin(plugin_path):
    data = {
        "seed": 2,
        "problem": {"name": "quadratic", "n_clients": 8, "dim_x": 3, "dim_y": 4},
        "algorithm": {"outer_iterations": 4, "clients_per_round": 4},
    }
    builtin = simulate(config.from_dict(data), SerialComm()).history
    data["problem"]["name"] = "tiny_plugins:TinyQuadratic"
    plugin = simulate(config.from_dict(data), SerialComm()).history
    np.testing.assert_array_equal(plugin["x_error"], builtin["x_error"])
    assert "tiny_plugins:TinyQuadratic" in config.reference_markdown()


def test_a_plugin_params_check_runs_with_the_inherited_ones(plugin_path):
    data = {"problem": {"name": "tiny_plugins:EvenQuadratic", "n_clients": 8}, "algorithm": {"clients_per_round": 4}}
    assert config.from_dict(data).problem.n_clients == 8
    with pytest.raises(ConfigError, match=r"^problem.n_clients: 7 is odd; this plugin pairs clients"):
        config.from_dict(data | {"problem": {"name": "tiny_plugins:EvenQuadratic", "n_clients": 7}})
    bad_spectrum = {"name": "tiny_plugins:EvenQuadratic", "n_clients": 8, "smoothness": 0.5}
    with pytest.raises(ConfigError, match=r"^problem.smoothness: 0.5 is below problem.strong_convexity"):
        config.from_dict(data | {"problem": bad_spectrum})


@pytest.mark.parametrize(
    "name,message",
    [
        ("tiny_plugins:NoParams", "class NoParams has no Params; give it its parameter class"),
        ("tiny_plugins:MutableParams", "is not frozen; declare it @dataclass(frozen=True)"),
        ("tiny_plugins:NoDefaultParams", "field 'n_clients' has no default"),
        ("tiny_plugins:ListFieldParams", "field 'weights' is of type <class 'tuple'>; use bool, int, float or str"),
        ("tiny_plugins:NoClientsParams", "lacks the field 'n_clients' every problem has"),
        ("tiny_plugins:not_a_class", "is not a class"),
        ("tiny_plugins:Missing", "module 'tiny_plugins' has no 'Missing'"),
        ("no_such_module_here:X", "cannot import module 'no_such_module_here'"),
        ("broken_at_import:X", "importing module 'broken_at_import' failed (RuntimeError: plugin bug at import)"),
        (":X", "is not of the form 'module:Class'"),
    ],
)
def test_a_broken_plugin_is_one_config_error_naming_it(plugin_path, name, message):
    with pytest.raises(ConfigError) as err:
        config.from_dict({"problem": {"name": name}})
    assert message in str(err.value) and "\n" not in str(err.value)


def _fake_distribution(tmp_path, group, entries):
    info = tmp_path / "fake_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))


def test_an_entry_point_plugin_is_found_by_its_name_with_did_you_mean(plugin_path, tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "fednest_mpi.algorithms", {"fednest_momentum": MOMENTUM_CLASS})
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ConfigError, match="did you mean 'fednest_momentum'"):
            config.from_dict({"algorithm": {"name": "fednest_momentun"}})
        cfg = config.from_dict({"algorithm": {"name": "fednest_momentum", "server_momentum": 0.3}})
        assert cfg.algorithm.server_momentum == 0.3 and cfg.algorithm.name == "fednest_momentum"
        assert "`fednest_momentum`" in config.reference_markdown()
    finally:
        config.ALGORITHMS.pop("fednest_momentum", None)


def test_an_entry_point_taking_a_builtin_name_is_refused(plugin_path, tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "fednest_mpi.problems", {"quadratic": "tiny_plugins:TinyQuadratic"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="'quadratic' is registered twice .* rename the plugin's entry point"):
        config.from_dict({"problem": {"name": "quadratic"}})
    with pytest.raises(ConfigError, match="'tiny_plugins:TinyQuadratic' is registered twice"):
        config.PROBLEMS.register(config.PROBLEMS.resolve("tiny_plugins:TinyQuadratic"))


def test_config_doc_with_a_plugin_taking_a_builtin_name_is_one_line_exit_2(plugin_path, tmp_path, monkeypatch, capsys):
    from fednest_mpi.cli import main

    _fake_distribution(tmp_path, "fednest_mpi.algorithms", {"fednest": MOMENTUM_CLASS})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["config-doc"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.splitlines() == [
        "fednest-mpi: error: algorithm.name: 'fednest' is registered twice (by fednest_mpi.algorithms.fednest:FedNest "
        f"and by the entry point {MOMENTUM_CLASS} of group fednest_mpi.algorithms); rename the plugin's entry point"
    ]


def test_an_installed_plugin_does_not_change_the_projects_config_reference(tmp_path):
    """An installed plugin is listed by ``config-doc`` but not by ``config-doc --builtin``, which makes
    docs/config.md (``make docs``, test_config.py): installing one never breaks the project's own tests."""
    _fake_distribution(tmp_path, "fednest_mpi.algorithms", {"fednest_momentum": MOMENTUM_CLASS})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(MOMENTUM), os.environ.get("PYTHONPATH", "")]))
    doc = [
        subprocess.run(
            [sys.executable, "-m", "fednest_mpi", "config-doc", *flag],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        for flag in ([], ["--builtin"])
    ]
    assert "`fednest_momentum`" in doc[0]
    assert doc[1].strip() == (Path(__file__).resolve().parents[2] / "docs" / "config.md").read_text().strip()


def _cli(*args, ranks=1, timeout=240):
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [sys.executable, "-m", "fednest_mpi", *map(str, args)]
    if ranks > 1:
        cmd = [str(mpiexec), "-n", str(ranks), *cmd]
    env = {**os.environ, "PYTHONPATH": f"{MOMENTUM}{os.pathsep}{PLUGINS}", "MPI4PY_RC_THREAD_LEVEL": "single"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_a_broken_plugin_under_mpiexec_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[problem]\nname = "broken_at_import:X"\n')
    done = _cli("run", cfg, "--output", tmp_path / "o.h5", ranks=2)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "broken_at_import" in lines[0], done.stderr


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.slow
def test_a_plugin_run_stopped_by_sigterm_resumes_on_another_rank_count_bitwise(tmp_path):
    cfg = tmp_path / "m.toml"
    cfg.write_text(
        (MOMENTUM / "quadratic_momentum.toml").read_text().replace('"fednest_momentum"', f'"{MOMENTUM_CLASS}"')
        + '\n[federation]\nreduction = "ordered"\n'
    )
    common = ["--set", "algorithm.outer_iterations=8", "-q"]
    whole = _cli("run", cfg, "--output", tmp_path / "whole.h5", *common)
    assert whole.returncode == 0, whole.stderr
    env_stop = {"FEDNEST_MPI_INJECT_FAULT": "0:4:term"}
    os.environ.update(env_stop)
    try:
        first = _cli("run", cfg, "--output", tmp_path / "cut.h5", *common, ranks=2)
    finally:
        os.environ.pop("FEDNEST_MPI_INJECT_FAULT")
    assert first.returncode == 0 and "--resume" in first.stderr, first.stderr
    second = _cli("run", cfg, "--output", tmp_path / "cut.h5", *common, "--resume")
    assert second.returncode == 0, second.stderr
    (_, a), (attrs, b) = read_run(tmp_path / "whole.h5"), read_run(tmp_path / "cut.h5")
    assert json.loads(attrs["resumes"])
    for name in ("x_error", "momentum_norm", "comm_rounds", "hypergradient_estimate_norm"):
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
