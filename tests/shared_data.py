"""Where the tests find the real data sets: $FEDNEST_DATA, else ../shared/data beside the checkout."""

import os
from pathlib import Path

import pytest

DATA = Path(os.environ.get("FEDNEST_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


def requires(folder: str):
    """Skip a test module or test when DATA/folder is absent (a machine without the shared data)."""
    return pytest.mark.skipif(not (DATA / folder).is_dir(), reason=f"{folder} not found under {DATA}; set FEDNEST_DATA")
