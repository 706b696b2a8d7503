"""Exception types shared by the whole package.

A :class:`UsageError` is the user's mistake (bad config, missing data file): the command line
prints its message once and exits with code 2, without a traceback. Every other exception is a
failure of the run (exit code 1; under MPI the whole job is aborted).
"""


class UsageError(Exception):
    """A mistake in what the user asked for; the message names the field and the fix."""


class ConfigError(UsageError):
    """A config field has a wrong name, type or value."""


class DataError(UsageError):
    """A data file is missing, truncated or of the wrong format."""


class OutputLost(Exception):
    """A run's output file or client file was deleted or replaced while the run wrote it (exit code 1)."""
