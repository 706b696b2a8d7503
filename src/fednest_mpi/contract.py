"""The plugin boundary: what a run checks of the code it calls -- a problem's oracles, an algorithm's
``step`` and ``State`` -- and how a fault in that code is named (docs/extending.md, "Checked at the
boundary").

* :func:`probe_problem`, at construction on every rank before any collective: each oracle once on
  (at most) two hosted clients at the initial point, twice with the same ``Sample``: its output must be
  a ``(B, d)`` tensor of the run's dtype on the run's device, finite, and the same both times (a draw
  from torch's or numpy's global generator gives other values: results would depend on ranks and
  chunks); once more on copies of its arguments, which it must leave as they were. The counts of the
  probe are not kept.
* :func:`check_state`, at construction: an algorithm's ``State`` holds only its declared fields, each a
  tensor, None or a ``ClientStore`` (what checkpoints save); :func:`check_declared_rounds`: its
  ``rounds_per_iteration`` is an int >= 0.
* :func:`check_step` / :func:`check_metrics` / :func:`check_rounds`, after each iteration (a few
  comparisons): the (x, y, diagnostics) ``step`` returns, the metrics ``evaluate`` returns against
  ``metric_info``, the counted rounds against ``rounds_per_iteration``.
* :func:`check_oracle_output` and :func:`check_finite_output` in the first ``problems.base.CHECKED_CALLS``
  counted calls of each oracle (``BilevelProblem.grad_x_outer`` and the others): shape, dtype, device, no
  autograd graph, finite where the arguments are.
* :func:`hook_of`: the plugin, callback and hook an exception (any ``BaseException``) came from, read from its
  traceback (no cost until something is raised); :func:`hook_running`: the hook a thread runs now (the
  watchdog's line).

Each violation is a :class:`PluginError`: one line naming the plugin, the hook, what was expected and
what came. No MPI and no HDF5 here.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import signal
import sys
import threading
import types
from collections import Counter

import numpy as np
import torch

from fednest_mpi.errors import UsageError

#: the hooks of a problem the runner and the algorithms call (an underscore: the implementation of the
#: counted public oracle of that name)
PROBLEM_HOOKS = frozenset(
    {
        "grad_x_outer",
        "grad_y_outer",
        "grad_y_inner",
        "hvp_yy_inner",
        "jvp_xy_inner",
        "local_sgd",
        "initial_point",
        "evaluate",
        "metric_info",
        "inner_value",
        "outer_value",
        "correct_counts",
        "outer_statistics",
        "outer_linearised",
        "outer_fixed",
        "inner_loss",
        "outer_loss",
        "client_batch",
        "client_bytes",
        "y_side_bytes",
        "__init__",
    }
)
ALGORITHM_HOOKS = frozenset({"step", "checkpoint_state", "client_states", "restore", "__init__"})


class PluginError(UsageError):
    """A plugin broke its contract (docs/extending.md): the message names the plugin, the hook, what was
    expected and what came. Exit 2; ``agreed``: raised on every rank (after an agreement), else on this
    rank alone, inside a step (the session then ends the job)."""

    agreed = False


def plugin_of(obj) -> str:
    """``problem 'name' (module:Class)`` / ``algorithm 'name' (module:Class)`` of a problem or algorithm."""
    from fednest_mpi.algorithms.base import Algorithm

    kind = "algorithm" if isinstance(obj, Algorithm) else "problem"
    cls = type(obj)
    target = f"{cls.__module__}:{cls.__qualname__}"
    name = getattr(getattr(obj, "cfg", None), "name", None)
    return f"{kind} {target!r}" if name in (None, target) else f"{kind} {name!r} ({target})"


def hook_of(exc: BaseException) -> str | None:
    """``problem 'name' (module:Class) hook H`` for the innermost problem or algorithm hook (``H`` without
    its implementation's underscore) in ``exc``'s traceback, else ``callback 'module:Class' hook H`` for a
    callback's method (:data:`fednest_mpi.callbacks.POINTS`), or None when it came from elsewhere. The traceback
    goes on into ``exc.__cause__``'s (``raise ... from``): a ``StopIteration`` that a plugin raised under a
    generator of the project arrives as the generator's ``RuntimeError``, whose cause holds the plugin's frames."""
    frames: list[types.FrameType] = []
    cause: BaseException | None = exc
    while cause is not None and len(frames) < 10_000:  # (a cycle of causes made by hand ends too)
        tb = cause.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        cause = cause.__cause__
    return _hook_in(frames)[0]


def hook_running(thread: threading.Thread | None = None) -> str | None:
    """The plugin hook that ``thread`` (default: the main thread) is running now, as :func:`hook_of` names it, or
    None, also when the hook waits in a collective of :data:`WAITING_IN` (the watchdog: where a rank that no
    longer answers stands)."""
    thread = thread or threading.main_thread()
    frame = sys._current_frames().get(thread.ident or -1)
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    found, at = _hook_in(frames)
    if found is None or any(f.f_globals.get("__name__") in WAITING_IN for f in frames[at + 1 :]):
        return None
    return found


#: the modules whose calls wait for the other ranks (the collectives, package docstring)
WAITING_IN = frozenset({"fednest_mpi.federation", "fednest_mpi.comm", "fednest_mpi.checkpoint"})


def _hook_in(frames) -> tuple[str | None, int]:
    """The innermost plugin hook of a stack (``frames``, outermost first) and its place in it."""
    from fednest_mpi.algorithms.base import Algorithm
    from fednest_mpi.callbacks import POINTS
    from fednest_mpi.problems.base import BilevelProblem

    found: str | None = None
    at = -1
    for i, frame in enumerate(frames):
        owner = frame.f_locals.get("self")
        name = frame.f_code.co_name
        public = name[1:] if name.startswith("_") and not name.startswith("__") else name
        if isinstance(owner, BilevelProblem) and public in PROBLEM_HOOKS:
            found, at = f"{plugin_of(owner)} hook {public}", i
        elif isinstance(owner, Algorithm) and public in ALGORITHM_HOOKS:
            found, at = f"{plugin_of(owner)} hook {public}", i
        elif owner is not None and name in POINTS and not found:
            cls = type(owner)
            found, at = f"callback '{cls.__module__}:{cls.__qualname__}' hook {name}", i
    return found, at


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        grad = " that requires grad (return it detached: .detach())" if value.requires_grad else ""
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}{grad}"
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
        parts = ", ".join(_describe(v) for v in value[:3]) + (", ..." if len(value) > 3 else "")
        return f"a {type(value).__name__} of {len(value)} ({parts})"
    if isinstance(value, np.ndarray):  # not its values: one line (return torch.as_tensor(a, dtype=..., device=...))
        return f"a numpy {value.dtype} array of shape {value.shape} (a torch tensor is needed: torch.as_tensor)"
    return " ".join(f"{type(value).__name__} {value!r}".split())[:120]  # one line


def _is_like(value, shape: tuple[int, ...], like: torch.Tensor) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and tuple(value.shape) == shape
        and value.dtype == like.dtype
        and value.device == like.device
        and not value.requires_grad
    )


def check_tensor(plugin: str, hook: str, value, shape: tuple[int, ...], like: torch.Tensor) -> None:
    """``value`` must be a tensor of ``shape`` with ``like``'s dtype and device, not requiring grad (an autograd
    graph kept across rounds grows the memory, and the aggregation cannot read it)."""
    if not _is_like(value, shape, like):
        raise PluginError(
            f"{plugin} hook {hook}: expected a {like.dtype} tensor of shape {shape} on {like.device}, "
            f"got {_describe(value)}"
        )


def check_oracle_output(problem, hook: str, value, rows: int, like: torch.Tensor) -> None:
    """A counted oracle's output: ``(B, d)`` rows of ``like``'s dtype on its device (``d``: dim_x for the
    x-side oracles, dim_y for the others)."""
    width = problem.dim_x if hook in ("grad_x_outer", "jvp_xy_inner") else problem.dim_y
    check_tensor(plugin_of(problem), hook, value, (rows, width), like)


def all_finite(value: torch.Tensor) -> bool:
    """Whether every entry of ``value`` is finite, by one sum: a NaN or an Inf anywhere makes the sum NaN or Inf
    (IEEE), so a finite sum proves it; only a sum that is not finite (a NaN/Inf, or finite entries whose sum
    overflows) is looked at entry by entry. ``torch.isfinite(value).all()`` costs 10-20 times the sum (temporary
    boolean tensors; 1.8 s against 0.12 s for 1,000 x 178,110 float64 on one Xeon core)."""
    if not value.is_floating_point() or value.numel() == 0:
        return True
    return bool(torch.isfinite(value.sum())) or bool(torch.isfinite(value).all())


def _nonfinite_rows(value: torch.Tensor, clients, inputs) -> tuple[str, str] | None:
    """(count, clients) of ``value``'s NaN/Inf when its ``inputs`` (x, y and v) are finite, else None (one
    :func:`all_finite` of the output; the inputs are looked at only when it fails)."""
    if all_finite(value):
        return None
    if not all(all_finite(t) for t in inputs if isinstance(t, torch.Tensor)):
        return None  # the iterates diverged: the runner's health check names the iteration
    bad = (~torch.isfinite(value)).reshape(value.shape[0], -1).any(1).cpu().numpy()
    ids = np.asarray(clients)[bad[: len(clients)]]
    listed = ", ".join(map(str, ids[:5].tolist())) + (", ..." if ids.size > 5 else "")
    who = f"client{'s' if ids.size > 1 else ''} {listed}"
    return f"{int((~torch.isfinite(value)).sum())} NaN/Inf of {value.numel()}", who


def check_finite_output(problem, hook: str, value: torch.Tensor, clients, inputs) -> None:
    """At the initial point (:func:`probe_problem`) an oracle's output is finite where its ``inputs`` are: a NaN
    or Inf there is the oracle's (it cannot be a divergence of the iterates)."""
    bad = _nonfinite_rows(value, clients, inputs)
    if bad is not None:
        raise PluginError(
            f"{plugin_of(problem)} hook {hook}: expected finite values at finite x and y, got {bad[0]} in the rows "
            f"of {bad[1]}"
        )


