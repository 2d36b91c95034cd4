"""The oracle's distributions: each request's acceptance level, the draft's top-``W`` probabilities at a position,
the target's rank among them and what the drafter reports.

- **acceptance level.** Each request draws a level ``a_r ~ Beta`` with mean ``a_dataset`` (the table entry
  of the (draft, target) pair, e.g. TurboSpec Table 3) and standard deviation ``spread``. With ``drift`` the
  level starts at ``a_0`` and relaxes to ``a_r``: ``a_r(t) = a_r + (a_0 - a_r)·exp(-t/τ)`` (LAPS-SD Figure
  3: acceptance is unstable early in a request and settles after ~150 tokens). ``a_0`` is drawn either around
  an absolute mean (``a0``) or at an offset below the request's own level (``offset``: ``a_0 = a_r - o_r``,
  ``o_r ~ Normal(offset, offset_spread)``, clipped into [A0_MIN, 1 - A0_MIN]). Off by default.
- **per-position distribution.** The draft's top-1 probability ``p0(r, t) ~ Beta(mean a_r(t), concentration
  κ_pos)``; rank ``j ≥ 1`` gets ``(1 - p0)(1 - q) q^(j-1)`` with ``q = max(decay, 1 - p0/(1 - p0))`` (the
  smallest ratio that keeps the ranks sorted), so ``(1 - p0) q^(W-1)`` of the mass lies outside the top
  ``W``.
- **truth.** The target's token at ``t`` is the draft's rank-``j`` token with probability ``p_j`` (a
  calibrated draft) or none of the top ``W`` (rank ``W``, a "miss"). Hence ``P(rank 0) = E[p0] =
  a_dataset``: a chain's per-token acceptance converges to the configured mean.
- **what the drafter reports.** ``confidence`` γ distorts the reported probabilities: ``∝ p^γ``,
  renormalised over the same top-``W`` mass (γ = 1 calibrated, γ > 1 over-confident, γ < 1 under-confident).
  Truth is always drawn from the true ``p``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from repro.oracle.store import _AR

P_FLOOR = 1e-6  # numerical floor on a drawn top-1 probability (keeps every reported probability in (0, 1])


def _beta_mean_sd(rng: np.random.Generator, mean: float, sd: float) -> float:
    """One draw of a Beta with the given mean and standard deviation (``sd = 0``: the mean itself)."""
    if sd <= 0.0:
        return mean
    conc = mean * (1.0 - mean) / sd**2 - 1.0
    x = float(rng.beta(mean * conc, (1.0 - mean) * conc))
    # a wide spread makes a U-shaped Beta whose draws can round to exactly 0 or 1, a level no request can have (its
    # positions' Beta(a·κ, (1 − a)·κ) would need a parameter of 0): the nearest level inside (0, 1) instead; every
    # draw strictly inside is returned as it is
    return x if 0.0 < x < 1.0 else (_BELOW_ONE if x >= 1.0 else _ABOVE_ZERO)


_BELOW_ONE, _ABOVE_ZERO = math.nextafter(1.0, 0.0), math.nextafter(0.0, 1.0)


def _check_mean(name: str, mean: float, sd: float) -> float:
    mean = float(mean)
    if not 0.0 < mean < 1.0:
        raise ValueError(f"{name}: mean {mean} must lie in (0, 1)")
    if sd > 0.0 and sd**2 >= mean * (1.0 - mean):
        raise ValueError(f"{name}: spread {sd} too large for mean {mean} (need spread² < mean·(1 - mean))")
    return mean


def _check_mean_of(what: str, spread: float, dataset: str, mean: float) -> float:
    return _check_mean(f"{what} / {dataset}", mean, spread)


def _per_request(dataset: np.ndarray, table: Mapping[str, Any], default: Any, what: str,
                 value: Callable[[str, Any], Any]) -> list[Any]:
    """Look up each request's dataset in ``table`` (then its ``default`` key, then ``default``)."""
    names, inverse = np.unique(dataset.astype(str), return_inverse=True)
    found = []
    for name in names.tolist():
        entry = table.get(name, table.get("default", default))
        if entry is None:
            raise KeyError(f"no {what} for dataset {name!r} (and no default); add it to conf/oracle")
        found.append(value(name, entry))
    return [found[i] for i in inverse.reshape(-1).tolist()]


A0_MIN = 0.01  # a relative drift start (level − offset) is clipped into [A0_MIN, 1 − A0_MIN]
_DRIFT_KEYS = ({"a0", "tau"}, {"a0", "tau", "a0_spread"}, {"offset", "tau"}, {"offset", "tau", "offset_spread"})


