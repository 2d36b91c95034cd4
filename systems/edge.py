"""Edge speculation (GoodSpeed's setting): the round protocol and estimators shared by GoodSpeed and its baselines.

One verification server and N remote draft servers, each serving its own client's prompts one at a time. GoodSpeed,
Fixed-S and Random-S differ only in how they split the verification budget C into draft lengths S_i.

A round is one engine step:
- Client i (a request's ``client``: ``workload.clients``) holds at most one request on the verifier, its earliest.
- A request that still needs its prompt prefills on the verifier this round; its draft server prefills its own copy
  when it first drafts (the remote proposer's catch-up).
- A decoding request drafts S_i tokens on its server (``StepPlan.draft_server = i``); S_i = 0: the verifier decodes
  one token for it alone.
- The engine charges the slowest server's drafting and uplink, one verification pass over the batch, then the
  downlink (:meth:`repro.sim.proposers.RemoteDraftServer.uplink_s` / ``downlink_s``).

Estimators (GoodSpeed Algorithm 1, line 14), updated after every round for every client:
    α̂_i ← (1 − η) α̂_i + η · a_i(t)       (Eq. 3; only in rounds where client i drafted)
    X_i ← (1 − β) X_i + β · x_i(t)        (Eq. 4)
- x_i(t): tokens client i received this round (accepted + 1 for a decoding request, 1 for a completed prompt, else 0).
- a_i(t) = (1/S_i) Σ_j min(1, p_j(s_j)/q_j(s_j)) over the server's drafted tokens, computed by the verifier over every
  drafted position (``StepResult.accept_prob``; the policies set ``observes_accept_prob``).

Plan telemetry per round: ``round`` (t, from 0); ``goodput_est`` = Σ_i x̂_i(S_i) at the current α̂ (expected tokens);
``utility`` = U(x̄(t)) = Σ_i log x̄_i over earlier rounds, x̄_i = client i's mean tokens per round; ``S_<i>`` per
client. The allocation math (x̂, Eq. 5's exact solver, U) is :mod:`repro.metrics.fairness`, shared with the optimum
x* that runs are compared with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from repro.metrics.fairness import allocate as gradient_allocation
from repro.metrics.fairness import expected_tokens, utility
from repro.sim.plan import IDLE, StepPlan, StepResult, ids
from repro.sim.policy import PolicyContext
from repro.sim.state import Status, View
from systems.lib import pending_tokens

__all__ = ["EdgeRounds", "expected_tokens", "gradient_allocation", "utility"]


@dataclass
class EdgeRounds:
    """The round protocol and the per-client estimators (module docstring)."""

    num_clients: int
    eta: float = 0.2
    beta: float = 0.5
    init_acceptance: float = 0.5
    init_goodput: float = 1.0
    alpha: np.ndarray = field(init=False)  # α̂_i
    goodput: np.ndarray = field(init=False)  # X_i (Eq. 4)
    received: np.ndarray = field(init=False)  # Σ_t x_i(t)
    rounds: int = 0
    _client: np.ndarray | None = None
    _s: np.ndarray | None = None  # the allocation played this round, by client

    @classmethod
    def bound(cls, ctx: PolicyContext, eta: float = 0.2, beta: float = 0.5, init_acceptance: float = 0.5,
              init_goodput: float = 1.0) -> EdgeRounds:
        """The protocol for a policy bound to ``ctx``: one client per remote draft server of its deployment."""
        servers = len(ctx.proposers.remote) if ctx.proposers is not None else 0
        return cls(servers, eta, beta, init_acceptance, init_goodput)

    def __post_init__(self) -> None:
        if self.num_clients < 1:
            raise ValueError("the deployment has no remote draft servers (engine.draft_servers): GoodSpeed needs "
                             "one per client")
        if not (0.0 < self.eta < 1.0 and 0.0 < self.beta < 1.0 and 0.0 < self.init_acceptance < 1.0):
            raise ValueError("eta, beta and init_acceptance must lie in (0, 1)")
        self.alpha = np.full(self.num_clients, self.init_acceptance)
        self.goodput = np.full(self.num_clients, float(self.init_goodput))
        self.received = np.zeros(self.num_clients)

    def current(self, view: View) -> tuple[np.ndarray, np.ndarray]:
        """Each client's request on the verifier this round, and whether it decodes.

        The request is the client's running one, else its earliest waiting one (-1: none left); not decoding means
        its prompt is computed this round.
        """
        client = view.client
        if self._client is None:
            self._client = np.asarray(client)
            if (self._client >= self.num_clients).any() or (self._client < 0).any():
                raise ValueError(f"requests of clients outside 0..{self.num_clients - 1}: the workload needs one "
                                 "client per draft server (workload.clients and engine.draft_servers)")
        rid = np.full(self.num_clients, -1, dtype=np.int64)
        for r in view.running.tolist():
            rid[client[r]] = r
        for r in view.waiting.tolist():
            c = client[r]
            if rid[c] < 0:
                rid[c] = r
        decoding = np.zeros(self.num_clients, dtype=bool)
        has = rid >= 0
        if has.any():
            st = view.status(rid[has])
            decoding[has] = (st == Status.RUNNING) & (pending_tokens(view, rid[has]) == 1)
        return rid, decoding

    def plan(self, view: View, rid: np.ndarray, decoding: np.ndarray, s: np.ndarray) -> StepPlan:
        """The round's plan: prompts of the clients that start a request, and every decoding client's S_i drafts
        on its own server."""
        self._s = np.where(decoding, s, 0).astype(np.int64)
        pre = rid[(rid >= 0) & ~decoding]
        dec_clients = np.flatnonzero(decoding)
        if pre.size == 0 and dec_clients.size == 0:
            return IDLE
        tel: dict[str, float] = {"round": float(self.rounds),
                                 "goodput_est": float(expected_tokens(self.alpha[decoding], self._s[decoding]).sum()),
                                 "utility": self.mean_utility()}
        tel.update({f"S_{i}": float(v) for i, v in enumerate(self._s)})
        return StepPlan(prefill_ids=pre, prefill_tokens=pending_tokens(view, pre) if pre.size else ids(),
                        decode_ids=rid[dec_clients], k=self._s[dec_clients], draft_server=dec_clients,
                        telemetry=tel)

    def mean_utility(self) -> float:
        """U(x̄) over the rounds played so far (NaN before the first)."""
        return utility(self.received / self.rounds) if self.rounds else math.nan

    def observe(self, result: StepResult) -> None:
        """Line 14: x_i(t), then Eq. 3 for the clients that drafted and Eq. 4 for every client."""
        if self._client is None or self._s is None:
            return
        x = np.zeros(self.num_clients)
        dec = result.decode_ids
        if dec.size:
            c = self._client[dec]
            np.add.at(x, c, result.num_emitted)
            drafted = result.num_proposed > 0
            if drafted.any() and result.accept_prob is not None:
                rate = result.accept_prob[drafted] / result.num_proposed[drafted]  # Eq. 3: mean min(1, p/q)
                ci = c[drafted]
                self.alpha[ci] = (1.0 - self.eta) * self.alpha[ci] + self.eta * rate
        if result.prefill_ids.size:  # a whole prompt computed: it samples its first token this round
            np.add.at(x, self._client[result.prefill_ids], 1.0)
        self.goodput = (1.0 - self.beta) * self.goodput + self.beta * x
        self.received += x
        self.rounds += 1
