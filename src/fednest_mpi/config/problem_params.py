"""The parameter classes of the built-in problems (the ``[problem]`` section, chosen by ``name``).

Each is the ``Params`` of its problem, as a plugin's are (docs/extending.md); a ``check`` method holds the
checks that involve several of its fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from fednest_mpi.config.fields import spec
from fednest_mpi.errors import ConfigError


@dataclass(frozen=True)
class QuadraticConfig:
    """Heterogeneous quadratic bilevel problem with closed-form solution (tests, quickstart)."""

    name: str = spec("quadratic", "problem kind", choices=("quadratic",))
    n_clients: int = spec(100, "number of clients M", low=1)
    dim_x: int = spec(10, "outer dimension d1", low=1)
    dim_y: int = spec(20, "inner dimension d2", low=1)
    strong_convexity: float = spec(
        1.0, "lower bound mu of every client's inner Hessian eigenvalues", low=0.0, low_open=True
    )
    smoothness: float = spec(
        4.0, "upper bound L of every client's inner Hessian eigenvalues (>= strong_convexity)", low=0.0, low_open=True
    )
    heterogeneity: float = spec(
        1.0, "scale of client-to-client differences in g_i and f_i (0 = identical clients)", low=0.0
    )
    gradient_noise: float = spec(
        0.0, "std of the additive Gaussian noise of every stochastic gradient oracle (0 = exact)", low=0.0
    )
    outer_regularization: float = spec(1.0, "weight of the (lambda/2)||x||^2 term in every f_i", low=0.0)
    lower_level: str = spec(
        "global",
        "global: one lower level y*(x) = argmin mean_i g_i (FedNest eq. (1)); local: every client its own "
        "y*_i(x) = argmin g_i (FedBiO eq. (7)); sets x* and the metrics",
        choices=("global", "local"),
    )

    def stored_numbers_per_client(self) -> int:
        """G, P (dim_y^2 each), B (dim_y x dim_x), c, a (dim_y), e (dim_x): the memory check (memory.py)."""
        return 2 * self.dim_y**2 + self.dim_y * self.dim_x + 2 * self.dim_y + self.dim_x

    def check(self) -> None:
        """mu <= L."""
        if self.smoothness < self.strong_convexity:
            raise ConfigError(
                f"problem.smoothness: {self.smoothness} is below problem.strong_convexity = {self.strong_convexity}; "
                "the Hessian spectrum needs mu <= L"
            )


@dataclass(frozen=True)
class DataSetSpec:
    """A real data set: its folder under a data root and its name in messages."""

    folder: str
    title: str
    images: bool  # IDX images, for the MNIST problems' problem.dataset


#: The real data sets by name, for ``problem.dataset``, ``fednest-mpi download`` and the data layer's folders.
DATASETS = {
    "mnist": DataSetSpec("mnist", "MNIST", images=True),
    "fashion": DataSetSpec("fashion-mnist", "Fashion-MNIST", images=True),
    "adult": DataSetSpec("adult", "Adult", images=False),
}
IMAGE_DATASETS = tuple(name for name, d in DATASETS.items() if d.images)


@dataclass(frozen=True)
class ImageClientsConfig:
    """Fields shared by the MNIST problems: data, clients and their local splits, minibatches."""

    name: str = spec("", "problem kind")
    dataset: str = spec("mnist", "image data set (same IDX format)", choices=IMAGE_DATASETS)
    data_dir: str = spec("", "data directory; empty: the FEDNEST_DATA environment variable")
    data_file: str = spec(
        "",
        "your own data: a federated data-set file (docs/data.md; `fednest-mpi data convert`) of 784 features "
        "and 10 classes, whose clients replace dataset and partition; empty: the data set split by partition",
    )
    n_clients: int = spec(100, "number of clients M", low=1)
    partition: str = spec(
        "shards",
        "iid; shards: McMahan non-iid (label-sorted shards); dirichlet: label skew",
        choices=("iid", "shards", "dirichlet"),
    )
    shards_per_client: int = spec(
        2, "shards per client (partition = shards; n_clients * shards_per_client shards)", low=1
    )
    dirichlet_alpha: float = spec(
        0.5, "Dirichlet concentration (partition = dirichlet; small = skewed)", low=0.0, low_open=True
    )
    val_fraction: float = spec(
        0.2, "fraction of each client's samples in its outer (validation) split", low=0.0, low_open=True, high=0.95
    )
    batch_size: int = spec(64, "minibatch size of the inner (FedInn) local steps", low=1)
    hypergradient_batch_size: int = spec(
        0, "minibatch of the outer/second-order oracles; 0 = the client's whole split (authors' code)", low=0
    )
    inner_regularization: float = spec(
        0.001, "lambda of the squared L2 term (lambda/2)||y||^2 in g_i (strong convexity)", low=0.0
    )


def _model(role: str):
    return spec(
        "",
        f"your own network (docs/extending.md): 'module:Class', a torch.nn.Module built with no arguments on every "
        f"rank, {role}; the oracles are then derived from the losses with torch.func; empty: the paper's MLP",
    )


def _derived_oracles():
    return spec(
        False,
        "derive the oracles of the paper's MLP from its losses with torch.func (problems/derived.py) instead of "
        "the closed forms (the same numbers to rounding); a model implies it",
    )


def check_model(cfg) -> None:
    """``model`` names 'module:Class' (imported when the problem is built, on every rank)."""
    module, _, attr = cfg.model.partition(":")
    if cfg.model and (not module or not attr):
        raise ConfigError(f"problem.model: {cfg.model!r} is not of the form 'module:Class'; write e.g. 'my_nets:LeNet'")


@dataclass(frozen=True)
class HyperRepresentationConfig(ImageClientsConfig):
    """Hyper-representation learning on MNIST (paper section 4.1): x = hidden layer, y = linear head."""

    name: str = spec("hyper_representation", "problem kind", choices=("hyper_representation",))
    hidden: int = spec(200, "width H of the hidden layer (x has 785 H numbers, y 10 H + 10)", low=1)
    dropout: float = spec(
        0.0, "dropout probability before the ReLU in training oracles (authors' code: 0.5)", low=0.0, high=0.9
    )
    model: str = _model("the body from (n, 784) image rows to (n, H) features: x = its parameters, y = a linear head")
    derived_oracles: bool = _derived_oracles()

    def check(self) -> None:
        """McMahan's shards split the 60,000 training images evenly; derived oracles take no dropout."""
        check_model(self)
        if (self.model or self.derived_oracles) and self.dropout > 0:
            raise ConfigError(
                "problem.dropout: the derived oracles (problem.model, problem.derived_oracles) take no dropout "
                "(a network's own dropout would draw from torch's global generator); set problem.dropout = 0"
            )
        if not self.data_file and self.partition == "shards" and 60000 % (self.n_clients * self.shards_per_client):
            raise ConfigError(
                f"problem.shards_per_client: {self.n_clients} clients x {self.shards_per_client} shards "
                "does not divide the 60000 "
                "training images into equal shards; choose n_clients * shards_per_client dividing 60000"
            )


