"""bench/: the sequential baseline computes the batched oracles' numbers (autograd, one client at a
time), and a tiny run of the harness writes and reads its HDF5 table. No timing assertions."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.sequential import SequentialProblem  # noqa: E402
from fednest_mpi import config, rng  # noqa: E402
from fednest_mpi.problems import build_problem  # noqa: E402
from fednest_mpi.problems.base import Sample  # noqa: E402


@pytest.fixture(scope="module")
def problems():
    cfg = config.from_dict({"problem": {"name": "synthetic", "n_clients": 30, "hidden": 5, "n_inputs": 8, "n_classes": 4,
                                        "samples_per_client": 20, "size_distribution": "lognormal", "size_sigma": 0.5,
                                        "batch_size": 6, "eval_clients": 3, "eval_samples": 5},
                            "algorithm": {"clients_per_round": 5}, "run": {"dtype": "float64"}})
    batched = build_problem(cfg.problem, 1, range(0), dtype=torch.float64)
    return batched, SequentialProblem(batched)


@pytest.mark.parametrize("sample", [None, Sample(int(rng.key(3)), 2)])
def test_sequential_baseline_matches_the_batched_oracles(problems, sample):
    batched, seq = problems
    ids = np.array([2, 9, 21])
    gen = torch.Generator().manual_seed(1)
    X, Y, V = (scale * torch.randn(3, dim, dtype=torch.float64, generator=gen)
               for scale, dim in ((0.3, batched.dim_x), (0.3, batched.dim_y), (1.0, batched.dim_y)))
    for name in ("grad_x_outer", "grad_y_outer", "grad_y_inner"):
        torch.testing.assert_close(getattr(seq, name)(ids, X, Y, sample), getattr(batched, name)(ids, X, Y, sample), msg=name)
    for name in ("hvp_yy_inner", "jvp_xy_inner"):
        torch.testing.assert_close(getattr(seq, name)(ids, X, Y, V, sample), getattr(batched, name)(ids, X, Y, V, sample), msg=name)


def test_harness_smoke_run_writes_its_table(tmp_path, capsys):
    from bench.run import COLUMNS, main
    from fednest_mpi.io.bench import read_bench

    spec = tmp_path / "tiny.toml"
    spec.write_text(f'''
iterations = 1
warmup = 0
output = "{tmp_path / 'tiny.h5'}"
sequential_max_clients = 3
[[case]]
name = "tiny"
clients_per_round = [3]
[case.config.problem]
name = "synthetic"
n_clients = 20
hidden = 4
samples_per_client = 10
eval_clients = 2
[case.config.algorithm]
inner_local_steps = 2
neumann_steps = 1
''')
    assert main([str(spec)]) == 0
    attrs, rows = read_bench(tmp_path / "tiny.h5")
    assert attrs["format"] == "fednest-mpi/bench" and set(rows[0]) == set(COLUMNS)
    assert [r["mode"] for r in rows] == ["sequential", "single"]
    single = rows[1]
    assert single["speedup_vs_sequential"] == rows[0]["alg_s"] / single["alg_s"]
    assert "speedup" in capsys.readouterr().out
