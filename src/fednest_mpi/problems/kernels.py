"""Dense kernels of the batched oracles whose results must not depend on how clients are grouped.

A run is bitwise the same for every chunk size and rank count (``federation.reduction =
"ordered"``) only if a client's numbers do not depend on the other clients evaluated with it. Two
CPU facts break that for products over many clients' rows at once: BLAS chooses its blocking, and
with it the order of the additions, by the shape of the whole product (the row of one sample in
``addmm`` over 8 rows and over 28 rows of 784 inputs differs in the last bit), and reductions over a
zero-padded axis are not always padding-invariant (``bmm`` and ``sum`` over 11 samples padded to
16 or 34 differ). So: products of shared weights with the rows of a block go through
:func:`rowwise_linear`, which always multiplies fixed-shape tiles (:func:`tile_rows`; the last
one zero-padded) by the same 2-d ``addmm``: every row meets the same kernel whatever the block (tested in
``tests/unit/test_kernels.py`` and end to end in ``tests/mpi/test_chunking.py``); padded widths
come from the whole population (:class:`~fednest_mpi.problems.clientdata.ClientSplit`).
Cost: 5-25 % over one ``addmm`` of the whole block at 640-5,000 rows (docs/performance.md).
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from fednest_mpi import native

TILE_BYTES = 2**20  # a tile's rows and results: about half of this core's 2 MiB L2


def tile_rows(K: int, N: int, itemsize: int) -> int:
    """Rows per tile of a (K -> N) product: the largest power of two whose rows and results fit
    :data:`TILE_BYTES`, within 64 .. 4096. A function of the shapes only, never of the number of
    rows, so a row meets the same kernel in every block. Measured (float32, one core): 72,800 x
    60 -> 64 rows in 5.7 ms with 2,048-row tiles against 11.2 ms with 128 and 13.5 ms in one
    ``addmm``; 4,000 x 784 -> 200 in 8.1 ms with 128 or 256 against 7.4 ms in one ``addmm``."""
    rows = TILE_BYTES // ((K + N) * itemsize)
    return min(4096, max(64, 1 << max(0, rows.bit_length() - 1)))


def rowwise_linear(rows: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``rows @ weight_t (+ bias)`` for (..., K) ``rows`` and a shared (K, N) ``weight_t``, with
    each row's result independent of the other rows: one ``addmm`` per tile of :func:`tile_rows`
    rows, the last tile zero-padded (a batched ``baddbmm`` of the tiles is not enough: in float64
    it rounds a tile differently in a batch of 6 than alone)."""
    K, N = weight_t.shape
    T = tile_rows(K, N, weight_t.element_size())
    flat = rows.reshape(-1, K)
    M = flat.shape[0]
    out = flat.new_empty(M, N)
    base = (flat.new_zeros(()) if bias is None else bias).expand(T, N)
    full = M - M % T
    for lo in range(0, full, T):
        torch.addmm(base, flat[lo : lo + T], weight_t, out=out[lo : lo + T])
    if full < M:
        tile = flat.new_zeros(T, K)
        tile[: M - full] = flat[full:]
        out[full:] = torch.addmm(base, tile, weight_t)[: M - full]
    return out.view(*rows.shape[:-1], N)


#: ``off``: :func:`gram` by its torch operations (the same bits, slower), for tests of that path
GRAM_KERNEL_VARIABLE = "FEDNEST_GRAM_KERNEL"
_GRAM_SOURCE = Path(__file__).with_name("gram_kernel.c")
GRAM_LANES = 8  #: the partial sums of each dot product of :func:`gram` (gram_kernel.c's LANES)


