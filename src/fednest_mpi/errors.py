"""Exception types shared by the whole package.

A :class:`UsageError` is the user's mistake (bad config, missing data file): the library raises it
on every rank; the command line prints its message once and exits with code 2, without a traceback.
A :class:`RunFailed` is a run that ended without its results (exit code 1). Every other exception is a
failure of the run (exit code 1; under MPI the whole job is aborted).
"""


class UsageError(Exception):
    """A mistake in what the user asked for; the message names the field and the fix."""


class ConfigError(UsageError):
    """A config field has a wrong name, type or value."""


class DataError(UsageError):
    """A data file is missing, truncated or of the wrong format."""


class RunFailed(Exception):
    """A run ended without its results (NaN/Inf, an output deleted while written, an exception in the run):
    :meth:`fednest_mpi.session.Session.run_to_file` raises it with the one-line message; the command line
    prints it and exits with code 1. ``__cause__`` holds the exception that ended the run, if any."""


class OutputLost(Exception):
    """A run's output file or client file was deleted or replaced while the run wrote it (exit code 1)."""


class RanksDisagree(Exception):
    """The ranks hold different iterates (``run.check_consistency``, :mod:`fednest_mpi.consistency`); every rank
    raises it after the same iteration (exit code 1)."""
