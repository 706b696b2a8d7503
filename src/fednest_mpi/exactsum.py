"""Sums whose bits do not depend on the order or grouping of their summands (binned pre-rounding).

A federated aggregation is a sum over the members of a round S. Floating-point addition is not
associative, so a plain sum depends on how the members are split into chunks and ranks. This module
makes the sum exact instead (Demmel & Nguyen, "Parallel Reproducible Summation", IEEE TC 2015; the
idea of ReproBLAS's binned numbers, written here for torch tensors):

* The real line is cut into **bins** of :data:`BIN_BITS` bits at fixed absolute positions: bin ``p``
  holds multiples of ``2**(p * BIN_BITS)``.
* A summand ``c`` whose magnitude is below ``2**(t * BIN_BITS - 1)`` (its **top** ``t``) is split into
  :data:`BINS` slices, one per bin ``t-1, t-2, ...``: ``q = (r + sigma) - sigma`` rounds the remainder
  ``r`` to the bin's grid (``sigma = 1.5 * 2**(ulp + 52)``), then ``r -= q``. Both operations are exact
  IEEE operations, so the slices depend on ``c`` and the bin positions only -- and a bin above a
  value's own top receives exactly 0 (``|c|`` is below half its grid step), so a window that starts
  higher gives the same slices in the bins it shares.
* A slice is below ``2**(BIN_BITS - 1)`` grid steps, so up to :data:`MAX_SUMMANDS` of them add up
  **exactly** in float64 in any order: the per-bin totals of a chunk, of a rank and of the
  ``Allreduce(SUM)`` over ranks are the same bits however the summands were grouped.
* Each coordinate keeps :data:`BINS` bins below its own top (the largest top of its summands so far);
  when a larger summand arrives the window moves up and the lowest bins drop out. Every rank drops
  what lies below the window of the *global* top, which one ``Allreduce(MAX)`` of the tops gives
  before the sum (:meth:`BinnedSum.align`), so the kept bins -- and the result, their sum in a fixed
  order -- are the same on any number of ranks.

Speed: :meth:`BinnedSum.add` runs a fused C loop (``exactsum_kernel.c``: the same IEEE operations, so the same bits,
in one pass over a cache-sized tile of columns instead of a torch operation per step) when a C compiler is
found; it is compiled once per source, compiler and CPU into ``$XDG_CACHE_HOME/fednest-mpi`` (:func:`kernel`).
Without one, or with ``FEDNEST_EXACTSUM_KERNEL=off``, the torch operations below compute the same bits, slower.

Accuracy: every coordinate keeps at least ``(BINS - 1) * BIN_BITS + 1`` bits below its largest summand
(65 for float64 payloads, 33 for float32), more than the payload's own precision; the result is then
rounded once. Cost: a few passes over the summands (no library kernel whose path depends on the CPU:
additions and subtractions only) and ``BINS`` float64 words per coordinate on the wire, independent of
|S|, of the chunk size and of the number of ranks. No MPI here: :mod:`fednest_mpi.federation` issues
the two collectives.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from fednest_mpi import native

#: bits per bin (the grid of bin p is 2**(p * BIN_BITS))
BIN_BITS = 32
#: bins kept per coordinate, by payload dtype
BINS = {torch.float64: 3, torch.float32: 2, torch.float16: 2, torch.bfloat16: 2}
#: the most summands one coordinate may receive: slices below 2**(BIN_BITS - 1) grid steps add exactly in
#: float64 while their count stays below 2**(53 - BIN_BITS + 1)
MAX_SUMMANDS = 2 ** (53 - BIN_BITS)  # 2,097,152
#: the range of tops: every sigma a normal float64 (values beyond 2**990 are outside the exact range; below
#: 2**-961 they round to the lowest grid)
TOP_MIN, TOP_MAX = -30, 31
#: elements of the float64 working set per pass (columns are taken in blocks of about this many elements: the
#: passes stay in the core's cache, and the block is large enough that the per-operation overhead is small)
_BLOCK_ELEMENTS = 1 << 17


#: ``off``: never use the compiled kernel (the torch operations give the same bits); ``auto`` (default): use it
#: when it can be built
KERNEL_VARIABLE = "FEDNEST_EXACTSUM_KERNEL"
_KERNEL_SOURCE = Path(__file__).with_name("exactsum_kernel.c")
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ADD = ([_PTR, _I64, _PTR, _I64, _I64, ctypes.c_int, _PTR, _PTR, _I64], ctypes.c_int)
_ALIGN = ([_PTR, _PTR, _I64, ctypes.c_int, _PTR, _I64], None)


@cache
def kernel() -> ctypes.CDLL | None:
    """The compiled fused loop of :meth:`BinnedSum.add` and the in-place :meth:`BinnedSum.align`
    (:func:`fednest_mpi.native.numeric_kernel`), or None (then the torch operations compute the same bits)."""
    return native.numeric_kernel(
        _KERNEL_SOURCE,
        KERNEL_VARIABLE,
        "exact sum (the torch operations compute it, slower)",
        {"binned_add_f32": _ADD, "binned_add_f64": _ADD, "binned_align": _ALIGN},
    )


def bins_for(dtype: torch.dtype) -> int:
    """Bins per coordinate for a payload of ``dtype``."""
    return BINS.get(dtype, 3)


def tops(values: torch.Tensor) -> torch.Tensor:
    """Per column of ``values`` (B, d) float64, the smallest top t with every |value| < 2**(t * BIN_BITS - 1):
    int64 (d,); TOP_MIN for an all-zero column, TOP_MAX for one with a non-finite value."""
    m = torch.linalg.vector_norm(values, float("inf"), dim=0) if values.shape[0] else values.new_zeros(values.shape[1])
    _, e = torch.frexp(m)  # m < 2**e
    t = torch.div(e.to(torch.int64) + BIN_BITS, BIN_BITS, rounding_mode="floor")  # ceil((e + 1) / BIN_BITS)
    t = torch.where(m == 0, TOP_MIN, t)
    t = torch.where(torch.isfinite(m), t, TOP_MAX)
    return t.clamp_(TOP_MIN, TOP_MAX)


class BinnedSum:
    """An exact, order-independent running sum of rows of ``d`` numbers (module docstring)."""

    def __init__(self, d: int, n_bins: int, device: torch.device | str = "cpu"):
        self.top = torch.full((d,), TOP_MIN, dtype=torch.int64, device=device)
        self.bins = torch.zeros((n_bins, d), dtype=torch.float64, device=device)
        self.empty = True  # nothing added or aligned yet: every top TOP_MIN, every bin 0

    @property
    def n_bins(self) -> int:
        return int(self.bins.shape[0])

    def align(self, top: torch.Tensor) -> None:
        """Move every coordinate's window up to ``top`` (>= the current top, elementwise): a bin keeps its
        absolute position, bins that leave the window are dropped, new ones start at 0."""
        shift = top - self.top
        if bool((shift == 0).all()):
            return
        if bool((shift < 0).any()):
            raise ValueError("BinnedSum.align: a coordinate's top may only rise")
        self.empty = False
        fn = kernel()
        if fn is not None and top.device.type == "cpu":  # in place, only the columns that move (a 2-rank
            # aggregation of 180,000 coordinates: about 2 ms by the torch operations below)
            self.top, self.bins = self.top.contiguous(), self.bins.contiguous()
            top = top.to(torch.int64).contiguous()
            fn.binned_align(
                self.top.data_ptr(), self.bins.data_ptr(), self.bins.stride(0), self.n_bins, top.data_ptr(), top.numel()
            )
            return
        k = torch.arange(self.n_bins, device=top.device)[:, None] - shift[None, :]
        moved = self.bins.gather(0, k.clamp(min=0))
        self.bins = torch.where(k >= 0, moved, torch.zeros((), dtype=torch.float64, device=top.device))
        self.top = top.clone()

    def add(self, values: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """Add the rows of ``values`` (B, d), any float dtype (converted to float64 exactly), each multiplied
        by its float64 weight first when ``weights`` (B,) is given (one rounding, per element)."""
        if values.shape[0] == 0:
            return
        if values.shape[0] > 1 and values.stride(0) == 0 and (weights is None or bool((weights == weights[0]).all())):
            self._add_copies(values[:1], None if weights is None else weights[:1], int(values.shape[0]))
            return
        self.empty = False
        if self._add_compiled(values, weights):
            return
        d = values.shape[1]
        step = max(64, _BLOCK_ELEMENTS // max(1, values.shape[0]))
        for lo in range(0, d, step):
            if weights is None:
                block = values[:, lo : lo + step].to(torch.float64, copy=True)  # the remainders, overwritten
            else:  # one pass: the payload converted exactly, times its weight in float64 (one rounding)
                block = torch.mul(values[:, lo : lo + step], weights[:, None])
            hi = lo + block.shape[1]
            top = torch.maximum(self.top[lo:hi], tops(block))
            self._align_columns(lo, hi, top)
            self._deposit(block, lo, hi)

    def _add_copies(self, row: torch.Tensor, weight: torch.Tensor | None, n: int) -> None:
        """Add ``n`` copies of the (1, d) ``row`` (a shared block, stride 0, with one weight for all): its slices
        are cut once, in the window the copies would have moved to, and added times ``n``. The same bits as ``n``
        deposits: a slice is an integer of at most ``BIN_BITS - 1`` bits on its bin's grid, so ``n`` times it and
        the bin's total stay exact while the bin receives at most :data:`MAX_SUMMANDS` summands (the limit of
        every sum here, checked by the config). A non-finite slice stays what ``n`` additions make of it. Into an
        empty sum (FedOut's aggregation at tau = 1) the row is deposited in place and the bins multiplied."""
        if self.empty:
            self.add(row, weight)
            self.bins *= n
            return
        once = BinnedSum(int(row.shape[1]), self.n_bins, device=self.bins.device)
        once.top = self.top.clone()
        once.add(row, weight)
        self.align(once.top)
        self.bins += once.bins * n

    def _add_compiled(self, values: torch.Tensor, weights: torch.Tensor | None) -> bool:
        """:meth:`add` by the compiled kernel (:func:`kernel`): False, having done nothing, where it does not apply
        (no kernel, not on the CPU, a payload dtype other than float32 and float64)."""
        fn = kernel()
        if fn is None or values.device.type != "cpu" or values.dtype not in (torch.float32, torch.float64):
            return False
        if self.n_bins not in (2, 3):  # the kernel's bin counts (exactsum.BINS)
            return False
        if values.stride(1) != 1:
            values = values.contiguous()
        if weights is not None:
            weights = weights.to("cpu", torch.float64).contiguous()
        self.top, self.bins = self.top.contiguous(), self.bins.contiguous()
        rows, cols = values.shape
        add = fn.binned_add_f32 if values.dtype == torch.float32 else fn.binned_add_f64
        return 0 == add(
            values.data_ptr(),
            values.stride(0),
            None if weights is None else weights.data_ptr(),
            rows,
            cols,
            self.n_bins,
            self.top.data_ptr(),
            self.bins.data_ptr(),
            self.bins.stride(0),
        )  # -1: its working set could not be allocated, nothing done (the torch path computes the same bits)

    def _align_columns(self, lo: int, hi: int, top: torch.Tensor) -> None:
        shift = top - self.top[lo:hi]
        if bool((shift == 0).all()):
            return
        k = torch.arange(self.n_bins, device=top.device)[:, None] - shift[None, :]
        moved = self.bins[:, lo:hi].gather(0, k.clamp(min=0))
        self.bins[:, lo:hi] = torch.where(k >= 0, moved, torch.zeros((), dtype=torch.float64, device=top.device))
        self.top[lo:hi] = top

    def _deposit(self, block: torch.Tensor, lo: int, hi: int) -> None:
        """Slice every value of ``block`` (B, hi - lo, overwritten) into the window of columns lo:hi and add the
        slices."""
        r = block
        q = torch.empty_like(r)
        one_and_half = torch.tensor(1.5, dtype=torch.float64, device=block.device)
        for k in range(self.n_bins):
            exponent = (self.top[lo:hi] - k - 1) * BIN_BITS + 52  # sigma = 1.5 * 2**(grid + 52)
            sigma = torch.ldexp(one_and_half, exponent.to(torch.float64))
            torch.add(r, sigma, out=q)
            q.sub_(sigma)  # r rounded to the grid of bin top - k - 1: exact
            self.bins[k, lo:hi] += q.sum(0)  # slices on one grid, bounded: exact in any order
            if k + 1 < self.n_bins:
                r.sub_(q)  # the remainder: exact

    def value(self) -> torch.Tensor:
        """The sum, float64 (d,): the bins added from the top down, one rounding per addition, the same order
        on every rank."""
        out = self.bins[0] + self.bins[1] if self.n_bins > 1 else self.bins[0].clone()
        for k in range(2, self.n_bins):
            out += self.bins[k]
        return out
