"""Compiled kernels for the step-by-step path's inner loops, with their NumPy references.

A kernel here is a plain Python function over NumPy arrays and scalars, written so that Numba compiles it
(``numba.njit``, no ``fastmath``: every floating-point operation is the one its NumPy reference performs, in the same
order, so results are bit-identical). Where Numba is not installed, or ``REPRO_JIT=0`` is set, callers use the NumPy
reference instead; the tests run both and compare them. Because the two give the same values, a run may switch from
one to the other at any step.

``REPRO_JIT=python`` runs the kernels themselves uncompiled, as plain Python, on every path that would compile them
(a debugger's breakpoint inside one, or a mutation run, ``scripts/mutation.sh``, whose rewritten kernels Numba
cannot compile): the same values, only slowly.

Numba is imported on the first kernel call, not with the package: a fast-forwarded run, which calls no kernel, never
pays for it. Compiled code is cached on disk (``cache=True``, beside the module, or under ``NUMBA_CACHE_DIR`` where that
is not writable), so only a machine's first run compiles (a second or two per kernel). Loading Numba still costs a
process about 0.35 s (its import and the first cached kernel's load), so two kinds of kernel engage differently:

- a beam search's (:func:`enabled`) on its first call: one call saves more than that;
- a step's bookkeeping (:func:`step_kernels`), tens of microseconds a step, once Numba is loaded anyway (by a beam
  search, or by ``REPRO_JIT=1``), or once the process has run :data:`LOAD_AFTER_STEPS` steps on NumPy
  (:func:`stepped`): about what that many steps save, so a short run never pays more than twice the best choice,
  and a sweep's worker runs its later points compiled.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

#: step-by-step steps a process runs on NumPy before it loads Numba for the step kernels (0.35 s / ~70 µs a step)
LOAD_AFTER_STEPS = 5000

_ON: list[bool | None] = [None]  # enabled(), once read
_STEP: list[bool | None] = [None]  # step_kernels(), once read
_STEPS = [0]  # steps run on NumPy while the step kernels were off (stepped())


def interpreted() -> bool:
    """``REPRO_JIT=python``: the kernels run as plain Python where they would run compiled (the module docstring)."""
    return os.environ.get("REPRO_JIT") == "python"


def enabled() -> bool:
    """Whether compiled kernels may be used: Numba installed (not imported here) and ``REPRO_JIT`` not ``0`` (read
    once per process, and again after :func:`refresh`: the step path asks several times a step)."""
    on = _ON[0]
    if on is None:
        on = _ON[0] = interpreted() or (os.environ.get("REPRO_JIT", "1") != "0"
                                        and importlib.util.find_spec("numba") is not None)
    return on


def step_kernels() -> bool:
    """Whether a step's bookkeeping runs compiled (the module docstring): :func:`enabled`, and ``REPRO_JIT=1``, or
    Numba loaded already, or :data:`LOAD_AFTER_STEPS` steps run on NumPy in this process."""
    on = _STEP[0]
    if on is None:
        on = _STEP[0] = enabled() and (os.environ.get("REPRO_JIT") in ("1", "python") or _loaded()
                                       or _STEPS[0] >= LOAD_AFTER_STEPS)
    return on


def stepped() -> None:
    """Count a step run on NumPy while :func:`step_kernels` is off; the step kernels engage after enough of them."""
    _STEPS[0] += 1
    if _STEPS[0] >= LOAD_AFTER_STEPS or _loaded():
        _STEP[0] = None  # (read again)


def load() -> None:
    """Load Numba now, where :func:`enabled` (a process about to run many steps): the step kernels engage at once."""
    if enabled() and not interpreted():
        _numba()
        _STEP[0] = None


def _loaded() -> bool:
    return "numba" in sys.modules


def refresh() -> None:
    """Read ``REPRO_JIT`` again at the next :func:`enabled` (a test that sets it), and count steps from 0."""
    _ON[0] = _STEP[0] = None
    _STEPS[0] = 0


def helper(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A function the kernels of its module call: compiled with them (``numba.extending.register_jitable``) where
    Numba is installed, else left plain Python. Kernel modules are imported only to compile their kernels
    (:func:`kernel`), so this imports nothing a run that calls no kernel would not."""
    if importlib.util.find_spec("numba") is None or interpreted():
        return fn
    jitable: Callable[..., Any] = importlib.import_module("numba.extending").register_jitable(fn)
    return jitable


@functools.cache
def _numba() -> Any:
    return importlib.import_module("numba")


def kernel(module: str, name: str) -> Callable[..., Any]:
    """``module.name`` compiled by Numba (``njit(cache=True)``), or itself under ``REPRO_JIT=python``; call only
    where :func:`enabled`."""
    if interpreted():
        return _interpreted(module, name)
    return _compiled(module, name)


@functools.cache
def _interpreted(module: str, name: str) -> Callable[..., Any]:
    """``module.name`` uncompiled, returning what its compiled self returns: Python scalars where the plain function
    returns NumPy ones (``np.int64``, ``np.bool_``), in a tuple too; arrays stay arrays."""
    fn = getattr(importlib.import_module(module), name)

    def as_compiled(value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(as_compiled(v) for v in value)
        return value.item() if isinstance(value, np.generic) else value

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        return as_compiled(fn(*args))

    return call


@functools.cache
def _compiled(module: str, name: str) -> Callable[..., Any]:
    fn = getattr(importlib.import_module(module), name)
    return _numba().njit(cache=True, nogil=True)(fn)
