"""vLLM V1's scheduler with static speculation: decodes first, chunked prefill in the same step, k drafts each.

vLLM V1 (``vllm/v1/core/sched/scheduler.py``, ``vllm/v1/spec_decode``), the engine of validate_vllm_v1 (a main build
of 2026-01-23) and of ``vllm bench serve`` runs with ``--speculative-config`` (draft model, EAGLE-3 or n-gram,
``num_speculative_tokens`` = k).

Each iteration, within ``max_num_batched_tokens`` tokens and ``max_num_seqs`` sequences: (1) every decode-ready
running request is scheduled with its 1 + k tokens (the last sampled token and k draft tokens to verify), preempting
the most recently admitted by recompute while the KV cache runs short (V1's ``_preempt_request`` takes the last of
the running queue); (2) partially prefilled running requests continue; (3) waiting requests are admitted FCFS, the
last prompt chunked to the budget left (chunked prefill, on in V1). The engine profile (``vllm_v1``) verifies the
drafts in the same pass as the prefill chunks, one multi-query pass of k + 1 tokens per request; the draft model
keeps its KV in sync over the prompts (V1's drafter runs on every scheduled token).

Deviations:
- A step that must preempt schedules no prefill (V1 stops admitting for that step too, but continues the prefills of
  requests already running when they fit); the difference is one step per preemption.
- No KV watermark (V1 has none); no prefix caching (off in the validation runs).
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import IDLE, ProposerName, StepPlan
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.lib import check_positive_int, decodes_first


class VLLMV1(Policy):
    repeats_plan = True  # its plan follows the queues and the KV pool only (the engine may fast-forward)
    keeps_plan_after_finish = True  # nothing waiting: the same decode step over whoever is left

    def __init__(self, k: int = 0, proposer: ProposerName = "draft", max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192) -> None:
        if k < 0:
            raise ValueError("k must be >= 0")
        self.k = k
        self.proposer = proposer
        self.max_num_seqs = check_positive_int("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = check_positive_int("max_num_batched_tokens", max_num_batched_tokens)
        self.uses_draft_model = k > 0 and proposer == "draft"
        self.speculates = k > 0  # (--speculative-config set)

    def schedule(self, view: View) -> StepPlan:
        k = self.k
        sync = self.uses_draft_model
        # (1) decodes first, 1 + k KV slots and tokens each (preempt the latest admitted if KV runs short);
        # (2) ongoing chunked prefills, then (3) new admissions chunked to the rest of the token budget
        decode, preempted, pre = decodes_first(view, lookahead=k, token_budget=self.max_num_batched_tokens,
                                               max_num_seqs=self.max_num_seqs)
        chains = np.full(decode.size, k, dtype=np.int64)
        if preempted.size:
            return StepPlan(decode_ids=decode, k=chains, proposer=self.proposer, draft_sync=sync,
                            preempt_ids=preempted)
        if decode.size == 0 and pre.rids.size == 0:
            return IDLE
        return StepPlan(prefill_ids=pre.rids, prefill_tokens=pre.tokens, decode_ids=decode, k=chains,
                        proposer=self.proposer, draft_sync=sync)
