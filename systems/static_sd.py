"""Static speculative decoding as vLLM ships it: every decoding request speculates a chain of k tokens.

Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", ICML 2023; Chen et al.,
"Accelerating LLM Decoding with Speculative Sampling", 2023; batching and scheduling as vLLM v0.6's spec-decode
worker (``vllm/spec_decode``), the "static k" baseline of TurboSpec §6–8 and Nightjar's "static SD γ=3".

Each iteration: vLLM's prefill-prioritized batch scheduler (the draft model prefills alongside the target, keeping
its KV in sync); decode steps propose k tokens per request with the configured proposer (draft model, EAGLE head
or prompt lookup), verify them in one target forward and keep ``accepted + 1``. The engine is vLLM v0
(``conf/engine/vllm_v0.yaml``): batch-expansion scoring, KV memory split with a draft model as v0 splits it (the
draft on the driver GPU, draft and target blocks split evenly; docs/calibration.md).

Dynamic k by batch size (``k_by_batch_size``): vLLM's ``num_speculative_tokens_per_batch_size``, the way upstream
vLLM ships dynamic speculation: a list of ``[max_batch, k]`` pairs, increasing in ``max_batch``; a decode step of
``n`` requests speculates the ``k`` of the first pair with ``n <= max_batch``, and none above the last.

Deviations:
- ``k_by_batch_size``: the schedule's format is the suite's reading (no upstream source in this repository): pairs of
  (largest batch, k), the step's decoding requests counted as its batch.
- ``disable_by_batch_size`` (vLLM's ``speculative_disable_by_batch_size``) turns speculation off for a step whose
  batch reaches the threshold; vLLM then skips the proposer for good, here the draft keeps running over those steps
  (``draft_sync``), so speculation resumes without a catch-up.
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import IDLE, ProposerName, StepPlan
from repro.sim.policy import Policy, WholePromptAdmission
from repro.sim.state import View
from systems.lib import prefill_prioritized


class StaticSD(Policy):
    repeats_plan = True  # its plan follows the queues and the KV pool only (the engine may fast-forward)

    def __init__(self, k: int = 3, proposer: ProposerName = "draft", max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 4096, watermark: float = 0.01,
                 disable_by_batch_size: int | None = None,
                 k_by_batch_size: list[list[int]] | None = None) -> None:
        if k < 0:
            raise ValueError("k must be >= 0")
        self.k = k
        self.k_by_batch_size = _schedule(k_by_batch_size)
        self.proposer = proposer
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = watermark
        self.disable_by_batch_size = disable_by_batch_size
        # nothing waiting: the same decode step over whoever is left, unless k depends on the batch size
        by_batch = disable_by_batch_size is not None or self.k_by_batch_size is not None
        self.keeps_plan_after_finish = not by_batch
        self.uses_draft_model = proposer == "draft"
        # arrivals during a run: a prefill-only step over those that fit whole, then the decode step again
        self.admits = None if by_batch else WholePromptAdmission(
            max_num_seqs, max_num_batched_tokens, watermark, proposer, draft_sync=proposer == "draft")

    def schedule(self, view: View) -> StepPlan:
        adm, decode, preempt = prefill_prioritized(
            view, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            watermark=self.watermark, lookahead=self.k)
        sync = self.proposer == "draft"
        if adm.rids.size:
            return StepPlan(prefill_ids=adm.rids, prefill_tokens=adm.tokens, proposer=self.proposer, draft_sync=sync)
        if decode.size == 0 and preempt.size == 0:
            return IDLE
        k = self.k
        if self.k_by_batch_size is not None:
            k = next((kk for most, kk in self.k_by_batch_size if decode.size <= most), 0)
        if self.disable_by_batch_size is not None and decode.size >= self.disable_by_batch_size:
            k = 0
        return StepPlan(decode_ids=decode, k=np.full(decode.size, k, dtype=np.int64), proposer=self.proposer,
                        draft_sync=sync, preempt_ids=preempt)


def _schedule(pairs: list[list[int]] | None) -> tuple[tuple[int, int], ...] | None:
    """``k_by_batch_size`` checked: ``[max_batch, k]`` pairs, ``max_batch`` increasing and positive, ``k >= 0``."""
    if pairs is None:
        return None
    try:
        out = tuple((int(b), int(k)) for b, k in pairs)
    except (TypeError, ValueError):
        raise ValueError(f"k_by_batch_size: a list of [max_batch, k] pairs, not {pairs!r}") from None
    if not out or any(b < 1 or k < 0 for b, k in out) or [b for b, _ in out] != sorted({b for b, _ in out}):
        raise ValueError(f"k_by_batch_size: [max_batch, k] pairs with max_batch increasing from 1 and k >= 0, not "
                         f"{[list(p) for p in out]}")
    return out

