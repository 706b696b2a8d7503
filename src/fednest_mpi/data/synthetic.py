"""Synthetic(alpha, beta) federated classification data (Li et al., FedProx, MLSys 2020, section 5.1).

Client i has its own softmax-regression teacher and input distribution:

    u_i ~ N(0, alpha),  W_i ~ N(u_i, 1) in R^{C x d},  b_i ~ N(u_i, 1) in R^C     (model heterogeneity)
    B_i ~ N(0, beta),   v_i ~ N(B_i, 1) in R^d                                    (input heterogeneity)
    a ~ N(v_i, Sigma),  Sigma = diag(j^{-1.2}), j = 1..d;   label t = argmax softmax(W_i a + b_i)

with d = 60 and C = 10 in the paper. alpha and beta are used as standard deviations (the FedProx
paper writes N(0, alpha) without saying which; its released generator draws with scale alpha).
alpha = beta = 0 gives clients whose teachers and inputs differ only by the N(., 1) draws;
larger values make them more heterogeneous.

Nothing is stored: everything about client i is a pure function of (seed, i), drawn from
counter-based streams keyed by :func:`fednest_mpi.rng.key` (``Purpose.PROBLEM_DATA``, client id,
stream tag) with :func:`fednest_mpi.rng.stream_normals`, so any rank can produce any client, a run
with 10^6 clients costs memory only for the clients being evaluated, and the data do not depend
on the number of ranks or on which clients are generated together (tested bitwise). Generation
is vectorised over a whole block of clients: one pass for the teachers, one for the samples, one
batched product for the labels (about 0.1 s of CPU for 6 M normals here). A caller that generates the same
clients again can keep their labels (:class:`KnownLabels`): a known client then costs its samples' normals and the
d + 2 numbers of its input mean only, the same bits.

Sample counts are ``fixed`` (n_i = n) or ``lognormal`` (n_i = clip(round(n exp(sigma z_i)), 2,
max), z_i ~ N(0, 1): a heavy-tailed, power-law-like spread with median n; FedProx uses
lognormal(4, 2) + 50).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi import rng

_MODEL, _SAMPLES, _SIZE = 0, 1, 2  # stream tags under (seed, PROBLEM_DATA, client)


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of the generator (the problem config carries the same fields)."""

    alpha: float = 1.0
    beta: float = 1.0
    n_inputs: int = 60
    n_classes: int = 10
    samples_per_client: int = 100
    size_distribution: str = "fixed"
    size_sigma: float = 2.0
    max_samples: int = 1000

    @classmethod
    def from_config(cls, cfg) -> SyntheticSpec:
        return cls(**{name: getattr(cfg, name) for name in cls.__dataclass_fields__})


def _keys(seed: int, clients: np.ndarray, tag: int, extra: int = 0) -> np.ndarray:
    return rng.key(seed, int(rng.Purpose.PROBLEM_DATA), clients, tag, extra)


def sample_counts(spec: SyntheticSpec, seed: int, clients: np.ndarray) -> np.ndarray:
    """n_i for each client id (vectorised; no per-client loop)."""
    clients = np.asarray(clients, dtype=np.int64)
    if spec.size_distribution == "fixed":
        return np.full(clients.shape, spec.samples_per_client, dtype=np.int64)
    z = rng.normal(_keys(seed, clients, _SIZE), 1)[..., 0]
    return np.clip(np.rint(spec.samples_per_client * np.exp(spec.size_sigma * z)), 2, spec.max_samples).astype(np.int64)


def _models(spec: SyntheticSpec, seed: int, clients: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W_i (B, C, d), b_i (B, C), v_i (B, d)) of the clients, float32: from each client's model
    stream, C d + C + d + 2 normals (the last two scaled by alpha and beta give u_i and B_i)."""
    C, d = spec.n_classes, spec.n_inputs
    m = C * d + C + d + 2
    z = rng.stream_normals(_keys(seed, clients, _MODEL), np.full(clients.size, m)).view(clients.size, m)
    u, B = z[:, -2:-1] * spec.alpha, z[:, -1:] * spec.beta
    return (u[:, :, None] + z[:, : C * d].view(-1, C, d)), u + z[:, C * d : C * d + C], B + z[:, C * d + C : -2]


def _input_means(spec: SyntheticSpec, seed: int, clients: np.ndarray) -> torch.Tensor:
    """v_i (B, d) alone, the same bits as :func:`_models`'s: the model stream's last d + 2 numbers only (C d + C is
    even, so they start at a word)."""
    C, d = spec.n_classes, spec.n_inputs
    z = rng.stream_normals(_keys(seed, clients, _MODEL), np.full(clients.size, d + 2), skip=C * d + C)
    z = z.view(clients.size, d + 2)
    return z[:, -1:] * spec.beta + z[:, :-2]


def client_model(spec: SyntheticSpec, seed: int, client: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Client ``client``'s teacher (W_i (C, d), b_i (C,)) and input mean v_i (d,), float32."""
    W, b, v = _models(spec, seed, np.array([client], dtype=np.int64))
    return W[0], b[0], v[0]


