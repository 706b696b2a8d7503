"""Per-client series and per-rank phase times of a run on every rank of COMM_WORLD, against the
same run on one rank (COMM_SELF): the files hold the same per-client data, bitwise (ordered reduction).

Run under ``mpiexec -n 1``, ``-n 2`` and ``-n 4`` (``make test-mpi``).
"""

import numpy as np
import pytest
from mpi4py import MPI

from fednest_mpi.callbacks import Recorder
from fednest_mpi.io.clients import read_clients, read_ranks, read_snapshots
from fednest_mpi.io.h5 import RunWriter
from fednest_mpi.io.schema import client_dir, rank_file
from fednest_mpi.runner import Simulation
from fednest_mpi.series import RunSeries, series_layout


def _run_to_file(small_config, name, comm, path):
    """What ``fednest-mpi run`` does with its output file, on ``comm``."""
    cfg = small_config(
        algorithm={"name": name, "ihgp_mode": "randomized", "outer_iterations": 4},
        federation={"reduction": "ordered"},
        problem={"gradient_noise": 0.1, "n_clients": 11},
        run={"snapshot_every": 2, "output": path},
    )
    sim = Simulation(cfg, comm)
    writer = (
        RunWriter(
            path,
            {"mpi_size": comm.Get_size(), "config_json": cfg.to_json()},
            sim.columns(),
            extend=series_layout(sim).create,
        )
        if comm.Get_rank() == 0
        else None
    )
    series = RunSeries(sim, writer)
    try:
        sim.run([Recorder(writer)] if writer is not None else [], series=series)
    finally:
        series.close()
        if writer is not None:
            writer.close()


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["fednest", "lfednest_nonalt"])
def test_per_client_data_of_n_ranks_equal_those_of_one_rank(small_config, name, tmp_path_factory):
    comm = MPI.COMM_WORLD
    folder = comm.bcast(str(tmp_path_factory.mktemp("series")) if comm.Get_rank() == 0 else None)
    world = f"{folder}/world.h5"
    _run_to_file(small_config, name, comm, world)
    comm.Barrier()
    if comm.Get_rank() == 0:
        single = f"{folder}/single.h5"
        _run_to_file(small_config, name, MPI.COMM_SELF, single)
        a, b = read_clients(world), read_clients(single)
        assert set(a) == set(b) and a["participation"].shape == (11, 5)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        assert a["participation"][:, 1:].any() and np.isfinite(a["inner_loss"]).any()
        # one file per rank that hosts a client, none for the others
        files = sorted(p.name for p in client_dir(world).iterdir())
        assert files == [rank_file(r) for r in range(min(comm.Get_size(), 11))]
        phases = read_ranks(world)
        assert all(v.shape == (comm.Get_size(), 5) and np.all(v >= -1e-6) for v in phases.values())
        np.testing.assert_array_equal(read_snapshots(world)["x"], read_snapshots(single)["x"])
    comm.Barrier()