def note_nonfinite_output(problem, hook: str, value: torch.Tensor, clients, inputs) -> None:
    """During the run, the first oracle output with NaN/Inf at finite arguments is noted on ``problem``
    (``nonfinite_note``), not raised: it is the oracle's, or an overflow of iterates that grew (an ``exp`` of a
    diverging x); the runner's NaN/Inf line then names it (:meth:`fednest_mpi.runner` health check)."""
    if getattr(problem, "nonfinite_note", None) is not None:
        return
    bad = _nonfinite_rows(value, clients, inputs)
    if bad is not None:
        largest = max(float(t.abs().max()) for t in inputs if isinstance(t, torch.Tensor) and t.numel())
        problem.nonfinite_note = (
            f"the first NaN/Inf came from {plugin_of(problem)} hook {hook} at finite arguments (largest |entry| "
            f"{largest:.3g}) in the rows of {bad[1]}: that oracle returns NaN/Inf there, or the iterates grew until "
            "it overflows"
        )


def probe_problem(problem, hosted: range, dtype: torch.dtype, key: int) -> None:
    """Call each oracle on at most two hosted clients at the initial point, twice with ``Sample(key, 0)``,
    and check the initial point and the outputs (module docstring); the oracle counts are left as they
    were. Raises :class:`PluginError`."""
    from fednest_mpi.problems.base import Sample, shared_rows

    plugin = plugin_of(problem)
    _check_constructed(problem, plugin)
    _check_metric_info(plugin, problem.metric_info())
    point = problem.initial_point()
    if not (isinstance(point, tuple) and len(point) == 2):
        raise PluginError(f"{plugin} hook initial_point: expected a tuple (x0, y0), got {_describe(point)}")
    x0, y0 = point
    like = torch.empty(0, dtype=dtype, device=x0.device if isinstance(x0, torch.Tensor) else "cpu")
    check_tensor(plugin, "initial_point", x0, (problem.dim_x,), like)
    check_tensor(plugin, "initial_point", y0, (problem.dim_y,), like)
    ids = np.arange(hosted.start, min(hosted.stop, hosted.start + 2), dtype=np.int64)
    if not ids.size:
        return
    counts = Counter(problem.oracle_counts)
    X, Y, V = shared_rows(x0, ids.size), shared_rows(y0, ids.size), shared_rows(torch.ones_like(y0), ids.size)
    try:
        _probe_oracles(problem, plugin, ids, X, Y, V, Sample(int(key), 0))
    finally:
        problem.oracle_counts = counts


