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
from fractions import Fraction
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


def stream_normals(keys: np.ndarray, lengths: np.ndarray, skip: int = 0) -> torch.Tensor:
    """Standard normals (float32) of many keyed streams at once, concatenated: the first
    ``lengths[i]`` numbers of stream ``keys[i]`` after its first ``skip`` (even: whole words), for every i, in one
    vectorised pass (no loop over streams); a number is the same bits whether it is drawn with or without the
    numbers before it. Stream k's j-th 64-bit word is the SplitMix64 output ``mix(k + (j + 1) * golden)``;
    each word gives two normals by Box-Muller (radius from its high 23 bits, angle from its low
    half's; values within about 5.7 standard deviations). A stream's numbers depend on its key
    alone, not on which other streams are drawn with it (tested bitwise across groupings).

    Exactly, with a half's 23 high bits as the mantissa of u in [1, 2): the numbers (r cos a, r sin a), r =
    sqrt(-2 log(2 - u_high)), a = 2 pi (u_low - 1), by :func:`box_muller` (the project's own log, cos and sin in
    float64, rounded once to float32: the same bits on every CPU); an odd-length stream drops the second number of
    its last word. The compiled kernel (:func:`kernel`) writes every stream's numbers straight into the output in one
    call; without it, numpy's passes make the words :data:`STREAM_BLOCK` at a time in buffers allocated once per
    call, so memory is the output plus O(block). The output is allocated by
    numpy (which asks for transparent huge pages: its first touch costs a third of torch's 4 KiB pages here) and
    shared with the returned tensor."""
    if skip % 2 or skip < 0:
        raise ValueError(f"stream_normals: skip={skip}: a whole number of words (an even count of numbers)")
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64).reshape(-1)
    flat = np.empty(int(lengths.sum()), dtype=np.float32)
    lib = kernel()
    if lib is not None:  # one compiled call for every stream (normals_kernel.c), from each stream's first word
        with np.errstate(over="ignore"):
            firsts = np.ascontiguousarray(keys + np.uint64(1 + skip // 2) * _GOLDEN)
        lib.stream_numbers(firsts.ctypes.data, lengths.ctypes.data, keys.size, *_SERIES_POINTERS, flat.ctypes.data)
        return torch.from_numpy(flat)
    words = (lengths + 1) // 2
    total = int(words.sum())
    if total == 0:
        return torch.from_numpy(flat)
    ends = np.cumsum(words)  # stream i owns the words [starts[i], ends[i]) of the concatenation
    starts = ends - words
    odd = lengths % 2 == 1
    block = min(STREAM_BLOCK, total)
    with np.errstate(over="ignore"):  # word g of stream i is mix(base[i] + g * golden), all mod 2^64
        base = keys + (np.uint64(1 + skip // 2) - starts.astype(np.uint64)) * _GOLDEN
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
        dropped = _NO_DROPS  # positions in the block's numbers of the second number of an odd stream's last word
        if buffers.pairs is not None:
            last = ends[s0:s1]
            dropped = 2 * (last[odd[s0:s1] & (last <= a + n)] - a) - 1
        o = _write_numbers(flat, o, buffers, firsts, step, n, dropped)
    return torch.from_numpy(flat)


_NO_DROPS = np.empty(0, dtype=np.int64)

#: ``off``: never use the compiled pass of :func:`stream_normals` (the numpy passes give the same bits); ``auto``
#: (default): use it when it can be built
KERNEL_VARIABLE = "FEDNEST_NORMALS_KERNEL"
_KERNEL_SOURCE = Path(__file__).with_name("normals_kernel.c")


@cache
def kernel() -> ctypes.CDLL | None:
    """The compiled pass of :func:`stream_normals` (``normals_kernel.c``, built by
    :func:`fednest_mpi.native.numeric_kernel`), or None (then numpy's passes compute the same bits, slower)."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return native.numeric_kernel(
        _KERNEL_SOURCE,
        KERNEL_VARIABLE,
        "normals (numpy's passes compute them, slower)",
        {"stream_numbers": ([ptr, ptr, i64, ptr, ptr, ptr, ptr], None)},
        vector_bits=512,  # 4.3 against 7.5 ns per word on the AMD EPYC here (docs/lab/issue34.md)
    )


def _series(terms) -> tuple[float, ...]:
    """The coefficients of a series as the doubles nearest to the exact fractions (highest power first: Horner)."""
    return tuple(float(t) for t in reversed(list(terms)))


_LOG_SERIES = _series(Fraction(1, 2 * k + 1) for k in range(11))  # 1 + z/3 + ... + z^10/21, z = s^2
_SIN_SERIES = _series(Fraction((-1) ** k, math.factorial(2 * k + 1)) for k in range(9))  # x - x^3/3! ... + x^17/17!
_COS_SERIES = _series(Fraction((-1) ** k, math.factorial(2 * k)) for k in range(10))  # 1 - x^2/2! ... - x^18/18!
_SERIES_ARRAYS = tuple(np.array(c, dtype=np.float64) for c in (_LOG_SERIES, _SIN_SERIES, _COS_SERIES))  # for the C loop
_SERIES_POINTERS = tuple(c.ctypes.data for c in _SERIES_ARRAYS)
_EXPONENT_MASK, _MANTISSA_MASK, _ONE_BITS = np.uint64(0x7FF), np.uint64(0x000FFFFFFFFFFFFF), np.uint64(0x3FF << 52)


def _horner(coefficients: tuple[float, ...], z: np.ndarray) -> np.ndarray:
    p = np.full_like(z, coefficients[0])
    for c in coefficients[1:]:
        p *= z
        p += c
    return p


def _log(t: np.ndarray) -> np.ndarray:
    """log t for normal doubles t in (0, 1], by the project's own series (every step one IEEE operation, so the
    same bits on every CPU, unlike a math library's log): t = m 2^e with m in [sqrt(1/2), sqrt(2)],
    s = (m - 1) / (m + 1), log t = e log 2 + 2 s (1 + s^2/3 + ... + s^20/21) (|s| <= 0.172: the next term is
    below 2^-53). Within 2 ulp of the true log (tests/unit/test_rng.py)."""
    bits = t.view(np.uint64)
    e = ((bits >> np.uint64(52)) & _EXPONENT_MASK).astype(np.int64) - 1023
    m = ((bits & _MANTISSA_MASK) | _ONE_BITS).view(np.float64)
    big = m > math.sqrt(2.0)
    m = np.where(big, m * 0.5, m)
    f = m - 1.0
    s = f / (2.0 + f)
    return (e + big).astype(np.float64) * math.log(2.0) + (2.0 * s) * _horner(_LOG_SERIES, s * s)


def box_muller(u_low: np.ndarray, u_high: np.ndarray, out: np.ndarray) -> None:
    """Box-Muller with the project's own elementary functions: for units u_low, u_high in [1, 2) (float32),
    ``out`` (n, 2) float32 = (r cos a, r sin a) with r = sqrt(-2 log(2 - u_high)) (:func:`_log`, IEEE sqrt) and the
    angle a = 2 pi (u_low - 1), taken in quarter turns: y = 4 (u_low - 1) (exact), k = rint(y), x = (y - k) pi/2 in
    [-pi/4, pi/4], cos and sin of x by their series to x^18 and x^17 (the next terms below 2^-53), then of a by the
    quadrant k. Every step is exact or one correctly rounded double operation, computed in float64 and rounded once
    to float32 at the end: the same bits on every x86-64 CPU (torch's float32 sqrt, log, cos and sin are MKL's
    vector math, whose code path, and last bits, depend on the CPU's vendor: docs/design.md). ``normals_kernel.c``
    computes the same bits in one pass."""
    radius = np.sqrt(-2.0 * _log(2.0 - u_high.astype(np.float64)))
    y = (u_low.astype(np.float64) - 1.0) * 4.0
    k = np.rint(y)
    x = (y - k) * (math.pi / 2)
    x2 = x * x
    sn = _horner(_SIN_SERIES, x2) * x
    cs = _horner(_COS_SERIES, x2)
    q = k.astype(np.int64) & 3
    c = np.select([q == 0, q == 1, q == 2], [cs, -sn, -cs], sn)
    s = np.select([q == 0, q == 1, q == 2], [sn, cs, -sn], -cs)
    np.multiply(radius, c, out=c)
    np.multiply(radius, s, out=s)
    out[:, 0] = c
    out[:, 1] = s


class _NormalBuffers:
    """The word-sized buffers of :func:`stream_normals`, allocated once per call: ``z`` holds the words, ``tmp`` the
    mix's shifts, then the halves as floats u in [1, 2) (numpy's passes only: the compiled loop keeps them in
    registers). ``pairs``: a block's numbers before odd streams' cuts (None when no stream is odd)."""

    def __init__(self, block: int, pairs: bool):
        self.pairs = np.empty((block, 2), dtype=np.float32) if pairs else None
        self.z = np.empty(block, dtype=np.uint64)
        self.tmp = np.empty(block, dtype=np.uint64)
        self.halves = self.z.view(np.uint32).reshape(block, 2)  # little-endian: (low, high) 32-bit halves
        self.unit_bits = self.tmp.view(np.uint32).reshape(block, 2)
        self.unit = self.tmp.view(np.float32).reshape(block, 2)

    def numbers(self, firsts: np.ndarray, step: np.ndarray, n: int, out: np.ndarray) -> None:
        """``out`` (n, 2) float32 = the two normals of each of the block's ``n`` words ``firsts + step``
        (``firsts``: one per word, or one for all): SplitMix64's mix, then :func:`box_muller` (numpy's passes; the
        compiled kernel computes the same bits per stream, without blocks)."""
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
        np.right_shift(self.halves[:n], np.uint32(9), out=self.unit_bits[:n])
        np.bitwise_or(self.unit_bits[:n], np.uint32(0x3F800000), out=self.unit_bits[:n])
        box_muller(self.unit[:n, 0], self.unit[:n, 1], out)


def _write_numbers(flat, o: int, buffers: _NormalBuffers, firsts, step, n: int, dropped: np.ndarray) -> int:
    """Write a block's numbers (two per word, :meth:`_NormalBuffers.numbers`) into ``flat`` from position ``o``,
    without the ``dropped`` ones (the second number of an odd stream's last word); the position after them."""
    if not dropped.size:
        buffers.numbers(firsts, step, n, flat[o : o + 2 * n].reshape(n, 2))
        return o + 2 * n
    pairs = buffers.pairs
    assert pairs is not None  # a stream is odd (dropped is not empty)
    buffers.numbers(firsts, step, n, pairs[:n])
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
