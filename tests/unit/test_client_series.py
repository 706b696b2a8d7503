"""Per-client series, per-rank phase times and snapshots: recorder, value oracles, file round trip,
live reading, truncation/re-partition for resumed runs."""

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from mpi4py import MPI
from shared_data import DATA, requires
from test_checkpoint import _cli_config, run_cli  # the small CLI run of the checkpoint tests (bitwise on 1, 2, 4 ranks)

from fednest_mpi.callbacks import Recorder
from fednest_mpi.cli import main
from fednest_mpi.errors import UsageError
from fednest_mpi.io import schema as S
from fednest_mpi.io.clients import (
    ClientFile,
    SeriesLayout,
    read_clients,
    read_ranks,
    read_snapshots,
    truncate_client_files,
)
from fednest_mpi.io.h5 import RunWriter
from fednest_mpi.problems import build_problem
from fednest_mpi.recorder import IHGP, INNER, OFF, OUTER, ClientRecorder, phase_times
from fednest_mpi.runner import Simulation
from fednest_mpi.series import RunSeries, series_layout

COLUMNS = {"iteration": ("k", "1"), "x_error": ("||x - x*||", "1")}


# -- recorder and phase times ------------------------------------------------------------------------
def test_recorder_ors_roles_keeps_the_last_value_and_resets():
    rec = ClientRecorder(range(10, 14))
    rec.took_part(np.array([10, 12]), INNER)
    rec.took_part(np.array([12]), OUTER)
    rec.record("inner_loss", np.array([10, 12]), lambda: torch.tensor([1.0, 2.0]))
    rec.record("inner_loss", np.array([12]), lambda: torch.tensor([5.0]))
    rec.record("outer_loss", np.array([12]), lambda: None)  # a problem without values
    out = rec.take()
    assert out["participation"].tolist() == [INNER, 0, INNER | OUTER, 0]
    np.testing.assert_array_equal(out["inner_loss"], [1.0, np.nan, 5.0, np.nan])
    assert np.isnan(out["outer_loss"]).all()
    assert not rec.take()["participation"].any()
    with pytest.raises(ValueError, match="not all hosted"):
        rec.took_part(np.array([14]), IHGP)


def test_off_recorder_does_not_compute():
    OFF.record("inner_loss", np.array([0]), lambda: pytest.fail("computed"))
    assert not OFF.enabled


def test_phase_times_split_waiting_from_transfer():
    # rank 0 enters rounds at 1.0 and 5.0, rank 1 at 3.0 and 4.0; both leave at 3.5 and 5.5
    table = np.array([[6.0, 1.0, 5.0, 3.5, 5.5], [6.0, 3.0, 4.0, 3.5, 5.5]])
    p = phase_times(table)
    np.testing.assert_allclose(p["wait_seconds"], [2.0, 1.0])  # (3 - 1) + 0 ; 0 + (5 - 4)
    np.testing.assert_allclose(p["transfer_seconds"], [0.5 + 0.5, 0.5 + 0.5])
    np.testing.assert_allclose(p["compute_seconds"], [6.0 - 3.0, 6.0 - 2.0])
    assert phase_times(np.array([[0.25]]))["compute_seconds"].tolist() == [0.25]  # no aggregation


# -- value oracles ----------------------------------------------------------------------------------
def _rows(prob, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        0.3 * torch.randn(n, prob.dim_x, dtype=torch.float64, generator=g),
        0.3 * torch.randn(n, prob.dim_y, dtype=torch.float64, generator=g),
    )


def _check_values(prob, ids):
    """Values do not depend on the block and their autograd y-gradients are the exact gradient oracles."""
    X, Y = _rows(prob, len(ids))
    for value, grad in ((prob.inner_value, prob.grad_y_inner), (prob.outer_value, prob.grad_y_outer)):
        full = value(ids, X, Y)
        assert full.shape == (len(ids),)
        alone = torch.cat([value(ids[i : i + 1], X[i : i + 1], Y[i : i + 1]) for i in range(len(ids))])
        torch.testing.assert_close(full, alone, rtol=1e-13, atol=0)  # up to the padding of a block's widest client
        Yl = Y.clone().requires_grad_(True)
        (gy,) = torch.autograd.grad(value(ids, X, Yl).sum(), Yl)
        torch.testing.assert_close(gy, grad(ids, X, Y, None), rtol=1e-9, atol=1e-11)


