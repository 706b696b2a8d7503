"""Names of everything in a run file (schema ``fednest-mpi/run``); the only place that spells them.

Documented in ``docs/hdf5.md``. :mod:`fednest_mpi.io.h5` writes the file attributes and the
per-iteration group, :mod:`fednest_mpi.io.clients` the 2-D groups (per client, per rank,
snapshots).
"""

from __future__ import annotations

from pathlib import Path

FORMAT = "fednest-mpi/run"
SCHEMA_VERSION = 1

# -- /iterations: one entry per outer iteration ---------------------------------------------------
GROUP = "iterations"
HIGHER_IS_BETTER = "higher_is_better"  # bool attribute of a metric column that declares its direction
COLUMN_INFO = "columns"  # read_run's attrs: column -> {description, units[, higher_is_better]} (not a file attribute)
PRIMARY_METRIC = "primary_metric"  # root attribute: the problem's primary metric
METRICS = "metrics"  # root attribute: JSON list of the metrics the problem declares (BilevelProblem.metric_info)
#: root attribute of a run stopped by a signal before its last iteration (io.h5.mark_stopped): JSON {by, iteration, utc}
STOPPED = "stopped"
#: the headline metrics, where a problem declares them: after its primary metric, what ``report`` shows by
#: default and the progress lines show
DEFAULT_METRICS = ("x_error", "outer_objective", "hypergradient_norm", "test_accuracy", "test_loss")
SCALE = "iteration"  # /iterations/iteration: the dimension scale of every per-iteration axis

# -- /clients: clients x iterations, joined from the per-rank files by virtual datasets --------------
CLIENTS = "clients"
CLIENT_SCALE = "client"  # /clients/client: client ids 0..M-1, the scale of axis 0
#: name -> (dtype, fill value, description, units)
CLIENT_SERIES = {
    "participation": (
        "uint8",
        0,
        "roles of the client in the iteration, a bitmask: 1 = FedInn/LFedInn set (Alg. 4/6), "
        "2 = FedIHGP set (Alg. 3), 4 = FedOut/LFedOut set (Alg. 2/5); 0 = did not take part (a member that "
        "did not answer a round may lack the role of the computation it skipped: dropped_rounds)",
        "1",
    ),
    "answered_rounds": (
        "uint16",
        0,
        "counted aggregations (communication rounds) of the iteration that the client answered as a member",
        "1",
    ),
    "dropped_rounds": (
        "uint16",
        0,
        "counted aggregations of the iteration whose client set held the client but that it did not answer "
        "(heterogeneity.drop_probability, heterogeneity.availability_trace); 0 without unavailability",
        "1",
    ),
    "inner_loss": (
        "float64",
        float("nan"),
        "g_i(x, y) on the client's whole inner data, at the (x, y) it received in "
        "its (last) FedInn round of the iteration; NaN if not in a FedInn set",
        "1",
    ),
    "outer_loss": (
        "float64",
        float("nan"),
        "f_i(x, y) on the client's whole outer data, at the (x, y) it received in "
        "FedOut/LFedOut; NaN if not in the FedOut set",
        "1",
    ),
    "inner_gradient_norm": (
        "float64",
        float("nan"),
        "||nabla_y g_i(x, y)||, the SVRG anchor of FedInn (Alg. 4) at the "
        "received (x, y); NaN without variance reduction or if not in a FedInn set",
        "1",
    ),
    "local_hypergradient_norm": (
        "float64",
        float("nan"),
        "||h_i||, the client's hypergradient estimate before "
        "aggregation (FedOut: eq. (8); LFedOut: its first local step, Alg. 5); NaN if not in "
        "the FedOut set",
        "1",
    ),
}

# -- /ranks: ranks x iterations ------------------------------------------------------------------------
RANKS = "ranks"
RANK_SCALE = "rank"  # /ranks/rank: 0..P-1
RANK_CPU_CLASS = "cpu_class"  # /ranks/cpu_class: (P,) strings, fednest_mpi.numerics.cpu_class
RANK_SERIES = {
    "compute_seconds": ("wall time of the rank's algorithm part outside aggregations", "s"),
    "wait_seconds": ("time inside aggregations before the last rank entered them (waiting for others)", "s"),
    "transfer_seconds": ("time inside aggregations after the last rank entered them (the reduction itself)", "s"),
}

# -- /snapshots: iterates every run.snapshot_every iterations ------------------------------------------
SNAPSHOTS = "snapshots"
SNAPSHOT_SCALE = "iteration"  # /snapshots/iteration: the iteration of each snapshot
SNAPSHOT_SERIES = {"x": "outer variable x after the iteration", "y": "inner variable y after the iteration"}


def client_dir(run_path: str | Path) -> Path:
    """Folder of the per-rank client files of a run file: ``RUN.h5`` -> ``RUN.clients``."""
    p = Path(run_path)
    return p.with_name(p.stem + ".clients")


def rank_file(rank: int) -> str:
    """Name of a rank's client file inside :func:`client_dir`."""
    return f"rank{rank:05d}.h5"
