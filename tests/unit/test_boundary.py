"""The plugin boundary (fednest_mpi.contract, docs/extending.md "Checked at the boundary"): each broken
contract of tests/plugins/faulty_plugins.py ends the run with its one line (exit 2), and a fault of any kind
on one rank ends every rank within seconds naming the rank and the hook."""

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from small_configs import make_config

from fednest_mpi import config
from fednest_mpi.api import PluginError, RunFailed, SerialComm, Simulation, UsageError, simulate
from fednest_mpi.errors import ConfigError
from fednest_mpi.session import Session

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
PROBLEM = "problem 'faulty_plugins:FaultyQuadratic'"
ALGORITHM = "algorithm 'faulty_plugins:FaultyFedNest'"


@pytest.fixture(autouse=True)
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    yield
    for name in [n for n in config.PROBLEMS if ":" in n] + [n for n in config.ALGORITHMS if ":" in n]:
        config.PROBLEMS.pop(name, None)
        config.ALGORITHMS.pop(name, None)


def faulty(problem_fault="", algorithm_fault="", **run):
    return make_config(
        problem={"name": "faulty_plugins:FaultyQuadratic", "fault": problem_fault},
        algorithm={"name": "faulty_plugins:FaultyFedNest", "fault": algorithm_fault},
        **({"run": run} if run else {}),
    )


def test_the_faultless_plugins_run():
    h = simulate(faulty(), SerialComm()).history
    assert h["x_error"][-1] < h["x_error"][0]


WRONG_SHAPE = f"{PROBLEM} hook grad_x_outer: expected a torch.float64 tensor of shape (2, 4) on cpu, got a "