def test_quadratic_values_average_to_the_global_objectives(small_config):
    cfg = small_config()
    prob = build_problem(cfg.problem, cfg.seed, range(0, 12), dtype=torch.float64)
    ids = np.arange(12)
    x, y = _rows(prob, 1, seed=3)
    X, Y = x.expand(12, -1), y.expand(12, -1)
    assert float(prob.inner_value(ids, X, Y).mean()) == pytest.approx(
        float(prob.inner_objective(x[0], y[0])), rel=1e-12
    )
    assert float(prob.outer_value(ids, X, Y).mean()) == pytest.approx(
        float(prob.outer_objective(x[0], y[0])), rel=1e-12
    )
    assert sum(prob.oracle_counts.values()) == 0  # values are diagnostics, not counted oracle calls
    _check_values(prob, np.array([1, 4, 9]))


def test_representation_values_match_the_gradient_oracles():
    from fednest_mpi import config

    cfg = config.from_dict(
        {
            "problem": {
                "name": "synthetic",
                "n_clients": 20,
                "hidden": 5,
                "n_inputs": 7,
                "n_classes": 4,
                "samples_per_client": 30,
                "eval_clients": 5,
                "eval_samples": 10,
            },
            "algorithm": {"clients_per_round": 5},
            "run": {"dtype": "float64"},
        }
    )
    prob = build_problem(cfg.problem, 0, range(0, 20), dtype=torch.float64)
    _check_values(prob, np.array([2, 3, 17]))


@requires("mnist")
@pytest.mark.parametrize(
    "problem", [{"name": "hyper_representation", "hidden": 6}, {"name": "loss_tuning", "hidden1": 7, "hidden2": 5}]
)
def test_mnist_values_match_the_gradient_oracles(problem):
    from fednest_mpi import config

    cfg = config.from_dict(
        {
            "problem": {"data_dir": str(DATA), "n_clients": 20, "partition": "shards", **problem},
            "algorithm": {"clients_per_round": 5},
            "run": {"dtype": "float64"},
        }
    )
    prob = build_problem(cfg.problem, 0, range(4, 12), dtype=torch.float64)
    _check_values(prob, np.array([4, 7, 11]))


# -- files ------------------------------------------------------------------------------------------
def _simulate_to_file(small_config, path, **run):
    cfg = small_config(run={"output": str(path), **run}, algorithm={"outer_iterations": 5})
    sim = Simulation(cfg, MPI.COMM_SELF)
    writer = RunWriter(
        path, {"mpi_size": 1, "config_json": cfg.to_json()}, sim.columns(), extend=series_layout(sim).create
    )
    series = RunSeries(sim, writer)
    sim.run([Recorder(writer)], series=series)
    series.close()
    writer.close()
    return sim


def test_round_trip_of_the_two_dimensional_series(small_config, tmp_path):
    path = tmp_path / "run.h5"
    sim = _simulate_to_file(small_config, path, snapshot_every=1)
    c, snaps = read_clients(path), read_snapshots(path)
    K, M, per_round = 5, 12, 6
    assert {k: (v.shape, v.dtype.name) for k, v in c.items()} == {
        name: ((M, K + 1), dtype) for name, (dtype, *_rest) in S.CLIENT_SERIES.items()
    }
    roles = c["participation"]
    assert not roles[:, 0].any()  # the initial point has no rounds
    assert ((roles[:, 1:] & INNER) > 0).sum(0).tolist() == [per_round] * K  # T = 1 FedInn set per iteration
    assert ((roles[:, 1:] & OUTER) > 0).sum(0).tolist() == [per_round] * K
    assert (((roles[:, 1:] & IHGP) > 0).sum(0) >= per_round).all()  # N + 1 resampled FedIHGP sets
    for name, role in (
        ("inner_loss", INNER),
        ("inner_gradient_norm", INNER),
        ("outer_loss", OUTER),
        ("local_hypergradient_norm", OUTER),
    ):
        np.testing.assert_array_equal(np.isfinite(c[name]), (roles & role) > 0, err_msg=name)
    # closed forms at the iterates: FedInn of iteration k gets (x_{k-1}, y_{k-1}), FedOut (x_{k-1}, y_k)
    prob = sim.problem
    assert snaps["iteration"].tolist() == list(range(K + 1))
    xs, ys = torch.as_tensor(snaps["x"]), torch.as_tensor(snaps["y"])
    for k in range(1, K + 1):
        inner = np.flatnonzero(roles[:, k] & INNER)
        X, Y = xs[k - 1].expand(len(inner), -1), ys[k - 1].expand(len(inner), -1)
        np.testing.assert_allclose(c["inner_loss"][inner, k], prob.inner_value(inner, X, Y).numpy(), rtol=1e-12)
        norms = torch.linalg.vector_norm(prob.grad_y_inner(inner, X, Y, None), dim=1).numpy()
        np.testing.assert_allclose(c["inner_gradient_norm"][inner, k], norms, rtol=1e-12)
        outer = np.flatnonzero(roles[:, k] & OUTER)
        Xo, Yo = xs[k - 1].expand(len(outer), -1), ys[k].expand(len(outer), -1)
        np.testing.assert_allclose(c["outer_loss"][outer, k], prob.outer_value(outer, Xo, Yo).numpy(), rtol=1e-12)
    assert np.all(c["inner_loss"][:, 1][np.isfinite(c["inner_loss"][:, 1])] == 0.0)  # g_i(0, 0) = 0
    phases = read_ranks(path)
    assert set(phases) == set(S.RANK_SERIES) and all(v.shape == (1, K + 1) for v in phases.values())
    assert np.all(phases["wait_seconds"] == 0) and np.all(phases["compute_seconds"][0, 1:] > 0)
    with h5py.File(path, "r") as f:
        for group, names in ((S.CLIENTS, S.CLIENT_SERIES), (S.RANKS, S.RANK_SERIES), (S.SNAPSHOTS, ("x", "y"))):
            for name in names:
                d = f[group][name]
                assert d.attrs["description"] and d.attrs["units"], name
                assert d.dims[0][0].name in (
                    f"/{S.CLIENTS}/{S.CLIENT_SCALE}",
                    f"/{S.RANKS}/{S.RANK_SCALE}",
                    f"/{S.SNAPSHOTS}/{S.SNAPSHOT_SCALE}",
                )
        assert f[S.CLIENTS]["outer_loss"].is_virtual
        assert f[S.CLIENTS]["outer_loss"].dims[1][0].name == f"/{S.GROUP}/{S.SCALE}"
        assert f[S.CLIENTS][S.CLIENT_SCALE][:].tolist() == list(range(M))


