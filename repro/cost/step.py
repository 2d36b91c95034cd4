"""The target's forward pass of one step, in seconds, as a serving engine runs it.

The engine turns a checked plan into :class:`PrefillBatch` and :class:`DecodeBatch`; :func:`verify_pass` charges
the target's one pass over every prefill chunk and every decoding request's 1 + speculated tokens as the engine
profile (:class:`~repro.cost.serving.EngineProfile`) runs it: the multi-query scorer reads each sequence's KV once,
batch expansion once per expanded query (k + 1 times) with every per-sequence cost repeated; which passes replay
CUDA graphs; the host-side costs of speculation. A prefill chunk on a cached prefix reads that prefix.
:func:`decode_pass_s` charges a uniform batch the same way, for policies that predict step times and for the
command line. The drafting before the pass depends on the plan's proposer: :mod:`repro.sim.stepcost`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from repro.core import jit
from repro.core.speculation import TreeSpec
from repro.cost.model import CostModel, ForwardShape
from repro.cost.serving import EngineProfile


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


def _host_s(profile: EngineProfile, n_spec: float, proposed: float) -> float:
    """The host's seconds of speculation around a pass: per speculating sequence and per proposed token; none under
    async scheduling, where that work overlaps the GPU's pass (repro.cost.serving)."""
    return 0.0 if profile.async_scheduling else profile.spec_seq_s * n_spec + profile.spec_token_s * proposed


def _decode_terms(profile: EngineProfile, k: np.ndarray, ctx: np.ndarray, multi_query: np.ndarray | None = None
                  ) -> tuple[float, float, float, float, float]:
    """(sequences, KV tokens read, query-key pairs, host seconds, largest query) of a pass's decode/verify part.

    Request i scores 1 + k[i] tokens on ctx[i] cached ones. Under batch expansion a request with k > 0 becomes k + 1
    single-query sequences, the j-th reading ctx + j tokens. ``multi_query`` marks requests scored with one
    multi-token query whatever the scorer (token trees).
    """
    q = k + 1
    n = float(k.size)
    spec = k > 0
    n_spec = float(np.count_nonzero(spec))
    host = _host_s(profile, n_spec, float(k.sum()))
    qmax = float(q.max()) if q.size else 1.0
    if profile.scorer == "batch_expansion" and n_spec:
        be = spec if multi_query is None else spec & ~multi_query
        n_be = np.count_nonzero(be)
        if n_be == be.size:  # every request expands (the terms below with nothing left: + 0)
            expanded = float(q.sum())
            kv_be = float(((1.0 + (q - 1) * profile.expand_reread) * ctx).sum() + (q * (q + 1)).sum() / 2.0)
            return expanded + 0.0, kv_be + 0.0, kv_be + 0.0, host + profile.expand_seq_s * expanded, 1.0
        if n_be:
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


#: :class:`~repro.cost.model.ForwardShape`'s fields in order, as :func:`verify_args` gives them
ShapeArgs = tuple[int, int, float, float, int, bool, float, int, int, float]


def verify_pass(profile: EngineProfile, pre: PrefillBatch, dec: DecodeBatch) -> tuple[ForwardShape, float]:
    """The target's forward pass of a step under ``profile``, and the host seconds of speculation around it.

    - Every prefill chunk (causal pairs, reading its cached prefix) and 1 + speculation per decoding request
      (:func:`_decode_terms`).
    - The LM head scores verified tokens and the last token of completed prefills.
    - CUDA graphs replay when there is no prefill, every query is one token (or the profile graphs verification) and
      the tokens fit the captured sizes.
    """
    args, host = verify_args(profile, pre, dec)
    return ForwardShape(*args), host


def verify_args(profile: EngineProfile, pre: PrefillBatch, dec: DecodeBatch) -> tuple[ShapeArgs, float]:
    """:func:`verify_pass` with the pass's :class:`~repro.cost.model.ForwardShape` as its fields in order (the first
    seven are ``CostModel.forward_s``'s arguments: the engine's hot path prices them without building objects)."""
    terms = None
    if dec.ids.size and jit.step_kernels() and dec.k.dtype == np.int64 and dec.ctx.dtype == np.int64:
        sums = jit.kernel("repro.cost.kernels", "chain_terms")(dec.k, dec.ctx)
        dec_tokens, terms = _chain_terms(profile, dec.k, dec.ctx, not dec.trees, *sums)
    else:
        dec_tokens = int(dec.k.sum()) + int(dec.ids.size)
    tree = None  # requests scored as one multi-token query: trees that branch (a width-1 tree is a chain)
    if dec.trees and terms is None:
        tree = np.fromiter((rid in dec.trees and dec.trees[rid].cand.draft_width > 1 for rid in dec.ids.tolist()),
                           dtype=bool, count=dec.ids.size)
    if terms is not None:
        seqs, kv, qpairs, host, qmax = terms
    elif dec.ids.size:
        seqs, kv, qpairs, host, qmax = _decode_terms(profile, dec.k, dec.ctx, tree)
    else:
        seqs, kv, qpairs, host, qmax = 0.0, 0.0, 0.0, 0.0, 1.0
    if pre.ids.size:
        n_tokens = int(pre.tokens.sum()) + dec_tokens
        return (n_tokens, int(pre.ids.size + seqs), kv + pre.cached, pre.pairs, dec_tokens + int(pre.completes.sum()),
                False, qpairs, int(pre.tokens.sum()), int(pre.ids.size), float(pre.cached)), host
    return _decode_args(profile, dec_tokens, seqs, kv, qpairs, host, qmax)


