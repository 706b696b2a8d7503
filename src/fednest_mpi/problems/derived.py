"""Problems from the losses of one client: the five oracles of :mod:`~fednest_mpi.problems.base`
derived with ``torch.func`` (no MPI; docs/extending.md, "Your own problem from its losses").

The user writes, for ONE client, the two losses of FedNest's problem (paper eq. (1))

    g_i(x, y; batch)   (inner)           f_i(x, y; batch)   (outer)

as torch functions of the vectors x (d1,) and y (d2,) and of that client's batch (a dict of
tensors), and says where a client's batch comes from. :class:`LossProblem` derives, on a block of
B clients at once (``torch.func.vmap`` over the block, never a Python loop over clients):

    grad_x_outer  = vmap(grad_x f)                                       eq. (5a)'s direct term
    grad_y_outer  = d/dY sum_i f_i(x, Y_i)                               Alg. 3, p_{i,0}
    grad_y_inner  = d/dY sum_i g_i(x, Y_i)                               Alg. 4 / 6
    hvp_yy_inner  = d/dY sum_i <grad_y g_i(x, Y_i), v_i> = nabla^2_yy g v                eq. (10b)
    jvp_xy_inner  = vmap(grad_x <grad_y g, v>):  grad_x of the jvp along v in y = nabla^2_xy g v  eq. (10a)

never a Hessian. The y side is reverse mode through the block's vmapped losses, summed over the
block (:func:`reverse_in_y`: a client's loss depends on its own row of Y only, so the sum's gradient
is each client's own; the product is a second reverse pass); the x side, whose gradients are per
client while x is shared, is ``vmap`` of ``grad`` (the cross product reverse-over-forward: one jvp
along v in y, then one reverse pass in x). A shared iterate (the global x or y, a stride-0 block:
:func:`~.base.is_shared`) enters ``vmap`` unbatched (``in_dims=None``) where the oracle does not
differentiate per client in it, so the network's products with it are one matrix product over the
block's samples, not B small ones.

Minibatches are drawn exactly as the built-ins draw theirs (:meth:`ClientSplit.batch
<fednest_mpi.problems.clientdata.ClientSplit.batch>`: keyed by the sample key, the step and the
client id), so a client's batch does not depend on its block or rank: with the default data access
(:class:`ClientSamples`) a derived problem reads the same samples as the hand-written oracle it
replaces. A batch holds every sample tensor of the client at the drawn positions, ``(b, ...)``, and
``"weight"`` (b,): the minibatch weights, summing to one over the drawn samples, zero on padding
(clients of different sizes are padded to one width of the whole population); losses are weighted
means ``(batch["weight"] * per_sample).sum()``.

:class:`ModuleParameters` splits the parameters of an ``nn.Module`` into flat x and y and calls it
with ``torch.func.functional_call``, so that a loss can be written over any network.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, jvp, vmap

from fednest_mpi import rng
from fednest_mpi.problems.base import BilevelProblem, Sample, is_shared, shared_rows
from fednest_mpi.problems.clientdata import ClientSplit, HostedSamples

Batch = dict[str, torch.Tensor]
INNER, OUTER = "inner", "outer"
Y_ONLY = frozenset({"grad_y_inner", "grad_y_outer", "hvp_yy_inner"})  #: the oracles that do not differentiate in x


@dataclass
class ClientSamples:
    """The hosted clients' samples: ``tensors`` (name -> (n, ...) tensor of the rank's samples) and,
    per split name (``"inner"``, ``"outer"``), a :class:`~fednest_mpi.problems.clientdata.ClientSplit`
    whose row r holds the positions of client ``first + r``'s samples in them."""

    tensors: dict[str, torch.Tensor]
    splits: dict[str, ClientSplit]
    first: int
    dtype: torch.dtype  #: of the weights

    @classmethod
    def of(cls, hosted: HostedSamples, dtype: torch.dtype) -> ClientSamples:
        """The samples of the built-in image problems (:class:`~.clientdata.ImageClients`,
        :class:`~.clientdata.FileClients`): ``inputs`` (n, d) and ``targets`` (n,)."""
        tensors = {"inputs": hosted.inputs, "targets": hosted.targets}
        return cls(tensors, {INNER: hosted.inner, OUTER: hosted.outer}, hosted.first, dtype)

    def batch(self, split: str, clients: np.ndarray, sample: Sample | None, batch_size: int) -> Batch:
        """The block's batches: every tensor at each client's drawn positions, (B, b, ...), and
        ``"weight"`` (B, b); ``sample=None`` or ``batch_size <= 0``: the client's whole split."""
        part = self.splits[split]
        rows = clients - self.first
        cols, weights = part.batch(rows, clients, sample, batch_size)
        pos = torch.as_tensor(part.positions(rows, cols))
        out = {}
        for name, t in self.tensors.items():
            where = pos.to(t.device).reshape(-1)
            out[name] = t.index_select(0, where).view(*pos.shape, *t.shape[1:])
        device = next(iter(self.tensors.values())).device
        out["weight"] = torch.as_tensor(weights, dtype=self.dtype, device=device)
        return out