@pytest.mark.parametrize(
    "problem_fault, algorithm_fault, message",
    [
        ("shape", "", WRONG_SHAPE + "torch.float64 tensor of shape (4,) on cpu"),
        ("float32", "", WRONG_SHAPE + "torch.float32 tensor of shape (2, 4) on cpu"),
        (
            "numpy",
            "",
            WRONG_SHAPE + "numpy float64 array of shape (2, 4) (a torch tensor is needed: torch.as_tensor)",
        ),
        (
            "negative_dim",
            "",
            f"{PROBLEM} hook __init__: expected the attribute dim_x (an int >= 1) set by the constructor, got int -4",
        ),
        (
            "bool_clients",
            "",
            f"{PROBLEM} hook __init__: expected the attribute n_clients (an int >= 1) set by the constructor, got "
            "bool True",
        ),
        (
            "metric_names",
            "",
            f"{PROBLEM} hook metric_info: expected a dict name -> (description, units[, higher_is_better]), got list "
            "['outer_objective', 'outer_loss', 'inner_loss', 'x_error', 'y_error', 'hypergradient_norm']",
        ),
        (
            "nan",
            "",
            f"{PROBLEM} hook grad_x_outer: expected finite values at finite x and y, got 8 NaN/Inf of 8 in the rows "
            "of clients 0, 1",
        ),
        (
            "requires_grad",
            "",
            WRONG_SHAPE + "torch.float64 tensor of shape (2, 4) on cpu that requires grad (return it detached: "
            ".detach())",
        ),
        (
            "mutate_x",
            "",
            f"{PROBLEM} hook grad_x_outer: expected its arguments x, y and v left as they were, got a shared row "
            "(stride 0) written in place; compute into new tensors (x + 1, not x.add_(1))",
        ),
        (
            "tensor_metric",
            "",
            f"{PROBLEM} hook evaluate: expected a float for the metric 'x_error', got a torch.float64 tensor of shape "
            "() on cpu; return float(value)",
        ),
        (
            "",
            "new_field",
            f"{ALGORITHM} hook step: expected only the fields State declares in self.state (checkpoints save only "
            "those), got also the attribute 'seen'; declare it as a field of a State dataclass (docs/extending.md)",
        ),
        (
            "no_super_init",
            "",
            f"{PROBLEM} hook __init__: expected the constructor to call super().__init__() (the oracle counters of "
            "BilevelProblem), got an instance without them; call it first",
        ),
        (
            "",
            "no_super_init",
            f"{ALGORITHM} hook __init__: expected the constructor to call super().__init__(cfg, problem, fed, seed, "
            "...), got an instance without fed; call it first",
        ),
        (
            "",
            "tensor_diagnostic",
            f"{ALGORITHM} hook step: expected a float for the diagnostic 'hypergradient_estimate_norm', got a "
            "torch.float32 tensor of shape (2,) on cpu; return float(value)",
        ),
        (
            "",
            "tuple_x",
            f"{ALGORITHM} hook step: expected a torch.float64 tensor of shape (4,) on cpu, got a tuple of 1 (a "
            "torch.float64 tensor of shape (4,) on cpu)",
        ),
        (
            "",
            "rounds_negative",
            f"{ALGORITHM} hook rounds_per_iteration: expected the number of counted aggregations of one iteration (an "
            "int >= 0), got int -1",
        ),
        (
            "",
            "rounds_none",
            f"{ALGORITHM} hook rounds_per_iteration: expected the number of counted aggregations of one iteration (an "
            "int >= 0), got NoneType None",
        ),
        (
            "metric",
            "",
            f"{PROBLEM} hook evaluate: expected the metrics metric_info declares (outer_objective, outer_loss, "
            "inner_loss, x_error, y_error, hypergradient_norm), got also 'surprise'; declare them in metric_info "
            "or drop them",
        ),
        (
            "shape_late",
            "",
            f"{PROBLEM} hook grad_x_outer: expected a torch.float64 tensor of shape (6, 4) on cpu, got a "
            "torch.float64 tensor of shape (4,) on cpu",
        ),
        (
            "",
            "int_state",
            f"{ALGORITHM} hook __init__: expected the State field 'steps' to be a tensor, None or a ClientStore "
            "(checkpoints save only those), got int 0; hold it as a tensor",
        ),
        (
            "",
            "rounds",
            f"{ALGORITHM} hook rounds_per_iteration: expected at most the 3 rounds it declares, got 9 counted "
            "aggregations in iteration 1; return the number of mean_over calls of one step",
        ),
        (
            "",
            "x_shape",
            f"{ALGORITHM} hook step: expected a torch.float64 tensor of shape (4,) on cpu, got a torch.float64 "
            "tensor of shape (3,) on cpu",
        ),
        (  # with a server optimiser the run would go on, without it (x_k - x_{k+1} = 0): exit 0, a wrong result
            "",
            "x_in_place",
            f"{ALGORITHM} hook step: expected its arguments x and y left as they were (the server optimiser compares "
            "x_k with the x it returns), got x written in place; return new tensors (x - lr * h, not x.sub_(lr * h))",
        ),
        (
            "",
            "not_a_tuple",
            f"{ALGORITHM} hook step: expected a tuple (x, y, diagnostics), got a torch.float64 tensor of shape (4,) "
            "on cpu",
        ),
    ],
)
def test_a_broken_contract_is_one_line_naming_the_plugin_and_the_hook(problem_fault, algorithm_fault, message):
    with pytest.raises(PluginError) as caught:
        simulate(faulty(problem_fault, algorithm_fault), SerialComm())
    assert str(caught.value) == message


@pytest.mark.parametrize("fault, what", [("close_stdout", "closed"), ("replace_stdout", "replaced")])
def test_a_constructor_that_closes_or_replaces_sys_stdout_is_refused(monkeypatch, fault, what):
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # the plugin's to close or replace; put back after the test
    with pytest.raises(PluginError) as caught:
        simulate(faulty(fault), SerialComm())
    assert str(caught.value) == (
        f"{PROBLEM} hook __init__: expected sys.stdout left as it was (the run prints its lines there), got it {what}; "
        "redirect it only around your own code (contextlib.redirect_stdout)"
    )


def test_a_constructor_that_changes_the_working_directory_is_refused_and_it_is_put_back(tmp_path, monkeypatch):
    # the run's relative paths (its output, checkpoints and locks) would be opened, and released, elsewhere
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(PluginError) as caught:
        simulate(faulty("chdir"), SerialComm())
    assert str(caught.value) == (
        f"{PROBLEM} hook __init__: expected the working directory left as it was (the run's relative paths start "
        f"there: run.output, its checkpoints and locks), got it changed to {str(tmp_path)!r}; open your files by "
        "absolute paths instead of os.chdir"
    )
    assert Path.cwd() == tmp_path / "run"


def test_a_constructor_that_takes_a_stop_signal_is_refused():
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(PluginError) as caught:
            simulate(faulty("ignore_sigint"), SerialComm())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert str(caught.value) == (
        f"{PROBLEM} hook __init__: expected the handlers of SIGTERM, SIGINT and SIGUSR1 left as they were (the run's "
        "stop requests: checkpoint and stop), got SIGINT set to SIG_IGN; leave them to the run"
    )


