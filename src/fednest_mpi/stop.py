"""How a run ends early: stop signals, their escalation, and the watchdog (docs/reliability.md).

* The **first** SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 asks the run to stop at the next safe point:
  :attr:`StopRequests.requested` becomes true, the runner ORs it over the ranks in its per-iteration
  bookkeeping reduction, and every rank stops after the same iteration with a checkpoint. The same
  signal delivered again within :data:`SAME_NOTICE_SECONDS` (Ctrl-C reaches every process of the
  terminal's group, and ``mpiexec`` forwards it too) is the same request.
* A **second** one later, or a SIGTERM/SIGINT whose stop is not reached within ``run.stop_timeout``
  seconds (a rank that no longer answers: stopped, blocked on I/O), ends the run **at once**: every
  rank closes its files at the iterations they hold (:mod:`fednest_mpi.failure` tells the others),
  rank 0 prints one line, and every rank exits with 128 + the signal's number (130 for SIGINT, 143
  for SIGTERM) by itself, so the launcher prints no "BAD TERMINATION". The last checkpoint stays.
* The **watchdog**: an outer iteration that does not complete within its limit ends the run the same way,
  with exit code 1. The limit is ``run.round_timeout`` seconds when set; else (0, the default) it is
  automatic from the first completed iteration on: ``run.round_timeout_factor`` times the longest iteration so
  far, and at least :data:`AUTO_MIN_SECONDS`, so that a plugin that blocks for ever on one rank cannot hang a
  job (a factor of 0 turns it off); the first iteration :data:`AUTO_FIRST_SECONDS`. A rank inside a plugin hook
  (a hook that spins) gets less: the same factor and at least :data:`AUTO_HOOK_MIN_SECONDS`
  (:meth:`StopRequests.hook_limit`). During the start-up and the first iteration :data:`AUTO_MIN_SECONDS` (or
  ``run.round_timeout``) ends a rank that is inside a plugin hook (its constructor, the probe's oracle calls, the
  first step) after that long; the project's own start-up (data, collectives) is not limited.
* The **idle look** ends a blocked plugin within seconds, where the watchdog needs minutes: a rank whose main
  thread is inside a plugin hook (start-up or iterations) and whose process has used (next to) no CPU for
  ``run.idle_timeout`` seconds (a hook that waits for input, a lock, a message or a child that never comes)
  ends the run the same way, exit 1. A computing hook, however slow, uses CPU; a rank that waits for the
  others in a collective is not in a hook (:func:`fednest_mpi.contract.hook_running`).
* Time while the whole process is stopped (SIGSTOP, ``scontrol suspend``, Ctrl-Z) does not count towards
  either limit: the watch thread notices the gap in its own ticks (:class:`RunningClock`), so a suspended and
  resumed job goes on.

The handlers are installed by the command line before it imports anything heavy or starts MPI
(:func:`install`), and a signal that arrived before the run looked is remembered. Python runs a
signal handler only in the main thread between bytecodes, so a main thread blocked in an MPI
collective (waiting for a stuck rank) would never see a second signal: :func:`signal.set_wakeup_fd`
makes the C-level handler also write the signal's number to a pipe, which a thread here reads.
No MPI and no HDF5 here.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Callable

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
SAME_NOTICE_SECONDS = 1.0  # a repeat within this time is the same request (group delivery and forwarding)
#: how much longer than run.round_timeout the watchdog of a rank that waits for the others (not in a plugin
#: hook) gives the rank that is stuck in one to end the run with the line that names the hook
WAITING_GRACE_SECONDS = 2.0
WATCH_SECONDS = 0.2  # how often the deadlines are looked at
#: the automatic watchdog's least limit (run.round_timeout = 0): a slow file system or a long evaluation in one
#: iteration must not end a run whose iterations are short
AUTO_MIN_SECONDS = 600.0
#: the automatic watchdog's limit on the first iteration (nothing is known of its length yet): long enough for the
#: first iteration of a large run, short enough that ranks left waiting in mismatched collectives do not wait for ever
AUTO_FIRST_SECONDS = 3600.0
#: the automatic watchdog's least limit for a rank inside a plugin hook, from the first completed iteration on
#: (a hook that spins; the project's own I/O keeps AUTO_MIN_SECONDS)
AUTO_HOOK_MIN_SECONDS = 60.0
#: a gap between two ticks of the watch thread longer than this is time the process was stopped (SIGSTOP)
STOPPED_GAP_SECONDS = 2.0
#: the idle look: a rank in a plugin hook that used less than this share of one core over run.idle_timeout is
#: blocked (a blocked thread uses none; a rank at nice 19 beside two busy processes on its core still gets ~0.7 %)
IDLE_CPU_SHARE = 0.001

#: end_now(exit_code, message): close the files and exit (the session's, while it has files open)
EndNow = Callable[[int, str], None]


class _Process:
    """The signals this process received (process-wide, as signal dispositions are)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.first: str | None = None  # name of the first stop signal
        self.first_signum = 0
        self.first_at = 0.0  # time.monotonic() when it arrived
        self.escalation: int = 0  # signal number of a second signal, 0: none yet
        self.wake = threading.Event()  # set on every signal
        self.installed_by: object = None  # who installed the handlers: "cli" (for good) or a StopRequests
        self.previous: dict = {}
        self.pipe: tuple[int, int] | None = None

    def note(self, signum: int) -> None:
        now = time.monotonic()
        with self.lock:
            if self.first is None:
                self.first, self.first_signum, self.first_at = signal.Signals(signum).name, signum, now
            elif now - self.first_at >= SAME_NOTICE_SECONDS and not self.escalation:
                self.escalation = signum
        self.wake.set()


