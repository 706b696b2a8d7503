"""Shared fixtures: small configs of the quadratic problem (tests/small_configs.py), data requirements."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from small_configs import make_config

LAUNCHERS = {"mpiexec", "mpirun", "srun"}  # what a test marked ``processes`` may start (make test-unit runs none)


@pytest.fixture
def small_config():
    return make_config


def pytest_collection_modifyitems(items):
    """Long tests (``@pytest.mark.slow``) first, in a stable sort. pytest-xdist hands tests to its workers in this
    order, so a long test collected last (the tutorial, say) would leave one worker running alone at the end of
    its tier; started first, it runs while the other worker takes the many short ones (longest-first scheduling)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_runtest_setup(item):
    """``@requires(folder)`` (tests/shared_data.py): skip, or fail under FEDNEST_REQUIRE_DATA=1, without the data."""
    from shared_data import DATA, need

    for mark in item.iter_markers(name="needs_data"):
        need(DATA / mark.args[0])


@pytest.fixture(autouse=True)
def _launchers_need_the_processes_mark(request, monkeypatch):
    """A test that starts ``mpiexec`` (or mpirun, srun) must be marked ``processes`` or ``packaging``:
    ``make test-unit`` leaves those out, so that its tier stays free of MPI launches (it fails here otherwise)."""
    if any(request.node.get_closest_marker(m) for m in ("processes", "packaging", "cluster")):
        return
    popen_init = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kw):
        first = args if isinstance(args, (str, bytes, Path)) else next(iter(args), "")
        name = Path(str(first).split()[0] if isinstance(first, str) and first.strip() else str(first)).name
        if name in LAUNCHERS:
            pytest.fail(f"{request.node.nodeid} starts {name}: mark it @pytest.mark.processes", pytrace=False)
        popen_init(self, args, *rest, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
