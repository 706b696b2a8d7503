"""Hyper-representation (paper section 4.1) and loss tuning (section 4.2) over any ``nn.Module``,
with the oracles derived from the losses of one client (:mod:`~fednest_mpi.problems.derived`).

``problem.model = "module:Class"`` names a network class (built with no arguments, on every rank);
an empty ``model`` with ``problem.derived_oracles = true`` is the paper's MLP through the derived
oracles (the same numbers as the closed forms to rounding: ``tests/unit/test_derived.py``).

* hyper_representation: x = every parameter of the **body** phi_x, a network from the (b, 784)
  image rows to (b, H) features; y = the linear head H -> 10 (W2, b2) on them:
  g_i = CE(head_y(phi_x(A)), t) on the inner split + (lambda/2) ||y||^2, f_i = the same CE on the
  outer split. Default body: Linear(784, hidden) + ReLU (x, y laid out as the closed forms lay them).
* loss_tuning: y = every parameter of the **network** z_y, from (b, 784) rows to (b, 10) logits;
  x = (delta, iota) of the VS-loss: g_i = CE(2 sigmoid(delta) z + iota, t) + (lambda/2) ||y||^2 on
  the inner split, f_i = class-weighted CE(z, t) on the outer split (x fixed at 0 without
  ``tune_loss``). Default network: the 784-hidden1-hidden2-10 MLP.

The data, minibatches, initial points of the default networks and metrics are those of the
closed-form problems (:mod:`.hyperrep`, :mod:`.losstuning`); a user's network starts from PyTorch's
default initialisation keyed by the seed (:meth:`ModuleParameters.initial`). Dropout (the
closed-form hyper-representation's ``dropout``) is not offered here: a module's own dropout would
draw from torch's global generator, which ``torch.func.vmap(randomness="error")`` refuses.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fednest_mpi.errors import ConfigError
from fednest_mpi.problems import kernels, losstuning
from fednest_mpi.problems.base import is_shared
from fednest_mpi.problems.clientdata import image_clients
from fednest_mpi.problems.derived import INNER, Y_ONLY, Batch, ClientSamples, LossProblem, ModuleParameters
from fednest_mpi.problems.representation import FeatureStore, head_side_bytes, linear_uniform
from fednest_mpi.registry import import_class

N_PIXELS, N_CLASSES = 784, 10
_EVAL_CHUNK = 5000
_TILE = 256  # rows per call of the body when its features are computed once per x


def user_module(cfg) -> nn.Module | None:
    """The network ``problem.model`` names, built with no arguments; None for the default."""
    target = getattr(cfg, "model", "")
    if not target:
        return None
    module_name, _, attr = target.partition(":")  # the form is checked with the config
    try:
        factory = import_class(target)
    except ImportError as exc:
        raise ConfigError(
            f"problem.model: cannot import module {module_name!r} ({exc}); install the model's package on every "
            "node, or put its folder on PYTHONPATH"
        ) from None
    except AttributeError:
        raise ConfigError(f"problem.model: module {module_name!r} has no {attr!r}; check the name") from None
    module = factory()
    if not isinstance(module, nn.Module):
        raise ConfigError(f"problem.model: {target}() is a {type(module).__name__}, not a torch.nn.Module")
    return module


def cross_entropy(logits: torch.Tensor, one_hot: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy of (..., C) ``logits`` against one-hot targets:
    logsumexp(z) - <one_hot, z>. The same numbers as ``F.cross_entropy`` to rounding, in fewer and
    elementwise operations: under ``torch.func`` (vmap of grad, and forward over reverse) about 1.5x
    faster per call than the log-softmax / NLL pair, whose batching and double-backward rules cost
    more than the arithmetic on 10 classes (docs/performance.md, the derived oracles' measurements)."""
    return torch.logsumexp(logits, -1) - (one_hot * logits).sum(-1)


