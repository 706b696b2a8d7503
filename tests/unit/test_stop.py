"""Stop requests in-process (src/fednest_mpi/stop.py): the first signal asks, a repeat within a
second is the same request, a later one, the stop timeout and the watchdog end the run at once;
and the unique exclusive temporary names of src/fednest_mpi/atomic.py. The same under mpiexec, with
real launchers, stuck ranks and files: the signal rows of tests/unit/test_reliability.py."""

import os
import signal
import threading
import time

import pytest

from fednest_mpi import atomic, stop


class Ended:
    """Records end_now(code, message) calls."""

    def __init__(self):
        self.calls, self.event = [], threading.Event()

    def __call__(self, code, message):
        self.calls.append((code, message))
        self.event.set()


def test_first_signal_asks_a_repeat_is_the_same_request_a_later_one_ends_at_once():
    ended = Ended()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # SIGINT: ignored in an xdist worker
    with stop.StopRequests() as requests:
        requests.arm(ended)
        assert not requests.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)  # the same notice delivered twice
        time.sleep(0.5)
        assert requests.requested and requests.received == "SIGUSR1" and not ended.calls
        time.sleep(stop.SAME_NOTICE_SECONDS)
        requests.beat(7)
        os.kill(os.getpid(), signal.SIGTERM)
        assert ended.event.wait(5)
    assert ended.calls == [(128 + signal.SIGTERM, "stopped at once by a second SIGTERM after iteration 7")]
    assert {s: signal.getsignal(s) for s in before} == before  # the previous handlers are back


def test_sigint_is_a_stop_request_not_a_keyboard_interrupt():
    with stop.StopRequests() as requests:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)
        assert requests.received == "SIGINT"


def test_a_stop_not_reached_within_the_stop_timeout_ends_the_run():
    ended = Ended()
    with stop.StopRequests(stop_timeout=0.5) as requests:
        requests.arm(ended)
        os.kill(os.getpid(), signal.SIGTERM)
        assert ended.event.wait(5)
    ((code, message),) = ended.calls
    assert code == 143 and "run.stop_timeout = 0.5 s" in message


def test_a_reached_stop_is_not_escalated_by_the_timeout():
    ended = Ended()
    with stop.StopRequests(stop_timeout=0.3) as requests:
        requests.arm(ended)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        requests.reached()  # the ranks agreed: the checkpoint may take its time
        assert not ended.event.wait(1.0)


def test_the_watchdog_ends_a_run_whose_iteration_does_not_complete():
    ended = Ended()
    with stop.StopRequests(round_timeout=0.6) as requests:
        requests.arm(ended)  # start-up: no watchdog
        time.sleep(1.0)
        assert not ended.calls
        requests.arm(ended, rounds=True)
        for k in range(4):  # iterations that complete in time
            time.sleep(0.2)
            requests.beat(k)
        assert not ended.calls
        assert ended.event.wait(5)
    ((code, message),) = ended.calls
    assert code == 1 and "run.round_timeout = 0.6 s" in message and "after iteration 3" in message


def test_the_automatic_watchdog_ends_an_iteration_far_longer_than_the_longest_so_far(monkeypatch):
    """run.round_timeout = 0 (the default): AUTO_FIRST_SECONDS for the first iteration (ranks left waiting in
    mismatched collectives end), then round_timeout_factor times the longest completed iteration, at least
    AUTO_MIN_SECONDS; factor 0: none."""
    monkeypatch.setattr(stop, "AUTO_MIN_SECONDS", 0.5)
    ended = Ended()
    with stop.StopRequests(round_timeout=0.0, round_factor=3.0) as requests:
        requests.arm(ended, rounds=True)
        assert requests.limit()[0] == stop.AUTO_FIRST_SECONDS
        time.sleep(0.7)  # the first iteration: longer than the least limit, within AUTO_FIRST_SECONDS
        requests.beat(0)
        assert requests.limit()[0] >= 2.1 and not ended.calls  # 3 x 0.7 s
        time.sleep(1.5)  # a slower iteration, within the limit
        requests.beat(1)
        assert not ended.calls and requests.limit()[0] >= 4.5
        assert ended.event.wait(10)
    ((code, message),) = ended.calls
    assert code == 1 and "automatic watchdog" in message and "run.round_timeout_factor = 3" in message
    assert "after iteration 1" in message
    off = Ended()
    with stop.StopRequests(round_timeout=0.0, round_factor=0.0) as requests:
        requests.arm(off, rounds=True)
        requests.beat(0)
        assert requests.limit() == (0.0, "") and not off.event.wait(1.0)


def test_the_running_clock_leaves_out_the_time_the_process_was_stopped(monkeypatch):
    """A gap between two ticks longer than STOPPED_GAP_SECONDS is a stopped process (SIGSTOP, a suspended job):
    it does not count; ticks at the watch interval do."""
    now = [100.0]
    monkeypatch.setattr(stop.time, "monotonic", lambda: now[0])
    clock = stop.RunningClock()
    for _ in range(10):  # 2 s of ordinary ticks
        now[0] += stop.WATCH_SECONDS
        clock.tick()
    assert clock.now() == pytest.approx(102.0)
    now[0] += 3600.0  # stopped for an hour
    clock.tick()
    assert clock.now() == pytest.approx(102.0 + stop.WATCH_SECONDS)
    now[0] += 1.0  # a slow tick under load (below the gap) counts whole
    clock.tick()
    assert clock.now() == pytest.approx(103.0 + stop.WATCH_SECONDS)


