"""Closed-form oracles of a ReLU MLP whose weights are **shared** by a block of C clients (no MPI, no
autograd): the common case of FedNest's aggregation rounds, where every client evaluates the global
y (FedInn's SVRG anchor and its gradients at y, FedIHGP's products, FedOut's Jacobian products).

Layers l = 1..L: z_l = h_{l-1} W_l^T + b_l, h_l = relu(z_l), h_0 = the client's samples (C, b, in);
the loss of client i is a weighted sum over its b samples of a function of the outputs z_L whose
gradient G (C, b, out) the caller supplies. With shared weights every product with W_l is one GEMM
over the C b rows of the block; only the per-client weight gradients sum_j delta_j^T h_j are batched
products (:func:`client_gradients`), written into the output rows.

Second order by Pearlmutter's R-operator along a shared direction V (same layout as the weights):

    R{z_l} = h_{l-1} V_l^T + R{h_{l-1}} W_l^T + v_l,       R{h_l} = 1[z_l > 0] R{z_l}
    R{delta_{l-1}} = 1[z_{l-1} > 0] (R{delta_l} W_l + delta_l V_l)          (relu'' = 0 a.e.)
    R{grad W_l} = sum_j R{delta_l}_j^T h_{l-1,j} + delta_{l,j}^T R{h_{l-1}}_j,  R{grad b_l} = sum_j R{delta_l}_j

so H v (eq. (10b)'s products) costs about two forward and two backward passes of the block
(checked against double-backward autograd in ``tests/unit/test_losstuning.py``).
"""

from __future__ import annotations

import torch

from fednest_mpi.problems.kernels import gram_norms, rowwise_linear

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # [(W_l (out, in), b_l (out,))]


