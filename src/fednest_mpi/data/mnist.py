"""MNIST and Fashion-MNIST from their original IDX files.

* :func:`read_idx` reads one IDX file (``.gz`` or raw) of unsigned bytes and checks its magic
  number (2051 for images, 2049 for labels) and that the payload length matches the header.
* :func:`load_mnist` loads the four standard files of a data directory into a
  :class:`MnistData`: images as float32 tensors of shape (n, 784), normalised once at load time,
  ``(pixel / 255 - mean) / std`` with the data set's usual constants, and labels as int64 tensors.

Fashion-MNIST uses the same four file names, in its own folder (``fashion-mnist/``). Any
missing, truncated or malformed file raises :class:`~fednest_mpi.errors.DataError` naming it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fednest_mpi.data.files import check_md5sums, find_file, read_bytes
from fednest_mpi.errors import DataError

IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
SIDE = 28
N_CLASSES = 10
FILES = {  # split -> (images file, labels file), names without ".gz"
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
NORMALISATION = {"mnist": (0.1307, 0.3081), "fashion": (0.2860, 0.3530)}  # variant -> (mean, std)


@dataclass(frozen=True)
class MnistData:
    """Normalised images (float32, (n, 784)) and labels (int64, (n,)) of both splits."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def read_idx(path: Path, magic: int) -> np.ndarray:
    """The uint8 array stored in IDX file ``path``, whose magic number must be ``magic``."""
    raw = read_bytes(path)
    if len(raw) < 4:  # an empty file, or an empty gzip stream
        unpacked = " once gunzipped" if Path(path).suffix == ".gz" else ""
        raise DataError(
            f"'{path}' is empty: {len(raw)} bytes{unpacked}, no IDX header (magic number); download the file again"
        )
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise DataError(
            f"'{path}' is not an IDX file of the expected kind: magic number {found}, "
            f"expected {magic}; check the file name or download the file again"
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(
            f"'{path}' is truncated: {len(raw)} bytes, shorter than its {header}-byte "
            f"IDX header; download the file again"
        )
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected, actual = math.prod(dims), len(raw) - header
    if actual != expected:
        what = "truncated" if actual < expected else "too long"
        raise DataError(
            f"'{path}' is {what}: its header announces shape {dims}, i.e. {expected} "
            f"payload bytes, but the file holds {actual}; download the file again"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _check_split(images: np.ndarray, labels: np.ndarray, image_path: Path, label_path: Path) -> None:
    if images.shape[1:] != (SIDE, SIDE):
        raise DataError(
            f"'{image_path}' holds images of {images.shape[1]}x{images.shape[2]} pixels, "
            f"expected {SIDE}x{SIDE}; is it an MNIST file?"
        )
    if len(labels) and labels.max() >= N_CLASSES:
        bad = int(np.argmax(labels >= N_CLASSES))
        raise DataError(
            f"'{label_path}' has label {labels[bad]} at index {bad}; labels must be in "
            f"0..{N_CLASSES - 1}: the file is damaged, download it again"
        )
    if len(images) != len(labels):
        raise DataError(
            f"'{image_path}' holds {len(images)} images but '{label_path}' holds "
            f"{len(labels)} labels; the two files do not belong together"
        )


def _normalise(images: np.ndarray, mean: float, std: float) -> torch.Tensor:
    x = images.reshape(len(images), SIDE * SIDE).astype(np.float32)
    x /= 255.0
    x -= mean
    x /= std
    return torch.from_numpy(x)


def load_mnist(data_dir: str | Path, variant: str = "mnist", verify: bool = True) -> MnistData:
    """Load MNIST (``variant="mnist"``) or Fashion-MNIST (``"fashion"``) from ``data_dir``.

    ``data_dir`` is the folder of the four IDX files (see
    :func:`~fednest_mpi.data.files.resolve_data_dir`). With ``verify`` every file listed in
    the folder's ``MD5SUMS`` is checked against it first.
    """
    if variant not in NORMALISATION:
        raise DataError(f"unknown MNIST variant {variant!r}; choose one of {', '.join(NORMALISATION)}")
    data_dir = Path(data_dir)
    paths = {split: [find_file(data_dir, name, variant) for name in names] for split, names in FILES.items()}
    if verify:
        check_md5sums(data_dir, [p for pair in paths.values() for p in pair])
    mean, std = NORMALISATION[variant]
    tensors = {}
    for split, (image_path, label_path) in paths.items():
        images, labels = read_idx(image_path, IMAGES_MAGIC), read_idx(label_path, LABELS_MAGIC)
        _check_split(images, labels, image_path, label_path)
        tensors[f"{split}_x"] = _normalise(images, mean, std)
        tensors[f"{split}_y"] = torch.from_numpy(labels.astype(np.int64))
    return MnistData(**tensors)
