"""The figure scripts of jobs/figures: shell syntax, help (exit 0) and usage errors (exit 2), without running sweeps."""

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
