"""Sweep presets (``[presets.NAME]``, ``jobs render/list --preset``) and the figures' two presets, ``paper``
and ``authors_code``: their values against the paper's text and the authors' scripts
(../shared/notes/fednest-reference.md), as the runs of each figure would load them."""

from __future__ import annotations

from pathlib import Path

import pytest

from fednest_mpi import config, jobs
from fednest_mpi.cli import main
from fednest_mpi.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ["fig2a", "fig2b", "fig2c", "fig3a", "fig3b", "fig4", "fig5", "fig6"]
PRESETS = ["paper", "authors_code"]


def _runs(figure: str, preset: str) -> list[tuple[jobs.Task, config.RunConfig]]:
    """Every run of a figure's preset with its config as `fednest-mpi run` would load it."""
    sweep = jobs.load_sweep(ROOT / "jobs" / "sweeps" / f"{figure}.toml", preset)
    tasks = jobs.expand(sweep)
    return [(t, config.load(ROOT / t.config, list(t.overrides))) for t in tasks]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("figure", FIGURES)
def test_every_figure_has_both_presets_whose_runs_validate(figure, preset):
    runs = _runs(figure, preset)
    assert len(runs) >= 6
    assert all(t.output.startswith(f"runs/{figure}/{preset}/") for t, _ in runs)
    seeds = {cfg.seed for _, cfg in runs}
    assert seeds == {0, 1, 2}  # three seeds, mean +- sd


def test_preset_lays_its_fields_over_the_file(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        'config = "configs/quadratic.toml"\noutput_dir = "runs/s"\n'
        "[set]\nalgorithm.outer_lr = 0.1\nalgorithm.inner_lr = 0.2\n"
        "[grid]\nseed = [0, 1]\nalgorithm.outer_iterations = [3, 4]\n"
        '[presets.a]\ndescription = "one"\nconfig = "configs/quadratic_sampled.toml"\n'
        "[presets.a.set]\nalgorithm.outer_iterations = 7\n"
        "[presets.a.grid]\nalgorithm.outer_lr = [0.3, 0.4]\n"
    )
    plain, a = jobs.load_sweep(sweep), jobs.load_sweep(sweep, "a")
    assert len(jobs.expand(plain)) == 4 and plain.presets == {"a": "one"}
    assert (a.name, a.output_dir, a.config) == ("s_a", "runs/s/a", "configs/quadratic_sampled.toml")
    assert a.set == {"algorithm.inner_lr": 0.2, "algorithm.outer_iterations": 7}  # the grid's field became fixed
    assert a.grid == {"seed": (0, 1), "algorithm.outer_lr": (0.3, 0.4)}  # the set's field became a grid
    with pytest.raises(UsageError, match=r"presets: no preset 'b' in this sweep \(its presets: a\)"):
        jobs.load_sweep(sweep, "b")


