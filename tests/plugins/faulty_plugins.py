"""Plugins that break their contract on purpose (tests/unit/test_boundary.py): a problem and an algorithm
whose ``fault`` field names the mistake, made on the rank ``fault_rank`` (-1: every rank).

Imported by name (``faulty_plugins:FaultyQuadratic``) from tests/plugins on ``sys.path`` or ``PYTHONPATH``.
"""

import io
import os
import signal
import sys
import threading
from dataclasses import dataclass

import torch
from derived_plugins import LossQuadratic

from fednest_mpi.api import FedNest, FedNestConfig, QuadraticConfig, QuadraticProblem, State, spec

#: faults of the problem after its probe (every oracle called twice at construction)
LATE = ("system_exit", "keyboard_interrupt", "shape_late", "unprintable", "stop_iteration")


class Unprintable(Exception):
    """An exception whose message cannot be made: its ``__str__`` raises."""

    def __str__(self):
        raise RuntimeError("no message")


@dataclass(frozen=True)
class FaultyParams(QuadraticConfig):
    name: str = spec("faulty_quadratic", "problem kind")
    fault: str = spec("", "the mistake (tests/plugins/faulty_plugins.py)")
    fault_rank: int = spec(-1, "the rank that makes it (-1: every rank)", low=-1)


class FaultyQuadratic(QuadraticProblem):
    """The quadratic problem, with the public oracle names, and one mistake."""

    Params = FaultyParams

    def __init__(self, cfg, seed, clients, device="cpu", dtype=torch.float64):
        super().__init__(cfg, seed, clients, device=device, dtype=dtype)
        self.calls = 0
        if cfg.fault == "no_super_init":  # as if BilevelProblem.__init__ had not been called
            del self.oracle_counts, self.unchecked_calls
        if cfg.fault == "negative_dim":
            self.dim_x = -self.dim_x
        if cfg.fault == "bool_clients":
            self.n_clients = True
        if cfg.fault == "close_stdout":  # e.g. a library that closes what it took for its own log file
            sys.stdout.close()
        if cfg.fault == "replace_stdout":  # silencing a chatty library for good: the run's own lines go too
            sys.stdout = io.StringIO()
        if cfg.fault == "chdir":  # to read its data by relative names: the run's relative paths would move too
            os.chdir("..")
        if cfg.fault == "ignore_sigint":  # Ctrl-C would do nothing: the run's stop request is gone
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self._faulty() == "thread":  # a thread that is no daemon and never ends: the interpreter waits for it
            threading.Thread(target=threading.Event().wait, name="plugin-thread").start()
        if self._faulty() == "sleep_in_init":  # a constructor that blocks for ever (e.g. on a lock or a file)
            threading.Event().wait()

    def _faulty(self) -> str:
        from fednest_mpi.comm import world

        rank = world().Get_rank()
        return self.cfg.fault if self.cfg.fault_rank in (-1, rank) else ""

    def initial_point(self):
        self.x0, y0 = super().initial_point()  # kept: "keep_x0" writes into it later
        return self.x0, y0

    def grad_x_outer(self, clients, x, y, sample):
        out = self._grad_x_outer_quadratic(clients, x, y, sample)
        self.calls += 1
        fault, late = self._faulty(), self.calls > 3  # the probe calls it three times
        if fault == "keep_x0" and late:  # its own x0, as a buffer: the run's x must not move with it
            self.x0.mul_(0.5)
        if fault == "system_exit" and late:
            raise SystemExit(3)
        if fault == "keyboard_interrupt" and late:
            raise KeyboardInterrupt
        if fault == "unprintable" and late:
            raise Unprintable
        if fault == "stop_iteration" and late:  # reaches the run through a generator: PEP 479 makes it a RuntimeError
            raise StopIteration
        if fault == "shape" or (fault == "shape_late" and late):
            return out[0]
        if fault == "float32":
            return out.float()
        if fault == "numpy":
            return out.numpy()
        if fault == "random":
            return out + torch.randn(out.shape, dtype=out.dtype)
        if fault == "nan":
            return out * torch.nan
        if fault == "block":  # rows that depend on the block: deterministic, yet not chunk- or rank-invariant
            return out * (1.0 + 0.01 * len(clients))
        if fault == "requires_grad":  # an autograd result not detached
            return out.detach().requires_grad_(True) * 1.0
        if fault == "nan_last_client" and late:  # one client's row only: the probe's two clients are fine
            return torch.where(torch.as_tensor(clients == clients.max())[:, None], torch.nan, out)
        if fault == "mutate_x":  # writes into its argument (rows of their own; a shared row refuses the write)
            x.mul_(0.5)
        if fault == "sleep" and late:  # blocks for ever
            threading.Event().wait()
        if fault == "abort" and late:  # a C-level abort: SIGABRT, no Python code runs any more
            os.abort()
        return out

    def _grad_x_outer_quadratic(self, clients, x, y, sample):
        return super().grad_x_outer(clients, x, y, sample)  # the quadratic's: QuadraticProblem._grad_x_outer

    def evaluate(self, x, y):
        metrics = super().evaluate(x, y)
        if self._faulty() == "metric":
            metrics["surprise"] = 1.0
        if self._faulty() == "tensor_metric":
            metrics["x_error"] = torch.linalg.vector_norm(x)
        if self._faulty() == "nan_metric" and self.calls > 3:
            metrics["x_error"] = float("nan")
        return metrics

    def metric_info(self):
        info = super().metric_info()
        return list(info) if self._faulty() == "metric_names" else info  # names without (description, units)


