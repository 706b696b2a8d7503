"""Closed-form batched oracles of hyper-representation learning (FedNest paper section 4.1),
shared by every problem with that structure (MNIST: :mod:`.hyperrep`; Synthetic(alpha, beta):
:mod:`.synthetic`). No MPI, no data source: subclasses say where a client's samples are.

A d-H-C network. The outer variable x is the representation layer (W1, b1: H d + H numbers),
the inner variable y the linear head (W2, b2: C H + C):

    g_i(x, y) = CE(head_y(phi_x(A)), t) on client i's inner (train) split + (lambda/2) ||y||^2
    f_i(x, y) = CE(head_y(phi_x(A)), t) on client i's outer (validation) split

with phi_x(A) = relu(dropout(A W1^T + b1)) (dropout before the ReLU, as in the authors' code;
off by default). The squared L2 term makes every g_i lambda-strongly convex in y, as the paper
assumes (Assumption 1).

All oracles are batched matrix products over a block of clients (no per-client Python loop, no
autograd graph): the head is a generalised linear model, so with P = softmax, E = one-hot
labels, m_j the minibatch weights and J = diag(p) - p p^T,

    nabla_y CE         = sum_j m_j (p_j - e_j) [h_j; 1]^T
    nabla^2_yy CE . v  = sum_j m_j J_j (V2 h_j + vb2) [h_j; 1]^T                    (eq. (10b) products)
    nabla^2_xy CE . v  = back-propagation of  m_j [V2^T (p_j - e_j) + W2^T J_j (V2 h_j + vb2)]
                         through phi_x                                            (eq. (10a) products)

(checked against autograd in ``tests/unit/test_hyperrep.py`` and ``tests/unit/test_synthetic.py``).

Data access (the subclass contract): :meth:`_locate` maps a split handle (``self.inner`` or
``self.outer``) and a block of client ids to ``(split, rows, inputs, targets)``: a
:class:`~fednest_mpi.problems.clientdata.ClientSplit` whose ``rows`` are the clients, and the
sample tensors its positions index. Minibatches are drawn by ``ClientSplit.batch`` (keyed by the
sample key and the client id, so independent of the block and the rank); clients with fewer
samples are padded and masked.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.problems.base import (
    BilevelProblem,
    Sample,
    _one_client_as_two,
    is_shared,
    shared_rows,
    squared_norms,
)
from fednest_mpi.problems.kernels import gram_norms, rowwise_linear, softmax_
from fednest_mpi.problems.mlp import GradientRows

_DROPOUT_TAG = 11
_EVAL_CHUNK = 5000
FEATURE_BUDGET_BYTES = 256 * 2**20  # cached per-client features beyond the current client set (see FeatureStore)


def _rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for an integer index of any shape, by ``index_select`` (a contiguous copy,
    about twice as fast as advanced indexing on CPU)."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, *table.shape[1:])


def _weight_and_bias_rows(G: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Per-client [sum_j G_j^T inputs_j (row-major), sum_j G_j] rows (B, out in + out), the gradient
    of a linear layer, written in place into one buffer (no concatenation copy)."""
    B, n_out, n_in = G.shape[0], G.shape[2], inputs.shape[2]
    out = G.new_empty(B, n_out * n_in + n_out)
    torch.bmm(G.transpose(1, 2), inputs, out=out[:, : n_out * n_in].view(B, n_out, n_in))
    torch.sum(G, 1, out=out[:, n_out * n_in :])
    return out


