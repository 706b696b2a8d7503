"""The exact reduction (fednest_mpi.exactsum, federation.reduction = "exact"): the same bits for every grouping
of the summands, accurate against the exact rational sum, O(d) words whatever the number of summands."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch
from compiled_paths import on_both_paths

from fednest_mpi import config, exactsum
from fednest_mpi.comm import SerialComm
from fednest_mpi.errors import ConfigError
from fednest_mpi.federation import Federation
from fednest_mpi.rng import key as rng_key


def _rows(dtype, n=41, d=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-25, 25, d, dtype=torch.float64)
    rows = torch.randn(n, d, generator=gen, dtype=torch.float64) * scale
    rows[:, 3] = 0.0  # an all-zero column
    rows[5, 9] = 1e30  # one huge summand among small ones
    rows[:, 11] = torch.tensor([(-1) ** i * 2.0**-1000 for i in range(n)])  # tiny, cancelling
    return rows.to(dtype)


def _grouped_sum(rows, groups, n_bins):
    """The sum of ``rows`` as ranks would form it: each group summed chunk by chunk, then combined."""
    parts = []
    for members, chunk in groups:
        acc = exactsum.BinnedSum(rows.shape[1], n_bins)
        for lo in range(0, len(members), chunk):
            acc.add(rows[members[lo : lo + chunk]])
        parts.append(acc)
    top = torch.stack([p.top for p in parts]).amax(0)
    for p in parts:
        p.align(top)
    total = exactsum.BinnedSum(rows.shape[1], n_bins)
    total.top, total.bins = top, sum(p.bins for p in parts)
    return total.value()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_grouping_gives_the_same_bits_and_the_sum_is_accurate(dtype):
    rows = _rows(dtype)
    n_bins = exactsum.bins_for(dtype)
    rng = np.random.default_rng(3)
    results = []
    for _ in range(6):
        order = rng.permutation(rows.shape[0])
        cuts = np.sort(rng.choice(np.arange(1, rows.shape[0]), size=rng.integers(0, 4), replace=False))
        groups = [(g, int(rng.integers(1, 9))) for g in np.split(order, cuts)]
        results.append(_grouped_sum(rows, groups, n_bins))
    for r in results[1:]:
        assert torch.equal(r, results[0])
    exact = [sum((Fraction(float(v)) for v in rows[:, j].tolist()), Fraction(0)) for j in range(rows.shape[1])]
    got = results[0]
    for j, e in enumerate(exact):
        biggest = max(abs(float(v)) for v in rows[:, j].tolist())
        # at least 65 (float64) / 33 (float32) bits below the largest summand, then one rounding per bin
        bound = biggest * 2.0 ** -(64 if dtype == torch.float64 else 32) * rows.shape[0] + abs(float(e)) * 2.0**-51
        assert abs(Fraction(float(got[j])) - e) <= Fraction(bound), (j, float(got[j]), float(e))


def test_non_finite_summands_give_a_non_finite_sum():
    rows = torch.ones(4, 3, dtype=torch.float64)
    rows[1, 0], rows[2, 1] = float("inf"), float("nan")
    acc = exactsum.BinnedSum(3, 3)
    acc.add(rows)
    out = acc.value()
    assert not torch.isfinite(out[0]) and torch.isnan(out[1]) and out[2] == 4.0


def test_the_weighted_mean_of_a_federation_is_bitwise_that_of_any_chunking():
    """Federation.mean_over with the exact reduction: chunks of 1, 3 and all give the same bits, close to the
    plain weighted sum, and the bytes counted per aggregation are the vector's, whatever |S|."""
    gen = torch.Generator().manual_seed(1)
    bytes_per_round = set()
    for n in (17, 170):
        rows = torch.randn(n, 50, generator=gen, dtype=torch.float64)
        outs = []
        for chunk in (1, 3, 0):
            fed = Federation(SerialComm(), n)
            fed.chunk_clients = chunk
            part = fed.sample(rng_key(1, 2), n)
            before = fed.stats.bytes
            (out,) = fed.mean_over(part, lambda piece: [rows[piece.local_slots]])
            bytes_per_round.add(fed.stats.bytes - before)
            outs.append(out)
        assert all(torch.equal(o, outs[0]) for o in outs)
        torch.testing.assert_close(outs[0], rows.mean(0), rtol=1e-14, atol=1e-15)
    assert bytes_per_round == {50 * 8}  # the aggregated vector (what the algorithm sends), whatever |S|


