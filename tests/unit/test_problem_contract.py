"""The oracle contract of docs/extending.md, checked for every registered problem (built-ins and the test
plugins): shapes and dtypes of the five oracles, empty blocks (B = 0, as FedBiO / FedBiOAcc ask for on a
rank none of whose clients take part), one-client blocks, and rows that do not depend on their block."""

import numpy as np
import pytest
import torch
from small_configs import register_test_plugins, small_problem_section

from fednest_mpi import config
from fednest_mpi.problems import build_problem
from fednest_mpi.problems.base import Sample, shared_rows

register_test_plugins()
NAMES = sorted(config.PROBLEMS)  # every entry, plugins included


def problem_of(name, dtype=torch.float64):
    section = small_problem_section(name)
    cfg = config.from_dict({"problem": section, "algorithm": {"clients_per_round": 2}})
    return build_problem(cfg.problem, 3, range(0, cfg.problem.n_clients), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", NAMES)
def test_oracles_keep_the_contract_on_empty_single_and_shared_blocks(name, dtype):
    problem = problem_of(name, dtype)
    x, y = problem.initial_point()
    assert x.shape == (problem.dim_x,) and y.shape == (problem.dim_y,) and x.dtype == y.dtype == dtype
    sample = Sample(12345, 1)
    for ids in (np.array([], dtype=np.int64), np.array([2]), np.array([0, 2, 3])):
        B = ids.size
        X, Y = shared_rows(x, B), shared_rows(y, B)
        V = torch.ones(B, problem.dim_y, dtype=dtype)
        for oracle, args, width in (
            (problem.grad_x_outer, (X, Y), problem.dim_x),
            (problem.grad_y_outer, (X, Y), problem.dim_y),
            (problem.grad_y_inner, (X, Y), problem.dim_y),
            (problem.hvp_yy_inner, (X, Y, V), problem.dim_y),
            (problem.jvp_xy_inner, (X, Y, V), problem.dim_x),
        ):
            out = oracle(ids, *args, sample)
            assert out.shape == (B, width) and out.dtype == dtype, (oracle.__name__, B, out.shape, out.dtype)
            assert torch.isfinite(out).all(), (oracle.__name__, B)
            if B == 3:  # client 2's row alone equals its row inside the block
                alone = oracle(np.array([2]), *(a[:1] for a in args), sample)
                torch.testing.assert_close(alone[0], out[1], rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_the_primary_metric_is_one_that_evaluate_records(name):
    """`plot` and `report --at` default to the run file's primary metric: for every problem it is a metric
    that the run records (declared in metric_info and returned by evaluate)."""
    problem = problem_of(name)
    primary = problem.primary_metric or next(iter(problem.metric_info()))
    assert primary in problem.metric_info() and primary in problem.evaluate(*problem.initial_point())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", NAMES)
def test_every_oracle_row_is_the_same_bits_in_every_block(name, dtype):
    """Bitwise, not to a tolerance: what the chunk- and rank-count invariance of the ordered reduction
    rests on. Each client's rows of the five oracles (a minibatch and the whole split, at a point away
    from the initial one) in blocks of 1, 2 and 5 clients equal its rows in the block of six."""
    problem = problem_of(name, dtype)
    x, y = problem.initial_point()
    gen = torch.Generator().manual_seed(7)
    y = y + 0.1 * torch.randn(y.shape, generator=gen, dtype=dtype)
    n = min(problem.n_clients, 6)
    V = torch.randn(n, problem.dim_y, generator=gen, dtype=dtype)

    def at(c):
        return shared_rows(x, c.size), shared_rows(y, c.size)

    for sample in (Sample(12345, 1), None):
        calls = {
            "grad_x_outer": lambda c: problem.grad_x_outer(c, *at(c), sample),
            "grad_y_outer": lambda c: problem.grad_y_outer(c, *at(c), sample),
            "grad_y_inner": lambda c: problem.grad_y_inner(c, *at(c), sample),
            "hvp_yy_inner": lambda c: problem.hvp_yy_inner(c, *at(c), V[c], sample),
            "jvp_xy_inner": lambda c: problem.jvp_xy_inner(c, *at(c), V[c], sample),
        }
        for oracle, call in calls.items():
            whole = call(np.arange(n))
            for size in (1, 2, 5):
                for lo in range(0, n - size + 1, size):
                    block = np.arange(lo, lo + size)
                    assert torch.equal(call(block), whole[lo : lo + size]), (oracle, sample, size, lo)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_finite_is_isfinite_all_including_overflowing_sums(dtype):
    from fednest_mpi.contract import all_finite

    big = torch.finfo(dtype).max
    cases = {
        "finite": torch.tensor([[1.0, -2.0], [3.0, 4.0]], dtype=dtype),
        "nan": torch.tensor([[1.0, float("nan")]], dtype=dtype),
        "inf": torch.tensor([[float("inf"), 1.0]], dtype=dtype),
        "minus inf": torch.tensor([[-float("inf"), 1.0]], dtype=dtype),
        "both infinities": torch.tensor([[float("inf"), -float("inf")]], dtype=dtype),
        "finite, the sum overflows": torch.tensor([[big, big, big]], dtype=dtype),
        "finite, the sum overflows, one nan": torch.tensor([[big, big, float("nan")]], dtype=dtype),
        "empty": torch.zeros((0, 3), dtype=dtype),
    }
    for name, value in cases.items():
        assert all_finite(value) == bool(torch.isfinite(value).all()), name
    assert all_finite(torch.tensor([1, 2, 3]))  # integers are finite
