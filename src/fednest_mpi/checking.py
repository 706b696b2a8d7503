"""``fednest-mpi check CONFIG``: the contract test and the invariance checks of any config, plugins included
(docs/extending.md, "fednest-mpi check").

1. **contract**: the run of the config on one rank for a few iterations, with every check of the plugin
   boundary (:mod:`fednest_mpi.contract`: the probe of the oracles, ``State``, ``step``, ``evaluate``, the
   rounds);
2. **chunks**: the same run with one client per chunk (``run.chunk_clients = 1``): bitwise the same record;
3. **ranks**: the same run on two ranks (``mpiexec -n 2 fednest-mpi run``, a subprocess): bitwise the same.

Each line says ``ok``, ``differs`` (the first column and iteration that differ) or ``not run`` (why: no
``mpiexec``, ``federation.reduction = "sum"``, fewer clients than ranks, the run failed or timed out).
The exit status: :data:`EXIT`. No MPI here (the two-rank run is a subprocess), no argparse.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from fednest_mpi.bitwise import first_difference

#: exit status of ``fednest-mpi check``: every check ran and agreed; a usage error or a broken contract; a
#: check ran and differs; a check could not run (and none differs)
EXIT = {"ok": 0, "usage": 2, "differs": 3, "not run": 4}


def _with(cfg, section: str, **fields):
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **fields)})


def _two_ranks(path: str, overrides: Sequence[str], folder: Path, ranks: int, timeout: float) -> tuple[str, object]:
    """("ok", columns) of the run on ``ranks`` ranks, or ("usage", its line) when it exited 2 (a contract
    broken on some rank), or ("not run", why)."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    found = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if found is None:
        return "not run", "no mpiexec beside the Python interpreter or on PATH"
    output = folder / "ranks.h5"
    command = [found, "-n", str(ranks), sys.executable, "-m", "fednest_mpi", "run", path, "-q", "--output", str(output)]
    for override in (*overrides, f"run.checkpoint_dir={json.dumps(str(folder / 'ckpt'))}"):
        command += ["--set", override]
    env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return "not run", f"the {ranks}-rank run took more than {timeout:g} s (--timeout)"
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if line.startswith("fednest-mpi:")), "")
        verdict = "usage" if done.returncode == EXIT["usage"] else "not run"  # a contract broken on some rank
        return verdict, f"the {ranks}-rank run failed (exit {done.returncode}): {first}"
    from fednest_mpi.io.h5 import read_run

    return "ok", read_run(output)[1]


def check(
    path: str,
    overrides: Sequence[str] = (),
    iterations: int = 3,
    ranks: int = 2,
    timeout: float = 600.0,
    say: Callable[[str], None] = print,
) -> int:
    """Run the three checks of the config at ``path`` (with ``overrides``) for ``iterations`` iterations;
    ``say`` one line per check; return the exit status (:data:`EXIT`). Raises UsageError (a mistake in the
    config, or a plugin's broken contract: exit 2)."""
    from fednest_mpi import config
    from fednest_mpi.comm import SerialComm
    from fednest_mpi.runner import simulate

    overrides = [*overrides, f"algorithm.outer_iterations={iterations}"]
    cfg = config.load(path, overrides)
    cfg = _with(cfg, "run", checkpoint_every=0, client_series=False)
    watch = Watchdog(cfg.run.round_timeout or timeout, cfg.run.idle_timeout)  # a plugin that blocks: exit 2
    base = simulate(cfg, SerialComm(), [watch]).history  # a PluginError: exit 2 with its line
    say(f"contract: ok ({cfg.problem.name} with {cfg.algorithm.name}: every oracle probed, {iterations} iterations)")
    verdicts = []
    invariant = cfg.federation.reduction != "sum"
    why_not = 'federation.reduction = "sum" adds in the order of the ranks and chunks; use "exact" or "ordered"'
    if invariant:
        chunked = simulate(_with(cfg, "run", chunk_clients=1), SerialComm(), [watch]).history
        diff = first_difference(base, chunked)
        verdicts.append("ok" if diff is None else "differs")
        say("chunks: " + ("ok (1 client per chunk: the same bits)" if diff is None else f"differs: {diff}"))
    else:
        verdicts.append("not run")
        say(f"chunks: not run: {why_not}")
    watch.stop()  # the one-rank runs are over (the many-rank run has its own watchdog: run.round_timeout)
    if not invariant:
        verdicts.append("not run")
        say(f"ranks: not run: {why_not}")
    elif cfg.problem.n_clients < ranks:
        verdicts.append("not run")
        say(f"ranks: not run: {cfg.problem.n_clients} clients, fewer than {ranks} ranks")
    else:
        verdicts.append(_ranks_check(path, overrides, ranks, timeout, base, say))
    for verdict in ("usage", "differs", "not run"):
        if verdict in verdicts:
            return EXIT[verdict]
    return EXIT["ok"]


