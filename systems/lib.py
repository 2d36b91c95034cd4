"""Shared pieces systems compose: FCFS admission within token/sequence/KV budgets, chunked prefill, preemption to
make room for decodes, and speculation planners (goodput argmax over k, budgeted selection over candidate trees).

They are plain functions of the read-only view; a system file strings them together like its paper's algorithm box.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from repro.plan import ids
from repro.state import View

EMPTY = ids()


@dataclass(frozen=True, slots=True)
class Admission:
    """Prefill chunks chosen for one step."""

    rids: np.ndarray
    tokens: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.sum())


NO_ADMISSION = Admission(EMPTY, EMPTY)


def pending_tokens(view: View, rids: np.ndarray) -> np.ndarray:
    """Tokens each request still has to compute before it samples (1 for a decode-ready request)."""
    return view.num_tokens(rids) - view.num_computed[rids]


def split_running(view: View) -> tuple[np.ndarray, np.ndarray]:
    """Running requests split into (decode-ready, still prefilling), each in admission order."""
    run = view.running
    if run.size == 0:
        return run, run
    ready = pending_tokens(view, run) == 1
    return run[ready], run[~ready]


def fcfs_admit(view: View, *, token_budget: int, max_new_seqs: int, free_blocks: int,
               watermark_blocks: int = 0, chunk: bool = False) -> Admission:
    """Admit waiting requests in queue order while their prompt fits the token budget, the sequence limit and the
    free KV blocks (keeping ``watermark_blocks`` spare). Without ``chunk`` a prompt that does not fit whole stops
    admission (head-of-line, like vLLM's default scheduler); with ``chunk`` the last admitted prompt may be cut to
    the remaining budget (Sarathi-Serve).
    """
    waiting = view.waiting
    if waiting.size == 0 or max_new_seqs <= 0 or token_budget <= 0:
        return NO_ADMISSION
    bs = view.block_size
    need = pending_tokens(view, waiting[: max_new_seqs])
    out_ids: list[int] = []
    out_tok: list[int] = []
    budget, blocks = token_budget, free_blocks - watermark_blocks
    for rid, n in zip(waiting[: max_new_seqs].tolist(), need.tolist(), strict=True):
        take = min(n, budget) if chunk else n
        if take <= 0 or (not chunk and n > budget):
            break
        nb = -(-take // bs)
        if nb > blocks:
            if not chunk:
                break
            take = blocks * bs
            if take <= 0:
                break
            nb = blocks
        out_ids.append(rid)
        out_tok.append(take)
        budget -= take
        blocks -= nb
        if budget <= 0 or blocks <= 0:
            break
    if not out_ids:
        return NO_ADMISSION
    return Admission(ids(out_ids), ids(out_tok))


def continue_prefills(view: View, rids: np.ndarray, *, token_budget: int, free_blocks: int) -> Admission:
    """Next chunks of partially prefilled running requests, in order, within the token budget and free blocks."""
    if rids.size == 0 or token_budget <= 0:
        return NO_ADMISSION
    need = pending_tokens(view, rids)
    out_ids: list[int] = []
    out_tok: list[int] = []
    budget = token_budget
    blocks = free_blocks
    bs = view.block_size
    comp = view.num_computed[rids]
    have = view.kv_blocks[rids]
    for rid, n, c, h in zip(rids.tolist(), need.tolist(), comp.tolist(), have.tolist(), strict=True):
        take = min(n, budget)
        extra = max(-(-(c + take) // bs) - h, 0)
        if extra > blocks:
            take = min(take, (h + blocks) * bs - c)
            extra = blocks
        if take <= 0:
            break
        out_ids.append(rid)
        out_tok.append(take)
        budget -= take
        blocks -= extra
        if budget <= 0:
            break
    if not out_ids:
        return NO_ADMISSION
    return Admission(ids(out_ids), ids(out_tok))


def make_room(view: View, decode: np.ndarray, new_tokens: np.ndarray | int,
              free_blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | int]:
    """Keep as many decode requests as KV allows, preempting the most recently admitted first (vLLM's policy).

    Returns ``(kept, preempted, kept_new_tokens)``; ``new_tokens`` is per request (1 + speculation) or a scalar.
    """
    need = view.blocks_for(decode, new_tokens)
    total = int(need.sum())
    if total <= free_blocks:
        return decode, EMPTY, new_tokens
    freed = view.kv_blocks[decode]
    # drop requests from the back until the rest fits: free = free_blocks + Σ freed(dropped) ≥ Σ need(kept)
    cum_need = np.cumsum(need)
    suffix_freed = np.concatenate([np.cumsum(freed[::-1])[::-1], [0]])[1:]
    fits = cum_need <= free_blocks + suffix_freed
    keep = int(np.nonzero(fits)[0].max()) + 1 if fits.any() else 0
    kept_tokens = new_tokens if isinstance(new_tokens, int) else new_tokens[:keep]
    return decode[:keep], decode[keep:][::-1].copy(), kept_tokens


def expected_accepted(alpha: float | np.ndarray, k: np.ndarray | int) -> np.ndarray:
    """Expected tokens generated by a chain of k with per-token acceptance alpha: (1 − α^(k+1)) / (1 − α)
    (Leviathan et al.; TurboSpec Eq. 4), i.e. accepted + bonus."""
    a = np.clip(np.asarray(alpha, dtype=np.float64), 1e-9, 1 - 1e-9)
    return (1.0 - a ** (np.asarray(k) + 1)) / (1.0 - a)


def prefill_prioritized(view: View, *, max_num_seqs: int, max_num_batched_tokens: int, watermark: float,
                        lookahead: int = 0) -> tuple[Admission, np.ndarray, np.ndarray]:
    """vLLM v0's default batch scheduler: a prefill-only step over the waiting requests that fit whole (FCFS), else
    a decode step over every running request with ``1 + lookahead`` KV slots each, preempting the most recently
    admitted (recompute) while KV runs short. Returns ``(admission, decode_ids, preempt_ids)``.
    """
    running = view.running
    adm = fcfs_admit(view, token_budget=max_num_batched_tokens, max_new_seqs=max_num_seqs - running.size,
                     free_blocks=view.free_blocks, watermark_blocks=int(watermark * view.total_blocks))
    if adm.rids.size:
        return adm, EMPTY, EMPTY
    decode, _ = split_running(view)
    if decode.size == 0:
        return NO_ADMISSION, EMPTY, EMPTY
    kept, preempted, _ = make_room(view, decode, 1 + lookahead, view.free_blocks)
    return NO_ADMISSION, kept, preempted
