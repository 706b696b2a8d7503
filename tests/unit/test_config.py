"""Every bad config gives one ConfigError naming the field and the fix (table-driven)."""

import pytest

from fednest_mpi import config
from fednest_mpi.errors import ConfigError

BAD = [
    ({"algoritm": {}}, "algoritm: unknown section or field (did you mean 'algorithm'?)"),
    ({"algorithm": {"outer_lr": 0.1, "outer_lrr": 1}}, "algorithm.outer_lrr: unknown field (did you mean 'outer_lr'?)"),
    ({"algorithm": {"name": "fednets"}}, "algorithm.name: 'fednets' is not one of"),
    ({"algorithm": {"name": "fednets"}}, "(did you mean 'fednest'?)"),
    ({"algorithm": {"outer_lr": "fast"}}, "algorithm.outer_lr: expected a number, got 'fast'"),
    ({"algorithm": {"outer_lr": 0}}, "algorithm.outer_lr: must be > 0.0"),
    ({"algorithm": {"outer_lr": float("nan")}}, "algorithm.outer_lr: expected a finite number"),
    ({"algorithm": {"outer_iterations": 2.5}}, "algorithm.outer_iterations: expected an integer, got 2.5"),
    ({"algorithm": {"outer_iterations": 0}}, "algorithm.outer_iterations: must be >= 1"),
    ({"algorithm": {"outer_iterations": True}}, "algorithm.outer_iterations: expected an integer"),
    ({"algorithm": {"neumann_steps": -1}}, "algorithm.neumann_steps: must be >= 0"),
    ({"algorithm": {"ihgp_mode": "random"}}, "algorithm.ihgp_mode: 'random' is not one of"),
    ({"algorithm": {"ihgp_mode": "randomized", "neumann_steps": 0}}, "algorithm.neumann_steps: the randomized FedIHGP"),
    ({"algorithm": {"ihgp_resample_clients": "yes"}}, "algorithm.ihgp_resample_clients: expected true or false"),
    (
        {"algorithm": {"clients_per_round": 200}},
        "algorithm.clients_per_round: 200 is more than problem.n_clients = 100",
    ),
    ({"problem": {"name": "quadratc"}}, "problem.name: unknown problem 'quadratc' (did you mean 'quadratic'?)"),
    ({"problem": {"n_clients": 0}}, "problem.n_clients: must be >= 1"),
    ({"problem": {"dim_y": "20"}}, "problem.dim_y: expected an integer, got '20'"),
    ({"problem": {"strong_convexity": 5.0}}, "problem.smoothness: 4.0 is below problem.strong_convexity = 5.0"),
    ({"problem": {"heterogeneity": -1}}, "problem.heterogeneity: must be >= 0"),
    ({"problem": 3}, "problem: expected a table of fields"),
    ({"federation": {"reduction": "tree"}}, "federation.reduction: 'tree' is not one of"),
    ({"run": {"dtype": "float16"}}, "run.dtype: 'float16' is not one of"),
    ({"run": {"device": "gpu"}}, "run.device: 'gpu' is not one of"),
    ({"run": {"torch_threads": 0}}, "run.torch_threads: must be >= 1"),
    ({"run": {"progress": "sometimes"}}, "run.progress: 'sometimes' is not one of"),
    ({"seed": -1}, "seed: must be >= 0"),
    ({"seed": "one"}, "seed: expected an integer"),
]


@pytest.mark.parametrize("data,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_config_gives_one_clear_message(data, message):
    with pytest.raises(ConfigError) as info:
        config.from_dict(data)
    assert message in str(info.value)


def test_defaults_are_valid_and_round_trip_through_json():
    cfg = config.from_dict({})
    assert cfg.algorithm.name == "fednest" and cfg.algorithm.neumann_steps == 5
    again = config.from_dict(__import__("json").loads(cfg.to_json()))
    assert again == cfg


def test_overrides_parse_toml_values_and_bare_words(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[problem]\n[algorithm]\nname = "lfednest"\n')
    cfg = config.load(path, ["algorithm.outer_lr=0.5", "algorithm.name=fednest_sgd", "run.overwrite=true", "seed=4"])
    assert cfg.algorithm.outer_lr == 0.5 and cfg.algorithm.name == "fednest_sgd" and cfg.run.overwrite and cfg.seed == 4


@pytest.mark.parametrize(
    "override,message",
    [
        ("algorithm.outer_lr", "expected section.field=value"),
        ("algorithm..x=1", "empty field name"),
        ("seed.x=1", "'seed' is a field, not a section"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError, match=message):
        config.apply_overrides({"seed": 1}, [override])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[algorithm\nname=1")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        config.load(bad)


def test_more_ranks_than_clients_is_refused():
    cfg = config.from_dict({"problem": {"n_clients": 3}, "algorithm": {"clients_per_round": 2}})
    config.validate_world(cfg, 3)
    with pytest.raises(ConfigError, match="3 clients cannot fill 4 MPI ranks"):
        config.validate_world(cfg, 4)


def test_reference_lists_every_field():
    text = config.reference_markdown()
    for cls in [
        config.QuadraticConfig,
        *(s.params for s in config.ALGORITHMS.values()),
        config.FederationConfig,
        config.RunSection,
    ]:
        for f in __import__("dataclasses").fields(cls):
            assert f"`{f.name}`" in text


def test_docs_config_md_is_generated_from_the_definitions():
    """In a fresh interpreter: plugins that other test modules register in this one (tests/plugins,
    examples/) are not part of the reference."""
    import subprocess
    import sys

    path = __import__("pathlib").Path(__file__).resolve().parents[2] / "docs" / "config.md"
    generated = subprocess.run(
        [sys.executable, "-m", "fednest_mpi", "config-doc", "--builtin"], capture_output=True, text=True, check=True
    ).stdout
    assert path.read_text().strip() == generated.strip(), "run `make docs` to regenerate docs/config.md"