def test_a_nan_of_one_client_after_the_probe_names_the_oracle_and_the_client():
    """After the probe a NaN/Inf at finite arguments may be the oracle's or an overflow of growing iterates (an
    exp of a diverging x): the NaN/Inf line names the oracle, its clients and the arguments' largest entry."""
    with pytest.raises(FloatingPointError) as caught:
        simulate(faulty("nan_last_client"), SerialComm())
    assert re.fullmatch(
        r"iteration 1: the iterates or metrics became NaN/Inf on rank 0 \(diverged\); lower the step sizes; the "
        f"first NaN/Inf came from {re.escape(PROBLEM)} hook grad_x_outer at finite arguments "
        r"\(largest \|entry\| 0\.\d+\) in the rows of client (\d+): that oracle returns NaN/Inf there, or the "
        "iterates grew until it overflows",
        str(caught.value),
    ), str(caught.value)


def test_past_its_budget_of_values_an_oracle_is_not_looked_at_for_nan_any_more(monkeypatch):
    """The NaN/Inf look is a pass over the output: each oracle's first CHECKED_VALUES values (here none after the
    probe's, which are looked at by the probe itself), so at 1,000 clients it costs a call or two, not every call
    of the first iterations; the run still stops at the NaN/Inf, without naming the oracle."""
    from fednest_mpi.problems import base

    monkeypatch.setattr(base, "CHECKED_VALUES", 0)
    with pytest.raises(FloatingPointError) as caught:
        simulate(faulty("nan_last_client"), SerialComm())
    assert str(caught.value) == (
        "iteration 1: the iterates or metrics became NaN/Inf on rank 0 (diverged); lower the step sizes"
    ), str(caught.value)


def test_a_nan_metric_at_finite_iterates_names_evaluate(tmp_path):
    cfg = faulty("nan_metric", output=str(tmp_path / "o.h5"), checkpoint_dir=str(tmp_path / "ckpt"))
    with pytest.raises(RunFailed) as caught:
        Session(cfg, SerialComm()).run_to_file()
    assert re.match(
        f"run failed: FloatingPointError: iteration 1: the metrics of {re.escape(PROBLEM)} hook evaluate became "
        r"NaN/Inf at finite x and y \(largest \|entry\| 0\.\d+\) on rank 0: evaluate returns NaN/Inf there, or the "
        "iterates diverged until it overflows",
        str(caught.value),
    ), str(caught.value)


class Raising:
    def on_iteration(self, k, row):
        if k == 2:
            raise ValueError("made on purpose")


def test_a_callback_that_raises_is_named(tmp_path):
    cfg = make_config(run={"output": str(tmp_path / "o.h5"), "checkpoint_dir": str(tmp_path / "ckpt")})
    with pytest.raises(RunFailed) as caught:
        Session(cfg, SerialComm(), callbacks=[Raising()]).run_to_file()
    assert str(caught.value) == (
        "rank 0/1: run failed after iteration 2: ValueError: made on purpose (raised in callback "
        "'test_boundary:Raising' hook on_iteration)"
    )


def test_the_watchdog_tells_a_hook_that_blocks_from_a_rank_that_waits():
    from fednest_mpi.contract import hook_running

    cfg = faulty("sleep")
    sim = Simulation(cfg, SerialComm())
    blocked = threading.Thread(target=sim.run, daemon=True)  # the oracle blocks in iteration 1
    blocked.start()
    expected, deadline = f"{PROBLEM} hook grad_x_outer", time.monotonic() + 30
    while hook_running(blocked) != expected and time.monotonic() < deadline:  # (it passes evaluate and others)
        time.sleep(0.05)
    assert hook_running(blocked) == expected
    assert hook_running(threading.current_thread()) is None  # this test is no hook


def test_randomness_from_a_global_generator_is_refused():
    with pytest.raises(PluginError) as caught:
        simulate(faulty("random"), SerialComm())
    text = str(caught.value)
    assert text.startswith(f"{PROBLEM} hook grad_x_outer: expected the same values from the same call (clients, x, y")
    assert text.endswith("draw randomness only from sample.key / rng.key (never torch's or numpy's global generators)")