def _check_constructed(problem, plugin: str) -> None:
    """The constructor called ``BilevelProblem.__init__`` and set ``dim_x``, ``dim_y`` and ``n_clients``, each an
    int >= 1 (a bool is no size)."""
    if not hasattr(problem, "unchecked_calls"):
        raise PluginError(
            f"{plugin} hook __init__: expected the constructor to call super().__init__() (the oracle counters of "
            "BilevelProblem), got an instance without them; call it first"
        )
    for attr in ("dim_x", "dim_y", "n_clients"):
        value = getattr(problem, attr, None)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise PluginError(
                f"{plugin} hook __init__: expected the attribute {attr} (an int >= 1) set by the constructor, "
                f"got {_describe(value)}"
            )


def _check_metric_info(plugin: str, info) -> None:
    """``metric_info()`` is a dict name -> (description, units) or (description, units, higher_is_better): the
    columns of the run file (checked on every rank: rank 0 alone reads it for the file)."""
    expected = f"{plugin} hook metric_info: expected a dict name -> (description, units[, higher_is_better])"
    if not isinstance(info, dict):
        raise PluginError(f"{expected}, got {_describe(info)}")
    for name, entry in info.items():
        if not (
            isinstance(name, str)
            and isinstance(entry, tuple)
            and len(entry) in (2, 3)
            and all(isinstance(part, str) for part in entry[:2])
            and (len(entry) == 2 or isinstance(entry[2], bool))
        ):
            raise PluginError(f"{expected}, got the entry {_describe(name)}: {_describe(entry)}")


