"""Federated data-set files: a user's own data, split into clients, in one HDF5 file (docs/data.md).

Format ``fednest-mpi/federated-data`` version :data:`VERSION`::

    /                    attrs: format, format_version, n_classes, feature_shape
    /features            (N, *feature_shape) float or integer; client i's samples are the rows
                         client_offsets[i] .. client_offsets[i+1] - 1
    /labels              (N,) integer in 0 .. n_classes - 1
    /client_offsets      (M + 1,) integer: 0, strictly increasing (every client has a sample), N last
    /sample_ids          (N,) integer, optional: each row's index in the source arrays
    /test/features       (T, *feature_shape), optional, with /test/labels (T,): a shared test set

:func:`write_federated` writes a file (to a fresh hidden ``.PATH.RANDOM.partial``, renamed when complete).
:class:`FederatedFile` opens one through :func:`fednest_mpi.io.safe.open_checked` (signature,
truncation, damaged metadata) and checks its structure, offsets and labels (read in slices, the
same verdict on every rank); :meth:`FederatedFile.read_clients` reads only the rows of a block of
clients (memory bounded by the block) and refuses NaN or infinite features there;
:meth:`FederatedFile.check_features` scans every feature in slices (``fednest-mpi data check``).
Every defect is a :class:`~fednest_mpi.errors.DataError` naming the file, the defect and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from fednest_mpi import atomic
from fednest_mpi.errors import DataError, UsageError
from fednest_mpi.io.safe import open_checked, reading
from fednest_mpi.pathkind import not_a_file

FORMAT = "fednest-mpi/federated-data"
VERSION = 1
FIX = "rewrite it with `fednest-mpi data convert` or fednest_mpi.data.convert_arrays (docs/data.md)"
_SLICE_BYTES = 64 << 20  # rows read at once when a whole dataset is checked


@dataclass(frozen=True)
class ClientBlock:
    """The rows of a block of clients: ``features`` (n, *shape), ``labels`` (n,) int64 and
    ``offsets`` (B + 1,) int64 into them (client ``clients[b]`` owns rows offsets[b]..offsets[b+1]-1)."""

    clients: range
    features: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray


def _check_output(path: Path, overwrite: bool) -> None:
    """Refuse an output that exists (unless ``overwrite``), is something else than a file (a folder, a FIFO, a link
    loop) or a name the kernel refuses (too long), or whose folder is a file, unwritable, a pseudo file system."""
    from fednest_mpi.io.h5 import check_directory

    what = not_a_file(path)
    if what is None and not overwrite:
        raise DataError(f"output {str(path)!r} already exists; choose another path or pass --overwrite")
    if what is not None and what != "does not exist":
        raise DataError(f"output {str(path)!r} {what}; choose another path")
    check_directory(path.parent, "--output")


def write_federated(
    path: str | Path,
    features: np.ndarray,
    labels: np.ndarray,
    offsets: np.ndarray,
    n_classes: int,
    test: tuple[np.ndarray, np.ndarray] | None = None,
    sample_ids: np.ndarray | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a federated data-set file (rows already in client order) and check it by reading it back."""
    path = Path(path)
    _check_output(path, overwrite)
    for what, array in (("features", features), ("test features", None if test is None else test[0])):
        array = None if array is None else np.asarray(array)
        if array is not None and array.dtype.kind == "f" and not np.isfinite(array).all():
            row = int(np.argwhere(~np.isfinite(array.reshape(len(array), -1)))[0, 0])
            raise DataError(f"{what} row {row} holds NaN or infinite values; remove or impute those samples")
    tmp = atomic.temp_name(path)  # unique, created exclusively: never through a planted link
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # as a run makes its output's folder
        with h5py.File(tmp, "x", libver="latest") as f:
            f.attrs.update(format=FORMAT, format_version=VERSION, n_classes=int(n_classes))
            f.attrs["feature_shape"] = np.asarray(np.shape(features)[1:], dtype=np.int64)
            f["features"], f["labels"] = np.asarray(features), np.asarray(labels, dtype=np.int64)
            f["client_offsets"] = np.asarray(offsets, dtype=np.int64)
            if sample_ids is not None:
                f["sample_ids"] = np.asarray(sample_ids, dtype=np.int64)
            if test is not None:
                f["test/features"], f["test/labels"] = np.asarray(test[0]), np.asarray(test[1], dtype=np.int64)
    except OSError as exc:
        raise DataError(f"cannot write {str(path)!r}: {exc}") from None
    try:
        FederatedFile(tmp).check_features()
    except DataError:
        tmp.unlink()
        raise
    os.replace(tmp, path)
    return path


