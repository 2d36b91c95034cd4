"""Errors a user can fix: the CLI prints them as one line (``error: ...``) and exits with status 2.

Raise a :class:`ReproError` subclass for anything caused by the user's configuration or environment (an
unknown key, a missing data file); let programming errors surface as ordinary exceptions with their traceback.
"""

from __future__ import annotations


class ReproError(Exception):
    """Base of the errors the command line reports as one line, without a traceback."""


class ConfigError(ReproError):
    """A configuration mistake: unknown key or config name, a value a constructor does not accept."""


class DataMissingError(ReproError):
    """A data file the run needs is missing (the message names the file and where it was looked for)."""