class LossProblem(BilevelProblem):
    """A bilevel problem given by the losses of one client; the oracles are derived (module docstring).

    A subclass sets ``dim_x``, ``dim_y``, ``n_clients``, ``dtype``, ``device`` and ``cfg`` (its
    parameters), and writes:

    * :meth:`inner_loss` and :meth:`outer_loss`: g_i and f_i of ONE client, scalars;
    * the client data: ``self.samples`` (a :class:`ClientSamples`), or its own :meth:`client_batch`;
    * :meth:`initial_point`, :meth:`evaluate`, :meth:`metric_info` (as every problem).

    The minibatch of each oracle: ``cfg.batch_size`` samples of the inner split for
    ``grad_y_inner`` (FedInn's local steps); ``cfg.hypergradient_batch_size`` for the others (inner
    split for the second-order products, outer split for the gradients of f); a missing field or 0
    means the whole split (:meth:`minibatch`).
    """

    samples: ClientSamples
    dtype: torch.dtype
    device: torch.device
    cfg: object

    # -- what a subclass writes --------------------------------------------------------------------
    @abstractmethod
    def inner_loss(self, x: torch.Tensor, y: torch.Tensor, batch: Batch) -> torch.Tensor:
        """g_i(x, y; batch) of one client: a 0-dim tensor. ``x`` (d1,), ``y`` (d2,), ``batch`` that client's
        tensors (without the block axis). Pure torch: no in-place updates of the arguments, no ``.item()``,
        no data-dependent Python control flow, no MPI, no global random generator (torch.func traces it)."""

    @abstractmethod
    def outer_loss(self, x: torch.Tensor, y: torch.Tensor, batch: Batch) -> torch.Tensor:
        """f_i(x, y; batch) of one client (see :meth:`inner_loss`)."""

    def client_batch(self, split: str, clients: np.ndarray, sample: Sample | None, batch_size: int) -> Batch:
        """The batches of a block of client ids: a dict of (B, ...) tensors on the problem's device,
        row b belonging to ``clients[b]`` and drawn from ``(sample, clients[b])`` only. Default:
        ``self.samples.batch(...)`` (:class:`ClientSamples`)."""
        return self.samples.batch(split, clients, sample, batch_size)

    def oracle_batch(self, oracle: str, clients: np.ndarray, x: torch.Tensor, sample: Sample | None) -> Batch:
        """The batch ``oracle`` (a name of :data:`~.base.ORACLES`) sees at the (B, d1) rows ``x``: by default
        :meth:`client_batch` of its :meth:`minibatch`. A problem whose losses reach x only through a
        representation of the batch (hyper-representation: a network's features) may return that
        representation, computed once, for the oracles of :data:`Y_ONLY` (which do not differentiate in x)
        at a shared x; its losses then read it instead of recomputing it."""
        split, size = self.minibatch(oracle)
        return self.client_batch(split, clients, sample, size)

    def minibatch(self, oracle: str) -> tuple[str, int]:
        """(split, minibatch size) of an oracle (see the class docstring); 0: the whole split."""
        if oracle == "grad_y_inner":
            return INNER, int(getattr(self.cfg, "batch_size", 0))
        size = int(getattr(self.cfg, "hypergradient_batch_size", 0))
        return (OUTER if oracle in ("grad_x_outer", "grad_y_outer") else INNER), size

    # -- derivation ------------------------------------------------------------------------------
    def _derived(self, oracle: str, per_client: Callable, clients, rows: tuple[torch.Tensor, ...], sample, width: int):
        """``vmap(per_client)(*rows, batch)`` over the block; shared rows enter unbatched."""
        clients = np.asarray(clients, dtype=np.int64)
        if clients.size == 0:
            return torch.zeros(0, width, dtype=self.dtype, device=self.device)
        batch = self._remembered_batch(oracle, clients, rows[0], sample)
        args = tuple(r[0] if is_shared(r) else r for r in rows)
        dims = tuple(None if is_shared(r) else 0 for r in rows)
        return vmap(per_client, in_dims=(*dims, 0), randomness="error")(*args, batch).contiguous()

    def _derived_y(self, oracle: str, loss: Callable, clients, x, y, sample, v=None) -> torch.Tensor:
        """The y-side oracles (``grad_y_*``; ``hvp_yy_inner`` with ``v``) by :func:`reverse_in_y`."""
        clients = np.asarray(clients, dtype=np.int64)
        if clients.size == 0:
            return torch.zeros(0, self.dim_y, dtype=self.dtype, device=self.device)
        batch = self._remembered_batch(oracle, clients, x, sample)
        if is_shared(x):
            return reverse_in_y(loss, x[0], None, y, batch, v)
        return reverse_in_y(loss, x, 0, y, batch, v)

    def _remembered_batch(self, oracle, clients, x, sample) -> Batch:
        """:meth:`oracle_batch`, remembered for one call: FedInn's SVRG step evaluates the same
        minibatch at y_i and at the anchor y (Alg. 4), so the second gather is free. The key holds
        everything the batch depends on (x by storage and version, as the feature store keys it)."""
        split, size = self.minibatch(oracle)
        key = (oracle in Y_ONLY, split, size, clients.tobytes(), sample, is_shared(x), x.data_ptr(), x._version)
        memo = getattr(self, "_last_batch", None)
        if memo is not None and memo[0] == key:
            return memo[1]
        batch = self.oracle_batch(oracle, clients, x, sample)
        self._last_batch = (key, batch)
        return batch

    def _grad_x_outer(self, clients, x, y, sample):
        return self._derived("grad_x_outer", grad(self.outer_loss, 0), clients, (x, y), sample, self.dim_x)

    def _grad_y_outer(self, clients, x, y, sample):
        return self._derived_y("grad_y_outer", self.outer_loss, clients, x, y, sample)

    def _grad_y_inner(self, clients, x, y, sample):
        return self._derived_y("grad_y_inner", self.inner_loss, clients, x, y, sample)

    def _hvp_yy_inner(self, clients, x, y, v, sample):
        return self._derived_y("hvp_yy_inner", self.inner_loss, clients, x, y, sample, v)

    def _jvp_xy_inner(self, clients, x, y, v, sample):
        def cross(x, y, v, batch):
            return grad(lambda x: jvp(lambda y: self.inner_loss(x, y, batch), (y,), (v,))[1])(x)

        return self._derived("jvp_xy_inner", cross, clients, (x, y, v), sample, self.dim_x)

    # -- fused local steps (FedInn's SVRG, LFedInn / FedAvg's SGD) ------------------------------------------
    def _local_sgd(self, clients, x, y, steps, lr, key, anchor):
        """:meth:`~.base.BilevelProblem.local_sgd` from the shared x and y, one ``grad_y g`` of the block per step;
        with FedInn's SVRG anchor q (Alg. 4) the step's two gradients, at y_i and at the shared y on the
        same minibatch, are one call on the 2B stacked rows:

            y_i <- y_i - lr (grad_y g_i(x, y_i; B_nu) - grad_y g_i(x, y; B_nu) + q)

        (the first step, where y_i = y, is y - lr q). The same steps as the oracle loop, to rounding."""
        clients = np.asarray(clients, dtype=np.int64)
        B = clients.size
        Y = y.expand(B, -1)
        if B == 0 or steps == 0:
            return Y.clone()
        X = shared_rows(x, B)

        def rows(Y, batch):
            return reverse_in_y(self.inner_loss, x, None, Y, batch)

        for nu in range(steps):
            if anchor is not None and nu == 0:
                Y = Y - lr * anchor
                continue
            batch = self._remembered_batch("grad_y_inner", clients, X, Sample(key, nu))
            if anchor is None:
                d = rows(Y, batch)
            else:
                both = rows(torch.cat([Y, y.expand(B, -1)]), {k: torch.cat([v, v]) for k, v in batch.items()})
                d = both[:B] - both[B:] + anchor
            Y = Y - lr * d
        return Y.contiguous()

    # -- values (not counted) ------------------------------------------------------------------------
    def _values(self, loss, split, clients, x, y) -> torch.Tensor:
        clients = np.asarray(clients, dtype=np.int64)
        if clients.size == 0:
            return torch.zeros(0, dtype=self.dtype, device=self.device)
        batch = self.client_batch(split, clients, None, 0)
        args = tuple(r[0] if is_shared(r) else r for r in (x, y))
        dims = tuple(None if is_shared(r) else 0 for r in (x, y))
        with torch.no_grad():
            out = vmap(loss, in_dims=(*dims, 0), randomness="error")(*args, batch)
        return out.expand(clients.size) if out.dim() == 0 else out

    def inner_value(self, clients, x, y):
        """g_i(x, y) on each client's whole inner split (not counted)."""
        return self._values(self.inner_loss, INNER, clients, x, y)

    def outer_value(self, clients, x, y):
        """f_i(x, y) on each client's whole outer split (not counted)."""
        return self._values(self.outer_loss, OUTER, clients, x, y)


