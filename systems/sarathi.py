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

import numpy as np

from repro.sim.plan import IDLE, StepPlan
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.lib import continue_prefills, fcfs_admit, make_room, split_running


class Sarathi(Policy):
    repeats_plan = True  # its plan follows the queues and the KV pool only (the engine may fast-forward)
    keeps_plan_after_finish = True  # nothing waiting: the same decode step over whoever is left

    def __init__(self, token_budget: int = 512, max_num_seqs: int = 256, watermark: float = 0.01) -> None:
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.watermark = watermark

    def schedule(self, view: View) -> StepPlan:
        decode, prefilling = split_running(view)
        # (1) decodes first: they never stall behind a prefill (preempt the latest admitted if KV runs short)
        free = view.free_blocks - int(view.blocks_for(decode, 1).sum())
        kept = decode
        if free < 0:
            kept, preempted, _ = make_room(view, decode, 1, view.free_blocks)
            return StepPlan(decode_ids=kept, preempt_ids=preempted)  # memory is short: no prefill this step
        budget = self.token_budget - kept.size
        # (2) ongoing chunked prefills, then (3) new admissions, chunked to fill the rest of the token budget
        cont = continue_prefills(view, prefilling, token_budget=budget, free_blocks=free)
        if cont.rids.size:
            budget -= cont.num_tokens
            free -= int(view.blocks_for(cont.rids, cont.tokens).sum())
        new = fcfs_admit(view, token_budget=budget, max_new_seqs=self.max_num_seqs - view.running.size,
                         free_blocks=free, watermark_blocks=int(self.watermark * view.total_blocks), chunk=True)
        pre_ids = np.concatenate([cont.rids, new.rids])
        if kept.size == 0 and pre_ids.size == 0:
            return IDLE
        return StepPlan(prefill_ids=pre_ids, prefill_tokens=np.concatenate([cont.tokens, new.tokens]),
                        decode_ids=kept)
