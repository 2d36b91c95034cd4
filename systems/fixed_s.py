"""Fixed-S: GoodSpeed's first baseline (§IV-B2): every draft server drafts the same S_i = C / N tokens each round.

Tran et al., GoodSpeed (goodspeed.txt) §IV-B2: "each draft server consistently generates a fixed number of tokens
per iteration, with S_i = C/N". The round protocol and the estimators are GoodSpeed's (:class:`systems.edge.
EdgeRounds`; the estimators only feed the step trace's ``goodput_est``).

Deviations:
- Where N does not divide C (C = 20, N = 8), each server drafts ⌊C/N⌋ and the C mod N tokens left go one each to
  servers in turn, round-robin (``remainder: rotate``, the default): every round spends the whole budget C, as
  GoodSpeed does, so the comparison is of allocations, not of budgets. ``remainder: drop`` (``fixed_s_floor``)
  rounds down and leaves them unused (16 of 20 at C = 20, N = 8): a 20-token round then costs 1.34-1.36× the wall
  time of a 16-token one, which is most of GoodSpeed's Fig. 3 gap to it. The paper's C values for N = 4 divide evenly.
- N counts every client, whether or not it decodes this round (a client computing a prompt leaves its share unused).
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import StepPlan, StepResult
from repro.sim.policy import Policy, PolicyContext
from repro.sim.state import View
from systems.edge import EdgeRounds
from systems.lib import check_positive_int


def allocation(capacity: int, n: int, round_index: int | None) -> np.ndarray:
    """The even split: S_i = ⌊C/N⌋ for each of ``n`` servers, plus one each for C mod N of them in turn.

    The extra tokens go to servers from ``round_index · (C mod N)`` on (None: the remainder is unused).
    """
    s = np.full(n, capacity // n, dtype=np.int64)
    extra = capacity % n
    if extra and round_index is not None:
        s[(round_index * extra + np.arange(extra)) % n] += 1
    return s


class FixedS(Policy):
    observes_accept_prob = True  # Eq. 3 reads the verifier's min(1, p/q) of every drafted token
    needs_draft_servers = True  # one remote draft server per client (systems/edge.py)

    def __init__(self, capacity: int = 20, remainder: str = "rotate") -> None:
        self.capacity = self.round_budget = check_positive_int("capacity", capacity)
        if remainder not in ("rotate", "drop"):
            raise ValueError(f"remainder must be 'rotate' or 'drop', not {remainder!r}")
        self.remainder = remainder

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        self.rounds = EdgeRounds.bound(ctx)
        self._round = 0

    def schedule(self, view: View) -> StepPlan:
        rid, decoding = self.rounds.current(view)
        n = self.rounds.num_clients
        s = allocation(self.capacity, n, self._round if self.remainder == "rotate" else None)
        self._round += 1
        return self.rounds.plan(view, rid, decoding, s)

    def observe(self, result: StepResult) -> None:
        self.rounds.observe(result)
