"""Client data of a rank: partition of a labelled training set into clients, each with its own
inner (train, g_i) and outer (validation, f_i) split, padded to matrices for batched oracles.

Deterministic in the seed and independent of the number of ranks: the partition is computed
identically on every rank from the full label vector, and each rank then keeps only the samples
of the clients it hosts, once, normalised, on the device. With ``problem.data_file`` the clients
are those of a federated data-set file (docs/data.md) instead, and a rank reads only its block's
rows (:class:`FileClients`; :func:`image_clients` picks the source).
"""

from __future__ import annotations

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.data import (
    dirichlet_partition,
    iid_partition,
    load_mnist,
    resolve_data_dir,
    shard_partition,
    split_inner_outer,
)
from fednest_mpi.errors import ConfigError, DataError
from fednest_mpi.io.federated import FederatedFile


def partition_clients(
    labels: np.ndarray, cfg, seed: int, equal_shards: bool = True
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per client (inner/train indices, outer/validation indices) into ``labels``."""
    if cfg.partition == "iid":
        parts = iid_partition(len(labels), cfg.n_clients, seed)
    elif cfg.partition == "shards":
        parts = shard_partition(
            labels,
            cfg.n_clients,
            seed,
            n_shards=cfg.n_clients * cfg.shards_per_client,
            shards_per_client=cfg.shards_per_client,
            equal_shards=equal_shards,
        )
    else:
        parts = dirichlet_partition(labels, cfg.n_clients, cfg.dirichlet_alpha, seed, min_size=2)
    splits = split_inner_outer(parts, cfg.val_fraction, seed)
    check_batch_sizes(splits, cfg)
    return splits


def check_batch_sizes(splits: list[tuple[np.ndarray, np.ndarray]], cfg) -> None:
    """ConfigError when a minibatch is larger than the smallest client's split. The partition is
    the same on every rank, so is the verdict."""
    for name, side, what in (
        ("batch_size", 0, "inner (training)"),
        ("hypergradient_batch_size", 1, "outer (validation)"),
    ):
        counts = np.array([len(split[side]) for split in splits])
        size = getattr(cfg, name)
        if size > counts.min():
            client = int(np.argmin(counts))
            raise ConfigError(
                f"problem.{name}: {size} is more than the {counts[client]} {what} samples of the smallest client "
                f"(client {client} of the {cfg.partition} partition); lower problem.{name} to at most "
                f"{counts[client]}, or use fewer clients"
            )


class ClientSplit:
    """One kind of local data (inner or outer) of the hosted clients, padded to a matrix.

    The padded width must not depend on which clients are held together: CPU kernels reduce a
    client's (zero-padded) samples in an order that can depend on the padded length (``bmm`` and
    ``sum`` over 11 samples padded to 16 or to 34 differ in the last bit), so the data sources pad
    every client to one width of the whole population (``width``), which keeps runs bitwise the
    same for every chunk size and rank count."""

    def __init__(self, index: np.ndarray, count: np.ndarray):
        self.index = index  # rows: hosted clients; entries: positions in the rank's sample tensor, -1 = padding
        self.count = count  # each row's number of samples
        self._last_shuffle: tuple | None = None  # (key, permutations) of the last epoch shuffle, see batch

    @classmethod
    def from_lists(cls, index_lists: list[np.ndarray], width: int) -> ClientSplit:
        """From each client's sample positions, padded to ``width`` columns."""
        count = np.array([len(ix) for ix in index_lists], dtype=np.int64)
        pad = np.full((len(index_lists), max(width, int(count.max(initial=1)))), -1, dtype=np.int64)
        for row, ix in enumerate(index_lists):
            pad[row, : len(ix)] = ix
        return cls(pad, count)

    @classmethod
    def contiguous(cls, start: np.ndarray, count: np.ndarray, width: int) -> ClientSplit:
        """Client i's samples at positions start[i] .. start[i] + count[i] - 1 (vectorised), padded
        to ``width`` columns."""
        cols = np.arange(max(width, int(count.max(initial=1))))
        index = np.where(cols < count[:, None], start[:, None] + cols, -1)
        return cls(index.astype(np.int64, copy=False), np.asarray(count, dtype=np.int64))

    def _shuffle(self, key: int, clients: np.ndarray, epoch: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Each client's epoch permutation of its columns (padding last), keyed by (key, client,
        epoch). Remembered for one (key, clients, epoch): the local steps of an epoch reuse it."""
        memo = (key, clients.tobytes(), epoch.tobytes())
        if self._last_shuffle is not None and self._last_shuffle[0] == memo:
            return self._last_shuffle[1]
        width = self.index.shape[1]
        u = rng.uniform(rng.key(key, clients, epoch), width)
        u[np.arange(width)[None, :] >= count[:, None]] = 2.0  # padding sorts last
        perm = np.argsort(u, axis=1, kind="stable")
        self._last_shuffle = (memo, perm)
        return perm

    def batch(self, rows: np.ndarray, clients: np.ndarray, sample, batch_size: int):
        """(columns (B, b) into the rows of :attr:`index`, weights (B, b)) of each client's minibatch;
        weights sum to 1 per row and are 0 on padding."""
        count = self.count[rows]
        width = self.index.shape[1]
        if sample is None or batch_size <= 0:
            cols = np.broadcast_to(np.arange(width), (len(rows), width))
            valid = cols < count[:, None]
        else:
            steps = -(-count // batch_size)  # batches per epoch
            epoch, j = sample.step // steps, sample.step % steps
            perm = self._shuffle(sample.key, clients, epoch, count)
            slots = j[:, None] * batch_size + np.arange(batch_size)[None, :]
            valid = slots < count[:, None]
            cols = np.take_along_axis(perm, np.minimum(slots, width - 1), axis=1)
        weights = valid / np.maximum(valid.sum(1, keepdims=True), 1)
        return np.where(valid, cols, 0), weights

    def positions(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Sample positions (in the rank's sample tensor) of the given columns; padding -> 0."""
        return np.maximum(np.take_along_axis(self.index[rows], cols, axis=1), 0)


