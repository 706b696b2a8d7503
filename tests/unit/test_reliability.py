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

import inspect
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
from test_checkpoint import _cli_config, run_cli

from fednest_mpi.io import schema as S
from fednest_mpi.io.h5 import read_run

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
LIMIT = 30.0  # seconds any case may take (the bound)
ONE_LINE = "exit 2, one line"


def _one_line_error(res) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    if res.returncode == 2 and len(lines) == 1 and lines[0].startswith("fednest-mpi: error:"):
        return ONE_LINE
    return f"exit {res.returncode}, {len(lines)} lines: {res.stderr[-300:]!r}"


def _finished_run(tmp, iterations=6, **kw):
    cfg = _cli_config(tmp, iterations=iterations, every=2)
    res = run_cli("run", cfg, "-q", **kw)
    assert res.returncode == 0, res.stderr
    return cfg, tmp / "out.h5"


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


def resume_without_clients(tmp):
    cfg, out = _finished_run(tmp)
    shutil.rmtree(S.client_dir(out))
    return _one_line_error(
        run_cli("run", cfg, "-q", "--resume", "--set", "algorithm.outer_iterations=9", timeout=LIMIT)
    )


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
]


def render_table() -> str:
    lines = ["| what was tried | result |", "|---|---|"]
    lines += [f"| {what} | {result} |" for what, _, result in CASES]
    return "\n".join(lines)


def test_the_doc_table_is_the_executed_list():
    text = DOC.read_text()
    assert render_table() in text, "docs/reliability.md must hold this table:\n" + render_table()


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
