"""Counter-based random streams keyed by (seed, round, client id, purpose, ...), never by rank.

Every random number the simulator draws is a pure function of integer keys, computed with the
SplitMix64 mixing function (Steele, Lea & Flood 2014) on ``uint64`` arrays. A client's minibatch
or noise therefore does not depend on which rank hosts it, on how many ranks there are, or on
what was drawn before: the basis of rank-count invariance and of bitwise restart.

Purposes are small integers from :class:`Purpose`; add new ones at the end.
"""

from __future__ import annotations

import ctypes
import enum
import math
from functools import cache
from pathlib import Path

import numpy as np
import torch

from fednest_mpi import native

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
    LOCAL_WORK = 10  # a client's number of local steps (heterogeneity.py), per client or (round, client)
    ANSWERS = 11  # whether a member answers a communication round (heterogeneity.py), per (round, client)
    PROBE = 12  # the sample of the contract probe of a problem's oracles at construction (contract.py)


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


STREAM_BLOCK = 1 << 15
"""Words (two normals each) that :func:`stream_normals` hashes and transforms per pass, in buffers of about 32
bytes per word that stay in the core's L2 cache (instead of stream-sized temporaries streamed through memory).
The values do not depend on it (tested with blocks that end inside streams)."""

_FEW_DROPS = 32  # up to this many odd streams ending in a block, their dropped numbers are cut by slice copies
_TWO_PI = np.float32(2.0 * math.pi)


def stream_normals(keys: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
    """Standard normals (float32) of many keyed streams at once, concatenated: the first
    ``lengths[i]`` numbers of stream ``keys[i]``, for every i, in one vectorised pass (no loop over
    streams). Stream k's j-th 64-bit word is the SplitMix64 output ``mix(k + (j + 1) * golden)``;
    each word gives two normals by Box-Muller (radius from its high 23 bits, angle from its low
    half's; values within about 5.7 standard deviations). A stream's numbers depend on its key
    alone, not on which other streams are drawn with it (tested bitwise across groupings).

    Exactly, in float32, with a half's 23 high bits as the mantissa of u in [1, 2): radius =
    sqrt(-2 log(2 - u_high)), angle = (u_low - 1) * fl(2 pi), numbers (radius cos(angle), radius sin(angle));
    an odd-length stream drops the second number of its last word. The words are made :data:`STREAM_BLOCK` at
    a time in buffers allocated once per call and each block's numbers written into the output, so memory is
    the output plus O(block). log, sqrt, cos and sin are torch's kernels (numpy's float32 ones round
    differently); every other step is exact or one correctly rounded float32 operation. The output is
    allocated by numpy (which asks for transparent huge pages: its first touch costs a third of torch's
    4 KiB pages here) and shared with the returned tensor."""
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    flat = np.empty(int(lengths.sum()), dtype=np.float32)
    words = (lengths + 1) // 2
    total = int(words.sum())
    if total == 0:
        return torch.from_numpy(flat)
    ends = np.cumsum(words)  # stream i owns the words [starts[i], ends[i]) of the concatenation
    starts = ends - words
    odd = lengths % 2 == 1
    block = min(STREAM_BLOCK, total)
    with np.errstate(over="ignore"):  # word g of stream i is mix(base[i] + g * golden), all mod 2^64
        base = keys + (np.uint64(1) - starts.astype(np.uint64)) * _GOLDEN
        step = np.arange(block, dtype=np.uint64) * _GOLDEN
    buffers = _NormalBuffers(block, pairs=bool(odd.any()))
    o = 0  # output position of the block's first number
    for a in range(0, total, block):
        n = min(block, total - a)
        s0 = int(np.searchsorted(ends, a, side="right"))  # the streams with words in [a, a + n)
        s1 = int(np.searchsorted(starts, a + n, side="left"))
        firsts = base[s0:s1] + np.uint64(a * int(_GOLDEN) % 2**64)  # z = base[stream] + a * golden + step
        if s1 - s0 > 1:
            firsts = np.repeat(firsts, np.minimum(ends[s0:s1], a + n) - np.maximum(starts[s0:s1], a))
        r, c, s = buffers.normals(firsts, step, n)
        dropped = _NO_DROPS  # positions in the block's numbers of the second number of an odd stream's last word
        if buffers.pairs is not None:
            last = ends[s0:s1]
            dropped = 2 * (last[odd[s0:s1] & (last <= a + n)] - a) - 1
        o = _write_numbers(flat, o, r, c, s, dropped, buffers.pairs)
    return torch.from_numpy(flat)


_NO_DROPS = np.empty(0, dtype=np.int64)

#: ``off``: never use the compiled passes of :func:`stream_normals` (the numpy passes give the same bits); ``auto``
#: (default): use them when they can be built
KERNEL_VARIABLE = "FEDNEST_NORMALS_KERNEL"
_KERNEL_SOURCE = Path(__file__).with_name("normals_kernel.c")


@cache
def kernel() -> ctypes.CDLL | None:
    """The compiled integer and float32 passes of :func:`stream_normals` (``normals_kernel.c``, built by
    :func:`fednest_mpi.native.numeric_kernel`), or None (then numpy's passes compute the same bits, slower)."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return native.numeric_kernel(
        _KERNEL_SOURCE,
        KERNEL_VARIABLE,
        "normals (numpy's passes compute them, slower)",
        {
            "normal_inputs": ([ptr, i64, ptr, i64, ctypes.c_float, ptr, ptr], None),
            "normal_pairs": ([ptr, ptr, ptr, i64, ptr], None),
        },
    )


class _NormalBuffers:
    """The word-sized buffers of :func:`stream_normals`, allocated once per call: ``z`` holds the words, then radius
    and angle; ``tmp`` the mix's shifts, then the halves as floats u in [1, 2), then cos and sin (each read before
    it is overwritten). ``pairs``: a block's numbers before odd streams' cuts (None when no stream is odd)."""

    def __init__(self, block: int, pairs: bool):
        self.z = np.empty(block, dtype=np.uint64)
        self.tmp = np.empty(block, dtype=np.uint64)
        self.halves = self.z.view(np.uint32).reshape(block, 2)  # little-endian: (low, high) 32-bit halves
        self.unit_bits = self.tmp.view(np.uint32).reshape(block, 2)
        self.unit = self.tmp.view(np.float32).reshape(block, 2)
        self.radius, self.angle = self.z.view(np.float32)[:block], self.z.view(np.float32)[block:]
        self.cos, self.sin = self.tmp.view(np.float32)[:block], self.tmp.view(np.float32)[block:]
        self.tensors = tuple(torch.from_numpy(x) for x in (self.radius, self.angle, self.cos, self.sin))
        self.pairs = np.empty((block, 2), dtype=np.float32) if pairs else None

    def normals(self, firsts: np.ndarray, step: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(radius, cos, sin) of the block's ``n`` words ``firsts + step`` (``firsts``: one per word, or one for
        all): SplitMix64's mix, then Box-Muller (:func:`stream_normals`), the integer and float32 passes compiled
        (:func:`kernel`) or numpy's (:meth:`_inputs`), the same bits; views of the buffers, valid until the next
        call."""
        whole = n == self.z.shape[0]
        if whole:
            r, an, c, s = self.radius, self.angle, self.cos, self.sin
            r_t, an_t, c_t, s_t = self.tensors
        else:
            r, an, c, s = self.radius[:n], self.angle[:n], self.cos[:n], self.sin[:n]
            r_t, an_t, c_t, s_t = (t[:n] for t in self.tensors)
        lib = kernel()
        if lib is not None:  # the C loop reads firsts and step as contiguous uint64 (no copy when they are)
            firsts, step = np.ascontiguousarray(firsts, np.uint64), np.ascontiguousarray(step, np.uint64)
            lib.normal_inputs(
                firsts.ctypes.data, int(firsts.size > 1), step.ctypes.data, n, _TWO_PI, r.ctypes.data, an.ctypes.data
            )
        else:
            self._inputs(firsts, step, n, r, an)
        torch.log(r_t, out=r_t)
        np.multiply(r, np.float32(-2.0), out=r)
        torch.sqrt(r_t, out=r_t)
        torch.cos(an_t, out=c_t)
        torch.sin(an_t, out=s_t)
        return r, c, s

    def _inputs(self, firsts: np.ndarray, step: np.ndarray, n: int, r: np.ndarray, an: np.ndarray) -> None:
        """The words' ``2 - u_high`` into ``r`` and ``(u_low - 1) fl(2 pi)`` into ``an`` by numpy's passes
        (``normals_kernel.c``'s ``normal_inputs`` computes the same bits in one)."""
        zb, tb = (self.z, self.tmp) if n == self.z.shape[0] else (self.z[:n], self.tmp[:n])
        np.add(firsts, step[:n], out=zb)
        np.right_shift(zb, np.uint64(30), out=tb)  # SplitMix64's mix, in place
        np.bitwise_xor(zb, tb, out=zb)
        np.multiply(zb, _M1, out=zb)
        np.right_shift(zb, np.uint64(27), out=tb)
        np.bitwise_xor(zb, tb, out=zb)
        np.multiply(zb, _M2, out=zb)
        np.right_shift(zb, np.uint64(31), out=tb)
        np.bitwise_xor(zb, tb, out=zb)
        u = self.unit[:n]
        np.right_shift(self.halves[:n], np.uint32(9), out=self.unit_bits[:n])
        np.bitwise_or(self.unit_bits[:n], np.uint32(0x3F800000), out=self.unit_bits[:n])
        np.subtract(np.float32(2.0), u[:, 1], out=r)  # in (0, 1], exact
        np.subtract(u[:, 0], np.float32(1.0), out=an)  # exact
        np.multiply(an, _TWO_PI, out=an)