def _probe_oracles(problem, plugin: str, ids: np.ndarray, X, Y, V, sample) -> None:
    """Each oracle called twice on the clients ``ids`` at (X, Y) (V: the vector of the Hessian products): finite
    values, the same both times, no draw from torch's global generator inside a vmapped loss."""
    from fednest_mpi.problems.base import ORACLES

    try:
        for hook in ORACLES:
            args = (ids, X, Y, V, sample) if hook in ("hvp_yy_inner", "jvp_xy_inner") else (ids, X, Y, sample)
            first = getattr(problem, hook)(*args)  # shape, dtype, device: BilevelProblem._oracle
            check_finite_output(problem, hook, first, ids, args[1:-1])
            _probe_arguments_kept(problem, plugin, hook, args)
            again = getattr(problem, hook)(*args)
            if not torch.equal(first, again):
                raise PluginError(
                    f"{plugin} hook {hook}: expected the same values from the same call (clients, x, y, sample), "
                    f"got values differing by up to {float((first - again).abs().max()):.3g}; draw randomness "
                    "only from sample.key / rng.key (never torch's or numpy's global generators)"
                )
    except RuntimeError as exc:
        if "written-to tensor refers to a single memory location" in str(exc):
            raise _changed(plugin, hook, "a shared row (stride 0)") from exc
        if "randomness" not in str(exc):
            raise
        raise PluginError(
            f"{plugin} hook {hook}: expected no random draws inside a loss (it is vmapped over clients), got "
            "a call of torch's global generator; draw from the batch's keys (sample.key, rng.key) instead"
        ) from exc


def _changed(plugin: str, hook: str, what: str) -> PluginError:
    return PluginError(
        f"{plugin} hook {hook}: expected its arguments x, y and v left as they were, got {what} written in place; "
        "compute into new tensors (x + 1, not x.add_(1))"
    )


def _probe_arguments_kept(problem, plugin: str, hook: str, args) -> None:
    """``hook`` called once more on dense copies of its tensor arguments (rows of their own, as in FedOut's local
    steps) must leave them as they were: an oracle that writes into x or y changes the algorithm's iterates."""
    dense = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    getattr(problem, hook)(*dense)
    for name, before, after in zip(("x", "y", "v"), args[1:], dense[1:]):
        if isinstance(before, torch.Tensor) and not torch.equal(before, after):
            raise _changed(plugin, hook, name)


def surroundings() -> tuple:
    """What a plugin's constructor must leave as it finds it (:func:`check_surroundings`): ``sys.stdout``,
    ``sys.stderr``, the working directory and the handlers of the stop signals (SIGTERM, SIGINT, SIGUSR1)."""
    from fednest_mpi.stop import SIGNALS

    return sys.stdout, sys.stderr, os.getcwd(), *(signal.getsignal(s) for s in SIGNALS)