@dataclass(frozen=True)
class LossTuningConfig(ImageClientsConfig):
    """VS-loss tuning on long-tail MNIST (paper section 4.2): x = logit adjustments, y = a 3-layer MLP."""

    name: str = spec("loss_tuning", "problem kind", choices=("loss_tuning",))
    imbalance_ratio: float = spec(
        100.0, "size ratio of the largest to the smallest class of the long-tail training set", low=1.0
    )
    max_per_class: int = spec(6000, "size of the largest class before the exponential decay", low=1)
    hidden1: int = spec(200, "width of the first hidden layer of the MLP y; 0 drops the layer", low=0)
    hidden2: int = spec(
        100,
        "width of the second hidden layer of the MLP y; 0 drops the layer (both 0: multinomial "
        "logistic regression, convex in y)",
        low=0,
    )
    tune_loss: bool = spec(
        True, "tune the VS-loss x; false: plain cross-entropy with x fixed at 0 (the untuned baseline)"
    )
    model: str = _model("the network y from (n, 784) image rows to (n, 10) logits (hidden1, hidden2 unused)")
    derived_oracles: bool = _derived_oracles()

    def check(self) -> None:
        """``model`` is 'module:Class'."""
        check_model(self)


@dataclass(frozen=True)
class MinimaxConfig:
    """Federated saddle-point problem of paper section 4.3 / Figure 4 (g_i = -f_i, closed-form saddle point)."""

    name: str = spec("minimax", "problem kind", choices=("minimax",))
    n_clients: int = spec(1000, "number of clients M", low=1)
    dim: int = spec(10, "dimension d of x and of y", low=1)
    heterogeneity: float = spec(1.0, "s: b'_i ~ N(0, s^2 I) before centring across clients", low=0.0)
    coupling_max: float = spec(0.1, "A_i = t_i I with t_i ~ U(0, coupling_max)", low=0.0)
    outer_regularization: float = spec(
        10.0, "lambda of the (lambda/2)||x||^2 term in every f_i (paper text: 10)", low=0.0, low_open=True
    )
    initial_value: float = spec(10.0, "every coordinate of x0 and y0 (authors' notebook: 10)")

    def stored_numbers_per_client(self) -> int:
        """t_i and b_i (dim): the memory check (memory.py)."""
        return 1 + self.dim


