"""Sarathi-Serve: chunked prefill within a per-step token budget, decodes first, stall-free batching.

Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", OSDI 2024, §4
(Algorithm 2: stall-free batching).

Each iteration: (1) every decode-ready running request decodes (one token each), preempting the most recently
admitted by recompute if KV runs short; (2) partially prefilled running requests continue with the budget left;
(3) new requests are admitted FCFS and their prompts chunked to fill the rest of the token budget.

Deviations:
- Recompute preemption (as vLLM) rather than Sarathi-Serve's swap/recompute choice.
"""

from __future__ import annotations

from repro.sim.plan import IDLE, StepPlan
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.lib import decodes_first


class Sarathi(Policy):
    speculates = False  # no speculative method configured
    repeats_plan = True  # its plan follows the queues and the KV pool only (the engine may fast-forward)
    keeps_plan_after_finish = True  # nothing waiting: the same decode step over whoever is left

    def __init__(self, token_budget: int = 512, max_num_seqs: int = 256, watermark: float = 0.01) -> None:
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.watermark = watermark

    def schedule(self, view: View) -> StepPlan:
        # (1) decodes first: they never stall behind a prefill (preempt the latest admitted if KV runs short);
        # (2) ongoing chunked prefills, then (3) new admissions, chunked to fill the rest of the token budget
        decode, preempted, pre = decodes_first(view, lookahead=0, token_budget=self.token_budget,
                                               max_num_seqs=self.max_num_seqs,
                                               watermark_blocks=int(self.watermark * view.total_blocks))
        if preempted.size:
            return StepPlan(decode_ids=decode, preempt_ids=preempted)  # memory is short: no prefill this step
        if decode.size == 0 and pre.rids.size == 0:
            return IDLE
        return StepPlan(prefill_ids=pre.rids, prefill_tokens=pre.tokens, decode_ids=decode)