class KnownLabels:
    """The labels of clients generated before, kept so that generating a client again draws only its samples'
    normals (and its d + 2 input-mean numbers) instead of its teacher's C d + C + d + 2 and the labels' batched
    product: a direct-mapped store of ``slots`` rows of ``width`` labels (client i in slot i mod ``slots``; a client
    whose slot another holds is generated in full). One byte per label up to 256 classes: 10^5 clients of 100
    samples in 10 MB. Labels of stream ``stream`` at padded width ``width`` only; the values do not depend on what
    it holds."""

    def __init__(self, slots: int, width: int, classes: int, stream: int = 0):
        self.width, self.stream = width, stream
        self.owner = np.full(slots, -1, dtype=np.int64)
        self.labels = torch.empty(slots, width, dtype=torch.uint8 if classes <= 256 else torch.int64)

    @classmethod
    def within(cls, budget: int, n_clients: int, width: int, classes: int) -> KnownLabels:
        """A store of at most ``budget`` bytes, no larger than the population needs."""
        row = 8 + width * (1 if classes <= 256 else 8)
        return cls(max(1, min(n_clients, budget // row)), width, classes)

    def find(self, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slots, held): each client's slot and whether the slot holds its labels."""
        slots = clients % self.owner.size
        return slots, self.owner[slots] == clients

    def keep(self, clients: np.ndarray, slots: np.ndarray, labels: torch.Tensor) -> None:
        """Store ``labels`` (one padded row per client); of clients sharing a slot, the first."""
        slots, first = np.unique(slots, return_index=True)
        self.owner[slots] = clients[first]
        self.labels[torch.from_numpy(slots)] = labels[torch.from_numpy(first)].to(self.labels.dtype)


def _labels(W: torch.Tensor, b: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
    """argmax_c (W_i a + b_i)_c of each padded row (B, width) in float32, one batched product over the clients."""
    return torch.baddbmm(b[:, None, :], padded, W.transpose(1, 2)).argmax(-1)


def _pad_rows(counts: np.ndarray, width: int) -> torch.Tensor | None:
    """The positions of the clients' rows in their block padded to ``width`` rows each, or None when every client has
    ``width`` rows (the block is the rows themselves)."""
    if np.all(counts == width):
        return None
    owner = np.repeat(np.arange(counts.size), counts)
    return torch.from_numpy(
        np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts) + owner * width
    )


def _padded(inputs: torch.Tensor, rows: torch.Tensor | None, n: int, width: int) -> torch.Tensor:
    """The ``n`` clients' rows padded with zeros to ``width`` (n, width, d) (``rows``: :func:`_pad_rows`)."""
    d = inputs.shape[1]
    if rows is None:
        return inputs.view(n, width, d)
    return inputs.new_zeros(n * width, d).index_copy_(0, rows, inputs).view(n, width, d)


def generate(spec: SyntheticSpec, seed: int, clients, counts=None, stream: int = 0, pad_to: int = 0, known=None):
    """All samples of ``clients``, concatenated in the given order: (inputs (sum n_i, d) float32
    tensor, labels (sum n_i,) int64 tensor, n_i numpy array).

    ``stream`` 0 draws the clients' own data; other values fresh samples of the same distributions
    (e.g. a test set). Labels are argmax_c (W_i a + b_i)_c (the softmax is monotone), computed in
    float32 by one batched product over the clients, padded to the largest n_i or to ``pad_to``
    when larger: a caller that passes the population's largest n_i gets labels that do not depend
    on which clients are generated together (the product's rounding can depend on its padded shape).
    ``known`` (:class:`KnownLabels` of this stream and padded width): labels kept from earlier calls are taken from
    it, and the new ones kept in it; the same bits.
    """
    clients = np.asarray(clients, dtype=np.int64).reshape(-1)
    counts = sample_counts(spec, seed, clients) if counts is None else np.asarray(counts, dtype=np.int64)
    d = spec.n_inputs
    width = max(int(counts.max()) if clients.size else 0, pad_to)
    if known is not None and (known.stream, known.width) != (stream, width):
        raise ValueError(f"generate: labels kept of stream {known.stream}, width {known.width}; not {stream}, {width}")
    slots, held = known.find(clients) if known is not None else (clients, np.zeros(clients.size, dtype=bool))
    new = np.flatnonzero(~held)
    W, b, means = _models(spec, seed, clients[new])
    if new.size < clients.size:  # held clients: only their input means
        every = torch.empty(clients.size, d)
        every[torch.from_numpy(new)] = means
        every[torch.from_numpy(np.flatnonzero(held))] = _input_means(spec, seed, clients[held])
        means = every
    inputs = rng.stream_normals(_keys(seed, clients, _SAMPLES, stream), counts * d).view(-1, d)
    inputs.mul_(torch.arange(1, d + 1, dtype=torch.float32) ** -0.6)  # sqrt of Sigma_jj = j^-1.2
    if clients.size and np.all(counts == counts[0]):  # equal clients: v_i broadcast over each client's rows
        inputs.view(clients.size, -1, d).add_(means[:, None, :])
    else:
        inputs.add_(means[torch.from_numpy(np.repeat(np.arange(clients.size), counts))])
    rows = _pad_rows(counts, width)
    if new.size == clients.size:
        labels = _labels(W, b, _padded(inputs, rows, clients.size, width))
    else:
        labels = torch.empty(clients.size, width, dtype=torch.int64)
        labels[torch.from_numpy(held)] = known.labels[torch.from_numpy(slots[held])].to(torch.int64)
        if new.size:
            padded = _padded(inputs, rows, clients.size, width)[torch.from_numpy(new)]
            labels[torch.from_numpy(new)] = _labels(W, b, padded)
    if known is not None and new.size:
        known.keep(clients[new], slots[new], labels[torch.from_numpy(new)] if new.size < clients.size else labels)
    labels = labels.reshape(-1)
    return inputs, labels if rows is None else labels[rows], counts
