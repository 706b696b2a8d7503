"""Hyper-representation learning on Synthetic(alpha, beta) data: the problem of the scaling benchmarks (10^4 - 10^6
clients).

The bilevel structure of the paper's MNIST experiment (section 4.1): x = representation layer
d -> H, y = linear head H -> C, with the closed-form batched oracles of
:mod:`fednest_mpi.problems.representation`. The data are FedProx's Synthetic(alpha, beta)
(:mod:`fednest_mpi.data.synthetic`): client i's samples are a pure function of (seed, i), the
first ``1 - val_fraction`` of them its inner (train) split, the rest its outer (validation) split.

Nothing is hosted: a client's data are generated when an oracle first asks for it (for a whole
chunk of clients at once) and kept for the most recent client sets within :data:`DATA_BUDGET_BYTES`
(at least the last one), so memory is bounded by the chunk and the budget, not by M or by the
clients of a round (10^4 - 10^6 clients are fine), and **any rank can evaluate any client**
(which balanced placement, ``federation.placement = "balanced"``, relies on). With
``problem.kept_clients_memory`` (MiB) the clients themselves are also kept, across sets and
iterations, least recently used first out (:class:`KeptClients`): FedNest draws 8 fresh sets per
outer iteration, so without it every set is generated anew; with a budget that holds the clients a
rank sees, generation is paid once per client. Without it, each client's labels are still kept (one
byte a sample, within :data:`LABELS_BUDGET_BYTES`), so a client generated again draws only its samples.
The data are the same bits either way (a client's samples depend on (seed, i) only).

Evaluation: accuracy and cross-entropy on ``eval_samples`` fresh samples (a separate stream) of
each of the clients 0 .. ``eval_clients`` - 1 (client ids are exchangeable, so these are a
uniform sample of clients).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi.data.synthetic import KnownLabels, SyntheticSpec, generate, sample_counts
from fednest_mpi.problems.clientdata import ClientSplit
from fednest_mpi.problems.representation import RepresentationProblem

#: generated samples kept for reuse (FedInn's anchor and local passes, FedOut's set), beside the chunk's own working
#: set. 64 MiB (was 256): at 10,000 of 100,000 clients per round the peak RSS fell from 1,167 to 939 MiB with the
#: same CPU per iteration (9.58 -> 9.53 s; a set of 10,000 clients, 240 MB, never fitted either budget), while
#: sets up to ~2,500 clients are still kept whole (docs/lab/issue34.md, sixth session). Values do not depend on it.
DATA_BUDGET_BYTES = 64 * 2**20
#: the clients' labels kept for their next generation (:class:`~fednest_mpi.data.synthetic.KnownLabels`, one byte
#: per sample: 10^5 clients of 100 samples in 10 MB), which then draws only the samples' normals: about -1 s of
#: ~8 s per iteration at 10,000 of 100,000 clients (docs/lab/issue34.md, tenth session). Values do not depend on it.
LABELS_BUDGET_BYTES = 32 * 2**20
_TEST_STREAM = 1


@dataclass
class _ClientSet:
    ids: np.ndarray  # sorted, unique
    inputs: torch.Tensor
    targets: torch.Tensor
    inner: ClientSplit
    outer: ClientSplit


def _nbytes(cs: _ClientSet) -> int:
    return cs.inputs.numel() * cs.inputs.element_size() + cs.targets.numel() * cs.targets.element_size()


class KeptClients:
    """Generated clients kept one by one within ``budget`` bytes, least recently used first out:
    :meth:`samples` returns the samples of ``ids`` as ``generate`` does (inputs and labels concatenated
    in the order of ``ids``, and the counts), generating only the clients it does not hold."""

    def __init__(self, budget: int):
        self.budget, self.held_bytes = budget, 0
        self._held: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def samples(self, ids: np.ndarray, make) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """``make(missing ids)`` -> (inputs, labels, counts) generates the clients not held."""
        if not ids.size:
            return make(ids)
        order = ids.tolist()
        missing = np.array([i for i in order if i not in self._held], dtype=np.int64)
        new: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if missing.size:
            inputs, labels, counts = make(missing)
            new = dict(zip(missing.tolist(), zip(inputs.split(counts.tolist()), labels.split(counts.tolist()))))
        parts = [new[i] if i in new else self._held[i] for i in order]
        for i, part in zip(order, parts):
            if i in self._held:
                self._held.move_to_end(i)
            else:
                self._keep(i, part)
        inputs, labels = torch.cat([a for a, _ in parts]), torch.cat([t for _, t in parts])
        return inputs, labels, np.array([t.numel() for _, t in parts], dtype=np.int64)

    def _keep(self, client: int, part: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Hold a copy of one client's rows (a view would keep its whole generated block alive), evicting the
        least recently used clients to stay within the budget; a client larger than the budget is not held."""
        size = sum(t.numel() * t.element_size() for t in part)
        if size > self.budget:
            return
        while self.held_bytes + size > self.budget:
            _, (a, t) = self._held.popitem(last=False)
            self.held_bytes -= a.numel() * a.element_size() + t.numel() * t.element_size()
        self._held[client] = (part[0].clone(), part[1].clone())
        self.held_bytes += size


