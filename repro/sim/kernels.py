"""The replica's compiled kernels (:mod:`repro.core.jit`): a decode step's per-request bookkeeping in one call.

Each kernel does what a stretch of :class:`~repro.sim.replica.Replica`'s NumPy code does (a dozen to thirty array
operations of a microsecond each on a batch of tens of requests) in one compiled loop over the batch, writing the
request state in place. The NumPy code stays as the reference: it runs where Numba is missing or ``REPRO_JIT=0``,
and the tests run whole simulations both ways and compare every state array bit for bit. Only integer arithmetic
and assignments happen here (no floating-point sum whose order could differ), and the batch's request ids are
unique (the replica checks that first), so a loop writes what the fancy-indexed assignments write.

Plain Python over arrays: each runs uncompiled too, only slowly.
"""

from __future__ import annotations

import numpy as np

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
    added = 0
    for i in range(n):
        r = dids[i]
        cur = kv_blocks[r]
        need = (ctx[i] + k[i] + 1 + (block_size - 1)) // block_size
        if need > cur:
            kv_blocks[r] = need
            added += need - cur
    return added


def decode_apply(output_len: np.ndarray, num_generated: np.ndarray, num_computed: np.ndarray,
                 kv_blocks: np.ndarray, num_draft_computed: np.ndarray, num_proposed: np.ndarray,
                 num_accepted: np.ndarray, num_matched: np.ndarray, num_spec_steps: np.ndarray,
                 num_decode_steps: np.ndarray, first_decode_at: np.ndarray, last_token_at: np.ndarray,
                 first_token_at: np.ndarray, dids: np.ndarray, gen: np.ndarray, ctx: np.ndarray,
                 drafted: np.ndarray, proposed: np.ndarray, accepted: np.ndarray, matched: np.ndarray,
                 block_size: int, sync_draft: int, start_at: float, end_at: float, emitted: np.ndarray,
                 finished: np.ndarray) -> tuple[int, int]:
    """``Replica._apply_decode`` and its ``KvPool.shrink_to``: each request emits ``accepted + 1`` tokens (capped at
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
