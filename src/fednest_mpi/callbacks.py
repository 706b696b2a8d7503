"""Callbacks of a run: what :meth:`fednest_mpi.runner.Simulation.run` tells the code that watches it (the
run file's writer, the progress line, the session's watchdog, the TensorBoard and MLflow writers of
:mod:`fednest_mpi.writers`, a user's own logger), at six points:

* ``on_start(sim, k)``: before the first iteration (``k``: 0, or the iteration a resumed run continues after);
* ``on_evaluation(k, metrics)``: the problem's metrics of iteration k, once every rank agreed they are sound;
* ``on_iteration(k, row)``: the record of iteration k (every column of the run file), after the evaluation;
* ``on_checkpoint(k, folder)``: a checkpoint of iteration k was written to ``folder``;
* ``on_end(result)``: the run returned (:class:`~fednest_mpi.runner.RunResult`; not after an exception);
* ``on_error(error)``: the run raised ``error`` on this rank (any exception, also ``KeyboardInterrupt``), which
  it raises again after the callbacks (an exception of ``on_error`` itself is logged, not raised); a session
  also calls it on the ranks that another rank's failure ends.

A callback is any object with some of these methods (:class:`Callback` has all of them, doing nothing). They
are called on every rank, in the order given, after the iteration's collectives: a callback must not call
MPI. The built-in ones: :class:`Recorder` (rank 0's run file) and :class:`fednest_mpi.runner.Progress`.
No MPI, no HDF5 here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

logger = logging.getLogger(__name__)

POINTS = ("on_start", "on_evaluation", "on_iteration", "on_checkpoint", "on_end", "on_error")


class Callback:
    """The six points of a run, doing nothing: subclass it and override those you need."""

    def on_start(self, sim, k: int) -> None:
        """Before the first iteration (k: 0, or the iteration a resumed run continues after)."""

    def on_evaluation(self, k: int, metrics: dict[str, float]) -> None:
        """The problem's metrics of iteration k (the same on every rank)."""

    def on_iteration(self, k: int, row: dict[str, float]) -> None:
        """The record of iteration k: every column of the run file's /iterations."""

    def on_checkpoint(self, k: int, folder) -> None:
        """A checkpoint of iteration k was written to ``folder``."""

    def on_end(self, result) -> None:
        """The run returned ``result`` (a RunResult)."""

    def on_error(self, error: BaseException) -> None:
        """The run raised ``error`` on this rank (or, in a session, another rank's failure ended it)."""


class Recorder(Callback):
    """Appends each iteration's row to ``writer`` (rank 0's :class:`~fednest_mpi.io.h5.RunWriter`)."""

    def __init__(self, writer):
        self.writer = writer

    def on_iteration(self, k: int, row: dict[str, float]) -> None:
        self.writer.append(row)

    def row_digests(self, rows: int):
        """Digests of the first ``rows`` rows written (what a checkpoint records for ``--resume`` to check)."""
        return self.writer.row_digests(rows)

    def main_digests(self, rows: int):
        """Digests of the first ``rows`` iterations of the run file's /ranks and /snapshots (the same for --resume)."""
        return self.writer.main_digests(rows)

    def attr_digests(self):
        """Digests of the run file's attributes (what a checkpoint records for ``--resume`` to check)."""
        return dict(self.writer.attr_digests)


class Callbacks:
    """Several callbacks called as one, in order; methods a callback lacks are skipped."""

    def __init__(self, callbacks: Iterable = ()):
        self.callbacks = [c for c in callbacks if c is not None]

    def call(self, point: str, *args) -> None:
        for callback in self.callbacks:
            method = getattr(callback, point, None)
            if method is not None:
                method(*args)

    def tell_error(self, error: BaseException) -> None:
        """``on_error(error)`` to every callback, even when one of them raises (its exception logged, not raised:
        the run's own exception is the one to report)."""
        for callback in self.callbacks:
            method = getattr(callback, "on_error", None)
            try:
                if method is not None:
                    method(error)
            except Exception:  # noqa: BLE001 -- logged; the run's exception follows
                logger.exception("%s.on_error failed", type(callback).__name__)

    def first(self, query: str, *args):
        """The answer of the first callback that has method ``query``, or None."""
        for callback in self.callbacks:
            method = getattr(callback, query, None)
            if method is not None:
                return method(*args)
        return None