def test_cli_names_an_unknown_preset_in_one_line(capsys):
    assert main(["jobs", "list", str(ROOT / "jobs/sweeps/fig4.toml"), "--preset", "paperr"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no preset 'paperr'" in err and "did you mean 'paper'" in err


def test_hyperrep_presets_split_as_the_paper_and_as_the_authors_code():
    # paper section 4.1: 300 train / 300 validation per client for both partitions; 5 epochs of batch 64
    for _, cfg in _runs("fig2a", "paper"):
        p, a = cfg.problem, cfg.algorithm
        assert (p.val_fraction, a.inner_local_steps, p.batch_size, a.neumann_steps, a.inner_rounds) == (
            0.5,
            25,
            64,
            5,
            1,
        )
        assert (a.outer_local_steps, a.clients_per_round, p.n_clients, p.dropout) == (1, 10, 100, 0.0)
    # the authors' scripts: iid 300 / 300, non-iid 480 / 120, Dropout(0.5)
    split = {cfg.problem.partition: (cfg.problem.val_fraction, cfg.algorithm.inner_local_steps)
             for _, cfg in _runs("fig2a", "authors_code")}  # fmt: skip
    assert split == {"iid": (0.5, 25), "shards": (0.2, 40)}
    assert {cfg.problem.dropout for _, cfg in _runs("fig5", "authors_code")} == {0.5}
    assert {cfg.algorithm.name for _, cfg in _runs("fig5", "paper")} == {"lfednest", "lfednest_svrg", "lfednest_nonalt"}


def test_fig6_couples_alpha_and_eta_only_in_the_authors_code_preset():
    alphas = [0.0075, 0.005, 0.0025, 0.001]
    paper, authors = _runs("fig6", "paper"), _runs("fig6", "authors_code")
    assert sorted({c.algorithm.outer_lr for _, c in paper}) == sorted(alphas)
    assert {c.algorithm.neumann_scale for _, c in paper} == {0.01}
    assert all(c.algorithm.neumann_scale == c.algorithm.outer_lr for _, c in authors)
    assert {c.problem.partition for _, c in paper + authors} == {"shards"}


def test_losstuning_presets_and_the_non_federated_baseline():
    for preset in PRESETS:
        runs = _runs("fig3a", preset)
        pooled = [c for _, c in runs if c.problem.n_clients == 1]
        assert len(pooled) == 3 and all(c.algorithm.clients_per_round == 1 and c.problem.tune_loss for c in pooled)
        untuned = [c for _, c in runs if not c.problem.tune_loss]
        assert len(untuned) == 6 and all(c.problem.n_clients == 100 for c in untuned)
    for _, cfg in _runs("fig3a", "paper"):  # section 4.2: 80 / 20, 784-200-100-10; appendix H: batch 64, N 5, T 1
        p, a = cfg.problem, cfg.algorithm
        assert (p.val_fraction, p.hidden1, p.hidden2, p.batch_size, a.neumann_steps, a.inner_rounds) == (
            0.2, 200, 100, 64, 5, 1)  # fmt: skip
    for _, cfg in _runs("fig3b", "authors_code"):  # reproduce/fig3.sh and main_imbalance.py
        p, a = cfg.problem, cfg.algorithm
        assert (p.hidden2, p.batch_size, a.neumann_steps, a.inner_rounds, a.inner_lr) == (0, 10, 3, 3, 0.01)
        assert a.outer_lr == a.neumann_scale == 0.02
        assert (p.val_fraction, a.inner_local_steps) == ((0.5, 40) if p.partition == "iid" else (0.2, 60))


def test_fig4_runs_lfednest_with_the_minimax_estimator_and_the_notebook_preset():
    paper = _runs("fig4", "paper")
    hyper = {c.algorithm.name: c.algorithm.hypergradient for _, c in paper if c.algorithm.name != "fedavg_s"}
    assert hyper == {"fednest": "direct", "lfednest": "direct"}  # eq. (9) / Algorithm 5's minimax line
    settings = {(c.algorithm.clients_per_round, c.heterogeneity.local_work) for _, c in paper}
    assert settings == {(1000, "full"), (1000, "uniform"), (50, "full"), (50, "uniform")}
    assert {c.problem.outer_regularization for _, c in paper} == {10.0}  # lambda of the paper's text
    for _, c in _runs("fig4", "authors_code"):  # minmax_synthetic.ipynb
        a = c.algorithm
        assert (c.problem.outer_regularization, a.clients_per_round, c.problem.n_clients) == (0.1, 50, 1000)
        assert (a.outer_iterations, a.inner_lr, a.outer_lr) == (200, 0.001, 0.001)
        if a.name != "fedavg_s":
            assert (a.hypergradient, a.inner_rounds, a.inner_local_steps, a.outer_local_steps) == (
                "direct",
                10,
                50,
                500,
            )
        else:
            assert a.inner_local_steps == 500


def test_the_authors_fedihgp_defect_is_an_opt_in_preset_only():
    """Default estimator everywhere; the 1/k-weighted FedIHGP only under fig2a's -P authors_estimator."""
    for figure in FIGURES:
        for preset in PRESETS:
            assert {c.algorithm.hypergradient_estimator for _, c in _runs(figure, preset)
                    if hasattr(c.algorithm, "hypergradient_estimator")} <= {"neumann"}  # fmt: skip
    opt_in = {(c.algorithm.name, c.algorithm.hypergradient_estimator) for _, c in _runs("fig2a", "authors_estimator")}
    assert opt_in == {("fednest", "authors_neumann"), ("lfednest", "neumann")}
