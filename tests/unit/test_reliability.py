"""The table of docs/reliability.md ("What was tried"), executed; and run files damaged at many offsets.

:data:`CASES` lists what a hostile user or a failing cluster does and the result the docs promise.
:func:`test_case` runs each one (subprocesses with timeouts: a hang fails the test instead of
hanging the suite) and compares the observed result with the promised one, and every case must
end within :data:`LIMIT` seconds. :func:`test_the_doc_table_is_the_executed_list` checks that the
table in docs/reliability.md is exactly :func:`render_table` (its failure message prints the table
to paste). :func:`test_damaged_files_fail_fast_or_read_the_same` is the property test: a real run
file and a client file truncated, zeroed, overwritten with random bytes or bit-flipped at many
offsets must either read exactly like the undamaged file or give one usage error, each in seconds.
"""

import atexit
import inspect
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from test_checkpoint import MPIEXEC, _cli_config, run_cli

from fednest_mpi import checkpoint
from fednest_mpi.io import schema as S
from fednest_mpi.io.h5 import read_run

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
PLUGINS = ROOT / "tests" / "plugins"
LIMIT = 30.0  # seconds any case may take (the bound)
ONE_LINE = "exit 2, one line"
STOPPED = "exit 0, 1 line(s), checkpoint of the iteration it names, no traceback or banner"


def _one_line_error(res) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    if res.returncode == 2 and len(lines) == 1 and lines[0].startswith("fednest-mpi: error:"):
        return ONE_LINE
    return f"exit {res.returncode}, {len(lines)} lines: {res.stderr[-300:]!r}"


_TEMPLATES: dict = {}  # key -> (folder, what make returned): runs made once per session


def _staged(key, make):
    """What ``make(folder)`` returns for a run it makes in ``folder``: made once per key, then copied
    afresh into that same folder for every case that asks (a case damages its copy). The copy keeps
    the absolute paths that the run's config and checkpoint name, so it resumes like the original;
    the cases run one after another."""
    if key not in _TEMPLATES:
        base = Path(tempfile.mkdtemp(prefix="fednest-reliability-"))
        atexit.register(shutil.rmtree, base, True)
        (base / "run").mkdir()
        _TEMPLATES[key] = (base, make(base / "run"))
        shutil.copytree(base / "run", base / "template", symlinks=True)
    base, result = _TEMPLATES[key]
    shutil.rmtree(base / "run")
    shutil.copytree(base / "template", base / "run", symlinks=True)
    return result


def _finished_run(tmp, iterations=6, **kw):
    """(config, output) of a finished 1-rank run of 6 iterations, checkpoints every 2 (a fresh copy;
    ``tmp`` is not used: the copy lives in a folder of its own, :func:`_staged`)."""

    def make(folder):
        cfg = _cli_config(folder, iterations=iterations, every=2)
        res = run_cli("run", cfg, "-q", **kw)
        assert res.returncode == 0, res.stderr
        return cfg, folder / "out.h5"

    return _staged(("finished", iterations, tuple(sorted(kw.items()))), make)


def _damage(path: Path, kind: str, offset: int, rnd=None) -> None:
    data = bytearray(path.read_bytes())
    if kind == "truncate":
        data = data[:offset]
    elif kind == "zero":
        data[offset : offset + 64] = bytes(len(data[offset : offset + 64]))
    elif kind == "random":
        n = len(data[offset : offset + 3000])
        data[offset : offset + n] = (rnd or random.Random(offset)).randbytes(n)
    elif kind == "flip":
        data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------------------------
# the cases: each returns the observed result


def resume_after(damage):
    def case(tmp):
        cfg, out = _finished_run(tmp)
        damage(out)
        return _one_line_error(
            run_cli("run", cfg, "-q", "--resume", "--set", "algorithm.outer_iterations=9", timeout=LIMIT)
        )

    return case


def reader_on(command, damage):
    def case(tmp):
        _, out = _finished_run(tmp)
        damage(out)
        args = ["report", out] if command == "report" else ["plot", out, "-o", tmp / "f.png"]
        return _one_line_error(run_cli(*args, timeout=LIMIT))

    return case


