"""AdaServe: SLO-customized LLM serving with fine-grained speculative decoding.

Li et al., "AdaServe: SLO-Customized LLM Serving with Fine-Grained Speculative Decoding", arXiv:2501.12162;
§4.3 Algorithm 2 (speculation, SLO-customized selection, throughput-optimized selection, verification) with
§5.2's dynamic depth and width (Eq. 8–9) and Table 1's budget B.

Each iteration:
  batch scheduling: prefill the waiting requests that fit (FCFS), else decode every running request;
  Step 1  speculation: beam search of depth d, width w over every decoding request's context (Eq. 8–9);
  Step 2  SLO-customized selection: by A(r) (Eq. 2), add each request's most probable nodes until
          Σ f(v) ≥ A_cap(r) (Eq. 5), at most n_max per request;
  Step 3  throughput-optimized selection: spend the rest of B on the globally most probable nodes (Eq. 6);
  Step 4  verification of every request's tree in one target pass (the engine).

Deviations:
- Prefill: the paper (§5) does not say how prefills are batched; we use vLLM's prefill-prioritized FCFS
  admission (a prefill-only step when waiting prompts fit, as the paper's IncrDec/vLLM baselines do), the draft
  prefilling alongside the target, and recompute preemption (most recently admitted first) when the KV for
  1 + tree nodes per request does not fit.
- t_spec (Eq. 2) is the cost model's latency of the planned step (the speculation round's host overhead, d draft
  passes over n then n·w tokens, and a target pass over min(B, n + candidates) tokens: what the engine charges),
  i.e. an offline profile, not an online measurement.
- A(r) uses l = now − first-token time and o = tokens generated − 1 (the TPOT the metrics judge:
  (finish − first token)/(output − 1)). Selection compares Σ f(v) over the speculated nodes with A_cap(r) − 1,
  the root's token counting 1.0 (Algorithm 2 line 6); Figure 2's A_cap values read as that speculative part.
- D_max, W_max and n_max are not given in the paper. Defaults are the authors' (FlexFlow Serve): W_max = 16
  (``max_tree_width``), n_max = ⌊B/n⌋ per step (``max_token_toward_slo = B / n``; the root's token is part of
  it, so a request gets at most ⌊B/n⌋ − 1 speculated nodes in the SLO step), D_max = 8 (SpecInfer's depth).
- ``pace`` (config): ``paper`` (default) targets Eq. (2)'s A(r), catching up on the delay a request has built
  up; ``authors`` targets the authors' per-iteration pace, 1.05 · t_spec / TPOT tokens, with no catch-up term
  (conf/system/adaserve_pace.yaml).
- ``recoverable_first`` (config, default off): visit requests that cannot get back on pace in this step
  (A(r) > d + 1: more tokens than the deepest tree can accept) after the others, in the same order; our reading
  of the authors' optional early termination of SLO-violated requests (conf/system/adaserve_recoverable_first.yaml).
- ``order`` (config): the paper visits requests by A(r) descending (furthest behind first), as the authors' code
  does by sorting spare latency (TPOT · decoded − elapsed) ascending. ``ascending`` visits the least-behind first
  (an experiment, neither the paper's nor the authors'). Requests with equal keys keep their admission order.
- With the default n_max the visiting order cannot change a selection: n requests capped at ⌊B/n⌋ − 1 nodes each
  never exhaust the B − n nodes the roots leave, so every request reaches its target or its cap whatever the order.
  ``order`` and ``recoverable_first`` matter only with a fixed ``n_max`` (or a budget override) under which the
  SLO step can run out (Figs. 4 and 8: adaserve_recoverable_first equals adaserve at every point).
- Algorithm 2's ``B ≥ 0`` loop guards are read as a strict budget: roots + nodes ≤ B. When the decoding batch
  alone reaches B (n ≥ B) the step verifies no speculation.
- Every decoding request pays its beam search (the engine charges d draft passes from the candidate tree), also
  one whose tree ends up with no speculated node.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from repro.sim.plan import StepPlan
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.trees import (
    Order,
    TreeBatching,
    estimate_step_s,
    select_global,
    select_slo_customized,
    slo_targets,
    tree_plan,
    tree_specs,
)

Pace = Literal["paper", "authors"]
#: The authors' per-iteration pace: a request should gain 1.05 · t_iter / TPOT tokens per iteration.
AUTHORS_PACE = 1.05
_LAST = 1e9  # key offset that moves a request to the end of the visiting order


class AdaServe(Policy):
    uses_draft_model = True

    def __init__(self, d_max: int = 8, w_max: int = 16, n_max: int | None = None, pace: Pace = "paper",
                 recoverable_first: bool = False, order: Order = "descending", budget: int | None = None,
                 max_num_seqs: int = 256, max_num_batched_tokens: int = 4096, watermark: float = 0.01) -> None:
        self.batching = TreeBatching(d_max, w_max, budget, max_num_seqs, max_num_batched_tokens, watermark)
        self.branching_trees = w_max > 1  # (beams of width 1 are chains)
        if n_max is not None and n_max < 0:
            raise ValueError("n_max must be >= 0 (or null for the authors' B // n)")
        if order not in ("descending", "ascending"):
            raise ValueError(f"order must be 'descending' or 'ascending', not {order!r}")
        if pace not in ("paper", "authors"):
            raise ValueError(f"pace must be 'paper' or 'authors', not {pace!r}")
        self.n_max, self.order, self.pace, self.recoverable_first = n_max, order, pace, recoverable_first

    def slo_step(self, a: np.ndarray, target: np.ndarray, tpot_s: np.ndarray, t_spec: float, d: int,
                 budget: int) -> tuple[np.ndarray, np.ndarray, int]:
        """The SLO step's inputs for n = len(a) requests: each request's target (speculated tokens to aim for),
        the visiting key (with ``order``) and the per-request node cap."""
        if self.pace == "authors":  # the authors' pace: 1.05 · t_iter / TPOT tokens this iteration, no catch-up
            target = np.minimum(AUTHORS_PACE * t_spec / tpot_s, d + 1.0) - 1.0
        key = a
        if self.recoverable_first:  # requests that cannot get back on pace this step go last
            behind = a > d + 1.0
            key = np.where(behind, a - _LAST, a) if self.order == "descending" else np.where(behind, a + _LAST, a)
        # the authors' max_token_toward_slo = B / n, the root's token included
        n_max = self.n_max if self.n_max is not None else max(budget // max(len(a), 1) - 1, 0)
        return target, key, n_max

    def schedule(self, view: View) -> StepPlan:
        # batch scheduling; B from Table 1 (plain decoding when the roots alone fill it)
        plan, decode, budget = self.batching.batch(view)
        if plan is not None:
            return plan
        n = int(decode.size)
        spare = budget - n  # Algorithm 2 line 7: every root takes one token of B
        # Step 1: speculation, d and w by Eq. (8)–(9)
        ranked, d, w = self.batching.speculate(view, decode, budget)
        t_spec = estimate_step_s(view.cost, n, float(view.num_tokens(decode).sum()), d, w,
                                 min(budget, n + int(ranked.size.sum())))
        # Eq. (2): A(r) = (l + t_spec)/t_TPOT − o;  A_cap(r) = min(A(r), d + 1)
        a, target = slo_targets(view, decode, t_spec, d)
        target, key, n_max = self.slo_step(a, target, view.tpot_slo_s[decode], t_spec, d, budget)
        # Step 2: SLO-customized selection (Eq. 5), visiting by `key`, ≤ n_max nodes each
        counts = select_slo_customized(ranked, target, key, order=self.order, n_max=n_max, budget=spare)
        # Step 3: throughput-optimized selection (Eq. 6) with what is left of B
        counts = select_global(ranked, counts, spare - int(counts.sum()))
        # Step 4: verification (the engine)
        return tree_plan(view, decode, tree_specs(ranked, counts))