@dataclass(frozen=True)
class SubclassParams(FaultyParams):
    name: str = spec("subclassed_quadratic", "problem kind")


class SubclassedQuadratic(FaultyQuadratic):
    """A plugin that extends another plugin's public oracle through super(): the same values, counted once."""

    Params = SubclassParams

    def grad_x_outer(self, clients, x, y, sample):
        return super().grad_x_outer(clients, x, y, sample) + 0.0

    def grad_y_inner(self, clients, x, y, sample):
        return super().grad_y_inner(clients, x, y, sample) * 1.0


@dataclass(frozen=True)
class FaultyFedNestParams(FedNestConfig):
    name: str = spec("faulty_fednest", "algorithm")
    fault: str = spec("", "the mistake (tests/plugins/faulty_plugins.py)")
    fault_rank: int = spec(-1, "the rank that makes a fault of step (-1: every rank)", low=-1)
    fault_at: int = spec(1, "the first iteration whose step makes it", low=1)


@dataclass
class CountingState(State):
    steps: int = 0  # not a tensor: checkpoints cannot save it


class FaultyFedNest(FedNest):
    """FedNest with one mistake."""

    Params = FaultyFedNestParams
    options = {"inner_variance_reduction": True, "global_outer": True}

    def __init__(self, cfg, problem, fed, seed, **variant):
        if cfg.fault == "no_super_init":
            self.cfg = cfg
            return
        super().__init__(cfg, problem, fed, seed, **variant)
        if cfg.fault == "int_state":
            self.state = CountingState()

    @classmethod
    def rounds_per_iteration(cls, cfg, **variant):
        declared = super().rounds_per_iteration(cfg, **variant)
        return {"rounds": 3, "rounds_negative": -1, "rounds_none": None}.get(cfg.fault, declared)

    def step(self, k, x, y):
        given = x
        x, y, diag = super().step(k, x, y)
        if k >= self.cfg.fault_at and self.cfg.fault_rank in (-1, self.fed.rank):
            if self.cfg.fault == "rank_x":  # rank-dependent: this rank's x moves by one part in 2**40
                x = x * (1.0 + 2.0**-40)
            if self.cfg.fault == "os_exit":  # the process ends at once: no exception, no file closed
                os._exit(3)
        if self.cfg.fault == "new_field":  # an attribute the State class does not declare: never checkpointed
            self.state.seen = torch.ones(1)
        if self.cfg.fault == "x_in_place":  # the update written into x_k itself: the server optimiser's x_k is gone
            return given.copy_(x), y, diag
        if self.cfg.fault == "x_shape":
            return x[:-1], y, diag
        if self.cfg.fault == "not_a_tuple":
            return x
        if self.cfg.fault == "tensor_diagnostic":
            return x, y, {**diag, "hypergradient_estimate_norm": torch.ones(2)}
        if self.cfg.fault == "tuple_x":
            return (x,), y, diag
        return x, y, diag


@dataclass(frozen=True)
class TextDefaultParams(QuadraticConfig):
    name: str = spec("text_default", "problem kind")
    scale: float = spec("1.0", "a float field whose default is text")


class TextDefault(QuadraticProblem):
    """A problem whose parameter class gives a float field a text default."""

    Params = TextDefaultParams


@dataclass(frozen=True)
class LowDefaultParams(QuadraticConfig):
    name: str = spec("low_default", "problem kind")
    width: int = spec(0, "an int field whose default is below its range", low=1)


class LowDefault(QuadraticProblem):
    """A problem whose parameter class gives an int field a default outside its range."""

    Params = LowDefaultParams


@dataclass(frozen=True)
class RandomLossParams(QuadraticConfig):
    name: str = spec("random_loss", "problem kind")


class RandomLoss(LossQuadratic):
    """The quadratic problem from its losses, with a draw of torch's global generator in the outer loss."""

    Params = RandomLossParams

    def outer_loss(self, x, y, batch):
        return super().outer_loss(x, y, batch) + torch.rand((), dtype=x.dtype)
