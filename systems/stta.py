"""STTA (shortest time to attain) with an SLO-aware batch size limit: run the requests closest to violating their
TPOT SLO, preempt those with the most slack.

Li et al., "AdaServe: SLO-Customized LLM Serving with Fine-Grained Speculative Decoding", arXiv:2501.12162,
§6.3 "Comparison with scheduling strategies based on continuous batching" (Figure 7): a preemption-based strategy
with SLO-aware, dynamically adjusted batch size limits (as FCFS) that "prioritizes requests closest to violating
their TPOT SLOs during each iteration".

Each iteration, rank every request the server holds (running, swapped, waiting) by its slack, the time left before
its average TPOT would exceed its SLO:

    slack = first_token_at + num_generated · tpot_slo − now

(a request that has ``g`` tokens meets its SLO at token ``g + 1`` iff that token comes within ``g · tpot_slo`` of
the first one; a request with no token yet has one SLO's worth, ``tpot_slo``). Prompts run first in a prefill-only
step (least slack first); otherwise the decoding iteration's batch is the longest prefix of that ranking whose
decode step the cost model estimates within the tightest TPOT SLO in it, and the rest, the most slack, are
preempted from the batch (``systems.lib.slo_aware_batch``, as ``fcfs_slo`` with another order).

Deviations:
- The paper does not define "closest to violating"; we use the slack above (requests already behind their SLO
  rank first, most behind first), ties broken by arrival.
- Preempted requests keep their KV until it is needed (then evicted by ``preempt_mode``, most slack first), as in
  ``fcfs_slo``: with per-iteration re-ranking, evicting every preempted request (``evict_unselected: true``) moves
  KV over the host link almost every step.
- Batch caps are IncrDec's (FlexFlow Serve's 64 requests, 3000 tokens per step); the admission watermark is vLLM's.
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import PreemptMode, StepPlan
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.lib import SloBatching, contenders


def slack_s(view: View, rids: np.ndarray) -> np.ndarray:
    """Seconds each request may still wait for its next token before its average TPOT exceeds its SLO."""
    slo = view.tpot_slo_s[rids]
    gen = view.num_generated[rids]
    started = gen > 0
    out = slo.copy()
    out[started] = view.first_token_at[rids[started]] + gen[started] * slo[started] - view.now
    return out


class STTA(Policy):
    def __init__(self, max_num_seqs: int = 64, max_num_batched_tokens: int = 3000, watermark: float = 0.01,
                 preempt_mode: PreemptMode = "swap", evict_unselected: bool = False) -> None:
        self.batching = SloBatching(max_num_seqs, max_num_batched_tokens, watermark, preempt_mode, evict_unselected)

    def schedule(self, view: View) -> StepPlan:
        rids = contenders(view)
        order = rids[np.lexsort((rids, view.arrival_s[rids], slack_s(view, rids)))]  # least slack first
        return self.batching.plan(view, order)
