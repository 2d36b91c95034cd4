"""SpecInfer, batched: every decoding request verifies a token tree of one fixed expansion (not budget-aware).

Miao et al., "SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative Inference and
Verification", ASPLOS 2024 (arXiv:2305.09781); as the baseline of AdaServe (arXiv:2501.12162) §6.1: "a batched
version of SpecInfer, using a default fixed tree expansion configuration of ⟨1,1,3,1,1,1,1,1⟩".

Each iteration: prefill-prioritized batch scheduling; for every decoding request the drafter expands the tree
level by level, every node of depth i − 1 by its own expansion[i] most probable children (SpecInfer's expansion,
as the authors' FlexFlow Serve code does: each node's top-k, all kept), giving the ⟨1,1,3,1,1,1,1,1⟩ tree of
1 + 1 + 3·6 = 20 nodes; one target pass verifies every request's whole tree.

Deviations:
- Drafting is charged as a beam over the expansion's widest level (d passes over n·3 tokens here), the same cost
  the draft model pays to expand the 20-node tree level by level.
- Batch scheduling as systems/adaserve.py (vLLM-style prefill-prioritized FCFS, recompute preemption).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from repro.sim.plan import IDLE, StepPlan, TreeSpec
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.trees import admit_or_decode, tree_plan


class SpecInfer(Policy):
    uses_draft_model = True

    def __init__(self, expansion: Sequence[int] = (1, 1, 3, 1, 1, 1, 1, 1), max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 4096, watermark: float = 0.01) -> None:
        self.expansion = tuple(int(k) for k in expansion)
        if not self.expansion or min(self.expansion) < 1:
            raise ValueError("expansion must be a non-empty list of positive child counts")
        self.branching_trees = max(self.expansion) > 1
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = watermark

    def schedule(self, view: View) -> StepPlan:
        prefill, decode = admit_or_decode(view, max_num_seqs=self.max_num_seqs,
                                          max_num_batched_tokens=self.max_num_batched_tokens, watermark=self.watermark)
        if prefill is not None:
            return prefill
        if decode.size == 0:
            return IDLE
        if view.drafter is None:
            raise ValueError("SpecInfer needs a drafter (configure a draft model)")
        cands = view.drafter.expansion_batch(decode, view.num_generated[decode], self.expansion)
        trees = {c.rid: TreeSpec(c, np.arange(c.size)) for c in cands}  # the whole expansion is verified
        return tree_plan(view, decode, trees)