def test_a_problem_that_writes_into_the_x0_it_returned_does_not_move_the_iterates():
    # the run starts from copies of initial_point's tensors (was: x moved with the problem's buffer, silently)
    assert (
        simulate(faulty("keep_x0"), SerialComm()).history["x_error"]
        == simulate(faulty(), SerialComm()).history["x_error"]
    )


def test_the_probe_leaves_the_oracle_counts_alone():
    h = simulate(faulty(), SerialComm()).history
    plain = simulate(make_config(), SerialComm()).history
    for name in ("oracle_grad_x_outer", "oracle_hvp_yy_inner", "x_error"):
        assert h[name] == plain[name], name


@pytest.mark.parametrize(
    "fault, kind",
    [
        ("system_exit", "SystemExit: 3"),
        ("keyboard_interrupt", "KeyboardInterrupt"),
        ("unprintable", "Unprintable: <str() of it raised RuntimeError>"),  # its __str__ raises: still one line
        ("stop_iteration", "RuntimeError: generator raised StopIteration"),  # named by its cause's frames
    ],
)
def test_a_base_exception_in_a_hook_fails_the_run_naming_the_hook(tmp_path, fault, kind):
    cfg = faulty(fault, output=str(tmp_path / "o.h5"), checkpoint_dir=str(tmp_path / "ckpt"))
    with pytest.raises(RunFailed) as caught:
        Session(cfg, SerialComm()).run_to_file()
    assert str(caught.value) == (
        f"rank 0/1: run failed after iteration 0: {kind} (raised in {PROBLEM} hook grad_x_outer)"
    )


def test_a_missing_oracle_is_refused_when_the_config_is_read():
    with pytest.raises(ConfigError) as caught:
        config.from_dict({"problem": {"name": "tiny_plugins:NoOracle"}})
    assert str(caught.value) == (
        "problem.name: 'tiny_plugins:NoOracle': class NoOracle does not define grad_y_inner, hvp_yy_inner; define "
        "them (docs/extending.md: the contract of a problem)"
    )


@pytest.mark.parametrize(
    "cls, why",
    [
        (
            "TextDefault",
            "field 'scale' has the default '1.0', which the field refuses (expected a number, got '1.0'); "
            "give it a default of its type (float) and range",
        ),
        (
            "LowDefault",
            "field 'width' has the default 0, which the field refuses (must be >= 1, got 0); give it a "
            "default of its type (int) and range",
        ),
    ],
)
def test_a_default_that_its_own_field_refuses_is_named_when_the_config_is_read(cls, why):
    # a config that does not set the field would hand the default to the plugin unchecked
    with pytest.raises(ConfigError) as caught:
        config.from_dict({"problem": {"name": f"faulty_plugins:{cls}"}})
    assert str(caught.value) == f"problem 'faulty_plugins:{cls}': its parameter class '{cls}Params': {why}"


def test_public_and_underscored_oracle_names_give_the_same_run():
    # FaultyQuadratic defines grad_x_outer under its public name; the built-in under _grad_x_outer
    assert (
        simulate(faulty(), SerialComm()).history["x_error"] == simulate(make_config(), SerialComm()).history["x_error"]
    )


def test_an_oracle_of_a_subclass_may_call_super_under_its_public_name():
    # SubclassedQuadratic.grad_x_outer -> super(): FaultyQuadratic's -> super(): QuadraticProblem._grad_x_outer
    sub = simulate(make_config(problem={"name": "faulty_plugins:SubclassedQuadratic"}), SerialComm()).history
    plain = simulate(make_config(), SerialComm()).history
    for name in ("x_error", "oracle_grad_x_outer", "oracle_grad_y_inner"):
        assert sub[name] == plain[name], name


def _env(**more) -> dict:
    """The environment of a run in a process of its own: the plugins' folder before the caller's PYTHONPATH (which
    may name the checkout's src/), one OpenMP thread."""
    path = os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **more}


def _mpiexec(cfg: Path, *args, ranks=2, timeout=120):
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec), "-n", str(ranks), sys.executable, "-m", "fednest_mpi", "run", str(cfg), *map(str, args)]
    env = _env(MPI4PY_RC_THREAD_LEVEL="single")
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return done, time.monotonic() - start


