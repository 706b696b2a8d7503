"""The live-SLURM tests (``@pytest.mark.cluster``): skipped, loudly, unless a scheduler answers.

``make test-cluster`` brings up the throw-away one-node SLURM of ``jobs/ci/slurm.sh``, runs these
tests with ``SLURM_CONF`` pointing at it, and stops it. By hand::

    dir=$(bash jobs/ci/slurm.sh up) && SLURM_CONF=$dir/slurm.conf .venv/bin/python -m pytest -q tests/cluster
    bash jobs/ci/slurm.sh down "$dir"
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def slurm_problem() -> str | None:
    """Why no SLURM can be used here, or None when one answers."""
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        return "SLURM_CONF is not set"
    if not os.path.isfile(conf):
        return f"SLURM_CONF={conf} does not exist"
    if not shutil.which("sbatch"):
        return "no sbatch on PATH"
    try:
        res = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"sinfo failed: {exc}"
    states = res.stdout.split()
    if res.returncode != 0 or not any(s.rstrip("*~#") in ("idle", "mixed", "allocated") for s in states):
        return f"sinfo answers {res.returncode}: {(res.stdout + res.stderr).strip()[:200]!r}, no usable node"
    return None


_SKIPPED: list[str] = []


def pytest_collection_modifyitems(config, items):
    cluster_items = [item for item in items if item.get_closest_marker("cluster")]
    if not cluster_items:
        return
    problem = slurm_problem()
    if problem is None:
        return
    reason = f"NO LIVE SLURM ({problem}): the cluster tests did not run; `make test-cluster` starts one and runs them"
    _SKIPPED.append(f"{len(cluster_items)} cluster tests SKIPPED: {reason}")
    for item in cluster_items:
        item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter):
    for line in _SKIPPED:
        terminalreporter.write_sep("!", line, yellow=True, bold=True)