def reverse_in_y(
    loss: Callable, x: torch.Tensor, x_dim: int | None, Y: torch.Tensor, batch: Batch, V=None
) -> torch.Tensor:
    """Each client's nabla_y l_i, or with ``V`` its nabla^2_yy l_i V_i, at its row of the (B, d2) ``Y``:
    reverse mode (twice for the product) through the block's losses ``vmap(l)(x, Y, batch)`` summed.
    A client's loss depends on its own row only, so d(sum_j l_j)/dY_i = nabla l_i(Y_i), the rows of
    ``vmap(grad l)`` bit for bit, and d(sum_i <nabla l_i, V_i>)/dY_i = nabla^2 l_i V_i. One
    ``torch.func`` layer instead of two (vmap over grad, or over jvp of grad): on the head of a
    network about 1.25x (gradient) and 1.5x (product) faster per call (docs/performance.md, the derived
    oracles' measurements). ``x``: the shared (d1,) vector (``x_dim=None``) or (B, d1) rows (``x_dim=0``)."""
    with torch.enable_grad():
        rows = Y.detach().contiguous().requires_grad_()
        total = vmap(loss, in_dims=(x_dim, 0, 0), randomness="error")(x.detach(), rows, batch).sum()
        (gradient,) = torch.autograd.grad(total, rows, create_graph=V is not None)
        if V is None:
            return gradient
        (product,) = torch.autograd.grad(gradient, rows, grad_outputs=V)
        return product


