"""The replica's compiled kernels (:mod:`repro.core.jit`): a decode step's per-request bookkeeping in one call.

Each kernel does what a stretch of :class:`~repro.sim.replica.Replica`'s NumPy code does (a dozen to thirty array
operations of a microsecond each on a batch of tens of requests) in one compiled loop over the batch, writing the
request state in place. The NumPy code stays as the reference: it runs where Numba is missing or ``REPRO_JIT=0``,
and the tests run whole simulations both ways and compare every state array bit for bit. Only integer arithmetic,
assignments and one addition per request (its service time plus the step's seconds, as NumPy adds a scalar to each
element) happen here, no floating-point sum whose order could differ; the batch's request ids are unique (the
replica checks that first), so a loop writes what the fancy-indexed assignments write.

Plain Python over arrays: each runs uncompiled too, only slowly.
"""

from __future__ import annotations

import numpy as np

from repro.core import jit

RUNNING = 2  # repro.sim.state.RUNNING (a compiled kernel reads module globals as constants)


def decode_begin(status: np.ndarray, num_generated: np.ndarray, num_computed: np.ndarray, prompt_len: np.ndarray,
                 kv_blocks: np.ndarray, dids: np.ndarray, k: np.ndarray, block_size: int, gen: np.ndarray,
                 ctx: np.ndarray) -> int:
    """``Replica._begin_decode`` for chains (no trees, no proposal before verification) and its ``KvPool.allocate``:
    the requests' tokens generated and context into ``gen`` and ``ctx``; each request's KV grown to hold its context
    and ``1 + k`` more tokens (never shrunk). Returns the blocks added, or -1 (nothing written) where a request is
    not running or has not finished its prefill, or a ``k`` is negative."""
    n = dids.shape[0]
    for i in range(n):
        r = dids[i]
        g = num_generated[r]
        c = num_computed[r]
        if status[r] != RUNNING or c != prompt_len[r] + g - 1 or k[i] < 0:
            return -1
        gen[i] = g
        ctx[i] = c
    return _grow_kv(kv_blocks, dids, ctx, k, block_size)


@jit.helper
def _grow_kv(kv_blocks: np.ndarray, dids: np.ndarray, ctx: np.ndarray, k: np.ndarray, block_size: int) -> int:
    """Each request's KV grown to hold its context and ``1 + k`` more tokens (never shrunk): the blocks added."""
    added = 0
    for i in range(dids.shape[0]):
        r = dids[i]
        cur = kv_blocks[r]
        need = (ctx[i] + k[i] + 1 + (block_size - 1)) // block_size
        if need > cur:
            kv_blocks[r] = need
            added += need - cur
    return added


def chains_begin(mark: np.ndarray, status: np.ndarray, num_generated: np.ndarray, num_computed: np.ndarray,
                 prompt_len: np.ndarray, kv_blocks: np.ndarray, num_draft_computed: np.ndarray, dids: np.ndarray,
                 k: np.ndarray, block_size: int, keeps_kv: bool, gen: np.ndarray, ctx: np.ndarray,
                 sums: np.ndarray, prefixes: bool = False) -> bool:
    """The start of a decode step in which every request drafts a chain of the same ``k[0]`` (0: none) with its
    draft's cache in step where it drafts (``Replica._execute_chains``): :func:`unique_ids`, then
    :func:`decode_begin`, with the sums :func:`draft_reads` and ``repro.cost.kernels.chain_terms`` take, in one
    pass. Returns False, having written nothing but the scratch ``mark``, where the step is not that (a request
    twice, not running or still prefilling, chains of different or negative lengths, a draft cache behind its
    context where it drafts): the general path takes it. Else the requests' tokens generated and contexts go to
    ``gen`` and ``ctx``, their KV grows as :func:`decode_begin` grows it, and ``sums`` gets (blocks added, Σ ctx,
    Σ (1 + k)·(ctx + 1 + k)). With ``prefixes``, a step in which every request drafts (a chain of one depth) and
    verifies its first ``k[i]`` ≥ 0 tokens (``Replica._execute_prefixes``): every draft cache must be in step."""
    n = dids.shape[0]
    if n == 0 or k[0] < 0:
        return False
    draft_in_step = keeps_kv and (prefixes or k[0] > 0)  # (a step that does not draft does not read the draft's cache)
    for i in range(n):
        mark[dids[i]] = i
    c_sum = 0
    pairs = 0
    for i in range(n):
        r = dids[i]
        g = num_generated[r]
        c = num_computed[r]
        if mark[r] != i or status[r] != RUNNING or c != prompt_len[r] + g - 1 or k[i] < 0 \
                or (k[i] != k[0] and not prefixes):
            return False
        if draft_in_step and num_draft_computed[r] != c:
            return False
        gen[i] = g
        ctx[i] = c
        c_sum += c
        pairs += (k[i] + 1) * (c + k[i] + 1)
    sums[0] = _grow_kv(kv_blocks, dids, ctx, k, block_size)
    sums[1] = c_sum
    sums[2] = pairs
    return True