def _ranks_check(path: str, overrides: Sequence[str], ranks: int, timeout: float, base: dict, say) -> str:
    """The run on ``ranks`` ranks against the one-rank record ``base``: its line said, its verdict returned."""
    with tempfile.TemporaryDirectory(prefix="fednest-check-") as folder:
        verdict, got = _two_ranks(path, overrides, Path(folder), ranks, timeout)
    if verdict != "ok":
        say(f"ranks: {'failed' if verdict == 'usage' else verdict}: {got}")
        return verdict
    diff = first_difference(base, got)  # type: ignore[arg-type]
    say(f"ranks: ok (1 and {ranks} ranks: the same bits)" if diff is None else f"ranks: differs: {diff}")
    return "ok" if diff is None else "differs"


class Watchdog:
    """The one-rank runs' watchdog (a callback and a thread): an outer iteration that does not complete within
    ``limit`` seconds (``run.round_timeout``, else ``--timeout``), or a plugin hook that uses no CPU for ``idle``
    seconds (``run.idle_timeout``: :class:`fednest_mpi.stop.IdleLook`), ends ``check`` with one line naming the
    plugin hook the run is in (:func:`fednest_mpi.contract.hook_running`), exit 2. Time the process was stopped
    does not count (:class:`fednest_mpi.stop.RunningClock`)."""

    def __init__(self, limit: float, idle: float = 0.0):
        from fednest_mpi.stop import IdleLook, RunningClock

        self.clock = RunningClock()
        self.idle = IdleLook(idle, self.clock)
        self.limit, self.beat = float(limit), self.clock.now()
        self.done = threading.Event()
        threading.Thread(target=self._watch, name="fednest-check-watch", daemon=True).start()

    def on_start(self, sim, k: int) -> None:
        self.beat = self.clock.now()

    def on_iteration(self, k: int, row: dict) -> None:
        self.beat = self.clock.now()

    def stop(self) -> None:
        self.done.set()

    def _watch(self) -> None:
        from fednest_mpi.contract import hook_running
        from fednest_mpi.stop import WATCH_SECONDS

        while not self.done.wait(WATCH_SECONDS):
            self.clock.tick()
            self.idle.sample()
            where = self.idle.blocked_in(hook_running)
            if where is not None:
                self._fail(
                    f"the one-rank run is in {where} and has used no CPU for {self.idle.seconds:g} s "
                    "(run.idle_timeout: a plugin that blocks)"
                )
            if self.clock.now() - self.beat > self.limit:
                where = hook_running() or "no plugin hook (the run itself)"
                self._fail(
                    f"the one-rank run completed no outer iteration within {self.limit:g} s "
                    f"(run.round_timeout, else --timeout): it is in {where}"
                )

    @staticmethod
    def _fail(message: str) -> None:
        print(f"fednest-mpi: error: {message}", file=sys.stderr, flush=True)
        os._exit(EXIT["usage"])
