"""Arithmetic (FLOP) and memory-traffic floors of one round of a benchmark case, and this core's
rates to turn them into seconds.

A round is one outer iteration of the runner. The case is described by :class:`RoundShape`: the
network as linear layers ``widths`` (d0 -> d1 -> ...), of which the first ``x_layers`` are the outer
variable x and the rest the inner variable y (loss tuning: x = 2C logit adjustments, no layer), the
mean inner / outer samples of a client, and the algorithm's steps. Counting rules (float
multiply-adds as 2 FLOP; bias, activation and loss terms are ignored as lower order):

* ``gemm(l, r) = 2 r d_l d_{l+1}``: one pass of r rows through layer l; a **gradient** with respect
  to the layers from ``lo`` on costs the forward pass through the layers from ``lo`` (the layers
  below ``lo`` are x, fixed within a round: their features are formed once per client and split,
  counted separately), one weight-gradient pass per differentiated layer and one input-gradient pass
  per differentiated layer above ``lo``: with ``lo = 0`` this is the usual fwd + bwd ~ 6 r P;
* a Hessian-vector or Jacobian-vector product by double backward (forward-over-reverse) costs two
  gradients (Pearlmutter 1994);
* FedAvg: per client ``tau`` gradients on ``b`` rows. FedNest per client and round: FedInn's SVRG
  anchor (whole inner split) and ``(1 + svrg) tau`` minibatch gradients, FedIHGP's nabla_y f on the
  outer split and ``N`` Hessian products on the inner split (``hypergradient_batch_size`` rows
  when set), FedOut's nabla_x f (outer split) and the Jacobian product (inner split), each on
  |S| clients (fresh client sets: no sharing of features between sets).

Generation floor (generated data, Synthetic): a fresh client set has no data until it is generated, and FedNest
draws ``T + N + 2`` sets per round (FedInn's T, FedIHGP's S_0 ... S_N, FedOut's), so a round generates each member's
keyed normals that many times: its samples' n_i d and its input mean's d + 2 (data.synthetic; the teacher's C d + C
and the labels' product once per client, not counted: an implementation that keeps the labels, one byte a sample,
as :class:`~fednest_mpi.data.synthetic.KnownLabels` does, pays them once per run). Seconds = normals x the
project's best measured time per keyed normal (``machine_rates``'s ``normal_seconds``). The floor an implementation
without kept samples cannot go below (issue 34: "within 1.5x of its generation + FLOP floor").

Memory-traffic floor: every local SGD step reads and writes the client's y (2 P_y elements) and
reads its minibatch (b d0); every other oracle reads x and y, writes one vector of its variable and
reads its rows once (r d0). Bytes = elements x the dtype's size. This is the floor of an
implementation that keeps per-client parameters; it ignores the aggregation and any data generation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class RoundShape:
    """What one round of a case does, as the floor formulas need it (see the module docstring)."""

    algorithm: str  # fedavg, fednest, fednest_sgd
    clients: int  # clients per round |S|
    widths: tuple[int, ...]  # linear layers d0 -> d1 -> ... -> C
    x_layers: int  # the first x_layers layers are x (0: x is not a layer)
    dim_x: int
    n_inner: float  # mean inner samples per client
    n_outer: float
    batch: int  # minibatch of the local steps
    tau: int  # local steps per inner round
    inner_rounds: int = 1
    neumann: int = 5
    hyper_batch: int = 0  # 0: the whole split
    outer_steps: int = 1
    x_in_inner: bool = True  # whether g_i depends on x (loss tuning with tune_loss = false: no)
    x_in_outer: bool = True  # whether f_i depends on x (loss tuning: no)
    element: int = 4  # bytes per number
    generated_normals: float = 0.0  # keyed normals generated per participating client and round (0: hosted data)

    @property
    def dim_y(self) -> int:
        return sum(i * o + o for i, o in zip(self.widths[self.x_layers : -1], self.widths[self.x_layers + 1 :]))

    @property
    def svrg(self) -> bool:
        return self.algorithm == "fednest"


def gemm(widths, layer: int, rows: float) -> float:
    return 2.0 * rows * widths[layer] * widths[layer + 1]


def gradient_flop(widths, lo: int, rows: float) -> float:
    """FLOP of one gradient on ``rows`` with respect to layers ``lo`` .. end (inputs to layer lo given)."""
    layers = range(lo, len(widths) - 1)
    return sum(2 * gemm(widths, j, rows) for j in layers) + sum(gemm(widths, j, rows) for j in layers if j > lo)


def features_flop(shape: RoundShape, rows: float) -> float:
    """Forward pass of ``rows`` through the x layers (formed once per client and split)."""
    return sum(gemm(shape.widths, j, rows) for j in range(shape.x_layers))


def _rows(shape: RoundShape, split_rows: float) -> float:
    return split_rows if shape.hyper_batch <= 0 else min(shape.hyper_batch, split_rows)


def flop_per_client(s: RoundShape) -> float:
    """FLOP per participating client and round (see the module docstring)."""
    W, lo = s.widths, s.x_layers
    grad = lambda rows: gradient_flop(W, lo, rows)  # noqa: E731
    if s.algorithm == "fedavg":
        return s.inner_rounds * s.tau * (features_flop(s, s.batch) + grad(s.batch))
    n_in, n_out = _rows(s, s.n_inner), _rows(s, s.n_outer)
    inner = s.inner_rounds * (
        features_flop(s, s.n_inner) + (grad(s.n_inner) if s.svrg else 0.0) + (1 + s.svrg) * s.tau * grad(s.batch)
    )
    ihgp = features_flop(s, n_out) + grad(n_out) + s.neumann * (features_flop(s, n_in) + 2 * grad(n_in))
    x_grad = (lambda rows: gradient_flop(W, 0, rows)) if lo else grad  # with x a layer: back through it
    out = x_grad(n_out) * s.x_in_outer * s.outer_steps + 2 * x_grad(n_in) * s.x_in_inner
    return inner + ihgp + out


def traffic_per_client(s: RoundShape) -> float:
    """Bytes per participating client and round (see the module docstring)."""
    P, d0 = s.dim_x + s.dim_y, s.widths[0]
    step = 2 * s.dim_y + s.batch * d0
    if s.algorithm == "fedavg":
        return s.element * s.inner_rounds * s.tau * step

    def oracle(rows, out):
        return P + out + rows * d0

    n_in, n_out = _rows(s, s.n_inner), _rows(s, s.n_outer)
    anchor = oracle(s.n_inner, s.dim_y) if s.svrg else 0.0
    inner = s.inner_rounds * (anchor + s.tau * (step + s.svrg * oracle(s.batch, s.dim_y)))
    ihgp = oracle(n_out, s.dim_y) + s.neumann * oracle(n_in, s.dim_y)
    out = oracle(n_out, s.dim_x) * s.x_in_outer * s.outer_steps + oracle(n_in, s.dim_x) * s.x_in_inner
    return s.element * (inner + ihgp + out)


def floors(shape: RoundShape) -> tuple[float, float]:
    """(FLOP, bytes) per round."""
    return shape.clients * flop_per_client(shape), shape.clients * traffic_per_client(shape)


def shape_of(cfg, n_inner: float, n_outer: float) -> RoundShape:
    """The :class:`RoundShape` of a run config (:class:`~fednest_mpi.config.RunConfig`) whose clients
    hold ``n_inner`` / ``n_outer`` samples on average."""
    p, a = cfg.problem, cfg.algorithm
    element = 4 if cfg.run.dtype == "float32" else 8
    common = dict(
        algorithm=a.name,
        clients=a.clients_per_round,
        n_inner=n_inner,
        n_outer=n_outer,
        batch=p.batch_size,
        tau=a.inner_local_steps,
        inner_rounds=getattr(a, "inner_rounds", 1),
        neumann=getattr(a, "neumann_steps", 0),
        hyper_batch=p.hypergradient_batch_size,
        outer_steps=getattr(a, "outer_local_steps", 1),
        element=element,
    )
    if p.name == "loss_tuning":
        widths = (784, *(h for h in (p.hidden1, p.hidden2) if h > 0), 10)
        return RoundShape(widths=widths, x_layers=0, dim_x=20, x_in_inner=p.tune_loss, x_in_outer=False, **common)
    d, C = (784, 10) if p.name == "hyper_representation" else (p.n_inputs, p.n_classes)
    if p.name == "synthetic" and a.name != "fedavg":
        sets = common["inner_rounds"] + common["neumann"] + 2  # FedInn's T, FedIHGP's S_0 ... S_N, FedOut's
        common["generated_normals"] = sets * ((n_inner + n_outer) * d + d + 2)
    return RoundShape(widths=(d, p.hidden, C), x_layers=1, dim_x=d * p.hidden + p.hidden, **common)


def generation_seconds(shape: RoundShape, normal_seconds: float) -> float:
    """The generation floor of a round in seconds (see the module docstring)."""
    return shape.clients * shape.generated_normals * normal_seconds


def machine_rates(size: int = 1024, copy_mib: int = 256, repeats: int = 5) -> dict[str, float]:
    """This process's best-of-``repeats`` float32 GEMM rate (``size``^3 matmul) in FLOP/s, copy
    bandwidth (bytes read + written per second, a ``copy_mib`` MiB tensor), on torch's current
    number of threads, and seconds per keyed normal (``rng.stream_normals``: 10^7 numbers from
    1,000 streams, the generation floor's rate)."""
    from fednest_mpi import rng

    keys = rng.key(0, 0, np.arange(1000))
    counts = np.full(1000, 10**4)
    rng.stream_normals(keys, counts)
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    src = torch.empty(copy_mib * 2**18)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.mm(a, b, out=out)

    def best(fn):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    return {
        "gemm_flops": 2.0 * size**3 / best(lambda: torch.mm(a, b, out=out)),
        "copy_bandwidth": 2.0 * src.numel() * src.element_size() / best(lambda: dst.copy_(src)),
        "normal_seconds": best(lambda: rng.stream_normals(keys, counts)) / counts.sum(),
    }
