"""Rendered sweeps on a live SLURM (``make test-cluster``; skipped, loudly, when none answers).

Every test renders a sweep with ``fednest-mpi jobs render`` for the site file of the test
cluster (``jobs/sites/ci-slurm.toml``), submits it with ``sbatch`` and compares the HDF5 files
bitwise (timing columns and run-time attributes aside) with the same tasks run outside SLURM:

a. a 4-task array with ``%2``: every task completes, every file equals the workstation runner's;
b. preemption: USR1 through ``scancel --signal=USR1 --batch`` and through
   ``--signal=B:USR1@20`` near a 1-minute limit; checkpoint, requeue, restart with
   ``SLURM_RESTART_COUNT=1``, resume; the final file equals an uninterrupted run; the log tells it;
c. a task with a bad config exits 2 with one message in its log, the other tasks complete;
d. a 2-rank task started by ``srun --mpi=pmi2`` and by ``mpiexec`` inside the allocation equals
   ``mpiexec -n 2`` outside SLURM.

The configs are small (``configs/quadratic.toml``, few iterations), except the preempted run,
which must outlast SLURM's early delivery of the time-limit signal (up to ~30 s early).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from histories import assert_histories_match

from fednest_mpi.io.h5 import read_run

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SITE = ROOT / "jobs" / "sites" / "ci-slurm.toml"
LOCAL_SITE = "local"  # the built-in workstation site
CONFIG = ROOT / "configs" / "quadratic.toml"
FINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}
VOLATILE_ATTRS = {"created_utc", "hostname", "resumes", "config"}  # when and where; config is config_json parsed


def job_env() -> dict[str, str]:
    """The submitter's environment: this venv first (sbatch passes it on), no SLURM_ variables of
    an enclosing allocation except SLURM_CONF."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "OMPI_")) or k == "SLURM_CONF"}
    env.update(
        FEDNEST_VENV=sys.prefix,
        VIRTUAL_ENV=sys.prefix,
        PATH=f"{BIN}:{env.get('PATH', '')}",
        MPI4PY_RC_THREAD_LEVEL="single",
        OMP_NUM_THREADS="1",
    )
    return env


def run(cmd, timeout=120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=job_env(), **kw)


def render(folder: Path, sweep_text: str, site: Path | str = SITE, *args: str) -> Path:
    """Render the sweep ``folder/s.toml`` to ``folder/jobs`` (jobs run in ``folder``); the jobs folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "s.toml").write_text(sweep_text)
    res = run(
        [
            BIN / "fednest-mpi",
            "jobs",
            "render",
            folder / "s.toml",
            "--site",
            site,
            "--out-dir",
            folder / "jobs",
            "--workdir",
            folder,
            *args,
        ]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return folder / "jobs"


def sweep(
    iterations: int,
    grid: str,
    *,
    ranks: int = 1,
    time_limit: str = "00:05:00",
    signal_seconds: int = 60,
    max_restarts: int = 3,
    extra: str = "",
) -> str:
    return f"""