def _drift_arrays(dataset: np.ndarray, drift: Mapping[str, Any] | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Per request, its dataset's drift shape: the start's mean (or offset) and sd, the time constant τ (NaN: no
    drift) and whether the start is relative to the request's level (1.0) or absolute (0.0).

    ``drift`` is one shape for every dataset, or a table dataset → shape or ``None`` (``"default"`` covers the
    datasets not listed; without it they do not drift). A shape is ``{a0, tau[, a0_spread]}`` (the start drawn
    around the absolute mean a0) or ``{offset, tau[, offset_spread]}`` (the start ``offset`` below the request's own
    level, the offset drawn per request with sd ``offset_spread``)."""
    if not drift:
        return None
    table: Mapping[str, Any] = {"default": drift} if "tau" in drift else drift

    def shape(name: str, entry: Any) -> tuple[float, float, float, float]:
        if entry is None:
            return (math.nan, math.nan, math.nan, math.nan)
        if not isinstance(entry, Mapping) or set(entry) not in _DRIFT_KEYS:
            raise ValueError(f"oracle drift for {name!r}: expected {{a0, tau[, a0_spread]}}, "
                             f"{{offset, tau[, offset_spread]}} or null, got {entry!r}")
        tau = float(entry["tau"])
        if not tau > 0.0:
            raise ValueError(f"oracle drift for {name!r}: tau must be > 0 tokens, not {tau}")
        if "offset" in entry:
            offset, osd = float(entry["offset"]), float(entry.get("offset_spread", 0.0))
            if not -1.0 < offset < 1.0 or osd < 0.0:
                raise ValueError(f"oracle drift for {name!r}: offset must lie in (-1, 1) and offset_spread be "
                                 f">= 0, not {offset}, {osd}")
            return (offset, osd, tau, 1.0)
        a0, sd = float(entry["a0"]), float(entry.get("a0_spread", 0.0))
        _check_mean(f"drift a0 of {name!r}", a0, sd)
        return (a0, sd, tau, 0.0)

    names, inverse = np.unique(dataset.astype(str), return_inverse=True)
    found = [shape(name, table.get(name, table.get("default"))) for name in names.tolist()]
    arr = np.array(found, dtype=np.float64).reshape(-1, 4)[inverse.reshape(-1)]
    return arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy(), arr[:, 3].copy()


def true_dist(p0: np.ndarray, width: int, decay: float) -> np.ndarray:
    """The draft's top-``width`` probabilities (last axis, sorted descending) given its top-1 ``p0``.

    ``p1 · q^j`` for ``j < width − 1``, the powers as NumPy's ``q[..., None] ** _AR[:width - 1]`` gives them. In a
    large table, where ``q`` is ``decay`` (every ``p0`` above about 0.23 at decay 0.7) they are one row computed
    once (:func:`_decay_powers`, by the same expression), and only the raised ``q`` are raised to the powers
    (NumPy's vectorized ``pow`` gives an element the same value whatever else its call holds; a test holds both
    ways to the single expression): 2,580 distributions of 16 ranks in about 100 µs instead of 340."""
    rest = 1.0 - p0
    q = np.maximum(decay, 1.0 - p0 / rest)
    p1 = np.minimum(rest * (1.0 - q), p0)  # = p0 when q is raised: exact, so ties break towards rank 0
    if q.size * (width - 1) < 4096:  # (a small table: the single expression is as fast)
        return np.concatenate([p0[..., None], p1[..., None] * q[..., None] ** _AR[:width - 1]], axis=-1)
    out = np.empty((*q.shape, width))
    out[..., 0] = p0
    lower = out[..., 1:]
    np.multiply(p1[..., None], _decay_powers(decay, width), out=lower)
    raised = q != decay
    if raised.any():
        lower[raised] = p1[raised][:, None] * q[raised][:, None] ** _AR[:width - 1]
    return out


@functools.cache
def _decay_powers(decay: float, width: int) -> np.ndarray:
    """``decay ** j`` for ``j < width − 1``, by :func:`true_dist`'s expression (read-only)."""
    row = (np.array([decay])[:, None] ** _AR[:width - 1])[0]
    row.flags.writeable = False
    return row


def sample_rank(p0: np.ndarray, u: np.ndarray, width: int, decay: float) -> np.ndarray:
    """Inverse CDF of :func:`true_dist` at uniforms ``u``: the target's rank (``width`` = not in the top W).

    The cumulative mass through rank ``j ≥ 1`` is ``p0 + p1 (1 - q^j)/(1 - q)``, so the rank is the smallest
    ``j`` with ``q^j < 1 - (u - p0)(1 - q)/p1``.
    """
    rest = 1.0 - p0
    q = np.maximum(decay, 1.0 - p0 / rest)
    one_q = 1.0 - q
    p1 = np.minimum(rest * one_q, p0)
    y = np.maximum(1.0 - (u - p0) * one_q / p1, 1e-300)
    j = np.floor(np.log(y) / np.log(q)) + 1.0
    return np.where(u < p0, 0, np.minimum(j, width)).astype(np.int8)


def reported_dist(p: np.ndarray, confidence: float) -> np.ndarray:
    """What the drafter reports: ``p^γ`` renormalised to the same total mass (γ = 1: ``p`` itself)."""
    if confidence == 1.0:
        return p
    r = p**confidence
    return r * (p.sum(axis=-1, keepdims=True) / r.sum(axis=-1, keepdims=True))
