"""Your own data as a federated data-set file: plain (features, labels) arrays split into clients.

* :func:`convert_arrays`: arrays -> a federated file (format in :mod:`fednest_mpi.io.federated`,
  docs/data.md), the clients from :mod:`~fednest_mpi.data.partition` (``iid``: equal random parts,
  McMahan et al. 2017, the remainder left out; ``shards``: ``shards_per_client`` label-sorted
  shards each, sizes differing by at most one, nothing left out; ``dirichlet``: label skew with
  proportions ~ Dirichlet(alpha), Hsu et al. 2019, each client with at least ``min_size`` samples),
  keyed by ``seed``: the same arrays, partition and seed give the same file.
* :func:`convert_npz`: the same from a numpy ``.npz`` holding ``features`` and ``labels`` (or
  Keras-style ``x_train`` and ``y_train``), optionally a test set (``test_features`` and
  ``test_labels``, or ``x_test`` and ``y_test``).
* :func:`describe`: a checked file summarised in a few lines (``fednest-mpi data check``).

Rows are written in client order (client 0's samples first, each client's in ascending source
order); ``/sample_ids`` keeps every row's index in the source arrays.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from fednest_mpi.data.partition import dirichlet_partition, iid_partition, shard_partition
from fednest_mpi.errors import DataError
from fednest_mpi.io.federated import FederatedFile, write_federated

PARTITIONS = ("iid", "shards", "dirichlet")
NPZ_KEYS = (("features", "labels", "test_features", "test_labels"), ("x_train", "y_train", "x_test", "y_test"))


def _labels(labels, what: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DataError(f"{what} must be a 1-D integer array of class ids, got shape {labels.shape} of {labels.dtype}")
    if len(labels) and labels.min() < 0:
        raise DataError(f"{what} holds the negative label {labels.min()}; labels must be class ids 0, 1, ...")
    return labels.astype(np.int64)


def _features(features, n: int, what: str) -> np.ndarray:
    features = np.asarray(features)
    if features.ndim < 1 or features.shape[0] != n or features.dtype.kind not in "fiu":
        raise DataError(
            f"{what} must be a float or integer array of {n} rows (one per label), "
            f"got shape {features.shape} of {features.dtype}"
        )
    return features


def client_indices(
    labels: np.ndarray,
    partition: str,
    n_clients: int,
    seed: int,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Each client's sorted indices into ``labels`` under ``partition``; DataError for bad arguments."""
    try:
        if partition == "iid":
            return iid_partition(len(labels), n_clients, seed)
        if partition == "shards":
            n_shards = n_clients * shards_per_client
            return shard_partition(labels, n_clients, seed, n_shards, shards_per_client, equal_shards=False)
        if partition == "dirichlet":
            return dirichlet_partition(labels, n_clients, alpha, seed, min_size=min_size)
    except ValueError as exc:
        raise DataError(f"--partition {partition} with --clients {n_clients}: {exc}") from None
    raise DataError(f"--partition: unknown partition {partition!r}; choose one of {', '.join(PARTITIONS)}")


def convert_arrays(
    features,
    labels,
    output: str | Path,
    partition: str = "iid",
    n_clients: int = 10,
    seed: int = 0,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    min_size: int = 1,
    test: tuple | None = None,
    n_classes: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``features`` (N, ...) and ``labels`` (N,) split into ``n_clients`` clients to ``output``.

    ``n_classes`` defaults to one more than the largest label (of the training and test sets), at least 2.
    """
    labels = _labels(labels, "labels")
    features = _features(features, len(labels), "features")
    if test is not None:
        test_labels = _labels(test[1], "test labels")
        test = (_features(test[0], len(test_labels), "test features"), test_labels)
        if test[0].shape[1:] != features.shape[1:]:
            raise DataError(f"test features have rows of shape {test[0].shape[1:]}, features {features.shape[1:]}")
    top = max([int(labels.max(initial=0))] + ([int(test[1].max(initial=0))] if test is not None else []))
    n_classes = max(2, top + 1) if n_classes is None else n_classes
    if n_classes < max(2, top + 1):
        raise DataError(f"--n-classes {n_classes}: the labels go up to {top}; give at least {max(2, top + 1)}")
    parts = client_indices(labels, partition, n_clients, seed, alpha, shards_per_client, min_size)
    if min(len(p) for p in parts) == 0:
        raise DataError(f"--partition {partition}: a client would have no sample; use fewer --clients")
    order = np.concatenate(parts)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
    return write_federated(
        output, features[order], labels[order], offsets, n_classes, test=test, sample_ids=order, overwrite=overwrite
    )


def load_npz(path: str | Path) -> tuple[np.ndarray, np.ndarray, tuple | None]:
    """(features, labels, (test features, test labels) or None) from a ``.npz`` file; see the module docstring."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            found = set(npz.files)
            for keys in NPZ_KEYS:
                if {keys[0], keys[1]} <= found:
                    test = (npz[keys[2]], npz[keys[3]]) if {keys[2], keys[3]} <= found else None
                    return npz[keys[0]], npz[keys[1]], test
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DataError(f"cannot read {str(path)!r} as a numpy .npz file ({exc})") from None
    raise DataError(
        f"{str(path)!r} holds the arrays {', '.join(sorted(found)) or 'none'}; it needs 'features' and 'labels' "
        "(np.savez(PATH, features=X, labels=Y), optionally test_features and test_labels) or x_train and y_train"
    )


def convert_npz(input: str | Path, output: str | Path, **options) -> Path:
    """:func:`convert_arrays` on the arrays of the ``.npz`` file ``input``."""
    features, labels, test = load_npz(input)
    return convert_arrays(features, labels, output, test=test, **options)


def describe(path: str | Path) -> str:
    """A few lines about a federated file, after checking it whole (every feature read once)."""
    data = FederatedFile(path)
    data.check_features()
    sizes = data.client_sizes()
    test = f"{data.n_test} test samples" if data.has_test else "no test set"
    return (
        f"{path}: valid federated data set (format version {data.version})\n"
        f"  {data.n_clients} clients, {data.n_samples} samples of shape {data.feature_shape}, "
        f"{data.n_classes} classes, {test}\n"
        f"  samples per client: min {sizes.min()}, median {int(np.median(sizes))}, max {sizes.max()}\n"
    )
