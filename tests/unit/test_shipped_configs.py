"""Every shipped config loads and validates; config families (``base = ...``) resolve as documented."""

import tomllib
from pathlib import Path

import pytest

from fednest_mpi import config
from fednest_mpi.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "configs").rglob("*.toml"))


def test_every_shipped_config_validates():
    """One test over all shipped configs; a failure lists every config that does not load."""
    assert len(SHIPPED) >= 70
    failures = []
    for path in SHIPPED:
        try:
            if not config.load(path).run.output.endswith(".h5"):
                failures.append(f"{path.relative_to(ROOT)}: run.output is not an .h5 file")
        except ConfigError as exc:
            failures.append(f"{path.relative_to(ROOT)}: {exc}")
    assert not failures, "\n".join(failures)


def test_family_members_write_distinct_outputs_and_differ_only_where_they_say():
    members = [p for p in SHIPPED if "base" in tomllib.loads(p.read_text())]
    assert len(members) >= 24  # every variant, iid and non-iid, of both MNIST problems
    outputs = [config.load(p).run.output for p in SHIPPED if p.name not in ("base.toml", "iid.toml")]
    assert len(outputs) == len(set(outputs))
    iid = config.load(ROOT / "configs/mnist/hyperrep/iid/lfednest.toml")
    noniid = config.load(ROOT / "configs/mnist/hyperrep/noniid/fednest.toml")
    assert (iid.algorithm.name, iid.problem.partition, iid.problem.val_fraction, iid.algorithm.inner_local_steps) == (
        "lfednest",
        "iid",
        0.2,
        40,
    )
    assert iid.algorithm.neumann_steps == noniid.algorithm.neumann_steps == 5  # inherited from base.toml
    assert config.load(ROOT / "configs/mnist/hyperrep/noniid/fednest_tau5.toml").algorithm.outer_local_steps == 5
    assert config.load(ROOT / "configs/mnist/losstuning/iid/untuned.toml").problem.tune_loss is False


def test_base_chain_merges_tables_and_overrides_win(tmp_path):
    (tmp_path / "a.toml").write_text("seed = 4\n[problem]\n[algorithm]\nouter_lr = 0.5\ninner_lr = 0.2\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.toml").write_text('base = "../a.toml"\n[algorithm]\ninner_lr = 0.3\n')
    cfg = config.load(tmp_path / "sub" / "b.toml", ["algorithm.outer_lr=0.7"])
    assert (cfg.seed, cfg.algorithm.inner_lr, cfg.algorithm.outer_lr) == (4, 0.3, 0.7)


@pytest.mark.parametrize(
    "text, message",
    [
        ('base = "missing.toml"\n', "does not exist"),
        ("base = 3\n", "base: expected the path of a config file"),
        ('base = "me.toml"\n', "leads back to itself"),
    ],
)
def test_bad_base(tmp_path, text, message):
    (tmp_path / "me.toml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        config.load(tmp_path / "me.toml")


def test_base_cycle_of_two(tmp_path):
    (tmp_path / "a.toml").write_text('base = "b.toml"\n')
    (tmp_path / "b.toml").write_text('base = "a.toml"\n')
    with pytest.raises(ConfigError, match="leads back to itself"):
        config.load(tmp_path / "a.toml")


def test_fedbio_configs_update_every_client_every_round_as_the_paper():
    """FedBiO / FedBiOAcc (Li, Huang & Huang, Algorithms 2 and 3) update all M clients at every step;
    client sampling is an opt-in (--set algorithm.clients_per_round=...)."""
    loaded = {p: config.load(p) for p in SHIPPED if p.parent.name == "fedbio"}
    fedbio = {p: c for p, c in loaded.items() if c.algorithm.name in ("fedbio", "fedbioacc")}
    assert len(fedbio) >= 6
    sampled = [str(p) for p, c in fedbio.items() if c.algorithm.clients_per_round != c.problem.n_clients]
    assert not sampled, sampled
