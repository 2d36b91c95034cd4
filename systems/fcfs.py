"""FCFS at batch size 1 with speculative decoding: the reference point of LAPS-SD's comparison.

Li, Chen and Li, "Semi-Clairvoyant Scheduling of Speculative Decoding Requests to Minimize LLM Inference Latency"
(arXiv:2505.17074), §1 Figure 1(a) and §2.3: first come, first served, as LLM serving systems commonly schedule.

Requests start in arrival order whenever the batch has room (``max_batch``, 1 as in the paper) and run to
completion, each round speculating a chain of ``k`` draft tokens.

Deviations:
- Not ``static_sd`` with one sequence: that is vLLM's scheduler on vLLM v0's engine; this one shares LAPS-SD's
  request-level scheduler (``systems.lib.serve_in_order``), speculation length and engine profile, so the four
  schedulers of the comparison differ only in their order.
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import StepPlan
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.lib import check_positive_int, serve_in_order


class FCFS(Policy):
    repeats_plan = True  # request-level order: a full batch decodes until a request finishes or arrives
    keeps_plan_after_finish = True  # nothing waiting: the same batch minus who finished, same k
    uses_draft_model = True

    def __init__(self, k: int = 4, max_batch: int = 1) -> None:
        self.k = check_positive_int("k", k)
        self.max_batch = check_positive_int("max_batch", max_batch)

    def schedule(self, view: View) -> StepPlan:
        running, waiting = view.running, view.waiting
        queued = waiting[np.lexsort((waiting, view.arrival_s[waiting]))]  # first come, first served
        return serve_in_order(view, np.concatenate([running, queued]), max_batch=self.max_batch, k=self.k,
                              pinned=running)