def test_the_watchdog_does_not_count_a_stopped_process(monkeypatch):
    """A whole job stopped for longer than run.round_timeout (and resumed) goes on: only its running time counts."""
    jump = [0.0]
    real = time.monotonic
    monkeypatch.setattr(stop.time, "monotonic", lambda: real() + jump[0])
    ended = Ended()
    with stop.StopRequests(round_timeout=1.0) as requests:
        requests.arm(ended, rounds=True)
        time.sleep(0.5)
        jump[0] = 3600.0  # the clock moves an hour between two ticks: the process was stopped
        assert not ended.event.wait(0.3)
        assert ended.event.wait(5)  # ... and the running time then reaches the limit
    ((code, message),) = ended.calls
    assert code == 1 and "run.round_timeout = 1 s" in message


def test_the_idle_look_tells_a_blocked_process_from_a_computing_one():
    """IdleLook: no CPU over its span is idle; a busy main thread is not; its own (watch) thread's CPU is left
    out; 0 seconds: never idle."""
    clock = stop.RunningClock()
    look = stop.IdleLook(0.6, clock)
    done = threading.Event()

    def watch():
        while not done.wait(0.05):
            clock.tick()
            look.sample()
            sum(i * i for i in range(2000))  # the watch thread's own work does not count

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        time.sleep(1.0)  # blocked: no CPU
        assert look.idle()
        look.reset()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # computing
            sum(i * i for i in range(10000))
        assert not look.idle()
    finally:
        done.set()
        thread.join()
    never = stop.IdleLook(0.0, clock)
    never.sample()
    assert not never.idle()


def test_the_idle_look_ends_a_rank_in_a_plugin_hook_and_spares_one_that_waits_for_the_others():
    ended = Ended()
    where = ["rank 0/1 is in problem 'p' hook grad_x_outer"]
    with stop.StopRequests(idle_timeout=0.6) as requests:
        requests.arm(ended, rounds=True, locate=lambda: where[0])
        requests.beat(2)
        assert ended.event.wait(5)
    ((code, message),) = ended.calls
    assert code == 1 and message.startswith(
        "run failed: rank 0/1 is in problem 'p' hook grad_x_outer and has used no CPU for 0.6 s after iteration 2"
    )
    waiting = Ended()
    with stop.StopRequests(idle_timeout=0.3) as requests:
        requests.arm(waiting, rounds=True, locate=lambda: None)  # in a collective: the others' business
        assert not waiting.event.wait(1.5)


def test_the_automatic_watchdog_gives_a_rank_in_a_plugin_hook_less_time(monkeypatch):
    """From the first completed iteration on, a rank inside a plugin hook (a hook that spins) is ended after
    round_timeout_factor times the longest iteration and at least AUTO_HOOK_MIN_SECONDS, not AUTO_MIN_SECONDS;
    before it (the first iteration), after AUTO_MIN_SECONDS."""
    monkeypatch.setattr(stop, "AUTO_MIN_SECONDS", 30.0)
    monkeypatch.setattr(stop, "AUTO_HOOK_MIN_SECONDS", 0.5)
    hook = "rank 0/1 is in problem 'p' hook grad_x_outer"
    ended = Ended()
    with stop.StopRequests(round_timeout=0.0, round_factor=3.0) as requests:
        requests.arm(ended, rounds=True, locate=lambda: hook)
        assert requests.hook_limit()[0] == 30.0 and not ended.event.wait(1.0)  # the first iteration: 30 s
        requests.beat(0)
        assert requests.hook_limit()[0] == pytest.approx(3.0, rel=0.2)  # 3 x its ~1 s
        assert requests.limit()[0] == 30.0  # a rank not in a hook: AUTO_MIN_SECONDS
        assert ended.event.wait(10)
    ((code, message),) = ended.calls
    assert code == 1 and message.startswith("run failed: no outer iteration completed within the automatic watchdog's")
    assert "for a rank in a plugin hook" in message and f"{hook} after iteration 0" in message


def test_the_first_iteration_ends_ranks_that_wait_longer_than_its_limit(monkeypatch):
    """Ranks that wait in a collective in the first iteration (not in a hook: a collective mismatch) are ended
    after AUTO_FIRST_SECONDS (and the grace), no longer left waiting for ever."""
    monkeypatch.setattr(stop, "AUTO_FIRST_SECONDS", 0.5)
    monkeypatch.setattr(stop, "WAITING_GRACE_SECONDS", 0.2)
    ended = Ended()
    with stop.StopRequests(round_timeout=0.0, round_factor=20.0) as requests:
        requests.arm(ended, rounds=True, locate=lambda: None)
        assert ended.event.wait(5)
    ((code, message),) = ended.calls
    assert code == 1 and message.startswith(
        "run failed: no outer iteration completed within the automatic watchdog's 0.5 s for the first iteration"
    )


def test_nothing_ends_a_disarmed_run():
    ended = Ended()
    with stop.StopRequests(round_timeout=0.2) as requests:
        requests.arm(ended, rounds=True)
        requests.disarm()
        assert not ended.event.wait(0.8)


def test_temporary_names_are_unique_and_never_written_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "out.h5"
    names = {atomic.temp_name(target) for _ in range(100)}
    assert len(names) == 100 and all(n.parent == tmp_path and n.name.startswith(".out.h5.") for n in names)
    atomic.write_bytes(target, b"new")
    assert target.read_bytes() == b"new" and victim.read_text() == "precious"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    link = tmp_path / "link"
    link.symlink_to(victim)
    with pytest.raises(OSError):  # O_EXCL | O_NOFOLLOW: an existing link is never opened
        os.open(link, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW)