def test_too_many_summands_for_the_exact_reduction_is_a_config_error():
    data = {
        "problem": {"name": "quadratic", "n_clients": exactsum.MAX_SUMMANDS + 1, "dim_x": 2, "dim_y": 2},
        "algorithm": {"clients_per_round": exactsum.MAX_SUMMANDS + 1},
    }
    with pytest.raises(ConfigError, match="federation.reduction: 'exact' adds at most"):
        config.from_dict(data)


def _both_paths(monkeypatch, chunks, n_bins, weights=None):
    """The BinnedSum of the row blocks ``chunks`` (added one after another) by the compiled kernel and by the
    torch operations."""

    def binned_sum():
        acc = exactsum.BinnedSum(chunks[0].shape[1], n_bins)
        for i, chunk in enumerate(chunks):
            acc.add(chunk, None if weights is None else weights[i])
        return acc

    return on_both_paths(monkeypatch, exactsum.KERNEL_VARIABLE, exactsum.kernel, binned_sum)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_compiled_kernel_gives_the_bits_of_the_torch_operations(monkeypatch, dtype, weighted):
    """Bins, tops and value bit for bit: magnitudes over 100 binades, zero and cancelling columns, a huge
    summand arriving in a later chunk (the window moves up), rows strided inside a wider tensor."""
    rows = _rows(dtype, n=41, d=300)
    wide = torch.cat([rows, rows[:, :5]], dim=1)[:, :300]  # a view with row stride 305
    chunks = [wide[8:41], wide[7:8], wide[:7]]  # row 5 (1e30) comes last
    gen = torch.Generator().manual_seed(3)
    weights = [torch.rand(c.shape[0], generator=gen, dtype=torch.float64) for c in chunks] if weighted else None
    compiled, plain = _both_paths(monkeypatch, chunks, exactsum.bins_for(dtype), weights)
    assert torch.equal(compiled.top, plain.top)
    assert torch.equal(compiled.bins, plain.bins)
    assert torch.equal(compiled.value(), plain.value())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_kernel_blocks_and_tiles_give_the_bits_of_the_torch_operations(monkeypatch, dtype):
    """One call of many rows and columns, as the kernel blocks them (row blocks of 32, column tiles of 512):
    tops that rise in later row blocks of the same call (each block's window moves up and is sliced again), a
    column that meets a NaN in a late block, then a second call into the same sum."""
    gen = torch.Generator().manual_seed(5)
    n, d = 150, 1100
    growth = torch.logspace(0, 40, n, dtype=torch.float64)[:, None]  # every row block raises the columns' tops
    rows = torch.randn(n, d, generator=gen, dtype=torch.float64) * torch.logspace(-20, 20, d, dtype=torch.float64)
    rows[:, ::3] *= growth
    rows[97, 1000] = float("nan")
    rows[120, 7] = float("inf")
    rows = rows.to(dtype)
    weights = [torch.rand(n, generator=gen, dtype=torch.float64), torch.rand(40, generator=gen, dtype=torch.float64)]
    compiled, plain = _both_paths(monkeypatch, [rows, rows[:40] * 3], exactsum.bins_for(dtype), weights)
    assert torch.equal(compiled.top, plain.top)
    assert int(compiled.top[1000]) == int(compiled.top[7]) == exactsum.TOP_MAX
    finite = torch.isfinite(plain.bins).all(0)
    assert torch.equal(finite, torch.isfinite(compiled.bins).all(0)) and not finite[[7, 1000]].any()
    assert torch.equal(compiled.bins[:, finite], plain.bins[:, finite])
    assert torch.equal(compiled.value()[finite], plain.value()[finite])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_kernel_first_windows_give_the_bits_of_the_torch_operations(monkeypatch, dtype):
    """The first windows of a fresh tile, set for all its columns at once: magnitudes at every binade edge of the
    lowest windows (2**-961 and its neighbours), zeros and subnormals, then a tile whose columns already hold
    values below TOP_MIN's limit (bins not empty, every top still TOP_MIN) when larger values arrive."""
    exps = torch.arange(-1074 if dtype == torch.float64 else -149, 128 if dtype == torch.float32 else 1000, 7)
    edges = torch.cat([exps.to(torch.float64), torch.tensor([-961.0, -962.0, -960.0, -929.0, -928.0, -897.0])])
    row = torch.ldexp(torch.ones_like(edges), edges).to(dtype)
    rows = torch.stack([row, -0.75 * row, torch.zeros_like(row), 1.5 * row])
    compiled, plain = _both_paths(monkeypatch, [rows[:1], rows], exactsum.bins_for(dtype))
    assert torch.equal(compiled.top, plain.top) and torch.equal(compiled.bins, plain.bins)
    if dtype == torch.float64:  # float32 has no value below 2**-961
        tiny = torch.full((3, 40), 2.0**-1000, dtype=dtype) * torch.arange(1, 4, dtype=dtype)[:, None]
        exponents = torch.arange(-961.0, -881.0, 2.0, dtype=dtype)
        lifts = torch.ldexp(torch.ones(40, dtype=dtype), exponents)[None, :]  # the windows move up by 1-3 bins
        compiled, plain = _both_paths(monkeypatch, [tiny, lifts, tiny], 2)
        assert torch.equal(compiled.top, plain.top) and torch.equal(compiled.bins, plain.bins)
        assert torch.equal(compiled.value(), plain.value())