def chain_args(profile: EngineProfile, k: np.ndarray, ctx: np.ndarray, n_spec: int, k_sum: int, q_max: int,
               ctx_sum: int, pairs: int) -> tuple[ShapeArgs, float]:
    """:func:`verify_args` of a decode-only step of chains (``k`` and ``ctx`` int64, no trees) given the kernel
    ``chain_terms``'s sums of them: the engine's lean step of chains (``Replica._execute_chains``)."""
    dec_tokens, terms = _chain_terms(profile, k, ctx, True, n_spec, k_sum, q_max, ctx_sum, pairs)
    seqs, kv, qpairs, host, qmax = terms if terms is not None else _decode_terms(profile, k, ctx, None)
    return _decode_args(profile, dec_tokens, seqs, kv, qpairs, host, qmax)


def _chain_terms(profile: EngineProfile, k: np.ndarray, ctx: np.ndarray, chains_only: bool, n_spec: int, k_sum: int,
                 q_max: int, ctx_sum: int, pairs: int) -> tuple[int, tuple[float, float, float, float, float] | None]:
    """The decoding requests' tokens, and :func:`_decode_terms` from ``chain_terms``'s integer sums (None where they
    do not give them: some requests of a batch-expanding scorer do not speculate, a tree, or a batch past NumPy's
    first block of a pairwise sum)."""
    n = int(k.shape[0])
    dec_tokens = k_sum + n
    host = _host_s(profile, float(n_spec), float(k_sum))
    if profile.scorer != "batch_expansion" or not n_spec:  # _decode_terms's last lines, from the integer sums
        kv = float(ctx_sum) + float(dec_tokens)
        return dec_tokens, (float(n), kv, float(pairs) if n_spec else kv, host, float(q_max))
    if n_spec == n and chains_only:  # every request expands: its first return
        q_sum, kv_be = jit.kernel("repro.cost.kernels", "expand_terms")(k, ctx, profile.expand_reread)
        if kv_be == kv_be:  # (NaN: a batch past NumPy's first block, whose own sum serves)
            expanded = float(q_sum)
            return dec_tokens, (expanded + 0.0, kv_be + 0.0, kv_be + 0.0, host + profile.expand_seq_s * expanded, 1.0)
    return dec_tokens, None


def _decode_args(profile: EngineProfile, dec_tokens: int, seqs: float, kv: float, qpairs: float, host: float,
                 qmax: float) -> tuple[ShapeArgs, float]:
    """A decode-only pass's shape fields and host seconds: CUDA graphs where every query is one token (or the profile
    graphs verification) and the tokens fit the captured sizes."""
    graphs = (qmax <= 1.0 or profile.verify_graphs) and seqs <= profile.graph_max_tokens \
        and dec_tokens <= profile.graph_max_tokens
    return (dec_tokens, int(seqs), kv, 0.0, dec_tokens, graphs, qpairs, 0, 0, 0.0), host




def verify_run_s(cost: CostModel, k: int, ctx: np.ndarray) -> tuple[np.ndarray, float]:
    """Verification seconds of each step of a decode-only run, and the fixed costs inside each (the same for all).

    - The same requests every step, each speculating a chain of ``k`` (0: none), no trees; row i of ``ctx``
      (steps × requests) holds step i's contexts.
    - Each value equals the engine's charge for that step alone (:func:`verify_pass`'s pass plus host seconds), bit
      for bit, priced by :meth:`~repro.cost.model.CostModel.forward_s_many`.
    - Fixed costs: the pass's ``overhead_s`` plus host seconds, as a step trace records them.
    """
    verify, overhead = verify_runs_s(cost, k, [ctx])
    return verify, overhead[0]


def verify_runs_s(cost: CostModel, k: int, blocks: Sequence[np.ndarray]) -> tuple[np.ndarray, list[float]]:
    """:func:`verify_run_s` of consecutive stretches: the values concatenated, and each stretch's fixed costs.

    ``blocks`` holds each stretch's contexts (steps × requests); each stretch has its own requests.
    """
    shapes, hosts, overheads, kv_read, qpairs, lengths = verify_terms(cost, k, blocks)
    return cost.forward_s_blocks(shapes, lengths, kv_read, qpairs) + per_step(hosts, lengths), overheads


def per_step(values: list[float], lengths: Sequence[int]) -> float | np.ndarray:
    """Each stretch's value for each of its steps (one value for all: that value)."""
    first = values[0]
    return first if len(values) == 1 or all(v == first for v in values) else np.repeat(values, lengths)


def verify_terms(cost: CostModel, k: int, blocks: Sequence[np.ndarray]
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
        host = _host_s(profile, n_spec, float(n * k))
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


def decode_pass_s(cost: CostModel, batch: int, context: float, k: float = 0.0, *, tree: bool = False) -> float:
    """Seconds of one target pass over ``batch`` requests, each scoring 1 + ``k`` tokens on ``context`` cached ones.

    ``k`` = 0 is plain decode; ``tree``: a k-node token tree, always one multi-token query. Charged exactly as
    :func:`verify_pass` charges the engine's steps, host costs of speculation included.
    """
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
