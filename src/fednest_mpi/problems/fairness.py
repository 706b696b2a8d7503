"""Fair federated learning on UCI Adult: the application of FedBiOAcc (Li, Huang & Huang, section 5),
with the formulation of ``../shared/notes/fedbio-and-peers.md`` section 2.2 (the paper's exact
setup was not recoverable: its datasets, model and numbers are missing from the text).

Cells c: the sensitive groups (``weight_cells = "group"``: sex or race) or the (group, label)
pairs (``"group_label"``); C cells. The outer variable x in R^C gives the cell weights
w(x) = C softmax(x) (mean 1; x = 0 is plain unweighted training). Client i holds a training split
D_i and a small validation split V_i:

    g_i(x, y) = (1/|D_i|) sum_{j in D_i} w_{c_j}(x) l(y; a_j, t_j) + (mu/2) ||y||^2
    f_i(x, y) = sum_{j in V_i} omega_ij l(y; a_j, t_j),   omega_ij proportional to 1/m_{c_j}

with l the logistic loss of the classifier y (logistic regression, or a 1-hidden-layer tanh MLP)
and m_c the number of validation samples of cell c, normalised per client: f is the
cell-balanced validation loss (``outer_objective = "balanced"``, the notes' formulation). With
``outer_objective = "worst_group"`` the outer loss is the notes' smooth worst-group loss of the
pooled validation set of the round's clients S,

    f(x, y) = tau log sum_s exp(L_s(y) / tau),   L_s = sum_{i in S} l_is / sum_{i in S} n_is

over the weighted cells s (the sensitive groups, or with ``weight_cells = "group_label"`` the
(group, label) cells, the "groups" of group DRO; l_is, n_is: client i's summed loss and count of
cell s in V_i; tau -> 0: max_s L_s). It is not a
mean of per-client losses: FedOut pools (l_is, n_is) in one extra round
(:meth:`outer_statistics`) and then uses f_i = sum_s p_s l_is / nbar_s, p = softmax(L / tau),
nbar_s = mean_S n_is, whose mean over S has the gradient of f (:meth:`outer_linearised`). The
per-client surrogate tau logsumexp_s(l_is / (n_is tau)) (the value recorded as outer_loss) was
measured as a poor target: with ~5 validation samples per group and client it favours the noisiest
groups (docs/algorithms.md). Algorithms with local outer steps (FedBiO, LFedNest) cannot pool, so
config validation restricts worst_group to FedOut (fednest, fednest_sgd).

f does not depend on x (zero direct gradient); the hypergradient
is all implicit. Logistic regression with mu > 0 makes g_i strongly convex in y.

Data (identical on every rank, from the seed): a cell-balanced validation pool of
min(``val_per_cell``, half the cell) samples per cell is drawn from ``adult.data`` and dealt
round-robin to the clients (each client's V_i is close to balanced); the rest of ``adult.data`` is
split over the clients by a Dirichlet(``dirichlet_alpha``) partition over the (group, label)
pairs, so group and label mixes differ between clients. Metrics use ``adult.test`` (16,281 rows):
accuracy, demographic-parity gap max_s P(yhat=1|s) - min_s P(yhat=1|s), equal-opportunity gap
(the same over true-positive rates), worst-group accuracy and the group accuracy gap (max - min),
over the sensitive groups; and over the (group, label) cells the worst-cell accuracy (group DRO's
"worst-group accuracy", Sagawa et al. 2020) and the worst-cell test loss. ``group_feature = false``
drops the sensitive attribute from the classifier's inputs ("fairness through unawareness").
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.data import dirichlet_partition, load_adult, resolve_data_dir
from fednest_mpi.data.adult import RACES, SEXES
from fednest_mpi.errors import ConfigError
from fednest_mpi.problems.autograd_oracles import AutogradOracles
from fednest_mpi.problems.base import BilevelProblem, squared_norms
from fednest_mpi.problems.clientdata import HostedSamples
from fednest_mpi.problems.kernels import binary_cross_entropy_with_logits

_POOL = 201  # stream of the validation pool (beyond rng.Purpose and data.partition's purposes)


@functools.lru_cache(maxsize=2)
def _adult(data_dir: str):
    return load_adult(resolve_data_dir(data_dir or None, "adult"))


def fairness_splits(
    cells: np.ndarray, full_cells: np.ndarray, cfg, seed: int
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Per client (train indices, validation indices) and the per-sample validation cell sizes m_c
    (indexed by sample; 0 outside the pool). ``cells``: weighted cell of every training sample;
    ``full_cells``: its (group, label) pair, the Dirichlet label."""
    pool = []
    for c in np.unique(cells):
        idx = np.flatnonzero(cells == c)
        idx = idx[rng.permutation(rng.key(seed, _POOL, c), len(idx))]
        pool.append(idx[: min(cfg.val_per_cell, len(idx) // 2)])
    sizes = np.zeros(len(cells))
    for part in pool:
        sizes[part] = len(part)
    pooled = np.concatenate(pool)
    rest = np.setdiff1d(np.arange(len(cells)), pooled)
    parts = dirichlet_partition(full_cells[rest], cfg.n_clients, cfg.dirichlet_alpha, seed, min_size=cfg.batch_size)
    splits = [(np.sort(rest[p]), np.sort(pooled[i :: cfg.n_clients])) for i, p in enumerate(parts)]
    return splits, sizes


def _check_batch_sizes(cfg, splits) -> None:
    """The minibatches fit in the smallest client's training samples."""
    smallest = min(len(train) for train, _ in splits)
    for name in ("batch_size", "hypergradient_batch_size"):
        if getattr(cfg, name) > smallest:
            raise ConfigError(
                f"problem.{name}: {getattr(cfg, name)} is more than the {smallest} training samples of the "
                f"smallest client; lower it to at most {smallest}, raise dirichlet_alpha or use fewer clients"
            )


class FairnessProblem(AutogradOracles, BilevelProblem):
    primary_metric = "worst_group_accuracy"
    """See the module docstring; oracles by autograd (:class:`AutogradOracles`). ``clients`` lists the
    client ids this instance hosts."""

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float64):
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.n_clients = cfg.n_clients
        self.device, self.dtype = torch.device(device), dtype
        data = _adult(cfg.data_dir)
        full, cells = self._cells(data)
        columns = self._features(data)
        if len(np.unique(cells)) < self.dim_x:
            raise ValueError(f"adult.data lacks some of the {self.dim_x} cells of {cfg.sensitive}")
        splits, sizes = fairness_splits(cells, full, cfg, seed)
        _check_batch_sizes(cfg, splits)
        # targets carry the (group, label) pair: label = t % 2, group = t // 2
        hosted = HostedSamples(data.train_x[:, columns], torch.as_tensor(full), splits, clients, self.device, dtype)
        self._first, self.inputs, self.targets = hosted.first, hosted.inputs, hosted.targets
        self.inner, self.outer = hosted.inner, hosted.outer
        self.inv_size = self._inverse_cell_sizes(splits, sizes, clients)
        self.test_inputs = data.test_x[:, columns].to(self.device, dtype)
        self.test_labels = data.test_y.to(self.device)
        self.test_groups = getattr(data, f"test_{cfg.sensitive}").to(self.device)
        self._cell_factor = None  # p_s / nbar_s inside outer_linearised (worst_group)
        # parses problem.initial_weights: a bad value fails here, on every rank alike
        self._x0 = self.x_of_weights(cfg.initial_weights)

    def _cells(self, data) -> tuple[np.ndarray, np.ndarray]:
        """Each training sample's (group, label) pair as ``2 * group + label``, and the cell it is weighted by
        (``problem.weight_cells``: that pair, or the group alone); sets the groups and ``dim_x``, a weight per
        cell."""
        cfg = self.cfg
        names = SEXES if cfg.sensitive == "sex" else RACES
        self.group_names = names
        self.n_groups = len(names)
        groups = getattr(data, f"train_{cfg.sensitive}").numpy()
        labels = data.train_y.numpy()
        full = 2 * groups + labels
        self.by_label = cfg.weight_cells == "group_label"
        cells = full if self.by_label else groups
        self.dim_x = 2 * self.n_groups if self.by_label else self.n_groups
        return full, cells

    def _features(self, data) -> list[int]:
        """The input features used (the sensitive attribute's own only with ``problem.group_feature``); sets
        ``n_features`` and ``dim_y``, the classifier's size."""
        cfg = self.cfg
        columns = [
            k
            for k, name in enumerate(data.feature_names)
            if cfg.group_feature or not name.startswith(f"{cfg.sensitive}=")
        ]
        self.n_features = len(columns)
        h = cfg.hidden
        self.dim_y = self.n_features + 1 if cfg.model == "logistic" else h * self.n_features + 2 * h + 1
        return columns

    def _inverse_cell_sizes(self, splits, sizes: np.ndarray, clients) -> torch.Tensor:
        """1 / m_c, the validation cell size of each sample that a hosted client holds (``sizes``: per sample, 0
        outside the validation pool, where it is 0 too), in the order of the samples' indices."""
        used = (
            np.unique(np.concatenate([np.concatenate(splits[i]) for i in clients]))
            if len(clients)
            else np.zeros(0, np.int64)
        )
        return torch.as_tensor(
            np.where(sizes[used] > 0, 1.0 / np.maximum(sizes[used], 1), 0.0), dtype=self.dtype, device=self.device
        )

    # -- model -------------------------------------------------------------------------------------
    def _logits(self, A: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Logits (B, n) of inputs A (B, n, d) under the classifiers y (B, d2). The per-client dot
        products are a product and a sum over the last axis: ``einsum`` or ``bmm`` with one column
        round a client's numbers differently with its place in the block (BLAS matrix-vector
        kernels depend on the operand's alignment), so a run would depend on the chunk size."""
        d = self.n_features
        if self.cfg.model == "logistic":
            return (A * y[:, None, :d]).sum(-1) + y[:, d:]
        h = self.cfg.hidden
        W1 = y[:, : h * d].reshape(-1, h, d)
        b1, w2, b2 = y[:, h * d : h * d + h], y[:, h * d + h : h * d + 2 * h], y[:, -1:]
        hidden = torch.tanh(torch.baddbmm(b1[:, None, :], A, W1.transpose(1, 2)))
        return (hidden * w2[:, None, :]).sum(-1) + b2

    def cell_weights(self, x: torch.Tensor) -> torch.Tensor:
        """w(x) = C softmax(x), rows (B, C)."""
        return self.dim_x * torch.softmax(x, dim=-1)

    def _batch(self, split, clients, sample, batch_size):
        clients = np.asarray(clients, dtype=np.int64)
        rows = clients - self._first
        cols, weights = split.batch(rows, clients, sample, batch_size)
        pos = torch.as_tensor(split.positions(rows, cols), device=self.device)
        return pos, torch.as_tensor(weights, dtype=self.dtype, device=self.device)

    def _inner_losses(self, clients, x, y, sample, batch_size) -> torch.Tensor:
        """Per-client weighted training loss (B,) without the regulariser."""
        pos, w = self._batch(self.inner, clients, sample, batch_size)
        t = self.targets[pos]
        cell = t if self.by_label else t // 2
        loss = binary_cross_entropy_with_logits(self._logits(self.inputs[pos], y), (t % 2).to(self.dtype))
        return (w * torch.gather(self.cell_weights(x), 1, cell) * loss).sum(1)

    def _validation_losses(self, clients, y) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(positions, weights, per-sample logistic loss), each (B, n), on the clients' whole validation splits."""
        pos, w = self._batch(self.outer, clients, None, 0)  # V_i is small: always all of it
        loss = binary_cross_entropy_with_logits(
            self._logits(self.inputs[pos], y), (self.targets[pos] % 2).to(self.dtype)
        )
        return pos, w, loss

    def _cell_sums(self, clients, y) -> tuple[torch.Tensor, torch.Tensor]:
        """Per client (B, C): summed validation loss l_is and count n_is of every weighted cell s."""
        pos, w, loss = self._validation_losses(clients, y)
        t = self.targets[pos]
        member = (
            torch.nn.functional.one_hot(t if self.by_label else t // 2, self.dim_x).to(self.dtype) * (w > 0)[..., None]
        )
        return (member * loss[..., None]).sum(1), member.sum(1)

    @staticmethod
    def _per_count(values, counts, empty: float) -> torch.Tensor:
        """values / counts for the cells present (count > 0), ``empty`` for the others (a mean count may be < 1)."""
        return torch.where(counts > 0, values / counts.clamp(min=torch.finfo(counts.dtype).tiny), empty)

    def _scaled_cell_losses(self, sums, counts) -> torch.Tensor:
        """L_s / tau for the cells present, -inf for the others: the argument of the smooth maximum."""
        return self._per_count(sums, counts, -torch.inf) / self.cfg.worst_group_temperature

    @property
    def pooled_outer_objective(self) -> bool:
        return self.cfg.outer_objective == "worst_group"

    def outer_statistics(self, clients, x, y):
        """(l_is, n_is) rows (B, 2C) for outer_objective = worst_group; None for the separable balanced loss."""
        if not self.pooled_outer_objective:
            return None
        with torch.no_grad():
            return torch.cat(self._cell_sums(clients, y), dim=1)

    @contextmanager
    def outer_linearised(self, mean_statistics):
        """f_i = sum_s p_s l_is / nbar_s with p = softmax(L / tau) at the pooled L_s (module docstring)."""
        sums, counts = mean_statistics[: self.dim_x], mean_statistics[self.dim_x :]
        p = torch.softmax(self._scaled_cell_losses(sums, counts), dim=0)
        self._cell_factor = self._per_count(p, counts, 0.0)
        try:
            yield
        finally:
            self._cell_factor = None

    def _outer_losses(self, clients, y, sample) -> torch.Tensor:
        """Per-client validation loss (B,): cell-balanced, or for worst_group the linearised pooled loss
        inside :meth:`outer_linearised` and the per-client surrogate outside (module docstring)."""
        if self.cfg.outer_objective == "worst_group":
            sums, counts = self._cell_sums(clients, y)
            if self._cell_factor is not None:
                return sums @ self._cell_factor
            return self.cfg.worst_group_temperature * torch.logsumexp(self._scaled_cell_losses(sums, counts), dim=1)
        pos, w, loss = self._validation_losses(clients, y)
        omega = w * self.inv_size[pos]
        omega = omega / omega.sum(1, keepdim=True)
        return (omega * loss).sum(1)

    # -- values (uncounted) --------------------------------------------------------------------------
    def inner_value(self, clients, x, y):
        with torch.no_grad():
            return self._inner_losses(clients, x, y, None, 0) + 0.5 * self.cfg.inner_regularization * squared_norms(y)

    def outer_value(self, clients, x, y):
        with torch.no_grad():
            return self._outer_losses(clients, y, None)

    # -- run interface -------------------------------------------------------------------------------
    def x_of_weights(self, text: str) -> torch.Tensor:
        """x with w(x) = the NAME=W pairs of ``text`` (the format of ``problem.initial_weights``; unnamed
        cells 1) rescaled to mean 1: x = log w, centred; 0 when ``text`` is empty."""
        names, text = self.cell_names(), text.strip()
        weights = dict.fromkeys(names, 1.0)
        for pair in filter(None, (p.strip() for p in text.split(","))):
            name, _, value = pair.partition("=")
            name = name.strip()
            if name not in weights:
                raise ConfigError(f"problem.initial_weights: {name!r} is not a cell; the cells are {', '.join(names)}")
            try:
                weights[name] = float(value)
            except ValueError:
                weights[name] = math.nan  # reported below, with the non-positive and infinite ones
            if not (weights[name] > 0 and math.isfinite(weights[name])):
                raise ConfigError(
                    f"problem.initial_weights: the weight of {name} must be a positive number, got {value.strip()!r}; "
                    "write NAME=W pairs separated by commas"
                )
        x = torch.log(torch.tensor([weights[n] for n in names], dtype=self.dtype, device=self.device))
        return x - x.mean()

    def initial_point(self):
        """x = x0 (:meth:`x_of_weights` of ``initial_weights``; 0: unweighted); y = 0 for logistic
        regression, a keyed U(+-1/sqrt(fan_in)) MLP otherwise."""
        x = self._x0.clone()
        if self.cfg.model == "logistic":
            return x, torch.zeros(self.dim_y, dtype=self.dtype, device=self.device)
        u = rng.uniform(rng.key(self.seed, rng.Purpose.INIT, 0), self.dim_y)
        scale = np.full(self.dim_y, 1 / math.sqrt(self.n_features))
        scale[self.cfg.hidden * self.n_features + self.cfg.hidden :] = 1 / math.sqrt(self.cfg.hidden)
        return x, torch.as_tensor((2 * u - 1) * scale, dtype=self.dtype, device=self.device)

    def cell_names(self) -> list[str]:
        if self.by_label:
            return [f"{g}_{label}" for g in self.group_names for label in ("le50K", "gt50K")]
        return list(self.group_names)

    def metric_info(self):
        info = {
            "test_accuracy": ("accuracy on adult.test", "%", True),
            "dp_gap": ("demographic-parity gap: max - min over groups of P(yhat = 1 | group), adult.test", "%"),
            "eo_gap": ("equal-opportunity gap: max - min over groups of the true-positive rate, adult.test", "%"),
            "worst_group_accuracy": ("lowest accuracy over the sensitive groups, adult.test", "%", True),
            "group_accuracy_gap": ("highest minus lowest accuracy over the sensitive groups, adult.test", "%", False),
            "test_loss": ("mean logistic loss on adult.test", "nats"),
            "balanced_test_loss": (
                "mean over (group, label) cells of the test loss (the balanced outer objective's target)",
                "nats",
            ),
            "worst_group_test_loss": (
                "highest mean test loss over the sensitive groups (the worst_group outer objective's target "
                "with weight_cells = group)",
                "nats",
            ),
            "worst_cell_accuracy": (
                "lowest accuracy over the (group, label) cells (group DRO's worst-group accuracy), adult.test",
                "%",
                True,
            ),
            "worst_cell_test_loss": (
                "highest mean test loss over the (group, label) cells (the worst_group outer objective's target "
                "with weight_cells = group_label)",
                "nats",
            ),
        }
        for name in self.cell_names():
            info[f"weight_{name}"] = (f"cell weight w(x) of {name} (mean 1)", "1")
        return info

    def evaluate(self, x, y):
        with torch.no_grad():
            z = self._logits(self.test_inputs[None], y[None])[0]
            t, g = self.test_labels, self.test_groups
            loss = binary_cross_entropy_with_logits(z, t.to(z.dtype))
            pred = z > 0
            correct = (pred == t.bool()).to(torch.float64)
            acc, positive, tpr, cell_loss, cell_acc, group_loss = [], [], [], [], [], []
            for s in range(self.n_groups):
                m = g == s
                if not bool(m.any()):
                    continue
                acc.append(float(correct[m].mean()))
                group_loss.append(float(loss[m].mean()))
                positive.append(float(pred[m].to(torch.float64).mean()))
                pos = m & t.bool()
                if bool(pos.any()):
                    tpr.append(float(pred[pos].to(torch.float64).mean()))
                for label in (0, 1):
                    cell = m & (t == label)
                    if bool(cell.any()):
                        cell_loss.append(float(loss[cell].mean()))
                        cell_acc.append(float(correct[cell].mean()))
            weights = self.cell_weights(x)
        out = {
            "test_accuracy": 100 * float(correct.mean()),
            "dp_gap": 100 * (max(positive) - min(positive)),
            "eo_gap": 100 * (max(tpr) - min(tpr)),
            "worst_group_accuracy": 100 * min(acc),
            "group_accuracy_gap": 100 * (max(acc) - min(acc)),
            "test_loss": float(loss.mean()),
            "balanced_test_loss": float(np.mean(cell_loss)),
            "worst_group_test_loss": max(group_loss),
            "worst_cell_accuracy": 100 * min(cell_acc),
            "worst_cell_test_loss": max(cell_loss),
        }
        out.update({f"weight_{name}": float(w) for name, w in zip(self.cell_names(), weights)})
        return out