def decode_apply(output_len: np.ndarray, num_generated: np.ndarray, num_computed: np.ndarray,
                 kv_blocks: np.ndarray, num_draft_computed: np.ndarray, num_proposed: np.ndarray,
                 num_accepted: np.ndarray, num_matched: np.ndarray, num_spec_steps: np.ndarray,
                 num_decode_steps: np.ndarray, first_decode_at: np.ndarray, last_token_at: np.ndarray,
                 first_token_at: np.ndarray, service_s: np.ndarray, dids: np.ndarray, gen: np.ndarray,
                 ctx: np.ndarray, drafted: np.ndarray, proposed: np.ndarray, accepted: np.ndarray,
                 matched: np.ndarray, block_size: int, sync_draft: int, step_s: float, start_at: float, end_at: float,
                 emitted: np.ndarray, finished: np.ndarray) -> tuple[int, int]:
    """``Replica._apply_decode`` and its ``KvPool.shrink_to``, and the step's seconds (``step_s``) added to each
    request's service (``Replica._execute``): each request emits ``accepted + 1`` tokens (capped at
    what it has left) into ``emitted``; its counters, times and KV (shrunk to its new context) follow. With
    ``sync_draft`` 1 (a proposer that keeps KV) the draft's cache of the requests drafted for takes the new context,
    with 2 (the plan's ``draft_sync`` too) every request's. Returns the change in blocks used and how many requests
    finished, their ids at the front of ``finished`` in batch order."""
    n = dids.shape[0]
    delta = 0
    done = 0
    spec = False  # anything proposed: the reference then adds every request's counts (0 where it proposed none)
    for i in range(n):
        if proposed[i] != 0:
            spec = True
    for i in range(n):
        r = dids[i]
        service_s[r] += step_s
        g = gen[i]
        remaining = output_len[r] - g
        e = accepted[i] + 1
        if e > remaining:
            e = remaining
        emitted[i] = e
        num_generated[r] = g + e
        c = ctx[i] + e
        num_computed[r] = c
        need = (c + (block_size - 1)) // block_size
        delta += need - kv_blocks[r]
        kv_blocks[r] = need
        if sync_draft == 2 or (sync_draft == 1 and drafted[i]):
            num_draft_computed[r] = c
        if spec:
            num_proposed[r] += proposed[i]
            num_accepted[r] += accepted[i]
            num_matched[r] += matched[i]
            if proposed[i] > 0:
                num_spec_steps[r] += 1
        num_decode_steps[r] += 1
        if g > 0 and np.isnan(first_decode_at[r]):  # a decode step after the first token
            first_decode_at[r] = start_at
        last_token_at[r] = end_at
        if g == 0:  # a prompt's last token decoded like any other: its sample is the first token
            first_token_at[r] = end_at
        if e == remaining:
            finished[done] = r
            done += 1
    return delta, done


def draft_reads(num_draft_computed: np.ndarray, dids: np.ndarray, ctx: np.ndarray, k: np.ndarray,
                spec: np.ndarray, keeps_kv: bool) -> tuple[int, int, int, int, int]:
    """What ``repro.sim.stepcost.StepCoster._draft_pass`` reads of the requests of ``spec`` (their contexts ``ctx``
    and chain lengths ``k``): (how many, Σ ctx, Σ of the tokens the draft's cache misses besides the last one where
    it ``keeps_kv``, else 0, max k, min k)."""
    n = 0
    c_sum = 0
    missing = 0
    k_max = 0
    k_min = 0
    for i in range(dids.shape[0]):
        if not spec[i]:
            continue
        c = ctx[i]
        if n == 0 or k[i] > k_max:
            k_max = k[i]
        if n == 0 or k[i] < k_min:
            k_min = k[i]
        n += 1
        c_sum += c
        if keeps_kv:
            missing += c - num_draft_computed[dids[i]]
    return n, c_sum, missing, k_max, k_min


def step_sums(emitted: np.ndarray, proposed: np.ndarray, accepted: np.ndarray, matched: np.ndarray,
              k: np.ndarray) -> tuple[int, int, int, int, int]:
    """The sums a step record takes of a step's decode batch (``repro.sim.trace.StepTracer.on_step``): tokens
    emitted, proposed, accepted, matched and Σ k."""
    e = 0
    p = 0
    a = 0
    m = 0
    for i in range(emitted.shape[0]):
        e += emitted[i]
        p += proposed[i]
        a += accepted[i]
        m += matched[i]
    s = 0
    for i in range(k.shape[0]):
        s += k[i]
    return e, p, a, m, s


def unique_ids(mark: np.ndarray, pids: np.ndarray, dids: np.ndarray) -> bool:
    """``Replica._check_unique``: whether no request is in ``pids`` and ``dids`` twice together (``mark``: a
    scratch array over every request id, its values meaningless before and after)."""
    n = pids.shape[0]
    for i in range(n):
        mark[pids[i]] = i
    for i in range(dids.shape[0]):
        mark[dids[i]] = n + i
    ok = True
    for i in range(n):
        if mark[pids[i]] != i:
            ok = False
    for i in range(dids.shape[0]):
        if mark[dids[i]] != n + i:
            ok = False
    return ok
