"""MNIST loading: the real files in shared/data, small IDX files made here, damaged files, data dirs."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_data import DATA as SHARED
from shared_data import need

from fednest_mpi.data import files, load_mnist, read_idx, resolve_data_dir
from fednest_mpi.data.mnist import IMAGES_MAGIC, LABELS_MAGIC
from fednest_mpi.errors import DataError

TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


@pytest.fixture(scope="module")
def mnist():
    need(SHARED / "mnist")
    return load_mnist(SHARED / "mnist")


def idx_bytes(magic: int, array: np.ndarray) -> bytes:
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


def write_set(folder: Path, gz: bool = True, n_train: int = 12, n_test: int = 5) -> Path:
    """Four small valid IDX files; image i of a split is filled with the value 20 * label."""
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = np.arange(n) % 10
        images = np.broadcast_to(20 * labels[:, None, None], (n, 28, 28))
        for name, magic, array in (
            (f"{prefix}-images-idx3-ubyte", IMAGES_MAGIC, images),
            (f"{prefix}-labels-idx1-ubyte", LABELS_MAGIC, labels),
        ):
            raw = idx_bytes(magic, array)
            if gz:
                (folder / f"{name}.gz").write_bytes(gzip.compress(raw))
            else:
                (folder / name).write_bytes(raw)
    return folder


def test_real_mnist_shapes_normalisation_and_counts(mnist):
    assert mnist.train_x.shape == (60000, 784) and mnist.test_x.shape == (10000, 784)
    assert mnist.train_x.dtype == mnist.test_x.dtype == torch.float32
    assert mnist.train_y.dtype == mnist.test_y.dtype == torch.int64 and mnist.test_y.shape == (10000,)
    assert abs(float(mnist.train_x.mean())) < 1e-3
    assert abs(float(mnist.train_x.std()) - 1.0) < 1e-3
    assert mnist.train_y.bincount().tolist() == TRAIN_COUNTS
    assert int(mnist.test_y.bincount().sum()) == 10000


@pytest.mark.parametrize("gz", [True, False])
def test_small_files_gz_or_raw_are_normalised_once(tmp_path, gz):
    data = load_mnist(write_set(tmp_path / "mnist", gz=gz))
    assert data.train_x.shape == (12, 784) and data.test_x.shape == (5, 784)
    assert data.train_y.tolist() == [i % 10 for i in range(12)]
    expected = (20 * 3 / 255 - 0.1307) / 0.3081
    assert np.allclose(data.train_x[3].numpy(), expected, atol=1e-6)


def test_fashion_uses_its_own_constants(tmp_path):
    data = load_mnist(write_set(tmp_path / "fashion-mnist"), variant="fashion")
    assert np.allclose(data.test_x[2].numpy(), (40 / 255 - 0.2860) / 0.3530, atol=1e-6)
    with pytest.raises(DataError, match="unknown MNIST variant 'kmnist'"):
        load_mnist(tmp_path / "fashion-mnist", variant="kmnist")


def test_md5sums_are_checked_when_verify(tmp_path):
    folder = write_set(tmp_path / "mnist")
    files.write_md5sums(folder, ["train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"])
    load_mnist(folder)
    labels = np.full(12, 1)
    (folder / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(LABELS_MAGIC, labels)))
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz' has md5 .* but .*MD5SUMS"):
        load_mnist(folder)
    assert load_mnist(folder, verify=False).train_y.tolist() == [1] * 12


def _bad_magic(folder):
    raw = idx_bytes(LABELS_MAGIC, np.zeros((3, 28, 28)))
    (folder / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw))
    return "train-images-idx3-ubyte.gz", "magic number 2049, expected 2051"


def _truncated(folder):
    raw = idx_bytes(IMAGES_MAGIC, np.zeros((12, 28, 28)))[:-100]
    (folder / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw))
    return "train-images-idx3-ubyte.gz", "is truncated: .* 9408 payload bytes, but the file holds 9308"


def _short_header(folder):
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(struct.pack(">IH", LABELS_MAGIC, 5)))
    return "t10k-labels-idx1-ubyte.gz", "truncated: 6 bytes, shorter than its 8-byte IDX header"


def _label_out_of_range(folder):
    labels = np.array([0, 1, 2, 10, 4])
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(LABELS_MAGIC, labels)))
    return "t10k-labels-idx1-ubyte.gz", "label 10 at index 3; labels must be in 0..9"


def _count_mismatch(folder):
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(LABELS_MAGIC, np.zeros(4))))
    return "t10k-labels-idx1-ubyte.gz", "holds 5 images but .* holds 4 labels"


def _wrong_size(folder):
    raw = idx_bytes(IMAGES_MAGIC, np.zeros((5, 27, 27)))
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw))
    return "t10k-images-idx3-ubyte.gz", "images of 27x27 pixels, expected 28x28"


def _missing(folder):
    (folder / "train-labels-idx1-ubyte.gz").unlink()
    return "train-labels-idx1-ubyte.gz", r"MNIST file .* not found in .*looked for .*download mnist --dest"


def _not_gzip(folder):
    (folder / "train-labels-idx1-ubyte.gz").write_bytes(idx_bytes(LABELS_MAGIC, np.zeros(12)))
    return "train-labels-idx1-ubyte.gz", "is not a valid gzip file"


def _truncated_gzip(folder):
    path = folder / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-30])
    return "train-images-idx3-ubyte.gz", "is not a valid gzip file"


@pytest.mark.parametrize(
    "damage",
    [
        _bad_magic,
        _truncated,
        _short_header,
        _label_out_of_range,
        _count_mismatch,
        _wrong_size,
        _missing,
        _not_gzip,
        _truncated_gzip,
    ],
)
def test_damaged_files_raise_data_error_naming_the_file(tmp_path, damage):
    folder = write_set(tmp_path / "mnist")
    name, pattern = damage(folder)
    with pytest.raises(DataError, match=pattern) as info:
        load_mnist(folder)
    assert name in str(info.value)


def test_read_idx_of_real_labels():
    path = SHARED / "mnist" / "t10k-labels-idx1-ubyte.gz"
    need(path)
    labels = read_idx(path, LABELS_MAGIC)
    assert labels.shape == (10000,) and labels.dtype == np.uint8 and labels.max() == 9


def test_resolve_data_dir(tmp_path, monkeypatch):
    root = tmp_path / "data"
    (root / "mnist").mkdir(parents=True)
    (root / "adult").mkdir()
    monkeypatch.delenv(files.ENV_VAR, raising=False)
    assert resolve_data_dir(str(root), "mnist") == root / "mnist"  # a root with one folder per data set
    assert resolve_data_dir(str(root / "adult"), "adult") == root / "adult"  # the data set's own folder
    assert resolve_data_dir(str(root), "fashion") == root  # no fashion-mnist/ subfolder: the folder itself
    with pytest.raises(DataError, match="no data directory for mnist: set problem.data_dir or .*FEDNEST_DATA"):
        resolve_data_dir(None, "mnist")
    monkeypatch.setenv(files.ENV_VAR, str(root))
    assert resolve_data_dir(None, "adult") == root / "adult"
    monkeypatch.setenv(files.ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match=r"'.*nowhere' \(from FEDNEST_DATA\) does not exist"):
        resolve_data_dir(None, "mnist")
    with pytest.raises(DataError, match="unknown data set 'cifar'"):
        resolve_data_dir(str(root), "cifar")


def test_resolve_data_dir_finds_the_shared_layout(monkeypatch):
    need(SHARED / "mnist")
    monkeypatch.setenv(files.ENV_VAR, str(SHARED))
    assert resolve_data_dir(None, "mnist") == SHARED / "mnist"
