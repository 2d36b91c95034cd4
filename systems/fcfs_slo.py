"""FCFS with an SLO-aware batch size limit: continuous batching that keeps batches small while urgent requests run.

Li et al., "AdaServe: SLO-Customized LLM Serving with Fine-Grained Speculative Decoding", arXiv:2501.12162,
§6.3 "Comparison with scheduling strategies based on continuous batching" (Figure 7): "FCFS and STTA are
preemption-based strategies that select requests to run in each decoding iteration according to specific policies.
FCFS [...] typically preempts requests when the number of concurrent requests exceeds a predefined threshold. In our
setting, these strategies are SLO-aware, dynamically adjusting batch size limits to accommodate TPOT SLOs. When
urgent requests exist, batch sizes are kept small to ensure low per-token latency, with requests preempted according
to the scheduling policy."

Each iteration, with every request the server holds (running, swapped, waiting) ordered by arrival time
(``systems.lib.slo_aware_batch``): (1) as in incremental decoding (§6.1), prompts run first in a prefill-only step
(FCFS, within the token and KV budgets); (2) otherwise the decoding iteration's batch is the longest prefix of the
decode-ready (or swapped) requests whose decode step the cost model estimates within the tightest TPOT SLO in it
(``systems.lib.slo_batch_limit``): while an urgent request runs the batch stays small, and the requests past the
limit, the most recently arrived, are preempted from the batch and wait, their per-token latency growing.

Deviations:
- The paper does not say how a preempted request is stored. It names waiting as the overhead ("preempted requests
  must wait to join a new batch"), so by default a request preempted from the batch keeps its KV on the GPU and is
  evicted (``preempt_mode``, swap by default: it keeps the tokens generated so far, at the host-link cost the
  engine charges; swapped requests come back when they re-enter the batch and KV allows) only when KV runs short,
  latest arrival first; ``evict_unselected: true`` evicts every preempted request at once.
- Admission is not limited by the batch size limit (only the limit on running requests, ``max_num_seqs``): the
  limit applies to "each decoding iteration"; new admissions wait while requests are swapped out (as vLLM).
- The limit is estimated for a decode-only step from the cost model (a real system would profile it); prefill
  steps are not limited.
- Batch caps are IncrDec's (FlexFlow Serve's 64 requests, 3000 tokens per step), the engine AdaServe built them in;
  the KV ``watermark`` for admissions is vLLM's.
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import PreemptMode, StepPlan
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.lib import SloBatching, contenders


class FCFSSLO(Policy):
    def __init__(self, max_num_seqs: int = 64, max_num_batched_tokens: int = 3000, watermark: float = 0.01,
                 preempt_mode: PreemptMode = "swap", evict_unselected: bool = False) -> None:
        self.batching = SloBatching(max_num_seqs, max_num_batched_tokens, watermark, preempt_mode, evict_unselected)

    def schedule(self, view: View) -> StepPlan:
        rids = contenders(view)
        order = rids[np.lexsort((rids, view.arrival_s[rids]))]  # first come, first served
        return self.batching.plan(view, order)