CONFIG = """seed = 3
[problem]
name = "faulty_plugins:FaultyQuadratic"
n_clients = 12
dim_x = 4
dim_y = 6
fault_rank = 1
[algorithm]
outer_iterations = 5
clients_per_round = 6
"""


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.parametrize(
    "fault, code, line",
    [
        (
            "system_exit",
            1,
            f"fednest-mpi: rank 1/2: run failed after iteration 0: SystemExit: 3 (raised in {PROBLEM} hook "
            "grad_x_outer)",
        ),
        (
            "keyboard_interrupt",
            1,
            f"fednest-mpi: rank 1/2: run failed after iteration 0: KeyboardInterrupt (raised in {PROBLEM} hook "
            "grad_x_outer)",
        ),
        (  # an exception whose __str__ raises: the rank's line still comes (the other rank waited for it)
            "unprintable",
            1,
            "fednest-mpi: rank 1/2: run failed after iteration 0: Unprintable: <str() of it raised RuntimeError> "
            f"(raised in {PROBLEM} hook grad_x_outer)",
        ),
        (
            "shape_late",
            2,
            f"fednest-mpi: rank 1/2: {PROBLEM} hook grad_x_outer: expected a torch.float64 tensor of shape (2, 4) on "
            "cpu, got a torch.float64 tensor of shape (4,) on cpu",
        ),
        ("shape", 2, f"fednest-mpi: error: rank 1/2: {WRONG_SHAPE}torch.float64 tensor of shape (4,) on cpu"),
        (  # rank 0 alone reads metric_info for the run file: every rank checks it
            "metric_names",
            2,
            f"fednest-mpi: error: rank 1/2: {PROBLEM} hook metric_info: expected a dict name -> (description, "
            "units[, higher_is_better]), got list ['outer_objective', 'outer_loss', 'inner_loss', 'x_error', "
            "'y_error', 'hypergradient_norm']",
        ),
    ],
)
def test_a_fault_on_one_rank_ends_every_rank_within_seconds_naming_rank_and_hook(tmp_path, fault, code, line):
    cfg = tmp_path / "f.toml"
    cfg.write_text(CONFIG)
    done, seconds = _mpiexec(cfg, "--output", tmp_path / "o.h5", "--set", f"problem.fault={fault}", "-q")
    assert done.returncode == code, done.stderr
    first = done.stderr.splitlines()[0]
    assert first == line or first.startswith(line + " (traceback: "), done.stderr  # a raise: its per-rank log
    assert seconds < 60, seconds  # no hang: the job ended (start-up of two ranks included)


def test_an_mpi_error_during_the_run_is_one_short_line_with_what_it_means():
    """Ranks whose collectives no longer match (one rank's step aggregates once more) fail in MPI with MPICH's error
    stack, dozens of lines, as the exception's text: the rank's line keeps its first words and says what it means
    (the stack goes to the traceback log). Under mpiexec MPICH's own fatal handler may print it first, or alone."""
    from mpi4py import MPI

    from fednest_mpi.session import failure_line

    try:
        raise MPI.Exception(MPI.ERR_TRUNCATE)
    except MPI.Exception as exc:
        line = failure_line(exc, 1, 2, 0)
    assert line == (
        "rank 1/2: run failed after iteration 0: MPI error: Message truncated (the ranks called different "
        "collectives: plugin code that aggregates (mean_over, evaluation_sum) a different number of times on "
        "different ranks, or calls MPI itself)"
    )


