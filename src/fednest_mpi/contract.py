"""The plugin boundary: what a run checks of the code it calls -- a problem's oracles, an algorithm's
``step`` and ``State`` -- and how a fault in that code is named (docs/extending.md, "Checked at the
boundary").

* :func:`probe_problem`, at construction on every rank before any collective: each oracle once on
  (at most) two hosted clients at the initial point, twice with the same ``Sample``: its output must be
  a ``(B, d)`` tensor of the run's dtype on the run's device, finite, and the same both times (a draw
  from torch's or numpy's global generator gives other values: results would depend on ranks and
  chunks). The counts of the probe are not kept.
* :func:`check_state`, at construction: every field of an algorithm's ``State`` must be a tensor, None
  or a ``ClientStore`` (what checkpoints save).
* :func:`check_step` / :func:`check_metrics` / :func:`check_rounds`, after each iteration (a few
  comparisons): the (x, y, diagnostics) ``step`` returns, the metrics ``evaluate`` returns against
  ``metric_info``, the counted rounds against ``rounds_per_iteration``.
* :func:`check_oracle_output` in the first ``problems.base.CHECKED_CALLS`` counted calls of each oracle
  (``BilevelProblem.grad_x_outer`` and the others): shape, dtype and device.
* :func:`hook_of`: the plugin and hook an exception (any ``BaseException``) came from, read from its
  traceback (no cost until something is raised).

Each violation is a :class:`PluginError`: one line naming the plugin, the hook, what was expected and
what came. No MPI and no HDF5 here.
"""

from __future__ import annotations

import dataclasses
import math
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
    its implementation's underscore) in ``exc``'s traceback, or None when it came from elsewhere."""
    from fednest_mpi.algorithms.base import Algorithm
    from fednest_mpi.problems.base import BilevelProblem

    found: tuple[object, str] | None = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        name = frame.f_code.co_name
        public = name[1:] if name.startswith("_") and not name.startswith("__") else name
        if isinstance(owner, BilevelProblem) and public in PROBLEM_HOOKS:
            found = (owner, public)
        elif isinstance(owner, Algorithm) and public in ALGORITHM_HOOKS:
            found = (owner, public)
        tb = tb.tb_next
    return None if found is None else f"{plugin_of(found[0])} hook {found[1]}"


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return f"{type(value).__name__} {value!r}"[:120]


def check_tensor(plugin: str, hook: str, value, shape: tuple[int, ...], like: torch.Tensor) -> None:
    """``value`` must be a tensor of ``shape`` with ``like``'s dtype and device (three comparisons)."""
    if (
        not isinstance(value, torch.Tensor)
        or tuple(value.shape) != shape
        or value.dtype != like.dtype
        or value.device != like.device
    ):
        raise PluginError(
            f"{plugin} hook {hook}: expected a {like.dtype} tensor of shape {shape} on {like.device}, "
            f"got {_describe(value)}"
        )


def check_oracle_output(problem, hook: str, value, rows: int, like: torch.Tensor) -> None:
    """A counted oracle's output: ``(B, d)`` rows of ``like``'s dtype on its device (``d``: dim_x for the
    x-side oracles, dim_y for the others)."""
    width = problem.dim_x if hook in ("grad_x_outer", "jvp_xy_inner") else problem.dim_y
    if (
        isinstance(value, torch.Tensor)
        and value.shape == (rows, width)
        and value.dtype == like.dtype
        and value.device == like.device
    ):
        return
    check_tensor(plugin_of(problem), hook, value, (rows, width), like)


def probe_problem(problem, hosted: range, dtype: torch.dtype, key: int) -> None:
    """Call each oracle on at most two hosted clients at the initial point, twice with ``Sample(key, 0)``,
    and check the initial point and the outputs (module docstring); the oracle counts are left as they
    were. Raises :class:`PluginError`."""
    from fednest_mpi.problems.base import Sample, shared_rows

    plugin = plugin_of(problem)
    for attr in ("dim_x", "dim_y", "n_clients"):
        if not isinstance(getattr(problem, attr, None), (int, np.integer)):
            raise PluginError(
                f"{plugin} hook __init__: expected the attribute {attr} (an int) set by the constructor, "
                f"got {_describe(getattr(problem, attr, None))}"
            )
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


def _probe_oracles(problem, plugin: str, ids: np.ndarray, X, Y, V, sample) -> None:
    """Each oracle called twice on the clients ``ids`` at (X, Y) (V: the vector of the Hessian products): finite
    values, the same both times, no draw from torch's global generator inside a vmapped loss."""
    from fednest_mpi.problems.base import ORACLES

    try:
        for hook in ORACLES:
            args = (ids, X, Y, V, sample) if hook in ("hvp_yy_inner", "jvp_xy_inner") else (ids, X, Y, sample)
            first = getattr(problem, hook)(*args)
            if not bool(torch.isfinite(first).all()):
                raise PluginError(
                    f"{plugin} hook {hook}: expected finite values at the initial point, got "
                    f"{int((~torch.isfinite(first)).sum())} NaN/Inf of {first.numel()}"
                )
            again = getattr(problem, hook)(*args)
            if not torch.equal(first, again):
                raise PluginError(
                    f"{plugin} hook {hook}: expected the same values from the same call (clients, x, y, sample), "
                    f"got values differing by up to {float((first - again).abs().max()):.3g}; draw randomness "
                    "only from sample.key / rng.key (never torch's or numpy's global generators)"
                )
    except RuntimeError as exc:
        if "randomness" not in str(exc):
            raise
        raise PluginError(
            f"{plugin} hook {hook}: expected no random draws inside a loss (it is vmapped over clients), got "
            "a call of torch's global generator; draw from the batch's keys (sample.key, rng.key) instead"
        ) from exc


def check_state(algorithm) -> None:
    """Every field of ``algorithm.state`` is a tensor, None or a ``ClientStore`` (what checkpoints save)."""
    from fednest_mpi.algorithms.base import ClientStore, State

    state = algorithm.state
    if not isinstance(state, State):
        raise PluginError(
            f"{plugin_of(algorithm)} hook __init__: expected self.state to be a fednest_mpi.api.State, "
            f"got {_describe(state)}"
        )
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if value is not None and not isinstance(value, (torch.Tensor, ClientStore)):
            raise PluginError(
                f"{plugin_of(algorithm)} hook __init__: expected the State field {f.name!r} to be a tensor, None "
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
    check_state(algorithm)


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
        try:
            math.isfinite(value)
        except TypeError:
            raise PluginError(
                f"{plugin} hook evaluate: expected a float for the metric {name!r}, got {_describe(value)}"
            ) from None


def check_rounds(algorithm, declared: int, counted: int, k: int) -> None:
    """Iteration k counted at most the ``rounds_per_iteration`` its algorithm declares."""
    if counted > declared:
        raise PluginError(
            f"{plugin_of(algorithm)} hook rounds_per_iteration: expected at most the {declared} rounds it declares, "
            f"got {counted} counted aggregations in iteration {k}; return the number of mean_over calls of one step"
        )