def _mlp(widths) -> nn.Sequential:
    layers: list[nn.Module] = []
    for j, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if j < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class _ImageLosses(LossProblem):
    """What both problems share: the image clients, weighted cross-entropy, test logits in chunks."""

    network: ModuleParameters
    _activation_numbers: int  #: outputs of every layer of the network for one sample (client_bytes)

    def _setup(self, cfg, seed, clients, device, dtype, select=None):
        self.cfg, self.seed = cfg, seed
        self.n_clients = cfg.n_clients
        self.device, self.dtype = torch.device(device), dtype
        data = image_clients(cfg, seed, clients, self.device, dtype, select=select)
        self.samples = ClientSamples.of(data, dtype)
        self.samples.tensors["one_hot"] = F.one_hot(data.targets, N_CLASSES).to(dtype)  # gathered with each batch
        self.test_inputs, self.test_targets = data.test_inputs, data.test_targets
        return data

    @abstractmethod
    def _logits(self, x, y, inputs):
        """Logits (n, 10) of one client's (n, 784) rows at x (d1,) and y (d2,)."""

    def client_bytes(self) -> int:
        """Per client: rows of x and y (iterates, gradients, tangents) and the activations of the
        network on a whole split (forward and its tangent, backward and its tangent): 8 numbers per
        output of every layer, counted once on one sample."""
        split = max(self.samples.splits[s].index.shape[1] for s in self.samples.splits)
        return super().client_bytes() + 8 * split * self._activation_numbers * self.dtype.itemsize

    def _count_activations(self) -> int:
        """Numbers of every intermediate output of the network for one sample (forward hooks, one dry run)."""
        total = [0]
        hooks = [
            m.register_forward_hook(lambda _m, _i, out: total.__setitem__(0, total[0] + out.numel()))
            for m in self.network.module.modules()
        ]
        try:
            with torch.no_grad():
                self.network.module(torch.zeros(1, N_PIXELS))
        finally:
            for h in hooks:
                h.remove()
        return total[0]

    def test_logits(self, x, y) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([self._logits(x, y, chunk) for chunk in self.test_inputs.split(_EVAL_CHUNK)])

    def correct_counts(self, clients, x, y):
        """(correct, total) predictions (plain logits) on each client's inner split."""
        clients = np.asarray(clients, dtype=np.int64)
        batch = self.client_batch(INNER, clients, None, 0)
        args = tuple(r[0] if is_shared(r) else r for r in (x, y))
        dims = tuple(None if is_shared(r) else 0 for r in (x, y))
        with torch.no_grad():
            logits = torch.func.vmap(self._logits, in_dims=(*dims, 0))(*args, batch["inputs"])
        valid = batch["weight"] > 0
        hit = (logits.argmax(-1) == batch["targets"]) & valid
        return hit.sum(1), valid.sum(1)


class ModelHyperRepresentation(_ImageLosses):
    """hyper_representation with x = a body network's parameters (module docstring)."""

    primary_metric = "test_accuracy"

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float32):
        super().__init__()
        self._setup(cfg, seed, clients, device, dtype)
        module = user_module(cfg)
        self.default_body = module is None
        body = nn.Sequential(*_mlp((N_PIXELS, cfg.hidden)), nn.ReLU()) if module is None else module
        self.network = ModuleParameters(body, x_names=[n for n, _ in body.named_parameters()])
        self._activation_numbers = self._count_activations()
        with torch.no_grad():
            self.hidden = int(self.network.module(torch.zeros(1, N_PIXELS)).shape[-1])
        self.dim_x, self.dim_y = self.network.dim_x, N_CLASSES * self.hidden + N_CLASSES
        self._store = FeatureStore()

    def initial_point(self):
        """The closed-form problem's for the default body (PyTorch's Linear init keyed by the seed);
        a user's body: :meth:`ModuleParameters.initial`; the head U(+-1/sqrt(H)) keyed as there."""
        if self.default_body:
            x = linear_uniform(self.seed, 1, self.dim_x, N_PIXELS, self.dtype, self.device)
        else:
            x = self.network.initial(self.seed, 1, "x", self.dtype, self.device)
        return x, linear_uniform(self.seed, 2, self.dim_y, self.hidden, self.dtype, self.device)

    def y_side_bytes(self) -> int:
        """:func:`~.representation.head_side_bytes`: the y-side oracles differentiate the head only,
        on features computed once per x (:meth:`oracle_batch`, the body in tiles of :data:`_TILE` rows)."""
        return head_side_bytes(self, self.samples.splits.values(), N_PIXELS, self.hidden, N_CLASSES)

    def _head(self, y, features):
        H, C = self.hidden, N_CLASSES
        weight, bias = y.split([C * H, C])  # one split: its backward is one concatenation
        return features @ weight.view(C, H).T + bias

    def _logits(self, x, y, inputs):
        return self._head(y, self.network.call(x, None, inputs))

    def _cross_entropy(self, x, y, batch: Batch) -> torch.Tensor:
        """Weighted CE of the head on the batch's features: precomputed ones (:meth:`oracle_batch`) or phi_x(inputs)."""
        features = batch["features"] if "features" in batch else self.network.call(x, None, batch["inputs"])
        z = self._head(y, features)
        return (batch["weight"] * cross_entropy(z, batch["one_hot"])).sum()

    # -- the body's features at a shared x, once per x (FedInn's local steps, FedIHGP's products) ------
    def oracle_batch(self, oracle, clients, x, sample):
        """For the oracles of :data:`~.derived.Y_ONLY` at a shared x: the minibatch's rows of the
        features phi_x of the clients' whole split, computed once per x (no graph) and kept in a
        :class:`~.representation.FeatureStore`, so that local steps and Neumann products differentiate
        the head only, as the closed forms do."""
        if oracle not in Y_ONLY or not is_shared(x):
            return super().oracle_batch(oracle, clients, x, sample)
        split, size = self.minibatch(oracle)
        part, rows = self.samples.splits[split], clients - self.samples.first
        whole = self._split_features(split, clients, x[0])  # (B, width, H)
        cols, weights = part.batch(rows, clients, sample, size)
        flat = torch.as_tensor(cols + np.arange(len(cols))[:, None] * whole.shape[1], device=self.device)
        pos = torch.as_tensor(part.positions(rows, cols), device=self.device)
        return {
            "features": whole.flatten(0, 1).index_select(0, flat.flatten()).view(*cols.shape, -1),
            "one_hot": self.samples.tensors["one_hot"][pos],
            "weight": torch.as_tensor(weights, dtype=self.dtype, device=self.device),
        }

    def _split_features(self, split, clients, x):
        """phi_x of the whole split of ``clients`` (B, width, H), from the store where it has them."""
        store, part = self._store, self.samples.splits[split]
        if not store.matches(x):
            store.reset(x)
        width = part.index.shape[1]
        hit = store.lookup(split, clients, width)  # the last set (FedInn's steps) or a stored block: no search
        if hit is not None:
            return hit
        missing = store.missing(split, clients)
        if missing.size:
            if 2 * missing.size > clients.size:  # mostly new: one block of the whole set
                missing = clients
            inputs = self.samples.batch(split, missing, None, 0)["inputs"]
            features = self._tiled_body(x, inputs.flatten(0, 1)).view(missing.size, width, self.hidden)
            store.add(split, missing, part.count[missing - self.samples.first], features)
        return store.assemble(split, clients, width, self.hidden, x)

    def _tiled_body(self, x, inputs):
        """phi_x of (n, 784) rows in tiles of :data:`_TILE` rows (the last one zero-padded): every row
        meets the network at the same shape whatever the block (see :mod:`~.kernels`)."""
        out = inputs.new_empty(inputs.shape[0], self.hidden)
        with torch.no_grad():
            for lo in range(0, inputs.shape[0], _TILE):
                tile = inputs[lo : lo + _TILE]
                if tile.shape[0] < _TILE:
                    tile = torch.cat([tile, tile.new_zeros(_TILE - tile.shape[0], tile.shape[1])])
                out[lo : lo + _TILE] = self.network.call(x, None, tile)[: out.shape[0] - lo]
        return out

    def inner_loss(self, x, y, batch):
        """g_i = weighted CE on the inner batch + (lambda/2) ||y||^2."""
        return self._cross_entropy(x, y, batch) + 0.5 * self.cfg.inner_regularization * (y * y).sum()

    def outer_loss(self, x, y, batch):
        """f_i = weighted CE on the outer batch."""
        return self._cross_entropy(x, y, batch)

    def metric_info(self):
        return {
            "test_accuracy": ("accuracy on the 10k test set", "%", True),
            "test_loss": ("mean cross-entropy on the 10k test set", "nats"),
        }

    def evaluate(self, x, y):
        logits = self.test_logits(x, y)
        acc = (logits.argmax(1) == self.test_targets).to(torch.float64).mean()
        return {"test_accuracy": 100.0 * float(acc), "test_loss": float(F.cross_entropy(logits, self.test_targets))}