@cache
def gram_kernel() -> ctypes.CDLL | None:
    """The compiled :func:`gram` and :func:`low_rank_add_` (``gram_kernel.c``), or None (then their torch
    operations give the same bits)."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    signature = ([ptr, ptr, ptr] + [i64] * 8, None)
    return native.numeric_kernel(
        _GRAM_SOURCE,
        GRAM_KERNEL_VARIABLE,
        "Gram products (torch's operations compute them, slower)",
        {name: signature for name in ("gram_f32", "gram_f64", "low_rank_add_f32", "low_rank_add_f64")},
    )


def gram(X: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """``X @ P^T`` per client, (C, b, k), for X (C, b, K) and P (C, k, K) whose rows are contiguous, each dot
    product summed in one fixed order that this module writes itself (gram_kernel.c: :data:`GRAM_LANES`
    partial sums by position, then a fixed tree), so a client's numbers depend on its own rows only: not on
    the block, the BLAS or its mode (MKL's strict mode costs these small batched products 1.5-2x)."""
    if X.device.type != "cpu":  # a GPU: its batched product (docs/design.md states the bits for x86-64 CPUs)
        return torch.bmm(X, P.transpose(1, 2))
    C, b, K = X.shape
    k = P.shape[1]
    if X.stride(2) != 1:
        X = X.contiguous()
    if P.stride(2) != 1:
        P = P.contiguous()
    out = X.new_empty(C, b, k)
    lib = gram_kernel() if X.dtype in (torch.float32, torch.float64) else None
    if lib is None or P.dtype != X.dtype:
        return _gram_torch(X, P.to(X.dtype), out)
    fn = lib.gram_f32 if X.dtype == torch.float32 else lib.gram_f64
    fn(X.data_ptr(), P.data_ptr(), out.data_ptr(), C, b, k, K, X.stride(0), X.stride(1), P.stride(0), P.stride(1))
    return out


def _gram_torch(X: torch.Tensor, P: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """:func:`gram` by torch's element-wise operations, lane block by lane block: the compiled kernel's bits."""
    K, L = X.shape[2], GRAM_LANES
    acc = X.new_zeros(*out.shape, L)
    full = K - K % L
    for lo in range(0, full, L):
        acc += X[:, :, None, lo : lo + L] * P[:, None, :, lo : lo + L]
    if full < K:
        acc[..., : K - full] += X[:, :, None, full:] * P[:, None, :, full:]
    for half in (4, 2, 1):
        acc[..., :half] += acc[..., half : 2 * half]
    return out.copy_(acc[..., 0])


def low_rank_add_(out: torch.Tensor, G: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """``out += G @ R`` per client, in place, for out (C, b, N), G (C, b, k) and R (C, k, N) whose rows are
    contiguous: the k terms G[c, i, j] R[c, j] added to ``out`` one at a time in increasing j (gram_kernel.c), so
    a client's numbers depend on its own rows only, as in :func:`gram`. Returns ``out``."""
    if out.device.type != "cpu":  # a GPU: its batched product, as in gram
        return out.baddbmm_(G, R)
    C, b, N = out.shape
    k = G.shape[2]
    G = G.contiguous()
    if R.stride(2) != 1:
        R = R.contiguous()
    lib = gram_kernel() if out.dtype in (torch.float32, torch.float64) else None
    if lib is None or out.stride(2) != 1 or G.dtype != out.dtype or R.dtype != out.dtype:
        for j in range(k):
            out += G[:, :, j, None] * R[:, None, j, :]
        return out
    fn = lib.low_rank_add_f32 if out.dtype == torch.float32 else lib.low_rank_add_f64
    fn(G.data_ptr(), R.data_ptr(), out.data_ptr(), C, b, k, N, R.stride(0), R.stride(1), out.stride(0), out.stride(1))
    return out


def gram_norms(products: list[tuple[torch.Tensor, torch.Tensor]], plain: torch.Tensor) -> torch.Tensor:
    """sqrt(sum over the pairs (L, R) of ||L_i^T R_i||_F^2, plus ``plain``) per client i, in float64: for L (B, K,
    out) and R (B, K, in), ||L^T R||_F^2 = sum((L L^T) o (R R^T)), K x K Gram matrices instead of the out x in
    product (K a client's few samples). A block of one client is computed as two (``bmm`` multiplies a batch of
    one by another kernel), so a client's value has the same bits in any block."""
    total = plain.to(torch.float64)
    for L, R in products:
        if L.shape[0] == 1:
            L, R = torch.cat([L, L]), torch.cat([R, R])
        L, R = L.to(torch.float64), R.to(torch.float64)
        gram = torch.bmm(L, L.transpose(1, 2)).mul_(torch.bmm(R, R.transpose(1, 2)))
        total = total + gram.sum((1, 2))[: total.shape[0]]
    return total.clamp_(min=0.0).sqrt_()


def softmax_(logits: torch.Tensor) -> torch.Tensor:
    """softmax over the last axis, in place: exp(z - max z) / sum exp(z - max z). On CPU,
    ``torch.softmax`` over short rows (10 classes) is about 6x slower than these four vectorised
    passes (33 vs 5.3 ms for 10,000 x 16 x 10, docs/performance.md)."""
    logits.sub_(logits.amax(-1, keepdim=True)).exp_()
    return logits.div_(logits.sum(-1, keepdim=True))


def sigmoid(z: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-z)). ``torch.sigmoid`` computes the last elements of a tensor (the part that
    does not fill a vector register) by another formula than the rest, which differs in the last
    bit for 2-5 % of inputs, so a client's value would depend on its place in the block; ``exp``
    and ``reciprocal`` give the same bits at every position (measured on 4,096 positions)."""
    return torch.reciprocal(1.0 + torch.exp(-z))


def softplus(z: torch.Tensor) -> torch.Tensor:
    """log(1 + exp(z)) = max(z, 0) + log1p(exp(-|z|)), position independent (``F.softplus`` and its
    gradient, a sigmoid, use vectorised kernels whose tail rounds differently, see :func:`sigmoid`);
    plain differentiable operations, so ``torch.func`` transforms and double backward go through it."""
    return z.clamp(min=0) + torch.log1p(torch.exp(-z.abs()))


class _BinaryCrossEntropyWithLogits(torch.autograd.Function):
    """-t log sigmoid(z) - (1 - t) log(1 - sigmoid(z)) = max(z, 0) - z t + log1p(exp(-|z|)), with the
    gradient (sigmoid(z) - t) g written in differentiable operations (double backward works)."""

    @staticmethod
    def forward(ctx, z, t):
        ctx.save_for_backward(z, t)
        return z.clamp(min=0) - z * t + torch.log1p(torch.exp(-z.abs()))

    @staticmethod
    def backward(ctx, grad):
        z, t = ctx.saved_tensors
        return grad * (sigmoid(z) - t), None


def binary_cross_entropy_with_logits(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Per-element logistic loss of logits ``z`` and 0/1 targets ``t`` (no reduction), position
    independent (``torch.nn.functional.binary_cross_entropy_with_logits`` is not: it uses
    ``torch.sigmoid``'s kernels, see :func:`sigmoid`)."""
    return _BinaryCrossEntropyWithLogits.apply(z, t)