def test_snapshots_every_k_and_the_last_iteration(small_config, tmp_path):
    _simulate_to_file(small_config, tmp_path / "r.h5", snapshot_every=2)
    assert read_snapshots(tmp_path / "r.h5")["iteration"].tolist() == [0, 2, 4, 5]


def test_a_run_without_client_series_says_so(small_config, tmp_path):
    _simulate_to_file(small_config, tmp_path / "r.h5", client_series=False)
    assert not S.client_dir(tmp_path / "r.h5").exists()
    with pytest.raises(UsageError, match="client_series = false"):
        read_clients(tmp_path / "r.h5")
    assert read_snapshots(tmp_path / "r.h5")["iteration"].size == 0


def test_other_schema_versions_are_refused_by_the_series_readers(small_config, tmp_path):
    _simulate_to_file(small_config, tmp_path / "r.h5")
    with h5py.File(tmp_path / "r.h5", "a") as f:
        f.attrs["schema_version"] = S.SCHEMA_VERSION + 1
    with pytest.raises(UsageError, match=f"schema version {S.SCHEMA_VERSION + 1}.*reads version {S.SCHEMA_VERSION}"):
        read_clients(tmp_path / "r.h5")


def _layout(path, blocks, n_clients):
    return SeriesLayout(
        run_path=path,
        n_clients=n_clients,
        blocks=blocks,
        client_series=True,
        snapshot_every=0,
        dim_x=1,
        dim_y=1,
        dtype="float64",
    )


def _row(ids, k):
    """Client rows of iteration k: everyone took part, inner_loss = 100 id + k, the rest NaN."""
    rest = {
        n: np.full(len(ids), fill, dtype)
        for n, (dtype, fill, *_) in S.CLIENT_SERIES.items()
        if n not in ("participation", "inner_loss")
    }
    return {"participation": np.ones(len(ids), np.uint8), "inner_loss": 100.0 * ids + k, **rest}


def _write_rank_files(path, blocks, K):
    """Per-rank files whose entries encode (client, iteration): participation 1, inner_loss = 100 client + k."""
    for rank, rows in enumerate(blocks):
        f = ClientFile(path, rank, rows)
        ids = np.arange(rows.start, rows.stop)
        for k in range(K):
            f.append(
                k,
                _row(ids, k),
            )
        f.close()


def test_a_reader_sees_the_per_rank_rows_through_the_run_file_while_they_are_written(tmp_path):
    path = tmp_path / "live.h5"
    blocks = (range(0, 2), range(2, 5))
    writer = RunWriter(path, {"config_json": json.dumps({})}, COLUMNS, extend=_layout(path, blocks, 5).create)
    files = [ClientFile(path, r, b) for r, b in enumerate(blocks)]
    reader = (
        "import sys; from fednest_mpi.io.clients import read_clients; "
        "print(read_clients(sys.argv[1])['inner_loss'].tolist())"
    )
    for k in range(2):
        for f, rows in zip(files, blocks):
            ids = np.arange(rows.start, rows.stop)
            f.append(
                k,
                _row(ids, k),
            )
        writer.append({"iteration": k, "x_error": 1.0})
        seen = subprocess.run([sys.executable, "-c", reader, str(path)], capture_output=True, text=True, timeout=60)
        assert json.loads(seen.stdout) == [[100.0 * i + j for j in range(k + 1)] for i in range(5)], seen.stderr
    for f in files:
        f.close()
    writer.close()