_P = _Process()


def _python_handler(signum, frame) -> None:
    """The Python-level handler: the C-level one already wrote ``signum`` to the wakeup pipe."""


def _reader(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum in {int(s) for s in SIGNALS}:
                _P.note(signum)


def install(owner: object = "cli") -> bool:
    """Install the stop-signal handlers (main thread only); False when they already are."""
    if _P.installed_by is not None or threading.current_thread() is not threading.main_thread():
        return False
    read, write = os.pipe()
    os.set_blocking(write, False)
    _P.previous = {s: signal.signal(s, _python_handler) for s in SIGNALS}
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    _P.pipe = (read, write)
    _P.installed_by = owner
    threading.Thread(target=_reader, args=(read,), name="fednest-signals", daemon=True).start()
    return True


def ignore_from_now() -> None:
    """The run is over and its files are closed: stop signals are ignored while the process exits.
    (The interpreter's teardown puts the default action back for every signal with a Python handler,
    so a signal during MPI's finalisation would kill the rank, and the launcher report exit 15.)"""
    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        signal.set_wakeup_fd(-1)


def _uninstall() -> None:
    signal.set_wakeup_fd(-1)
    for s, handler in _P.previous.items():
        signal.signal(s, handler)
    if _P.pipe is not None:
        os.close(_P.pipe[1])  # the reader sees the end of the pipe and returns
    _P.installed_by, _P.pipe, _P.previous = None, None, {}


def _reset() -> None:
    """Forget the signals received (a new in-process run)."""
    with _P.lock:
        _P.first, _P.first_signum, _P.first_at, _P.escalation = None, 0, 0.0, 0


class RunningClock:
    """Seconds of :func:`time.monotonic` less the time this process was stopped (SIGSTOP, a suspended SLURM
    job): :meth:`tick`, called by a watch thread every :data:`WATCH_SECONDS`, counts a gap between two ticks
    longer than :data:`STOPPED_GAP_SECONDS` as stopped. Time the process ran (also in C code that releases the
    GIL) counts; the watch thread's own gaps under load are far below the gap."""

    def __init__(self):
        self._stopped = 0.0
        self._last = time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last > STOPPED_GAP_SECONDS:
            self._stopped += now - self._last - WATCH_SECONDS
        self._last = now

    def now(self) -> float:
        return time.monotonic() - self._stopped


class IdleLook:
    """Whether this process has used (next to) no CPU for ``seconds`` of :class:`RunningClock` time:
    :meth:`sample` from the watch thread at each tick (its own CPU left out). 0 seconds: never."""

    def __init__(self, seconds: float, clock: RunningClock):
        self.seconds, self.clock = float(seconds), clock
        self._samples: collections.deque[tuple[float, float]] = collections.deque()
        self._forget = False  # set by reset() (any thread); the watch thread clears the samples

    def sample(self) -> None:
        """One sample (the watch thread, each tick); samples older than ``seconds`` before the last one go."""
        if self.seconds <= 0:
            return
        if self._forget:
            self._forget = False
            self._samples.clear()
        now = self.clock.now()
        self._samples.append((now, time.process_time() - time.thread_time()))
        while len(self._samples) > 1 and now - self._samples[1][0] >= self.seconds:
            self._samples.popleft()

    def idle(self) -> bool:
        """True when the samples span ``seconds`` and the CPU used over them is below :data:`IDLE_CPU_SHARE`."""
        if not self._samples:
            return False
        (then, cpu_then), (now, cpu) = self._samples[0], self._samples[-1]
        return now - then >= self.seconds and cpu - cpu_then < IDLE_CPU_SHARE * (now - then)

    def reset(self) -> None:
        """Start afresh (a new phase, or the rank was found not in a hook)."""
        self._forget = True

    def blocked_in(self, locate: Callable[[], str | None]) -> str | None:
        """Where the process sits blocked: ``locate()`` (the plugin hook its main thread runs) once the process
        has been :meth:`idle`, else None; idle outside a hook (waiting for other ranks, the project's own I/O) is
        the watchdog's business, and the look starts afresh."""
        if not self.idle():
            return None
        where = locate()
        if where is None:
            self.reset()
        return where


class StopRequests:
    """The stop requests of one run: :attr:`requested` and :attr:`received` for the runner, the
    escalation and the watchdog for the session. A context manager: it installs the handlers unless
    the command line did (and then restores the previous ones on exit).

    ``stop_timeout``: seconds after a SIGTERM/SIGINT within which the ranks must reach the stop (0:
    no limit); ``round_timeout``: seconds an outer iteration may take (0: the automatic limit, ``round_factor``
    times the longest completed iteration and at least :data:`AUTO_MIN_SECONDS`; both 0: no watchdog);
    ``idle_timeout``: seconds a rank may sit in a plugin hook using no CPU (0: no idle look). :meth:`arm` gives
    the function that ends the run at once; :meth:`beat` marks a completed iteration.
    """

    def __init__(
        self,
        stop_timeout: float = 0.0,
        round_timeout: float = 0.0,
        round_factor: float = 0.0,
        idle_timeout: float = 0.0,
    ):
        self.stop_timeout, self.round_timeout = float(stop_timeout), float(round_timeout)
        self.round_factor = float(round_factor)
        self._clock = RunningClock()
        self._idle = IdleLook(idle_timeout, self._clock)
        self._longest: float | None = None  # the longest completed iteration so far (seconds)
        self._end_now: EndNow | None = None
        self._locate: Callable[[], str | None] | None = None
        self._last_beat = self._clock.now()
        self._iteration: int | None = None
        self._reached = False
        self._rounds = False  # whether the watchdog runs (from the first iteration on, not during start-up)
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def received(self) -> str | None:
        return _P.first

    @property
    def requested(self) -> bool:
        return _P.first is not None

    def __enter__(self) -> StopRequests:
        if install(self) and _P.installed_by is self:  # (else the command line's, or none off the main thread)
            _reset()
        self._thread = threading.Thread(target=self._watch, name="fednest-stop-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.disarm()
        self._done.set()
        _P.wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if _P.installed_by is self:
            _uninstall()

    def arm(self, end_now: EndNow, rounds: bool = False, locate: Callable[[], str | None] | None = None) -> None:
        """From now on a second signal, the stop timeout or the watchdog calls ``end_now(code, message)``: with
        ``rounds`` (the iterations start now) on an iteration over its limit, else (the start-up) on a start-up
        over the limit while ``locate()`` names a plugin hook (a constructor or the probe's oracle calls that
        block). ``locate()``: where this rank is stuck (the plugin hook it runs, e.g. ``rank 1/2 is in problem 'p'
        hook grad_x_outer``), or None when it waits for the others (or runs the project's own code)."""
        self._last_beat = self._clock.now()
        self._idle.reset()
        self._rounds = rounds
        self._end_now = end_now
        self._locate = locate

    def disarm(self) -> None:
        """The run's files are closed (or it reached its stop): nothing ends it at once any more."""
        self._end_now = None

    def reached(self) -> None:
        """The ranks agreed to stop (the stop timeout no longer applies; a second signal still does)."""
        self._reached = True

    def beat(self, k: int) -> None:
        """Iteration ``k`` was recorded (the watchdog's clock starts again)."""
        now = self._clock.now()
        self._longest = max(self._longest or 0.0, now - self._last_beat)
        self._iteration, self._last_beat = k, now

    def limit(self) -> tuple[float, str]:
        """The watchdog's limit on the iteration now running, in seconds (0: none yet), and its name for
        the message."""
        if self.round_timeout > 0:
            return self.round_timeout, f"run.round_timeout = {self.round_timeout:g} s"
        if self.round_factor > 0 and self._longest is not None:
            seconds = max(AUTO_MIN_SECONDS, self.round_factor * self._longest)
            return seconds, (
                f"the automatic watchdog's {seconds:.0f} s (run.round_timeout_factor = {self.round_factor:g} times "
                f"the longest iteration so far, at least {AUTO_MIN_SECONDS:g} s; set run.round_timeout to choose)"
            )
        if self.round_factor > 0 and not self._rounds:
            return AUTO_MIN_SECONDS, (
                f"the automatic watchdog's {AUTO_MIN_SECONDS:.0f} s (no iteration yet; set run.round_timeout to choose)"
            )
        if self.round_factor > 0:  # the first iteration: ranks that wait in a collective for ever (a mismatch)
            return AUTO_FIRST_SECONDS, (
                f"the automatic watchdog's {AUTO_FIRST_SECONDS:g} s for the first iteration (set run.round_timeout "
                "to choose)"
            )
        return 0.0, ""

    def hook_limit(self) -> tuple[float, str]:
        """The limit for a rank whose main thread is inside a plugin hook (a hook that spins, or blocks while
        using CPU) and its name: :meth:`limit`, except that the automatic one is shorter from the first
        completed iteration on, ``round_timeout_factor`` times the longest iteration and at least
        :data:`AUTO_HOOK_MIN_SECONDS` (a hook call that long is not a slow one), and :data:`AUTO_MIN_SECONDS`
        during the start-up and the first iteration (nothing is known of their length)."""
        if self.round_timeout > 0 or self.round_factor <= 0:
            return self.limit()
        if self._longest is None:
            return AUTO_MIN_SECONDS, (
                f"the automatic watchdog's {AUTO_MIN_SECONDS:.0f} s (no iteration yet; set run.round_timeout to choose)"
            )
        seconds = max(AUTO_HOOK_MIN_SECONDS, self.round_factor * self._longest)
        return seconds, (
            f"the automatic watchdog's {seconds:.0f} s for a rank in a plugin hook (run.round_timeout_factor = "
            f"{self.round_factor:g} times the longest iteration so far, at least {AUTO_HOOK_MIN_SECONDS:g} s; set "
            "run.round_timeout to choose)"
        )

    def _watch(self) -> None:
        while not self._done.is_set():
            _P.wake.wait(WATCH_SECONDS)
            _P.wake.clear()
            self._clock.tick()
            self._idle.sample()
            reason = self._reason()
            end_now = self._end_now
            if reason is not None and end_now is not None:
                self._end_now = None
                end_now(*reason)
                return

    def _reason(self) -> tuple[int, str] | None:
        """(exit code, message) when the run must end at once, else None."""
        now, after = self._clock.now(), self._where()
        if _P.escalation:
            name = signal.Signals(_P.escalation).name
            return 128 + _P.escalation, f"stopped at once by a second {name} {after}"
        first = _P.first_signum
        if first in (signal.SIGTERM, signal.SIGINT) and self.stop_timeout > 0 and not self._reached:
            if time.monotonic() - _P.first_at > self.stop_timeout:
                return 128 + first, (
                    f"stopped at once: the ranks did not reach a safe point within run.stop_timeout = "
                    f"{self.stop_timeout:g} s of the {_P.first} (a rank stopped, blocked on I/O, or an iteration "
                    f"longer than that) {after}"
                )
        idle = self._idle_reason(after)
        if idle is not None:
            return idle
        elapsed = now - self._last_beat
        hook_seconds, hook_limit = self.hook_limit()
        if hook_seconds > 0 and elapsed > hook_seconds and self._locate is not None:
            stuck = self._locate()  # only a rank inside a plugin hook; the others wait for it (below)
            if stuck is not None and not self._rounds:
                return 1, (
                    f"run failed: the start-up did not finish within {hook_limit}: {stuck} (a plugin that blocks, "
                    "or raise run.round_timeout)"
                )
            if stuck is not None:
                return 1, (
                    f"run failed: no outer iteration completed within {hook_limit}: "
                    f"{stuck} {after} (a plugin that blocks, or raise run.round_timeout)"
                )
        seconds, limit = self.limit()
        if self._rounds and seconds > 0 and elapsed > seconds + WAITING_GRACE_SECONDS:
            return 1, (
                f"run failed: no outer iteration completed within {limit} "
                f"(a rank stopped or blocked on I/O, or raise run.round_timeout) {after}"
            )
        return None

    def _idle_reason(self, after: str) -> tuple[int, str] | None:
        """The idle look's (exit code, message): this rank sits in a plugin hook and used no CPU for
        ``idle_timeout`` seconds."""
        stuck = None if self._locate is None else self._idle.blocked_in(self._locate)
        if stuck is None:
            return None
        phase = "during the start-up" if not self._rounds else after
        return 1, (
            f"run failed: {stuck} and has used no CPU for {self._idle.seconds:g} s {phase} (a plugin that blocks: "
            f"it waits for input, a lock or a message that never comes; run.idle_timeout = 0 turns this look off, "
            f"e.g. for a hook that waits on a download)"
        )

    def _where(self) -> str:
        if self._iteration is None:
            return "before iteration 0 completed"
        return f"after iteration {self._iteration}"