class FederatedFile:
    """An opened, checked federated data-set file; see the module docstring."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        f = self._open()
        with f, reading(self.path, "federated data file"):
            self._check_header(f)
            self.version, self.n_classes = int(f.attrs["format_version"]), int(f.attrs["n_classes"])
            self.feature_shape = tuple(int(n) for n in f.attrs["feature_shape"])
            self.offsets = self._read_offsets(f)
            self.n_clients, self.n_samples = len(self.offsets) - 1, int(self.offsets[-1])
            self.has_test = "test" in f
            self.n_test = int(f["test/labels"].shape[0]) if self.has_test and "test/labels" in f else 0
            for prefix in ("", "test/") if self.has_test else ("",):
                self._check_split(f, prefix)
            if "sample_ids" in f:
                self._check_labelled(f, "sample_ids", f["features"].shape[0])

    def _open(self) -> h5py.File:
        """The file opened by :func:`~fednest_mpi.io.safe.open_checked` (empty, foreign, truncated or
        damaged files refused there), its refusal as a DataError with the fix."""
        try:
            return open_checked(self.path, "federated data file", hint=f"; {FIX}")[0]
        except DataError:
            raise
        except UsageError as exc:
            raise DataError(f"{exc}; copy the file again or {FIX}") from None

    def _fail(self, defect: str, fix: str = FIX) -> DataError:
        return DataError(f"federated data file {str(self.path)!r}: {defect}; {fix}")

    def _check_header(self, f: h5py.File) -> None:
        found = f.attrs.get("format")
        if found != FORMAT:
            raise self._fail(f"attribute format is {found!r}, not {FORMAT!r}: not a federated data file")
        version = f.attrs.get("format_version")
        if not isinstance(version, (int, np.integer)) or not 1 <= version <= VERSION:
            raise self._fail(
                f"format_version {version} is not one this fednest-mpi reads (1..{VERSION})",
                "upgrade fednest-mpi, or rewrite the file with this version",
            )
        for name in ("n_classes", "feature_shape"):
            if name not in f.attrs:
                raise self._fail(f"the attribute {name} is missing")
        n_classes = f.attrs["n_classes"]
        if not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
            raise self._fail(f"attribute n_classes is {n_classes!r}; it must be an integer of at least 2")
        for name in ("features", "labels", "client_offsets"):
            if not isinstance(f.get(name), h5py.Dataset):
                raise self._fail(f"the dataset /{name} is missing")

    def _read_offsets(self, f: h5py.File) -> np.ndarray:
        ds = f["client_offsets"]
        if ds.ndim != 1 or ds.shape[0] < 2 or ds.dtype.kind not in "iu":
            raise self._fail(
                f"/client_offsets must be a 1-D integer array of M + 1 >= 2 entries, found {ds.shape} {ds.dtype}"
            )
        offsets = ds[()].astype(np.int64)
        n = f["features"].shape[0] if f["features"].ndim else 0
        steps = np.diff(offsets)
        if offsets[0] != 0:
            raise self._fail(f"/client_offsets starts at {offsets[0]}, not 0")
        if steps.min() <= 0:
            i = int(np.argmin(steps))
            raise self._fail(
                f"/client_offsets is not strictly increasing: client {i} has {steps[i]} samples "
                f"(offsets {offsets[i]} then {offsets[i + 1]}); every client needs at least one sample"
            )
        if offsets[-1] != n:
            raise self._fail(
                f"/client_offsets ends at {offsets[-1]}, but /features has {n} rows; it must end at N = {n}"
            )
        return offsets

    def _check_split(self, f: h5py.File, prefix: str) -> None:
        feats = f.get(prefix + "features")
        if not isinstance(feats, h5py.Dataset) or not isinstance(f.get(prefix + "labels"), h5py.Dataset):
            raise self._fail(f"/{prefix}features or /{prefix}labels is missing (a test set needs both)")
        if feats.ndim < 1 or tuple(feats.shape[1:]) != self.feature_shape:
            raise self._fail(
                f"/{prefix}features has shape {feats.shape}, but the attribute feature_shape says "
                f"(N, {', '.join(map(str, self.feature_shape))})"
            )
        if feats.dtype.kind not in "fiu":
            raise self._fail(f"/{prefix}features has dtype {feats.dtype}; it must be float or integer")
        labels = self._check_labelled(f, prefix + "labels", feats.shape[0])
        for start in range(0, len(labels), 1 << 20):
            part = labels[start : start + (1 << 20)]
            bad = np.flatnonzero((part < 0) | (part >= self.n_classes))
            if bad.size:
                j = start + int(bad[0])
                raise self._fail(
                    f"/{prefix}labels[{j}] is {part[bad[0]]}, outside 0..{self.n_classes - 1} "
                    f"(n_classes = {self.n_classes})"
                )

    def _check_labelled(self, f: h5py.File, name: str, n: int) -> h5py.Dataset:
        ds = f[name]
        if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.kind not in "iu":
            found = f"{getattr(ds, 'shape', None)} {getattr(ds, 'dtype', None)}"
            raise self._fail(f"/{name} must be a 1-D integer array, found {found}")
        if ds.shape[0] != n:
            raise self._fail(f"/{name} has {ds.shape[0]} entries but its features have {n} rows")
        return ds

    def labels(self) -> np.ndarray:
        """Every training label, (N,) int64 (8 bytes per sample)."""
        f = self._open()
        with f, reading(self.path, "federated data file"):
            return f["labels"][()].astype(np.int64)

    def client_sizes(self) -> np.ndarray:
        """Number of samples of every client, (M,)."""
        return np.diff(self.offsets)

    def read_clients(self, clients: range) -> ClientBlock:
        """The rows of ``clients`` (a range of client ids), read as one slice."""
        if clients.step != 1 or not 0 <= clients.start <= clients.stop <= self.n_clients:
            raise DataError(f"clients {clients} are not a block of the {self.n_clients} clients of {str(self.path)!r}")
        lo, hi = int(self.offsets[clients.start]), int(self.offsets[clients.stop])
        features, labels = self._rows("", lo, hi)
        return ClientBlock(clients, features, labels, self.offsets[clients.start : clients.stop + 1] - lo)

    def read_test(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(features, labels) of the shared test set, or None when the file has none."""
        return self._rows("test/", 0, self.n_test) if self.has_test else None

    def _rows(self, prefix: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        f = self._open()
        with f, reading(self.path, "federated data file"):
            features, labels = f[prefix + "features"][lo:hi], f[prefix + "labels"][lo:hi].astype(np.int64)
        if features.dtype.kind == "f" and not np.isfinite(features).all():
            row = lo + int(np.argwhere(~np.isfinite(features.reshape(len(features), -1)))[0, 0])
            where = f", client {int(np.searchsorted(self.offsets, row, 'right')) - 1}" if not prefix else ""
            raise self._fail(
                f"/{prefix}features[{row}]{where} holds NaN or infinite values",
                "remove or impute those samples and convert again",
            )
        return features, labels

    def check_features(self) -> None:
        """Read every feature row (in slices of about 64 MiB) and refuse NaN or infinite values."""
        row_bytes = max(1, int(np.prod(self.feature_shape, dtype=np.int64)) * 8)
        step = max(1, _SLICE_BYTES // row_bytes)
        for prefix, n in (("", self.n_samples), ("test/", self.n_test)):
            for lo in range(0, n, step):
                self._rows(prefix, lo, min(lo + step, n))
