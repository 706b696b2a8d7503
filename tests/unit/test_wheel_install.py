"""An installed wheel carries what ``fednest-mpi jobs render`` reads (its templates, the built-in sites).

The wheel is built offline (``pip wheel --no-build-isolation --no-index``, with the venv's
setuptools) from a copy of the package sources, installed with ``pip install --target`` into a
temporary folder and run with ``PYTHONPATH`` pointing there, from a folder outside the source tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
SWEEP = """
config = "configs/quadratic.toml"
output_dir = "out"
[set]
algorithm.outer_iterations = 2
[grid]
seed = [1, 2]
[resources]
tasks_per_node = 2
"""


def run(cmd, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=240, **kw)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))}: exit {res.returncode}\n{res.stdout}{res.stderr}"
    return res


def install_wheel(tmp_path: Path) -> Path:
    """Build the wheel from a copy of the sources (nothing is written into the tree) and install it
    into a fresh folder; that folder."""
    src = tmp_path / "sources"
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist, target = tmp_path / "dist", tmp_path / "site"
    run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, src])
    (wheel,) = dist.glob("fednest_mpi-*.whl")
    run([*PIP, "install", "--no-deps", "--no-index", "--target", target, wheel])
    return target


@pytest.mark.packaging  # make test-examples runs it, with the other wheel builds
def test_jobs_render_works_from_an_installed_wheel_outside_the_tree(tmp_path):
    target = install_wheel(tmp_path)
    work = tmp_path / "work"
    (work / "configs").mkdir(parents=True)
    shutil.copy(ROOT / "configs" / "quadratic.toml", work / "configs")
    (work / "s.toml").write_text(SWEEP)
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = run([sys.executable, "-c", "import fednest_mpi.jobs as j; print(j.__file__)"], cwd=work, env=env)
    assert Path(where.stdout.strip()).is_relative_to(target), where.stdout  # the installed copy, not the tree's
    for site in ("local", "example-cluster"):
        out = work / f"jobs-{site}"
        args = [] if site == "local" else ["--site", site]  # local is the default
        run([sys.executable, "-m", "fednest_mpi", "jobs", "render", "s.toml", "-o", out, *args], cwd=work, env=env)
        scripts = [out / "s.array.sbatch", out / "s.local.sh", *(out / "run" / f"seed{i}.sbatch" for i in (1, 2))]
        assert (out / "s.tasks").read_text().count("\n") == 2 and (out / "logs").is_dir()
        for script in scripts:
            assert f"# site {site} ({target}" in script.read_text(), script  # the site file of the install
            assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script