IDLE_HINT = (
    "(a plugin that blocks: it waits for input, a lock or a message that never comes; run.idle_timeout = 0 turns "
    "this look off, e.g. for a hook that waits on a download)"
)


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.parametrize(
    ("fault", "limit", "line", "whole"),
    [
        (  # an oracle that blocks in an iteration: the line goes on with what was closed
            "sleep",
            "run.round_timeout=3",
            "fednest-mpi: run failed: no outer iteration completed within run.round_timeout = 3 s: rank 1/2 is in "
            f"{PROBLEM} hook grad_x_outer after iteration 0 (a plugin that blocks, or raise run.round_timeout)",
            False,
        ),
        (  # a constructor that blocks the start-up
            "sleep_in_init",
            "run.round_timeout=3",
            "fednest-mpi: run failed: the start-up did not finish within run.round_timeout = 3 s: rank 1/2 is in "
            f"{PROBLEM} hook __init__ (a plugin that blocks, or raise run.round_timeout)",
            True,
        ),
        (  # the same two with the automatic watchdog (600 s): the idle look ends them, the hook uses no CPU
            "sleep",
            "run.idle_timeout=3",
            f"fednest-mpi: run failed: rank 1/2 is in {PROBLEM} hook grad_x_outer and has used no CPU for 3 s after "
            f"iteration 0 {IDLE_HINT}",
            False,
        ),
        (
            "sleep_in_init",
            "run.idle_timeout=3",
            f"fednest-mpi: run failed: rank 1/2 is in {PROBLEM} hook __init__ and has used no CPU for 3 s during "
            f"the start-up {IDLE_HINT}",
            True,
        ),
    ],
)
def test_the_watchdog_names_the_rank_and_the_hook_that_blocks(tmp_path, fault, limit, line, whole):
    cfg = tmp_path / "f.toml"
    cfg.write_text(CONFIG)
    sets = ("--set", f"problem.fault={fault}", "--set", limit, "-q")
    done, seconds = _mpiexec(cfg, "--output", tmp_path / "o.h5", *sets)
    assert done.returncode == 1, done.stderr
    first = done.stderr.splitlines()[0]
    assert first == line if whole else first.startswith(line), done.stderr
    assert seconds < 60, seconds


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_thread_a_plugin_leaves_running_does_not_keep_the_job(tmp_path, ranks):
    # the run completes; the interpreter would then wait for the thread for ever (the job never ends)
    cfg = tmp_path / "f.toml"
    cfg.write_text(CONFIG)
    sets = ("--set", "problem.fault=thread", "--set", f"problem.fault_rank={ranks - 1}", "-q")
    done, seconds = _mpiexec(cfg, "--output", tmp_path / "o.h5", *sets, ranks=ranks)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"fednest-mpi: warning: rank {ranks - 1}/{ranks}: the run is over, yet 1 thread(s) started by plugin code "
        "still run: 'plugin-thread' (threading.Event.wait); not waiting for them (start such a thread with "
        "daemon=True, or end it before the hook returns)"
    ]
    assert (tmp_path / "o.h5").is_file() and seconds < 60, seconds


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_recover_names_the_hook_of_a_c_level_abort_on_one_rank(tmp_path):
    cfg = tmp_path / "f.toml"
    cfg.write_text(CONFIG)
    done, seconds = _mpiexec(cfg, "--output", tmp_path / "o.h5", "--set", "problem.fault=abort", "-q")
    assert done.returncode != 0 and seconds < 60, (done.returncode, seconds)
    assert done.stderr.splitlines()[0] == (  # at once, from the signal's handler (then MPICH's own lines)
        f"fednest-mpi: rank 1/2: run failed: killed by SIGABRT (an abort) in {PROBLEM} hook grad_x_outer (its "
        f"Python stack: {tmp_path / 'o.h5.failed' / 'fatal-rank00001.log'}; fednest-mpi recover {tmp_path / 'o.h5'} "
        "names the function)"
    ), done.stderr
    recovered = subprocess.run(
        [sys.executable, "-m", "fednest_mpi", "recover", str(tmp_path / "o.h5")], capture_output=True, text=True
    )
    assert recovered.returncode == 0, recovered.stderr
    assert re.search(
        r"; rank 1 died of a fatal signal \(Fatal Python error: Aborted\) in File \".*faulty_plugins\.py\", "
        r"line \d+ in grad_x_outer \(.*o\.h5\.failed/fatal-rank00001\.log\)$",
        recovered.stdout.strip(),
    ), recovered.stdout


def test_a_run_that_ends_well_leaves_no_fatal_log(tmp_path):
    # a process of its own: faulthandler is pytest's in this one (the log is kept only where nobody enabled it)
    cfg = tmp_path / "f.toml"
    cfg.write_text(CONFIG)
    env = _env()
    env.pop("PYTHONFAULTHANDLER", None)
    cmd = [sys.executable, "-m", "fednest_mpi", "run", str(cfg), "--output", str(tmp_path / "o.h5"), "-q"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "o.h5").is_file() and not (tmp_path / "o.h5.failed").exists()


def test_usage_error_is_the_base_of_plugin_error():
    assert issubclass(PluginError, UsageError) and PluginError.agreed is False


