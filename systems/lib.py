"""Shared pieces systems compose: FCFS admission within token/sequence/KV budgets, chunked prefill, preemption to
make room for decodes, and speculation planners (goodput argmax over k, budgeted selection over candidate trees).

They are plain functions of the read-only view; a system file strings them together like its paper's algorithm box.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from repro.core import jit
from repro.cost.step import decode_pass_s
from repro.sim.plan import PreemptMode, StepPlan, ids
from repro.sim.policy import whole_prompts_that_fit
from repro.sim.state import RUNNING as _RUNNING
from repro.sim.state import SWAPPED as _SWAPPED
from repro.sim.state import WAITING as _WAITING
from repro.sim.state import View

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
    """Admit waiting requests in queue order while their prompts fit the token, sequence and KV budgets.

    ``watermark_blocks`` KV blocks are kept spare. Without ``chunk`` the first prompt that does not fit whole stops
    admission (head-of-line, as vLLM's default scheduler); with ``chunk`` the last admitted prompt may be cut to the
    remaining budget (Sarathi-Serve).
    """
    waiting = view.waiting
    if waiting.size == 0 or max_new_seqs <= 0 or token_budget <= 0:
        return NO_ADMISSION
    bs = view.block_size
    need = pending_tokens(view, waiting[: max_new_seqs])
    if not chunk:  # the rule the engine also applies to admissions inside its runs (Policy.admits)
        n = whole_prompts_that_fit(need.tolist(), token_budget=token_budget, max_new_seqs=max_new_seqs,
                                   free_blocks=free_blocks - watermark_blocks, block_size=bs)
        return Admission(ids(waiting[:n].copy()), ids(need[:n].copy())) if n else NO_ADMISSION
    out_ids: list[int] = []
    out_tok: list[int] = []
    budget, blocks = token_budget, free_blocks - watermark_blocks
    for rid, n in zip(waiting[: max_new_seqs].tolist(), need.tolist(), strict=True):
        take = min(n, budget)
        if take <= 0:
            break
        nb = -(-take // bs)
        if nb > blocks:  # the last prompt is cut to the blocks left
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
    """Expected tokens (accepted + bonus) from a chain of k at per-token acceptance α: (1 − α^(k+1)) / (1 − α).

    Leviathan et al.; TurboSpec Eq. 4.
    """
    if isinstance(alpha, float):  # a per-step controller's α: np.clip's dispatch would cost more than the formula
        a: float | np.ndarray = min(max(alpha, 1e-9), 1 - 1e-9)
    else:
        a = np.clip(np.asarray(alpha, dtype=np.float64), 1e-9, 1 - 1e-9)
    return (1.0 - a ** (np.asarray(k) + 1)) / (1.0 - a)


def prefill_prioritized(view: View, *, max_num_seqs: int, max_num_batched_tokens: int, watermark: float,
                        lookahead: int = 0) -> tuple[Admission, np.ndarray, np.ndarray]:
    """vLLM v0's default batch scheduler; returns ``(admission, decode_ids, preempt_ids)``.

    A prefill-only step over the waiting requests that fit whole (FCFS), else a decode step over every running request
    with ``1 + lookahead`` KV slots each, preempting the most recently admitted (recompute) while KV runs short.
    """
    running = view.running
    if view.waiting.size:  # (nothing to admit: a decode step)
        adm = fcfs_admit(view, token_budget=max_num_batched_tokens, max_new_seqs=max_num_seqs - running.size,
                         free_blocks=view.free_blocks, watermark_blocks=int(watermark * view.total_blocks))
        if adm.rids.size:
            return adm, EMPTY, EMPTY
    if jit.step_kernels():  # the same reads, compiled (systems.kernels.ready_to_decode)
        out = np.empty(running.size, dtype=np.int64)
        n, blocks = jit.kernel("systems.kernels", "ready_to_decode")(
            view.prompt_len, view.num_generated, view.num_computed, view.kv_blocks, running, 1 + lookahead,
            view.block_size, out)
        decode = out[:n]
        if n and blocks <= view.free_blocks:  # (make_room keeps every one)
            return NO_ADMISSION, decode, EMPTY
    else:
        decode = running[pending_tokens(view, running) == 1]  # split_running's decode-ready half
    if decode.size == 0:
        return NO_ADMISSION, EMPTY, EMPTY
    kept, preempted, _ = make_room(view, decode, 1 + lookahead, view.free_blocks)
    return NO_ADMISSION, kept, preempted


def decodes_first(view: View, *, lookahead: int, token_budget: int, max_num_seqs: int,
                  watermark_blocks: int = 0) -> tuple[np.ndarray, np.ndarray, Admission]:
    """Sarathi-Serve's stall-free batching, which vLLM V1's scheduler also does; returns ``(decode_ids, preempt_ids,
    prefill)``.

    Every decode-ready running request decodes with ``1 + lookahead`` tokens (KV slots and token budget); while KV
    runs short the most recently admitted are preempted (recompute) and no prefill runs that step. Otherwise the
    rest of the token budget goes to ongoing chunked prefills, then to new admissions FCFS, the last prompt chunked.
    """
    decode, prefilling = split_running(view)
    per = 1 + lookahead
    free = view.free_blocks - int(view.blocks_for(decode, per).sum())
    if free < 0:
        kept, preempted, _ = make_room(view, decode, per, view.free_blocks)
        return kept, preempted, NO_ADMISSION
    budget = token_budget - decode.size * per
    cont = continue_prefills(view, prefilling, token_budget=budget, free_blocks=free)
    if cont.rids.size:
        budget -= cont.num_tokens
        free -= int(view.blocks_for(cont.rids, cont.tokens).sum())
    new = fcfs_admit(view, token_budget=budget, max_new_seqs=max_num_seqs - view.running.size, free_blocks=free,
                     watermark_blocks=watermark_blocks, chunk=True)
    if not new.rids.size:
        return decode, EMPTY, cont
    return decode, EMPTY, Admission(np.concatenate([cont.rids, new.rids]), np.concatenate([cont.tokens, new.tokens]))


# --- SLO-aware continuous batching (AdaServe §6.3: FCFS and STTA) -------------------------------------------------


def slo_batch_limit(view: View, order: np.ndarray, *, max_num_seqs: int) -> int:
    """AdaServe §6.3's dynamic batch size limit, in ``[1, max_num_seqs]``.

    The largest ``n`` whose decode step over the first ``n`` requests of ``order`` (priority order) the cost model
    estimates at no more than the tightest TPOT SLO among them. The test is monotone in ``n``, so it bisects:
    O(log n) cost-model calls.
    """
    m = min(int(order.size), max_num_seqs)
    if m <= 1:
        return m
    top = order[:m]
    kv_read = np.cumsum(view.num_tokens(top))  # a decode reads its cached context plus its new token
    tightest = np.minimum.accumulate(view.tpot_slo_s[top])

    def fits(n: int) -> bool:
        return decode_pass_s(view.cost, n, float(kv_read[n - 1]) / n - 1.0) <= tightest[n - 1]

    if fits(m):
        return m
    lo, hi = 1, m  # a lone request runs whatever its SLO; fits(hi) is false
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def evict_prefix(view: View, victims: np.ndarray, need_blocks: int) -> np.ndarray:
    """The shortest prefix of ``victims`` (in eviction order) whose KV blocks cover ``need_blocks``."""
    if need_blocks <= 0 or victims.size == 0:
        return EMPTY
    freed = np.cumsum(view.kv_blocks[victims])
    return victims[: int(np.searchsorted(freed, need_blocks)) + 1].copy()


def slo_aware_batch(view: View, order: np.ndarray, *, max_num_seqs: int, max_num_batched_tokens: int,
                    watermark: float = 0.01, preempt_mode: PreemptMode = "swap",
                    evict_unselected: bool = False) -> StepPlan:
    """One iteration of SLO-aware continuous batching (AdaServe §6.3) over requests in priority ``order``.

    ``order`` holds every request the server holds (running, swapped, waiting), highest priority first.
    (1) Prefill stage, as in incremental decoding (§6.1): prompts run first in a prefill-only step, partially
    prefilled ones, then waiting ones in ``order`` (chunked to ``max_num_batched_tokens``, at most ``max_num_seqs``
    running, KV above the ``watermark`` fraction, none while requests are swapped out, as vLLM).
    (2) Decode stage: the batch is the first ``slo_batch_limit`` decode-ready or swapped requests of ``order``; the
    others are preempted from it. A preempted request keeps its KV and waits to rejoin a later batch, unless
    ``evict_unselected`` or its blocks are needed, when it is evicted by ``preempt_mode``, lowest priority first.
    Swapped requests of the batch are swapped back in (and decode in the same step) while KV allows, in order.
    """
    if order.size == 0:
        return StepPlan()
    status = view.status(order)
    resident = status == _RUNNING
    ready = resident & (pending_tokens(view, order) == 1)

    # (1) prefill stage first: prefill preempts ongoing decoding
    cont = continue_prefills(view, order[resident & ~ready], token_budget=max_num_batched_tokens,
                             free_blocks=view.free_blocks)
    free = view.free_blocks - (int(view.blocks_for(cont.rids, cont.tokens).sum()) if cont.rids.size else 0)
    new = NO_ADMISSION
    if view.swapped.size == 0:
        fresh = order[status == _WAITING][: max(max_num_seqs - view.running.size, 0)]
        new = continue_prefills(view, fresh, token_budget=max_num_batched_tokens - cont.num_tokens,
                                free_blocks=free - int(watermark * view.total_blocks))
    if cont.rids.size or new.rids.size:
        return StepPlan(prefill_ids=np.concatenate([cont.rids, new.rids]),
                        prefill_tokens=np.concatenate([cont.tokens, new.tokens]))

    # (2) decode stage: the batch under the SLO-aware limit, in priority order
    runs = order[ready | (status == _SWAPPED)]
    n = slo_batch_limit(view, runs, max_num_seqs=max_num_seqs)
    runs, rest = runs[:n], runs[n:]
    unselected = rest[view.status(rest) == _RUNNING][::-1]  # eviction order: lowest priority first
    evicted = unselected if evict_unselected else EMPTY
    victims = unselected[evicted.size:]
    free = view.free_blocks + int(view.kv_blocks[evicted].sum())
    # keep the longest prefix of the batch whose KV fits (dropped residents may be evicted for it)
    new_tok = (pending_tokens(view, runs) == 1).astype(np.int64)  # a swapped partial prefill only comes back
    need = view.blocks_for(runs, new_tok)
    own = view.kv_blocks[runs]  # freed if the request is dropped (0 for swapped requests)
    suffix_own = np.concatenate([np.cumsum(own[::-1])[::-1], [0]])[1:]
    fits = np.cumsum(need) <= free + int(view.kv_blocks[victims].sum()) + suffix_own
    keep = int(np.nonzero(fits)[0].max()) + 1 if fits.any() else 0
    kept, dropped = runs[:keep], runs[keep:]
    dropped_resident = dropped[view.status(dropped) == _RUNNING][::-1]
    evicted = np.concatenate([evicted, evict_prefix(view, np.concatenate([victims, dropped_resident]),
                                                   int(need[:keep].sum()) - free)])
    back = kept[view.status(kept) == _SWAPPED]
    if kept.size == 0 and evicted.size == 0:  # prompts stuck without KV: the lowest-priority one gives its blocks
        stuck = order[resident & ~ready]
        evicted = stuck[-1:] if stuck.size > 1 or (stuck.size and order.size > stuck.size) else EMPTY
    return StepPlan(decode_ids=kept[new_tok[:keep] == 1], swap_in_ids=back, preempt_ids=evicted,
                    preempt_mode=preempt_mode)


def contenders(view: View) -> np.ndarray:
    """Every request a server could put in this iteration's batch: running, swapped and waiting."""
    return np.concatenate([view.running, view.swapped, view.waiting])


@dataclass(frozen=True, slots=True)
class SloBatching:
    """The knobs of SLO-aware continuous batching (AdaServe §6.3), shared by FCFS and STTA, which differ only in
    the priority order they hand to :meth:`plan`."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 3000
    watermark: float = 0.01
    preempt_mode: PreemptMode = "swap"
    evict_unselected: bool = False

    def __post_init__(self) -> None:
        if self.preempt_mode not in ("swap", "recompute"):
            raise ValueError(f"preempt_mode must be 'swap' or 'recompute', not {self.preempt_mode!r}")

    def plan(self, view: View, order: np.ndarray) -> StepPlan:
        return slo_aware_batch(view, order, max_num_seqs=self.max_num_seqs,
                               max_num_batched_tokens=self.max_num_batched_tokens, watermark=self.watermark,
                               preempt_mode=self.preempt_mode, evict_unselected=self.evict_unselected)


# --- request-level schedulers at small batch (LAPS-SD and its baselines: FCFS, LP-SJF, LAS) ---------------------


@dataclass(frozen=True, slots=True)
class LogNormalLengthPredictor:
    """Output-length predictor with log-normal error: ``L̂ = max(1, round(L · exp(σ·z)))``, ``z ~ N(0, 1)``.

    - ``z`` depends on ``(seed, request id)`` alone: systems compared with the same ``sigma`` and seed (LP-SJF,
      LAPS-SD) get the same estimate for the same request.
    - ``sigma = 0`` is a perfect predictor.
    - :meth:`repro.sim.state.View.predicted_output_len` hands it the reference lengths; a policy sees only estimates.
    """

    sigma: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.sigma >= 0.0 and np.isfinite(self.sigma)):
            raise ValueError(f"length_error_sigma must be a finite number >= 0, not {self.sigma!r}")

    def predict(self, rids: np.ndarray, output_len: np.ndarray) -> np.ndarray:
        z = np.array([np.random.default_rng([self.seed, int(r)]).standard_normal() for r in rids.tolist()])
        est = np.rint(np.asarray(output_len, dtype=np.float64) * np.exp(self.sigma * z))
        return np.maximum(est, 1).astype(np.int64)


def length_predictor(sigma: float, rng: np.random.Generator) -> LogNormalLengthPredictor:
    """The run's length predictor: its seed is the first draw of the run's policy stream, so two systems run with
    the same seed see the same predictions."""
    return LogNormalLengthPredictor(sigma=sigma, seed=int(rng.integers(2**31)))


def check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, not {value!r}")
    return value


def serve_in_order(view: View, order: np.ndarray, *, max_batch: int, k: int, pinned: np.ndarray = EMPTY) -> StepPlan:
    """One step of a request-level scheduler: serve ``pinned`` plus the top of ``order``, up to ``max_batch``.

    - ``pinned`` running requests are never preempted; ``order`` lists every contender, highest priority first.
    - Running requests left out are swapped out (the engine charges the transfer); swapped ones in the batch come back.
    - If a batch request still needs its prompt, the step is prefill-only over those (the draft prefills too);
      otherwise every batch request decodes with a chain of ``k``.
    - Requests whose KV would not fit wait for a later step (lowest priority dropped first).
    """
    if order.size == 0:
        return StepPlan()
    if pinned.size:
        pin = set(pinned.tolist())
        top = order.tolist()
        rest = [r for r in top if r not in pin]
        # when every contender is pinned the batch is ``order`` itself (no new array)
        cand = ids([r for r in top if r in pin] + rest[: max(max_batch - len(pin), 0)]) if rest else order
    else:
        pin = set()
        cand = order[:max_batch]
    chosen = cand.tolist()
    batch_set = set(chosen)
    victims = [r for r in view.running.tolist() if r not in batch_set and r not in pin]
    # KV: keep the longest prefix of the batch that fits once the victims' blocks are freed
    free = view.free_blocks
    if victims:
        preempt = ids(victims)
        free += int(view.kv_blocks[preempt].sum())
    else:
        preempt = EMPTY
    # request by request (the batch is small): its pending tokens (pending_tokens) and the KV blocks its step needs,
    # as View.blocks_for counts them (a swapped request holds none: its whole context)
    bs, slots = view.block_size, 1 + k
    prompt, generated, computed, blocks = view.prompt_len, view.num_generated, view.num_computed, view.kv_blocks
    todo: list[int] = []
    for rid in chosen:
        done = int(computed[rid])
        pending = int(prompt[rid]) + int(generated[rid]) - done
        need = max((done + max(pending, slots) + bs - 1) // bs - int(blocks[rid]), 0)
        if need > free and rid not in pin:
            break
        free -= need
        todo.append(pending)
    keep = len(todo)
    batch = cand[:keep]
    status = view.status(batch).tolist()
    back = [rid for rid, st in zip(chosen[:keep], status, strict=True) if st == _SWAPPED]
    swap_in = ids(back) if back else EMPTY
    prefill = [i for i, st in enumerate(status) if (st != _SWAPPED and todo[i] > 1) or st == _WAITING]
    if prefill:
        return StepPlan(prefill_ids=batch[prefill], prefill_tokens=ids([todo[i] for i in prefill]),
                        preempt_ids=preempt, preempt_mode="swap", swap_in_ids=swap_in, draft_sync=True)
    return StepPlan(decode_ids=batch, k=np.array([k] * keep, dtype=np.int64), preempt_ids=preempt, preempt_mode="swap",
                    swap_in_ids=swap_in)