@pytest.mark.parametrize(
    "new_blocks", [(range(0, 2), range(2, 5)), (range(0, 1), range(1, 3), range(3, 5)), (range(0, 5),)]
)
def test_truncation_keeps_the_first_iterations_for_any_number_of_ranks(tmp_path, new_blocks):
    path = tmp_path / "r.h5"
    _write_rank_files(path, (range(0, 2), range(2, 5)), K=4)
    truncate_client_files(path, 3, new_blocks)
    names = sorted(p.name for p in S.client_dir(path).iterdir())
    assert names == [S.rank_file(r) for r in range(len(new_blocks))]
    for rank, rows in enumerate(new_blocks):
        with h5py.File(S.client_dir(path) / S.rank_file(rank), "r") as f:
            assert f.attrs["first_client"] == rows.start
            got = f[S.CLIENTS]["inner_loss"][:]
        np.testing.assert_array_equal(got, 100.0 * np.arange(rows.start, rows.stop)[:, None] + np.arange(3)[None, :])


def _cli(*args, ranks=1, env=None, ok=True):
    res = run_cli("run", *args, "-q", "--set", "run.snapshot_every=2", ranks=ranks, env=env, timeout=180)
    assert (res.returncode == 0) == ok, res.stderr


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_a_sigkilled_two_rank_run_leaves_per_client_series_of_its_completed_iterations(tmp_path):
    cfg = _cli_config(tmp_path)
    _cli(cfg, ranks=2, env={"FEDNEST_MPI_INJECT_FAULT": "1:4:kill"}, ok=False)  # rank 1 dies inside iteration 4
    _cli(cfg, "--output", tmp_path / "ref.h5", "--set", "algorithm.outer_iterations=3")
    with pytest.raises(UsageError, match="fednest-mpi recover"):  # killed: not closed
        read_clients(tmp_path / "out.h5")
    assert main(["recover", str(tmp_path / "out.h5")]) == 0
    got, ref = read_clients(tmp_path / "out.h5"), read_clients(tmp_path / "ref.h5")
    for name in S.CLIENT_SERIES:  # iterations 0..3 completed
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.slow
def test_a_four_rank_run_resumed_on_two_ranks_has_the_series_of_an_uninterrupted_run(tmp_path):
    cfg = _cli_config(tmp_path)
    _cli(cfg, ranks=4, env={"FEDNEST_MPI_INJECT_FAULT": "3:5:term"})  # stops after iteration 5, checkpoint at 5
    _cli(cfg, "--resume", ranks=2)
    _cli(cfg, "--output", tmp_path / "ref.h5")
    got, ref = read_clients(tmp_path / "out.h5"), read_clients(tmp_path / "ref.h5")
    for name in S.CLIENT_SERIES:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
    assert sorted(p.name for p in S.client_dir(tmp_path / "out.h5").iterdir()) == [S.rank_file(0), S.rank_file(1)]
    snaps, ref_snaps = read_snapshots(tmp_path / "out.h5"), read_snapshots(tmp_path / "ref.h5")
    assert snaps["iteration"].tolist() == [0, 2, 4, 6, 8, 10]
    np.testing.assert_array_equal(snaps["y"], ref_snaps["y"])
    phases = read_ranks(tmp_path / "out.h5")["wait_seconds"]
    assert phases.shape == (2, 11) and np.isnan(phases[:, :6]).all() and np.isfinite(phases[:, 6:]).all()


def test_analysis_frames_of_the_series(small_config, tmp_path):
    from fednest_mpi.post import load_clients, load_ranks

    _simulate_to_file(small_config, tmp_path / "r.h5")
    arrays = read_clients(tmp_path / "r.h5")
    df = load_clients(tmp_path / "r.h5")
    assert len(df) == int((arrays["participation"] > 0).sum()) and (df["participation"] > 0).all()
    for name in S.CLIENT_SERIES:
        np.testing.assert_array_equal(df[name], arrays[name][df["client"], df["iteration"]], err_msg=name)
    assert len(load_clients(tmp_path / "r.h5", participants_only=False)) == 12 * 6
    ranks = load_ranks(tmp_path / "r.h5")
    assert list(ranks.columns) == ["rank", "iteration", *S.RANK_SERIES] and len(ranks) == 6
