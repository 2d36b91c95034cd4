"""Step costing: a planned step's shape in seconds, under one replica's cost model, engine profile and proposers
(docs/design.md, "Cost model" and "Engine").

The engine checks a plan and turns it into the batches below (:class:`PrefillBatch`, :class:`DecodeBatch`); this
module charges them. :func:`verify_pass` is the target's one forward pass over every prefill chunk and every decoding
request's 1 + speculated tokens as the engine profile (:class:`~repro.cost.serving.EngineProfile`) runs it: the
multi-query scorer reads each sequence's KV once, batch expansion once per expanded query (k + 1 times) with every
per-sequence cost repeated; which passes replay CUDA graphs; the host-side costs of speculation. A prefill chunk on
a cached prefix reads that prefix. :meth:`StepCoster.draft_s` is the drafting before it, priced as the plan's
proposer object (:mod:`repro.proposers`) says: its host time (prompt lookup's matching, or a model-based proposer's
per-round bookkeeping), then the passes of a draft model or EAGLE head on the proposer's cost model, which first
catch up on the tokens the proposer's own cache misses; requests placed on remote draft servers draft there, each
server on its own cost model plus its round trip, and the step waits for the slowest. :func:`decode_pass_s` charges
a uniform batch the same way, for policies that predict step times and for the command line. The engine only
sequences events and applies outcomes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from repro.cost.model import CostModel, ForwardShape
from repro.cost.serving import EngineProfile
from repro.plan import PlanError, StepPlan, TreeSpec
from repro.state import RequestState

if TYPE_CHECKING:
    from repro.proposers import Proposer, RemoteDraftServer


@dataclass(frozen=True, slots=True)
class PrefillBatch:
    """The prefill chunks of a step: ids, tokens, causal attention pairs, which chunks complete their request, and
    the cached prefix the chunks attend (tokens, summed)."""

    ids: np.ndarray
    tokens: np.ndarray
    pairs: float
    completes: np.ndarray
    cached: float = 0.0


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
    first: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # (proposed, accepted, matched) of a proposer that
    # proposes before verification (prompt lookup), known before the target's pass


def _decode_terms(profile: EngineProfile, k: np.ndarray, ctx: np.ndarray, multi_query: np.ndarray | None = None
                  ) -> tuple[float, float, float, float, float]:
    """(sequences, KV tokens read, query-key pairs, host seconds, largest query) of the decode/verify part of a pass:
    request i scores 1 + k[i] tokens on ctx[i] cached ones. Under batch expansion a request with k > 0 becomes k + 1
    single-query sequences, the j-th reading ctx + j tokens; ``multi_query`` marks requests scored with one
    multi-token query whatever the scorer (token trees)."""
    q = k + 1
    n = float(k.size)
    spec = k > 0
    n_spec = float(np.count_nonzero(spec))
    proposed = float(k.sum())
    host = profile.spec_seq_s * n_spec + profile.spec_token_s * proposed
    qmax = float(q.max()) if q.size else 1.0
    if profile.scorer == "batch_expansion" and n_spec:
        be = spec if multi_query is None else spec & ~multi_query
        if be.any():
            qb, cb = q[be], ctx[be]
            rest = ~be
            qr, cr = q[rest], ctx[rest]
            expanded = float(qb.sum())
            kv_be = float(((1.0 + (qb - 1) * profile.expand_reread) * cb).sum() + (qb * (qb + 1)).sum() / 2.0)
            seqs = expanded + float(qr.size)
            kv = kv_be + float(cr.sum() + qr.sum())
            qpairs = kv_be + float((qr * (cr + qr)).sum())
            qmax = float(qr.max()) if qr.size else 1.0
            return seqs, kv, qpairs, host + profile.expand_seq_s * expanded, qmax
    kv = float(ctx.sum()) + float(q.sum())
    qpairs = float((q * (ctx + q)).sum()) if n_spec else kv
    return n, kv, qpairs, host, qmax


def verify_pass(profile: EngineProfile, pre: PrefillBatch, dec: DecodeBatch) -> tuple[ForwardShape, float]:
    """The target's forward pass of a step, and the host seconds of speculation around it, under ``profile``:
    every prefill chunk (its causal pairs, reading its cached prefix) and 1 + speculation per decoding request
    (:func:`_decode_terms`); the LM head scores verified tokens and the last token of completed prefills. The pass
    replays CUDA graphs when it has no prefill, every query is a single token (or the profile graphs verification)
    and its tokens fit the captured sizes."""
    dec_tokens = int(dec.k.sum()) + int(dec.ids.size)
    tree = None  # requests scored as one multi-token query: trees that branch (a width-1 tree is a chain)
    if dec.trees:
        tree = np.fromiter((rid in dec.trees and dec.trees[rid].cand.draft_width > 1 for rid in dec.ids.tolist()),
                           dtype=bool, count=dec.ids.size)
    if dec.ids.size:
        seqs, kv, qpairs, host, qmax = _decode_terms(profile, dec.k, dec.ctx, tree)
    else:
        seqs, kv, qpairs, host, qmax = 0.0, 0.0, 0.0, 0.0, 1.0
    if pre.ids.size:
        n_tokens = int(pre.tokens.sum()) + dec_tokens
        shape = ForwardShape(n_tokens, int(pre.ids.size + seqs), kv + pre.cached, pre.pairs,
                             dec_tokens + int(pre.completes.sum()), False, qpairs)
        return shape, host
    graphs = (qmax <= 1.0 or profile.verify_graphs) and seqs <= profile.graph_max_tokens \
        and dec_tokens <= profile.graph_max_tokens
    return ForwardShape(dec_tokens, int(seqs), kv, 0.0, dec_tokens, graphs, qpairs), host


_NO_IDS = np.zeros(0, dtype=np.int64)
_NO_MASK = np.zeros(0, dtype=bool)


def verify_run_s(cost: CostModel, k: int, ctx: np.ndarray) -> tuple[np.ndarray, float]:
    """The verification seconds (:func:`verify_pass`'s target pass plus its host seconds) of a run of decode-only
    steps over the same requests, each speculating a chain of ``k`` (0: none) with no trees: row i of ``ctx`` (steps
    × requests) holds step i's contexts. Each value equals what the engine charges that step on its own, bit for bit:
    the same terms, summed in the same order (a row sum is numpy's sum of that row), priced by
    :meth:`~repro.cost.model.CostModel.forward_s_many`. Also returns the fixed costs inside each step's verification
    (the pass's ``overhead_s`` plus the host seconds, as a step trace records them), the same for every step."""
    verify, overhead = verify_runs_s(cost, k, [ctx])
    return verify, overhead[0]


def verify_runs_s(cost: CostModel, k: int, blocks: Sequence[np.ndarray]) -> tuple[np.ndarray, list[float]]:
    """:func:`verify_run_s` of consecutive stretches of steps, each over its own requests (``blocks``: each
    stretch's contexts, steps × requests): the stretches' values one after the other, and each stretch's fixed
    costs."""
    shapes, hosts, overheads, kv_read, qpairs, lengths = _verify_terms(cost, k, blocks)
    return cost.forward_s_blocks(shapes, lengths, kv_read, qpairs) + _per_step(hosts, lengths), overheads


def decode_runs_s(cost: CostModel, prop: Proposer, k: int, blocks: Sequence[np.ndarray],
                  csum: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Drafting and verification seconds of consecutive stretches of steps in which every request drafts a chain of
    ``k`` > 0 with the co-located model-based proposer ``prop`` (:meth:`StepCoster.draft_runs_s`; ``csum``: each
    step's total context) and the target verifies them (:func:`verify_runs_s`), and each stretch's fixed costs of
    verification. Where both models are analytic, both come from one evaluation of the pass formula
    (:meth:`~repro.cost.model.CostModel.forward_s_rows`); the values are those of the two functions, bit for bit."""
    shapes, hosts, overheads, kv_read, qpairs, lengths = _verify_terms(cost, k, blocks)
    sizes = [b.shape[1] for b in blocks]
    which = prop.which
    if prop.cost is cost and which is not None and not prop.remote and k > 0:
        steps = kv_read.size
        kv = np.empty((k + 1, steps))
        kv[:k] = csum + np.arange(1, k + 1)[:, None] * (sizes[0] if len(sizes) == 1 else np.repeat(sizes, lengths))
        kv[k] = kv_read
        qp = np.zeros((k + 1, steps))
        qp[k] = qpairs
        drafting = [(n, n, n, True) for n in sizes]  # (one list for the k passes: its parts are looked up once)
        passes = cost.forward_s_rows([(which, drafting)] * k + [("target", shapes)], lengths, kv, qp)
        if passes is not None:
            total = 0.0 + passes[0]
            for j in range(1, k):
                total = total + passes[j]
            draft = _per_step([prop.host_s(n) for n in sizes], lengths) + total
            return draft, passes[k] + _per_step(hosts, lengths), overheads
    verify = cost.forward_s_blocks(shapes, lengths, kv_read, qpairs) + _per_step(hosts, lengths)
    return draft_runs_s(prop, k, sizes, csum, lengths), verify, overheads


def _per_step(values: list[float], lengths: Sequence[int]) -> float | np.ndarray:
    """Each stretch's value for each of its steps (one value for all: that value)."""
    first = values[0]
    return first if len(values) == 1 or all(v == first for v in values) else np.repeat(values, lengths)


def _verify_terms(cost: CostModel, k: int, blocks: Sequence[np.ndarray]
                  ) -> tuple[list[tuple[int, int, int, bool]], list[float], list[float], np.ndarray, np.ndarray,
                             list[int]]:
    """What verification of each stretch of ``blocks`` charges (:func:`verify_runs_s`): each stretch's pass shape,
    host seconds and fixed costs, each step's KV read and query pairs, and the stretches' lengths."""
    profile = cost.engine
    q = k + 1
    shapes: list[tuple[int, int, int, bool]] = []
    hosts: list[float] = []
    overheads: list[float] = []
    kv_reads: list[np.ndarray] = []
    qpairs: list[np.ndarray] = []
    for ctx in blocks:
        ctx = np.ascontiguousarray(ctx)  # a row sum of another layout may add in another order
        n = ctx.shape[1]
        n_spec = float(n) if k else 0.0
        host = profile.spec_seq_s * n_spec + profile.spec_token_s * float(n * k)
        dec_tokens = n * k + n
        if profile.scorer == "batch_expansion" and n_spec:
            expanded = float(n * q)
            kv_be = ((1.0 + k * profile.expand_reread) * ctx).sum(axis=1) + (n * q * (q + 1)) / 2.0
            seqs, kv_read, qp = expanded, kv_be, kv_be  # (verify_pass adds the non-expanded requests' 0.0)
            host += profile.expand_seq_s * expanded
            qmax = 1.0
        else:
            seqs = float(n)
            kv_read = ctx.sum(axis=1).astype(np.float64) + float(n * q)
            qp = (q * (ctx + q)).sum(axis=1).astype(np.float64) if n_spec else kv_read
            qmax = float(q)
        graphs = (qmax <= 1.0 or profile.verify_graphs) and seqs <= profile.graph_max_tokens \
            and dec_tokens <= profile.graph_max_tokens
        shapes.append((dec_tokens, int(seqs), dec_tokens, graphs))
        hosts.append(host)
        overheads.append(cost.fixed_s(int(seqs), graphs) + host)
        kv_reads.append(kv_read)
        qpairs.append(qp)
    if len(blocks) == 1:
        return shapes, hosts, overheads, kv_reads[0], qpairs[0], [kv_reads[0].size]
    return shapes, hosts, overheads, np.concatenate(kv_reads), np.concatenate(qpairs), [b.shape[0] for b in blocks]


def draft_runs_s(prop: Proposer, k: int, ns: Sequence[int], csum: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
    """:meth:`StepCoster.draft_run_s` of consecutive stretches of steps, ``lengths[i]`` steps over ``ns[i]`` requests
    each (``csum``: every step's total context, the stretches one after the other)."""
    which = prop.which
    if which is None or prop.remote or k <= 0:
        raise ValueError(f"draft_run_s: proposer {prop.name!r} with k={k} does not draft a model chain here")
    # pass j of k reads csum + j·n; every pass has n tokens, n sequences and scores n tokens (as draft_s charges)
    if len(ns) == 1:
        n = ns[0]
        passes = prop.cost.forward_s_many(n, n, csum + (np.arange(1, k + 1) * n)[:, None], 0.0, n, True, which)
    else:
        passes = prop.cost.forward_s_blocks([(n, n, n, True) for n in ns], lengths,
                                            csum + np.arange(1, k + 1)[:, None] * np.repeat(ns, lengths), 0.0, which)
    total = 0.0 + passes[0]
    for j in range(1, k):
        total = total + passes[j]
    return _per_step([prop.host_s(n) for n in ns], lengths) + total


def decode_pass_s(cost: CostModel, batch: int, context: float, k: float = 0.0, *, tree: bool = False) -> float:
    """Seconds of one target pass over ``batch`` requests with ``context`` cached tokens each, every one scoring
    1 + ``k`` tokens (``k`` = 0: plain decode; ``tree``: a token tree of k nodes, always one multi-token query),
    charged exactly as :func:`verify_pass` charges the engine's steps, host costs of speculation included."""
    if batch <= 0:
        return 0.0
    kk = np.full(batch, float(k))
    ctx = np.full(batch, float(context))
    seqs, kv, qpairs, host, qmax = _decode_terms(cost.engine, kk, ctx,
                                                 np.ones(batch, dtype=bool) if tree else None)
    prof = cost.engine
    tokens = batch * (1 + k)
    graphs = (qmax <= 1.0 or prof.verify_graphs) and seqs <= prof.graph_max_tokens and tokens <= prof.graph_max_tokens
    return cost.forward_s(round(tokens), round(seqs), kv_read_tokens=kv, lm_head_tokens=round(tokens),
                          decode_only=graphs, query_pairs=qpairs) + host


class StepCoster:
    """Drafting time of a replica's steps: its request state (what each draft cache holds), its cost model and the
    remote draft servers its plans may place requests on."""

    def __init__(self, state: RequestState, cost: CostModel, draft_servers: Sequence[RemoteDraftServer] = ()) -> None:
        self.s = state
        self.cost = cost
        self.draft_servers = tuple(draft_servers)

    def draft_s(self, prop: Proposer, plan: StepPlan, dids: np.ndarray, dc: np.ndarray, k: np.ndarray,
                spec: np.ndarray, trees: Any, pids: np.ndarray, ptok: np.ndarray, *, draft_resident: bool) -> float:
        """Seconds of drafting before the target's pass with proposer ``prop``: its host time, then (a model-based
        proposer) its passes for the requests in ``spec``, locally or on the remote draft servers ``plan`` places
        them on (the slowest server, its passes and then the uplink of its drafts: ``uplink_s``)."""
        host_s = prop.host_s(int(np.count_nonzero(spec)))
        if prop.which is None:  # runs on the host (prompt lookup), for every request asked, matched or not
            return host_s
        servers = plan.draft_server
        if prop.resident and not draft_resident and servers is None:
            raise PlanError(f"speculating with a {prop.name} model that is not resident")
        if servers is None or not self.draft_servers:
            return host_s + self._draft_pass(prop, plan, dids, dc, k, spec, trees, pids, ptok)
        servers = np.asarray(servers, dtype=np.int64)
        t = 0.0
        for srv in np.unique(servers[spec]).tolist():
            mask = spec & (servers == srv)
            if srv < 0:
                t = max(t, self._draft_pass(prop, plan, dids, dc, k, mask, trees, pids[:0], ptok[:0]))
            else:
                ds = self.draft_servers[srv]
                t = max(t, self._draft_pass(ds, plan, dids, dc, k, mask, trees, pids[:0], ptok[:0])
                        + ds.uplink_s(int(k[mask].sum())))
        return host_s + t

    def prompts_s(self, prop: Proposer, plan: StepPlan, pids: np.ndarray, tokens: np.ndarray, *,
                  draft_resident: bool) -> tuple[float, float]:
        """(drafting, verification) seconds of a prefill-only ``plan`` over whole prompts with nothing cached
        (``tokens`` each; requests ``pids`` never computed anything): :meth:`draft_s` and :func:`verify_pass`'s
        target pass plus its host seconds, the same terms in the same order (the draft's one pass over the prompts
        where ``plan.draft_sync``), without building the batches."""
        pairs = float((tokens * (0 + (tokens + 1) / 2.0)).sum())  # the prompts' causal pairs (nothing cached: 0 + ...)
        num_tokens, num_seqs = int(tokens.sum()), int(pids.size)
        if not plan.draft_sync:
            draft_s = 0.0
        elif prop.which is not None and prop.keeps_kv and (draft_resident or not prop.resident) \
                and (plan.draft_server is None or not self.draft_servers):
            draft_s = prop.host_s(0) + (0.0 + prop.cost.forward_s(num_tokens, num_seqs, 0.0, 0.0 + pairs, num_seqs,
                                                                  pairs == 0.0, which=prop.which))
        else:
            draft_s = self.draft_s(prop, plan, _NO_IDS, _NO_IDS, _NO_IDS, _NO_MASK, {}, pids, tokens,
                                   draft_resident=draft_resident)
        # the LM head scores each prompt's last token; a prefill-only pass has no host seconds of speculation
        verify_s = self.cost.forward_s(num_tokens, num_seqs, 0.0 + 0.0, pairs, num_seqs, False, 0.0) + 0.0
        return draft_s, verify_s

    def draft_run_s(self, prop: Proposer, n: int, k: int, csum: np.ndarray) -> np.ndarray:
        """:meth:`draft_s` for a run of steps in which the same ``n`` requests all draft a chain of ``k`` > 0 with the
        co-located model-based proposer ``prop``, whose cache (if it keeps one) holds every computed token (no
        catch-up) and with nothing else in the step; ``csum`` holds each step's total context. Each value equals
        ``draft_s`` of that step bit for bit (the same passes, accumulated in the same order)."""
        return draft_runs_s(prop, k, [n], csum, [csum.size])

    def _draft_pass(self, prop: Proposer, plan: StepPlan, dids: np.ndarray, dc: np.ndarray, k: np.ndarray,
                    spec: np.ndarray, trees: Any, pids: np.ndarray, ptok: np.ndarray) -> float:
        """Draft steps of ``prop`` (on its cost model) for the speculating requests: step 1 processes each request's
        catch-up tokens (its last token, plus whatever the proposer's own KV cache misses), steps 2..D one token per
        chain or ``w`` per beam."""
        s = self.s
        cost, which, keeps_kv = prop.cost, prop.which, prop.keeps_kv
        if which is None:
            raise PlanError(f"proposer {prop.name!r} runs no model passes")
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
        if keeps_kv and n:
            have = s.num_draft_computed[sid]
            lag = c - have  # tokens the draft's cache misses besides the last one
            missing = int(lag.sum())
            if missing:
                tok1 += missing
                catch = lag + 1
                pairs = float((catch * (have + (catch + 1) / 2.0)).sum())
        seq1, kv1 = n, csum + n
        if plan.draft_sync and keeps_kv:  # keep the draft's KV in sync over the rest of the step
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
