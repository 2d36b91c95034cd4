"""Errors a user can fix: the CLI prints them as one line (``error: ...``) and exits with status 2.

Raise a :class:`ReproError` subclass for anything caused by the user's configuration or environment (an
unknown key, a missing data file); let programming errors surface as ordinary exceptions with their traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ReproError(Exception):
    """Base of the errors the command line reports as one line, without a traceback."""


class ConfigError(ReproError):
    """A configuration mistake: unknown key or config name, a value a constructor does not accept."""


class MissingTableError(ConfigError, KeyError):
    """An oracle table the run needs has no entry for its models (a draft/target pair, a target's EAGLE head): a
    config mistake, and a :class:`KeyError` (a lookup that failed), printed as its plain message."""

    __str__ = Exception.__str__


class DataMissingError(ReproError):
    """A data file the run needs is missing (the message names the file and where it was looked for)."""


class PlanError(AssertionError):
    """A policy returned a plan that breaks the engine's invariants (a bug in the policy).

    Not a :class:`ReproError`: it surfaces with its traceback. Here, below every module that raises it
    (:mod:`repro.sim.plan` re-exports it).
    """


def suggest(word: str, known: Iterable[str], n: int = 1, cutoff: float = 0.6, parts: bool = False) -> str:
    """`` (did you mean 'x'?)`` for the ``n`` closest known words (`` (did you mean 'x', 'y'?)``), or an empty string
    (for an error message). With ``parts``, where nothing is close, the known words that contain ``word``
    (``llama2-7`` -> ``llama2-7b``)."""
    words = list(known)
    close = difflib.get_close_matches(word, words, n=n, cutoff=cutoff)
    if not close and parts:
        close = [k for k in words if word.lower() in k.lower()][:n]
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
