"""Fixed-S: GoodSpeed's first baseline (§IV-B2): every draft server drafts the same S_i = C / N tokens each round.

Tran et al., GoodSpeed (goodspeed.txt) §IV-B2: "each draft server consistently generates a fixed number of tokens
per iteration, with S_i = C/N". The round protocol and the estimators are GoodSpeed's (:class:`systems.edge.
EdgeRounds`; the estimators only feed the step trace's ``goodput_est``).

Deviations:
- C / N rounded down (C = 20, N = 8: 2 tokens each, 16 of the 20 used; the paper's C values divide N = 4 evenly).
- N counts every client, whether or not it decodes this round (a client computing a prompt leaves its share unused).
"""

from __future__ import annotations

import numpy as np

from repro.plan import StepPlan, StepResult
from repro.policy import Policy, PolicyContext
from repro.state import View
from systems.edge import EdgeRounds
from systems.lib import check_positive_int


class FixedS(Policy):
    observes_accept_prob = True  # Eq. 3 reads the verifier's min(1, p/q) of every drafted token
    needs_draft_servers = True  # one remote draft server per client (systems/edge.py)

    def __init__(self, capacity: int = 20) -> None:
        self.capacity = self.round_budget = check_positive_int("capacity", capacity)

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        self.rounds = EdgeRounds.bound(ctx)

    def schedule(self, view: View) -> StepPlan:
        rid, decoding = self.rounds.current(view)
        n = self.rounds.num_clients
        return self.rounds.plan(view, rid, decoding, np.full(n, self.capacity // n, dtype=np.int64))

    def observe(self, result: StepResult) -> None:
        self.rounds.observe(result)