class SyntheticProblem(RepresentationProblem):
    primary_metric = "test_accuracy"
    """See the module docstring. ``clients`` (the placement block) is ignored: data are generated."""

    inner, outer = "inner", "outer"  # split handles for _locate

    def __init__(self, cfg, seed: int, clients=None, device="cpu", dtype=torch.float32):
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.n_clients = cfg.n_clients
        self.device, self.dtype = torch.device(device), dtype
        self.spec = SyntheticSpec.from_config(cfg)
        self._set_shape(cfg.n_inputs, cfg.hidden, cfg.n_classes)
        eval_ids = np.arange(min(cfg.eval_clients, cfg.n_clients))
        inputs, labels, _ = generate(
            self.spec, seed, eval_ids, np.full(eval_ids.size, cfg.eval_samples), stream=_TEST_STREAM
        )
        self.test_inputs = inputs.to(self.device, self.dtype)
        self.test_targets = labels.to(self.device)
        self._sets: OrderedDict[bytes, _ClientSet] = OrderedDict()
        self.kept = KeptClients(cfg.kept_clients_memory * 2**20) if cfg.kept_clients_memory else None
        self.widths = self._split_widths()
        self.known = KnownLabels.within(LABELS_BUDGET_BYTES, cfg.n_clients, sum(self.widths), cfg.n_classes)

    def _outer_counts(self, counts: np.ndarray) -> np.ndarray:
        """Each client's outer (validation) samples; the rest are its inner ones. Both grow with n_i."""
        return np.clip(np.rint(self.cfg.val_fraction * counts), 1, counts - 1).astype(np.int64)

    def _split_widths(self) -> tuple[int, int]:
        """(inner, outer) padded widths: those of the population's largest client (see ClientSplit:
        a client's padding must not depend on the clients generated with it). Vectorised over the
        ids in pieces of 2^20."""
        largest = max(
            int(sample_counts(self.spec, self.seed, np.arange(lo, min(lo + 2**20, self.n_clients))).max())
            for lo in range(0, self.n_clients, 2**20)
        )
        n_outer = int(self._outer_counts(np.array([largest]))[0])
        return largest - n_outer, n_outer

    def _generate(self, ids: np.ndarray) -> _ClientSet:
        def make(clients):
            return generate(self.spec, self.seed, clients, pad_to=sum(self.widths), known=self.known)

        inputs, labels, counts = make(ids) if self.kept is None else self.kept.samples(ids, make)
        n_outer = self._outer_counts(counts)
        start = np.concatenate([[0], np.cumsum(counts)[:-1]])
        split_at = start + counts - n_outer
        inner = ClientSplit.contiguous(start, counts - n_outer, self.widths[0])
        outer = ClientSplit.contiguous(split_at, n_outer, self.widths[1])
        return _ClientSet(ids, inputs.to(self.device, self.dtype), labels.to(self.device), inner, outer)

    def client_set(self, clients) -> tuple[_ClientSet, np.ndarray]:
        """The generated data holding ``clients`` (a recent set containing them, else a new one) and
        their rows in it."""
        clients = np.asarray(clients, dtype=np.int64)
        if not clients.size:  # a rank without participants: nothing to generate, nothing evicted
            return self._generate(clients), clients
        for key, cs in reversed(self._sets.items()):
            rows = np.minimum(np.searchsorted(cs.ids, clients), cs.ids.size - 1)
            if cs.ids.size and np.array_equal(cs.ids[rows], clients):
                self._sets.move_to_end(key)
                return cs, rows
        ids = np.unique(clients)
        cs = self._generate(ids)
        self._sets[ids.tobytes()] = cs
        while len(self._sets) > 1 and sum(_nbytes(c) for c in self._sets.values()) > DATA_BUDGET_BYTES:
            self._sets.popitem(last=False)
        return cs, np.searchsorted(ids, clients)

    def client_bytes(self) -> int:
        """The default estimate plus a client's generated samples and their features at the padded
        width (the population's largest client), several times over (inputs, features,
        pre-activations, their minibatch gathers): chunks stay small enough for their sample blocks
        to be reused by the allocator (fednest_mpi.allocator)."""
        return super().client_bytes() + 6 * sum(self.widths) * (self.cfg.n_inputs + self.hidden) * 4

    def _split_width(self, split) -> int:
        return self.widths[0] if split == self.inner else self.widths[1]

    def _locate(self, split, clients):
        cs, rows = self.client_set(clients)
        return (cs.inner if split == self.inner else cs.outer), rows, cs.inputs, cs.targets

    def metric_info(self):
        n = min(self.cfg.eval_clients, self.cfg.n_clients)
        return {
            "test_accuracy": (f"accuracy on {self.cfg.eval_samples} fresh samples of each of {n} clients", "%", True),
            "test_loss": ("mean cross-entropy on the same test samples", "nats"),
        }
