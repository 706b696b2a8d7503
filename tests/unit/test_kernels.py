"""Kernels whose results must not depend on how clients are grouped (problems/kernels.py)."""

import pytest
import torch
from compiled_paths import on_both_paths

from fednest_mpi.problems import kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(784, 200), (64, 10), (60, 64)])
def test_rowwise_linear_gives_a_row_the_same_bits_in_every_block(dtype, shape):
    K, N = shape
    gen = torch.Generator().manual_seed(K)
    W = torch.randn(N, K, generator=gen, dtype=dtype)
    b = torch.randn(N, generator=gen, dtype=dtype)
    X = torch.randn(2 * 4096 + 3, K, generator=gen, dtype=dtype)
    alone = kernels.rowwise_linear(X[:1], W.T, b)[0]
    tol = 1e-4 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(alone, torch.addmm(b, X[:1], W.T)[0], rtol=tol, atol=tol)  # to rounding
    T = kernels.tile_rows(K, N, X.element_size())
    for M in (2, 7, T, T + 1, 2 * T + 3):
        for at in (0, M // 2, M - 1):  # the row at the start, inside and at the end of full and padded tiles
            block = X[1:M].clone() if M > 1 else X[:0].clone()
            block = torch.cat([block[:at], X[:1], block[at:]])
            assert torch.equal(kernels.rowwise_linear(block, W.T, b)[at], alone), (M, at)
    batched = kernels.rowwise_linear(X[:30].view(5, 6, K), W.T)  # leading axes kept, no bias
    torch.testing.assert_close(batched, (X[:30] @ W.T).view(5, 6, N), rtol=tol, atol=tol)


def test_softmax_in_place_matches_torch():
    z = torch.randn(50, 16, 10, dtype=torch.float64) * 30
    expected = torch.softmax(z, -1)
    out = kernels.softmax_(z)
    assert out.data_ptr() == z.data_ptr()
    torch.testing.assert_close(out, expected, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sigmoid_gives_an_element_the_same_bits_at_every_position(dtype):
    z = torch.randn(4096 + 7, generator=torch.Generator().manual_seed(1), dtype=dtype) * 5
    whole = kernels.sigmoid(z)
    torch.testing.assert_close(whole, torch.sigmoid(z))
    for at in range(0, 4096, 37):  # alone: the element is in the part of the tensor that fills no vector register
        assert torch.equal(kernels.sigmoid(z[at : at + 1])[0], whole[at])


def test_logistic_loss_value_gradient_and_hessian_match_torch():
    gen = torch.Generator().manual_seed(2)
    z = (torch.randn(300, generator=gen, dtype=torch.float64) * 8).requires_grad_()
    z.data[:3] = torch.tensor([0.0, 40.0, -40.0], dtype=torch.float64)  # the kink-free point 0 and both tails
    t = (torch.rand(300, generator=gen, dtype=torch.float64) > 0.5).to(torch.float64)
    w = torch.randn(300, generator=gen, dtype=torch.float64)
    ours = kernels.binary_cross_entropy_with_logits(z, t)
    theirs = torch.nn.functional.binary_cross_entropy_with_logits(z, t, reduction="none")
    torch.testing.assert_close(ours, theirs, rtol=1e-14, atol=1e-13)
    (g1,) = torch.autograd.grad((w * ours).sum(), z, create_graph=True)
    (g2,) = torch.autograd.grad((w * theirs).sum(), z, create_graph=True)
    torch.testing.assert_close(g1, g2, rtol=1e-14, atol=1e-15)
    (h1,) = torch.autograd.grad(g1.sum(), z)
    (h2,) = torch.autograd.grad(g2.sum(), z)
    torch.testing.assert_close(h1, h2, rtol=1e-12, atol=1e-15)


def _gram_both(monkeypatch, X, P):
    """kernels.gram by the compiled kernel and by its torch operations."""
    return on_both_paths(monkeypatch, kernels.GRAM_KERNEL_VARIABLE, kernels.gram_kernel, lambda: kernels.gram(X, P))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(4, 784, 16), (3, 200, 5), (6, 37, 9), (1, 15, 2)])