def half(path):
    _damage(path, "truncate", path.stat().st_size // 2)


def client_file(damage):
    return lambda out: damage(S.client_dir(out) / S.rank_file(0))


def _killed(tmp):
    cfg = _cli_config(tmp, iterations=10, every=3)
    res = run_cli("run", cfg, "-q", env={"FEDNEST_MPI_INJECT_FAULT": "0:8:kill"})
    assert res.returncode == -signal.SIGKILL
    return cfg, tmp / "out.h5"


def report_on_killed(tmp):
    _, out = _killed(tmp)
    res = run_cli("report", out, timeout=LIMIT)
    return _one_line_error(res) + (", names `fednest-mpi recover`" if "fednest-mpi recover" in res.stderr else "")


def recover_killed(tmp):
    _, out = _killed(tmp)
    res = run_cli("recover", out, timeout=LIMIT)
    with h5py.File(out, "r") as f:  # plain read mode
        kept = json.loads(f.attrs["recovered"])["iterations_kept"]
        rows = {
            f["iterations/iteration"].shape[0],
            f["ranks/wait_seconds"].shape[1],
            f["clients/participation"].shape[1],
        }
    return f"exit {res.returncode}, plain HDF5 opens it, {kept} iterations kept, all parts in step: {rows == {kept}}"


def resume_killed(tmp):
    cfg, out = _killed(tmp)
    res = run_cli("run", cfg, "-q", "--resume", timeout=LIMIT)
    return f"exit {res.returncode}, {len(read_run(out)[1]['iteration'])} iterations"


def second_writer(flags):
    def case(tmp):
        cfg = _cli_config(tmp, iterations=100000, every=0)
        env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "OMP_NUM_THREADS": "1"}
        first = subprocess.Popen(
            [sys.executable, "-m", "fednest_mpi", "run", str(cfg), "-q"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not (tmp / "out.h5.ckpt" / "state.pt").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            res = run_cli("run", cfg, "-q", *flags, timeout=LIMIT)
            named = f"pid {first.pid}," in res.stderr and "host " in res.stderr and "started " in res.stderr
            first.send_signal(signal.SIGTERM)
            first.communicate(timeout=60)
        finally:
            first.kill()
        named = ", names host, pid, start" if named else ""
        return _one_line_error(res) + named + f"; first run exit {first.returncode}"

    return case


def stale_lock(tmp):
    cfg, out = _killed(tmp)
    assert len(list(tmp.glob("*.lock"))) == 2  # the output's and the checkpoint folder's
    res = run_cli("run", cfg, "-q", "--overwrite", timeout=LIMIT)
    left = "none left" if not list(tmp.glob("*.lock")) else f"left {sorted(p.name for p in tmp.glob('*.lock'))}"
    return f"exit {res.returncode}, takes both stale locks over, {left}"


def stale_locks_without_overwrite(tmp):
    cfg, out = _killed(tmp)
    out.unlink()  # else the existing output is refused first
    res = run_cli("run", cfg, "-q", timeout=LIMIT)
    both = f"rm {out}.lock {out}.ckpt.lock" in res.stderr
    return _one_line_error(res) + (", one `rm` of both locks" if both else "")


def failure_on(rank, kind="raise", k=5):
    def case(tmp):
        cfg = _cli_config(tmp, iterations=10, every=3)
        res = run_cli("run", cfg, "-q", ranks=2, env={"FEDNEST_MPI_INJECT_FAULT": f"{rank}:{k}:{kind}"}, timeout=LIMIT)
        out = tmp / "out.h5"
        with h5py.File(out, "r") as f:  # plain read mode: closed
            parts = {f["iterations/iteration"].shape[0], f["ranks/wait_seconds"].shape[1]}
        for r in range(2):
            with h5py.File(S.client_dir(out) / S.rank_file(r), "r") as g:
                parts.add(g["clients/participation"].shape[1])
        return f"exit {res.returncode}, files closed, rows/clients/ranks: {sorted(parts)}"

    return case


def _parts(out: Path) -> list[int]:
    """The iterations held by each part of the run ``out`` (rows, /ranks columns, both client files), read in
    plain HDF5 mode (a file not closed raises)."""
    with h5py.File(out, "r") as f:
        parts = {f["iterations/iteration"].shape[0], f["ranks/wait_seconds"].shape[1]}
    for r in range(2):
        with h5py.File(S.client_dir(out) / S.rank_file(r), "r") as g:
            parts.add(g["clients/participation"].shape[1])
    return sorted(parts)


def _plugin_fault(tmp, fault, at, *sets):
    """The 2-rank run of :func:`_cli_config` with the algorithm tests/plugins/faulty_plugins.py:FaultyFedNest, which
    makes ``fault`` on rank 1 in every step from iteration ``at`` on."""
    sets = (
        'algorithm.name="faulty_plugins:FaultyFedNest"',
        f'algorithm.fault="{fault}"',
        "algorithm.fault_rank=1",
        f"algorithm.fault_at={at}",
        *sets,
    )
    cfg = _cli_config(tmp, iterations=10, every=3)
    args = [a for s in sets for a in ("--set", s)]
    return run_cli("run", cfg, "-q", *args, ranks=2, env={"PYTHONPATH": str(PLUGINS)}, timeout=LIMIT)


def rank_dependent_x(tmp):
    res = _plugin_fault(tmp, "rank_x", 3, "run.check_consistency=1")
    ours = _our_lines(res.stderr)
    named = len(ours) == 1 and "differ between ranks at iteration 3 (rank 1 differs from rank 0)" in ours[0]
    return f"exit {res.returncode}, {len(ours)} line(s) naming iteration 3 and rank 1: {named}, files closed, " + (
        f"rows/clients/ranks: {_parts(tmp / 'out.h5')}"
    )


def os_exit_then_recover(tmp):
    res = _plugin_fault(tmp, "os_exit", 2)
    out = tmp / "out.h5"
    report = run_cli("report", out, timeout=LIMIT)
    named = "fednest-mpi recover" in report.stderr
    rec = run_cli("recover", out, timeout=LIMIT)
    says = rec.stdout.startswith(f"recovered {out}: kept iterations 0..1 (2 rows")
    return (
        f"exit {res.returncode}, {len(_our_lines(res.stderr))} line(s); `report` names `fednest-mpi recover`: "
        f"{named}; `recover`: exit {rec.returncode}, says what it kept: {says}, rows/clients/ranks: {_parts(out)}"
    )


def bad_input(*args, ranks=1, text=None, name="bad.toml"):
    def case(tmp):
        cfg = _cli_config(tmp)
        if text is not None:
            cfg = tmp / name
            if text == "folder":
                cfg.mkdir()
            else:
                cfg.write_bytes(text)
        return _one_line_error(run_cli("run", cfg, "-q", *args, ranks=ranks, timeout=LIMIT))

    return case


def output_named(name: bytes, *how: str):
    """`run` with the output named ``name`` (bytes, as a shell passes them), by --output or, with ``how``,
    --set ("open quote": after a quote that opens a TOML string and never closes it)."""

    def case(tmp):
        cfg = _cli_config(tmp, iterations=2)
        out = os.fsencode(tmp) + b"/" + name
        quote = b'"' if how == ("open quote",) else b""
        arg = ["--output", out] if not how else ["--set", b"run.output=" + quote + out]
        res = run_cli_bytes("run", cfg, "-q", *arg)
        if res.returncode != 0:
            lines = [line for line in res.stderr.splitlines() if line.strip()]
            written = sorted(p.name for p in tmp.iterdir() if p.name != cfg.name)
            head = b"fednest-mpi: error:"
            one = res.returncode == 2 and len(lines) == 1 and lines[0].startswith(head)
            return (ONE_LINE if one else f"exit {res.returncode}: {res.stderr[-300:]!r}") + f", written: {written}"
        there = os.path.isfile(out) and res.stdout == b"output: " + out + b"\n"
        return f"exit 0, the run file at exactly that path: {there}"

    return case


def run_cli_bytes(*args):
    """:func:`run_cli` with argv and output as bytes."""
    cmd = [
        os.fsencode(sys.executable),
        b"-m",
        b"fednest_mpi",
        *(a if isinstance(a, bytes) else os.fsencode(a) for a in args),
    ]
    env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, timeout=LIMIT, env=env)


def edited_row(out):
    with h5py.File(out, "r+") as f:
        f["iterations/outer_objective"][3] += 1e-9


def resume_after_edit(tmp):
    cfg, out = _finished_run(tmp)
    edited_row(out)
    res = run_cli("run", cfg, "-q", "--resume", "--set", "algorithm.outer_iterations=9", timeout=LIMIT)
    told = "with --overwrite in place of --resume" in res.stderr
    # the repair the line offers: the same command with --overwrite recomputes every row (the run is deterministic)
    with h5py.File(out, "r") as f:
        edited = f["iterations/outer_objective"][()]
    fixed = run_cli("run", cfg, "-q", "--overwrite", "--set", "algorithm.outer_iterations=9", timeout=LIMIT)
    with h5py.File(out, "r") as f:
        repaired = f["iterations/outer_objective"][()]
    same = bool((np.delete(repaired[:7], 3) == np.delete(edited, 3)).all() and repaired[3] != edited[3])
    return (
        _one_line_error(res)
        + (", names row 3" if "row 3 of /iterations" in res.stderr else "")
        + f", offers --overwrite: {told}; that rerun: exit {fixed.returncode}, {len(repaired)} rows, row 3 recomputed"
        f" and the others the same: {same}"
    )


def resume_after_attribute_edit(tmp):
    cfg, out = _finished_run(tmp)
    with h5py.File(out, "r+") as f:
        f.attrs["seed"] = 99  # the file would then claim a seed its rows were not computed with
    res = run_cli("run", cfg, "-q", "--resume", "--set", "algorithm.outer_iterations=9", timeout=LIMIT)
    with h5py.File(out, "r") as f:
        kept = int(f.attrs["seed"]) == 99 and f["iterations/iteration"].shape[0] == 7
    named = "the attribute 'seed'" in res.stderr
    return _one_line_error(res) + f", names the attribute 'seed': {named}, file kept: {kept}"


def resume_after_client_edit(tmp):
    cfg, out = _finished_run(tmp)
    with h5py.File(S.client_dir(out) / S.rank_file(0), "r+") as f:
        f["clients/outer_loss"][1, 2] = 0.0  # the checkpoint after iteration 6 covers iteration 2
    res = run_cli("run", cfg, "-q", "--resume", "--set", "algorithm.outer_iterations=9", timeout=LIMIT)
    named = "iteration 2 of the per-client series" in res.stderr
    return _one_line_error(res) + f", names iteration 2: {named}"


def config_is(make):
    def case(tmp):
        path = tmp / "c.toml"
        make(path)
        res = run_cli("run", path, "-q", timeout=LIMIT)
        what = res.stderr.split("' ")[-1].split(";")[0] if res.returncode == 2 else ""
        return _one_line_error(res) + (f", says it {what}" if what else "")

    return case


def failure_log(rank=1, ranks=2):
    """An exception on ``rank`` of ``ranks``: the job's lines on stderr (all of them, MPICH's included), the log."""

    def case(tmp):
        cfg = _cli_config(tmp, iterations=10, every=3)
        env = {"FEDNEST_MPI_INJECT_FAULT": f"{rank}:5:raise"}
        res = run_cli("run", cfg, "-q", ranks=ranks, env=env, timeout=LIMIT)
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        log = tmp / "out.h5.failed" / f"traceback-rank{rank:05d}.log"
        named = len(lines) == 1 and f"(traceback: {log})" in lines[0] and "Traceback" not in res.stderr
        logged = log.is_file() and "Traceback (most recent call last)" in log.read_text()
        return f"exit {res.returncode}, {len(lines)} line(s) naming the log: {named}, traceback in the log: {logged}"

    return case


def edited_client_range(out):
    with h5py.File(S.client_dir(out) / S.rank_file(0), "r+") as f:
        f.attrs["first_client"] = 1  # its clients 1..M: beyond the run's


def resume_without_clients(tmp):
    cfg, out = _finished_run(tmp)
    shutil.rmtree(S.client_dir(out))
    return _one_line_error(
        run_cli("run", cfg, "-q", "--resume", "--set", "algorithm.outer_iterations=9", timeout=LIMIT)
    )


# ---- signals, stuck ranks, deleted outputs (issue 26)

LAUNCHER = "[mpiexec@"  # hydra's own lines ("Sending Ctrl-C to processes as requested")
BANNER = "BAD TERMINATION"


def _our_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith(LAUNCHER)]


