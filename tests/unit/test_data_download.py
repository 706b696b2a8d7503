"""The downloader, fed by file:// URLs (no network here): checksums, atomic writes, errors."""

from __future__ import annotations

import gzip
import shutil

import pytest
from shared_data import DATA as SHARED
from shared_data import need

from fednest_mpi.data import download, resolve_data_dir
from fednest_mpi.data.download import SOURCES
from fednest_mpi.data.files import read_md5sums
from fednest_mpi.errors import DataError


@pytest.fixture
def mirror(tmp_path):
    """A copy of the shared files laid out as on the download servers (Adult uncompressed)."""
    need(SHARED / "mnist")
    need(SHARED / "adult")
    site = tmp_path / "site"
    site.mkdir()
    for name in SOURCES["mnist"][1]:
        shutil.copy(SHARED / "mnist" / name, site / name)
    for name in SOURCES["adult"][1]:
        (site / name).write_bytes(gzip.decompress((SHARED / "adult" / f"{name}.gz").read_bytes()))
    return site


def test_download_mnist_and_adult(tmp_path, mirror):
    dest = tmp_path / "data"
    for dataset in ("mnist", "adult"):
        folder = download(dataset, dest, base_url=mirror.as_uri())
        assert folder == dest / dataset == resolve_data_dir(str(dest), dataset)
        assert sorted(read_md5sums(folder)) == sorted(SOURCES[dataset][1])
        assert not list(folder.glob(".partial-*"))
    assert (dest / "mnist" / "train-images-idx3-ubyte.gz").read_bytes() == (
        SHARED / "mnist" / "train-images-idx3-ubyte.gz"
    ).read_bytes()
    # files already there with the right content are kept: an empty mirror is not even asked
    empty = tmp_path / "empty"
    empty.mkdir()
    assert download("mnist", dest, base_url=empty.as_uri()) == dest / "mnist"


def test_download_rejects_a_corrupt_file(tmp_path, mirror):
    (mirror / "adult.test").write_text("25, Private\n")
    with pytest.raises(DataError, match=r"downloaded .*adult.test but its content has md5 .*, expected 3523"):
        download("adult", tmp_path / "data", base_url=mirror.as_uri())
    folder = tmp_path / "data" / "adult"
    assert sorted(p.name for p in folder.iterdir()) == ["adult.data"]  # no partial or bad file left


def test_download_network_failure_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"could not download file://.*/nowhere/train-images-idx3-ubyte.gz"):
        download("mnist", tmp_path / "data", base_url=(tmp_path / "nowhere").as_uri())
    assert not list((tmp_path / "data" / "mnist").iterdir())
    with pytest.raises(DataError, match="unknown data set 'cifar10'"):
        download("cifar10", tmp_path / "data")


def test_download_command_line(tmp_path, mirror, capsys):
    from fednest_mpi.cli import main

    dest = tmp_path / "cli"
    assert main(["download", "mnist", "--dest", str(dest), "--mirror", mirror.as_uri()]) == 0
    assert f"output: {dest / 'mnist'}" in capsys.readouterr().out
    assert main(["download", "mnist", "--dest", str(tmp_path / "x"), "--mirror", (tmp_path / "nowhere").as_uri()]) == 1
    assert "could not download" in capsys.readouterr().err


def test_download_command_needs_a_destination(monkeypatch, capsys):
    from fednest_mpi.cli import main

    monkeypatch.delenv("FEDNEST_DATA", raising=False)
    assert main(["download", "adult"]) == 2
    assert "--dest" in capsys.readouterr().err


def test_every_data_set_has_a_source_and_every_source_is_a_data_set():
    from fednest_mpi.config import DATASETS

    assert set(SOURCES) == set(DATASETS)