@dataclass(frozen=True)
class CompositionalConfig:
    """Federated compositional problem (paper eq. (2.1), section 3.2): linear r_i, quadratic f_i, known x*."""

    name: str = spec("compositional", "problem kind", choices=("compositional",))
    n_clients: int = spec(20, "number of clients M", low=1)
    dim_x: int = spec(5, "outer dimension d1", low=1)
    dim_y: int = spec(10, "inner dimension d2 (>= dim_x, so that x* is unique)", low=1)
    heterogeneity: float = spec(
        1.0, "scale of client-to-client differences in r_i and f_i (0 = identical clients)", low=0.0
    )

    def stored_numbers_per_client(self) -> int:
        """R (dim_y x dim_x), c, a, p (dim_y): the memory check (memory.py)."""
        return self.dim_y * self.dim_x + 3 * self.dim_y

    def check(self) -> None:
        """dim_y >= dim_x, so that x* is unique."""
        if self.dim_y < self.dim_x:
            raise ConfigError(
                f"problem.dim_y: {self.dim_y} is below problem.dim_x = {self.dim_x}; "
                "the compositional x* is unique only for dim_y >= dim_x"
            )


@dataclass(frozen=True)
class SyntheticConfig:
    """Hyper-representation (x = representation layer, y = linear head) on FedProx's Synthetic(alpha, beta) data,
    generated per client from (seed, client id): any number of clients (scaling runs)."""

    name: str = spec("synthetic", "problem kind", choices=("synthetic",))
    n_clients: int = spec(1000, "number of clients M (data are generated on demand, so 10^6 costs no memory)", low=1)
    alpha: float = spec(1.0, "model heterogeneity: u_i ~ N(0, alpha^2), W_i, b_i ~ N(u_i, 1)", low=0.0)
    beta: float = spec(
        1.0, "input heterogeneity: B_i ~ N(0, beta^2), v_i ~ N(B_i, 1), a ~ N(v_i, diag(j^-1.2))", low=0.0
    )
    n_inputs: int = spec(60, "input dimension d", low=1)
    n_classes: int = spec(10, "number of classes C", low=2)
    samples_per_client: int = spec(100, "samples per client (fixed), or their median (lognormal)", low=2)
    size_distribution: str = spec(
        "fixed",
        "fixed: every client has samples_per_client; lognormal: heavy-tailed sizes",
        choices=("fixed", "lognormal"),
    )
    size_sigma: float = spec(2.0, "sigma of the lognormal sample counts (FedProx: 2)", low=0.0)
    max_samples: int = spec(
        1000, "cap on a client's sample count (lognormal); clients are padded to the largest of a round", low=2
    )
    val_fraction: float = spec(
        0.2, "fraction of each client's samples in its outer (validation) split", low=0.0, low_open=True, high=0.95
    )
    hidden: int = spec(64, "width H of the representation layer (x has (d + 1) H numbers, y C H + C)", low=1)
    dropout: float = spec(0.0, "dropout probability before the ReLU in training oracles", low=0.0, high=0.9)
    batch_size: int = spec(16, "minibatch size of the inner (FedInn) local steps", low=1)
    hypergradient_batch_size: int = spec(
        0, "minibatch of the outer/second-order oracles; 0 = the client's whole split", low=0
    )
    inner_regularization: float = spec(
        0.001, "lambda of the squared L2 term (lambda/2)||y||^2 in g_i (strong convexity)", low=0.0
    )
    eval_clients: int = spec(100, "evaluation: clients 0..eval_clients-1 ...", low=1)
    eval_samples: int = spec(100, "... each with this many fresh samples (a separate stream)", low=1)
    kept_clients_memory: int = spec(
        0,
        "MiB per rank of generated clients kept across client sets and iterations, least recently used "
        "first out (0: only the last sets, 64 MiB): generation is paid once per client while they fit "
        "(100,000 clients of 100 samples: 2.4 GB); results do not depend on it",
        low=0,
    )