def _start(tmp, ranks=2, sets=(), iterations=100000, algorithm=None):
    """A long run started in its own process group; returns (process, config, output)."""
    cfg = _cli_config(tmp, iterations=iterations, every=0)
    extra = [a for s in sets for a in ("--set", s)]
    if algorithm:
        extra += ["--set", f"algorithm.name={algorithm}"]
    cmd = [sys.executable, "-m", "fednest_mpi", "run", str(cfg), "-q", *extra]
    if ranks > 1:
        cmd = [str(MPIEXEC), "-n", str(ranks), *cmd]
    env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    return proc, cfg, tmp / "out.h5"


def _iterating(proc, out, timeout=60.0) -> None:
    """Wait until the run has written its checkpoint of iteration 0 (it is then in its iterations)."""
    deadline = time.monotonic() + timeout
    while not (out.parent / (out.name + ".ckpt") / "state.pt").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
        time.sleep(0.1)
    time.sleep(0.5)


def _ranks(proc) -> list[int]:
    """pids of the Python processes (the ranks) under ``proc`` (mpiexec and its proxy), in start order."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    below, todo = [], [proc.pid]
    while todo:
        pid = todo.pop()
        children = [c for c, p in parents.items() if p == pid]
        below += children
        todo += children
    ranks = []
    for pid in below:
        try:
            if "fednest_mpi" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                ranks.append(pid)
        except OSError:
            continue
    return sorted(ranks)


def _ended(proc, timeout=LIMIT):
    t0 = time.monotonic()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, "", "", timeout
    return proc.returncode, stdout, stderr, time.monotonic() - t0


def _stopped_result(proc, out, by=None) -> str:
    """The result of a run asked to stop: exit, lines, and whether the checkpoint is the iteration named."""
    rc, stdout, stderr, _ = _ended(proc)
    if rc is None:
        return "hangs"
    lines = _our_lines(stderr)
    named = re.search(rf"stopped by {by or '.*'} after iteration (\d+), checkpoint written", stderr)
    same = named is not None and checkpoint.load(out.parent / (out.name + ".ckpt")).iteration == int(named.group(1))
    clean = "Traceback" not in stderr and BANNER not in stdout + stderr
    return (
        f"exit {rc}, {len(lines)} line(s)"
        + (", checkpoint of the iteration it names" if same else "")
        + (", no traceback or banner" if clean else f": {stderr[-300:]!r}")
    )


def _forced_result(proc, out) -> str:
    """The result of a run ended at once: exit, lines, the run file closed, the lock gone."""
    rc, stdout, stderr, _ = _ended(proc, timeout=LIMIT + 15)
    if rc is None:
        return "hangs"
    lines = _our_lines(stderr)
    try:
        with h5py.File(out, "r"):  # plain read mode: closed
            closed = True
    except OSError:
        closed = False
    unlocked = not (out.parent / (out.name + ".lock")).exists()
    return (
        f"exit {rc}, {len(lines)} line(s)"
        + (", run file closed" if closed else ", run file left for `recover`")
        + (", lock released" if unlocked else "")
        + ("" if BANNER not in stdout + stderr else ", banner")
    )


def signalled(target, signum=signal.SIGINT, ranks=2, repeat_after=None):
    """A signal to mpiexec, to one rank or to the whole process group, once the run iterates."""

    def case(tmp):
        proc, _, out = _start(tmp, ranks=ranks)
        try:
            _iterating(proc, out)
            for i in range(2 if repeat_after is not None else 1):
                if i:
                    time.sleep(repeat_after)
                if target == "group":
                    os.killpg(proc.pid, signum)
                elif target == "rank":
                    os.kill(_ranks(proc)[-1], signum)
                else:
                    proc.send_signal(signum)
            return _stopped_result(proc, out)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    return case


def early_usr1(tmp):
    """SIGUSR1 to mpiexec 1 s after the start: during start-up, before the run looks for signals."""
    proc, _, out = _start(tmp)
    try:
        time.sleep(1.0)
        proc.send_signal(signal.SIGUSR1)
        return _stopped_result(proc, out, by="SIGUSR1")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def stuck_rank(then, sets=(), which=-1):
    """Rank 1 of 2 stopped (SIGSTOP) while the run iterates, then ``then``: "term" (one SIGTERM to
    mpiexec), "term twice" (a second 2 s later), "nothing" (the watchdog's business)."""

    def case(tmp):
        proc, _, out = _start(tmp, sets=sets)
        try:
            _iterating(proc, out)
            os.kill(_ranks(proc)[which], signal.SIGSTOP)  # -1: rank 1 (started last), 0: rank 0
            time.sleep(0.5)
            if then.startswith("term"):
                proc.send_signal(signal.SIGTERM)
            if then == "term twice":
                time.sleep(2.0)
                proc.send_signal(signal.SIGTERM)
            return _forced_result(proc, out)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    return case


def deleted_mid_run(what):
    def case(tmp):
        proc, _, out = _start(tmp, ranks=2)
        try:
            _iterating(proc, out)
            if what == "output":
                out.unlink()
            else:
                shutil.rmtree(S.client_dir(out))
            rc, stdout, stderr, _ = _ended(proc)
            lines = _our_lines(stderr)
            printed = "output:" in stdout
            return f"exit {rc}, {len(lines)} line(s), " + ("`output:` printed" if printed else "no `output:`")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    return case


def _fedbioacc_run(tmp, ranks=2, seed=None):
    """A finished 2-rank FedBiOAcc run (per-client state: client checkpoint files r0 and r1): its
    config and checkpoint folder (a fresh copy, :func:`_staged`; ``tmp`` is not used)."""

    def make(folder):
        cfg = _cli_config(folder, iterations=6, every=2)
        sets = ["--set", "algorithm.name=fedbioacc"] + (["--set", f"seed={seed}"] if seed is not None else [])
        res = run_cli("run", cfg, "-q", *sets, ranks=ranks)
        assert res.returncode == 0, res.stderr
        return cfg, folder / "out.h5.ckpt"

    return _staged(("fedbioacc", ranks, seed), make)


def damaged_checkpoint(damage):
    """`run --resume` of a FedBiOAcc run after ``damage(checkpoint folder, tmp)``."""

    def case(tmp):
        cfg, folder = _fedbioacc_run(tmp)
        damage(folder, tmp)
        sets = ["--set", "algorithm.name=fedbioacc", "--set", "algorithm.outer_iterations=9"]
        return _one_line_error(run_cli("run", cfg, "-q", "--resume", *sets, ranks=2, timeout=LIMIT))

    return case


def _client(folder, rank):
    return next(folder.glob(f"clients-*-r{rank:05d}.pt"))


def _flip(path):
    _damage(path, "flip", path.stat().st_size // 2)


def _swap(folder, tmp):
    a, b = _client(folder, 0), _client(folder, 1)
    tmp_name = folder / "swap"
    a.rename(tmp_name)
    b.rename(a)
    tmp_name.rename(b)


def _foreign(folder, tmp):
    _, theirs = _fedbioacc_run(tmp, seed=6)
    shutil.copy(_client(theirs, 0), _client(folder, 0))


def _reconfigured(folder, tmp):
    """state.pt rewritten with a config of another shape, its digests made to match."""
    path = folder / "state.pt"
    head, _, payload = path.read_bytes().partition(b"\n")
    record = torch.load(io.BytesIO(payload), weights_only=True)
    record["config_json"] = '{"algorithm": 5, "problem": [1]}'
    record["config_sha256"] = checkpoint.config_digest(record["config_json"])
    buffer = io.BytesIO()
    torch.save(record, buffer)
    payload = buffer.getvalue()
    fmt, version, _ = head.decode().split(" ")
    path.write_bytes(f"{fmt} {version} {checkpoint.digest(payload)}\n".encode() + payload)


def fifo(path):
    path.unlink()
    os.mkfifo(path)


def _fifo_state(folder, tmp):
    (folder / "state.pt").unlink()
    os.mkfifo(folder / "state.pt")


def resume_spelled(tmp):
    """A run with output `out.h5` (relative), resumed as `./out.h5` and as the absolute path."""
    cfg = _cli_config(tmp, iterations=4, every=2)
    env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "OMP_NUM_THREADS": "1"}
    codes = []
    for k, output in ((4, "out.h5"), (6, "./out.h5"), (8, str(tmp / "out.h5"))):
        flags = ["--resume"] if k > 4 else []
        cmd = [sys.executable, "-m", "fednest_mpi", "run", str(cfg), "-q", "-o", output, *flags]
        cmd += ["--set", f"algorithm.outer_iterations={k}"]
        res = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=LIMIT)
        codes.append(f"exit {res.returncode}")
    return ", ".join(codes) + f", {len(read_run(tmp / 'out.h5')[1]['iteration'])} iterations"