class OuterProductRows:
    """Per-client rows [sum_j G_j^T inputs_j (row-major), sum_j G_j] of a linear layer's gradient (the layout of
    :func:`_weight_and_bias_rows`), held factored: G (B, K, out) and inputs (B, K, in), K terms per client (the
    same K for every client). A factored form of :meth:`BilevelProblem.local_sgd`'s kind: the exact reduction's
    summation groups sum it by one GEMM of the group's factors (:meth:`group_sum`) and never form its rows."""

    def __init__(self, G: torch.Tensor, inputs: torch.Tensor):
        self.G, self.inputs = G, inputs

    @property
    def shape(self) -> tuple[int, int]:
        return self.G.shape[0], self.G.shape[2] * (self.inputs.shape[2] + 1)

    @property
    def dtype(self) -> torch.dtype:
        return self.G.dtype

    @property
    def device(self) -> torch.device:
        return self.G.device

    @property
    def compact(self) -> bool:
        """Whether the factors hold fewer numbers than the rows (few samples against a wide layer)."""
        return self.G.shape[1] * (self.G.shape[2] + self.inputs.shape[2]) < self.shape[1]

    def __getitem__(self, index: slice) -> OuterProductRows:
        return OuterProductRows(self.G[index], self.inputs[index])

    def part(self, lo: int, hi: int) -> OuterProductRows:
        return self[lo:hi]

    def dense(self, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """The rows of clients lo..hi-1; a block of one client as two copies of it (``bmm`` multiplies a batch
        of one by another kernel), so each row has the same bits in any block."""
        G, inputs = self.G[lo:hi], self.inputs[lo:hi]
        if G.shape[0] == 1:
            return _weight_and_bias_rows(torch.cat([G, G]), torch.cat([inputs, inputs]))[:1]
        return _weight_and_bias_rows(G, inputs)

    def weighted_sum(self, w: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.shape[1], dtype=self.dtype, device=self.device)
        self.group_sum(0, self.shape[0], w, out)
        return out

    def row_norms(self) -> torch.Tensor:
        """Each client's row norm from its factors (:func:`~fednest_mpi.problems.kernels.gram_norms`: K x K Gram
        matrices for the weights, ||sum_j G_j|| for the biases), in the rows' dtype."""
        bias = self.G.sum(1).to(torch.float64).square().sum(1)
        return gram_norms([(self.G, self.inputs)], bias).to(self.dtype)

    def group_sum(self, lo: int, hi: int, w: torch.Tensor, out: torch.Tensor) -> None:
        """sum_i w_i row_i over clients lo..hi-1 into ``out`` (d,): one GEMM of the clients' (K terms each)
        w-scaled G and inputs, whose shape depends on the clients only; the bias part one sum of the scaled G."""
        n_out, n_in = self.G.shape[2], self.inputs.shape[2]
        scaled = (self.G[lo:hi] * w[:, None, None]).flatten(0, 1)
        torch.mm(scaled.T, self.inputs[lo:hi].flatten(0, 1), out=out[: n_out * n_in].view(n_out, n_in))
        torch.sum(scaled, 0, out=out[n_out * n_in :])


def linear_uniform(seed: int, tag: int, n: int, fan_in: int, dtype, device) -> torch.Tensor:
    """n numbers U(-1/sqrt(fan_in), 1/sqrt(fan_in)) keyed by (seed, INIT, tag): PyTorch's default Linear init."""
    u = rng.uniform(rng.key(seed, rng.Purpose.INIT, tag), n)
    return torch.as_tensor((2 * u - 1) / math.sqrt(fan_in), dtype=dtype, device=device)


def head_side_bytes(problem: BilevelProblem, splits, n_inputs: int, hidden: int, n_classes: int) -> int:
    """The y-side working set per client (:meth:`BilevelProblem.y_side_bytes`) of a body with a linear
    head: 16 rows of y (iterates, gradients, the tangents of Hessian products, FedInn's SVRG pair) and,
    per sample of the client's widest split (of the ``ClientSplit`` s ``splits``), its gathered inputs
    once and its features and logits with their gradients and tangents. The body's product with x runs
    once per x over these inputs, its features kept in a :class:`FeatureStore`."""
    width = max(part.index.shape[1] for part in splits)
    itemsize = getattr(problem, "dtype", torch.float64).itemsize  # as BilevelProblem.client_bytes reads it
    return itemsize * (16 * problem.dim_y + width * (n_inputs + 4 * (hidden + n_classes)))


def factored_rows_bytes(problem: BilevelProblem, splits, n_inputs: int, hidden: int, n_classes: int) -> int | None:
    """The working set per client of :meth:`RepresentationProblem.hypergradient_rows`
    (:meth:`BilevelProblem.factored_rows_bytes`): the y side's (:func:`head_side_bytes`) plus, per sample of both
    splits (of the ``ClientSplit`` s ``splits``), its gathered inputs and its factors (the gradient at the hidden
    layer and the inputs, twice: the outer and the inner batch, then their concatenation). None where the factors
    are not the smaller (the rows are made dense: the default estimate)."""
    K = sum(part.index.shape[1] for part in splits)
    if K * (hidden + n_inputs) >= hidden * (n_inputs + 1):
        return None
    itemsize = getattr(problem, "dtype", torch.float64).itemsize
    return head_side_bytes(problem, splits, n_inputs, hidden, n_classes) + itemsize * 3 * K * (n_inputs + hidden)


class FeatureStore:
    """Hidden features relu(A W1^T + b1) of whole client splits for **one** shared x, in blocks.

    Every oracle of an outer iteration sees the same x (FedInn freezes it; the hypergradient,
    FedIHGP included, is taken at it), but on several client sets (FedInn's, FedOut's, FedIHGP's
    fresh S_n): a client drawn again reads its rows instead of recomputing them. An entry is valid
    while x is the same storage at the same version (the store holds a reference to x, so the
    storage cannot be reused); a new x empties it. Features are kept as the (B, width, H) blocks
    they were computed in (padding rows zero), the oldest evicted first beyond the newest block
    plus :data:`FEATURE_BUDGET_BYTES`; a request for exactly a stored block's clients returns
    the block itself (no copy), any other set is assembled from the blocks holding its clients
    (vectorised per block, no per-client Python loop). The last assembled set is remembered, so
    FedInn's minibatch steps gather from it directly.
    """

    def __init__(self):
        self.x = None  # (x, version) the blocks belong to
        self.blocks: list[tuple[object, np.ndarray, torch.Tensor]] = []  # (split, clients, (B, width, H)), oldest first
        self.assembled = None  # ((split, clients bytes, width), (B, width, H))

    def matches(self, x) -> bool:
        return self.x is not None and self.x[0].data_ptr() == x.data_ptr() and self.x[1] == x._version

    def reset(self, x) -> None:
        self.x, self.assembled = (x, x._version), None
        self.blocks.clear()

    def lookup(self, split, clients: np.ndarray, width: int):
        key = (split, clients.tobytes(), width)
        if self.assembled is not None and self.assembled[0] == key:
            return self.assembled[1]
        for s, ids, feats in reversed(self.blocks):
            if s == split and feats.shape[1] == width and np.array_equal(ids, clients):
                self.assembled = (key, feats)
                return feats
        return None

    def missing(self, split, clients: np.ndarray) -> np.ndarray:
        """The clients of ``clients`` in no block of ``split``: one membership test against the
        blocks' ids together (one per block cost a sort each, ~7 % of a many-clients round)."""
        held = [ids for s, ids, _ in self.blocks if s == split]
        if not held:
            return clients
        return clients[~np.isin(clients, np.concatenate(held))]

    def add(self, split, clients: np.ndarray, counts: np.ndarray, features: torch.Tensor) -> None:
        """Keep a block of (B, width, H) features; rows at or beyond a client's count are zeroed (no
        pass over the block when every client fills the width, e.g. Synthetic's fixed sizes)."""
        pad = np.arange(features.shape[1])[None, :] >= counts[:, None]
        if pad.any():
            features.masked_fill_(torch.as_tensor(pad, device=features.device)[..., None], 0.0)
        self.blocks.append((split, clients.copy(), features))

    def assemble(self, split, clients: np.ndarray, width: int, hidden: int, like: torch.Tensor) -> torch.Tensor:
        """(B, width, H): each client's rows from the newest block holding it, zero rows as padding;
        then the blocks beyond the budget are dropped (the newest one stays)."""
        out = self.lookup(split, clients, width)
        if out is None:
            out = self._gather(split, clients, width, hidden, like)
            self.assembled = ((split, clients.tobytes(), width), out)
        self._evict()
        return out

    def _gather(self, split, clients: np.ndarray, width: int, hidden: int, like: torch.Tensor) -> torch.Tensor:
        out = like.new_zeros(clients.size, width, hidden)
        todo = np.ones(clients.size, dtype=bool)
        for s, ids, feats in reversed(self.blocks):
            if s != split or not todo.any():
                continue
            order = np.argsort(ids, kind="stable")
            at = np.minimum(np.searchsorted(ids, clients, sorter=order), ids.size - 1)
            take = todo & (ids[order[at]] == clients)
            if take.any():
                w = min(width, feats.shape[1])
                dest = torch.as_tensor(np.flatnonzero(take), device=out.device)
                src = torch.as_tensor(order[at[take]], device=out.device)
                out[:, :w].index_copy_(0, dest, feats[:, :w].index_select(0, src))
                todo &= ~take
        return out

    def _evict(self) -> None:
        """Drop the oldest blocks beyond the newest one and the budget."""
        sizes = [f.numel() * f.element_size() for _, _, f in self.blocks]
        while len(self.blocks) > 1 and sum(sizes[:-1]) > FEATURE_BUDGET_BYTES:
            self.blocks.pop(0)
            sizes.pop(0)


class RepresentationProblem(BilevelProblem):
    """x = representation layer d -> H, y = linear head H -> C; see the module docstring.

    Subclasses set ``cfg`` (fields ``hidden``, ``dropout``, ``batch_size``,
    ``hypergradient_batch_size``, ``inner_regularization``), ``seed``, ``device``, ``dtype``,
    ``test_inputs``/``test_targets`` (the evaluation set) and call :meth:`_set_shape`.
    """

    fresh_outputs = True  # hvp_yy_inner: a new (B, d2) sum per call
    inner: object
    outer: object
    cfg: Any
    seed: int
    device: torch.device
    dtype: torch.dtype

    def _set_shape(self, n_inputs: int, hidden: int, n_classes: int) -> None:
        self.n_inputs, self.hidden, self.n_classes = n_inputs, hidden, n_classes
        self.dim_x, self.dim_y = hidden * n_inputs + hidden, n_classes * hidden + n_classes
        self._features = FeatureStore()  # see _features_of
        self._last_batch = None  # see _batch
        self._last_minibatch = None  # see _minibatch

    @abstractmethod
    def _locate(self, split, clients: np.ndarray):
        """(ClientSplit, rows of ``clients`` in it, inputs (n, d), targets (n,)) for a split handle."""

    # -- parameters ----------------------------------------------------------------------------
    def _unpack_x(self, x):
        h, d = self.hidden, self.n_inputs
        return x[:, : h * d].reshape(-1, h, d), x[:, h * d :]

    def _unpack_y(self, y):
        h, c = self.hidden, self.n_classes
        return y[:, : c * h].reshape(-1, c, h), y[:, c * h :]

    def initial_point(self):
        """PyTorch's default Linear initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), keyed by the seed."""
        return (
            linear_uniform(self.seed, 1, self.dim_x, self.n_inputs, self.dtype, self.device),
            linear_uniform(self.seed, 2, self.dim_y, self.hidden, self.dtype, self.device),
        )

    # -- forward and the pieces every oracle needs -----------------------------------------------
    def _hidden(self, A, x):
        """Pre-activations A W1^T + b1 for (B, b, d) inputs and x rows (one GEMM when x is shared)."""
        W1, b1 = self._unpack_x(x)
        if is_shared(x):
            return rowwise_linear(A, W1[0].T, b1[0])
        return torch.baddbmm(b1[:, None, :], A, W1.transpose(1, 2))

    @contextmanager
    def outer_fixed(self, clients, x):
        """While x is frozen (FedInn), the hidden features of the clients' inner splits are computed
        once, now (one GEMM), and every local step only gathers its minibatch rows: the d x H
        product leaves the local-step loop (see :meth:`_features_of`)."""
        clients = np.asarray(clients, dtype=np.int64)
        self._features_of(self.inner, clients, shared_rows(x, len(clients)), create=True)
        yield

    def _features_of(self, split, clients, x, create: bool):
        """relu(A W1^T + b1) of the **whole** split of ``clients`` for a shared row ``x`` (stride 0),
        without dropout, as (B, width, H) with zero rows as padding; None otherwise.

        Kept in a :class:`FeatureStore` while x is unchanged, per client: whole-split oracles at
        the same x (FedIHGP products, the hypergradient) compute only the rows of clients not seen
        at this x, in one GEMM (all of the set's rows when more than 90 % are new: a seen client's
        rows are copied, H numbers a sample, about a tenth of the cost of recomputing them, d H
        multiply-adds a sample). ``create``: compute the missing rows;
        otherwise None when any is missing.
        """
        if self.cfg.dropout > 0 or not is_shared(x):
            return None
        store = self._features
        if not store.matches(x):
            if not create:
                return None
            store.reset(x)
        part, rows, inputs, _ = self._locate(split, clients)
        width = part.index.shape[1]
        hit = store.lookup(split, clients, width)
        if hit is not None:
            return hit
        missing = store.missing(split, clients)
        if missing.size:
            if not create:
                return None
            if 10 * missing.size > 9 * clients.size:  # (nearly) all new: one block of the whole set (no gather copy)
                missing = clients
            part, rows, inputs, _ = self._locate(split, missing)
            cols = np.broadcast_to(np.arange(part.index.shape[1]), (len(rows), part.index.shape[1]))
            pos = torch.as_tensor(part.positions(rows, cols), device=self.device)
            store.add(split, missing, part.count[rows], torch.relu(self._hidden(_rows(inputs, pos), x)))
        return store.assemble(split, clients, width, self.hidden, x)

    def _cached_features(self, split, clients, x):
        """The cached features of (split, clients, x), or None (no computation)."""
        return self._features_of(split, np.asarray(clients, dtype=np.int64), x, create=False)

    def _forward(self, split, clients, x, y, sample, batch_size, need_x=False):
        """Everything the oracles need for the (mini)batches of ``clients``: the y-independent part
        (:meth:`_minibatch`) and the head's logits and softmax at ``y``."""
        s = self._minibatch(split, np.asarray(clients, dtype=np.int64), x, sample, batch_size, need_x)
        W2, b2 = self._unpack_y(y)
        logits = torch.baddbmm(b2[:, None, :], s["H"], W2.transpose(1, 2))
        return s | {"W2": W2, "P": softmax_(logits.clone()), "logits": logits}

    def _minibatch(self, split, clients, x, sample, batch_size, need_x):
        """Inputs A (when the features are computed here, or ``need_x``), weights, pre-activations,
        dropout mask, features H and one-hot labels of the (mini)batches of ``clients`` at ``x``.

        Remembered for one call: FedInn's SVRG step evaluates the same minibatch at the same x and
        two y (Alg. 4), so the second call gathers nothing. The entry holds x (its storage cannot be
        reused) and matches only the same storage at the same version."""
        key = (split, clients.tobytes(), sample, batch_size, need_x)
        memo = self._last_minibatch
        if memo is not None and memo[0] == key and memo[1] is x and memo[2] == x._version:
            return memo[3]
        part, rows, inputs, targets = self._locate(split, clients)
        cols, weights = self._batch(part, rows, clients, sample, batch_size)
        pos = torch.as_tensor(part.positions(rows, cols), device=self.device)
        t = _rows(targets, pos)
        w = torch.as_tensor(weights, dtype=self.dtype, device=self.device)
        whole = sample is None or batch_size <= 0
        cached = self._features_of(split, clients, x, create=whole)
        if cached is not None:  # x shared and unchanged: no input pass
            drop = None
            A = _rows(inputs, pos) if need_x else None
            if whole:
                H = cached
            else:
                flat = torch.as_tensor(cols + np.arange(len(cols))[:, None] * cached.shape[1], device=self.device)
                H = cached.flatten(0, 1).index_select(0, flat.flatten()).reshape(*cols.shape, -1)
            pre = H  # only its sign is used: relu(z) > 0 exactly where z > 0
        else:
            A = _rows(inputs, pos)  # (B, b, d)
            pre = self._hidden(A, x)
            drop = self._dropout(clients, sample, pre.shape) if self.cfg.dropout > 0 else None
            if drop is not None:
                pre = pre * drop
            H = torch.relu(pre)
        E = torch.nn.functional.one_hot(t, self.n_classes).to(self.dtype)
        s = {"A": A, "w": w, "pre": pre, "drop": drop, "H": H, "E": E}
        self._last_minibatch = (key, x, x._version, s)
        return s

    def _batch(self, part, rows, clients, sample, batch_size):
        """``part.batch(...)``, remembered for one call: FedInn's SVRG step evaluates the same
        minibatch at y_i and at the anchor y (Alg. 4), so the second draw is free. The key holds
        everything the draw depends on."""
        key = (clients.tobytes(), part.count[rows].tobytes(), part.index.shape[1], sample, batch_size)
        if self._last_batch is not None and self._last_batch[0] == key:
            return self._last_batch[1]
        out = part.batch(rows, clients, sample, batch_size)
        self._last_batch = (key, out)
        return out

    def _dropout(self, clients, sample, shape):
        step = -1 if sample is None else sample.step
        key = 0 if sample is None else sample.key
        u = rng.uniform(rng.key(key, step, clients, _DROPOUT_TAG), shape[1] * shape[2]).reshape(shape)
        keep = 1.0 - self.cfg.dropout
        return torch.as_tensor((u < keep) / keep, dtype=self.dtype, device=self.device)

    def _backprop_x(self, s, grad_h):
        """nabla_x of sum_j <grad_h_j, h_j>: through the ReLU and dropout to (W1, b1)."""
        return _weight_and_bias_rows(self._gate(s, grad_h), s["A"])

    @staticmethod
    def _gate(s, grad_h):
        """The per-sample gradient at the hidden layer's pre-activations: through the ReLU and dropout."""
        dz = grad_h * (s["pre"] > 0)
        if s["drop"] is not None:
            dz = dz * s["drop"]
        return dz

    def _head_grad(self, s, G):
        """(W2, b2) gradient for per-sample logit gradients G (B, b, C)."""
        return _weight_and_bias_rows(G, s["H"])

    def _residual(self, s):
        return (s["P"] - s["E"]) * s["w"][..., None]

    def _glm_hessian(self, s, v):
        V2, vb2 = self._unpack_y(v)
        U = torch.baddbmm(vb2[:, None, :], s["H"], V2.transpose(1, 2))
        P = s["P"]
        return P * U - P * (P * U).sum(-1, keepdim=True), V2  # J u per sample

    # -- fused local steps of the head (FedInn's SVRG, LFedInn / FedAvg's SGD) ---------------------
    def _local_sgd(self, clients, x, y, steps, lr, key, anchor):
        """``steps`` local steps of the head from the shared y at the shared x (no dropout), fused:
        the features of the clients' whole inner splits are computed once (one GEMM, or read from
        the feature store), each step gathers its minibatch rows, evaluates the logits once and
        updates the clients' rows in place (``baddbmm_`` into the weight block). With the SVRG
        anchor q of FedInn (Alg. 4), the two minibatch gradients of a step share their features and
        the one-hot labels cancel:

            G_i(y_nu; B) - G_i(y; B) = sum_{j in B} m_j (p_j(y_nu) - p_j(y)) [h_j; 1]^T + lambda (y_nu - y)

        with p_j(y) of every sample computed once per call (the anchor's logits are one GEMM since
        y is shared). Same minibatches as the step-by-step oracle loop (tested equal to it)."""
        if self.cfg.dropout > 0:
            return None  # fresh dropout masks per step: the oracle loop
        clients = np.asarray(clients, dtype=np.int64)
        B = clients.size
        Y = y.expand(B, -1).clone()
        if B == 0 or steps == 0:
            return Y
        feats = self._features_of(self.inner, clients, shared_rows(x, B), create=True)  # (B, width, H)
        part, rows, _, targets = self._locate(self.inner, clients)
        width, C, lam = feats.shape[1], self.n_classes, self.cfg.inner_regularization
        flat_feats = feats.flatten(0, 1)
        W, b = self._unpack_y(Y)  # views into Y, updated in place
        if anchor is not None:
            W0, b0 = self._unpack_y(y[None])
            P0 = softmax_(rowwise_linear(flat_feats, W0[0].T, b0[0]))  # (B width, C): p_j(y) of every sample
            drift = lr * (anchor - lam * y)  # the constant part of lr * (direction - lambda y_nu)
        offsets = np.arange(B, dtype=np.int64)[:, None] * width
        Hb = G = Pb = None
        for nu in range(steps):
            cols, weights = part.batch(rows, clients, Sample(key, nu), self.cfg.batch_size)
            flat = torch.as_tensor((cols + offsets).reshape(-1), device=self.device)
            Hb = torch.index_select(flat_feats, 0, flat, out=Hb) if Hb is not None else flat_feats.index_select(0, flat)
            Hb3 = Hb.view(B, cols.shape[1], -1)
            G = torch.baddbmm(b[:, None, :], Hb3, W.transpose(1, 2), out=G)
            softmax_(G)
            if anchor is not None:
                Pb = torch.index_select(P0, 0, flat, out=Pb) if Pb is not None else P0.index_select(0, flat)
                G.sub_(Pb.view_as(G))
            else:
                pos = torch.as_tensor(part.positions(rows, cols), device=self.device)
                G.view(-1, C).scatter_add_(1, _rows(targets, pos).view(-1, 1), G.new_full((G.numel() // C, 1), -1.0))
            G.mul_(torch.as_tensor(weights, dtype=self.dtype, device=self.device)[..., None])
            if lam:
                Y.mul_(1.0 - lr * lam)
            if anchor is not None:
                Y.sub_(drift)
            W.baddbmm_(G.transpose(1, 2), Hb3, alpha=-lr)
            b.sub_(G.sum(1), alpha=lr)
        return Y

    # -- oracles -------------------------------------------------------------------------------
    def _grad_y_inner(self, clients, x, y, sample):
        s = self._forward(self.inner, clients, x, y, sample, self.cfg.batch_size)
        return self._head_grad(s, self._residual(s)) + self.cfg.inner_regularization * y

    def _grad_y_outer(self, clients, x, y, sample):
        s = self._forward(self.outer, clients, x, y, sample, self.cfg.hypergradient_batch_size)
        return self._head_grad(s, self._residual(s))

    def _grad_x_outer(self, clients, x, y, sample):
        s = self._forward(self.outer, clients, x, y, sample, self.cfg.hypergradient_batch_size, need_x=True)
        return self._backprop_x(s, torch.bmm(self._residual(s), s["W2"]))

    def _hvp_yy_inner(self, clients, x, y, v, sample):
        s = self._forward(self.inner, clients, x, y, sample, self.cfg.hypergradient_batch_size)
        Ju, _ = self._glm_hessian(s, v)
        return self._head_grad(s, Ju * s["w"][..., None]) + self.cfg.inner_regularization * v

    def _jvp_xy_inner(self, clients, x, y, v, sample):
        s = self._forward(self.inner, clients, x, y, sample, self.cfg.hypergradient_batch_size, need_x=True)
        Ju, V2 = self._glm_hessian(s, v)
        grad_h = torch.bmm(self._residual(s), V2) + torch.bmm(Ju * s["w"][..., None], s["W2"])
        return self._backprop_x(s, grad_h)

    def hypergradient_rows(self, clients, x, y, v, outer_sample, jvp_sample) -> OuterProductRows | None:
        """The clients' hypergradient directions nabla_x f_i(x, y) - nabla^2_xy g_i(x, y) v (FedNest eq. (8)),
        factored (:class:`OuterProductRows`: the outer batch's and, negated, the inner batch's per-sample
        gradients at the hidden layer and inputs), for the exact reduction's summation groups; counted as the
        two oracles; made dense where the factors are not the smaller (many samples against a narrow layer). None
        where a subclass computes either oracle its own way."""
        if not self._own_directions():
            return None
        clients = np.asarray(clients)
        self.oracle_counts["grad_x_outer"] += len(clients)
        self.oracle_counts["jvp_xy_inner"] += len(clients)
        rows = _one_client_as_two(self._hypergradient_factors, clients, x, y, v, outer_sample, jvp_sample)
        return rows if rows.compact else rows.dense()

    def gradient_rows(self, oracle: str, clients, x, y, sample) -> GradientRows | None:
        """nabla_y g_i (``oracle = "grad_y_inner"``) or nabla_y f_i (``"grad_y_outer"``) of the head at the shared
        y, factored (:class:`~fednest_mpi.problems.mlp.GradientRows`: the logit gradients against the features,
        and lambda y shared for g), for the exact reduction's summation groups; counted as the oracle. None where
        the factors are not the smaller (the oracle's dense rows then), y is not shared or a subclass computes
        the oracle its own way."""
        if getattr(type(self), "_" + oracle) is not getattr(RepresentationProblem, "_" + oracle) or not is_shared(y):
            return None
        inner = oracle == "grad_y_inner"
        split, batch = (self.inner, self.cfg.batch_size) if inner else (self.outer, self.cfg.hypergradient_batch_size)
        if not self._head_factors_compact(split, sample, batch):
            return None
        self.oracle_counts[oracle] += len(clients)
        return _one_client_as_two(self._head_rows, np.asarray(clients), split, x, y, sample, batch, None, inner)

    def hvp_rows(self, clients, x, y, v, sample) -> GradientRows | None:
        """nabla^2_yy g_i v of :meth:`hvp_yy_inner`, factored (the GLM Hessian's logit terms against the features,
        lambda v shared) for the summation groups; counted as the oracle; None as in :meth:`gradient_rows`."""
        own = type(self)._hvp_yy_inner is RepresentationProblem._hvp_yy_inner
        batch = self.cfg.hypergradient_batch_size
        if not own or not (is_shared(y) and is_shared(v)) or not self._head_factors_compact(self.inner, sample, batch):
            return None
        self.oracle_counts["hvp_yy_inner"] += len(clients)
        return _one_client_as_two(self._head_rows, np.asarray(clients), self.inner, x, y, sample, batch, v, True)

    def _head_factors_compact(self, split, sample, batch: int) -> bool:
        """Whether a client's head factors (K samples' logit terms and features: its whole split, or a minibatch)
        hold fewer numbers than its row."""
        width = self._split_width(split)
        K = width if sample is None or batch <= 0 else min(width, batch)
        return K * (self.n_classes + self.hidden) < self.dim_y

    def _split_width(self, split) -> int:
        """Samples per client of ``split``, padded (the population's widest client): a ``ClientSplit``'s columns."""
        return int(split.index.shape[1])

    def _head_rows(self, clients, split, x, y, sample, batch, v, regularized: bool) -> GradientRows:
        """The factored head rows of :meth:`gradient_rows` (``v`` None) or :meth:`hvp_rows`; ``regularized``: g's
        lambda y (or lambda v) as the shared row, else zeros (f)."""
        s = self._forward(split, clients, x, y, sample, batch)
        G = self._residual(s) if v is None else self._glm_hessian(s, v)[0] * s["w"][..., None]
        shared = self.cfg.inner_regularization * (y if v is None else v)[0] if regularized else torch.zeros_like(y[0])
        return GradientRows([(G, s["H"], G.sum(1))], shared)

    def _own_directions(self) -> bool:
        """Whether both oracles of the hypergradient direction are this class's closed forms (a subclass may
        compute either its own way; :meth:`hypergradient_rows` factors these only)."""
        own = RepresentationProblem
        return type(self)._grad_x_outer is own._grad_x_outer and type(self)._jvp_xy_inner is own._jvp_xy_inner

    def _hypergradient_factors(self, clients, x, y, v, outer_sample, jvp_sample) -> OuterProductRows:
        batch = self.cfg.hypergradient_batch_size
        s = self._forward(self.outer, clients, x, y, outer_sample, batch, need_x=True)
        G_f, A_f = self._gate(s, torch.bmm(self._residual(s), s["W2"])), s["A"]
        s = self._forward(self.inner, clients, x, y, jvp_sample, batch, need_x=True)
        Ju, V2 = self._glm_hessian(s, v)
        G_j = self._gate(s, torch.bmm(self._residual(s), V2) + torch.bmm(Ju * s["w"][..., None], s["W2"]))
        return OuterProductRows(torch.cat([G_f, -G_j], 1), torch.cat([A_f, s["A"]], 1))

    def _cross_entropy(self, split, clients, x, y) -> torch.Tensor:
        """Mean cross-entropy of each client's whole split, shape (B,)."""
        s = self._forward(split, clients, x, y, None, 0)
        return -(s["w"] * (torch.log_softmax(s["logits"], dim=-1) * s["E"]).sum(-1)).sum(1)

    def inner_value(self, clients, x, y):
        """g_i(x, y): cross-entropy on the whole inner split + (lambda/2) ||y||^2 (not counted)."""
        return self._cross_entropy(self.inner, clients, x, y) + 0.5 * self.cfg.inner_regularization * squared_norms(y)

    def outer_value(self, clients, x, y):
        """f_i(x, y): cross-entropy on the whole outer split (not counted)."""
        return self._cross_entropy(self.outer, clients, x, y)

    def correct_counts(self, clients, x, y):
        """(correct, total) predictions of the global-model head on each client's inner split."""
        s = self._forward(self.inner, clients, x, y, None, 0)
        valid = s["w"] > 0
        hit = (s["logits"].argmax(-1) == s["E"].argmax(-1)) & valid
        return hit.sum(1), valid.sum(1)

    # -- evaluation ----------------------------------------------------------------------------
    def predict_logits(self, x, y, inputs):
        """Logits of the global model (x, y) on (n, d) inputs, in chunks (no dropout)."""
        W1, b1 = self._unpack_x(x[None])
        W2, b2 = self._unpack_y(y[None])
        return torch.cat([torch.relu(chunk @ W1[0].T + b1[0]) @ W2[0].T + b2[0] for chunk in inputs.split(_EVAL_CHUNK)])

    def evaluate(self, x, y):
        logits = self.predict_logits(x, y, self.test_inputs)
        loss = torch.nn.functional.cross_entropy(logits, self.test_targets)
        acc = (logits.argmax(1) == self.test_targets).to(torch.float64).mean()
        return {"test_accuracy": 100.0 * float(acc), "test_loss": float(loss)}
