"""Compiled kernels for the step-by-step path's per-node inner loops, with their NumPy references.

A kernel here is a plain Python function over NumPy arrays and scalars, written so that Numba compiles it
(``numba.njit``, no ``fastmath``: every floating-point operation is the one its NumPy reference performs, in the same
order, so results are bit-identical). Where Numba is not installed, or ``REPRO_JIT=0`` is set, callers use the NumPy
reference instead; the tests run both and compare them.

Numba is imported on the first kernel call, not with the package: a fast-forwarded run, which calls no kernel, never
pays for it. Compiled code is cached on disk (``cache=True``, beside the module, or under ``NUMBA_CACHE_DIR`` where that
is not writable), so only a machine's first run compiles (a second or two per kernel).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from typing import Any


def enabled() -> bool:
    """Whether compiled kernels are used: Numba importable and ``REPRO_JIT`` not ``0`` (read once per process, and
    again after :func:`refresh`: a step asks several times, and reading the environment costs a microsecond)."""
    on = _ON[0]
    if on is None:
        on = _ON[0] = _numba() is not None and os.environ.get("REPRO_JIT", "1") != "0"
    return on


_ON: list[bool | None] = [None]


def refresh() -> None:
    """Read ``REPRO_JIT`` again at the next :func:`enabled` (a test that sets it)."""
    _ON[0] = None


@functools.cache
def _numba() -> Any:
    try:
        return importlib.import_module("numba")
    except ImportError:  # the NumPy references serve
        return None


@functools.cache
def kernel(module: str, name: str) -> Callable[..., Any]:
    """``module.name`` compiled by Numba (``njit(cache=True)``); call only where :func:`enabled`."""
    fn = getattr(importlib.import_module(module), name)
    return _numba().njit(cache=True, nogil=True)(fn)
