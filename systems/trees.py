"""Shared pieces of the tree-speculation systems (AdaServe, SpecInfer, EqualGreedy, GlobalGreedy).

Li et al., "AdaServe: SLO-Customized LLM Serving with Fine-Grained Speculative Decoding", arXiv:2501.12162:
candidate trees come from the drafter's beam search (§4.3 Step 1); selection picks nodes of them by the draft's
approximate path probability f(v) (Eq. 7) within a token budget B (Eq. 1).

Selection works on a :class:`Ranked` batch: each request's candidate nodes sorted by ``(−path_prob, depth,
index)``. Because a child's path probability never exceeds its parent's (f(child) = f(parent)·p, p ≤ 1; paper
App. A.1) and the parent is shallower, a parent always precedes its children in that order, so *every prefix of
a row is a tree closed under parent*. All selectors below therefore only decide a prefix length per request
(``counts``): the SLO step takes a prefix per request, the throughput step extends prefixes by the globally best
remaining nodes (which again extends each row by a prefix), and the result is connected by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from repro.core import jit
from repro.cost.step import decode_pass_s
from repro.sim.plan import IDLE, CandidateTree, StepPlan, TreeSpec, ids
from repro.sim.state import View

if TYPE_CHECKING:
    from repro.cost.model import CostModel
from systems.lib import fcfs_admit, make_room, split_running

Order = Literal["descending", "ascending"]
_PAD_DEPTH = np.iinfo(np.int64).max // 4


@dataclass(frozen=True, slots=True)
class Ranked:
    """Candidate trees of a batch as padded ``(n, m)`` arrays, each row sorted by ``(−path_prob, depth, index)``.

    ``node[i, j]`` is the candidate-node index of the ``j``-th best node of request ``i`` (``-1`` past
    ``size[i]``), ``pp`` its path probability (``-inf`` as padding), ``depth`` its depth.
    """

    cands: Sequence[CandidateTree]
    node: np.ndarray
    pp: np.ndarray
    depth: np.ndarray
    size: np.ndarray

    @property
    def n(self) -> int:
        return int(self.node.shape[0])


_ROWS = np.arange(1024)[:, None]


def _rows(n: int) -> np.ndarray:
    """Row indices as an (n, 1) column (to pick along rows: ``a[_rows(n), idx]``)."""
    return _ROWS[:n] if n <= _ROWS.shape[0] else np.arange(n)[:, None]


def rank_nodes(cands: Sequence[CandidateTree]) -> Ranked:
    """Sort every candidate tree's nodes by path probability (ties toward shallower, then lower index)."""
    n = len(cands)
    size = np.fromiter((c.size for c in cands), dtype=np.int64, count=n)
    m = int(size.max()) if n else 0
    if n and (size == m).all():  # the drafter's batches: one (depth × width) shape, stack without padding
        pp = np.stack([c.path_prob for c in cands]).astype(np.float64, copy=False)
        shared = cands[0].depth
        if all(c.depth is shared for c in cands) and (shared[1:] >= shared[:-1]).all():
            # one depth array, in breadth-first order: nodes tied in pp are in (depth, index) order already
            node = np.argsort(-pp, axis=1, kind="stable")
            return Ranked(cands, node, pp[_rows(n), node], shared[node], size)  # take_along_axis, without its set-up
        depth = np.stack([c.depth for c in cands])
    else:
        pp = np.full((n, m), -np.inf)
        depth = np.full((n, m), _PAD_DEPTH, dtype=np.int64)
        for i, c in enumerate(cands):
            pp[i, : c.size] = c.path_prob
            depth[i, : c.size] = c.depth
    idx = np.broadcast_to(np.arange(m), (n, m))
    node = np.lexsort((idx, depth, -pp), axis=-1)
    rows = _rows(n)
    spp, sdepth = pp[rows, node], depth[rows, node]  # take_along_axis along rows, without its per-call set-up
    node = np.where(idx < size[:, None], node, -1)
    return Ranked(cands, node, spp, sdepth, size)