def check_surroundings(plugin_object, before: tuple) -> None:
    """The constructor of ``plugin_object`` left what :func:`surroundings` found as it was: the run prints its
    lines on ``sys.stdout`` and ``sys.stderr`` (its last one, ``output: ...``, after every file is written), opens
    its relative paths (``run.output``, the checkpoints, the locks) from the working directory, and a stop signal
    is the run's request to checkpoint and stop (an ignored SIGINT: Ctrl-C would do nothing). What was changed is
    put back before the :class:`PluginError` is raised (so that its line is printed and the locks released)."""
    broken = _changed_surroundings(before, surroundings())
    if broken is not None:
        _put_back(before)
        raise PluginError(f"{plugin_of(plugin_object)} hook __init__: {broken}")


def _changed_surroundings(before: tuple, now: tuple) -> str | None:
    from fednest_mpi.stop import SIGNALS

    for name, was, is_ in zip(("stdout", "stderr"), before, now):
        what = "replaced" if is_ is not was else "closed" if getattr(is_, "closed", False) else ""
        if what:
            return (
                f"expected sys.{name} left as it was (the run prints its lines there), got it {what}; redirect it "
                f"only around your own code (contextlib.redirect_{name})"
            )
    if now[2] != before[2]:
        return (
            "expected the working directory left as it was (the run's relative paths start there: run.output, its "
            f"checkpoints and locks), got it changed to {now[2]!r}; open your files by absolute paths instead of "
            "os.chdir"
        )
    for number, was, is_ in zip(SIGNALS, before[3:], now[3:]):
        if is_ is not was:
            return (
                "expected the handlers of SIGTERM, SIGINT and SIGUSR1 left as they were (the run's stop requests: "
                f"checkpoint and stop), got {signal.Signals(number).name} {_handler(is_)}; leave them to the run"
            )
    return None


def _put_back(before: tuple) -> None:
    from fednest_mpi.stop import SIGNALS

    sys.stdout, sys.stderr = before[0], before[1]
    os.chdir(before[2])
    if threading.current_thread() is threading.main_thread():  # (signal.signal works there only)
        for number, handler in zip(SIGNALS, before[3:]):
            if handler is not None:
                signal.signal(number, handler)


def _handler(handler) -> str:
    if isinstance(handler, signal.Handlers):
        return f"set to {handler.name}"
    return f"handled by {getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', '?')}"


def check_state(algorithm, hook: str = "__init__") -> None:
    """``algorithm.state`` holds only its declared fields, each a tensor, None or a ``ClientStore`` (what
    checkpoints save); ``hook``: where it was changed last (``__init__``, ``step``)."""
    from fednest_mpi.algorithms.base import ClientStore, State

    if not hasattr(algorithm, "fed"):
        raise PluginError(
            f"{plugin_of(algorithm)} hook __init__: expected the constructor to call super().__init__(cfg, problem, "
            "fed, seed, ...), got an instance without fed; call it first"
        )
    state = getattr(algorithm, "state", None)
    if not isinstance(state, State):
        raise PluginError(
            f"{plugin_of(algorithm)} hook {hook}: expected self.state to be a fednest_mpi.api.State, "
            f"got {_describe(state)}"
        )
    fields = dataclasses.fields(state)
    undeclared = sorted(set(getattr(state, "__dict__", ())) - {f.name for f in fields})
    if undeclared:
        cls = type(state).__qualname__
        raise PluginError(
            f"{plugin_of(algorithm)} hook {hook}: expected only the fields {cls} declares in self.state "
            f"(checkpoints save only those), got also the attribute {', '.join(map(repr, undeclared))}; declare it "
            f"as a field of a State dataclass (docs/extending.md)"
        )
    for f in fields:
        value = getattr(state, f.name)
        if value is not None and not isinstance(value, (torch.Tensor, ClientStore)):
            raise PluginError(
                f"{plugin_of(algorithm)} hook {hook}: expected the State field {f.name!r} to be a tensor, None "
                f"or a ClientStore (checkpoints save only those), got {_describe(value)}; hold it as a tensor"
            )


