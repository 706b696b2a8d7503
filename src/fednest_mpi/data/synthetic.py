"""Synthetic(alpha, beta) federated classification data (Li et al., FedProx, MLSys 2020, section 5.1).

Client i has its own softmax-regression teacher and input distribution:

    u_i ~ N(0, alpha),  W_i ~ N(u_i, 1) in R^{C x d},  b_i ~ N(u_i, 1) in R^C     (model heterogeneity)
    B_i ~ N(0, beta),   v_i ~ N(B_i, 1) in R^d                                    (input heterogeneity)
    a ~ N(v_i, Sigma),  Sigma = diag(j^{-1.2}), j = 1..d;   label t = argmax softmax(W_i a + b_i)

with d = 60 and C = 10 in the paper. alpha and beta are used as standard deviations (the FedProx
paper writes N(0, alpha) without saying which; its released generator draws with scale alpha).
alpha = beta = 0 gives clients whose teachers and inputs differ only by the N(., 1) draws;
larger values make them more heterogeneous.

Nothing is stored: everything about client i is a pure function of (seed, i), drawn from torch
CPU generators seeded with keys of :func:`fednest_mpi.rng.key` (``Purpose.PROBLEM_DATA``, client
id, stream tag) -- the sample counts from ``rng.normal`` directly -- so any rank can produce any
client, a run with 10^6 clients costs memory only for the clients of the current round, and the
data do not depend on the number of ranks (for a given torch version: the generator's stream is
torch's). Generation is a per-client loop (one seeded generator per client and stream, about
0.1-0.5 ms of CPU for 100 samples here, float32); the oracles never loop over clients.

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


def _normals(key, *shape, out=None) -> torch.Tensor:
    """float32 standard normals from a CPU generator seeded with ``key`` (torch's vectorised sampler;
    float32 draws cost a quarter of float64 ones here, and are what an fp32 run uses anyway)."""
    gen = torch.Generator().manual_seed(int(key) & 0x7FFF_FFFF_FFFF_FFFF)
    return torch.randn(shape, generator=gen, dtype=torch.float32, out=out)


def sample_counts(spec: SyntheticSpec, seed: int, clients: np.ndarray) -> np.ndarray:
    """n_i for each client id (vectorised; no per-client loop)."""
    clients = np.asarray(clients, dtype=np.int64)
    if spec.size_distribution == "fixed":
        return np.full(clients.shape, spec.samples_per_client, dtype=np.int64)
    z = rng.normal(_keys(seed, clients, _SIZE), 1)[..., 0]
    return np.clip(np.rint(spec.samples_per_client * np.exp(spec.size_sigma * z)), 2, spec.max_samples).astype(np.int64)


def _model(spec: SyntheticSpec, key) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W_i (C, d), b_i (C,), v_i (d,)) from the client's model stream: one draw of C d + C + d + 2 normals."""
    C, d = spec.n_classes, spec.n_inputs
    z = _normals(key, C * d + C + d + 2)
    u, B = float(z[-2]) * spec.alpha, float(z[-1]) * spec.beta
    return (u + z[: C * d]).reshape(C, d), u + z[C * d: C * d + C], B + z[C * d + C: -2]


def client_model(spec: SyntheticSpec, seed: int, client: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Client ``client``'s teacher (W_i (C, d), b_i (C,)) and input mean v_i (d,), float32."""
    return _model(spec, _keys(seed, np.int64(client), _MODEL))


def generate(spec: SyntheticSpec, seed: int, clients, counts=None, stream: int = 0):
    """All samples of ``clients``, concatenated in the given order: (inputs (sum n_i, d) float32
    tensor, labels (sum n_i,) int64 tensor, n_i numpy array).

    ``stream`` 0 draws the clients' own data; other values fresh samples of the same distributions
    (e.g. a test set). Labels are argmax_c (W_i a + b_i)_c (the softmax is monotone), computed
    in float32 as ``torch.addmm(b_i, a, W_i^T)``.
    """
    clients = np.asarray(clients, dtype=np.int64).reshape(-1)
    counts = sample_counts(spec, seed, clients) if counts is None else np.asarray(counts, dtype=np.int64)
    model_keys, sample_keys = _keys(seed, clients, _MODEL), _keys(seed, clients, _SAMPLES, stream)
    scale = torch.arange(1, spec.n_inputs + 1, dtype=torch.float32) ** -0.6  # sqrt of Sigma_jj = j^-1.2
    inputs = torch.empty((int(counts.sum()), spec.n_inputs), dtype=torch.float32)
    labels = torch.empty(int(counts.sum()), dtype=torch.int64)
    start = 0
    for mk, sk, n in zip(model_keys.tolist(), sample_keys.tolist(), counts.tolist()):
        W, b, v = _model(spec, mk)
        a = _normals(sk, n, spec.n_inputs, out=inputs[start: start + n]).mul_(scale).add_(v)
        torch.argmax(torch.addmm(b, a, W.T), dim=1, out=labels[start: start + n])
        start += n
    return inputs, labels, counts