class ModelLossTuning(_ImageLosses):
    """loss_tuning with y = a network's parameters (module docstring)."""

    primary_metric = "balanced_accuracy"

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float32):
        super().__init__()
        data = self._setup(cfg, seed, clients, device, dtype, select=losstuning.long_tail_select(cfg))
        self.class_weights = losstuning.class_weights(
            np.bincount(data.train_labels, minlength=N_CLASSES), dtype, self.device
        )
        module = user_module(cfg)
        self.default_network = module is None
        widths = (N_PIXELS, *(h for h in (cfg.hidden1, cfg.hidden2) if h > 0), N_CLASSES)
        self.network = ModuleParameters(_mlp(widths) if module is None else module)
        self._activation_numbers = self._count_activations()
        self.dim_x, self.dim_y = 2 * N_CLASSES, self.network.dim_y

    def initial_point(self):
        """x = 0; y: the closed-form problem's for the default MLP, else :meth:`ModuleParameters.initial`."""
        x = torch.zeros(self.dim_x, dtype=self.dtype, device=self.device)
        if self.default_network:
            shapes = [s for _, s in self.network.y_shapes if len(s) == 2]  # the weights' (out, in)
            return x, losstuning.mlp_initial_point(shapes, self.seed, self.dtype, self.device)
        return x, self.network.initial(self.seed, 2, "y", self.dtype, self.device)

    def _logits(self, x, y, inputs):
        return self.network.call(None, y, inputs)

    def inner_loss(self, x, y, batch):
        """g_i = weighted VS-loss on the inner batch + (lambda/2) ||y||^2."""
        z = self._logits(x, y, batch["inputs"])
        if self.cfg.tune_loss:
            z = z * (2.0 * kernels.sigmoid(x[:N_CLASSES])) + x[N_CLASSES:]
        ce = cross_entropy(z, batch["one_hot"])
        return (batch["weight"] * ce).sum() + 0.5 * self.cfg.inner_regularization * (y * y).sum()

    def outer_loss(self, x, y, batch):
        """f_i = class-weighted CE on the outer batch (independent of x)."""
        ce = cross_entropy(self._logits(x, y, batch["inputs"]), batch["one_hot"])
        return (batch["weight"] * self.class_weights[batch["targets"]] * ce).sum()

    def metric_info(self):
        return losstuning.METRICS

    def evaluate(self, x, y):
        return losstuning.metrics_of(self.test_logits(x, y), self.test_targets)
