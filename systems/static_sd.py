"""Static speculative decoding as vLLM ships it: every decoding request speculates a chain of k tokens.

Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", ICML 2023; Chen et al.,
"Accelerating LLM Decoding with Speculative Sampling", 2023; batching and scheduling as vLLM v0.6's spec-decode
worker (``vllm/spec_decode``), the "static k" baseline of TurboSpec §6–8 and Nightjar's "static SD γ=3".

Each iteration: vLLM's prefill-prioritized batch scheduler (the draft model prefills alongside the target, keeping
its KV in sync); decode steps propose k tokens per request with the configured proposer (draft model, EAGLE head
or prompt lookup), verify them in one target forward and keep ``accepted + 1``. The engine is vLLM v0
(``conf/engine/vllm_v0.yaml``): batch-expansion scoring, KV memory split with a draft model as v0 splits it (the
draft on the driver GPU, draft and target blocks split evenly; docs/calibration.md).

Deviations:
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
                 disable_by_batch_size: int | None = None) -> None:
        if k < 0:
            raise ValueError("k must be >= 0")
        self.k = k
        self.proposer = proposer
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = watermark
        self.disable_by_batch_size = disable_by_batch_size
        # nothing waiting: the same decode step over whoever is left, unless k depends on the batch size
        self.keeps_plan_after_finish = disable_by_batch_size is None
        self.uses_draft_model = proposer == "draft"
        # arrivals during a run: a prefill-only step over those that fit whole, then the decode step again
        self.admits = None if disable_by_batch_size is not None else WholePromptAdmission(
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
        if self.disable_by_batch_size is not None and decode.size >= self.disable_by_batch_size:
            k = 0
        return StepPlan(decode_ids=decode, k=np.full(decode.size, k, dtype=np.int64), proposer=self.proposer,
                        draft_sync=sync, preempt_ids=preempt)