@dataclass(frozen=True)
class FairnessConfig:
    """Fair federated learning on UCI Adult (FedBiOAcc paper's application): x = group weights, y = a classifier."""

    name: str = spec("fairness", "problem kind", choices=("fairness",))
    data_dir: str = spec("", "data directory holding adult/; empty: the FEDNEST_DATA environment variable")
    n_clients: int = spec(20, "number of clients M", low=1)
    sensitive: str = spec("sex", "sensitive attribute defining the groups", choices=("sex", "race"))
    weight_cells: str = spec(
        "group",
        "what x weights: group (one weight per sensitive group) or group_label "
        "(one per (group, label) cell); the validation set is balanced over the same cells",
        choices=("group", "group_label"),
    )
    dirichlet_alpha: float = spec(
        0.5,
        "Dirichlet concentration of the split of the training set over clients, "
        "by (group, label) cell (small = skewed)",
        low=0.0,
        low_open=True,
    )
    val_per_cell: int = spec(
        100,
        "samples per weighted cell in the group-balanced validation set (taken from adult.data, "
        "dealt round-robin to the clients)",
        low=1,
    )
    outer_objective: str = spec(
        "balanced",
        "outer loss: balanced (f_i = mean over the weighted cells of the cell's mean loss on the "
        "client's validation split) or worst_group (tau logsumexp over the weighted cells of the pooled "
        "cell loss / tau, tau = worst_group_temperature: a smooth worst-group loss; fednest and fednest_sgd "
        "only, one extra round per outer iteration)",
        choices=("balanced", "worst_group"),
    )
    worst_group_temperature: float = spec(
        0.05, "tau of outer_objective = worst_group (-> 0: the max over groups)", low=0.0, low_open=True
    )
    initial_weights: str = spec(
        "",
        "cell weights at the start, as NAME=W pairs separated by commas (NAME: a group, or GROUP_le50K / "
        "GROUP_gt50K with weight_cells = group_label; unnamed cells 1; rescaled to mean 1); empty: all 1. "
        "With algorithm fedavg (x fixed) this retrains the classifier with given, e.g. tuned, weights",
    )
    group_feature: bool = spec(
        True,
        "whether the classifier sees the sensitive attribute (its one-hot columns); false: "
        "'fairness through unawareness', the groups share one intercept and the weights decide the compromise",
    )
    model: str = spec(
        "logistic", "classifier y: logistic regression or a one-hidden-layer MLP", choices=("logistic", "mlp")
    )
    hidden: int = spec(16, "hidden width of the MLP (model = mlp)", low=1)
    batch_size: int = spec(64, "minibatch size of the inner local steps", low=1)
    hypergradient_batch_size: int = spec(
        0,
        "minibatch of the second-order oracles (training split); 0 = the client's whole split; "
        "the outer loss always uses the client's whole (small) validation split",
        low=0,
    )
    inner_regularization: float = spec(0.01, "mu of the (mu/2)||y||^2 term in g_i (strong convexity)", low=0.0)

    @property
    def pooled_outer_objective(self) -> bool:
        """Whether f is a function of the pooled validation set (needs an algorithm that can pool it)."""
        return self.outer_objective == "worst_group"