def planted_link(tmp):
    """A symbolic link at `RUN.h5.partial` (the old temporary name) pointing at another file of the user's."""
    cfg = _cli_config(tmp, iterations=3, every=1)
    victim = tmp / "thesis.tex"
    victim.write_text("precious")
    (tmp / "out.h5.partial").symlink_to(victim)
    (tmp / "out.h5.ckpt").mkdir()
    (tmp / "out.h5.ckpt" / ".state.pt.tmp").symlink_to(victim)
    res = run_cli("run", cfg, "-q", timeout=LIMIT)
    return f"exit {res.returncode}, the link's target " + (
        "unchanged" if victim.read_text() == "precious" else "CHANGED"
    )


def base_chain(tmp):
    """A `base` chain of 1,500 config files, each setting the seed of its own."""
    for i in range(1500):
        text = f'base = "b{i + 1}.toml"\nseed = {i}\n' if i < 1499 else _cli_config(tmp, iterations=2).read_text()
        (tmp / f"b{i}.toml").write_text(text)
    res = run_cli("run", tmp / "b0.toml", "-q", timeout=LIMIT)
    return f"exit {res.returncode}, seed {read_run(tmp / 'out.h5')[0]['seed']}"


#: (what was tried, the result) -- the table of docs/reliability.md
CASES = [
    ("`run --resume`, output truncated to half its size", resume_after(half), ONE_LINE),
    ("`run --resume`, output truncated to 1,000 bytes", resume_after(lambda p: _damage(p, "truncate", 1000)), ONE_LINE),
    (
        "`run --resume`, 3,000 random bytes written in the middle of the output",
        resume_after(lambda p: _damage(p, "random", p.stat().st_size // 2)),
        ONE_LINE,
    ),
    (
        "`run --resume`, one client file (`RUN.clients/rank00000.h5`) truncated to half",
        resume_after(client_file(half)),
        ONE_LINE,
    ),
    ("`run --resume`, the `RUN.clients/` folder deleted", resume_without_clients, ONE_LINE),
    ("`report` on a run file truncated to half", reader_on("report", half), ONE_LINE),
    ("`plot` on a run file truncated to half", reader_on("plot", half), ONE_LINE),
    (
        "`report` on a run file with zeroed bytes in its attribute heap (HDF5 loops on it)",
        reader_on("report", lambda p: _damage(p, "zero", 4321)),
        ONE_LINE,
    ),
    ("`report` on a SIGKILLed run", report_on_killed, ONE_LINE + ", names `fednest-mpi recover`"),
    (
        "`fednest-mpi recover` on a SIGKILLed run (killed in iteration 8)",
        recover_killed,
        "exit 0, plain HDF5 opens it, 8 iterations kept, all parts in step: True",
    ),
    ("`run --resume` after SIGKILL (takes over the stale lock)", resume_killed, "exit 0, 11 iterations"),
    (
        "a second `run --overwrite` on the output of a running run",
        second_writer(["--overwrite"]),
        ONE_LINE + ", names host, pid, start; first run exit 0",
    ),
    (
        "a second `run` (no `--overwrite`) on the output of a running run",
        second_writer([]),
        ONE_LINE + "; first run exit 0",
    ),
    (
        "a second `run --resume` on the output of a running run",
        second_writer(["--resume"]),
        ONE_LINE + ", names host, pid, start; first run exit 0",
    ),
    (
        "a new `run --overwrite` where a SIGKILLed run left its locks",
        stale_lock,
        "exit 0, takes both stale locks over, none left",
    ),
    (
        "a new `run` (no `--overwrite`) where a SIGKILLed run left its locks, its output removed",
        stale_locks_without_overwrite,
        ONE_LINE + ", one `rm` of both locks",
    ),
    ("exception on rank 1 of 2 in iteration 5", failure_on(1), "exit 1, files closed, rows/clients/ranks: [5]"),
    ("exception on rank 0 of 2 in iteration 5", failure_on(0), "exit 1, files closed, rows/clients/ranks: [5]"),
    ("exception on rank 1 of 2 in iteration 1", failure_on(1, k=1), "exit 1, files closed, rows/clients/ranks: [1]"),
    ("NaN on rank 1 of 2 in iteration 6", failure_on(1, "nan", 6), "exit 1, files closed, rows/clients/ranks: [6]"),
    (
        "a plugin moves x on rank 1 of 2 from iteration 3, `run.check_consistency = 1`",
        rank_dependent_x,
        "exit 1, 1 line(s) naming iteration 3 and rank 1: True, files closed, rows/clients/ranks: [3]",
    ),
    (
        "a plugin calls `os._exit(3)` on rank 1 of 2 in iteration 2, then `report` and `fednest-mpi recover`",
        os_exit_then_recover,
        "exit 3, 0 line(s); `report` names `fednest-mpi recover`: True; `recover`: exit 0, says what it kept: True, "
        "rows/clients/ranks: [2]",
    ),
    ("`seed = 2**64`", bad_input("--set", f"seed={2**64}"), ONE_LINE),
    ("`problem.n_clients = 2**70`", bad_input("--set", f"problem.n_clients={2**70}"), ONE_LINE),
    (
        "`problem.n_clients = 10**11` (client data beyond memory), 2 ranks",
        bad_input("--set", "problem.n_clients=100000000000", ranks=2),
        ONE_LINE,
    ),
    ("`problem.dim_y = 10**6` (client data beyond memory)", bad_input("--set", "problem.dim_y=1000000"), ONE_LINE),
    ("a config file that is not UTF-8", bad_input(text=b"\xff\xfe[problem]\n"), ONE_LINE),
    ("an empty config file", bad_input(text=b""), ONE_LINE),
    ("a folder given as the config", bad_input(text="folder"), ONE_LINE),
    ("output under /proc", bad_input("--output", "/proc/x.h5"), ONE_LINE),
    ("output under /sys", bad_input("--output", "/sys/x.h5"), ONE_LINE),
    ("SIGINT (Ctrl-C) to `mpiexec`, 2 ranks, while they iterate", signalled("mpiexec"), STOPPED),
    ("SIGINT to rank 1 of 2", signalled("rank"), STOPPED),
    ("SIGINT to the whole process group (a terminal's Ctrl-C), 2 ranks", signalled("group"), STOPPED),
    ("SIGINT to a 1-rank run (no `mpiexec`)", signalled("mpiexec", ranks=1), STOPPED),
    (
        "two SIGTERMs to `mpiexec` 0.3 s apart (one request)",
        signalled("mpiexec", signal.SIGTERM, repeat_after=0.3),
        STOPPED,
    ),
    ("SIGUSR1 to `mpiexec` 1 s after the start (during start-up)", early_usr1, STOPPED),
    (
        "rank 1 of 2 stopped (SIGSTOP), then SIGTERM to `mpiexec` (`run.stop_timeout = 4`)",
        stuck_rank("term", sets=["run.stop_timeout=4"]),
        "exit 143, 1 line(s), run file closed, lock released",
    ),
    (
        "rank 1 of 2 stopped, then two SIGTERMs to `mpiexec` 2 s apart",
        stuck_rank("term twice"),
        "exit 143, 1 line(s), run file closed, lock released",
    ),
    (
        "rank 0 of 2 stopped, then two SIGTERMs to `mpiexec` 2 s apart (rank 1 reports)",
        stuck_rank("term twice", which=0),
        "exit 143, 1 line(s), run file left for `recover`",
    ),
    (
        "rank 1 of 2 stopped, no signal, watchdog `run.round_timeout = 3`",
        stuck_rank("nothing", sets=["run.round_timeout=3"]),
        "exit 1, 1 line(s), run file closed, lock released",
    ),
    ("the output file deleted while the run iterates", deleted_mid_run("output"), "exit 1, 1 line(s), no `output:`"),
    (
        "the `RUN.clients/` folder deleted while the run iterates",
        deleted_mid_run("clients"),
        "exit 1, 1 line(s), no `output:`",
    ),
    (
        "`run --resume`, one byte flipped in `state.pt`",
        damaged_checkpoint(lambda f, t: _flip(f / "state.pt")),
        ONE_LINE,
    ),
    (
        "`run --resume`, one byte flipped in a client checkpoint file",
        damaged_checkpoint(lambda f, t: _flip(_client(f, 1))),
        ONE_LINE,
    ),
    ("`run --resume`, the client checkpoint files of ranks 0 and 1 swapped", damaged_checkpoint(_swap), ONE_LINE),
    (
        "`run --resume`, a client checkpoint file copied from another run (seed 6)",
        damaged_checkpoint(_foreign),
        ONE_LINE,
    ),
    (
        "`run --resume`, a client checkpoint file deleted",
        damaged_checkpoint(lambda f, t: _client(f, 0).unlink()),
        ONE_LINE,
    ),
    (
        "`run --resume`, a client checkpoint file truncated to half",
        damaged_checkpoint(lambda f, t: half(_client(f, 1))),
        ONE_LINE,
    ),
    (
        "`run --resume`, `state.pt` holding a config of another shape (digests made to match)",
        damaged_checkpoint(_reconfigured),
        ONE_LINE,
    ),
    ("`run --resume`, a FIFO in place of `state.pt`", damaged_checkpoint(_fifo_state), ONE_LINE),
    ("`run --resume`, a FIFO in place of the output file", resume_after(fifo), ONE_LINE),
    ("`run --resume`, a FIFO in place of `RUN.clients/rank00000.h5`", resume_after(client_file(fifo)), ONE_LINE),
    (
        "`--resume` with the output spelled `./out.h5`, then absolute",
        resume_spelled,
        "exit 0, exit 0, exit 0, 9 iterations",
    ),
    (
        "symbolic links planted at `RUN.h5.partial` and a checkpoint temporary name",
        planted_link,
        "exit 0, the link's target unchanged",
    ),
    ("a `base` chain of 1,500 config files", base_chain, "exit 0, seed 0"),
    ("a JSON config whose top level is a list", bad_input(text=b"[1, 2]", name="bad.json"), ONE_LINE),
    (
        "a JSON config with a key given twice",
        bad_input(text=b'{"problem": {}, "problem": {}, "algorithm": {}}', name="bad.json"),
        ONE_LINE,
    ),
    (
        "a config with arrays nested 3,000 deep",
        bad_input(text=b"[problem]\nx = " + b"[" * 3000 + b"]" * 3000),
        ONE_LINE,
    ),
    (
        "a TOML date as a value (`seed = 1979-05-27`)",
        bad_input(text=b"seed = 1979-05-27\n[problem]\n[algorithm]\n"),
        ONE_LINE,
    ),
    (
        "a TOML time as a value (`problem.n_clients = 07:32:00`)",
        bad_input(text=b"[problem]\nn_clients = 07:32:00\n[algorithm]\n"),
        ONE_LINE,
    ),
    ("a config with only `[problem]`", bad_input(text=b'[problem]\nname = "quadratic"\n'), ONE_LINE),
    (
        '`--output` named with a non-BMP character, quotes and spaces (`🚀 it\'s "a".h5`)',
        output_named('🚀 it\'s "a".h5'.encode()),
        "exit 0, the run file at exactly that path: True",
    ),
    (
        "`--set run.output=` a name with bytes that are no UTF-8 (`a\\xff\\xfe.h5`)",
        output_named(b"a\xff\xfe.h5", "--set"),
        "exit 0, the run file at exactly that path: True",
    ),
    (
        "`--output` a name of 255 bytes (its `.lock`, `.ckpt` and temporary names are longer)",
        output_named(b"n" * 255),
        "exit 2, one line, written: []",
    ),
    (
        "`--set run.output='\"...'` (a quote that opens no TOML string)",
        output_named(b"unterminated.h5", "open quote"),
        "exit 2, one line, written: []",
    ),
    (
        "a symbolic link loop as the config file",
        config_is(lambda p: os.symlink(p.name, p)),
        ONE_LINE + ", says it is a symbolic link loop (following its links leads back to one of them)",
    ),
    (
        "a FIFO as the config file",
        config_is(os.mkfifo),
        ONE_LINE + ", says it is a FIFO (named pipe), which would block the read for ever",
    ),
    (
        "a row of `/iterations` edited (h5py) before the last checkpoint, then `run --resume`",
        resume_after_edit,
        ONE_LINE + ", names row 3, offers --overwrite: True; that rerun: exit 0, 10 rows, row 3 recomputed and the"
        " others the same: True",
    ),
    (
        "an attribute of the run file (`seed`) edited (h5py) before the last checkpoint, then `run --resume`",
        resume_after_attribute_edit,
        ONE_LINE + ", names the attribute 'seed': True, file kept: True",
    ),
    (
        "a value of the per-client series (`RUN.clients/rank00000.h5`) edited before the last checkpoint, then "
        "`run --resume`",
        resume_after_client_edit,
        ONE_LINE + ", names iteration 2: True",
    ),
    (
        "an exception on rank 1 of 2",
        failure_log(),
        "exit 1, 1 line(s) naming the log: True, traceback in the log: True",
    ),
    (
        "an exception in a 1-rank run (no `mpiexec`)",
        failure_log(0, 1),
        "exit 1, 1 line(s) naming the log: True, traceback in the log: True",
    ),
    (
        "`--output` named with `%` (`50%.h5`; HDF5 reads `%b` and `%%` in the client series' source file names)",
        output_named(b"50%.h5"),
        "exit 0, the run file at exactly that path: True",
    ),
    (
        "`--output` in a folder whose name is 300 bytes long",
        output_named(b"d" * 300 + b"/out.h5"),
        "exit 2, one line, written: []",
    ),
    (
        "`--output` a path of more than 4,096 bytes (21 folders of 200 bytes)",
        output_named(b"/".join([b"p" * 200] * 21) + b"/out.h5"),
        "exit 2, one line, written: []",
    ),
    (
        "`--output x.clients` (the run file would be its own client-file folder)",
        output_named(b"x.clients"),
        "exit 2, one line, written: []",
    ),
    (
        "`--set 'algorithm.outer_lr=0.1<newline>seed=7'` (a line break, then more TOML)",
        bad_input("--set", "algorithm.outer_lr=0.1\nseed=7"),
        ONE_LINE,
    ),
    (
        "`run --resume`, the `first_client` attribute of `RUN.clients/rank00000.h5` edited",
        resume_after(edited_client_range),
        ONE_LINE,
    ),
]


def render_table() -> str:
    lines = ["| what was tried | result |", "|---|---|"]
    lines += [f"| {what} | {result} |" for what, _, result in CASES]
    return "\n".join(lines)


def test_the_doc_table_is_the_executed_list():
    text = DOC.read_text()
    assert render_table() in text, "docs/reliability.md must hold this table:\n" + render_table()


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.parametrize("what,case,expected", CASES, ids=[re.sub(r"\W+", "-", c[0])[:60] for c in CASES])
def test_case(tmp_path, what, case, expected):
    t0 = time.monotonic()
    assert case(tmp_path) == expected
    assert time.monotonic() - t0 < LIMIT + 30  # the case's own runs (setup included) end in time


# ----------------------------------------------------------------------------------------------
# property test: many offsets and kinds of damage, read in a subprocess with a time limit

CHECKER = r"""
import json, shutil, sys, time
from pathlib import Path
import numpy as np
from fednest_mpi.errors import UsageError
from fednest_mpi.io import schema as S
from fednest_mpi.io.clients import read_clients, read_ranks
from fednest_mpi.io.h5 import read_run
import random
src, work = Path(sys.argv[1]), Path(sys.argv[2])
ref, ref_c = read_run(src)[1], read_clients(src)
for line in sys.stdin:
    target, kind, offset = json.loads(line)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    dst = work / src.name
    shutil.copy(src, dst)
    shutil.copytree(S.client_dir(src), S.client_dir(dst))
    _damage(dst if target == "run" else S.client_dir(dst) / S.rank_file(0), kind, offset, random.Random(offset))
    t = time.monotonic()
    try:
        data, clients = read_run(dst)[1], read_clients(dst)
        read_ranks(dst)
        same = data.keys() == ref.keys() and all(np.array_equal(data[k], ref[k], equal_nan=True) for k in ref)
        same = same and all(np.array_equal(clients[k], ref_c[k], equal_nan=True) for k in ref_c)
        out = "same" if same else "DIFFERENT"
    except UsageError as exc:
        out = "usage" if "\n" not in str(exc) else "usage on several lines"
    except Exception as exc:
        out = f"{type(exc).__name__}: {exc}"
    print(json.dumps([target, kind, offset, out, time.monotonic() - t]), flush=True)
"""


@pytest.mark.slow
def test_damaged_files_fail_fast_or_read_the_same(tmp_path):
    _, out = _finished_run(tmp_path)
    rnd = random.Random(19)
    cases = []
    for target, path in (("run", out), ("client", S.client_dir(out) / S.rank_file(0))):
        size = path.stat().st_size
        offsets = [0, 8, 12, 44, 48, 200, 1000, size // 2, size - 1] + [rnd.randrange(size) for _ in range(12)]
        cases += [(target, "truncate", o) for o in offsets]
        cases += [(target, kind, rnd.randrange(size)) for kind in ("zero", "random", "flip") for _ in range(12)]
    stdin = "".join(json.dumps(c) + "\n" for c in cases)
    env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "OMP_NUM_THREADS": "1"}
    checker = "from pathlib import Path\nimport random\n" + inspect.getsource(_damage) + CHECKER  # the same damage
    res = subprocess.run(
        [sys.executable, "-c", checker, str(out), str(tmp_path / "work")],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60 + 12 * len(cases),
        env=env,
    )
    results = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(results) == len(cases), res.stderr[-2000:]
    bad = [r for r in results if r[3] not in ("same", "usage") or r[4] > LIMIT / 2]
    assert not bad, bad
    assert any(r[3] == "usage" for r in results) and any(r[2] == 0 or r[3] == "same" for r in results)
