"""Proportional fairness over speculative goodput (GoodSpeed §III).

A chain's expected tokens, the utility, the exact per-round allocation of a verification budget (GoodSpeed-sched,
Eq. 5) and the optimal long-term goodput x* of problem (1).

The achievable region 𝒳 (Eq. 2) is the convex hull of μ(k) over the allocations k ∈ 𝒦 = {k ∈ Z+^N : Σ k_i ≤ C},
μ_i(k) = (1 − α_i^(k_i + 1)) / (1 − α_i) tokens per round. x* = argmax_{x ∈ 𝒳} Σ_i log x_i is found by Frank-Wolfe:
the linear maximization over 𝒳 at gradient g = 1/x is GoodSpeed-sched with weights g (:func:`allocate`), and an
exact line search on the log utility picks each step. Every μ_i(k) ≥ 1 (the bonus token), so U is finite on 𝒳.
"""

from __future__ import annotations

import numpy as np


def expected_tokens(alpha: np.ndarray | float, s: np.ndarray | int) -> np.ndarray:
    """x̂(S) = (1 − α^(S+1)) / (1 − α): the expected tokens of a chain of S drafts at per-token acceptance α
    (accepted + the bonus token)."""
    a = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0 - 1e-12)
    return (1.0 - a ** (np.asarray(s) + 1)) / (1.0 - a)


def allocate(weights: np.ndarray, alpha: np.ndarray, capacity: int) -> np.ndarray:
    """GoodSpeed-sched (Eq. 5): S maximizing Σ_i w_i · x̂_i(S_i) subject to Σ S_i ≤ C, S_i ∈ Z+.

    The objective is separable and each x̂_i is concave in S_i (its increments α_i^(S+1) shrink), so taking the C
    largest marginal gains w_i · α_i^(S_i + 1) one at a time is exact; a gain of 0 is not taken; ties go to the lowest
    index."""
    w = np.asarray(weights, dtype=np.float64)
    a = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0 - 1e-12)
    s = np.zeros(w.size, dtype=np.int64)
    gain = w * a  # the gain of each client's next token: w_i α_i^(S_i + 1)
    for _ in range(max(int(capacity), 0)):
        i = int(np.argmax(gain))
        if not gain[i] > 0.0:
            break
        s[i] += 1
        gain[i] *= a[i]
    return s


def utility(x: np.ndarray) -> float:
    """U(x) = Σ_i log x_i (proportional fairness; −inf when a client got nothing)."""
    v = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return float(np.log(v).sum())


def even_goodput(alpha: np.ndarray, capacity: int) -> np.ndarray:
    """Long-term goodput of the even split (GoodSpeed's Fixed-S spending the whole budget C).

    Each client drafts ⌊C/N⌋, the C mod N left over go one each in turn: x_i = (1 − f) · x̂_i(⌊C/N⌋) +
    f · x̂_i(⌊C/N⌋ + 1), f = (C mod N) / N. U(x*) − U(this) is all that adapting the allocation can gain.
    """
    a = np.asarray(alpha, dtype=np.float64)
    if a.size == 0:
        return a
    q, r = divmod(max(int(capacity), 0), a.size)
    f = r / a.size
    return (1.0 - f) * expected_tokens(a, q) + f * expected_tokens(a, q + 1)


def optimal_goodput(alpha: np.ndarray, capacity: int, iters: int = 500, tol: float = 1e-10) -> np.ndarray:
    """x* of problem (1): the goodput vector (tokens per round) maximizing Σ log x_i over the achievable region.

    The region of per-token acceptances ``alpha`` and budget ``capacity``. Frank-Wolfe with exact line search (module
    docstring), stopped when the duality gap falls below ``tol``.
    """
    a = np.asarray(alpha, dtype=np.float64)
    n = a.size
    x = expected_tokens(a, allocate(np.ones(n), a, capacity))
    for _ in range(iters):
        g = 1.0 / x
        y = expected_tokens(a, allocate(g, a, capacity))
        d = y - x
        gap = float(g @ d)  # Frank-Wolfe duality gap: U(x*) − U(x) ≤ gap
        if gap <= tol:
            break
        lo, hi = 0.0, 1.0  # the step maximizing Σ log(x + γ d): its derivative Σ d / (x + γ d) falls with γ
        if float((d / (x + d)).sum()) >= 0.0:
            lo = 1.0
        else:
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                if float((d / (x + mid * d)).sum()) > 0.0:
                    lo = mid
                else:
                    hi = mid
        x = x + lo * d
    return x
