"""Problems written as the losses of one client (fednest_mpi.problems.derived.LossProblem), registered by
the tests as plugins (``derived_plugins:LossQuadratic``), so that the contract, chunk- and rank-count tests
check derived oracles like the built-ins."""

from dataclasses import dataclass

from fednest_mpi.config import QuadraticConfig, spec
from fednest_mpi.problems import QuadraticProblem
from fednest_mpi.problems.derived import LossProblem


@dataclass(frozen=True)
class LossQuadraticParams(QuadraticConfig):
    """The quadratic problem's fields (its closed forms stay valid); gradient_noise must stay 0."""

    name: str = spec("loss_quadratic", "problem kind")


class LossQuadratic(LossProblem, QuadraticProblem):
    """The quadratic problem (its data, closed-form solution and metrics) with the oracles derived from

    g_i(x, y) = 1/2 y^T G_i y - y^T (B_i x + c_i)
    f_i(x, y) = 1/2 (y - a_i)^T P_i (y - a_i) + lambda/2 ||x||^2 + e_i^T x
    """

    Params = LossQuadraticParams

    def client_batch(self, split, clients, sample, batch_size):
        return {k: self._local(k, clients) for k in "GBcPae"}

    def inner_loss(self, x, y, batch):
        return 0.5 * y @ batch["G"] @ y - y @ (batch["B"] @ x + batch["c"])

    def outer_loss(self, x, y, batch):
        r = y - batch["a"]
        return 0.5 * r @ batch["P"] @ r + 0.5 * self.cfg.outer_regularization * x @ x + batch["e"] @ x
