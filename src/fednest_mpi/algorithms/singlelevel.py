"""Single-level federated learning (FedNest paper section 3.3, eq. (14), Theorem 3.2): FedAvg and FedSVRG.

Design: a single-level objective min_y (1/M) sum_i g_i(x0, y) is the **inner level of any problem
with x frozen** at the problem's initial x0, so every problem of the simulator (quadratic, MNIST
with the full MLP of ``loss_tuning`` under ``tune_loss = false``, synthetic) doubles as an ordinary
FL task with no new oracle: y is the model, g_i the client's training loss, and the problem's
metrics (test accuracy, ``y_error`` = ||y - argmin g(x0, .)|| on the quadratic) measure it.

One outer iteration of the runner = ``inner_rounds`` rounds, each on a fresh client set S:

* ``fedavg``  (McMahan et al. 2017) = LFedInn (Alg. 6): tau local SGD steps from the global y,
  then y+ = mean_S y_i; one round;
* ``fedsvrg`` (FedLin-style; Alg. 2 applied to (14) as in the proof of Lemma F.1, which is Alg. 4
  with the roles renamed): y_{i,nu+1} = y_{i,nu} - beta (q_i(y_{i,nu}) - q_i(y) + q(y)) with
  q(y) = mean_S q_i(y); two rounds (q, then y).

On heterogeneous clients FedAvg's fixed point is biased by client drift; FedSVRG's correction
removes it (with full participation its fixed point is the exact minimiser). Both reuse the
FedNest family's FedInn/LFedInn code (:class:`~fednest_mpi.algorithms.fednest.InnerLevel`), so x is
never updated and no outer oracle is called.
"""

from __future__ import annotations

from fednest_mpi.algorithms.base import Algorithm
from fednest_mpi.algorithms.fednest import InnerLevel
from fednest_mpi.federation import Federation
from fednest_mpi.problems.base import BilevelProblem


class SingleLevel(InnerLevel, Algorithm):
    """FedAvg (``inner_variance_reduction = False``) or FedSVRG (``True``) on g(x0, .) with the parameters
    of :class:`~fednest_mpi.config.SingleLevelConfig` (see the module docstring); no state across iterations.
    Each client performs its own number of local steps (``heterogeneity.local_work``, :meth:`InnerLevel.fed_inn`)."""

    def __init__(self, cfg, problem: BilevelProblem, fed: Federation, seed: int, *, inner_variance_reduction: bool):
        super().__init__(cfg, problem, fed, seed)
        self.inner_variance_reduction = inner_variance_reduction

    @classmethod
    def rounds_per_iteration(cls, cfg, **options: bool) -> int:
        """T rounds (FedAvg) or 2T (FedSVRG: the anchor, then y)."""
        return (2 if options["inner_variance_reduction"] else 1) * cfg.inner_rounds

    def step(self, k: int, x, y):
        """Outer iteration k: ``inner_rounds`` FedAvg / FedSVRG rounds on y; x unchanged."""
        for t in range(self.cfg.inner_rounds):
            y = self.fed_inn(k, t, x, y)
        return x, y, {}
