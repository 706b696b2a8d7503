"""The oracle interface of a federated bilevel problem (paper eq. (1)); no MPI here.

    min_x f(x) = (1/M) sum_i f_i(x, y*(x)),   y*(x) = argmin_y (1/M) sum_i g_i(x, y)

Every oracle evaluates a **block** of clients in one call: ``clients`` is an integer array of B
client ids, ``x`` is ``(B, d1)`` and ``y`` is ``(B, d2)`` (row b belongs to ``clients[b]``; a
shared iterate is passed with ``Tensor.expand``, which copies nothing). ``sample`` is a
:class:`Sample`: a counter-based key of the round and the index of the local step; the problem
combines it with each client id (e.g. step nu of a round reads minibatch nu of that client's
epoch-wise shuffles), so a client's sample does not depend on its block or rank.
``sample=None`` means the client's whole local data set (exact local oracle).

Subclasses implement the oracles under their public names (``def grad_x_outer(self, clients, x, y,
sample)``; the built-ins use the underscored names, which work as well): the base class puts them behind
the public methods, which count oracle calls per client (``self.oracle_counts``, recorded next to the
communication counters) and check every output's shape, dtype and device (:mod:`fednest_mpi.contract`).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections import Counter
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import torch

from fednest_mpi import failure
from fednest_mpi.contract import check_oracle_output, note_nonfinite_output, plugin_of


def shared_rows(vector: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, d) block of ``n`` copies of the (d,) ``vector`` without copying: every row is the
    same storage (leading stride 0, also for n = 1, where ``Tensor.expand`` would keep the stride),
    the way algorithms pass the global x or y; see :func:`is_shared`."""
    return vector.as_strided((n, vector.shape[0]), (0, vector.stride(0)), vector.storage_offset())


def _one_client_as_two(oracle, clients, *args):
    """``oracle(clients, *args)``, with a block of one client evaluated as two copies of it (row 0
    returned): ``bmm`` multiplies a batch of one matrix by another kernel than a batch of several
    (a (64 x 784) x (784 x 200) product differs in the last bit), so without this a client would
    round differently when it is alone in its chunk or on its rank. Rows keep their layout (shared
    rows stay shared)."""
    if len(clients) != 1:
        return oracle(clients, *args)

    def twice(a):
        if not isinstance(a, torch.Tensor):
            return a  # the Sample
        return shared_rows(a[0], 2) if is_shared(a) else torch.cat([a, a])

    return oracle(np.repeat(np.asarray(clients), 2), *(twice(a) for a in args))[:1]


def is_shared(rows: torch.Tensor) -> bool:
    """Whether (B, d) ``rows`` are one row shared by the block (``Tensor.expand``: stride 0), the way
    algorithms pass the global x or y; oracles may then compute what depends on it once."""
    return bool(rows.shape[0]) and rows.stride(0) == 0


def squared_norms(rows: torch.Tensor) -> torch.Tensor:
    """||row||^2 of each row of (B, d) ``rows``; a shared row (``Tensor.expand``, stride 0) is
    reduced once instead of B times."""
    if is_shared(rows):
        return (rows[0] @ rows[0]).expand(rows.shape[0])
    return (rows * rows).sum(1)


class Sample(NamedTuple):
    """Names a stochastic draw: ``key`` from :func:`fednest_mpi.rng.key` (seed, purpose, round, ...),
    ``step`` the local step (or Neumann term) within that round."""

    key: int
    step: int


ORACLES = ("grad_x_outer", "grad_y_outer", "grad_y_inner", "hvp_yy_inner", "jvp_xy_inner")
CHECKED_CALLS = 1000  # calls of each oracle whose output is checked, on each rank: the first iterations
#: output values of each oracle looked at for NaN/Inf in those calls, on each rank: a full pass over the output
#: (0.05 s for 1,000 clients' rows of 157,010 float32), so at 1,000 clients only the first call or two of an
#: x-side oracle, while small problems are looked at in all their first CHECKED_CALLS calls
CHECKED_VALUES = 1 << 27


def _boundary(method):
    """Mark a counted public method of :class:`BilevelProblem` (not an implementation to move behind it)."""
    method._boundary = True
    return method


