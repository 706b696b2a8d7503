"""Checkpoint and restart: atomic files, state routed by client id, bitwise resume, signals, faults.

The in-process tests use ``COMM_SELF``; the command-line tests run ``mpiexec`` subprocesses
(SIGKILL mid-iteration, SIGTERM, a 4-rank run resumed on 2 ranks). Bitwise comparisons use
``federation.reduction = "ordered"`` and full participation (see ``_cli_config``).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI

from fednest_mpi import checkpoint, config
from fednest_mpi.algorithms import ClientStore, FedNest, State
from fednest_mpi.cli import main
from fednest_mpi.errors import UsageError
from fednest_mpi.io.h5 import RunWriter, read_run
from fednest_mpi.runner import Simulation, simulate

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


@dataclass
class CountingState(State):
    clients: ClientStore  # row "s" of every hosted client
    steps: torch.Tensor  # replicated


class CountingFedNest(FedNest):
    """FedNest with a per-client state s_i that grows by k (i + 1) in iteration k on the rank
    hosting client i, so after K iterations s_i = (i + 1) K (K + 1) / 2 exactly, wherever and
    however often the run was interrupted, if and only if restarts route every row to its id."""

    def __init__(self, cfg, problem, fed, seed):
        super().__init__(cfg, problem, fed, seed, **config.ALGORITHMS[cfg.name].options)
        self.ids = np.arange(self.fed.block.start, self.fed.block.stop)
        store = ClientStore(self.fed.block, {"s": torch.zeros(1, dtype=torch.float64)})
        store.put(self.ids, s=torch.zeros(len(self.ids), 1, dtype=torch.float64))
        self.state = CountingState(store, torch.zeros(1, dtype=torch.float64))

    @property
    def s(self):
        return self.state.clients.get("s", self.ids)

    @property
    def steps(self):
        return self.state.steps

    def step(self, k, x, y):
        self.state.clients.put(self.ids, s=self.s + k * torch.from_numpy(self.ids + 1.0)[:, None])
        self.state.steps = self.state.steps + 1
        return super().step(k, x, y)

    def restore(self, global_state, client_states):
        assert np.array_equal(client_states["s"][0], self.ids)
        super().restore(global_state, client_states)


class StopAt:
    """A stop request that appears once iteration ``k`` has been recorded (as a signal would)."""

    def __init__(self, k):
        self.k, self.seen, self.received = k, -1, None

    def on_iteration(self, k, row):
        self.seen = k

    def reached(self):
        pass

    @property
    def requested(self):
        if self.seen + 1 >= self.k:
            self.received = "SIGTERM"
        return self.received is not None


def _sim(cfg, comm):
    sim = Simulation(cfg, comm)
    sim.algorithm = CountingFedNest(cfg.algorithm, sim.problem, sim.fed, cfg.seed)
    return sim


def assert_same_history(actual, expected):
    assert actual.keys() == expected.keys()
    assert_histories_match(actual, expected)


# ----------------------------------------------------------------------------------------------
# files


def test_checkpoint_round_trip_and_client_rows_found_by_id(tmp_path, small_config):
    cfg = small_config()
    ids = np.arange(12)
    rows = torch.arange(24, dtype=torch.float64).reshape(12, 2)
    ck = checkpoint.Checkpoint(
        iteration=4,
        x=torch.ones(4),
        y=torch.zeros(6),
        comm_rounds=7,
        comm_bytes=70,
        comm_seconds=0.5,
        oracle_totals=torch.arange(5.0),
        wall_time=1.5,
        output_rows=5,
        config_json=cfg.to_json(),
        mpi_size=1,
        algorithm_state={"m": torch.full((3,), 2.0)},
    )
    checkpoint.save(MPI.COMM_SELF, tmp_path, ck, {"s": (ids, rows)})
    back = checkpoint.load(tmp_path)
    assert back.iteration == 4 and back.output_rows == 5 and back.comm_rounds == 7 and back.wall_time == 1.5
    assert torch.equal(back.x, ck.x) and torch.equal(back.algorithm_state["m"], ck.algorithm_state["m"])
    got_ids, got_rows = checkpoint.load_client_states(tmp_path, back, range(3, 7))["s"]
    assert got_ids.tolist() == [3, 4, 5, 6] and torch.equal(got_rows, rows[3:7])
    assert checkpoint.load_client_states(tmp_path, back, range(20, 30)) == {}


def test_a_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, small_config, monkeypatch):
    cfg = small_config()

    def ck(k):
        return checkpoint.Checkpoint(
            iteration=k,
            x=torch.full((4,), float(k)),
            y=torch.zeros(6),
            comm_rounds=k,
            comm_bytes=0,
            comm_seconds=0.0,
            oracle_totals=torch.zeros(5),
            wall_time=0.0,
            output_rows=k + 1,
            config_json=cfg.to_json(),
            mpi_size=1,
        )

    checkpoint.save(MPI.COMM_SELF, tmp_path, ck(3), {"s": (np.arange(2), torch.ones(2, 1))})
    real_save = torch.save

    def dies_halfway(obj, f):
        real_save(obj, f)
        f.truncate(10)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(MPI.COMM_SELF, tmp_path, ck(6), {"s": (np.arange(2), torch.ones(2, 1))})
    monkeypatch.setattr(torch, "save", real_save)
    back = checkpoint.load(tmp_path)
    assert back.iteration == 3 and torch.equal(back.x, torch.full((4,), 3.0))
    assert checkpoint.load_client_states(tmp_path, back, range(2))["s"][1].tolist() == [[1.0], [1.0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clients-k000000003-r00000.pt", "state.pt"]


def test_resume_checks_name_the_config_difference(tmp_path, small_config):
    cfg = small_config()
    ck = checkpoint.Checkpoint(
        iteration=5,
        x=torch.ones(4),
        y=torch.zeros(6),
        comm_rounds=0,
        comm_bytes=0,
        comm_seconds=0.0,
        oracle_totals=torch.zeros(5),
        wall_time=0.0,
        output_rows=6,
        config_json=cfg.to_json(),
        mpi_size=2,
    )
    checkpoint.check_resumable(
        ck, small_config(algorithm={"outer_iterations": 9}, run={"log_every": 3, "checkpoint_every": 2})
    )
    with pytest.raises(UsageError, match=r"algorithm.inner_lr: checkpoint 0.05, now 0.06"):
        checkpoint.check_resumable(ck, small_config(algorithm={"inner_lr": 0.06}))
    with pytest.raises(UsageError, match="checkpoint is at iteration 5, beyond algorithm.outer_iterations = 4"):
        checkpoint.check_resumable(ck, small_config(algorithm={"outer_iterations": 4}))
    with pytest.raises(UsageError, match="no checkpoint in"):
        checkpoint.load(tmp_path / "none")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "state.pt").write_bytes(b"garbage")
    with pytest.raises(UsageError, match="is not a fednest-mpi checkpoint file"):
        checkpoint.load(tmp_path / "bad")


def test_writer_resume_keeps_the_checkpoint_rows_and_replaces_the_file(tmp_path):
    cols = {"iteration": ("k", "1"), "v": ("v", "1")}
    w = RunWriter(tmp_path / "r.h5", {"seed": 1, "mpi_size": 4}, cols)
    for k in range(6):
        w.append({"iteration": k, "v": k / 3})
    w.close()
    w = RunWriter(tmp_path / "r.h5", {"seed": 1, "mpi_size": 2}, cols, keep_rows=4)
    w.append({"iteration": 4, "v": -1.0})
    w.close()
    attrs, data = read_run(tmp_path / "r.h5")
    assert data["iteration"].tolist() == [0, 1, 2, 3, 4] and data["v"][:4].tolist() == [k / 3 for k in range(4)]
    assert attrs["mpi_size"] == 4 and json.loads(attrs["resumes"])[0]["iteration"] == 3
    with pytest.raises(UsageError, match="has the columns"):
        RunWriter(tmp_path / "r.h5", {}, {"iteration": ("k", "1"), "w": ("w", "1")}, keep_rows=2)


# ----------------------------------------------------------------------------------------------
# in-process resume (COMM_SELF)


@pytest.mark.parametrize("stop_at", [0, 3, 7])
def test_stopped_and_resumed_run_equals_the_uninterrupted_one(tmp_path, small_config, stop_at):
    cfg = small_config(
        algorithm={"outer_iterations": 7, "ihgp_mode": "randomized"},
        problem={"gradient_noise": 0.1},
        federation={"reduction": "ordered"},
        run={"checkpoint_every": 2},
    )
    whole = _sim(cfg, MPI.COMM_SELF)
    full = whole.run()
    stop = StopAt(stop_at)
    first = _sim(cfg, MPI.COMM_SELF).run([stop], checkpoint_dir=tmp_path, stop=stop)
    assert first.stopped_by == ("SIGTERM" if stop_at < 7 else None)
    saved = checkpoint.load(tmp_path)
    assert saved.iteration == stop_at and saved.output_rows == stop_at + 1
    assert saved.comm_rounds == first.history["comm_rounds"][-1]
    resumed = _sim(cfg, MPI.COMM_SELF)
    second = resumed.run(checkpoint_dir=tmp_path, resume=saved)
    joined = {name: first.history[name] + second.history.get(name, []) for name in full.history}
    assert_same_history(joined, full.history)
    assert torch.equal(second.x, full.x) and torch.equal(second.y, full.y)
    assert torch.equal(resumed.algorithm.s, whole.algorithm.s) and resumed.algorithm.steps.item() == 7
    np.testing.assert_array_equal(resumed.algorithm.s[:, 0].numpy(), (np.arange(12) + 1) * 7 * 8 / 2)


def test_checkpoint_schedule(tmp_path, small_config, monkeypatch):
    cfg = small_config(algorithm={"outer_iterations": 7}, run={"checkpoint_every": 3})
    seen = []
    real = checkpoint.save

    def spy(comm, folder, ck, states, *series):
        seen.append(ck.iteration)
        real(comm, folder, ck, states, *series)

    monkeypatch.setattr(checkpoint, "save", spy)
    simulate(cfg, MPI.COMM_SELF, checkpoint_dir=tmp_path)
    assert seen == [0, 3, 6, 7]


# ----------------------------------------------------------------------------------------------
# command line, under mpiexec


def run_cli(*args, ranks=1, env=None, timeout=120):
    cmd = [sys.executable, "-m", "fednest_mpi", *map(str, args)]
    if ranks > 1:
        cmd = [str(MPIEXEC), "-n", str(ranks), *cmd]
    full_env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


def _cli_config(tmp_path, iterations=10, every=3):
    """A small quadratic run, ordered reduction and full participation: bitwise the same on 1, 2
    and 4 ranks (every rank then evaluates at least 2 clients per oracle call; a rank with a single
    client takes another floating-point path in the quadratic problem's einsum)."""
    path = tmp_path / "c.toml"
    path.write_text(f"""seed = 5
[problem]
name = "quadratic"
n_clients = 8
dim_x = 3
dim_y = 5
gradient_noise = 0.1
[algorithm]
outer_iterations = {iterations}
clients_per_round = 8
inner_local_steps = 3
neumann_steps = 4
ihgp_mode = "randomized"
[federation]
reduction = "ordered"
[run]
output = "{tmp_path / "out.h5"}"
checkpoint_every = {every}
""")
    return path


def _reference(path):
    return simulate(config.load(path), MPI.COMM_SELF).history


def assert_file_equals(path, history):
    _, data = read_run(path)
    assert data["iteration"].tolist() == history["iteration"]
    assert_same_history({k: data[k] for k in history}, history)


@pytest.mark.slow
def test_sigkill_mid_iteration_then_resume_equals_the_uninterrupted_run(tmp_path):
    cfg = _cli_config(tmp_path)
    res = run_cli("run", cfg, "-q", env={"FEDNEST_MPI_INJECT_FAULT": "0:8:kill"})
    assert res.returncode == -signal.SIGKILL
    assert len(read_run(tmp_path / "out.h5", unclosed="read")[1]["iteration"]) == 8  # iterations 0..7 were flushed
    assert checkpoint.load(tmp_path / "out.h5.ckpt").iteration == 6
    res = run_cli("run", cfg, "-q", "--resume")
    assert res.returncode == 0, res.stderr
    assert_file_equals(tmp_path / "out.h5", _reference(cfg))


def test_a_run_ended_at_once_by_a_second_signal_is_marked_stopped_until_resumed(tmp_path):
    """The file of a run that a second SIGTERM ended at once (exit 143, no safe point) says so (the attribute
    ``stopped``, which tells a reader it is no result: post.benchmark), and the resume drops the mark."""
    cfg = _cli_config(tmp_path, iterations=8, every=2)
    res = run_cli("run", cfg, "-q", env={"FEDNEST_MPI_INJECT_FAULT": "0:5:term2"})
    assert res.returncode == 128 + signal.SIGTERM, res.stderr
    assert "stopped at once by a second SIGTERM after iteration 4" in res.stderr
    attrs, data = read_run(tmp_path / "out.h5")
    assert json.loads(attrs["stopped"])["by"] == "SIGTERM (ended at once)" and data["iteration"][-1] == 4
    res = run_cli("run", cfg, "-q", "--resume")
    assert res.returncode == 0, res.stderr
    assert "stopped" not in read_run(tmp_path / "out.h5")[0]
    assert_file_equals(tmp_path / "out.h5", _reference(cfg))


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_sigterm_on_one_rank_of_two_checkpoints_and_stops_all(tmp_path):
    cfg = _cli_config(tmp_path)
    res = run_cli("run", cfg, "-q", ranks=2, env={"FEDNEST_MPI_INJECT_FAULT": "1:4:term"})
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("stopped by a signal to another rank after iteration 4, checkpoint written") == 1
    assert "--resume" in res.stderr
    assert checkpoint.load(tmp_path / "out.h5.ckpt").iteration == 4
    assert read_run(tmp_path / "out.h5")[1]["iteration"].tolist() == list(range(5))
    res = run_cli("run", cfg, "-q", "--resume", ranks=2)
    assert res.returncode == 0, res.stderr
    assert_file_equals(tmp_path / "out.h5", _reference(cfg))


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_sigterm_from_outside_under_mpiexec(tmp_path):
    """A real signal to mpiexec (which passes it to the ranks), at a moment the test does not choose."""
    cfg = _cli_config(tmp_path, iterations=100000, every=0)
    env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [str(MPIEXEC), "-n", "2", sys.executable, "-m", "fednest_mpi", "run", str(cfg), "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if (tmp_path / "out.h5").exists() and len(read_run(tmp_path / "out.h5")[1]["iteration"]) >= 3:
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    k = checkpoint.load(tmp_path / "out.h5.ckpt").iteration
    assert f"stopped by SIGTERM after iteration {k}" in err and k >= 2
    res = run_cli("run", cfg, "-q", "--resume", "--set", f"algorithm.outer_iterations={k + 3}")
    assert res.returncode == 0, res.stderr
    assert_file_equals(tmp_path / "out.h5", _reference_with(cfg, k + 3))


def _reference_with(path, iterations):
    return simulate(config.load(path, [f"algorithm.outer_iterations={iterations}"]), MPI.COMM_SELF).history


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.slow
def test_four_rank_run_resumed_on_two_ranks_gives_the_same_file(tmp_path):
    cfg = _cli_config(tmp_path)
    res = run_cli("run", cfg, "-q", ranks=4, env={"FEDNEST_MPI_INJECT_FAULT": "3:5:term"})
    assert res.returncode == 0, res.stderr
    assert checkpoint.load(tmp_path / "out.h5.ckpt").mpi_size == 4
    res = run_cli("run", cfg, "-q", "--resume", ranks=2)
    assert res.returncode == 0, res.stderr
    assert_file_equals(tmp_path / "out.h5", _reference(cfg))
    attrs, _ = read_run(tmp_path / "out.h5")
    assert attrs["mpi_size"] == 4 and json.loads(attrs["resumes"]) == [
        {"iteration": 5, "mpi_size": 2, "utc": json.loads(attrs["resumes"])[0]["utc"]}
    ]


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_nan_on_one_rank_stops_every_rank_with_the_iteration(tmp_path):
    cfg = _cli_config(tmp_path, every=1)
    res = run_cli("run", cfg, "-q", ranks=2, env={"FEDNEST_MPI_INJECT_FAULT": "1:6:nan"})
    assert res.returncode == 1
    assert res.stderr.count("fednest-mpi: run failed") == 1
    assert "iteration 6: the iterates or metrics became NaN/Inf on rank 1 (diverged)" in res.stderr
    assert "Traceback" not in res.stderr
    assert read_run(tmp_path / "out.h5")[1]["iteration"].tolist() == list(range(6))
    assert checkpoint.load(tmp_path / "out.h5.ckpt").iteration == 5  # the last good one


def test_resume_usage_errors_exit_2(tmp_path, capsys):
    cfg = _cli_config(tmp_path, iterations=4)
    assert main(["run", str(cfg), "-q", "--resume"]) == 2
    assert "--resume: no checkpoint in" in capsys.readouterr().err
    assert main(["run", str(cfg), "-q"]) == 0
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.inner_lr=0.07"]) == 2
    assert "differs from the checkpoint's in algorithm.inner_lr: checkpoint 0.01, now 0.07" in capsys.readouterr().err
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.outer_iterations=6"]) == 0
    assert read_run(tmp_path / "out.h5")[1]["iteration"].tolist() == list(range(7))
    (tmp_path / "out.h5").unlink()
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.outer_iterations=8"]) == 2
    assert "the output file" in capsys.readouterr().err


def test_every_single_bit_flip_in_a_checkpoint_is_refused(tmp_path, small_config):
    """Issue 26: of 300 single-bit flips, 110 in state.pt and 185 in a client file used to load
    without error (and resume to other numbers). Every one is now a usage error naming the file
    (50 random flips in each file here)."""
    cfg = small_config()
    ck = checkpoint.Checkpoint(
        iteration=4,
        x=torch.ones(4),
        y=torch.zeros(6),
        comm_rounds=7,
        comm_bytes=70,
        comm_seconds=0.5,
        oracle_totals=torch.arange(5.0),
        wall_time=1.5,
        output_rows=5,
        config_json=cfg.to_json(),
        mpi_size=1,
        algorithm_state={"m": torch.full((3,), 2.0)},
    )
    good = tmp_path / "good"
    checkpoint.save(MPI.COMM_SELF, good, ck, {"s": (np.arange(12), torch.rand(12, 2, dtype=torch.float64))})
    files = {p.name: p.read_bytes() for p in good.iterdir()}
    rnd = np.random.default_rng(26)
    for name, data in files.items():
        for offset in rnd.integers(0, len(data), 50):
            work = tmp_path / "work"
            work.mkdir()
            for other, content in files.items():
                flipped = bytearray(content)
                if other == name:
                    flipped[offset] ^= 1 << int(rnd.integers(8))
                (work / other).write_bytes(bytes(flipped))
            with pytest.raises(UsageError, match=r"checkpoint|state\.pt") as caught:
                back = checkpoint.load(work)
                checkpoint.check_client_files(work, back)
                checkpoint.load_client_states(work, back, range(12))
            assert "\n" not in str(caught.value)
            for p in work.iterdir():
                p.unlink()
            work.rmdir()


@pytest.mark.parametrize("column", ["outer_objective", "iteration", "wall_time"])
def test_a_row_changed_since_the_checkpoint_is_named_at_resume(tmp_path, capsys, column):
    """The checkpoint records a digest of every row of /iterations it covers: a row edited since
    (any column, any bit) is refused at --resume, naming the row; restored, the run continues."""
    cfg = _cli_config(tmp_path, iterations=4)
    assert main(["run", str(cfg), "-q"]) == 0
    out = tmp_path / "out.h5"
    with h5py.File(out, "r+") as f:
        d = f["iterations"][column]
        before = d[2]
        d[2] = before + 1 if column == "iteration" else np.nextafter(before, np.inf)  # the least change
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.outer_iterations=6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "row 2 of /iterations" in err and "changed since the checkpoint" in err, err
    with h5py.File(out, "r+") as f:
        f["iterations"][column][2] = before
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.outer_iterations=6"]) == 0
    assert read_run(out)[1]["iteration"].tolist() == list(range(7))


def _set_attr(name, value):
    def edit(f):
        f.attrs[name] = value(f.attrs[name]) if callable(value) else value

    return edit


def _del_attr(name):
    def edit(f):
        del f.attrs[name]

    return edit


@pytest.mark.parametrize(
    "name,edit,how",
    [
        ("seed", _set_attr("seed", 99), "changed"),
        ("config_json", _set_attr("config_json", lambda text: json.dumps({**json.loads(text), "seed": 6})), "changed"),
        ("created_utc", _del_attr("created_utc"), "removed"),
        ("note", _set_attr("note", "mine"), "added"),
    ],
)
def test_an_attribute_changed_since_the_checkpoint_is_named_at_resume(tmp_path, capsys, name, edit, how):
    """The checkpoint records a digest of every attribute of the run file (but ``resumes``): one edited, removed or
    added since is refused at --resume, naming it, rather than carried into the resumed file; restored, the run
    continues, also with the ``resumes`` that a resume stopped before its first checkpoint leaves (not checked)."""
    cfg = _cli_config(tmp_path, iterations=4)
    assert main(["run", str(cfg), "-q"]) == 0
    out = tmp_path / "out.h5"
    with h5py.File(out, "r") as f:
        before = dict(f.attrs)
    with h5py.File(out, "r+") as f:
        edit(f)
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.outer_iterations=6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the attribute {name!r} of" in err and f"was {how} since the checkpoint" in err
    with h5py.File(out, "r+") as f:
        for key in set(f.attrs) - set(before):
            del f.attrs[key]
        f.attrs.update(before)
        f.attrs["resumes"] = json.dumps([{"iteration": 4, "mpi_size": 2, "utc": "2026-12-06T17:00:00+00:00"}])
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.outer_iterations=6"]) == 0
    assert read_run(out)[1]["iteration"].tolist() == list(range(7))


@pytest.mark.parametrize("series", ["participation", "inner_loss"])
def test_a_client_series_value_changed_since_the_checkpoint_is_named_at_resume(tmp_path, capsys, series):
    """The checkpoint records a digest of every iteration of the per-client series (summed over the ranks' blocks,
    so any rank count resumes): a value edited since in a client file is refused at --resume, naming the iteration;
    restored, the run continues."""
    cfg = _cli_config(tmp_path, iterations=4)
    assert main(["run", str(cfg), "-q"]) == 0
    out = tmp_path / "out.h5"
    client_file = tmp_path / "out.clients" / "rank00000.h5"
    with h5py.File(client_file, "r+") as f:
        d = f["clients"][series]
        before = d[5, 2]
        d[5, 2] = before + 1 if d.dtype.kind in "iu" else np.nextafter(before, np.inf)
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.outer_iterations=6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "iteration 2 of the per-client series" in err and "changed since" in err, err
    with h5py.File(client_file, "r+") as f:
        f["clients"][series][5, 2] = before
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.outer_iterations=6"]) == 0
    assert read_run(out)[1]["iteration"].tolist() == list(range(7))


def test_rows_deleted_since_the_checkpoint_name_the_command_that_starts_again(tmp_path, capsys):
    """Rows of /iterations deleted since the checkpoint (h5py resize): refused at --resume with the one command
    that recomputes the run (--overwrite; a plain rerun would only say that the output exists)."""
    cfg = _cli_config(tmp_path, iterations=4)
    assert main(["run", str(cfg), "-q"]) == 0
    out = tmp_path / "out.h5"
    with h5py.File(out, "r+") as f:
        for column in f["iterations"].values():
            column.resize((3,))
    assert main(["run", str(cfg), "-q", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds 3 iterations, fewer than the 5 of the checkpoint (rows deleted" in err, err
    assert "the same command with --overwrite in place of --resume" in err
    assert main(["run", str(cfg), "-q", "--overwrite"]) == 0
    assert read_run(out)[1]["iteration"].tolist() == list(range(5))


def test_client_files_whose_client_ranges_were_edited_are_refused_naming_them(tmp_path, capsys):
    """A client file's first_client attribute edited (its range beyond the run's clients), or a second file with
    the same clients: one line naming the file, from --resume and from the readers. (The first case used to end
    in a traceback: the message read the name of a file it had just closed.)"""
    from fednest_mpi.io.clients import read_clients

    cfg = _cli_config(tmp_path, iterations=4)
    assert main(["run", str(cfg), "-q"]) == 0
    out, folder = tmp_path / "out.h5", tmp_path / "out.clients"
    with h5py.File(folder / "rank00000.h5", "r+") as f:
        f.attrs["first_client"] = 1
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.outer_iterations=6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rank00000.h5' holds clients 1..8 (its attributes" in err, err
    assert "the run has 8: it was edited or belongs to another run" in err
    with h5py.File(folder / "rank00000.h5", "r+") as f:
        f.attrs["first_client"] = 0
    shutil.copy(folder / "rank00000.h5", folder / "rank00001.h5")  # two files of the same clients
    with pytest.raises(UsageError, match=r"rank00001.h5' holds clients 0..7 .*, so does '.*rank00000.h5'"):
        read_clients(out)
    assert main(["run", str(cfg), "-q", "--resume", "--set", "algorithm.outer_iterations=6"]) == 2
    assert "so does" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["ranks/compute_seconds", "snapshots/x"])
def test_a_phase_time_or_snapshot_changed_since_the_checkpoint_is_named_at_resume(tmp_path, capsys, where):
    """The checkpoint records a digest of each iteration of /ranks and /snapshots too (rank 0 reads them back)."""
    cfg = _cli_config(tmp_path, iterations=4)
    sets = ["--set", "run.snapshot_every=1"]
    assert main(["run", str(cfg), "-q", *sets]) == 0
    out = tmp_path / "out.h5"
    with h5py.File(out, "r+") as f:
        before = f[where][()]
        edited = before.copy()
        if where.startswith("ranks"):
            edited[0, 2] += 1.0  # rank 0's phase time of iteration 2
        else:
            edited[2, 0] += 1.0  # the snapshot of iteration 2
        f[where][...] = edited
    assert main(["run", str(cfg), "-q", "--resume", *sets, "--set", "algorithm.outer_iterations=6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "iteration 2 of /ranks or /snapshots in" in err and "changed since" in err, err
    with h5py.File(out, "r+") as f:
        f[where][...] = before
    assert main(["run", str(cfg), "-q", "--resume", *sets, "--set", "algorithm.outer_iterations=6"]) == 0
    assert read_run(out)[1]["iteration"].tolist() == list(range(7))
