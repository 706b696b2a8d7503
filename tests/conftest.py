"""Shared fixtures: small configs of the quadratic problem (tests/small_configs.py), data requirements."""

from __future__ import annotations

import pytest
from small_configs import make_config


@pytest.fixture
def small_config():
    return make_config


def pytest_runtest_setup(item):
    """``@requires(folder)`` (tests/shared_data.py): skip, or fail under FEDNEST_REQUIRE_DATA=1, without the data."""
    from shared_data import DATA, need

    for mark in item.iter_markers(name="needs_data"):
        need(DATA / mark.args[0])
