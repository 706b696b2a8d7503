"""The plain per-client PyTorch loop of a run config: the many-clients benchmark's baseline, written the way a user
without a framework would write the same task.

Per client, one after another: its own copy of the parameters (plain tensors with
``requires_grad``), ``torch.autograd`` for every gradient (Hessian- and Jacobian-vector products by
double backward), ``torch.optim.SGD`` for the local steps, the data as tensors loaded before the
first round (MNIST) or generated per client from the problem's definition (synthetic: a pure
function of (seed, client id), :func:`fednest_mpi.data.synthetic.generate`; 10^5 clients of 100
samples do not fit in memory), and the average at the end of each round. Same model, same local
steps, batch sizes and step sizes as the config; not our minibatch draws (each client's epoch is a
``torch.randperm``) nor our client sets (``numpy.random.Generator.choice``). Nothing of the
project's batched oracles, samplers or federation is used; the data come from
:mod:`fednest_mpi.data` and the partition from the same function as the project's.

Algorithms: ``fedavg`` (tau local SGD steps, one round), ``fednest`` and ``fednest_sgd`` (FedInn with
or without the SVRG correction, FedIHGP's N Hessian rounds, over fresh client sets when
``ihgp_resample_clients``, FedOut with tau outer steps; Algorithm 1 of the paper). Problems:
``loss_tuning`` (x = VS-loss logit adjustments, y = the whole MLP), ``hyper_representation`` and
``synthetic`` (x = the representation layer, y = the linear head; hyper_representation with
``problem.model``: x = the parameters of that network, called per client by
``torch.func.functional_call``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from fednest_mpi.data import load_mnist, long_tail_indices, resolve_data_dir
from fednest_mpi.data.synthetic import SyntheticSpec, generate
from fednest_mpi.errors import UsageError
from fednest_mpi.problems.clientdata import partition_clients
from fednest_mpi.registry import import_class

ALGORITHMS = ("fedavg", "fednest", "fednest_sgd")
PROBLEMS = ("loss_tuning", "hyper_representation", "synthetic")
N_CLASSES_MNIST = 10


def mlp(params: list[torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
    """Logits of the MLP whose layers are ``params = [W1, b1, W2, b2, ...]`` (ReLU between layers)."""
    h = inputs
    for j in range(0, len(params), 2):
        h = F.linear(h, params[j], params[j + 1])
        if j + 2 < len(params):
            h = torch.relu(h)
    return h


def linear_init(widths, gen: torch.Generator, dtype) -> list[torch.Tensor]:
    """Layers d0 -> d1 -> ... with torch.nn.Linear's default init U(+-1/sqrt(fan_in))."""
    params = []
    for inp, out in zip(widths[:-1], widths[1:]):
        bound = 1.0 / math.sqrt(inp)
        params += [
            (2 * torch.rand(out, inp, generator=gen, dtype=dtype) - 1) * bound,
            (2 * torch.rand(out, generator=gen, dtype=dtype) - 1) * bound,
        ]
    return params


