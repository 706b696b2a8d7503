"""The figure scripts of jobs/figures: shell syntax, help (exit 0) and usage errors (exit 2), without running sweeps."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

FIGURES = Path(__file__).resolve().parents[2] / "jobs" / "figures"
SHELL = sorted(FIGURES.glob("*.sh"))
PYTHON = sorted(FIGURES.glob("*.py"))


@pytest.mark.parametrize("script", SHELL, ids=lambda p: p.name)
def test_shell_scripts_parse_and_answer_help(script):
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if script.name == "figure.sh":
        return  # sourced by the figNN scripts, not run alone
    done = subprocess.run(["bash", str(script), "-h"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage" in done.stdout.lower()
    bad = subprocess.run(["bash", str(script), "-Z"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr.lower()


@pytest.mark.parametrize("script", PYTHON, ids=lambda p: p.name)
def test_python_helpers_print_usage_and_exit_2_without_arguments(script):
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "usage" in done.stdout


def test_fairness_retrain_names_a_missing_config():
    done = subprocess.run(
        ["bash", str(FIGURES / "fairness_retrain.sh"), "-c", "no/such.toml"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "-c: no config file 'no/such.toml'" in done.stderr


def _fake_fig2a_runs(folder: Path, iterations: int) -> None:
    """Run files shaped like fig2a's (algorithm x partition x seed, test_accuracy), without MNIST."""
    import json

    from fednest_mpi.io.h5 import RunWriter

    columns = {"iteration": ("k", "1"), "comm_rounds": ("rounds", "1"), "wall_time": ("t", "s")}
    columns["test_accuracy"] = ("accuracy on the 10k test set", "%", True)
    for algorithm in ("fednest", "lfednest"):
        for partition in ("iid", "shards"):
            for seed in (0, 1):
                cfg = {
                    "seed": seed,
                    "problem": {"name": "hyper_representation", "partition": partition},
                    "algorithm": {"name": algorithm, "outer_iterations": iterations},
                }
                attrs = {"seed": seed, "problem": "hyper_representation", "algorithm": algorithm, "mpi_size": 1}
                path = folder / f"{algorithm}_{partition}_seed{seed}.h5"
                writer = RunWriter(path, {**attrs, "config_json": json.dumps(cfg)}, columns)
                for k in range(iterations + 1):
                    writer.append({"iteration": k, "comm_rounds": 3 * k, "wall_time": 0.1 * k,
                                   "test_accuracy": 10.0 + k * (5 + seed)})  # fmt: skip
                writer.close()


def test_a_shortened_figure_is_tabulated_at_the_iterations_it_reaches(tmp_path):
    """`fig2a.sh -k 5`: the table has a column for iteration 5 and none of its rows is all '-'."""
    runs, figs, bin_dir = tmp_path / "runs", tmp_path / "figs", tmp_path / "bin"
    runs.mkdir()
    bin_dir.mkdir()
    _fake_fig2a_runs(runs, 5)
    (bin_dir / "fednest-mpi").write_text(f'#!/bin/sh\nexec {sys.executable} -m fednest_mpi "$@"\n')
    (bin_dir / "fednest-mpi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "VIRTUAL_ENV": str(tmp_path)}
    script = FIGURES / "fig2a.sh"
    done = subprocess.run(["bash", str(script), "-p", "-k", "5", "-r", str(runs), "-o", str(figs)],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    head, _, *rows = (figs / "fig2a_paper_table.md").read_text().splitlines()
    assert [c.strip() for c in head.split("|")][3:-2] == ["5"]
    assert len(rows) == 4 and all(row.split("|")[3].strip() != "-" for row in rows)
    assert (figs / "fig2a_paper_iteration.png").stat().st_size > 5000
    bad = subprocess.run(["bash", str(script), "-r", str(runs)], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "-r RUN_DIR goes with -p" in bad.stderr


def test_a_figure_goes_to_a_cluster_as_an_array_and_a_plot_job_after_it(tmp_path):
    """`fig2c.sh -P authors_code -s SITE`: the preset's array script is submitted, then `fig2c.sh -p` with
    `--dependency=afterany` on it; `-k` with `-s` is refused (the cluster runs the full length)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "sbatch.calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho 4242\n')
    (bin_dir / "sbatch").chmod(0o755)
    (bin_dir / "fednest-mpi").write_text(f'#!/bin/sh\nexec {sys.executable} -m fednest_mpi "$@"\n')
    (bin_dir / "fednest-mpi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "VIRTUAL_ENV": str(tmp_path)}
    script = FIGURES / "fig2c.sh"
    done = subprocess.run(["bash", str(script), "-P", "authors_code", "-s", "example-cluster"],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    array, plot = calls.read_text().splitlines()
    assert array == "--parsable runs/jobs/fig2c_authors_code/fig2c_authors_code.array.sbatch"
    assert "--dependency=afterany:4242" in plot and plot.endswith(f"bash {script} -P authors_code -p -o figs")
    bad = subprocess.run(["bash", str(script), "-s", "example-cluster", "-k", "5"],
                         capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert bad.returncode == 2 and "drop -k" in bad.stderr
    unknown = subprocess.run(["bash", str(script), "-P", "paperr", "-p"], capture_output=True, text=True, env=env)
    assert unknown.returncode == 2 and "no preset 'paperr'" in unknown.stderr