def violation(check, *args) -> PluginError | None:
    """The :class:`PluginError` that ``check(*args)`` raises, or None."""
    try:
        check(*args)
    except PluginError as exc:
        return exc
    return None


def check_step(algorithm, out, x: torch.Tensor, y: torch.Tensor) -> None:
    """``step`` returned ``(x+, y+, diagnostics)``: x+ and y+ of x's and y's shape, dtype and device, a dict
    of the diagnostics its class declares; its ``State`` still checkpointable (:func:`check_state`)."""
    plugin = plugin_of(algorithm)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise PluginError(f"{plugin} hook step: expected a tuple (x, y, diagnostics), got {_describe(out)}")
    check_tensor(plugin, "step", out[0], tuple(x.shape), x)
    check_tensor(plugin, "step", out[1], tuple(y.shape), y)
    if not isinstance(out[2], dict):
        raise PluginError(f"{plugin} hook step: expected a dict of diagnostics, got {_describe(out[2])}")
    extra = sorted(set(out[2]) - set(algorithm.diagnostics))
    if extra:
        cls = type(algorithm).__qualname__
        raise PluginError(
            f"{plugin} hook step: expected the diagnostics {cls}.diagnostics declares, got also "
            f"{', '.join(map(repr, extra))}; add name -> (description, units) to {cls}.diagnostics"
        )
    for name, value in out[2].items():
        if not isinstance(value, numbers.Real):
            raise PluginError(
                f"{plugin} hook step: expected a float for the diagnostic {name!r}, got {_describe(value)}; "
                "return float(value)"
            )
    check_state(algorithm, "step")


def versions(*tensors: torch.Tensor) -> tuple[int, ...]:
    """The version counters of ``tensors`` (torch counts every in-place write into a tensor or a view of it):
    :func:`check_kept` compares them after ``step``."""
    return tuple(t._version for t in tensors)


def check_kept(algorithm, before: tuple[int, ...], x: torch.Tensor, y: torch.Tensor) -> None:
    """``step`` left its arguments x_k and y_k as they were (:func:`versions` before it): the server optimiser
    moves x by x_k - x_{k+1}, which an update written into x_k makes zero (the run would go on, silently
    without it)."""
    for name, version, value in zip(("x", "y"), before, (x, y)):
        if value._version != version:
            raise PluginError(
                f"{plugin_of(algorithm)} hook step: expected its arguments x and y left as they were (the server "
                f"optimiser compares x_k with the x it returns), got {name} written in place; return new tensors "
                "(x - lr * h, not x.sub_(lr * h))"
            )


def check_metrics(problem, metrics, declared) -> None:
    """``evaluate`` returned a dict of numbers whose keys ``metric_info`` declares."""
    plugin = plugin_of(problem)
    if not isinstance(metrics, dict):
        raise PluginError(f"{plugin} hook evaluate: expected a dict name -> float, got {_describe(metrics)}")
    extra = sorted(set(metrics) - set(declared))
    if extra:
        raise PluginError(
            f"{plugin} hook evaluate: expected the metrics metric_info declares ({', '.join(declared)}), got "
            f"also {', '.join(map(repr, extra))}; declare them in metric_info or drop them"
        )
    for name, value in metrics.items():
        if not isinstance(value, numbers.Real):  # a tensor too: return float(t)
            raise PluginError(
                f"{plugin} hook evaluate: expected a float for the metric {name!r}, got {_describe(value)}; "
                "return float(value)"
            )


def check_declared_rounds(algorithm, declared) -> None:
    """``rounds_per_iteration`` returned a count: an int >= 0 (checked at construction, on every rank)."""
    if isinstance(declared, bool) or not isinstance(declared, (int, np.integer)) or declared < 0:
        raise PluginError(
            f"{plugin_of(algorithm)} hook rounds_per_iteration: expected the number of counted aggregations of one "
            f"iteration (an int >= 0), got {_describe(declared)}"
        )


def check_rounds(algorithm, declared: int, counted: int, k: int) -> None:
    """Iteration k counted at most the ``rounds_per_iteration`` its algorithm declares."""
    if counted > declared:
        raise PluginError(
            f"{plugin_of(algorithm)} hook rounds_per_iteration: expected at most the {declared} rounds it declares, "
            f"got {counted} counted aggregations in iteration {k}; return the number of mean_over calls of one step"
        )