class HostedSamples:
    """The samples of the hosted ``clients`` (a range of client ids) with their two splits, each
    padded to the largest split of **all** clients (not only the hosted ones): a client's padded
    width, and with it every reduction over its samples, is then the same on any number of ranks
    (see :class:`ClientSplit`)."""

    def __init__(self, train_x: torch.Tensor, train_y: torch.Tensor, splits, clients: range, device, dtype):
        self.first = clients.start if len(clients) else 0
        hosted = [splits[i] for i in clients]
        used = np.unique(np.concatenate([np.concatenate(s) for s in hosted])) if hosted else np.zeros(0, np.int64)
        where = np.full(len(train_y), -1, dtype=np.int64)
        where[used] = np.arange(len(used))
        self.inputs = train_x[used].to(device, dtype)
        self.targets = train_y[used].to(device)
        widths = [max((len(split[side]) for split in splits), default=1) for side in (0, 1)]
        self.inner = ClientSplit.from_lists([where[tr] for tr, _ in hosted], widths[0])
        self.outer = ClientSplit.from_lists([where[va] for _, va in hosted], widths[1])


class ImageClients(HostedSamples):
    """An MNIST-format training set (``cfg.dataset`` in ``cfg.data_dir`` or ``$FEDNEST_DATA``)
    partitioned into clients by ``cfg`` (:func:`partition_clients`), the hosted clients' samples
    kept on ``device``, and the 10k test set.

    ``select(labels) -> indices`` restricts the training set first (e.g. the long-tail subset);
    its shards may then differ in size by one, so that no selected sample is dropped.
    """

    def __init__(self, cfg, seed: int, clients: range, device, dtype, select=None):
        data = load_mnist(resolve_data_dir(cfg.data_dir or None, cfg.dataset), variant=cfg.dataset)
        labels = data.train_y.numpy()
        keep = np.arange(len(labels)) if select is None else select(labels)
        parts = partition_clients(labels[keep], cfg, seed, equal_shards=select is None)
        super().__init__(data.train_x, data.train_y, [(keep[tr], keep[va]) for tr, va in parts], clients, device, dtype)
        self.train_labels = labels[keep]  #: labels of the (selected) training set, every client's
        self.test_inputs = data.test_x.to(device, dtype)
        self.test_targets = data.test_y.to(device)

    def attach(self, problem) -> None:
        """Give ``problem`` the attributes the batched oracles read."""
        problem._first = self.first
        problem.inputs, problem.targets, problem.inner, problem.outer = (
            self.inputs,
            self.targets,
            self.inner,
            self.outer,
        )
        problem.test_inputs, problem.test_targets = self.test_inputs, self.test_targets


