"""SpecInfer, batched: every decoding request verifies a token tree of one fixed expansion (not budget-aware).

Miao et al., "SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative Inference and
Verification", ASPLOS 2024 (arXiv:2305.09781); as the baseline of AdaServe (arXiv:2501.12162) §6.1: "a batched
version of SpecInfer, using a default fixed tree expansion configuration of ⟨1,1,3,1,1,1,1,1⟩".

Each iteration: prefill-prioritized batch scheduling; for every decoding request a candidate tree of depth
len(expansion); at depth i every selected node keeps its expansion[i] most probable children, giving the
⟨1,1,3,1,1,1,1,1⟩ tree (2 + 3 + 3·5 = 20 nodes); one target pass verifies all trees.

Deviations:
- SpecInfer expands each node by the draft's top-k tokens at that node. Our drafter only serves beam searches, so
  the expansion is read off a beam whose width is the expansion's widest level (3 here, capped at the drafter's
  width): at each depth, each selected node keeps its k lowest-rank children present in the beam. A child the
  beam dropped (because other branches had higher path probability) is missing, so a tree can be smaller than 20.
- Drafting is charged as that beam search (d passes over n·w tokens), not SpecInfer's per-branch expansion.
- Batch scheduling as systems/adaserve.py (vLLM-style prefill-prioritized FCFS, recompute preemption).
"""

from __future__ import annotations

from collections.abc import Sequence

from repro.plan import IDLE, StepPlan, TreeSpec
from repro.policy import Policy
from repro.state import View
from systems.trees import admit_or_decode, expansion_width, select_expansion, tree_plan


class SpecInfer(Policy):
    uses_draft_model = True

    def __init__(self, expansion: Sequence[int] = (1, 1, 3, 1, 1, 1, 1, 1), max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 4096, watermark: float = 0.01) -> None:
        self.expansion = tuple(int(k) for k in expansion)
        if not self.expansion or min(self.expansion) < 1:
            raise ValueError("expansion must be a non-empty list of positive child counts")
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
        width = min(expansion_width(self.expansion), view.drafter.max_width)
        cands = view.drafter.candidates_batch(decode, view.num_generated[decode], len(self.expansion), width)
        trees = {c.rid: TreeSpec(c, select_expansion(c, self.expansion)) for c in cands}
        return tree_plan(view, decode, trees)
