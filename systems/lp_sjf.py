"""LP-SJF: shortest job first on the predicted output length, non-preemptive.

The LP-SJF baseline of Li, Chen and Li, "Semi-Clairvoyant Scheduling of Speculative Decoding Requests to Minimize
LLM Inference Latency" (arXiv:2505.17074), §5.1: Qiu et al., "Efficient Interactive LLM Serving with Proxy
Model-based Sequence Length Prediction" (ASPLOS 2024 workshop), whose proxy model predicts each request's output
length; the scheduler runs the request with the shortest prediction.

Whenever the batch has room (``max_batch``, 1 as in the paper), the waiting request with the shortest predicted
output length (ties by arrival) starts; a started request runs to completion.

Deviations:
- The proxy model is the configurable error model LAPS-SD uses (``systems.lib.LogNormalLengthPredictor``, same
  σ and the same draws for the same seed), so the two differ only in how they use the prediction.
- Qiu et al. also preempt with a starvation guard (SSJF's variants); the LAPS-SD paper's baseline is plain SJF.
- Speculation length, engine profile and batch size as LAPS-SD's (``conf/system/lp_sjf.yaml``).
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import StepPlan
from repro.sim.policy import Policy, PolicyContext
from repro.sim.state import View
from systems.lib import LogNormalLengthPredictor, check_positive_int, length_predictor, serve_in_order


class LPSJF(Policy):
    repeats_plan = True  # request-level order: a full batch decodes until a request finishes or arrives
    keeps_plan_after_finish = True  # nothing waiting: the same batch minus who finished, same k
    uses_draft_model = True

    def __init__(self, k: int = 4, length_error_sigma: float = 0.25, max_batch: int = 1) -> None:
        self.k = check_positive_int("k", k)
        self.max_batch = check_positive_int("max_batch", max_batch)
        self.sigma = length_error_sigma
        self.predictor = LogNormalLengthPredictor(length_error_sigma)
        self.pred_len = np.zeros(0, dtype=np.int64)

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        self.predictor = length_predictor(self.sigma, ctx.rng)
        self.pred_len = np.zeros(0, dtype=np.int64)

    def schedule(self, view: View) -> StepPlan:
        if self.pred_len.size < view.arrival_s.size:
            self.pred_len = np.full(view.arrival_s.size, -1, dtype=np.int64)
        running, waiting = view.running, view.waiting
        new = waiting[self.pred_len[waiting] < 0]
        if new.size:  # the proxy model predicts each request once, on arrival
            self.pred_len[new] = view.predicted_output_len(new, self.predictor)
        pred = self.pred_len[waiting]
        queued = waiting[np.lexsort((waiting, view.arrival_s[waiting], pred))]  # shortest predicted first
        order = np.concatenate([running, queued])
        return serve_in_order(view, order, max_batch=self.max_batch, k=self.k, pinned=running)  # never preempts