class FileClients(HostedSamples):
    """The clients of the federated data-set file ``cfg.data_file`` (docs/data.md): its partition
    replaces ``cfg.partition``; each client's rows are split into inner and outer parts by
    :func:`~fednest_mpi.data.split_inner_outer` (keyed by the seed and the client id, as for
    :class:`ImageClients`); only the hosted block's rows are read, used as stored (no
    normalisation); the metrics use the file's test set, which must hold every class. Samples must
    have ``n_features`` numbers and labels ``n_classes`` classes."""

    def __init__(self, cfg, seed: int, clients: range, device, dtype, n_features: int, n_classes: int):
        data = FederatedFile(cfg.data_file)
        where = f"problem.data_file {cfg.data_file!r}"
        if data.n_clients != cfg.n_clients:
            raise ConfigError(
                f"problem.n_clients: {cfg.n_clients}, but {where} holds {data.n_clients} clients; "
                f"set problem.n_clients = {data.n_clients}"
            )
        if int(np.prod(data.feature_shape)) != n_features or data.n_classes != n_classes:
            raise DataError(
                f"{where} holds samples of shape {data.feature_shape} in {data.n_classes} classes; "
                f"problem {cfg.name!r} needs {n_features} numbers per sample and {n_classes} classes"
            )
        offsets = data.offsets
        try:
            splits = split_inner_outer(
                [np.arange(a, b) for a, b in zip(offsets[:-1], offsets[1:])], cfg.val_fraction, seed
            )
        except ValueError as exc:
            raise ConfigError(f"problem.val_fraction: {exc}") from None
        check_batch_sizes(splits, cfg)
        block, lo = data.read_clients(clients), int(offsets[clients.start])
        rows = torch.from_numpy(block.features.reshape(len(block.features), n_features))
        shifted = [(tr - lo, va - lo) for tr, va in splits]  # positions in the block's rows (only hosted ones are read)
        super().__init__(rows, torch.from_numpy(block.labels), shifted, clients, device, dtype)
        self.train_labels = data.labels()  #: every client's labels
        test = data.read_test()
        if test is None:
            raise DataError(
                f"{where} has no test set, which the metrics need; convert it with test_features and test_labels"
            )
        test_x, test_y = test
        missing = np.setdiff1d(np.arange(n_classes), test_y)
        if missing.size:  # per-class test metrics (loss_tuning's balanced accuracy) would be NaN
            raise DataError(
                f"{where}: its test set has no sample of class(es) {', '.join(map(str, missing[:10]))}; "
                "the metrics need every class, so add test samples of them and convert again"
            )
        self.test_inputs = torch.from_numpy(test_x.reshape(len(test_x), n_features)).to(device, dtype)
        self.test_targets = torch.from_numpy(test_y).to(device)

    attach = ImageClients.attach


def image_clients(cfg, seed: int, clients: range, device, dtype, select=None, n_features=784, n_classes=10):
    """The hosted clients' data: :class:`FileClients` when ``cfg.data_file`` is set (``select``
    unused: the file is taken as it is), else :class:`ImageClients`."""
    if cfg.data_file:
        return FileClients(cfg, seed, clients, device, dtype, n_features, n_classes)
    return ImageClients(cfg, seed, clients, device, dtype, select=select)
