"""What follows from a cost model alone, computed once per process for equal models.

A sweep's points each build their own :class:`~repro.cost.model.CostModel`, most of them equal (the same hardware,
models, parallelism and engine), and each re-derived the same things from it: AdaServe's baseline latency (127
priced passes), TurboSpec's and DSD's offline fits, Nightjar's c_prefill table. :func:`remember` keeps them per
:func:`fingerprint` (the model's constructor arguments) and key.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

import numpy as np

__all__ = ["fingerprint", "remember"]

T = TypeVar("T")
MAX_ENTRIES = 1024  # values kept per process (a few per distinct model and caller)
_KEPT: dict[tuple[Hashable, ...], Any] = {}


def fingerprint(cost: Any) -> tuple[Hashable, ...] | None:
    """Everything a cost model's latencies follow from (its constructor's arguments), hashable; ``None`` with a
    measured profile or an unhashable part (then nothing computed from it is shared)."""
    if cost.target_profile is not None or cost.draft_profile is not None:
        return None
    key = (cost.hardware, cost.model, cost.tp, cost.draft, cost.draft_hardware, cost.draft_tp,
           cost.gpu_memory_utilization, cost.activation_reserve_gb, cost.engine)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def remember(fp: tuple[Hashable, ...] | None, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()``, a pure function of the model fingerprinted ``fp`` and ``key``, once per process (computed
    afresh where ``fp`` is ``None``). NumPy arrays in a remembered value (an array, a dataclass and its dataclass
    fields) are made read-only, as it is shared."""
    if fp is None:
        return compute()
    k = (fp, key)
    if k in _KEPT:
        return _KEPT[k]
    value = compute()
    _read_only(value)
    if len(_KEPT) >= MAX_ENTRIES:
        _KEPT.clear()
    _KEPT[k] = value
    return value


def _read_only(value: Any) -> None:
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            _read_only(getattr(value, f.name))