def _check(tmp_path, *args):
    cfg = tmp_path / "f.toml"
    cfg.write_text(CONFIG)
    env = _env(MPI4PY_RC_THREAD_LEVEL="single")
    cmd = [sys.executable, "-m", "fednest_mpi", "check", str(cfg), "--iterations", "2", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.slow
def test_check_passes_a_sound_plugin_at_one_and_two_ranks_and_one_client_per_chunk(tmp_path):
    done = _check(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "contract: ok (faulty_plugins:FaultyQuadratic with fednest: every oracle probed, 2 iterations)",
        "chunks: ok (1 client per chunk: the same bits)",
        "ranks: ok (1 and 2 ranks: the same bits)",
    ]


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.slow
def test_check_names_the_first_difference_and_exits_3(tmp_path):
    done = _check(tmp_path, "--set", 'problem.fault="block"', "--set", "problem.fault_rank=-1")
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("chunks: differs: hypergradient_estimate_norm at iteration 1 (1.39447702824")
    assert lines[2].startswith("ranks: differs: hypergradient_estimate_norm at iteration 1 (1.39447702824")


@pytest.mark.parametrize(
    ("limit", "line"),
    [
        (
            "run.round_timeout=2",
            "fednest-mpi: error: the one-rank run completed no outer iteration within 2 s (run.round_timeout, else "
            f"--timeout): it is in {PROBLEM} hook grad_x_outer",
        ),
        (
            "run.idle_timeout=2",
            f"fednest-mpi: error: the one-rank run is in {PROBLEM} hook grad_x_outer and has used no CPU for 2 s "
            "(run.idle_timeout: a plugin that blocks)",
        ),
    ],
)
def test_check_of_a_plugin_that_blocks_ends_naming_the_hook(tmp_path, limit, line):
    # the one-rank run blocks in iteration 1: check's watchdog (or its idle look) ends it before any mpiexec starts
    sets = ("--set", 'problem.fault="sleep"', "--set", "problem.fault_rank=-1", "--set", limit)
    done = _check(tmp_path, *sets)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [line]


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_check_says_not_run_apart_from_differs_and_exits_4(tmp_path):
    done = _check(tmp_path, "--set", 'federation.reduction="sum"')
    assert done.returncode == 4, done.stderr
    why = 'federation.reduction = "sum" adds in the order of the ranks and chunks; use "exact" or "ordered"'
    assert done.stdout.splitlines()[1:] == [f"chunks: not run: {why}", f"ranks: not run: {why}"]


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_check_of_a_contract_broken_on_rank_1_only_exits_2_naming_the_hook(tmp_path):
    done = _check(tmp_path, "--set", 'problem.fault="random"')
    assert done.returncode == 2, done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith(
        f"ranks: failed: the 2-rank run failed (exit 2): fednest-mpi: error: rank 1/2: {PROBLEM} hook grad_x_outer: "
        "expected the same values from the same call"
    )


@pytest.mark.processes  # starts mpiexec: make test-processes
def test_check_of_a_contract_broken_everywhere_is_one_line_exit_2(tmp_path):
    done = _check(tmp_path, "--set", 'problem.fault="float32"', "--set", "problem.fault_rank=-1")
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.splitlines() == [f"fednest-mpi: error: {WRONG_SHAPE}torch.float32 tensor of shape (2, 4) on cpu"]


def test_a_random_draw_inside_a_loss_is_named_not_left_to_vmap():
    cfg = make_config(problem={"name": "faulty_plugins:RandomLoss"})
    with pytest.raises(PluginError) as caught:
        simulate(cfg, SerialComm())
    assert str(caught.value) == (
        "problem 'faulty_plugins:RandomLoss' hook grad_x_outer: expected no random draws inside a loss (it is "
        "vmapped over clients), got a call of torch's global generator; draw from the batch's keys (sample.key, "
        "rng.key) instead"
    )


def test_without_a_c_compiler_there_is_no_fatal_line_and_the_run_goes_on(tmp_path):
    """The fatal-signal line is compiled on first use (native.build); with no compiler the library is None (one
    log line says so), no handler is installed and the hooks' bookkeeping does nothing."""
    script = (
        "import sys; from fednest_mpi import failure, native; "
        "assert native.build(failure.Path(failure.__file__).with_name('fatal_line.c'), ('-shared',), 't') is None; "
        "log = failure.FatalLog(sys.argv[1], 0, 1); assert failure._FATAL_LINE is None; "
        "failure.hook_entered('h'); assert not failure._HOOKS; failure.hook_left(); log.close(); print('ok')"
    )
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    cmd = [sys.executable, "-c", script, str(tmp_path / "o.h5")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