class ModuleParameters:
    """The parameters of an ``nn.Module`` split into two flat vectors by name: those whose name is in
    ``x_names`` (or starts with one of them followed by ``.``) form x, the others y, each in the
    module's parameter order. :meth:`call` runs the module on them (``torch.func.functional_call``:
    the module's own tensors are not touched, so one module serves every client of a block).
    Buffers (e.g. batch-norm statistics) are not supported: a module with buffers is refused."""

    def __init__(self, module: nn.Module, x_names: Iterable[str] = ()):
        if any(True for _ in module.buffers()):
            raise ValueError(f"{type(module).__name__} has buffers (e.g. batch norm); use a module without them")
        prefixes = tuple(x_names)
        params = list(module.named_parameters())
        self.module = module
        in_x = [any(n == p or n.startswith(p + ".") for p in prefixes) for n, _ in params]
        self.x_shapes = [(n, tuple(t.shape)) for (n, t), xi in zip(params, in_x) if xi]
        self.y_shapes = [(n, tuple(t.shape)) for (n, t), xi in zip(params, in_x) if not xi]
        self.dim_x = sum(math.prod(s) for _, s in self.x_shapes)
        self.dim_y = sum(math.prod(s) for _, s in self.y_shapes)

    @staticmethod
    def _unflatten(vector: torch.Tensor, shapes) -> dict[str, torch.Tensor]:
        """Views of ``vector`` by one ``split``, whose backward concatenates the parameters' gradients
        in one pass (slicing each one out would fill and add a zero vector of the whole length per
        parameter: for a per-client gradient in x, (B, d1) numbers several times over)."""
        pieces = vector.split([math.prod(shape) for _, shape in shapes]) if shapes else ()
        return {name: piece.view(shape) for (name, shape), piece in zip(shapes, pieces)}

    def parameters(self, x: torch.Tensor | None, y: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """name -> parameter tensor (views into ``x`` (d1,) and ``y`` (d2,))."""
        out = {} if x is None else self._unflatten(x, self.x_shapes)
        return out | ({} if y is None else self._unflatten(y, self.y_shapes))

    def call(self, x: torch.Tensor | None, y: torch.Tensor | None, *args):
        """``module(*args)`` with its parameters taken from x and y (None: a side without parameters)."""
        return functional_call(self.module, self.parameters(x, y), args)

    def initial(self, seed: int, tag: int, side: str, dtype=torch.float64, device="cpu") -> torch.Tensor:
        """PyTorch's default initialisation of linear and convolution layers, U(-1/sqrt(fan_in),
        1/sqrt(fan_in)) for weights and biases (fan_in: the inputs of one output unit), keyed by
        (seed, INIT, tag, parameter index) instead of torch's global generator: the same on every rank."""
        shapes = self.x_shapes if side == "x" else self.y_shapes
        fan_in = _fan_ins(self.module)
        parts = []
        for j, (name, shape) in enumerate(shapes):
            u = rng.uniform(rng.key(seed, rng.Purpose.INIT, tag, j), math.prod(shape))
            parts.append(torch.as_tensor((2 * u - 1) / math.sqrt(fan_in[name]), dtype=dtype, device=device))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype, device=device)


def _fan_ins(module: nn.Module) -> dict[str, int]:
    """Parameter name -> fan-in: a weight's inputs per output (its size over its first dimension);
    the other parameters of the same submodule (its bias) share its weight's fan-in; a parameter
    without a weight beside it: its own size."""
    out = {}
    for prefix, sub in module.named_modules():
        own = dict(sub.named_parameters(recurse=False))
        weight = own.get("weight")
        fan = math.prod(weight.shape[1:]) if weight is not None and weight.dim() > 1 else None
        for name, t in own.items():
            out[f"{prefix}.{name}" if prefix else name] = max(1, fan or t.numel())
    return out
