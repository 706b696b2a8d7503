"""Splitting a data set among federated clients (pure numpy, deterministic in the seed).

* :func:`iid_partition`: a random permutation cut into equal parts, ``n_samples // n_clients``
  samples per client (McMahan et al. 2017, IID case; the remainder is left unused).
* :func:`shard_partition`: McMahan et al.'s pathological non-IID split: indices sorted by label,
  cut into ``n_shards`` equal (or, if asked, nearly equal) shards, ``shards_per_client`` random
  shards per client.
* :func:`dirichlet_partition`: label skew (Hsu et al. 2019): each class is shared among clients in
  proportions drawn from Dirichlet(alpha), redrawn until every client has ``min_size`` samples.
* :func:`split_inner_outer`: each client's indices split into an inner (training) part and an
  outer (validation) part of ``ceil(val_fraction * n_i)`` samples.
* :func:`long_tail_indices`: an imbalanced subset, class c keeping
  ``min(ceil(max_per_class * mu**c), count_c)`` samples with ``mu = ratio**(-1/(n_classes-1))``.

Every random choice is drawn from :mod:`fednest_mpi.rng` keys ``(seed, purpose, ...)`` with the
purposes below (beyond :class:`~fednest_mpi.rng.Purpose`, so they never meet its streams), so a
partition depends on the seed and the arguments only, never on MPI ranks. Each client's indices
are returned sorted ascending. Invalid arguments raise :class:`ValueError`.
"""

from __future__ import annotations

import math

import numpy as np

from fednest_mpi import rng

_IID = 101
_SHARDS = 102
_DIRICHLET = 103
_SPLIT = 104
_MAX_DIRICHLET_DRAWS = 1000


def _check_clients(n_samples: int, n_clients: int, per_client: int = 1) -> None:
    if n_clients < 1:
        raise ValueError(f"n_clients must be at least 1, got {n_clients}")
    if n_samples < n_clients * per_client:
        raise ValueError(
            f"cannot give {n_clients} clients {per_client} sample(s) each from only "
            f"{n_samples} samples; use fewer clients"
        )


def _labels(labels) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got shape {labels.shape} of {labels.dtype}")
    return labels


def iid_partition(n_samples: int, n_clients: int, seed: int) -> list[np.ndarray]:
    """``n_clients`` disjoint random index sets of ``n_samples // n_clients`` each."""
    _check_clients(n_samples, n_clients)
    size = n_samples // n_clients
    perm = rng.permutation(rng.key(seed, _IID), n_samples)
    return [np.sort(perm[i * size : (i + 1) * size]) for i in range(n_clients)]


def shard_partition(
    labels, n_clients: int, seed: int, n_shards: int = 200, shards_per_client: int = 2, equal_shards: bool = True
) -> list[np.ndarray]:
    """Label-sorted indices cut into ``n_shards`` shards; ``shards_per_client`` random ones each.

    With ``equal_shards`` (McMahan et al.) ``n_shards`` must divide the number of samples;
    otherwise shard sizes differ by at most one (no sample dropped: a long-tailed set keeps all of
    its rarest class). Needs ``n_clients * shards_per_client <= n_shards``; shards left over are
    unused.
    """
    labels = _labels(labels)
    n = len(labels)
    if n_shards < 1 or shards_per_client < 1:
        raise ValueError(f"n_shards and shards_per_client must be at least 1, got {n_shards} and {shards_per_client}")
    if equal_shards and n % n_shards:
        raise ValueError(f"{n} samples cannot be cut into {n_shards} equal shards; choose n_shards dividing {n}")
    _check_clients(n_shards, n_clients, shards_per_client)
    shards = np.array_split(np.argsort(labels, kind="stable"), n_shards)
    order = rng.permutation(rng.key(seed, _SHARDS), n_shards)
    return [
        np.sort(np.concatenate([shards[j] for j in order[i * shards_per_client : (i + 1) * shards_per_client]]))
        for i in range(n_clients)
    ]


