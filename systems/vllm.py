"""vLLM: continuous batching with PagedAttention, FCFS, prefill-prioritized (vLLM v0's default scheduler).

Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention", SOSP 2023;
scheduler as in vLLM v0.6 (``vllm/core/scheduler.py``, chunked prefill off).

Each iteration: if waiting requests fit whole (token budget ``max_num_batched_tokens``, ``max_num_seqs`` running,
free KV blocks above the watermark), run a prefill-only step over them in FCFS order; otherwise decode every
running request, preempting the most recently admitted by recompute when KV runs out.

Deviations:
- No swap preemption (vLLM v0 swaps only for beam search / multi-sequence groups); recompute throughout.
- The KV watermark is a fraction of the pool (vLLM's default 0.01), checked for admissions only.
"""

from __future__ import annotations

from repro.sim.plan import IDLE, StepPlan
from repro.sim.policy import Policy, WholePromptAdmission
from repro.sim.state import View
from systems.lib import prefill_prioritized


class VLLM(Policy):
    speculates = False  # no speculative method configured
    repeats_plan = True  # its plan follows the queues and the KV pool only (the engine may fast-forward)
    keeps_plan_after_finish = True  # nothing waiting: the same decode step over whoever is left

    def __init__(self, max_num_seqs: int = 256, max_num_batched_tokens: int = 4096,
                 watermark: float = 0.01) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = watermark
        # arrivals during a run: a prefill-only step over those that fit whole, then the decode step again
        self.admits = WholePromptAdmission(max_num_seqs, max_num_batched_tokens, watermark)

    def schedule(self, view: View) -> StepPlan:
        adm, decode, preempt = prefill_prioritized(
            view, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            watermark=self.watermark)
        if adm.rids.size:
            return StepPlan(prefill_ids=adm.rids, prefill_tokens=adm.tokens)
        if decode.size == 0 and preempt.size == 0:
            return IDLE
        return StepPlan(decode_ids=decode, preempt_ids=preempt)
