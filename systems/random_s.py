"""Random-S: GoodSpeed's second baseline (§IV-B2): each round every draft server drafts a random S_i, with
Σ_i S_i ≤ C.

Tran et al., GoodSpeed (goodspeed.txt) §IV-B2: "each draft server randomly samples S_i per iteration, constrained
such that the total across clients does not exceed C". The round protocol and the estimators are GoodSpeed's
(:class:`systems.edge.EdgeRounds`).

Deviations:
- The distribution is not stated. Ours: the total T is uniform on 0..C and split over the decoding clients by a
  uniformly random composition (every way of writing T as N ordered non-negative parts equally likely: stars and
  bars), drawn from the policy's own seeded generator (the run's seed gives the same draws). A round then drafts
  C / 2 tokens on average, half the budget GoodSpeed and Fixed-S spend: most of its utility gap comes from that.
  ``total: whole`` (``random_s_whole``) keeps T = C and randomizes only the split, the reading in which Random-S
  differs from the others in its allocation alone.
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import StepPlan, StepResult
from repro.sim.policy import Policy, PolicyContext
from repro.sim.state import View
from systems.edge import EdgeRounds
from systems.lib import check_positive_int


def random_composition(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random way of writing ``total`` as ``parts`` ordered non-negative integers (stars and bars)."""
    if parts <= 0:
        return np.zeros(0, dtype=np.int64)
    bars = np.sort(rng.choice(total + parts - 1, size=parts - 1, replace=False))
    edges = np.concatenate([[-1], bars, [total + parts - 1]])
    return (np.diff(edges) - 1).astype(np.int64)


class RandomS(Policy):
    observes_accept_prob = True  # Eq. 3 reads the verifier's min(1, p/q) of every drafted token
    needs_draft_servers = True  # one remote draft server per client (systems/edge.py)

    def __init__(self, capacity: int = 20, total: str = "uniform") -> None:
        self.capacity = self.round_budget = check_positive_int("capacity", capacity)
        if total not in ("uniform", "whole"):
            raise ValueError(f"total must be 'uniform' or 'whole', not {total!r}")
        self.total = total

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        self.rng = np.random.default_rng(ctx.rng.integers(2**63))  # the policy's own stream, from the run's seed
        self.rounds = EdgeRounds.bound(ctx)

    def schedule(self, view: View) -> StepPlan:
        rid, decoding = self.rounds.current(view)
        s = np.zeros(self.rounds.num_clients, dtype=np.int64)
        if decoding.any():
            total = int(self.rng.integers(self.capacity + 1)) if self.total == "uniform" else self.capacity
            s[decoding] = random_composition(total, int(decoding.sum()), self.rng)
        return self.rounds.plan(view, rid, decoding, s)

    def observe(self, result: StepResult) -> None:
        self.rounds.observe(result)