def _dirichlet_draw(by_class: list[np.ndarray], n_clients: int, alpha: float, seed: int, draw: int) -> list[np.ndarray]:
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for j, idx in enumerate(by_class):
        gen = np.random.Generator(np.random.Philox(key=int(rng.key(seed, _DIRICHLET, draw, j))))
        cuts = (np.cumsum(gen.dirichlet(np.full(n_clients, alpha)))[:-1] * len(idx)).astype(np.int64)
        for i, chunk in enumerate(np.split(idx, cuts)):
            parts[i].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def dirichlet_partition(labels, n_clients: int, alpha: float, seed: int, min_size: int = 1) -> list[np.ndarray]:
    """Every sample to one client; class c is shared in proportions p_c ~ Dirichlet(alpha).

    Small ``alpha`` gives each client few classes; large ``alpha`` approaches an IID split. The
    proportions are redrawn (draw 0, 1, ... of the seed's stream) until every client holds at
    least ``min_size`` samples; :class:`ValueError` after 1000 failed draws.
    """
    labels = _labels(labels)
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    if min_size < 0:
        raise ValueError(f"min_size must be non-negative, got {min_size}")
    _check_clients(len(labels), n_clients, max(min_size, 1))
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    by_class = [idx[rng.permutation(rng.key(seed, _DIRICHLET, -1, j), len(idx))] for j, idx in enumerate(by_class)]
    for draw in range(_MAX_DIRICHLET_DRAWS):
        parts = _dirichlet_draw(by_class, n_clients, alpha, seed, draw)
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise ValueError(
        f"no Dirichlet(alpha={alpha}) split in {_MAX_DIRICHLET_DRAWS} draws gave each "
        f"of {n_clients} clients {min_size} samples; raise alpha or lower min_size "
        f"or n_clients"
    )


def split_inner_outer(
    client_indices: list[np.ndarray], val_fraction: float, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per client i, ``(train_idx, val_idx)`` with ``ceil(val_fraction * n_i)`` random validation
    indices; client i's split uses the key ``(seed, client i)`` only.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    indices = [np.asarray(idx) for idx in client_indices]
    sizes = np.array([len(idx) for idx in indices], dtype=np.int64)
    n_val = np.ceil(val_fraction * sizes - 1e-9).astype(np.int64)  # tolerance: 0.7 * 10 is 7.000000000000001
    short = np.flatnonzero(n_val >= sizes)
    if short.size:
        i = int(short[0])
        raise ValueError(
            f"client {i} has {sizes[i]} samples: val_fraction={val_fraction} "
            f"leaves none for training; give clients more samples"
        )
    perms: list[np.ndarray] = [np.empty(0, np.int64)] * len(indices)
    for n in np.unique(sizes):  # clients of one size draw their permutations in one vectorised call
        members = np.flatnonzero(sizes == n)
        for i, perm in zip(members.tolist(), rng.permutation(rng.key(seed, _SPLIT, members), int(n))):
            perms[i] = perm
    return [(np.sort(idx[perm[v:]]), np.sort(idx[perm[:v]])) for idx, perm, v in zip(indices, perms, n_val.tolist())]


def long_tail_indices(labels, n_classes: int = 10, max_per_class: int = 6000, ratio: float = 100) -> np.ndarray:
    """Sorted indices of a long-tailed subset: the first ``min(ceil(max_per_class * mu**c),
    count_c)`` samples of each class c in file order, ``mu = ratio**(-1/(n_classes-1))``.
    """
    labels = _labels(labels)
    if n_classes < 2 or max_per_class < 1 or ratio < 1:
        raise ValueError(
            f"need n_classes >= 2, max_per_class >= 1 and ratio >= 1, got {n_classes}, {max_per_class} and {ratio}"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"labels must be in 0..{n_classes - 1}, found {labels.min()}..{labels.max()}")
    mu = ratio ** (-1.0 / (n_classes - 1))
    keep = [np.flatnonzero(labels == c)[: math.ceil(max_per_class * mu**c)] for c in range(n_classes)]
    return np.sort(np.concatenate(keep))
