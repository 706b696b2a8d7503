"""Plugins the tests register from outside the package: a problem and broken classes of every kind.

Imported by name (``tiny_plugins:...``) from tests/plugins on ``sys.path`` or ``PYTHONPATH``, as a
user's own module would be.
"""

from dataclasses import dataclass

from fednest_mpi.config import QuadraticConfig, spec
from fednest_mpi.errors import ConfigError
from fednest_mpi.problems import BilevelProblem, QuadraticProblem


@dataclass(frozen=True)
class ShiftedParams(QuadraticConfig):
    """The quadratic problem's fields (the closed forms stay valid) under a plugin name."""

    name: str = spec("tiny_quadratic", "problem kind")


class TinyQuadratic(QuadraticProblem):
    """The quadratic problem, registered as a plugin (its closed-form x* is the built-in's)."""

    Params = ShiftedParams


@dataclass(frozen=True)
class EvenParams(QuadraticConfig):
    """A plugin parameter class with a check among its own fields, on top of the inherited ones."""

    name: str = spec("even_quadratic", "problem kind")

    def check(self) -> None:
        super().check()
        if self.n_clients % 2:
            raise ConfigError(
                f"problem.n_clients: {self.n_clients} is odd; this plugin pairs clients, use an even count"
            )


class EvenQuadratic(QuadraticProblem):
    """The quadratic problem with a plugin's own cross-field check."""

    Params = EvenParams


class NoParams(QuadraticProblem):
    """A problem class that forgot its parameter class."""


@dataclass
class _Mutable:
    name: str = "mutable"
    n_clients: int = 4


class MutableParams(QuadraticProblem):
    Params = _Mutable


@dataclass(frozen=True)
class _NoDefault:
    n_clients: int
    name: str = "nodefault"


class NoDefaultParams(QuadraticProblem):
    Params = _NoDefault


@dataclass(frozen=True)
class _ListField:
    name: str = "listfield"
    n_clients: int = 4
    weights: tuple = (1, 2)


class ListFieldParams(QuadraticProblem):
    Params = _ListField


@dataclass(frozen=True)
class _NoClients:
    name: str = "noclients"


class NoClientsParams(QuadraticProblem):
    Params = _NoClients


not_a_class = 3


class NoOracle(BilevelProblem):  # three oracles of five, under their public names
    """A problem that forgot two of its oracles."""

    Params = ShiftedParams

    def grad_x_outer(self, clients, x, y, sample): ...

    def grad_y_outer(self, clients, x, y, sample): ...

    def jvp_xy_inner(self, clients, x, y, v, sample): ...

    def initial_point(self): ...

    def evaluate(self, x, y): ...

    def metric_info(self): ...
