"""The command line under mpiexec: success, usage errors (exit 2, one message), failures (exit 1, no hang)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fednest_mpi.io.h5 import read_run

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
CONFIG = ROOT / "configs" / "quadratic.toml"


def run_cli(*args, ranks=1, timeout=120, env=None):
    cmd = [sys.executable, "-m", "fednest_mpi", *map(str, args)]
    if ranks > 1:
        cmd = [str(MPIEXEC), "-n", str(ranks), *cmd]
    full_env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


# in-process (main()): a fresh interpreter per argparse check cost up to a minute each on the loaded
# 2-core machine; the subprocess tests below run `python -m fednest_mpi` itself
def test_help_has_a_runnable_example(capsys):
    with pytest.raises(SystemExit) as stop:
        _main(capsys, "run", "--help")
    out = capsys.readouterr().out
    assert stop.value.code == 0 and "example:" in out and "mpiexec -n 2 fednest-mpi run" in out


def test_usage_error_of_argparse_exits_2(capsys):
    for args in (["run"], ["frobnicate"]):
        with pytest.raises(SystemExit) as stop:
            _main(capsys, *args)
        assert stop.value.code == 2


def test_resume_and_skip_finished_are_one_or_the_other(capsys):
    with pytest.raises(SystemExit) as stop:
        _main(capsys, "run", CONFIG, "--resume", "--skip-finished")
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--skip-finished: not allowed with argument --resume" in err


# 4 ranks oversubscribe this 2-core machine (MPICH busy-polls), so that run is shorter
@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.slow
@pytest.mark.parametrize("ranks,iterations,reduction", [(1, 60, 1e-6), (2, 60, 1e-6), (4, 20, 1e-1)])
def test_run_writes_hdf5_with_table_2_counts_and_converges(tmp_path, ranks, iterations, reduction):
    out = tmp_path / "q.h5"
    res = run_cli(
        "run",
        CONFIG,
        "--output",
        out,
        "--quiet",
        "--set",
        "problem.n_clients=20",
        "--set",
        "algorithm.clients_per_round=20",
        "--set",
        f"algorithm.outer_iterations={iterations}",
        "--set",
        "algorithm.neumann_steps=30",
        ranks=ranks,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith(f"output: {out}")
    attrs, data = read_run(out)
    assert attrs["mpi_size"] == ranks and attrs["config"]["algorithm"]["name"] == "fednest"
    assert data["iteration"].tolist() == list(range(iterations + 1))
    assert np.all(np.diff(data["comm_rounds"]) == 2 * 1 + 30 + 3)
    assert data["x_error"][-1] < reduction * data["x_error"][0]


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_bad_config_exits_2_with_one_message_on_all_ranks(tmp_path):
    res = run_cli("run", CONFIG, "--set", "algorithm.outer_lrr=0.1", "--output", tmp_path / "x.h5", ranks=4)
    assert res.returncode == 2
    assert res.stderr.count("fednest-mpi: error:") == 1
    assert "algorithm.outer_lrr: unknown field (did you mean 'outer_lr'?)" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "x.h5").exists()


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_more_ranks_than_clients_exits_2(tmp_path):
    res = run_cli(
        "run",
        CONFIG,
        "--set",
        "problem.n_clients=3",
        "--set",
        "algorithm.clients_per_round=2",
        "--output",
        tmp_path / "x.h5",
        ranks=4,
    )
    assert res.returncode == 2 and "3 clients cannot fill 4 MPI ranks" in res.stderr
    assert res.stderr.count("fednest-mpi: error:") == 1


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_existing_output_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "x.h5"
    out.write_bytes(b"precious")
    res = run_cli("run", CONFIG, "--output", out, "--set", "algorithm.outer_iterations=1", ranks=2)
    assert res.returncode == 2 and "already exists" in res.stderr and out.read_bytes() == b"precious"
    res = run_cli(
        "run", CONFIG, "--output", out, "--set", "algorithm.outer_iterations=1", "--overwrite", "--quiet", ranks=2
    )
    assert res.returncode == 0 and read_run(out)[1]["iteration"].tolist() == [0, 1]


def test_missing_config_file_exits_2(tmp_path, capsys):
    rc, _, err = _main(capsys, "run", tmp_path / "missing.toml")
    assert rc == 2 and "does not exist" in err


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_exception_on_one_rank_ends_the_whole_job_quickly(tmp_path):
    # timed from the failing rank's message, not from the launch: starting 4 Python ranks that
    # import torch can itself take longer than 10 s on a loaded 2-core machine
    cmd = [
        str(MPIEXEC),
        "-n",
        "4",
        sys.executable,
        "-m",
        "fednest_mpi",
        "run",
        str(CONFIG),
        "--output",
        str(tmp_path / "x.h5"),
        "--quiet",
    ]
    env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "FEDNEST_MPI_INJECT_FAULT": "2:3"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    lines, fault_seen = [], None
    for line in proc.stderr:  # ends when every rank has exited (all hold the pipe)
        lines.append(line)
        if fault_seen is None and "fault injected" in line:
            fault_seen = time.monotonic()
    proc.wait(timeout=60)
    assert fault_seen is not None, "".join(lines)
    ended = time.monotonic() - fault_seen
    assert ended < 10, f"the job ended {ended:.1f} s after the fault"
    assert proc.returncode != 0
    text = "".join(lines)
    assert "rank 2/4: run failed after iteration 2: RuntimeError: fault injected" in text
    # one line from the failing rank, naming the log file that holds its traceback; no traceback on stderr
    ours = [line for line in lines if line.startswith("fednest-mpi:")]
    log = tmp_path / "x.h5.failed" / "traceback-rank00002.log"
    assert len(ours) == 1 and f"(traceback: {log})" in ours[0] and "Traceback" not in text, text
    assert "Traceback (most recent call last)" in log.read_text() and "fault injected" in log.read_text()


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_divergence_stops_with_the_iteration(tmp_path):
    res = run_cli("run", CONFIG, "--output", tmp_path / "x.h5", "--quiet", "--set", "algorithm.inner_lr=5.0", ranks=2)
    assert res.returncode == 1
    assert "FloatingPointError: iteration" in res.stderr and "diverged" in res.stderr
    _, data = read_run(tmp_path / "x.h5")  # the file holds the iterations before the divergence
    assert len(data["iteration"]) >= 1 and np.all(np.isfinite(data["x_error"]))


def test_jobs_render_and_list(tmp_path, capsys):
    rc, out, _ = _main(capsys, "jobs", "list", ROOT / "jobs" / "sweeps" / "quadratic_variants.toml")
    assert rc == 0 and "fednest_seed0" in out
    sweep = ROOT / "jobs" / "sweeps" / "quadratic_variants.toml"
    rc, out, _ = _main(capsys, "jobs", "render", sweep, "--site", "local", "--out-dir", tmp_path, "--workdir", ROOT)
    assert rc == 0 and "submit: sbatch" in out
    assert _main(capsys, "jobs", "list", tmp_path / "missing.toml")[0] == 2


@pytest.fixture(scope="module")
def two_algorithms(tmp_path_factory):
    """FedNest and LFedNest, seeds 0 and 1: four small run files written as `fednest-mpi run` does."""
    from small_configs import make_config

    from fednest_mpi.comm import SerialComm
    from fednest_mpi.session import Session

    root = tmp_path_factory.mktemp("cli_runs")
    for algorithm in ("fednest", "lfednest"):
        for seed in (0, 1):
            cfg = make_config(
                seed=seed,
                algorithm={"name": algorithm, "outer_iterations": 4},
                run={"output": str(root / f"{algorithm}_s{seed}.h5"), "progress": "never", "client_series": False},
            )
            assert Session(cfg, SerialComm()).run_to_file() == 0
    return root


def _main(capsys, *args):
    from fednest_mpi.cli import main

    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_report_group_by_groups_the_summary_and_at_takes_the_primary_metric(two_algorithms, capsys):
    rc, out, err = _main(capsys, "report", two_algorithms, "-g", "algorithm.name")
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["fednest"], ["lfednest"])]
    assert [r[:2] for r in rows[:2]] == [["fednest", "2"], ["lfednest", "2"]] and "±" in out
    rc, out, err = _main(capsys, "report", two_algorithms, "--at", "2", "-g", "algorithm.name")
    assert rc == 0, err
    assert out.splitlines()[0].startswith("|algorithm.name|runs| 2 |") and len(out.splitlines()) == 4
    rc, out, err = _main(capsys, "report", two_algorithms, "--at", "40")
    assert rc == 2 and "no run reaches this iteration" in err and len(err.splitlines()) == 1


def test_plot_options_reach_the_figure(two_algorithms, tmp_path, capsys):
    out_file = tmp_path / "fig.pdf"
    args = ["plot", two_algorithms, "-o", out_file, "-g", "algorithm.name", "--title", "T", "--size", "3.5x2.5"]
    rc, out, err = _main(capsys, *args, "--label", "lfednest=LFedNest (local)", "--ylabel", "f", "--logx")
    assert rc == 0, err
    assert out.strip() == f"output: {out_file}" and out_file.read_bytes()[:5] == b"%PDF-"
    for bad, message in ((["--size", "big"], "--size: expected WIDTHxHEIGHT"), (["--label", "x"], "--label: expected")):
        rc, _, err = _main(capsys, "plot", two_algorithms, "-o", tmp_path / "x.png", *bad)
        assert rc == 2 and message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("variable", ["PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"])
def test_argparse_errors_are_printed_by_the_first_rank_only(capsys, variable):
    """Under mpiexec every rank parses the same arguments: a usage error (or --help) is printed once, by the
    rank its launcher numbered 0 (the ranks are known from the environment before MPI starts); all exit 2."""
    from fednest_mpi.cli import _parser
    from fednest_mpi.cli.common import parsed

    for rank, printed in ((1, False), (0, True)):
        with pytest.raises(SystemExit) as stop:
            parsed(_parser(), ["run", str(CONFIG), "--output"], environ={variable: str(rank)})
        err = capsys.readouterr().err
        assert stop.value.code == 2
        assert ("--output/-o: expected one argument" in err) is printed, (rank, err)


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_argparse_error_under_mpiexec_is_one_message(tmp_path):
    res = run_cli("run", CONFIG, "--output", ranks=2, timeout=60)
    assert res.returncode == 2
    assert res.stderr.count("expected one argument") == 1 and res.stderr.count("\n") == 1, res.stderr


def test_an_argparse_error_is_one_line_with_the_way_out(capsys):
    """``--output -x.h5``: argparse reads '-x.h5' as an option; the line says how to pass such a value."""
    with pytest.raises(SystemExit) as stop:
        _main(capsys, "run", CONFIG, "--output", "-x.h5")
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert "--output/-o: expected one argument; a value that starts with '-' goes after '=' (--output=-run.h5)" in err


def test_an_exception_in_a_one_rank_run_is_one_line_naming_its_traceback_log(tmp_path, capfd, monkeypatch):
    """Without mpiexec as under it: the run's one line names the log file that holds the traceback."""
    from fednest_mpi.cli import main

    monkeypatch.setenv("FEDNEST_MPI_INJECT_FAULT", "0:2:raise")
    out = tmp_path / "x.h5"
    rc = main(["run", str(CONFIG), "--set", "algorithm.outer_iterations=4", "--output", str(out), "-q"])
    err = capfd.readouterr().err  # the line is written to file descriptor 2 in one write
    log = tmp_path / "x.h5.failed" / "traceback-rank00000.log"
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "rank 0/1: run failed after iteration 1: RuntimeError: fault injected" in err
    assert f"(traceback: {log})" in err and "Traceback (most recent call last)" in log.read_text()


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_an_exception_on_one_rank_is_one_line_without_mpichs_abort_line(tmp_path):
    """The failing rank's line is the job's only one: MPICH's own 'Abort(1) on node 1 ... MPI_Abort' is not added."""
    res = run_cli("run", CONFIG, "--set", "algorithm.outer_iterations=4", "--output", tmp_path / "x.h5", "-q",
                  ranks=2, env={"FEDNEST_MPI_INJECT_FAULT": "1:2:raise"})  # fmt: skip
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith("fednest-mpi: rank 1/2: run failed after iteration 1") and "(traceback: " in lines[0]