class BilevelProblem(ABC):
    """Per-client oracles f_i, g_i, their gradients and second-order products, batched over clients."""

    dim_x: int
    dim_y: int
    n_clients: int
    #: the metric that ``report``, ``plot`` and the progress lines show first (a key of :meth:`metric_info`);
    #: None: the first metric
    primary_metric: str | None = None
    #: True where every call of :meth:`hvp_yy_inner` and of :meth:`grad_x_outer` returns a new tensor (not a view
    #: or the storage of an argument, of the problem's own state or of an earlier output), so that the algorithm
    #: may compute in it (FedIHGP's (I - eta H) r in Hr's memory, the hypergradient direction nabla_x f_i - J_i p in
    #: nabla_x f_i's: the same operations, no temporary of the chunk's rows). False (the default): the algorithm
    #: never writes into an output. A subclass that overrides either oracle keeps the promise or sets it False.
    fresh_outputs: bool = False

    def __init__(self) -> None:
        self.oracle_counts: Counter = Counter()
        #: calls of each oracle still to check at the boundary (the first CHECKED_CALLS on this rank)
        self.unchecked_calls = dict.fromkeys(ORACLES, CHECKED_CALLS)
        #: output values of each oracle still to look at for NaN/Inf in those calls (CHECKED_VALUES at first)
        self.unchecked_values = dict.fromkeys(ORACLES, CHECKED_VALUES)
        #: hook -> ``problem 'name' (module:Class) hook H``, the name a fatal signal's line gives it
        self.hook_names: dict[str, str] = {}
        #: the first oracle output with NaN/Inf at finite arguments in those calls (contract.note_nonfinite_output)
        self.nonfinite_note: str | None = None
        #: hook -> the class whose implementation of it runs now (:meth:`_run_implementation`)
        self.running_implementations: dict[str, type] = {}

    @classmethod
    def implementation_for(cls, cfg) -> type[BilevelProblem]:
        """The class that runs the [problem] section ``cfg`` of this problem (``problems.build_problem``): this
        one unless a problem offers another form (hyper_representation and loss_tuning: the derived oracles
        over a network, :mod:`~fednest_mpi.problems.models`, when ``cfg.model`` or ``cfg.derived_oracles``)."""
        return cls

    # -- initial point and metrics ------------------------------------------------------------
    @abstractmethod
    def initial_point(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x0, y0), identical on every rank."""

    @abstractmethod
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """Metrics of the global iterate (objectives, distances to known solutions, accuracies)."""

    @abstractmethod
    def metric_info(self) -> dict[str, tuple]:
        """name -> (description, units) or (description, units, higher_is_better) of every metric
        :meth:`evaluate` returns: the column's attributes in the run file; ``report``'s "best" is the
        maximum where ``higher_is_better`` is true, else the minimum (a metric that does not say: lower is
        better)."""

    @contextmanager
    def outer_fixed(self, clients, x: torch.Tensor):
        """Promise that, until exit, oracles on ``clients`` are called with the shared row ``x``
        (a FedInn round). Problems may cache what depends on x alone; the default caches nothing."""
        yield

    # -- pooled outer objectives: f = phi(mean_i u_i(y)), not a mean of per-client losses ------------
    @property
    def pooled_outer_objective(self) -> bool:
        """Whether f is a function of pooled statistics (:meth:`outer_statistics` is not None)."""
        return False

    def outer_statistics(self, clients, x, y) -> torch.Tensor | None:
        """Per-client statistics u_i(x, y), shape (B, k), of an outer objective that is a function of
        their mean over the clients (e.g. a smooth maximum of pooled group losses); None (the
        default): f is the mean of the f_i and needs none. Uncounted, like the values."""
        return None

    def outer_linearised(self, mean_statistics: torch.Tensor):
        """Context manager: until exit, f_i is the linearisation of the pooled objective at
        ``mean_statistics`` (the mean over a client set of :meth:`outer_statistics`), so that the
        mean of the clients' grad f_i is the gradient of the pooled objective. Problems whose
        :meth:`outer_statistics` is not None provide it."""
        raise NotImplementedError(f"{type(self).__name__} has no pooled outer objective")

    # -- oracles (public: counted and checked at the boundary) ------------------------------------------
    def __init_subclass__(cls, **kwargs):
        """A subclass implements the oracles under their public names (``def grad_x_outer(self, clients, x,
        y, sample)``, docs/extending.md); they become the implementations (``_grad_x_outer``) behind the
        counted, checked public methods below. Implementations under the underscored names work as well."""
        super().__init_subclass__(**kwargs)
        for name in (*ORACLES, "local_sgd"):
            own = cls.__dict__.get(name)
            if own is not None and not getattr(own, "_boundary", False):
                setattr(cls, "_" + name, own)
                setattr(cls, name, getattr(BilevelProblem, name))

    def _run_implementation(self, hook: str, *args):
        """Run the implementation of ``hook`` (``_grad_x_outer``, ...): the most derived one, or, when called from
        within a running one (an implementation that calls ``super().grad_x_outer(...)``, which reaches the public
        method), the next one after it in the method resolution order, as ``super()`` means."""
        running = self.running_implementations
        before = running.get(hook)
        mro = type(self).__mro__
        owner = next(k for k in mro[0 if before is None else mro.index(before) + 1 :] if "_" + hook in k.__dict__)
        running[hook] = owner
        try:
            return owner.__dict__["_" + hook](self, *args)
        finally:
            if before is None:
                del running[hook]
            else:
                running[hook] = before

    def _oracle(self, hook: str, clients, x, *args) -> torch.Tensor:
        """Count ``hook`` for the B ``clients``, call its implementation (one client as two) and, in its first
        :data:`CHECKED_CALLS` calls, check the output: (B, d) rows of x's dtype on x's device, finite where the
        arguments are (:func:`fednest_mpi.contract.check_oracle_output`; a NaN/Inf at finite arguments, looked for
        in the first :data:`CHECKED_VALUES` output values, is noted, ``note_nonfinite_output``, and named by the
        runner's NaN/Inf line; later calls cost nothing more)."""
        if hook in self.running_implementations:  # super().hook(...) in an implementation: not another call
            return self._run_implementation(hook, clients, x, *args)
        self.oracle_counts[hook] += len(clients)
        failure.hook_entered(
            self.hook_names.get(hook) or self.hook_names.setdefault(hook, f"{plugin_of(self)} hook {hook}")
        )
        try:
            out = _one_client_as_two(functools.partial(self._run_implementation, hook), clients, x, *args)
        finally:
            failure.hook_left()
        if self.unchecked_calls[hook]:
            self.unchecked_calls[hook] -= 1
            check_oracle_output(self, hook, out, len(clients), x)
            if self.unchecked_values[hook] > 0:
                self.unchecked_values[hook] -= out.numel()
                note_nonfinite_output(self, hook, out, clients, (x, *args))
        return out

    @_boundary
    def grad_x_outer(self, clients, x, y, sample) -> torch.Tensor:
        """Direct gradient nabla_x f_i(x, y; xi), shape (B, d1) -- eq. (5a)."""
        return self._oracle("grad_x_outer", clients, x, y, sample)

    @_boundary
    def grad_y_outer(self, clients, x, y, sample) -> torch.Tensor:
        """nabla_y f_i(x, y; xi), shape (B, d2): the vector of FedIHGP (Alg. 3, p_{i,0})."""
        return self._oracle("grad_y_outer", clients, x, y, sample)

    @_boundary
    def grad_y_inner(self, clients, x, y, sample) -> torch.Tensor:
        """nabla_y g_i(x, y; zeta), shape (B, d2): the FedInn direction (Alg. 4/6)."""
        return self._oracle("grad_y_inner", clients, x, y, sample)

    @_boundary
    def hvp_yy_inner(self, clients, x, y, v, sample) -> torch.Tensor:
        """nabla^2_yy g_i(x, y; zeta) v, shape (B, d2) -- the products of eq. (10b)."""
        return self._oracle("hvp_yy_inner", clients, x, y, v, sample)

    @_boundary
    def jvp_xy_inner(self, clients, x, y, v, sample) -> torch.Tensor:
        """nabla^2_xy g_i(x, y; zeta) v = nabla_x <nabla_y g_i, v>, shape (B, d1) -- eq. (10a)."""
        return self._oracle("jvp_xy_inner", clients, x, y, v, sample)

    @_boundary
    def local_sgd(
        self,
        clients,
        x: torch.Tensor,
        y: torch.Tensor,
        steps: int,
        lr: float,
        key: int,
        anchor: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """The clients' y after ``steps`` local steps from the **shared** iterates x (d1,) and y (d2,)
        with minibatches Sample(key, nu), as (B, d2) rows: SGD y <- y - lr nabla_y g_i(x, y_nu) --
        LFedInn (Alg. 6) / FedAvg -- or, with the ``anchor`` q (d2,), FedInn's SVRG steps (Alg. 4)
        y <- y - lr (nabla_y g_i(x, y_nu) - nabla_y g_i(x, y) + q). The rows may be a factored form
        with ``dense(lo, hi)`` and ``weighted_sum(w)`` (:func:`fednest_mpi.federation.dense` gives the
        tensor; :meth:`Federation.mean_over` averages it as it is), optionally ``part(lo, hi)`` and
        ``group_sum(lo, hi, w, out)`` together (the exact reduction's group sums from the factors; without
        them it sums the form's dense rows). None when the problem has no
        fused form (the algorithm then calls :meth:`grad_y_inner` step by step). Counted as the
        inner gradient calls it replaces (one or two per step and client)."""
        if "local_sgd" in self.running_implementations:  # super().local_sgd(...) in an implementation
            return self._run_implementation("local_sgd", clients, x, y, steps, lr, key, anchor)
        if len(clients) == 1:  # see _one_client_as_two
            twice = np.repeat(np.asarray(clients), 2)
            rows = self._run_implementation("local_sgd", twice, x, y, steps, lr, key, anchor)
            if rows is not None:  # a factored form stays one (its group sums use its factors: federation.py)
                rows = (
                    rows[:1]
                    if isinstance(rows, torch.Tensor)
                    else rows.part(0, 1)
                    if hasattr(rows, "part")
                    else rows.dense()[:1]
                )
        else:
            rows = self._run_implementation("local_sgd", clients, x, y, steps, lr, key, anchor)
        if rows is not None:
            self.oracle_counts["grad_y_inner"] += len(clients) * steps * (1 if anchor is None else 2)
        return rows

    def _local_sgd(self, clients, x, y, steps, lr, key, anchor) -> torch.Tensor | None:
        return None

    def local_sgd_bytes(self, steps: int, anchored: bool) -> int | None:
        """Working set per client of :meth:`local_sgd`, when it differs from :meth:`client_bytes`
        (e.g. a factored form that never holds a client's y); None: that estimate. Default:
        :meth:`y_side_bytes` (local steps move y at the shared x)."""
        return self.y_side_bytes()

    def y_side_bytes(self) -> int | None:
        """Working set per client of the calls that hold no row of x per client: the oracles of the
        y side (``grad_y_inner``, ``grad_y_outer``, ``hvp_yy_inner``) and the local steps, at the
        shared x, when it is smaller than :meth:`client_bytes` (whose estimate must cover the x side,
        (B, d1) rows); None: that estimate. It sizes those calls' chunks (``Federation.chunk_for``):
        a large d1 then no longer limits the chunks of a round's many y-side calls."""
        return None

    def x_side_bytes(self) -> int | None:
        """Working set per client of FedOut's hypergradient direction at the shared y (``grad_x_outer`` and
        ``jvp_xy_inner``: rows of x per client, none of y), when it is smaller than :meth:`client_bytes` (whose
        estimate must cover rows of y per client); None: that estimate. It sizes those calls' chunks
        (``Federation.chunk_for``), which change no bit of the result."""
        return None

    def factored_rows_bytes(self) -> int | None:
        """Working set per client of the factored-row oracles that the exact reduction's summation groups call
        instead of the dense ones (``hvp_rows``, ``gradient_rows``, ``hypergradient_rows``: a few factors per
        client, never a row of x or y per client), when it is smaller than the dense calls' estimate; None: that
        estimate. It sizes those calls' chunks (``Federation.chunk_for``), which change no bit of the result."""
        return None

    # -- values (optional, not counted) ------------------------------------------------------------
    def inner_value(self, clients, x, y) -> torch.Tensor | None:
        """g_i(x, y) on each client's whole local inner data, shape (B,), or None where the problem
        does not define it. A diagnostic of the per-client series (docs/hdf5.md), not an oracle of
        the algorithms: not counted in :attr:`oracle_counts`, so the Table 2 counts do not depend
        on whether a run records it."""
        return None

    def outer_value(self, clients, x, y) -> torch.Tensor | None:
        """f_i(x, y) on each client's whole local outer data, shape (B,), or None (see :meth:`inner_value`)."""
        return None

    def correct_counts(self, clients, x, y) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(correctly classified, total) samples of each client's whole inner (training) data,
        shapes (B,), for classification problems; None elsewhere (the training accuracy of
        ``run.train_eval_every``; not counted as an oracle)."""
        return None

    # -- to implement --------------------------------------------------------------------------
    @abstractmethod
    def _grad_x_outer(self, clients, x, y, sample): ...

    @abstractmethod
    def _grad_y_outer(self, clients, x, y, sample): ...

    @abstractmethod
    def _grad_y_inner(self, clients, x, y, sample): ...

    @abstractmethod
    def _hvp_yy_inner(self, clients, x, y, v, sample): ...

    @abstractmethod
    def _jvp_xy_inner(self, clients, x, y, v, sample): ...

    def client_bytes(self) -> int:
        """Estimated working set of one client in an oracle call or a local step, in bytes (sizes
        the chunks of :meth:`Federation.mean_over <fednest_mpi.federation.Federation.mean_over>`):
        by default 16 rows of x and y (iterates, gradients and the temporaries of a local step)."""
        itemsize = torch.empty((), dtype=getattr(self, "dtype", torch.float64)).element_size()
        return 16 * (self.dim_x + self.dim_y) * itemsize

    def counts_vector(self) -> np.ndarray:
        """Oracle counts in the fixed order of :data:`ORACLES` (for summing over ranks)."""
        return np.array([self.oracle_counts[name] for name in ORACLES], dtype=np.float64)