def test_gram_is_the_product_to_rounding_with_the_bits_of_its_torch_path_in_every_block(monkeypatch, dtype, shape):
    """Per client X P^T: to rounding of the float64 product; compiled and torch paths bit for bit (dot products
    of K = 784, 200, 37 and 15: whole and partial lane blocks; b rows in fours and the rest); P a slice of a
    wider history buffer (its clients strided); a client's
    result the same alone and in blocks of any size and position."""
    b, K, k = shape
    gen = torch.Generator().manual_seed(K)
    X = torch.randn(9, b, K, generator=gen, dtype=dtype)
    history = torch.randn(9, k + 3, K, generator=gen, dtype=dtype)
    P = history[:, :k]
    compiled, plain = _gram_both(monkeypatch, X, P)
    assert torch.equal(compiled, plain)
    exact = torch.bmm(X.double(), P.double().transpose(1, 2))
    tol = 1e-5 * K if dtype == torch.float32 else 1e-13 * K
    torch.testing.assert_close(compiled.double(), exact, rtol=0, atol=tol)
    for lo, hi in ((0, 1), (4, 5), (8, 9), (2, 7), (0, 9)):
        assert torch.equal(kernels.gram(X[lo:hi].clone(), history[lo:hi, :k].clone()), compiled[lo:hi])


def test_gram_adds_in_the_written_order():
    """The order of the additions is gram_kernel.c's, not some other exact-in-theory one: 1 and twice 2**-24 eight
    lanes apart (lane 0 twice) gives what that order gives and what a sequential sum would not."""
    K = 33
    x = torch.zeros(1, 1, K, dtype=torch.float32)
    x[0, 0, 0], x[0, 0, 16], x[0, 0, 32], x[0, 0, 1] = 1.0, 2.0**-24, 2.0**-24, -1.0
    ones = torch.ones(1, 1, K, dtype=torch.float32)
    # lane 0: 1 + 2**-24 (rounds to 1) + 2**-24 (rounds to 1) = 1; lane 1: -1; tree: 1 + -1 = 0
    assert float(kernels.gram(x, ones)[0, 0, 0]) == 0.0
    # a sequential sum: 1 - 1 + 2**-24 + 2**-24 = 2**-23
    assert float(x.double().sum()) == 2.0**-23


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(4, 16, 200), (6, 5, 784), (3, 1, 9)])
def test_low_rank_add_is_the_product_to_rounding_with_the_bits_of_its_torch_path_in_every_block(
    monkeypatch, dtype, shape
):
    """out += G R per client: to rounding of the float64 result; compiled and torch paths bit for bit (b rows in
    fours and the rest, R a slice of a wider buffer); a client's result the same alone and in any block."""
    b, k, N = shape
    gen = torch.Generator().manual_seed(N + k)
    out0 = torch.randn(9, b, N, generator=gen, dtype=dtype)
    G = torch.randn(9, b, k, generator=gen, dtype=dtype)
    R = torch.randn(9, k + 2, N, generator=gen, dtype=dtype)[:, :k]
    compiled, plain = on_both_paths(
        monkeypatch,
        kernels.GRAM_KERNEL_VARIABLE,
        kernels.gram_kernel,
        lambda: kernels.low_rank_add_(out0.clone(), G, R),
    )
    assert torch.equal(compiled, plain)
    exact = out0.double() + torch.bmm(G.double(), R.double())
    tol = 1e-5 * k if dtype == torch.float32 else 1e-13 * k
    torch.testing.assert_close(compiled.double(), exact, rtol=tol, atol=tol)
    for lo, hi in ((0, 1), (8, 9), (2, 7)):
        alone = kernels.low_rank_add_(out0[lo:hi].clone(), G[lo:hi].clone(), R[lo:hi].clone())
        assert torch.equal(alone, compiled[lo:hi])
