"""Hyper-representation learning on MNIST (FedNest paper section 4.1, Figure 2).

A 784-H-10 MLP (H = ``hidden``, 200 in the paper): x is the representation layer (157,000
numbers for H = 200), y the linear head (2,010). The losses and their closed-form batched
oracles are those of :mod:`fednest_mpi.problems.representation`; this module supplies the data:
the MNIST training images partitioned into clients (inner = train split, outer = validation
split), and the 10k test set for evaluation.

The authors' code adds non-squared norms 0.05 (||W2|| + ||b2||) to g_i, which is neither smooth
at 0 nor strongly convex; here g_i has the squared L2 term of the paper's assumptions
(``docs/algorithms.md``).

Minibatches: a client's local step nu of a round with key K reads batch ``nu mod s_i`` of its
epoch ``nu div s_i`` shuffle (s_i = ceil(n_i / batch_size)), the shuffle keyed by (K, client,
epoch); the last batch of an epoch may be short.
"""

from __future__ import annotations

import numpy as np
import torch

from fednest_mpi.problems.clientdata import image_clients
from fednest_mpi.problems.representation import RepresentationProblem, factored_rows_bytes, head_side_bytes

N_PIXELS, N_CLASSES = 784, 10


class HyperRepresentationProblem(RepresentationProblem):
    primary_metric = "test_accuracy"
    """See the module docstring. ``clients`` lists the client ids this instance hosts."""

    @classmethod
    def implementation_for(cls, cfg):
        """The derived oracles over a network (:class:`~fednest_mpi.problems.models.ModelHyperRepresentation`) when
        ``cfg.model`` or ``cfg.derived_oracles`` asks for them; else these closed forms."""
        if cfg.model or cfg.derived_oracles:
            from fednest_mpi.problems.models import ModelHyperRepresentation

            return ModelHyperRepresentation
        return cls

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float32):
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.n_clients = cfg.n_clients
        self.device, self.dtype = torch.device(device), dtype
        self._set_shape(N_PIXELS, cfg.hidden, N_CLASSES)
        image_clients(cfg, seed, clients, self.device, self.dtype).attach(self)

    def y_side_bytes(self) -> int:
        """:func:`~.representation.head_side_bytes` at the wider of the two splits."""
        return head_side_bytes(self, (self.inner, self.outer), N_PIXELS, self.hidden, N_CLASSES)

    def factored_rows_bytes(self) -> int | None:
        """:func:`~.representation.factored_rows_bytes` of the two splits (None where a subclass computes the
        direction's oracles its own way)."""
        if not self._own_directions():
            return None
        return factored_rows_bytes(self, (self.inner, self.outer), N_PIXELS, self.hidden, N_CLASSES)

    def _locate(self, split, clients):
        return split, np.asarray(clients, dtype=np.int64) - self._first, self.inputs, self.targets

    def metric_info(self):
        return {
            "test_accuracy": ("accuracy on the 10k test set", "%", True),
            "test_loss": ("mean cross-entropy on the 10k test set", "nats"),
        }
