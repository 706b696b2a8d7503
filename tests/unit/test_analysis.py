"""Post-processing (fednest_mpi.post): DataFrames, sweeps, text report and plots from real (small) run files."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from small_configs import make_config, write_run

from fednest_mpi import post
from fednest_mpi.errors import UsageError
from fednest_mpi.io.h5 import RunWriter, read_run
from fednest_mpi.post.plotting import _auto_log

ITERATIONS = 15
ALGORITHMS = ("fednest", "lfednest")
SEEDS = (0, 1)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(path, algorithm: str, seed: int, **algorithm_fields) -> None:
    """A real run written like `fednest-mpi run` does (1 rank, in process)."""
    cfg = make_config(
        seed=seed,
        algorithm={"name": algorithm, "outer_iterations": ITERATIONS, **algorithm_fields},
        run={"output": str(path), "progress": "never"},
    )
    write_run(path, cfg)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """fednest and lfednest x seeds 0, 1: four run files."""
    root = tmp_path_factory.mktemp("runs")
    paths = []
    for algorithm in ALGORITHMS:
        for seed in SEEDS:
            path = root / f"{algorithm}_s{seed}.h5"
            _write_run(path, algorithm, seed)
            paths.append(path)
    return paths


@pytest.fixture(scope="module")
def other_problem_run(tmp_path_factory):
    """A run file of another (classification-like) problem, with accuracy columns and no x_error."""
    path = tmp_path_factory.mktemp("other") / "classifier.h5"
    cols = {
        "iteration": ("k", "1"),
        "comm_rounds": ("rounds", "1"),
        "comm_bytes": ("bytes", "B"),
        "wall_time": ("t", "s"),
        "algorithm_time": ("t", "s"),
        "evaluation_time": ("t", "s"),
        "test_accuracy": ("acc", "1"),
        "test_loss": ("loss", "1"),
    }
    cfg = {
        "seed": 0,
        "problem": {"name": "classifier", "n_clients": 10},
        "algorithm": {"name": "fednest", "outer_iterations": 4},
    }
    writer = RunWriter(
        path,
        {
            "seed": 0,
            "problem": "classifier",
            "algorithm": "fednest",
            "mpi_size": 1,
            "config_json": __import__("json").dumps(cfg),
            "primary_metric": "test_accuracy",
        },
        cols,
    )
    for k, acc in enumerate([0.1, 0.6, 0.8, 0.7, 0.75]):
        writer.append(
            {
                "iteration": k,
                "comm_rounds": 3 * k,
                "comm_bytes": 1.5e6 * k,
                "wall_time": 0.1 * k,
                "algorithm_time": 0.01,
                "evaluation_time": 0.002,
                "test_accuracy": acc,
                "test_loss": 2.0 - acc,
            }
        )
    writer.close()
    return path


# ------------------------------------------------------------------------------------------------
# Loading


def test_load_run_round_trips_read_run(runs):
    df = post.load_run(runs[0])
    attrs, data = read_run(runs[0])
    assert list(df.columns)[0] == "iteration"
    assert set(df.columns) == set(data)
    assert len(df) == ITERATIONS + 1
    for name, values in data.items():
        np.testing.assert_array_equal(df[name].to_numpy(), values)
    assert df["iteration"].dtype == np.int64
    assert df.attrs["config"] == attrs["config"]
    assert df.attrs["seed"] == 0 and df.attrs["problem"] == "quadratic"


def test_flatten_config_dotted_names():
    flat = post.flatten_config(
        {"seed": 1, "algorithm": {"outer_lr": 0.2, "name": "fednest"}, "x": {"y": {"z": [1, 2]}}}
    )
    assert flat == {"seed": 1, "algorithm.outer_lr": 0.2, "algorithm.name": "fednest", "x.y.z": (1, 2)}


def test_config_differences_lists_only_differing_fields(runs):
    diffs = post.config_differences(runs)
    assert diffs == {"algorithm.name": ["fednest", "fednest", "lfednest", "lfednest"], "seed": [0, 1, 0, 1]}


def test_load_sweep_has_run_and_differing_config_columns(runs):
    df = post.load_sweep(runs)
    assert len(df) == len(runs) * (ITERATIONS + 1)
    assert list(df.columns[:3]) == ["run", "algorithm.name", "seed"]
    for common in ("algorithm.outer_lr", "problem.n_clients", "run.output", "problem.name"):
        assert common not in df.columns
    assert set(df["run"]) == {str(p) for p in runs}
    assert df["seed"].dtype.kind == "i"
    # usable for grouping by config values
    final = df[df["iteration"] == ITERATIONS].groupby("algorithm.name")["x_error"].mean()
    by_hand = np.mean([read_run(p)[1]["x_error"][-1] for p in runs[:2]])
    assert final["fednest"] == pytest.approx(by_hand)
    assert df.attrs["differences"] == ["algorithm.name", "seed"]


def test_single_path_and_directory_are_accepted(runs):
    assert len(post.load_sweep(str(runs[0]))) == ITERATIONS + 1
    assert set(post.load_sweep(runs[0].parent)["run"]) == {str(p) for p in runs}


def test_run_names_disambiguate_equal_stems(tmp_path):
    assert post.run_names(["a/b/run.h5", "a/c/run.h5", "x.h5"]) == ["b/run", "c/run", "x"]


# ------------------------------------------------------------------------------------------------
# Report


def _row(text: str, name: str) -> list[str]:
    """The cells of the first table line of run ``name``."""
    for line in text.splitlines():
        if line.split()[:1] == [name]:
            return line.split()
    raise AssertionError(f"no line for {name} in\n{text}")


def test_report_lists_each_run_with_final_and_best_values(runs):
    text = post.report(runs)
    assert max(len(line) for line in text.splitlines()) <= 100
    header = next(line for line in text.splitlines() if "x_error" in line)
    assert "outer_objective" in header and "hypergradient_norm" in header
    for path in runs:
        _, data = read_run(path)
        cells = _row(text, path.stem)
        assert post.format_number(data["x_error"][-1]) in cells
        assert post.format_number(data["x_error"].min()) in cells
        assert post.format_number(data["outer_objective"][-1]) in cells
        assert str(ITERATIONS) in cells
        algorithm = read_run(path)[0]["algorithm"]
        assert algorithm in cells
    # communication block: final rounds and human-readable bytes
    _, data = read_run(runs[0])
    lines = [line for line in text.splitlines() if line.startswith(runs[0].stem)]
    assert len(lines) == 2  # split into two blocks at 100 characters
    assert post.format_bytes(data["comm_bytes"][-1]) in lines[1]
    assert re.search(rf"\b{int(data['comm_rounds'][-1])}\b", lines[1])
    assert re.search(r"\d (ms|us|s)\b", lines[1])


def test_report_explicit_metrics_and_accuracy_best_is_max(other_problem_run):
    text = post.report([other_problem_run], metrics=["test_accuracy", "test_loss"])
    cells = _row(text, "classifier")
    # final 0.75, best accuracy 0.8 (max), best loss 1.2 (min)
    assert cells[cells.index("0.75") : cells.index("0.75") + 4] == ["0.75", "0.8", "1.25", "1.2"]
    assert "6 MB" in text and "12" in cells


def test_report_default_metrics_of_mixed_problems_shows_dash(runs, other_problem_run):
    text = post.report([runs[0], other_problem_run])
    assert "x_error" in text and "test_accuracy" in text
    assert "-" in _row(text, "classifier")


def test_report_groups_runs_without_at(runs):
    """`report -g algorithm.name`: one line per algorithm, final and best as mean ± sd over its seeds."""
    text = post.report(runs, metrics=["x_error"], group_by="algorithm.name")
    assert "seed" not in text.splitlines()[0] + text.splitlines()[1]
    for algorithm in ALGORITHMS:
        members = [read_run(p)[1]["x_error"] for p in runs if p.stem.startswith(algorithm + "_")]
        finals, bests = [m[-1] for m in members], [m.min() for m in members]
        cells = " ".join(_row(text, algorithm))
        for v in (finals, bests):
            assert f"{post.format_number(np.mean(v))} ± {post.format_number(np.std(v, ddof=1))}" in cells
        assert _row(text, algorithm)[1] == str(len(SEEDS))
    assert "in 2 group(s) of algorithm.name" in text.replace("\n", " ")


def test_report_across_algorithms_shows_what_the_runs_share(runs, tmp_path):
    """A FedBiO run beside FedNest runs: the fields that only one kind has are left out (not columns of
    '-'); a field both have that differs is shown."""
    fedbio = tmp_path / "fedbio.h5"
    _write_run(fedbio, "fedbio", 0, sync_period=2)
    text = post.report([*runs[:1], fedbio], metrics=["x_error"])
    words = set(" ".join(text.splitlines()[:2]).split())
    diffs = post.config_differences([runs[0], fedbio])
    shown = {f.rpartition(".")[2] for f, v in diffs.items() if None not in v}
    own = {f.rpartition(".")[2] for f, v in diffs.items() if None in v} - shown  # e.g. sync_period
    assert {"sync_period", "ihgp_resample_clients"} <= own and not own & words
    assert "name" in words and "-" not in _row(text, "fedbio")
    assert f"Not shown: {sum(None in v for v in diffs.values())} config field(s)" in text.replace("\n", " ")


def test_formatting_helpers():
    assert post.format_bytes(0) == "0 B"
    assert post.format_bytes(1234567) == "1.23 MB"
    assert post.format_bytes(44800) == "44.8 kB"
    assert post.format_seconds(0.0123) == "12.3 ms"
    assert post.format_seconds(2.5e-5) == "25 us"
    assert post.format_seconds(0.9996) == "1 s" and post.format_seconds(119.97) == "2 min"
    assert post.format_number(float("nan")) == "-"
    assert post.format_number(0.123456) == "0.1235"


# ------------------------------------------------------------------------------------------------
# Grouping


def test_group_mean_sd_equals_mean_by_hand(runs):
    frames = [post.load_run(p) for p in runs[:2]]  # fednest, seeds 0 and 1
    stats = post.group_mean_sd(frames, "x_error", "iteration")
    a, b = (f["x_error"].to_numpy() for f in frames)
    np.testing.assert_array_equal(stats.x, np.arange(ITERATIONS + 1))
    np.testing.assert_allclose(stats.mean, (a + b) / 2, rtol=0, atol=1e-15)
    np.testing.assert_allclose(stats.sd, np.abs(a - b) / np.sqrt(2), rtol=1e-12)
    assert (stats.n == 2).all()
    # comm_rounds of fednest is a deterministic schedule: same grid, no interpolation
    stats = post.group_mean_sd(frames, "x_error", "comm_rounds")
    np.testing.assert_array_equal(stats.x, frames[0]["comm_rounds"].to_numpy())
    np.testing.assert_allclose(stats.mean, (a + b) / 2, rtol=0, atol=1e-15)


def test_group_mean_sd_interpolates_different_grids_and_skips_nan():
    f1 = pd.DataFrame({"t": [0.0, 1.0, 2.0, 3.0], "m": [np.nan, 2.0, 4.0, 6.0]})
    f2 = pd.DataFrame({"t": [0.5, 1.5, 2.5], "m": [1.0, 3.0, 5.0]})
    stats = post.group_mean_sd([f1, f2], "m", "t")
    np.testing.assert_array_equal(stats.x, [0.5, 1.0, 1.5, 2.0, 2.5])
    # f1 has no value before t=1 (NaN), f2 is linear 2t
    np.testing.assert_allclose(stats.mean, [1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(stats.n, [1, 2, 2, 2, 2])
    assert np.isnan(stats.sd[0]) and stats.sd[1] == 0.0


# ------------------------------------------------------------------------------------------------
# Plots


def _is_png(path) -> bool:
    return path.stat().st_size > 5000 and path.read_bytes()[:8] == PNG_MAGIC


def test_plot_grouped_ungrouped_and_comm_rounds(runs, tmp_path):
    from matplotlib.figure import Figure

    fig = post.plot(runs, tmp_path / "grouped.png", group_by="algorithm.name")
    assert isinstance(fig, Figure) and _is_png(tmp_path / "grouped.png")
    post.plot(runs, tmp_path / "sub" / "runs.png")
    assert _is_png(tmp_path / "sub" / "runs.png")
    post.plot(runs, tmp_path / "rounds.png", x_axis="comm_rounds", group_by="algorithm.name", logy=True)
    post.plot(runs, tmp_path / "wall.png", x_axis="wall_time", group_by="algorithm.name")
    assert _is_png(tmp_path / "rounds.png") and _is_png(tmp_path / "wall.png")
    post.plot(runs, tmp_path / "multi.pdf", metric=["x_error", "outer_objective", "hypergradient_norm"])
    assert (tmp_path / "multi.pdf").read_bytes()[:5] == b"%PDF-"


def _texts(fig) -> dict:
    ax = fig.axes[0]
    return {
        "title": fig.get_suptitle(),
        "x": ax.get_xlabel(),
        "y": ax.get_ylabel(),
        "legend": [t.get_text() for t in ax.get_legend().get_texts()],
        "yscale": ax.get_yscale(),
        "xscale": ax.get_xscale(),
    }


def test_figure_words_come_from_the_run_files(runs, tmp_path):
    """The y label is the column's stored description and unit, the legend names the algorithms as the
    paper does, the title says what is drawn in words; no file is written without ``out``."""
    from fednest_mpi.io.h5 import read_run

    fig = post.plot(runs, metric="x_error", group_by="algorithm.name", smooth=3)
    words = _texts(fig)
    description = read_run(runs[0])[0]["columns"]["x_error"]["description"]
    assert words["y"] == "\u2016x - x*\u2016" and description.startswith("||x - x*|| (")
    assert words["x"] == "outer iteration"
    assert words["legend"] == ["FedNest", "LFedNest"]
    assert words["title"] == "Quadratic bilevel problem: mean \u00b1 sd over 2 seeds, 3-iteration running mean"
    assert "algorithm.name" not in words["title"]
    assert list(tmp_path.iterdir()) == []


def test_figure_options_title_labels_size_scales_and_vector_output(runs, tmp_path):
    fig = post.plot(
        runs,
        tmp_path / "f.svg",
        metric="x_error",
        group_by="algorithm.name",
        title="Quadratic, M = 20",
        xlabel="round k",
        ylabel="distance to x*",
        size=(3.5, 2.6),
        logy=False,
        logx=True,
        labels={"fednest": "FedNest (ours)"},
    )
    words = _texts(fig)
    assert (words["title"], words["x"], words["y"]) == ("Quadratic, M = 20", "round k", "distance to x*")
    assert words["legend"] == ["FedNest (ours)", "LFedNest"]
    assert (words["xscale"], words["yscale"]) == ("log", "linear")
    assert tuple(fig.get_size_inches()) == (3.5, 2.6)
    assert (tmp_path / "f.svg").read_text().lstrip().startswith("<?xml") and "FedNest (ours)" in (
        tmp_path / "f.svg"
    ).read_text()
    assert _texts(post.plot(runs, metric="x_error", title=""))["title"] == ""
    assert post.plot(runs, metric="x_error", legend="none").axes[0].get_legend() is None
    for where in ("right", "below"):
        outside = post.plot(runs, metric=["x_error", "outer_objective"], group_by="seed", legend=where)
        assert [a.get_legend() for a in outside.axes] == [None, None] and len(outside.legends) == 1
    with pytest.raises(UsageError, match="legend: 'above' is not one of best, right, below, none"):
        post.plot(runs, legend="above")
    with pytest.raises(UsageError, match="size: expected"):
        post.plot(runs, size=(0, 3))
    with pytest.raises(UsageError, match="ylabel: 2 labels for 1 metrics"):
        post.plot(runs, metric="x_error", ylabel=["a", "b"])


def test_plot_labels_fields_and_values_in_words():
    from fednest_mpi.post.labels import axis_label, group_label, problem_label

    assert group_label(["algorithm.name", "problem.partition"], ("lfednest", "shards")) == "LFedNest, non-iid (shards)"
    assert group_label(["algorithm.clients_per_round"], (50,)) == "clients per round = 50"
    assert group_label(["algorithm.outer_lr", "seed"], (0.05, 2)) == "outer step size = 0.05, seed 2"
    assert group_label(["problem.tune_loss"], (False,)) == "cross-entropy (untuned)"
    assert group_label(["algorithm.ihgp_mode"], ("truncated",)) == "ihgp mode: truncated"
    assert group_label(["algorithm.name"], ("my_pkg.mod:MyAlgorithm",)) == "MyAlgorithm"
    assert group_label(["algorithm.name", "seed"], ("fednest", 1), {"fednest, 1": "mine"}) == "mine"
    assert problem_label({"problem.name": "hyper_representation", "problem.dataset": "fashion"}) == (
        "Hyper-representation, Fashion-MNIST"
    )
    assert axis_label("test_accuracy", {"description": "accuracy on the 10k test set", "units": "%"}) == (
        "Accuracy on the 10k test set [%]"
    )
    assert axis_label("my_metric", {}) == "my_metric"
    assert (
        axis_label("x_sq_error", {"description": "||x - x*||^2 (Figure 4)", "units": "1"}) == "\u2016x - x*\u2016\u00b2"
    )
    assert axis_label("comm_rounds", {"description": "cumulative rounds", "units": "1"}) == "communication rounds"


def test_plot_and_checkpoint_table_default_to_the_primary_metric(other_problem_run, tmp_path):
    """A run whose problem has no x_error (MNIST-like) plots and tabulates without naming a metric."""
    fig = post.plot([other_problem_run], tmp_path / "acc.png")
    assert fig.axes[0].get_ylabel() == "Acc" and _is_png(tmp_path / "acc.png")
    table = post.checkpoint_table([other_problem_run], None, at=[2])
    assert table.splitlines()[2].split("|")[3].strip() == "0.8"
    with pytest.raises(UsageError, match=r"--at 9, 12: no run reaches these iterations.*up to 4"):
        post.checkpoint_table([other_problem_run], None, at=[9, 12])


def test_auto_log_scale_only_for_errors_spanning_decades():
    assert _auto_log("x_error", [np.array([1.0, 1e-3])])
    assert not _auto_log("x_error", [np.array([1.0, 0.5])])
    assert not _auto_log("outer_objective", [np.array([1.0, 1e-3])])
    assert not _auto_log("hypergradient_norm", [np.array([1.0, 0.0])])


# ------------------------------------------------------------------------------------------------
# Usage errors


def test_unknown_metric_lists_available_and_suggests(runs, tmp_path):
    with pytest.raises(
        UsageError, match=r"'x_eror' is not recorded.*did you mean 'x_error'.*available: .*outer_objective"
    ):
        post.plot(runs, tmp_path / "x.png", metric="x_eror")
    with pytest.raises(UsageError, match="did you mean 'hypergradient_norm'"):
        post.report(runs, metrics=["hypergradient_nrm"])
    with pytest.raises(UsageError, match="x_axis 'comm_round' .*did you mean 'comm_rounds'"):
        post.plot(runs, tmp_path / "x.png", x_axis="comm_round")


def test_unknown_group_by_field(runs, tmp_path):
    with pytest.raises(
        UsageError, match=r"group_by 'algorithm.nme' .*did you mean 'algorithm.name'.*differ.*algorithm.name, seed"
    ):
        post.plot(runs, tmp_path / "x.png", group_by="algorithm.nme")
    assert not (tmp_path / "x.png").exists()


def test_empty_paths_and_missing_file(tmp_path):
    for call in (post.load_sweep, post.config_differences, post.report):
        with pytest.raises(UsageError, match="no run files given"):
            call([])
    with pytest.raises(UsageError, match="no run files given"):
        post.plot([], tmp_path / "x.png")
    with pytest.raises(UsageError, match="does not exist"):
        post.load_run(tmp_path / "missing.h5")


def test_mixed_problems_with_metric_only_one_has(runs, other_problem_run, tmp_path):
    with pytest.raises(
        UsageError,
        match=r"'x_error' is recorded by fednest_s0 \[quadratic\] but not by classifier \[classifier\].*mix problems",
    ):
        post.plot([runs[0], other_problem_run], tmp_path / "x.png", metric="x_error")
    with pytest.raises(UsageError, match="not by classifier"):
        post.report([runs[0], other_problem_run], metrics=["x_error"])


def test_bad_plot_suffix_and_all_nan_metric(runs, tmp_path):
    with pytest.raises(UsageError, match=r"ending in \.png, \.pdf, \.svg"):
        post.plot(runs, tmp_path / "x.jpg2")
    lfednest = [p for p in runs if p.stem.startswith("lfednest")]
    with pytest.raises(UsageError, match="no finite value"):
        post.plot(lfednest, tmp_path / "x.png", metric="hypergradient_estimate_norm")


def test_import_is_cheap_and_apart_from_the_run_path(runs):
    """Importing post loads none of pandas, matplotlib, torch, MPI or the simulation, and reading
    and tabulating runs loads no torch, MPI or simulation either; the run path (runner, and with it
    federation, algorithms, problems, checkpoint, io) does not load post."""
    import subprocess
    import sys

    run_path = (
        "torch",
        "mpi4py.MPI",
        "fednest_mpi.runner",
        "fednest_mpi.federation",
        "fednest_mpi.algorithms",
        "fednest_mpi.problems",
    )
    code = (
        f"import sys, fednest_mpi.post as post; print([m for m in {run_path + ('pandas', 'matplotlib')!r} "
        f"if m in sys.modules]); post.load_run({str(runs[0])!r}); post.report({[str(p) for p in runs]!r}); "
        f"print([m for m in {run_path!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["[]", "[]"]
    code = "import sys, fednest_mpi.runner, fednest_mpi.cli; print([m for m in sys.modules if 'fednest_mpi.post' in m])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_running_mean_is_a_trailing_window_that_skips_nan():
    a = np.array([1.0, 3.0, np.nan, 5.0, 7.0])
    np.testing.assert_allclose(post.running_mean(a, 2), [1.0, 2.0, 3.0, 5.0, 6.0])
    np.testing.assert_allclose(post.running_mean(a, 3), [1.0, 2.0, 2.0, 4.0, 6.0])
    np.testing.assert_array_equal(post.running_mean(a, 1), a)


def test_checkpoint_table_is_mean_and_sd_over_seeds_by_hand(runs):
    table = post.checkpoint_table(runs, "x_error", at=[5, 10], group_by=["algorithm.name"], smooth=3)
    lines = table.splitlines()
    assert len(lines) == 2 + len(ALGORITHMS)
    for algorithm in ALGORITHMS:
        members = [p for p in runs if p.stem.startswith(algorithm + "_")]
        at10 = [post.running_mean(read_run(p)[1]["x_error"], 3)[10] for p in members]
        row = next(line for line in lines if f" {algorithm} " in line)
        cells = [c.strip() for c in row.split("|")]
        assert cells[2] == str(len(members))
        assert cells[4] == f"{post.format_number(np.mean(at10))} ± {post.format_number(np.std(at10, ddof=1))}"


def test_checkpoint_table_says_how_many_runs_of_a_row_reach_an_iteration(runs, tmp_path):
    """A run that ended early (diverged, cut off) drops out of the mean past its end: the cell says so."""
    short = tmp_path / "fednest_short.h5"
    _write_run(short, "fednest", 7, outer_iterations=6)
    table = post.checkpoint_table([*runs, short], "x_error", at=[5, 10], group_by=["algorithm.name"])
    row = next(line for line in table.splitlines() if " fednest " in line)
    cells = [c.strip() for c in row.split("|")]
    members = [p for p in runs if p.stem.startswith("fednest_")]
    at10 = [read_run(p)[1]["x_error"][10] for p in members]
    assert cells[2] == str(len(members) + 1) and "of" not in cells[3]  # all three reach 5
    assert cells[4] == (
        f"{post.format_number(np.mean(at10))} ± {post.format_number(np.std(at10, ddof=1))} "
        f"({len(members)} of {len(members) + 1})"
    )


def test_plot_and_table_group_by_two_fields(runs, tmp_path):
    fig = post.plot(runs, tmp_path / "two.png", metric="x_error", group_by=["algorithm.name", "seed"], smooth=5)
    assert (tmp_path / "two.png").read_bytes().startswith(PNG_MAGIC)
    # colour by algorithm, line style by seed; one run per group: no band, no counts
    lines = fig.axes[0].get_lines()
    assert [(line.get_color(), line.get_linestyle()) for line in lines] == [
        ("C0", "-"), ("C0", "--"), ("C1", "-"), ("C1", "--")
    ]  # fmt: skip
    assert _texts(fig)["legend"] == ["FedNest, seed 0", "FedNest, seed 1", "LFedNest, seed 0", "LFedNest, seed 1"]
    table = post.checkpoint_table(runs, "x_error", at=[3], group_by=["algorithm.name", "seed"])
    assert len(table.splitlines()) == 2 + len(ALGORITHMS) * len(SEEDS)
    assert all(row.split("|")[2].strip() == "1" for row in table.splitlines()[2:])


def test_group_mean_sd_keeps_runs_until_they_stop():
    long = {"iteration": np.arange(5), "m": np.array([1.0, 2.0, 3.0, 4.0, 5.0])}
    short = {"iteration": np.arange(3), "m": np.array([3.0, 4.0, 5.0])}  # e.g. diverged after iteration 2
    stats = post.group_mean_sd([long, short], "m")
    np.testing.assert_array_equal(stats.x, np.arange(5))
    np.testing.assert_allclose(stats.mean, [2.0, 3.0, 4.0, 4.0, 5.0])
    np.testing.assert_array_equal(stats.n, [2, 2, 2, 1, 1])
    assert np.isnan(stats.sd[3:]).all()


@pytest.mark.parametrize("group_by", [None, "seed"])
def test_plot_joins_a_sparsely_recorded_metric_into_one_line(tmp_path, group_by):
    """A metric recorded every 3rd iteration (NaN between, as run.train_eval_every writes it) is one
    connected line: in the SVG one path with a single move-to, not a dash per recorded value."""
    path = tmp_path / "sparse.h5"
    cols = {
        "iteration": ("k", "1"),
        "comm_rounds": ("rounds", "1"),
        "wall_time": ("t", "s"),
        "inner_loss": ("loss", "1"),
    }
    cfg = {"seed": 0, "problem": {"name": "classifier"}, "algorithm": {"name": "fedavg"}}
    writer = RunWriter(
        path,
        {
            "seed": 0,
            "problem": "classifier",
            "algorithm": "fedavg",
            "mpi_size": 1,
            "config_json": __import__("json").dumps(cfg),
        },
        cols,
    )
    for k in range(10):
        writer.append(
            {
                "iteration": k,
                "comm_rounds": k,
                "wall_time": 0.1 * k,
                "inner_loss": 2.0 / (k + 1) if k % 3 == 0 else np.nan,
            }
        )
    writer.close()
    post.plot([path], tmp_path / "sparse.svg", metric="inner_loss", group_by=group_by, smooth=1)
    svg = (tmp_path / "sparse.svg").read_text()
    data_line = re.findall(r'<path d="([^"]+)"[^>]*style="fill: none; stroke: #1f77b4', svg, flags=re.S)[
        0
    ]  # then the legend's
    assert data_line.count("M") == 1 and data_line.count("L") == 3  # 4 recorded values (k = 0, 3, 6, 9), joined


def test_a_single_run_is_named_in_the_title_without_a_legend(runs):
    fig = post.plot(runs[:1], metric="x_error")
    assert fig.get_suptitle() == "Quadratic bilevel problem: FedNest, seed 0" and fig.axes[0].get_legend() is None


def test_every_built_in_algorithm_has_its_papers_name():
    from fednest_mpi import config
    from fednest_mpi.post.labels import ALGORITHM_LABELS

    builtin = [n for n in config.ALGORITHMS.names() if ":" not in n and n not in config.ALGORITHMS.entry_points()]
    assert set(builtin) <= set(ALGORITHM_LABELS), set(builtin) - set(ALGORITHM_LABELS)


def test_constant_runs_are_drawn_as_a_dashed_line_at_their_final_value(runs):
    """``plot(constant=[FIELD=VALUE])`` (Fig. 3's untuned baseline): the matching group is one black dashed
    horizontal line at the mean over its runs of each one's last value; the other groups stay curves."""
    fig = post.plot(runs, metric="x_error", group_by="algorithm.name", constant=["algorithm.name=lfednest"])
    ax = fig.axes[0]
    finals = [read_run(p)[1]["x_error"][-1] for p in runs if "lfednest" in str(p)]
    flat = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(flat) == 1 and flat[0].get_color() == "k"
    assert list(flat[0].get_ydata()) == pytest.approx([np.mean(finals)] * 2)
    assert any(len(line.get_xdata()) > 2 for line in ax.get_lines())  # FedNest is still a curve
    assert _texts(fig)["legend"] == ["FedNest", "LFedNest (final value)"]
    with pytest.raises(UsageError, match=r"constant: expected FIELD=VALUE"):
        post.plot(runs, metric="x_error", constant=["lfednest"])


def test_mean_and_sd_of_huge_values_are_finite_and_quiet():
    """A diverging run's 1e200 makes numpy's square overflow (a RuntimeWarning on the table's stderr): the sd is
    then taken on the values scaled by their largest magnitude, and equals the plain one where both exist."""
    import warnings

    from fednest_mpi.post.tables import format_mean_sd, sample_sd

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert format_mean_sd([1e200, -1e200, 1e200]) == "3.333e+199 ± 1.155e+200"
        assert sample_sd(np.array([1e200, 3e200])) == pytest.approx(np.sqrt(2) * 1e200, rel=1e-15)
    assert sample_sd(np.array([1.0, 2.0, 4.0])) == np.array([1.0, 2.0, 4.0]).std(ddof=1)
