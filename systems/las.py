"""LAS: Least-Attained-Service scheduling of speculative-decoding requests, preemptive at every round.

The LAS baseline of Li, Chen and Li, "Semi-Clairvoyant Scheduling of Speculative Decoding Requests to Minimize LLM
Inference Latency" (arXiv:2505.17074), §3 and §5.1 ("allows inference requests to be preempted based on their
attained services, which has been adopted by [Leviathan et al., 2023]"); LAS as in Rai et al., SIGMETRICS 2003.

After every speculative-decoding round the batch is the ``max_batch`` requests with the least attained service
(speculation plus verification time spent on them; ties by arrival); a running request that lost its place is
swapped out (KV to host memory, charged by the engine over the host link) and swapped back in when it wins again.

Deviations:
- Attained service as LAPS-SD measures it (``systems.laps_sd``): every step the request ran in, prefill included,
  at the step's drafting plus verification time; swap time is not service.
- Speculation length, engine profile and batch size as LAPS-SD's (``conf/system/las.yaml``), so the comparison
  differs only in the order.
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import StepPlan, StepResult
from repro.sim.policy import Policy, PolicyContext
from repro.sim.state import View
from systems.lib import check_positive_int, contenders, serve_in_order


class LAS(Policy):
    uses_draft_model = True

    def __init__(self, k: int = 4, max_batch: int = 1) -> None:
        self.k = check_positive_int("k", k)
        self.max_batch = check_positive_int("max_batch", max_batch)
        self.attained_s = np.zeros(0)

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        self.attained_s = np.zeros(0)

    def schedule(self, view: View) -> StepPlan:
        if self.attained_s.size < view.arrival_s.size:
            self.attained_s = np.zeros(view.arrival_s.size)
        rids = contenders(view)
        order = rids[np.lexsort((rids, view.arrival_s[rids], self.attained_s[rids]))]  # least attained first
        return serve_in_order(view, order, max_batch=self.max_batch, k=self.k)

    def observe(self, result: StepResult) -> None:
        ran = np.concatenate([result.prefill_ids, result.decode_ids])
        self.attained_s[ran] += result.draft_s + result.verify_s