def split_sizes(counts: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(inner, outer) sample counts of synthetic clients with ``counts`` samples (the outer split is
    the last round(val_fraction n) samples, at least 1, leaving at least 1 inner)."""
    n_outer = np.clip(np.rint(val_fraction * counts), 1, counts - 1).astype(np.int64)
    return counts - n_outer, n_outer


class ClientData:
    """Client c's (inner inputs, inner labels, outer inputs, outer labels): MNIST clients loaded
    once; synthetic clients generated at every call (as a plain loop without a cache would)."""

    def __init__(self, pcfg, seed: int, dtype):
        self.pcfg, self.seed, self.dtype = pcfg, seed, dtype
        self.class_weights = None
        if pcfg.name == "synthetic":
            self.spec = SyntheticSpec.from_config(pcfg)
            self.clients = None
            return
        data = load_mnist(resolve_data_dir(pcfg.data_dir or None, pcfg.dataset), variant=pcfg.dataset)
        labels = data.train_y.numpy()
        keep = np.arange(len(labels))
        if pcfg.name == "loss_tuning":
            keep = long_tail_indices(labels, N_CLASSES_MNIST, pcfg.max_per_class, pcfg.imbalance_ratio)
            sizes = np.bincount(labels[keep], minlength=N_CLASSES_MNIST)
            self.class_weights = torch.as_tensor(sizes.sum() / (N_CLASSES_MNIST * sizes), dtype=dtype)
        parts = partition_clients(labels[keep], pcfg, seed, equal_shards=pcfg.name != "loss_tuning")
        inputs, targets = data.train_x.to(dtype), data.train_y
        self.clients = [(inputs[keep[tr]], targets[keep[tr]], inputs[keep[va]], targets[keep[va]]) for tr, va in parts]
        self.test = (data.test_x.to(dtype), data.test_y)

    def __call__(self, c: int):
        if self.clients is not None:
            return self.clients[c]
        inputs, labels, counts = generate(self.spec, self.seed, np.array([c]))
        n_in = int(split_sizes(counts, self.pcfg.val_fraction)[0][0])
        inputs = inputs.to(self.dtype)
        return inputs[:n_in], labels[:n_in], inputs[n_in:], labels[n_in:]

    def sizes(self) -> tuple[float, float]:
        """Mean (inner, outer) samples per client (synthetic: over the first 10,000 clients)."""
        if self.clients is not None:
            return (
                float(np.mean([len(c[1]) for c in self.clients])),
                float(np.mean([len(c[3]) for c in self.clients])),
            )
        from fednest_mpi.data.synthetic import sample_counts

        n_in, n_out = split_sizes(
            sample_counts(self.spec, self.seed, np.arange(min(self.pcfg.n_clients, 10000))), self.pcfg.val_fraction
        )
        return float(n_in.mean()), float(n_out.mean())


class PlainLoop:
    """One outer iteration per :meth:`step` of ``cfg`` (a :class:`~fednest_mpi.config.RunConfig`), one
    client at a time. x and y are lists of parameter tensors."""

    def __init__(self, cfg):
        p, a = cfg.problem, cfg.algorithm
        if p.name not in PROBLEMS or a.name not in ALGORITHMS:
            raise UsageError(
                f"the plain loop covers problems {', '.join(PROBLEMS)} and algorithms "
                f"{', '.join(ALGORITHMS)}; "
                f"not {p.name} with {a.name}"
            )
        self.p, self.a = p, a
        torch.set_num_threads(cfg.run.torch_threads)
        dtype = getattr(torch, cfg.run.dtype)
        self.data = ClientData(p, cfg.seed, dtype)
        self.sampler = np.random.default_rng(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        if p.name == "loss_tuning":  # x = (delta, iota): Delta = 2 sigmoid(delta) scales, iota shifts the logits
            widths = (784, *(h for h in (p.hidden1, p.hidden2) if h > 0), N_CLASSES_MNIST)
            self.x = [torch.zeros(N_CLASSES_MNIST, dtype=dtype), torch.zeros(N_CLASSES_MNIST, dtype=dtype)]
            self.y = linear_init(widths, self.gen, dtype)
        elif getattr(p, "model", ""):  # x = the parameters of the user's body network, y = a linear head on it
            torch.manual_seed(cfg.seed)  # the module's own default initialisation
            self.body = import_class(p.model)().to(dtype)
            self.names = [n for n, _ in self.body.named_parameters()]
            self.x = [w.detach().clone() for w in self.body.parameters()]
            with torch.no_grad():
                hidden = self.body(torch.zeros(1, 784, dtype=dtype)).shape[-1]
            self.y = linear_init((hidden, N_CLASSES_MNIST), self.gen, dtype)
        else:  # x = representation layer d -> H, y = head H -> C
            d, C = (784, N_CLASSES_MNIST) if p.name == "hyper_representation" else (p.n_inputs, p.n_classes)
            layers = linear_init((d, p.hidden, C), self.gen, dtype)
            self.x, self.y = layers[:2], layers[2:]

    # -- the task's losses (one client's batch; x, y lists of tensors) -------------------------------
    body = None  # a user's network (problem.model): called with torch.func.functional_call on the parameters x

    def logits(self, x, y, A):
        if self.p.name == "loss_tuning":
            return mlp(y, A)
        if self.body is not None:
            return F.linear(torch.func.functional_call(self.body, dict(zip(self.names, x)), (A,)), y[0], y[1])
        return mlp(x + y, A)

    def inner_loss(self, x, y, A, t):
        """g_i: cross-entropy (loss tuning: the VS-loss) + (lambda/2) ||y||^2."""
        z = self.logits(x, y, A)
        if self.p.name == "loss_tuning" and self.p.tune_loss:
            z = z * (2.0 * torch.sigmoid(x[0])) + x[1]
        return F.cross_entropy(z, t) + 0.5 * self.p.inner_regularization * sum((w * w).sum() for w in y)

    def outer_loss(self, x, y, A, t):
        """f_i: cross-entropy on the validation split (loss tuning: class-weighted, independent of x)."""
        z = self.logits(x, y, A)
        if self.class_weights is None:
            return F.cross_entropy(z, t)
        return (self.class_weights[t] * F.cross_entropy(z, t, reduction="none")).mean()

    @property
    def class_weights(self):
        return self.data.class_weights

    # -- helpers -------------------------------------------------------------------------------
    def sample(self) -> np.ndarray:
        return self.sampler.choice(self.p.n_clients, self.a.clients_per_round, replace=False)

    def batches(self, n: int, size: int, steps: int):
        """Index tensors of ``steps`` minibatches of ``size``: consecutive slices of a fresh
        permutation per epoch (the last one of an epoch may be short)."""
        per_epoch = -(-n // size)
        for nu in range(steps):
            if nu % per_epoch == 0:
                perm = torch.randperm(n, generator=self.gen)
            j = nu % per_epoch
            yield perm[j * size : (j + 1) * size]

    def subset(self, A, t, size: int):
        """The whole split (size 0) or one random minibatch of ``size``."""
        if size <= 0:
            return A, t
        idx = torch.randperm(len(t), generator=self.gen)[:size]
        return A[idx], t[idx]

    @staticmethod
    def leaves(params):
        return [w.detach().requires_grad_() for w in params]

    @staticmethod
    def grad(loss, wrt, **kwargs):
        return [
            torch.zeros_like(w) if g is None else g
            for w, g in zip(wrt, torch.autograd.grad(loss, wrt, allow_unused=True, **kwargs))
        ]

    def mean(self, clients, fn):
        """The average over ``clients`` of ``fn(client data)`` (a list of tensors)."""
        total = None
        for c in clients.tolist():
            out = fn(self.data(c))
            total = [o.detach().clone() for o in out] if total is None else [s.add_(o) for s, o in zip(total, out)]
        return [s / len(clients) for s in total]

    # -- local steps: FedAvg, FedInn / LFedInn --------------------------------------------------
    def local_steps(self, x, y, A, t, q=None):
        """tau SGD steps from the global y on the client's inner split (torch.optim.SGD); with ``q``
        the SVRG direction G_i(y_i) - G_i(y) + q on the same minibatch (FedInn, Alg. 4)."""
        params = [w.detach().clone().requires_grad_() for w in y]
        opt = torch.optim.SGD(params, lr=self.a.inner_lr)
        for idx in self.batches(len(t), self.p.batch_size, self.a.inner_local_steps):
            opt.zero_grad()
            self.inner_loss(x, params, A[idx], t[idx]).backward()
            if q is not None:
                y0 = self.leaves(y)
                for w, g0, m in zip(params, self.grad(self.inner_loss(x, y0, A[idx], t[idx]), y0), q):
                    w.grad.sub_(g0).add_(m)
            opt.step()
        return [w.detach() for w in params]

    def fed_inn(self, x, y):
        S = self.sample()
        q = None
        if self.a.name == "fednest":  # SVRG anchor: q = mean_S G_i(y) on each client's whole inner split
            y0 = self.leaves(y)
            q = self.mean(S, lambda d: self.grad(self.inner_loss(x, y0, d[0], d[1]), y0))
        return self.mean(S, lambda d: self.local_steps(x, y, d[0], d[1], q))

    # -- FedOut with FedIHGP ------------------------------------------------------------------
    def hvp(self, x, y, r, A, t):
        """(I - eta H_i) r with H_i = nabla^2_yy g_i on (a minibatch of) the inner split."""
        A, t = self.subset(A, t, self.p.hypergradient_batch_size)
        yy = self.leaves(y)
        gy = torch.autograd.grad(self.inner_loss(x, yy, A, t), yy, create_graph=True)
        Hr = torch.autograd.grad(gy, yy, grad_outputs=r)
        return [ri - self.a.neumann_scale * h for ri, h in zip(r, Hr)]

    def local_hypergradient(self, x, y, p, d):
        """nabla_x f_i - nabla^2_xy g_i p (eq. (8)); the Jacobian product by double backward."""
        hb = self.p.hypergradient_batch_size
        xx, yy = self.leaves(x), self.leaves(y)
        direct = self.grad(self.outer_loss(xx, yy, *self.subset(d[2], d[3], hb)), xx)
        A, t = self.subset(d[0], d[1], hb)
        gy = torch.autograd.grad(self.inner_loss(xx, yy, A, t), yy, create_graph=True)
        cross = self.grad(gy, xx, grad_outputs=p)
        return [a - b for a, b in zip(direct, cross)]

    def fed_out(self, x, y):
        a, hb = self.a, self.p.hypergradient_batch_size
        S = self.sample()
        yy = self.leaves(y)
        v = self.mean(S, lambda d: self.grad(self.outer_loss(x, yy, *self.subset(d[2], d[3], hb)), yy))
        r, acc = v, v
        for _ in range(a.neumann_steps):
            Sn = self.sample() if a.ihgp_resample_clients else S
            r = self.mean(Sn, lambda d, r=r: self.hvp(x, y, r, d[0], d[1]))
            acc = [s + ri for s, ri in zip(acc, r)]
        p = [a.neumann_scale * s for s in acc]
        h = self.mean(S, lambda d: self.local_hypergradient(x, y, p, d))

        def outer_steps(d):
            xi = [w - a.outer_lr * g for w, g in zip(x, h)]
            for _ in range(1, a.outer_local_steps):  # x_i -= alpha (grad f_i(x_i) - grad f_i(x) + h)
                A, t = self.subset(d[2], d[3], hb)
                xl, x0, y0 = self.leaves(xi), self.leaves(x), self.leaves(y)
                gi, g0 = self.grad(self.outer_loss(xl, y0, A, t), xl), self.grad(self.outer_loss(x0, y0, A, t), x0)
                xi = [w - a.outer_lr * (u - w0 + m) for w, u, w0, m in zip(xi, gi, g0, h)]
            return xi

        return self.mean(S, outer_steps) if a.outer_local_steps > 1 else [w - a.outer_lr * g for w, g in zip(x, h)]

    # -- one outer iteration ----------------------------------------------------------------------
    def step(self) -> None:
        for _ in range(self.a.inner_rounds):
            self.y = self.fed_inn(self.x, self.y)
        if self.a.name != "fedavg":
            self.x = self.fed_out(self.x, self.y)

    def test_accuracy(self) -> float:
        """Accuracy (%) on the MNIST test set; NaN for the synthetic problem."""
        if self.data.clients is None:
            return float("nan")
        with torch.no_grad():
            A, t = self.data.test
            return 100.0 * float((self.logits(self.x, self.y, A).argmax(1) == t).double().mean())