def linear(h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """h W^T for (C, b, in) rows and shared (out, in) weights: GEMMs over the C b rows in fixed
    tiles (:func:`~fednest_mpi.problems.kernels.rowwise_linear`: a row's result does not depend on
    the block)."""
    return rowwise_linear(h, W.T)


def back(delta: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """delta W for (C, b, out) rows and shared (out, in) weights (row-wise, as :func:`linear`)."""
    return rowwise_linear(delta, W)


def forward(layers: Layers, A: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(inputs h_{l-1} of every layer, pre-activations z_l of every layer) for samples A (C, b, in)."""
    inputs, pre = [], []
    h = A
    for j, (W, b) in enumerate(layers):
        inputs.append(h)
        z = linear(h, W).add_(b)
        pre.append(z)
        if j < len(layers) - 1:
            h = torch.relu(z)
    return inputs, pre


def backward(layers: Layers, pre: list[torch.Tensor], G: torch.Tensor) -> list[torch.Tensor]:
    """delta_l = dLoss/dz_l of every layer from G = dLoss/dz_L."""
    deltas = [G]
    for j in range(len(layers) - 1, 0, -1):
        deltas.insert(0, back(deltas[0], layers[j][0]).mul_(pre[j - 1] > 0))
    return deltas


def client_gradients(
    inputs: list[torch.Tensor],
    deltas: list[torch.Tensor],
    out: torch.Tensor,
    r_inputs: list[torch.Tensor] | None = None,
    r_deltas: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Per-client parameter gradients into ``out`` (C, d), layout [W_1, b_1, W_2, b_2, ...]:
    sum_j delta_j^T h_j and sum_j delta_j; with ``r_inputs``/``r_deltas`` their R-derivatives
    sum_j R{delta}_j^T h_j + delta_j^T R{h}_j and sum_j R{delta}_j instead."""
    at = 0
    C = out.shape[0]
    for j, (h, delta) in enumerate(zip(inputs, deltas)):
        n_out, n_in = delta.shape[-1], h.shape[-1]
        rows = out[:, at : at + n_out * n_in].view(C, n_out, n_in)
        bias = out[:, at + n_out * n_in : at + n_out * n_in + n_out]
        if r_deltas is None:
            rows.baddbmm_(delta.transpose(1, 2), h, beta=0.0)
            bias.copy_(delta.sum(1))
        else:
            assert r_inputs is not None
            left = torch.cat([r_deltas[j], delta], dim=1).transpose(1, 2)  # (C, out, 2b)
            rows.baddbmm_(left, torch.cat([h, r_inputs[j]], dim=1), beta=0.0)  # right: (C, 2b, in)
            bias.copy_(r_deltas[j].sum(1))
        at += n_out * n_in + n_out
    return out


class GradientRows:
    """Per-client rows ``shared + scale * F_i`` in the layout of :func:`client_gradients` (F_i = [sum_j L_j^T R_j
    (row-major), b_j] per layer), held factored: per layer L (C, K, out), R (C, K, in) with K terms per client
    (the same K for every client) and b (C, out), a (d,) row shared by every client and a scalar. A factored form
    of :meth:`BilevelProblem.local_sgd`'s kind: the exact reduction's summation groups sum it by one GEMM per
    layer of the group's factors (:meth:`group_sum`) and never form its rows."""

    def __init__(self, factors: list, shared: torch.Tensor, scale: float = 1.0):
        self.factors, self.shared, self.scale = factors, shared, scale  # factors: (L, R, b) per layer

    @property
    def shape(self) -> tuple[int, int]:
        return self.factors[0][0].shape[0], int(self.shared.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return self.shared.dtype

    @property
    def device(self) -> torch.device:
        return self.shared.device

    @property
    def compact(self) -> bool:
        """Whether the factors hold fewer numbers than the rows (few samples against wide layers)."""
        return sum(L.shape[1] * (L.shape[2] + R.shape[2]) for L, R, _ in self.factors) < self.shape[1]

    def __getitem__(self, index: slice) -> GradientRows:
        return GradientRows([(L[index], R[index], b[index]) for L, R, b in self.factors], self.shared, self.scale)

    def part(self, lo: int, hi: int) -> GradientRows:
        return self[lo:hi]

    def plus_scaled(self, row: torch.Tensor, c: float) -> GradientRows:
        """The rows ``row + c * self`` (FedIHGP's r - eta Hr with c = -eta), still factored."""
        return GradientRows(self.factors, torch.add(row, self.shared, alpha=c), c * self.scale)

    def dense(self, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """The rows of clients lo..hi-1; a block of one client as two copies of it (``baddbmm`` multiplies a
        batch of one by another kernel), so each row has the same bits in any block."""
        part = self[lo:hi]
        C = part.shape[0]
        if C == 1:
            twice = GradientRows(
                [(torch.cat([L, L]), torch.cat([R, R]), torch.cat([b, b])) for L, R, b in part.factors],
                self.shared,
                self.scale,
            )
            return twice.dense()[:1]
        out = torch.empty(C, part.shape[1], dtype=self.dtype, device=self.device)
        at = 0
        for L, R, b in part.factors:
            n_out, n_in = L.shape[2], R.shape[2]
            out[:, at : at + n_out * n_in].view(C, n_out, n_in).baddbmm_(L.transpose(1, 2), R, beta=0.0)
            out[:, at + n_out * n_in : at + n_out * n_in + n_out] = b
            at += n_out * n_in + n_out
        return out.mul_(self.scale).add_(self.shared)

    def weighted_sum(self, w: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.shape[1], dtype=self.dtype, device=self.device)
        self.group_sum(0, self.shape[0], w, out)
        return out

    def shared_row(self) -> torch.Tensor:
        """The (d,) row every client's row holds once."""
        return self.shared

    def row_norms(self) -> torch.Tensor:
        """Each client's row norm from its factors, in float64 (:func:`~fednest_mpi.problems.kernels.gram_norms`):
        ||shared + s F||^2 = ||shared||^2 + 2 s <shared, F> + s^2 ||F||^2 per layer, <S, L^T R> = sum((L S) o R)
        and ||L^T R||^2 from K x K Gram matrices: no out x in product per client. In the rows' dtype."""
        C, s, at = self.shape[0], self.scale, 0
        plain = torch.zeros(C, dtype=torch.float64, device=self.device)
        for L, R, b in self.factors:
            n_out, n_in = L.shape[2], R.shape[2]
            S_w = self.shared[at : at + n_out * n_in].view(n_out, n_in)
            S_b = self.shared[at + n_out * n_in : at + n_out * n_in + n_out]
            cross = (rowwise_linear(L, S_w) * R).sum((1, 2)).to(torch.float64)  # each row alone: any block
            plain = plain + 2 * s * cross + (S_b.to(torch.float64) + s * b.to(torch.float64)).square().sum(1)
            plain = plain + S_w.to(torch.float64).square().sum()
            at += n_out * n_in + n_out
        return gram_norms([(s * L, R) for L, R, _ in self.factors], plain).to(self.dtype)

    def group_sum(self, lo: int, hi: int, w: torch.Tensor, out: torch.Tensor, shared: bool = True) -> None:
        """sum_i w_i row_i over clients lo..hi-1 into ``out`` (d,): per layer one GEMM of the clients' scaled L
        and R (a shape that depends on the clients only) and one product for the biases, then sum(w) shared
        (``shared=False``: not that; the caller adds it once for all groups)."""
        ws = w * self.scale
        at = 0
        for L, R, b in self.factors:
            n_out, n_in = L.shape[2], R.shape[2]
            scaled = (L[lo:hi] * ws[:, None, None]).flatten(0, 1)
            torch.mm(scaled.T, R[lo:hi].flatten(0, 1), out=out[at : at + n_out * n_in].view(n_out, n_in))
            out[at + n_out * n_in : at + n_out * n_in + n_out] = ws @ b[lo:hi]
            at += n_out * n_in + n_out
        if shared:
            out.add_(self.shared, alpha=float(w.sum()))


def r_forward(
    layers: Layers, direction: Layers, inputs: list[torch.Tensor], pre: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(R{h_{l-1}} of every layer, R{z_l} of every layer) along the shared ``direction``."""
    r_inputs, r_pre = [], []
    r_h = torch.zeros_like(inputs[0])
    for j, ((W, _), (V, v)) in enumerate(zip(layers, direction)):
        r_inputs.append(r_h)
        r_z = linear(inputs[j], V).add_(v)
        if j:
            r_z.add_(linear(r_h, W))
        r_pre.append(r_z)
        if j < len(layers) - 1:
            r_h = r_z * (pre[j] > 0)
    return r_inputs, r_pre


def r_backward(
    layers: Layers, direction: Layers, pre: list[torch.Tensor], deltas: list[torch.Tensor], r_G: torch.Tensor
) -> list[torch.Tensor]:
    """R{delta_l} of every layer from R{G} (the R-derivative of dLoss/dz_L)."""
    r_deltas = [r_G]
    for j in range(len(layers) - 1, 0, -1):
        r = back(r_deltas[0], layers[j][0]).add_(back(deltas[j], direction[j][0]))
        r_deltas.insert(0, r.mul_(pre[j - 1] > 0))
    return r_deltas
