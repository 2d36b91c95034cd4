"""The cost model's compiled kernels (:mod:`repro.core.jit`): the integer sums a step's pricing takes of its batch.

One compiled loop in place of a handful of NumPy reductions of a microsecond each; the NumPy code stays as the
reference (``REPRO_JIT=0``; ``tests/test_step_kernels.py`` runs whole simulations both ways). Integers only, so the
sums are the same whatever their order; the floating-point terms are then formed from them exactly as the
reference forms them. Plain Python over arrays: it runs uncompiled too, only slowly.
"""

from __future__ import annotations

import numpy as np


def chain_terms(k: np.ndarray, ctx: np.ndarray) -> tuple[int, int, int, int, int]:
    """The integer sums ``repro.cost.step._decode_terms`` takes of a batch of chains (``k`` speculated tokens on
    ``ctx`` cached ones each, both int64) where every request is one query of ``1 + k`` tokens: (requests that
    speculate, Σ k, max(1 + k), Σ ctx, Σ (1 + k)·(ctx + 1 + k))."""
    n_spec = 0
    k_sum = 0
    q_max = 0
    ctx_sum = 0
    pairs = 0
    for i in range(k.shape[0]):
        q = k[i] + 1
        if k[i] > 0:
            n_spec += 1
        k_sum += k[i]
        if q > q_max:
            q_max = q
        ctx_sum += ctx[i]
        pairs += q * (ctx[i] + q)
    return n_spec, k_sum, q_max, ctx_sum, pairs


def expand_terms(k: np.ndarray, ctx: np.ndarray, reread: float) -> tuple[int, float]:
    """``repro.cost.step._decode_terms`` where every request speculates under batch expansion: (Σ (1 + k), the KV
    tokens read, Σ (1 + (k)·reread)·ctx + Σ (1 + k)(2 + k) / 2). The floating-point sum is NumPy's pairwise
    summation of the same terms, reproduced operation for operation (eight running sums over a block of at most
    128 terms, combined pairwise, then the rest in order; a batch of more than 128 returns NaN and the caller takes
    NumPy's own)."""
    n = k.shape[0]
    q_sum = 0
    tri = 0
    for i in range(n):
        q = k[i] + 1
        q_sum += q
        tri += q * (q + 1)
    if n > 128:
        return q_sum, np.nan
    t = np.empty(n)
    for i in range(n):
        t[i] = (1.0 + (k[i] + 1 - 1) * reread) * ctx[i]
    if n < 8:
        s = -0.0
        for i in range(n):
            s += t[i]
    else:
        r = t[:8].copy()
        i = 8
        while i < n - (n % 8):
            for j in range(8):
                r[j] += t[i + j]
            i += 8
        s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            s += t[i]
            i += 1
    return q_sum, (0.0 + s) + tri / 2.0
