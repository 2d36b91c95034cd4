"""EqualGreedy: the budget split evenly among requests, each filled greedily by path probability (§6.3 ablation).

Li et al., "AdaServe: SLO-Customized LLM Serving with Fine-Grained Speculative Decoding", arXiv:2501.12162; §6.3
"Comparison with tree construction algorithms": like EAGLE-2's top-m selection over a beam-search candidate tree
(Li et al., arXiv:2406.16858), but budget-aware: every request gets ⌊B/n⌋ tokens of the budget.

Each iteration: AdaServe's batch scheduling and speculation (beam search of d × w, Eq. 8–9), then per request its
⌊B/n⌋ − 1 most probable candidate nodes (the root takes one token), then verification.

Deviations:
- The B mod n tokens left by the even split stay unused (the paper does not say where they go).
- As systems/adaserve.py: prefill-prioritized batching, no speculation when n ≥ B.
"""

from __future__ import annotations

from repro.sim.plan import StepPlan
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.trees import TreeBatching, select_equal, tree_plan, tree_specs


class EqualGreedy(Policy):
    uses_draft_model = True

    def __init__(self, d_max: int = 8, w_max: int = 16, budget: int | None = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 4096, watermark: float = 0.01) -> None:
        self.batching = TreeBatching(d_max, w_max, budget, max_num_seqs, max_num_batched_tokens, watermark)
        self.branching_trees = w_max > 1  # (beams of width 1 are chains)

    def schedule(self, view: View) -> StepPlan:
        plan, decode, budget = self.batching.batch(view)
        if plan is not None:
            return plan
        ranked, _, _ = self.batching.speculate(view, decode, budget)
        # ⌊B/n⌋ tokens per request, greedy by f(v) within its own candidate tree
        return tree_plan(view, decode, tree_specs(ranked, select_equal(ranked, budget)))
