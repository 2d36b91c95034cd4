"""GlobalGreedy: AdaServe without SLO-customized selection (the §6.3 ablation).

Li et al., "AdaServe: SLO-Customized LLM Serving with Fine-Grained Speculative Decoding", arXiv:2501.12162; §6.3
"Comparison with tree construction algorithms": the budget B goes to the nodes with the highest approximate path
probabilities across all candidate trees (Algorithm 2 lines 18–23 alone), so it is budget-aware but SLO-blind.

Each iteration: AdaServe's batch scheduling and speculation (beam search of d × w, Eq. 8–9), then the B − n
globally most probable candidate nodes (Eq. 6), then verification.

Deviations: as systems/adaserve.py (prefill-prioritized batching, strict budget, no speculation when n ≥ B).
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import StepPlan
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.trees import TreeBatching, select_global, tree_plan, tree_specs


class GlobalGreedy(Policy):
    uses_draft_model = True

    def __init__(self, d_max: int = 8, w_max: int = 16, budget: int | None = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 4096, watermark: float = 0.01) -> None:
        self.batching = TreeBatching(d_max, w_max, budget, max_num_seqs, max_num_batched_tokens, watermark)
        self.branching_trees = w_max > 1  # (beams of width 1 are chains)

    def schedule(self, view: View) -> StepPlan:
        plan, decode, budget = self.batching.batch(view)
        if plan is not None:
            return plan
        n = int(decode.size)
        ranked, _, _ = self.batching.speculate(view, decode, budget)
        # Eq. (6): the B − n most probable nodes over all candidate trees
        counts = select_global(ranked, np.zeros(n, dtype=np.int64), budget - n)
        return tree_plan(view, decode, tree_specs(ranked, counts))
