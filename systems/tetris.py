"""TETRIS: fixed-length drafting, then the batch's most confident draft tokens verified within a token budget.

Wu et al., "TETRIS: Optimal Draft Token Selection for Batch Speculative Decoding", arXiv:2502.15197, as Nightjar
(Li et al.) ref. [16] describes the baseline (§6.1): "Given a fixed speculative length (similar to standard SD),
TETRIS keeps the draft generation process intact but re-engineers the verification phase. Within a predefined
computational budget, it prioritizes the verification of tokens with the highest predictive entropy across a batch";
§6.2: "TETRIS exhibits performance drops under high request load due to its high overhead in large batch size".
Implemented: chains of γ drafted for every decoding request, the greedy selection of the C draft tokens of the
batch with the highest path probability (each request's selection a prefix of its chain), verified on vLLM v0,
and the host cost of ranking the batch's drafts charged to each step (``StepPlan.host_s``).

Each iteration:
  1. vLLM's prefill-prioritized batch scheduler (FCFS, recompute preemption), reserving γ lookahead KV slots per
     decoding request; a prefill step runs the draft model alongside the target;
  2. decode step: the draft model drafts a chain of γ for every request (the drafter's width-1, depth-γ candidate
     tree, each node carrying its path probability, the product of the draft's probabilities along the chain);
  3. selection (:func:`select_drafts`): the C = ⌊budget_per_seq · B⌋ draft tokens of the batch with the highest
     path probability (ties: shallower, then earlier in the batch); a child's path probability never exceeds its
     parent's, so every request's selection is a prefix of its chain (a chain-shaped ``TreeSpec``);
  4. one target pass verifies every request's selected prefix (scored like a chain of that length: batch
     expansion), each request keeps accepted + 1 tokens; the step pays ``host_s`` for the ranking.

Deviations:
- Ranking key: the path probability (the draft's estimate that the token and its prefix are accepted, for a
  calibrated draft), the quantity TETRIS's greedy selection maximizes (its title: "optimal draft token
  selection"); Nightjar's "highest predictive entropy" is read as highest confidence (most likely accepted).
- Budget C = ⌊budget_per_seq · B⌋ draft tokens per step on top of each request's last token (ours; TETRIS's own
  capacity is not in the material we have): budget_per_seq = 2 < γ = 3, so a step verifies at most 2/3 of the
  B·γ drafted tokens and drops the least confident third. γ = 3 as Nightjar's standard SD.
- Every request drafts the full γ whatever is selected (TETRIS keeps drafting intact): the draft cost is a chain
  of γ per request; unselected tokens only save verification.
- Verification cost: each request's own prefix length k_i is charged (k_i + 1 expanded sequences under vLLM v0's
  batch expansion). vLLM v0's spec decode assumes one proposal length per step; TETRIS on it needs a scorer that
  takes per-sequence lengths, and that is what is charged (no padding to the longest prefix).
- Host cost of the ranking (``host_s``, not measured; order-of-magnitude values): a fixed ``host_fixed_s`` = 50 µs
  per step (copying the batch's draft probabilities device → host and the stream synchronization that waits for
  the draft) plus ``host_per_token_log_s`` = 0.2 µs per comparison of a sort of the N = B·γ drafted tokens,
  N·log2 N comparisons (a host-side sort and greedy walk, a few tenths of a µs per element step). At B = 256,
  γ = 3: 1.5 ms per step; at B = 8: 0.07 ms.
- Lookahead slots: γ per decoding request (every draft token may be selected when C ≥ B·γ).
- Draft-model proposer only; the draft runs on every step (``draft_sync``), as StaticSD.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from repro.sim.plan import IDLE, CandidateTree, StepPlan, TreeSpec
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.lib import prefill_prioritized
from systems.trees import rank_nodes, select_global, tree_specs


def select_drafts(cands: Sequence[CandidateTree], budget: int) -> dict[int, TreeSpec]:
    """The ``budget`` draft tokens of the batch with the highest path probability (ties toward shallower tokens,
    then earlier requests), as one prefix-closed ``TreeSpec`` per request (possibly empty)."""
    counts = chain_counts(cands, budget)
    if counts is None:
        ranked = rank_nodes(cands)
        return tree_specs(ranked, select_global(ranked, np.zeros(ranked.n, dtype=np.int64), budget))
    prefixes = np.arange(cands[0].size + 1)
    prefixes.flags.writeable = False  # every tree's nodes are a view of it: 0..count-1
    nodes = [prefixes[:c] for c in range(prefixes.size)]
    return {cand.rid: TreeSpec(cand, nodes[c]) for cand, c in zip(cands, counts.tolist(), strict=True)}


def chain_counts(cands: Sequence[CandidateTree], budget: int) -> np.ndarray | None:
    """:func:`select_drafts`'s prefix length per request when every candidate is a chain of one length whose path
    probability never rises along it (a calibrated draft's: each token multiplies in a probability ≤ 1); else None.

    Each chain then is already in rank order (−path probability, depth, index), and the batch's ranking is one
    stable sort of the tokens listed depth by depth (ties: shallower, then earlier requests).
    """
    if not cands:
        return None
    n, m = len(cands), cands[0].path_prob.size
    if {(c.draft_width, c.path_prob.size) for c in cands} != {(1, m)}:
        return None
    pp = np.concatenate([c.path_prob for c in cands]).reshape(n, m)
    if not (pp[:, 1:] <= pp[:, :-1]).all():
        return None
    best = np.argsort(-pp.T.ravel(), kind="stable")[: max(budget, 0)]  # index = (depth − 1)·n + request
    return np.bincount(best % n, minlength=n)


def ranking_host_s(num_ranked: int, fixed_s: float, per_token_log_s: float) -> float:
    """Host seconds of ranking ``num_ranked`` draft tokens: a fixed cost plus a sort's N·log2 N comparisons."""
    if num_ranked <= 0:
        return 0.0
    return fixed_s + per_token_log_s * num_ranked * math.log2(num_ranked)


class TETRIS(Policy):
    uses_draft_model = True

    def __init__(self, gamma: int = 3, budget_per_seq: float = 2.0, host_fixed_s: float = 5e-5,
                 host_per_token_log_s: float = 2e-7, max_num_seqs: int = 256, max_num_batched_tokens: int = 4096,
                 watermark: float = 0.01) -> None:
        if gamma < 1 or budget_per_seq < 0 or host_fixed_s < 0 or host_per_token_log_s < 0:
            raise ValueError("gamma must be >= 1; budget_per_seq and the host costs >= 0")
        self.gamma = gamma
        self.budget_per_seq = budget_per_seq
        self.host_fixed_s = host_fixed_s
        self.host_per_token_log_s = host_per_token_log_s
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = watermark

    def budget(self, batch: int) -> int:
        """C: draft tokens verified per step for a batch of ``batch`` decoding requests."""
        return math.floor(self.budget_per_seq * batch)

    def schedule(self, view: View) -> StepPlan:
        adm, decode, preempt = prefill_prioritized(
            view, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            watermark=self.watermark, lookahead=self.gamma)
        if adm.rids.size:
            return StepPlan(prefill_ids=adm.rids, prefill_tokens=adm.tokens, proposer="draft", draft_sync=True)
        if decode.size == 0:
            return IDLE if preempt.size == 0 else StepPlan(preempt_ids=preempt)
        if view.drafter is None:
            raise ValueError("TETRIS needs a drafter (configure a draft model)")
        cands = view.drafter.candidates_batch(decode, view.num_generated[decode], self.gamma, 1)  # chains of γ
        budget = self.budget(int(decode.size))
        trees = select_drafts(cands, budget)
        host_s = ranking_host_s(int(decode.size) * self.gamma, self.host_fixed_s, self.host_per_token_log_s)
        verified = sum(t.nodes.size for t in trees.values())
        return StepPlan(decode_ids=decode, trees=trees, proposer="draft", draft_sync=True, preempt_ids=preempt,
                        host_s=host_s, telemetry={"budget": float(budget), "verified": float(verified)})
