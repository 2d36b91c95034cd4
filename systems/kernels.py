"""The policies' compiled kernels (:mod:`repro.core.jit`): per-step reads of the batch that a scheduler repeats.

Each kernel gives what a few NumPy operations of :mod:`systems.lib` or a system give (each a microsecond on a batch
of tens of requests), in one compiled loop; the NumPy code stays as the reference, used where Numba is missing or
``REPRO_JIT=0`` (``tests/test_step_kernels.py`` runs the systems both ways). Integers only: the same values whatever
the order, except :func:`slo_need`'s prefix sums, added in NumPy's order. Plain Python over arrays: each runs
uncompiled too, only slowly.
"""

from __future__ import annotations

import math

import numpy as np


def ready_to_decode(prompt_len: np.ndarray, num_generated: np.ndarray, num_computed: np.ndarray,
                    kv_blocks: np.ndarray, running: np.ndarray, new_tokens: int, block_size: int,
                    out: np.ndarray) -> tuple[int, int]:
    """``systems.lib.prefill_prioritized``'s decode half: the running requests whose prefill is done (one token
    pending), in order, into the front of ``out``, and the extra KV blocks they need for ``new_tokens`` tokens each
    (``View.blocks_for``, summed). Returns (how many, blocks)."""
    count = 0
    blocks = 0
    for i in range(running.shape[0]):
        r = running[i]
        c = num_computed[r]
        if prompt_len[r] + num_generated[r] - c == 1:
            out[count] = r
            count += 1
            need = (c + new_tokens + block_size - 1) // block_size - kv_blocks[r]
            if need > 0:
                blocks += need
    return count, blocks


def blocks_and_context(num_computed: np.ndarray, kv_blocks: np.ndarray, decode: np.ndarray, spec: np.ndarray,
                       block_size: int, k: int) -> tuple[int, int]:
    """TurboSpec's reads of its decode batch: ``kv_blocks_needed_at`` (the extra KV blocks of a proposal of ``k``
    from the requests of ``spec``, one token from the others) and the batch's total context."""
    need = 0
    context = 0
    for i in range(decode.shape[0]):
        r = decode[i]
        c = num_computed[r]
        context += c
        extra = (c + block_size + (k if spec[i] else 0)) // block_size - kv_blocks[r]
        if extra > 0:
            need += extra
    return need, context


def acceptance_counts(k: np.ndarray, num_proposed: np.ndarray, num_accepted: np.ndarray
                      ) -> tuple[int, int, int, int, int]:
    """TurboSpec's ``AcceptanceTracker.update`` reads of a step: (requests asked to propose (k > 0), tokens
    accepted, requests whose chain was rejected before its end, requests asked that got a proposal, Σ k)."""
    asked = 0
    accepted = 0
    rejected = 0
    got = 0
    k_sum = 0
    for i in range(k.shape[0]):
        accepted += num_accepted[i]
        if num_accepted[i] < num_proposed[i]:
            rejected += 1
        k_sum += k[i]
        if k[i] > 0:
            asked += 1
            if num_proposed[i] > 0:
                got += 1
    return asked, accepted, rejected, got, k_sum


def slo_select(pp: np.ndarray, size: np.ndarray, target: np.ndarray, n_max: int, visit: np.ndarray, budget: int,
               out: np.ndarray) -> None:
    """``systems.trees.select_slo_customized`` (Eq. 5) into ``out``: per request, the ranked nodes ``j`` below the
    row's ``size`` whose exclusive prefix sum of path probabilities (a non-finite one counted 0) is still below the
    row's ``target``, at most ``n_max``; then, visiting the requests in ``visit`` order, what ``budget`` leaves of
    each. The prefix sums are added in rank order as ``np.cumsum`` adds them, so the comparisons are the NumPy
    reference's."""
    n, m = pp.shape
    for i in range(n):
        run = 0.0
        count = 0
        t = target[i]
        lim = size[i]
        for j in range(m):
            if j < lim and run < t:
                count += 1
            v = pp[i, j]
            run += v if math.isfinite(v) else 0.0
        out[i] = min(count, n_max)
    left = budget
    for i in visit:  # budget - (nodes wanted by the requests visited before), within 0..wanted
        want = out[i]
        out[i] = min(max(left, 0), want)
        left -= want


def global_select(pp: np.ndarray, depth: np.ndarray, size: np.ndarray, counts: np.ndarray, budget: int,
                  out: np.ndarray) -> None:
    """``systems.trees.select_global`` (Eq. 6) into ``out``: each row's prefix ``counts`` plus, of the nodes past
    it (below the row's ``size``), the ``budget`` of largest path probability; at the ``budget``-th largest value
    ``t`` (``np.partition``'s), those above it, then those at ``t`` by depth, then row-major position (the NumPy
    reference's ``lexsort``). Comparisons only: the same picks."""
    n = pp.shape[0]
    total = 0
    for i in range(n):
        out[i] = counts[i]
        if size[i] > counts[i]:
            total += size[i] - counts[i]
    if budget <= 0 or total == 0:
        return
    if total <= budget:
        for i in range(n):
            if size[i] > counts[i]:
                out[i] = size[i]
        return
    vals = np.empty(total)
    k = 0
    for i in range(n):
        for j in range(counts[i], size[i]):
            vals[k] = pp[i, j]
            k += 1
    t = np.partition(vals, total - budget)[total - budget]
    above = 0
    tied = 0
    for i in range(n):
        for j in range(counts[i], size[i]):
            v = pp[i, j]
            if v > t:
                out[i] += 1
                above += 1
            elif v == t:
                tied += 1
    need = budget - above
    if need <= 0:
        return
    rows = np.empty(tied, dtype=np.int64)
    depths = np.empty(tied, dtype=np.int64)
    k = 0
    for i in range(n):
        for j in range(counts[i], size[i]):
            if pp[i, j] == t:
                rows[k] = i
                depths[k] = depth[i, j]
                k += 1
    if tied <= need:
        for q in range(tied):
            out[rows[q]] += 1
        return
    order = np.argsort(depths, kind="mergesort")  # stable: by depth, then row-major position
    for q in range(need):
        out[rows[order[q]]] += 1