def depth_width(n_active: int, d_max: int, w_max: int, budget: int) -> tuple[int, int]:
    """Eq. (8)–(9): d = max(1, min(D_max, ⌈B/n⌉)), w = max(1, min(W_max, ⌊B/n⌋))."""
    if n_active <= 0:
        return d_max, w_max
    d = max(1, min(d_max, -(-budget // n_active)))
    w = max(1, min(w_max, budget // n_active))
    return d, w


def slo_targets(view: View, rids: np.ndarray, t_spec_s: float, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (2)–(3): ``(A, target)`` with A(r) = (l + t_spec)/t_TPOT − o and target = min(A, d + 1) − 1.

    - l = now − first_token_at; o = num_generated − 1 (tokens decoded since the first).
    - target = A_cap(r) − 1: what the speculated nodes must add to the root's certain token (Algorithm 2 line 6,
      n_acc starts at 1.0).
    - A request without a TPOT SLO (inf) has A = −o.
    """
    first = view.first_token_at[rids]
    lat = np.where(np.isnan(first), 0.0, view.now - first)
    decoded = np.maximum(view.num_generated[rids] - 1, 0).astype(np.float64)
    with np.errstate(divide="ignore"):
        a = (lat + t_spec_s) / view.tpot_slo_s[rids] - decoded
    return a, np.minimum(a, depth + 1.0) - 1.0


def select_slo_customized(ranked: Ranked, target: np.ndarray, key: np.ndarray, *, order: Order, n_max: int,
                          budget: int) -> np.ndarray:
    """Algorithm 2 lines 9–17 (SLO-customized selection); returns the nodes taken per request (a ranked-row prefix).

    Visits requests by ``key`` (A(r)) in ``order``, adding each one's most probable nodes until Σ f(v) ≥ ``target``
    (A_cap − 1), at most ``n_max`` per request, while ``budget`` nodes remain.
    """
    n = ranked.n
    if n == 0 or budget <= 0 or n_max <= 0:
        return np.zeros(n, dtype=np.int64)
    visit = np.argsort(-key if order == "descending" else key, kind="stable")
    if jit.step_kernels():  # the same selection, compiled (systems.kernels.slo_select)
        taken = np.empty(n, dtype=np.int64)
        jit.kernel("systems.kernels", "slo_select")(ranked.pp, ranked.size, np.asarray(target, dtype=np.float64),
                                                    int(n_max), visit, int(budget), taken)
        return taken
    pp = np.where(np.isfinite(ranked.pp), ranked.pp, 0.0)
    before = np.zeros_like(pp)  # Σ f of the nodes ahead of each node (an exclusive sum: cumsum − pp can round
    np.cumsum(pp[:, :-1], axis=1, out=before[:, 1:])  # below a target the prefix meets exactly)
    valid = np.arange(pp.shape[1]) < ranked.size[:, None]
    # Eq. (5): node j is added while the running sum is still below the target
    need = ((before < target[:, None]) & valid).sum(axis=1)
    need = np.minimum(need, n_max)
    cum = np.cumsum(need[visit])
    taken = np.zeros(n, dtype=np.int64)
    taken[visit] = np.clip(budget - (cum - need[visit]), 0, need[visit])
    return taken


def select_global(ranked: Ranked, counts: np.ndarray, budget: int) -> np.ndarray:
    """Algorithm 2 lines 18–23 (throughput-optimized selection): add the ``budget`` globally most probable nodes
    not selected yet (ties toward shallower nodes); returns the new prefix lengths."""
    out = np.asarray(counts, dtype=np.int64).copy()
    if budget <= 0 or ranked.n == 0:
        return out
    if jit.step_kernels():  # the same picks, compiled (systems.kernels.global_select)
        jit.kernel("systems.kernels", "global_select")(ranked.pp, ranked.depth, ranked.size, out.copy(), int(budget),
                                                       out)
        return out
    cols = np.arange(ranked.pp.shape[1])
    rest = (cols >= out[:, None]) & (cols < ranked.size[:, None])
    flat = np.flatnonzero(rest)
    if flat.size > budget:
        # Eq. (6): maximise Σ f(v); keep the top `budget` by (−f, depth, request, rank): those above the
        # budget-th largest f, t, and the first of those at t by (depth, request, rank)
        pp = ranked.pp.ravel()[flat]
        t = np.partition(pp, flat.size - budget)[flat.size - budget]
        tied = flat[pp == t]
        flat = flat[pp > t]
        if tied.size > budget - flat.size:
            tied = tied[np.lexsort((tied, ranked.depth.ravel()[tied]))]
        flat = np.concatenate([flat, tied[:budget - flat.size]])
    out += np.bincount(flat // ranked.pp.shape[1], minlength=ranked.n)
    return out


def select_equal(ranked: Ranked, budget: int) -> np.ndarray:
    """EqualGreedy (§6.3): every request gets ⌊B/n⌋ tokens (its root included) and fills them greedily by f(v)."""
    n = ranked.n
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    return np.minimum(max(budget // n - 1, 0), ranked.size)


def tree_specs(ranked: Ranked, counts: np.ndarray) -> dict[int, TreeSpec]:
    """The selected prefixes as TreeSpecs, one per drafted request (an empty tree still pays its beam search)."""
    out: dict[int, TreeSpec] = {}
    for i in range(ranked.n):
        cand = ranked.cands[i]
        out[cand.rid] = TreeSpec(cand, np.sort(ranked.node[i, : int(counts[i])]))
    return out


# --- batch scheduling and cost estimates ------------------------------------------------------------------------

def admit_or_decode(view: View, *, max_num_seqs: int, max_num_batched_tokens: int,
                    watermark: float) -> tuple[StepPlan | None, np.ndarray]:
    """vLLM-style prefill-prioritized batching: :func:`systems.lib.prefill_prioritized` without its KV check.

    A prefill-only step if waiting requests fit whole (the draft prefills too, draft_sync), else the decode-ready
    running requests; :func:`tree_plan` checks KV later, against the selected trees.
    """
    adm = fcfs_admit(view, token_budget=max_num_batched_tokens, max_new_seqs=max_num_seqs - view.running.size,
                     free_blocks=view.free_blocks, watermark_blocks=int(watermark * view.total_blocks))
    if adm.rids.size:
        return StepPlan(prefill_ids=adm.rids, prefill_tokens=adm.tokens, draft_sync=True), ids()
    decode, _ = split_running(view)
    return None, decode


@dataclass(frozen=True, slots=True)
class TreeBatching:
    """Batching and speculation knobs shared by AdaServe and its ablations.

    The beam limits D_max and W_max, the budget B (None: Table 1's for the hardware) and vLLM-style admission limits.
    """

    d_max: int = 8
    w_max: int = 16
    budget: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    watermark: float = 0.01

    def __post_init__(self) -> None:
        if self.d_max < 1 or self.w_max < 1:
            raise ValueError("d_max and w_max must be >= 1")
        if self.budget is not None and self.budget < 1:
            raise ValueError("budget must be >= 1 (or null for the hardware's)")

    def batch(self, view: View) -> tuple[StepPlan | None, np.ndarray, int]:
        """Schedule the batch: ``(plan, decode, B)``.

        ``plan`` is the step to run when there is nothing to speculate with (a prefill step, no decoding request, or
        n ≥ B); otherwise it is ``None``, ``decode`` holds the decoding requests and ``B`` is the budget.
        """
        prefill, decode = admit_or_decode(view, max_num_seqs=self.max_num_seqs,
                                          max_num_batched_tokens=self.max_num_batched_tokens,
                                          watermark=self.watermark)
        if prefill is not None:
            return prefill, decode, 0
        b = self.budget if self.budget is not None else view.cost.budget_tokens  # Table 1
        if decode.size == 0:
            return IDLE, decode, b
        if b <= decode.size:  # Algorithm 2 line 7: every root takes one token of B; nothing is left to speculate
            return tree_plan(view, decode, {}), decode, b
        return None, decode, b

    def speculate(self, view: View, decode: np.ndarray, budget: int) -> tuple[Ranked, int, int]:
        """Step 1: beam-search candidate trees with d and w from Eq. (8)–(9), ranked for selection."""
        return speculate(view, decode, d_max=self.d_max, w_max=self.w_max, budget=budget)


def tree_plan(view: View, decode: np.ndarray, trees: dict[int, TreeSpec]) -> StepPlan:
    """A decode step verifying ``trees``, preempting the most recently admitted requests (recompute) while the KV
    for 1 + tree nodes per request does not fit."""
    if decode.size == 0:
        return IDLE
    q = np.ones(decode.size, dtype=np.int64)
    for i, rid in enumerate(decode.tolist()):
        t = trees.get(rid)
        if t is not None:
            q[i] += t.num_nodes
    kept, preempted, _ = make_room(view, decode, q, view.free_blocks)
    if preempted.size:
        trees = {rid: trees[rid] for rid in kept.tolist() if rid in trees}
    if kept.size == 0 and preempted.size == 0:
        return IDLE
    return StepPlan(decode_ids=kept, trees=trees, proposer="draft", draft_sync=True, preempt_ids=preempted)


def estimate_step_s(cost: CostModel, num_seqs: int, context_tokens: float, depth: int, width: int,
                    verify_tokens: int) -> float:
    """The cost model's latency of a tree decode step, as the engine charges it (AdaServe's offline profile).

    Host overhead of the speculation round, d beam-search draft passes (the roots, then n·w tokens each) and one target
    pass over ``verify_tokens`` tree tokens. ``context_tokens`` is the total over ``num_seqs`` requests, each one's
    last token still to compute.
    """
    n = num_seqs
    if n == 0:
        return 0.0
    t = cost.spec_round_s()
    t += cost.forward_s(n, n, kv_read_tokens=context_tokens + n, decode_only=True, which="draft")
    t = cost.draft_steps_s(t, n * width, n, context_tokens, depth, "draft")  # passes 2..d, n·w tokens each
    return t + decode_pass_s(cost, n, context_tokens / n - 1.0, (verify_tokens - n) / n, tree=True)


def speculate(view: View, decode: np.ndarray, *, d_max: int, w_max: int, budget: int) -> tuple[Ranked, int, int]:
    """AdaServe §4.3 Step 1 with §5.2's schedule: every decoding request's candidate tree, ranked; ``(ranked, d, w)``.

    Depth d and beam width w follow Eq. 8–9 from the number of active requests.
    """
    drafter = view.drafter
    if drafter is None:
        raise ValueError("tree speculation needs a drafter (configure a draft model)")
    if w_max > drafter.max_width:
        raise ValueError(f"w_max={w_max} exceeds the drafter's widest beam ({drafter.max_width}; raise oracle.width)")
    d, w = depth_width(int(decode.size), d_max, w_max, budget)
    cands = drafter.candidates_batch(decode, view.num_generated[decode], d, w)
    return rank_nodes(cands), d, w