def _pairs(r: np.ndarray, c: np.ndarray, s: np.ndarray, out: np.ndarray) -> None:
    """``out`` (n, 2, contiguous) = (r cos, r sin) per word: compiled (:func:`kernel`) or numpy's, the same bits."""
    lib = kernel()
    if lib is not None:
        lib.normal_pairs(r.ctypes.data, c.ctypes.data, s.ctypes.data, r.shape[0], out.ctypes.data)
    else:
        np.multiply(r, c, out=out[:, 0])
        np.multiply(r, s, out=out[:, 1])


def _write_numbers(flat, o: int, r, c, s, dropped: np.ndarray, pairs) -> int:
    """Write a block's numbers (r cos, r sin per word) into ``flat`` from position ``o``, without the ``dropped``
    ones (the second number of an odd stream's last word); the position after them."""
    n = r.shape[0]
    if not dropped.size:
        _pairs(r, c, s, flat[o : o + 2 * n].reshape(n, 2))
        return o + 2 * n
    _pairs(r, c, s, pairs[:n])
    numbers = pairs[:n].reshape(-1)
    if dropped.size <= _FEW_DROPS:  # copy the runs between dropped numbers
        cut = 0
        for stop in dropped.tolist() + [2 * n]:
            flat[o : o + stop - cut] = numbers[cut:stop]
            o += stop - cut
            cut = stop + 1
        return o
    keep = np.ones(2 * n, dtype=bool)
    keep[dropped] = False
    flat[o : o + 2 * n - dropped.size] = numbers[keep]
    return o + 2 * n - dropped.size
