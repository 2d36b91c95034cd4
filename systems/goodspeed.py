"""GoodSpeed: gradient scheduling of draft lengths across distributed draft servers, for proportional fairness.

Tran et al., "GoodSpeed: Optimizing Fair Goodput with Adaptive Speculative Decoding in Distributed Edge Inference"
(goodspeed.txt). Implemented: §III-C Algorithm 1 — smoothed acceptance per draft server (Eq. 3, η), smoothed goodput
(Eq. 4, β) with x_i(t) = accepted + 1, and each round GoodSpeed-sched (Eq. 5): maximize Σ_i ∇U_i(X_i) · x̂_i(S_i)
subject to Σ_i S_i ≤ C with x̂_i(S) = (1 − α̂_i^(S+1)) / (1 − α̂_i) and U = Σ log (∇U_i = 1 / X_i), solved exactly by
greedy marginal gains (:func:`systems.edge.gradient_allocation`).

Each round (Algorithm 1 lines 2-16, one engine step; the protocol is :class:`systems.edge.EdgeRounds`):
  1. every client with a decoding request drafts S_i(t) tokens on its own server, in parallel (steps 1-2: the
     server's GPU and model, then the uplink of the tokens and their vocabulary-sized distributions);
  2. the verifier waits for the slowest, verifies the batch in one pass (steps 3-4) and updates α̂ and X (line 14);
  3. it solves GoodSpeed-sched for S(t + 1) (line 15) and sends the accepted tokens and the allocation back (step 6).

Deviations:
- Eq. 3's min(1, p/q) of a drafted token is, in the simulator, the probability that the target keeps it (the
  oracle's per-position acceptance probability), which the engine reports as the verifier would compute it
  (``StepResult.accept_prob``); the chain's accepted / tested tokens would be biased low for short chains (an
  average of ratios: about 0.40 for α = 0.6 at S = 6).
- Initial values (Algorithm 1 line 1 leaves them open): α̂_i(0) = 0.5, X_i(0) = 1 token per round, S_i(0) from
  Eq. 5 at those values (the uniform split). η = 0.2 (not stated; Assumption 3 asks η ≪ β) and β = 0.5 (§IV-B3:
  "with β = 0.5").
- A client that starts a new request computes its prompt on the verifier that round and drafts from the next; its
  server prefills its own copy of the prompt when it first drafts (the remote proposer's catch-up).
- Engine: GoodSpeed's verifier is its own code; its pass is costed as a multi-query engine (``pytorch_mq``: one pass of
  1 + S_i tokens per request, prompts and drafts in one step).
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import StepPlan, StepResult
from repro.sim.policy import Policy, PolicyContext
from repro.sim.state import View
from systems.edge import EdgeRounds, gradient_allocation
from systems.lib import check_positive_int


class GoodSpeed(Policy):
    observes_accept_prob = True  # Eq. 3 reads the verifier's min(1, p/q) of every drafted token
    needs_draft_servers = True  # one remote draft server per client (systems/edge.py)

    def __init__(self, capacity: int = 20, eta: float = 0.2, beta: float = 0.5, init_acceptance: float = 0.5,
                 init_goodput: float = 1.0) -> None:
        self.capacity = self.round_budget = check_positive_int("capacity", capacity)
        self.eta, self.beta = eta, beta
        self.init_acceptance, self.init_goodput = init_acceptance, init_goodput

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        self.rounds = EdgeRounds.bound(ctx, eta=self.eta, beta=self.beta, init_acceptance=self.init_acceptance,
                                       init_goodput=self.init_goodput)

    def allocation(self, decoding: np.ndarray) -> np.ndarray:
        """Eq. 5 over the clients that decode this round, weights ∇U_i(X_i) = 1 / X_i."""
        r = self.rounds
        s = np.zeros(r.num_clients, dtype=np.int64)
        if decoding.any():
            w = 1.0 / np.maximum(r.goodput[decoding], 1e-9)
            s[decoding] = gradient_allocation(w, r.alpha[decoding], self.capacity)
        return s

    def schedule(self, view: View) -> StepPlan:
        rid, decoding = self.rounds.current(view)
        return self.rounds.plan(view, rid, decoding, self.allocation(decoding))

    def observe(self, result: StepResult) -> None:
        self.rounds.observe(result)
