"""The policies' compiled kernels (:mod:`repro.core.jit`): per-step reads of the batch that a scheduler repeats.

Each kernel gives what a few NumPy operations of :mod:`systems.lib` or a system give (each a microsecond on a batch
of tens of requests), in one compiled loop; the NumPy code stays as the reference, used where Numba is missing or
``REPRO_JIT=0`` (``tests/test_step_kernels.py`` runs the systems both ways). Integers only: the same values whatever
the order. Plain Python over arrays: each runs uncompiled too, only slowly.
"""

from __future__ import annotations

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
