"""What README.md and docs/hdf5.md say about the run file is true of a default run: the groups, the
attributes and the /iterations columns they name, read_run's return type, and the progress line and
report of the problem's declared metrics."""

import json
import logging
import re
from pathlib import Path

import h5py
import pytest

from fednest_mpi import config, post
from fednest_mpi.comm import SerialComm
from fednest_mpi.io.clients import read_snapshots
from fednest_mpi.io.h5 import read_run
from fednest_mpi.session import Session

ROOT = Path(__file__).resolve().parents[2]
HDF5_DOC = (ROOT / "docs" / "hdf5.md").read_text()
README = (ROOT / "README.md").read_text()


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The README's first run (configs/quadratic.toml, every default), cut to 3 iterations."""
    out = tmp_path_factory.mktemp("default") / "quadratic.h5"
    cfg = config.load(ROOT / "configs" / "quadratic.toml", ["algorithm.outer_iterations=3", "run.log_every=1"],
                      {"run.output": str(out)})  # fmt: skip
    assert cfg.run.snapshot_every == 0  # the default this test is about
    assert Session(cfg, SerialComm()).run_to_file() == 0
    return out


def _section(heading: str) -> str:
    """The text of docs/hdf5.md's section whose heading starts with ``heading``."""
    start = HDF5_DOC.index("\n## " + heading)
    end = HDF5_DOC.find("\n## ", start + 1)
    return HDF5_DOC[start : end if end > 0 else None]


def _table_names(section: str) -> list[tuple[list[str], str]]:
    """([names in the first cell], the row's text) of every table row of ``section``."""
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            rows.append((re.findall(r"`([\w<>]+)`", first), line))
    return rows


def test_the_groups_the_docs_name_are_those_of_a_default_run(default_run):
    with h5py.File(default_run, "r") as f:
        groups = set(f)
    documented = set(re.findall(r"^## `/(\w+)", HDF5_DOC, re.M))
    conditional = {g for g in documented if "0 = none, the default" in _section(f"`/{g}")}
    assert conditional == {"snapshots"}
    assert groups == documented - conditional, (groups, documented)
    assert read_snapshots(default_run)["iteration"].shape == (0,)  # as both docs say: none by default
    for doc in (README, HDF5_DOC):
        mentioned = {g for g in re.findall(r"`/(\w+)", doc) if g in documented}
        assert mentioned <= groups | conditional
    assert "only when `run.snapshot_every > 0`" in README and "/snapshots only when run.snapshot_every > 0" in HDF5_DOC


def test_every_documented_attribute_and_column_is_in_a_default_run(default_run):
    attrs, data = result = read_run(default_run)
    assert isinstance(result, tuple) and isinstance(attrs, dict) and isinstance(data, dict)  # README: a tuple
    for names, row in _table_names(_section("File attributes")):
        for name in names:
            assert name in attrs or "only in" in row, (name, row)
    for names, row in _table_names(_section("`/iterations")):
        if "only in runs" in row or "<name>" in row:
            continue
        for name in names:
            assert name in data, (name, row)
    declared = json.loads(attrs["metrics"])
    assert {"outer_objective", "x_error", "y_error", "hypergradient_norm"} <= set(declared) <= set(data)


def test_report_shows_every_declared_metric(default_run):
    text = post.report([default_run])
    for metric in json.loads(read_run(default_run)[0]["metrics"]):
        assert metric in text, (metric, text)


def test_progress_lines_show_the_headline_metrics_rate_and_time_left(tmp_path, caplog):
    cfg = config.load(ROOT / "configs" / "quadratic.toml", ["algorithm.outer_iterations=2", "run.log_every=1"],
                      {"run.output": str(tmp_path / "q.h5")})  # fmt: skip
    with caplog.at_level(logging.INFO, logger="fednest_mpi"):
        assert Session(cfg, SerialComm()).run_to_file() == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("iteration 2/2")]
    assert len(lines) == 1, caplog.text
    assert re.search(r"x_error=\S+ .*comm_rounds=\S+ wall=\S+s [\d.e+]+ it/s, 0:00:00 left", lines[0]), lines[0]
