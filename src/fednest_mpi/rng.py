"""Counter-based random streams keyed by (seed, round, client id, purpose, ...), never by rank.

Every random number the simulator draws is a pure function of integer keys, computed with the
SplitMix64 mixing function (Steele, Lea & Flood 2014) on ``uint64`` arrays. A client's minibatch
or noise therefore does not depend on which rank hosts it, on how many ranks there are, or on
what was drawn before: the basis of rank-count invariance and of bitwise restart.

Purposes are small integers from :class:`Purpose`; add new ones at the end.
"""

from __future__ import annotations

import enum
import math

import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


class Purpose(enum.IntEnum):
    """What a stream is used for; one independent stream family per member."""

    INNER_CLIENTS = 1  # FedInn client set, per (round, inner round t)
    OUTER_CLIENTS = 2  # FedOut client set, per round
    IHGP_CLIENTS = 3  # FedIHGP client sets S_n, per (round, n)
    IHGP_LENGTH = 4  # random truncation N' of FedIHGP / LFedOut
    INNER_SAMPLE = 5  # minibatches / noise of inner oracles
    OUTER_SAMPLE = 6  # minibatches / noise of outer oracles
    HVP_SAMPLE = 7  # minibatches / noise of Hessian and Jacobian products
    PROBLEM_DATA = 8  # synthetic problem data, per client
    INIT = 9  # initial iterates


def _splitmix(z: np.ndarray) -> np.ndarray:
    z = (z + _GOLDEN).astype(np.uint64)
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def key(*parts) -> np.ndarray:
    """Hash integer parts (scalars or broadcastable arrays) into one ``uint64`` key per element."""
    with np.errstate(over="ignore"):
        h = np.zeros((), dtype=np.uint64)
        for part in parts:
            p = np.asarray(part).astype(np.int64).astype(np.uint64)
            h = _splitmix(h ^ _splitmix(p))
        return h


def uniform(keys: np.ndarray, n: int) -> np.ndarray:
    """Uniform [0, 1) floats, shape ``keys.shape + (n,)``, element j drawn from ``key(k, j)``."""
    bits = key(np.asarray(keys)[..., None], np.arange(n, dtype=np.int64))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def normal(keys: np.ndarray, n: int) -> np.ndarray:
    """Standard normal floats, shape ``keys.shape + (n,)`` (Box-Muller on two counter streams)."""
    k = np.asarray(keys)
    u1 = uniform(key(k, 1), n)
    u2 = uniform(key(k, 2), n)
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


def permutation(keys: np.ndarray, n: int) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` per key, shape ``keys.shape + (n,)``."""
    return np.argsort(uniform(keys, n), axis=-1, kind="stable")


def sample_without_replacement(k: np.ndarray, population: int, size: int) -> np.ndarray:
    """``size`` distinct integers from ``range(population)``, uniformly, in increasing order.

    Uses a Philox generator keyed by ``k`` (cost O(size) for ``size`` << ``population``), so
    every rank computes the same set without communication.
    """
    gen = np.random.Generator(np.random.Philox(key=int(k)))
    return np.sort(gen.choice(population, size=size, replace=False))


def integer(k: np.ndarray, low: int, high: int) -> int:
    """One integer uniformly from ``[low, high)``."""
    return low + int(uniform(k, 1)[0] * (high - low))


def stream_normals(keys: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
    """Standard normals (float32) of many keyed streams at once, concatenated: the first
    ``lengths[i]`` numbers of stream ``keys[i]``, for every i, in one vectorised pass (no loop over
    streams). Stream k's j-th 64-bit word is the SplitMix64 output ``mix(k + (j + 1) * golden)``;
    each word gives two normals by Box-Muller (radius from its high 23 bits, angle from its low
    half's; values within about 5.7 standard deviations). A stream's numbers depend on its key
    alone, not on which other streams are drawn with it (tested bitwise across groupings)."""
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    words = (lengths + 1) // 2
    if keys.size and np.all(words == words[0]):  # equal streams: a (streams, words) grid
        z = keys[:, None] + np.arange(1, int(words[0]) + 1, dtype=np.uint64)[None, :] * _GOLDEN
    else:
        total = int(words.sum())
        counter = np.arange(1, total + 1, dtype=np.uint64) - np.repeat(np.cumsum(words) - words, words).astype(
            np.uint64
        )
        z = keys[np.repeat(np.arange(keys.size), words)] + counter * _GOLDEN
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    halves = z.reshape(-1).view(np.uint32).reshape(-1, 2)  # little-endian: (low, high) 32-bit halves
    unit = torch.from_numpy(((halves >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32))  # [1, 2)
    radius = unit[:, 1].neg().add_(2.0).log_().mul_(-2.0).sqrt_()  # from u in (0, 1]
    angle = unit[:, 0].sub(1.0).mul_(2.0 * math.pi)
    out = torch.empty(unit.shape, dtype=torch.float32)
    out[:, 0] = radius * torch.cos(angle)
    out[:, 1] = radius.mul_(torch.sin(angle))
    out = out.reshape(-1)
    if np.any(lengths % 2):  # an odd-length stream drops the second number of its last word
        keep = np.ones(out.numel(), dtype=bool)
        keep[2 * np.cumsum(words)[lengths % 2 == 1] - 1] = False
        out = out[torch.from_numpy(keep)]
    return out