def test_compiled_kernel_marks_non_finite_columns_as_the_torch_operations(monkeypatch):
    rows = _rows(torch.float64, n=6, d=20)
    rows[2, 4], rows[3, 5], rows[1, 6] = float("inf"), float("nan"), -float("inf")
    compiled, plain = _both_paths(monkeypatch, [rows[:3], rows[3:]], 3)
    assert torch.equal(compiled.top, plain.top) and int(compiled.top[4]) == exactsum.TOP_MAX
    finite = torch.isfinite(plain.value())
    assert torch.equal(finite, torch.isfinite(compiled.value())) and not finite[4:7].any()
    assert torch.equal(compiled.value()[finite], plain.value()[finite])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kernel", ["auto", "off"])
def test_a_shared_row_is_deposited_once_with_the_bits_of_its_copies(monkeypatch, dtype, kernel):
    """A shared block (one row, stride 0: FedOut's x - alpha h of every client at tau = 1) with one weight for all
    is sliced once and added n times over: bins, tops and value bit for bit those of its n copies, after other
    rows (the window already up in some columns, rising in others) and with non-finite values; with unequal
    weights the copies are deposited one by one."""
    monkeypatch.setenv(exactsum.KERNEL_VARIABLE, kernel)
    exactsum.kernel.cache_clear()
    once = []
    cut_once = exactsum.BinnedSum._add_copies
    monkeypatch.setattr(exactsum.BinnedSum, "_add_copies", lambda acc, *a: once.append(a[2]) or cut_once(acc, *a))
    rows = _rows(dtype, n=41, d=300)
    row = rows[6].clone()
    row[20], row[21] = float("inf"), float("nan")
    cases = ((1000, torch.full((1000,), 1e-3, dtype=torch.float64)), (7, None), (5, torch.arange(5.0)))
    for (n, weights), first in itertools.product(cases, (True, False)):  # after other rows, or into an empty sum
        shared, copies = (exactsum.BinnedSum(300, exactsum.bins_for(dtype)) for _ in range(2))
        for acc, block in ((shared, row.expand(n, -1)), (copies, row.expand(n, -1).contiguous())):
            if first:
                acc.add(rows[:3])
            acc.add(block, weights)
        assert torch.equal(shared.top, copies.top)
        for a, b in ((shared.bins, copies.bins), (shared.value(), copies.value())):
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    assert once == [1000, 1000, 7, 7]  # the shared blocks with one weight were cut once; unequal weights were not
    exactsum.kernel.cache_clear()


@pytest.mark.parametrize("n_bins", [2, 3])
def test_compiled_align_moves_the_bins_as_the_torch_operations(monkeypatch, n_bins):
    """BinnedSum.align in place by the kernel: bins, tops and value bit for bit those of the torch path, for
    columns whose windows rise by 0, 1, 2 and more bins (all dropped); a falling top is refused on both paths."""
    rows = _rows(torch.float64, n=9, d=300)
    rise = torch.arange(300) % 5  # 0 .. 4 bins up

    def aligned():
        acc = exactsum.BinnedSum(300, n_bins)
        acc.add(rows)
        target = (acc.top + rise).clamp(max=exactsum.TOP_MAX)
        acc.align(target)
        assert torch.equal(acc.top, target)
        with pytest.raises(ValueError, match="only rise"):
            acc.align(target - 1)
        return acc

    compiled, plain = on_both_paths(monkeypatch, exactsum.KERNEL_VARIABLE, exactsum.kernel, aligned)
    assert torch.equal(compiled.bins, plain.bins) and torch.equal(compiled.value(), plain.value())
