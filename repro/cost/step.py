"""Step costing: a planned step's shape in seconds, under one replica's cost model and deployment (DESIGN.md,
"Cost model" and "Engine").

The engine checks a plan and turns it into the batches below (:class:`PrefillBatch`, :class:`DecodeBatch`); this
module charges them: :func:`verify_shape` is the target's one forward pass over every prefill chunk and every decoding
request's 1 + speculated tokens, and :meth:`StepCoster.draft_s` the drafting before it (prompt lookup on the host;
a draft model's or EAGLE head's passes, which first catch up on the tokens the draft's cache misses; remote draft
servers with their round trip). The engine only sequences events and applies outcomes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from repro.cost.model import CostModel, Which
from repro.plan import PlanError, StepPlan, TreeSpec
from repro.state import RequestState


@dataclass(frozen=True, slots=True)
class DraftServer:
    """A remote draft server (GoodSpeed): the draft model on its own GPU, reached over a network."""

    cost: CostModel  # cost model whose ``draft`` runs on the server's hardware
    rtt_s: float


@dataclass(frozen=True, slots=True)
class PrefillBatch:
    """The prefill chunks of a step: ids, tokens, causal attention pairs, which chunks complete their request."""

    ids: np.ndarray
    tokens: np.ndarray
    pairs: float
    completes: np.ndarray


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """The decoding requests of a step: ids, tokens generated and context before the step, speculated tokens
    (chain k or tree nodes), which requests the proposer drafts for, and their trees."""

    ids: np.ndarray
    gen: np.ndarray
    ctx: np.ndarray
    k: np.ndarray
    drafted: np.ndarray
    trees: Mapping[int, TreeSpec]
    pld: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # prompt lookup's (proposed, accepted, matched), known
    # before verification


def verify_shape(pre: PrefillBatch, dec: DecodeBatch) -> tuple[int, int, float, float, int, bool]:
    """The target forward of a step (ForwardShape's fields): every prefill chunk and 1 + speculation per decode;
    decode/verify reads each request's KV, prefill pays causal attention, the LM head scores verified tokens and
    the last token of completed prefills."""
    dec_tokens = int(dec.k.sum()) + int(dec.ids.size)
    n_tokens = int(pre.tokens.sum()) + dec_tokens if pre.ids.size else dec_tokens
    return (n_tokens, int(pre.ids.size + dec.ids.size), float(dec.ctx.sum()) + dec_tokens, pre.pairs,
            dec_tokens + int(pre.completes.sum()), pre.ids.size == 0)


class StepCoster:
    """Drafting time of a replica's steps: its request state (what each draft cache holds), its cost model and its
    remote draft servers."""

    def __init__(self, state: RequestState, cost: CostModel, draft_servers: tuple[DraftServer, ...] = ()) -> None:
        self.s = state
        self.cost = cost
        self.draft_servers = draft_servers

    def draft_s(self, plan: StepPlan, dids: np.ndarray, dc: np.ndarray, k: np.ndarray, spec: np.ndarray,
                trees: Any, pids: np.ndarray, ptok: np.ndarray, *, draft_resident: bool) -> float:
        """Seconds of drafting before the target's pass: prompt lookup on the host, or the draft model's (or EAGLE
        head's) passes for the requests in ``spec``, locally or on remote draft servers (the slowest server and
        its round trip), plus the round's host-side overhead."""
        if plan.proposer == "pld":
            return self.cost.pld_s(int(spec.sum()))  # the lookup runs for every request asked, matched or not
        which: Which = "eagle" if plan.proposer == "eagle" else "draft"
        if which == "draft" and not draft_resident and plan.draft_server is None:
            raise PlanError("speculating with a draft model that is not resident")
        servers = plan.draft_server
        rounds = self.cost.spec_round_s() if spec.any() else 0.0  # proposer bookkeeping, once per step
        if servers is None or not self.draft_servers:
            return rounds + self._draft_pass(self.cost, which, plan, dids, dc, k, spec, trees, pids, ptok)
        servers = np.asarray(servers, dtype=np.int64)
        t = 0.0
        for srv in np.unique(servers[spec]).tolist():
            mask = spec & (servers == srv)
            if srv < 0:
                t = max(t, self._draft_pass(self.cost, which, plan, dids, dc, k, mask, trees, pids[:0], ptok[:0]))
            else:
                ds = self.draft_servers[srv]
                t = max(t, ds.rtt_s + self._draft_pass(ds.cost, which, plan, dids, dc, k, mask, trees, pids[:0],
                                                      ptok[:0]))
        return rounds + t

    def _draft_pass(self, cost: CostModel, which: Which, plan: StepPlan, dids: np.ndarray, dc: np.ndarray,
                    k: np.ndarray, spec: np.ndarray, trees: Any, pids: np.ndarray, ptok: np.ndarray) -> float:
        """Draft steps for the speculating requests: step 1 processes each request's catch-up tokens (its last token,
        plus whatever the draft's KV misses), steps 2..D one token per chain or ``w`` per beam."""
        s = self.s
        n = int(np.count_nonzero(spec))
        if n == dids.size:
            sid, c, depth = dids, dc, k
        else:
            sid, c, depth = dids[spec], dc[spec], k[spec]
        csum = float(c.sum())
        width: np.ndarray | None = None
        if trees:
            depth = depth.copy()
            width = np.ones_like(depth)
            for i, rid in enumerate(sid.tolist()):
                t = trees.get(rid)
                if t is not None:
                    depth[i] = t.cand.draft_depth
                    width[i] = t.cand.draft_width
        tok1, pairs = n, 0.0
        if which == "draft" and n:
            have = s.num_draft_computed[sid]
            lag = c - have  # tokens the draft's cache misses besides the last one
            missing = int(lag.sum())
            if missing:
                tok1 += missing
                catch = lag + 1
                pairs = float((catch * (have + (catch + 1) / 2.0)).sum())
        seq1, kv1 = n, csum + n
        if plan.draft_sync and which == "draft":  # keep the draft's KV in sync over the rest of the step
            rest = ~spec
            n_rest = dids.size - n
            tok1 += n_rest + int(ptok.sum())
            seq1 += n_rest + int(pids.size)
            if n_rest:
                c_rest = dc[rest]
                kv1 += float(c_rest.sum()) + n_rest
                have = s.num_draft_computed[dids[rest]]
                lag = c_rest - have  # what the draft missed while these requests did not speculate
                if lag.any():
                    tok1 += int(lag.sum())
                    pairs += float(((lag + 1) * (have + (lag + 2) / 2.0)).sum())
            if pids.size:
                pc = s.num_computed[pids]
                pairs += float((ptok * (pc + (ptok + 1) / 2.0)).sum())
        total = 0.0
        if seq1:
            total += cost.forward_s(tok1, seq1, kv_read_tokens=kv1, prefill_attn_pairs=pairs,
                                    lm_head_tokens=seq1, decode_only=pairs == 0.0, which=which)
        if not n:
            return total
        dmax, dmin = int(depth.max()), int(depth.min())
        if width is None and dmax == dmin:  # every request drafts the same chain: closed form per step
            for j in range(2, dmax + 1):
                total += cost.forward_s(n, n, kv_read_tokens=csum + j * n, decode_only=True, which=which)
            return total
        if dmax >= 2:
            # requests still drafting at step j: depth >= j; reverse cumulative sums over depth
            n_ge = np.bincount(depth, minlength=dmax + 1)[::-1].cumsum()[::-1]
            w_ge = n_ge if width is None else np.bincount(depth, weights=width, minlength=dmax + 1)[::-1].cumsum()[::-1]
            c_ge = np.bincount(depth, weights=c, minlength=dmax + 1)[::-1].cumsum()[::-1]
            for j in range(2, dmax + 1):
                nj = int(n_ge[j])
                if nj == 0:
                    continue
                tok = int(w_ge[j])
                total += cost.forward_s(tok, nj, kv_read_tokens=float(c_ge[j]) + j * nj, lm_head_tokens=tok,
                                        decode_only=True, which=which)
        return total