config = "{CONFIG}"
output_dir = "out"
[set]
algorithm.outer_iterations = {iterations}
{extra}
[grid]
{grid}
[resources]
tasks_per_node = {ranks}
time = "{time_limit}"
signal_seconds = {signal_seconds}
max_restarts = {max_restarts}
max_parallel = 2
"""


def sbatch(script: Path, folder: Path) -> str:
    res = run(["sbatch", "--parsable", script], cwd=folder)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def job_records(job_id: str) -> list[dict[str, str]]:
    res = run(["scontrol", "-o", "show", "job", job_id])
    assert res.returncode == 0, res.stderr
    return [dict(tok.split("=", 1) for tok in line.split() if "=" in tok) for line in res.stdout.splitlines() if line]


def wait_for(job_id: str, n_tasks: int = 1, timeout: float = 300) -> list[dict[str, str]]:
    """Every array task of ``job_id`` in a final state (a requeued task is not); its records by task id."""
    deadline = time.monotonic() + timeout
    while True:
        records = job_records(job_id)
        if len(records) == n_tasks and all(r["JobState"] in FINAL for r in records):
            return sorted(records, key=lambda r: int(r.get("ArrayTaskId", 0)))
        if time.monotonic() > deadline:
            pytest.fail(
                f"job {job_id} not done after {timeout} s: "
                + "; ".join(f"{r.get('ArrayTaskId')}: {r['JobState']} {r.get('Reason')}" for r in records)
            )
        time.sleep(0.5)


def logs(jobs_dir: Path, record: dict[str, str]) -> tuple[str, str]:
    """(stdout, stderr) of one array task."""
    return Path(record["StdOut"]).read_text(), Path(record["StdErr"]).read_text()


def assert_same_run(path: Path, reference: Path) -> None:
    """Same columns, every non-timing column bitwise equal, same attributes apart from when and where."""
    attrs, data = read_run(path)
    ref_attrs, ref_data = read_run(reference)
    assert sorted(data) == sorted(ref_data)
    assert_histories_match(data, ref_data)
    assert {k: v for k, v in attrs.items() if k not in VOLATILE_ATTRS} == {
        k: v for k, v in ref_attrs.items() if k not in VOLATILE_ATTRS
    }


def tasks_of(jobs_dir: Path) -> list[list[str]]:
    """The tasks file: one word list per task (NAME RANKS ARGS...)."""
    return [shlex.split(line) for line in next(jobs_dir.glob("*.tasks")).read_text().splitlines()]


# ----------------------------------------------------------------------------------------------


def test_array_of_four_with_throttle_equals_the_workstation_runner(tmp_path):
    text = sweep(20, 'algorithm.name = ["fednest", "lfednest"]\nseed = [0, 1]')
    jobs_dir = render(tmp_path / "slurm", text)
    script = jobs_dir / "s.array.sbatch"
    assert "#SBATCH --array=0-3%2" in script.read_text()
    job_id = sbatch(script, tmp_path / "slurm")
    # meanwhile the same sweep through the workstation script
    local = render(tmp_path / "local", text, LOCAL_SITE)
    res = run(["bash", local / "s.local.sh", "-j", "1"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    records = wait_for(job_id, 4)
    assert [(r["ArrayTaskId"], r["JobState"], r["ExitCode"]) for r in records] == [
        (str(i), "COMPLETED", "0:0") for i in range(4)
    ]
    assert all(r.get("ArrayTaskThrottle") in (None, "2") for r in records)
    names = [t[0] for t in tasks_of(jobs_dir)]
    assert len(set(names)) == 4
    for name, record in zip(names, records):
        out, err = logs(jobs_dir, record)
        assert f"output: out/{name}.h5" in out, out + err
        assert_same_run(tmp_path / "slurm" / "out" / f"{name}.h5", tmp_path / "local" / "out" / f"{name}.h5")
        assert read_run(tmp_path / "slurm" / "out" / f"{name}.h5")[0]["mpi_size"] == 1


# The preempted run must outlast the 10-40 s after its start within which SLURM (checking about
# every 30 s) sends --signal=B:USR1@20 to a job with a 1-minute limit: sized from a timed short run.
PREEMPT_SECONDS = 45


def preempt_iterations(folder: Path) -> int:
    """Iterations of configs/quadratic.toml that take about PREEMPT_SECONDS on this machine now."""
    folder.mkdir()
    res = run(
        [BIN / "fednest-mpi", "run", CONFIG, "-q", "--set", "algorithm.outer_iterations=100", "--output", "t.h5"],
        cwd=folder,
    )
    assert res.returncode == 0, res.stderr
    per_iteration = read_run(folder / "t.h5")[1]["wall_time"][-1] / 100
    return max(300, min(20000, int(PREEMPT_SECONDS / per_iteration)))


def assert_preemption_story(out: str, err: str, restarts: int) -> None:
    """The log of a task stopped by USR1, requeued and resumed ``restarts`` times."""
    story = [
        r"restart 0,",
        r"USR1 before the time limit: asking the run to checkpoint",
        r"fednest-mpi: stopped by SIGUSR1 after iteration (\d+), checkpoint written",
        r"requeueing to resume",
        r"restart 1,",
        r"resuming after iteration (\d+)",
    ]
    pos, stopped = 0, None
    for pattern in story:
        m = re.compile(pattern).search(err, pos)
        assert m, f"{pattern!r} missing (in order) from the job log:\n{err}"
        pos = m.end()
        if m.groups():
            if stopped is None:
                stopped = m.group(1)
            else:
                assert m.group(1) == stopped, err  # resumed where it stopped
    assert len(re.findall(r"restart \d+,", err)) == restarts + 1, err
    assert "Traceback" not in err and "fednest-mpi: error" not in err, err
    assert out.rstrip().endswith(".h5"), out


def test_preempted_task_checkpoints_requeues_and_resumes_to_the_same_bits(tmp_path):
    """Two preemptions of the same task, both compared with one uninterrupted run:
    ``scancel --signal=USR1 --batch`` mid-run, and SLURM's own ``--signal=B:USR1@20`` before a
    1-minute limit (it may strike again after a restart: up to 8 restarts allowed)."""
    grid, iterations = "seed = [7]", preempt_iterations(tmp_path / "timing")
    by_hand = render(tmp_path / "scancel", sweep(iterations, grid, time_limit="00:10:00"))
    by_limit = render(tmp_path / "limit", sweep(iterations, grid, time_limit="1", signal_seconds=20, max_restarts=8))
    assert "#SBATCH --signal=B:USR1@20" in (by_limit / "s.array.sbatch").read_text()
    limit_id = sbatch(by_limit / "s.array.sbatch", tmp_path / "limit")
    hand_id = sbatch(by_hand / "s.array.sbatch", tmp_path / "scancel")
    name = tasks_of(by_hand)[0][0]

    # USR1 by hand once the run has written 20 iterations
    output = tmp_path / "scancel" / "out" / f"{name}.h5"
    deadline = time.monotonic() + 120
    while not (output.exists() and len(read_run(output)[1]["iteration"]) >= 20):
        assert time.monotonic() < deadline, f"no 20 iterations in {output} after 120 s: {job_records(hand_id)}"
        time.sleep(0.3)
    res = run(["scancel", "--signal=USR1", "--batch", hand_id])
    assert res.returncode == 0, res.stderr

    # the uninterrupted run, by the workstation script, while the jobs go on
    local = render(tmp_path / "local", sweep(iterations, grid), LOCAL_SITE)
    res = run(["bash", local / "s.local.sh"], timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    reference = tmp_path / "local" / "out" / f"{name}.h5"

    (hand,) = wait_for(hand_id, timeout=300)
    assert (hand["JobState"], hand["ExitCode"], hand["Restarts"]) == ("COMPLETED", "0:0", "1"), hand
    assert_preemption_story(*logs(by_hand, hand), restarts=1)
    assert_same_run(output, reference)

    (limit,) = wait_for(limit_id, timeout=400)
    assert (limit["JobState"], limit["ExitCode"]) == ("COMPLETED", "0:0"), limit
    restarts = int(limit["Restarts"])
    assert 1 <= restarts <= 8, limit
    assert_preemption_story(*logs(by_limit, limit), restarts=restarts)
    assert_same_run(tmp_path / "limit" / "out" / f"{name}.h5", reference)


def test_bad_config_task_exits_2_with_one_message_while_the_others_complete(tmp_path):
    jobs_dir = render(tmp_path, sweep(5, "algorithm.inner_lr = [0.05, -1.0, 0.1]"), SITE, "--no-check")
    job_id = sbatch(jobs_dir / "s.array.sbatch", tmp_path)
    records = wait_for(job_id, 3)
    assert [(r["JobState"], r["ExitCode"]) for r in records] == [
        ("COMPLETED", "0:0"),
        ("FAILED", "2:0"),
        ("COMPLETED", "0:0"),
    ]
    names = [t[0] for t in tasks_of(jobs_dir)]
    out, err = logs(jobs_dir, records[1])
    messages = [line for line in err.splitlines() if line.startswith("fednest-mpi: error:")]
    assert len(messages) == 1 and "algorithm.inner_lr" in messages[0], err
    assert "Traceback" not in err and "output:" not in out
    assert not (tmp_path / "out" / f"{names[1]}.h5").exists()
    for i in (0, 2):
        assert read_run(tmp_path / "out" / f"{names[i]}.h5")[1]["iteration"].tolist() == list(range(6))


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_two_rank_task_in_the_allocation_equals_mpiexec_outside(tmp_path, launcher):
    jobs_dir = render(tmp_path, sweep(20, "seed = [3]", ranks=2), SITE, "--launcher", launcher)
    script = (jobs_dir / "s.array.sbatch").read_text()
    assert re.search(
        r"^srun -n \"\$RANKS\" --mpi=pmi2 fednest-mpi run"
        if launcher == "srun"
        else r"^mpiexec -n \"\$RANKS\" fednest-mpi run",
        script,
        re.M,
    )
    job_id = sbatch(jobs_dir / "s.array.sbatch", tmp_path)
    name, ranks, *args = tasks_of(jobs_dir)[0]
    assert ranks == "2"
    outside = tmp_path / "outside"  # the same relative output path (it is in the file's config) in another folder
    outside.mkdir()
    res = run([BIN / "mpiexec", "-n", "2", BIN / "fednest-mpi", "run", CONFIG, "-q", *args], timeout=120, cwd=outside)
    assert res.returncode == 0, res.stderr
    (record,) = wait_for(job_id)
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), logs(jobs_dir, record)
    result, reference = tmp_path / "out" / f"{name}.h5", outside / "out" / f"{name}.h5"
    assert read_run(result)[0]["mpi_size"] == 2 == read_run(reference)[0]["mpi_size"]
    assert_same_run(result, reference)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root to become the user nobody")
def test_slurm_sh_up_and_down_as_an_ordinary_user():
    """jobs/ci/slurm.sh as the user nobody: its own munged, slurmctld and slurmd; a job runs as nobody;
    down leaves no process and no folder."""
    home = Path(tempfile.mkdtemp(prefix="fednest-nobody-"))  # pytest's tmp_path is private to root
    home.chmod(0o755)
    script = home / "slurm.sh"
    shutil.copy(ROOT / "jobs" / "ci" / "slurm.sh", script)
    script.chmod(0o755)
    as_nobody = ["runuser", "-u", "nobody", "--", "env", "TMPDIR=/tmp"]
    res = run([*as_nobody, "bash", script, "up"], timeout=120)
    assert res.returncode == 0, res.stderr
    folder = Path(res.stdout.split()[-1])
    try:
        assert folder.stat().st_uid != 0
        conf = f"SLURM_CONF={folder / 'slurm.conf'}"
        res = run([*as_nobody, conf, "sbatch", "--wait", "-o", folder / "job.out", "--wrap", "id -un"], timeout=60)
        assert res.returncode == 0, res.stderr
        assert (folder / "job.out").read_text().strip() == "nobody"
        pids = [(folder / f).read_text().strip() for f in ("slurmctld.pid", "slurmd.pid", "munge/munged.pid")]
    finally:
        res = run([*as_nobody, "bash", script, "down", folder], timeout=60)
    assert res.returncode == 0, res.stderr
    shutil.rmtree(home)
    assert not folder.exists()
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]
