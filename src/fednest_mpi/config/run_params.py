"""The ``[federation]``, ``[heterogeneity]`` and ``[run]`` sections and :class:`RunConfig`, the whole run."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from fednest_mpi import numerics
from fednest_mpi.config.algorithm_params import FedNestConfig
from fednest_mpi.config.fields import spec
from fednest_mpi.config.problem_params import QuadraticConfig


@dataclass(frozen=True)
class FederationConfig:
    """How aggregation is done across ranks."""

    reduction: str = spec(
        "exact",
        "exact: the sum over the participants is exact (binned pre-rounding, fednest_mpi.exactsum): bitwise the "
        "same for any number of ranks and chunk size, 2-3 float64 words per coordinate whatever |S|; "
        "sum: one Allreduce of the weighted local sums (fastest, rank-count invariant only to ~1e-15 relative); "
        "ordered: one Allreduce of per-participant slots summed in client order (bitwise invariant, |S| times "
        "more bytes)",
        choices=("exact", "sum", "ordered"),
    )
    group_clients: int = spec(
        0,
        "exact reduction: consecutive client ids per summation group; a round's rows are summed in floating point "
        "within a group (one GEMM of its rows, or of a factored form's factors), the groups' sums exactly, and a rank "
        "hosts whole groups, so results stay bitwise invariant to ranks and chunk size (1: every client's row "
        "exactly; 0: automatic, 1 below 32 clients per round, else m n_clients / clients_per_round: about m "
        "members a group, m = min(32, clients_per_round / 16); docs/design.md)",
        low=0,
    )
    wait: str = spec(
        "auto",
        "how ranks wait in a collective: block (MPI's busy-poll), poll (test and yield the core), "
        "auto (poll when a node has more ranks than cores)",
        choices=("auto", "block", "poll"),
    )
    placement: str = spec(
        "block",
        "which rank evaluates which client: block (contiguous blocks of client ids, a rank hosts their data); "
        "balanced (each round's participants split evenly, every rank within one client of the same count; "
        "every rank then holds every client's data -- synthetic generates it from the client id -- and no per-client "
        "records are written)",
        choices=("block", "balanced"),
    )


@dataclass(frozen=True)
class HeterogeneityConfig:
    """System heterogeneity, keyed by (seed, round, client id): local steps per client, members that do not answer."""

    local_work: str = spec(
        "full",
        "local steps per client: full (every client runs the configured steps of each local phase) or uniform "
        "(client i runs tau_i drawn uniformly from {ceil(local_work_min tau), ..., tau} of a phase of tau steps)",
        choices=("full", "uniform"),
    )
    local_work_min: float = spec(
        0.5, "local_work = uniform: the smallest fraction of the configured steps", low=0.0, high=1.0, low_open=True
    )
    local_work_draw: str = spec(
        "client",
        "local_work = uniform: draw tau_i once per client (client) or again every outer iteration (iteration)",
        choices=("client", "iteration"),
    )
    drop_probability: float = spec(
        0.0,
        "probability that a member of a round's client set does not answer that communication round (it computes "
        "and sends nothing; the round aggregates over the members that answered)",
        low=0.0,
        high=1.0,
    )
    availability_trace: str = spec(
        "",
        "path of a 0/1 table (.npy, or .csv text), one row per communication round (cyclic) and one column per "
        "client: a member answers a round only where its entry is 1 (and the drop_probability lets it); empty: none",
    )


@dataclass(frozen=True)
class RunSection:
    """Where and how the run executes."""

    output: str = spec("runs/run.h5", "HDF5 output path")
    overwrite: bool = spec(False, "replace an existing output file")
    device: str = spec("cpu", "torch device", choices=("cpu", "cuda"))
    dtype: str = spec("float64", "floating-point precision of iterates and oracles", choices=("float32", "float64"))
    torch_threads: int = spec(1, "torch intra-op threads per rank (ranks x threads <= cores)", low=1)
    numerics: str = spec(
        numerics.DEFAULT,
        "which code paths of MKL and ATen compute the run: reproducible = chunk- and rank-count invariant on "
        "every x86-64 CPU at each library's own speed (MKL strict on its own branch), the same bits on the "
        "machines of one CPU class; portable = also the same bits on Intel and AMD (slower products); native = "
        "each library's fastest path, no guarantee (docs/design.md)",
        choices=tuple(numerics.MODES),
    )
    chunk_clients: int = spec(
        0,
        "clients a rank evaluates at once; a round's members are processed chunk by chunk, so memory "
        "per rank is bounded by the chunk (0: automatic from run.block_memory; results do not depend "
        "on it: bitwise with federation.reduction = ordered, docs/performance.md)",
        low=0,
    )
    block_memory: int = spec(
        512,
        "working-set budget of one chunk per rank in MiB, for the automatic run.chunk_clients "
        "(the problem estimates its bytes per client)",
        low=1,
    )
    log_every: int = spec(10, "one summary log line every k outer iterations (batch logs)", low=1)
    progress: str = spec(
        "auto", "progress bar on rank 0: auto (only on a terminal), always, never", choices=("auto", "always", "never")
    )
    checkpoint_every: int = spec(
        100,
        "write a checkpoint every k outer iterations; one is also written at iteration 0, at the end "
        "and on SIGTERM/SIGINT/SIGUSR1 (0: only then); see docs/reliability.md",
        low=0,
    )
    checkpoint_dir: str = spec(
        "", "checkpoint folder (shared by all ranks); empty: the output path with '.ckpt' appended"
    )
    stop_timeout: float = spec(
        15.0,
        "seconds after a SIGTERM or SIGINT within which the ranks must reach the end of the iteration and "
        "checkpoint; past it (a rank stopped or blocked on I/O, or a longer iteration) every rank closes its "
        "files and exits at once, as after a second signal (0: wait for ever); docs/reliability.md",
        low=0.0,
    )
    round_timeout: float = spec(
        0.0,
        "watchdog: seconds an outer iteration (with its evaluation and checkpoint) may take; past it every "
        "rank closes its files and the run exits with code 1 (0: the automatic limit of round_timeout_factor); "
        "docs/reliability.md",
        low=0.0,
    )
    round_timeout_factor: float = spec(
        20.0,
        "with round_timeout = 0, the automatic watchdog: from the first completed outer iteration on, an "
        "iteration may take this many times the longest one so far, and at least 600 s (a plugin that blocks "
        "for ever cannot hang the job; a rank inside a plugin hook: at least 60 s; the first iteration: 600 s "
        "for a rank in a hook, 3600 s for the others); 0: no watchdog at all",
        low=0.0,
    )
    idle_timeout: float = spec(
        30.0,
        "the idle look: a rank inside a plugin hook (a problem's oracle or constructor, an algorithm's step) whose "
        "process has used no CPU for this many seconds (it waits for input, a lock or a message that never "
        "comes) ends the run on every rank with one line naming the rank and the hook, exit 1; time the job "
        "was stopped (SIGSTOP, a suspended job) does not count (0: off, e.g. for a hook that waits on a "
        "download); docs/reliability.md",
        low=0.0,
    )
    check_consistency: int = spec(
        1,
        "every k outer iterations check that all ranks hold the same x and y (a 64-bit digest of their bytes, "
        "carried by the per-iteration bookkeeping reduction: no extra collective, no counted round, not on one "
        "rank); where they differ (a plugin computed something rank-dependent) the run stops on every rank with "
        "one line naming the iteration and the ranks, exit 1 (0: off); docs/reliability.md",
        low=0,
    )
    client_series: bool = spec(
        True,
        "record per-client series (participation, local losses, gradient norms; clients x iterations, "
        "one file per rank joined by virtual datasets, docs/hdf5.md); needs federation.placement = block",
    )
    train_eval_every: int = spec(
        0,
        "every k outer iterations also evaluate on the training data of all clients: "
        "outer_loss = mean_i f_i(x, y), inner_loss = mean_i g_i(x, y) and train_accuracy "
        "where the problem classifies (NaN in between; 0: never)",
        low=0,
    )
    snapshot_every: int = spec(
        0, "store x and y in /snapshots every k outer iterations and at the last one (0: never)", low=0
    )
    tensorboard_dir: str = spec(
        "",
        "also write the run to TensorBoard event files in FOLDER/NAME, NAME the run file's name without its suffix "
        "(rank 0; the runs of a sweep may share FOLDER): every per-iteration value of the run file as a scalar at "
        "step = outer iteration, the config as text and hparams; needs "
        "pip install 'fednest-mpi[tensorboard]' (empty: none); docs/extending.md",
    )
    mlflow_uri: str = spec(
        "",
        "also log the run to MLflow at this tracking URI (rank 0; http://HOST:5000, databricks, or file:FOLDER "
        "with MLFLOW_ALLOW_FILE_STORE=true): the flattened config as params, every per-iteration value as a "
        "metric at step = outer iteration, the run file as an artifact, the status FINISHED, KILLED (stopped) or "
        "FAILED; needs pip install 'fednest-mpi[mlflow]' (empty: none); docs/extending.md",
    )
    mlflow_experiment: str = spec("fednest-mpi", "the MLflow experiment of run.mlflow_uri (created when missing)")


@dataclass(frozen=True)
class RunConfig:
    """A whole run."""

    seed: int = spec(0, "seed of every random stream (sampling, minibatches, data, init)", low=0)
    problem: Any = field(default_factory=QuadraticConfig, metadata={"help": "problem section; see the problem kinds"})
    algorithm: Any = field(default_factory=FedNestConfig, metadata={"help": "algorithm section; see the algorithms"})
    federation: FederationConfig = field(default_factory=FederationConfig, metadata={"help": "federation section"})
    heterogeneity: HeterogeneityConfig = field(
        default_factory=HeterogeneityConfig, metadata={"help": "heterogeneity section"}
    )
    run: RunSection = field(default_factory=RunSection, metadata={"help": "run section"})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


SECTIONS = {"federation": FederationConfig, "heterogeneity": HeterogeneityConfig, "run": RunSection}
