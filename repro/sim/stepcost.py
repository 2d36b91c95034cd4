"""What a planned step costs in seconds: the drafting before the target's pass (:class:`StepCoster`) and the
stretches of steps the fast path prices at once (:func:`decode_runs_s`, :func:`draft_runs_s`).

The target's pass itself is :func:`repro.cost.step.verify_pass`'s; this module adds what depends on the plan's
proposer and on each request's draft cache (:mod:`repro.sim.proposers`, :mod:`repro.sim.state`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from repro.core import jit
from repro.core.errors import PlanError
from repro.core.speculation import trees_at
from repro.cost.model import CostModel
from repro.cost.step import per_step, verify_terms
from repro.sim.plan import StepPlan
from repro.sim.state import RequestState

if TYPE_CHECKING:
    from repro.sim.proposers import Proposer, RemoteDraftServer

_NO_IDS = np.zeros(0, dtype=np.int64)
_NO_MASK = np.zeros(0, dtype=bool)


def decode_runs_s(cost: CostModel, prop: Proposer, k: int, blocks: Sequence[np.ndarray],
                  csum: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Drafting and verification seconds, and fixed verification costs, of stretches of chain-``k`` decode steps.

    Every request drafts ``k`` > 0 with the co-located model-based ``prop`` (:func:`draft_runs_s`; ``csum``: each
    step's total context) and the target verifies (:func:`repro.cost.step.verify_runs_s`). The values equal those two
    functions' bit for bit; with both models analytic they come from one
    :meth:`~repro.cost.model.CostModel.forward_s_rows` call.
    """
    shapes, hosts, overheads, kv_read, qpairs, lengths = verify_terms(cost, k, blocks)
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
            draft = per_step([prop.host_s(n) for n in sizes], lengths) + total
            return draft, passes[k] + per_step(hosts, lengths), overheads
    verify = cost.forward_s_blocks(shapes, lengths, kv_read, qpairs) + per_step(hosts, lengths)
    return draft_runs_s(prop, k, sizes, csum, lengths), verify, overheads


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
    return per_step([prop.host_s(n) for n in ns], lengths) + total


class StepCoster:
    """Drafting time of a replica's steps: its request state (what each draft cache holds), its cost model and the
    remote draft servers its plans may place requests on."""

    def __init__(self, state: RequestState, cost: CostModel, draft_servers: Sequence[RemoteDraftServer] = ()) -> None:
        self.s = state
        self.cost = cost
        self.draft_servers = tuple(draft_servers)

    def draft_s(self, prop: Proposer, plan: StepPlan, dids: np.ndarray, dc: np.ndarray, k: np.ndarray,
                spec: np.ndarray, trees: Any, pids: np.ndarray, ptok: np.ndarray, *, draft_resident: bool) -> float:
        """Seconds of drafting with ``prop`` before the target's pass.

        Host time, then (model-based) its passes for the requests in ``spec``: locally, or on the remote draft servers
        ``plan`` places them on (the slowest server's passes plus the uplink of its drafts, ``uplink_s``).
        """
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
        """(drafting, verification) seconds of a prefill-only ``plan`` over whole, uncached prompts.

        ``tokens`` per request of ``pids``. The same terms, in the same order, as :meth:`draft_s` (one draft pass over
        the prompts where ``plan.draft_sync``) and :func:`verify_pass` plus host seconds, without building batches.
        """
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
        """:meth:`draft_s` of each step of a run where the same ``n`` requests draft chains of ``k`` > 0.

        ``prop`` is co-located and model-based, its cache (if any) holds every computed token (no catch-up), and the
        steps hold nothing else; ``csum`` is each step's total context. Each value equals ``draft_s`` bit for bit.
        """
        return draft_runs_s(prop, k, [n], csum, [csum.size])

    @staticmethod
    def chains_s(prop: Proposer, n: int, c_sum: int, k: int) -> float:
        """:meth:`_draft_pass` of ``n`` chains of ``k`` > 0 whose draft caches hold their contexts (``c_sum`` tokens
        in all), nothing else in the step: one catch-up-free first step, then steps 2..k (the lean step of chains,
        ``Replica._execute_chains``, and the first case below)."""
        cost, which = prop.cost, prop.which
        assert which is not None
        csum = float(c_sum)
        total = 0.0
        total += cost.forward_s(n, n, kv_read_tokens=csum + n, prefill_attn_pairs=0.0, lm_head_tokens=n,
                                decode_only=True, which=which)
        return cost.draft_steps_s(total, n, n, csum, k, which)

    def _draft_pass(self, prop: Proposer, plan: StepPlan, dids: np.ndarray, dc: np.ndarray, k: np.ndarray,
                    spec: np.ndarray, trees: Any, pids: np.ndarray, ptok: np.ndarray) -> float:
        """Seconds of ``prop``'s draft steps (on its cost model) for the speculating requests.

        Step 1 processes each request's catch-up tokens (its last token plus what the proposer's KV cache misses);
        steps 2..D one token per chain or ``w`` per beam.
        """
        s = self.s
        cost, which, keeps_kv = prop.cost, prop.which, prop.keeps_kv
        if which is None:
            raise PlanError(f"proposer {prop.name!r} runs no model passes")
        width: np.ndarray | None = None
        pairs = 0.0
        reads = None
        if jit.step_kernels() and not trees:  # the sums below, compiled (repro.sim.kernels.draft_reads)
            reads = jit.kernel("repro.sim.kernels", "draft_reads")(s.num_draft_computed, dids, dc, k, spec, keeps_kv)
        if reads is not None and not reads[2]:  # (no catch-up: its pairs are a floating-point sum, NumPy's)
            n, c_sum, _, dmax, dmin = reads
            if n and dmax == dmin and n == dids.size and not pids.size:  # every request the same chain
                return self.chains_s(prop, n, c_sum, dmax)
            csum = float(c_sum)
            tok1 = n
            sid = c = depth = None  # (read below only where the chains' lengths differ)
        else:
            n = int(np.count_nonzero(spec))
            if n == dids.size:
                sid, c, depth = dids, dc, k
            else:
                sid, c, depth = dids[spec], dc[spec], k[spec]
            csum = float(c.sum())
            if trees:
                depth = depth.copy()
                width = np.ones_like(depth)
                found = trees_at(trees, sid.tolist())
                if found:
                    at = [i for i, _ in found]
                    depth[at] = [t.cand.draft_depth for _, t in found]
                    width[at] = [t.cand.draft_width for _, t in found]
            tok1 = n
            if keeps_kv and n:
                have = s.num_draft_computed[sid]
                lag = c - have  # tokens the draft's cache misses besides the last one
                missing = int(lag.sum())
                if missing:
                    tok1 += missing
                    catch = lag + 1
                    pairs = float((catch * (have + (catch + 1) / 2.0)).sum())
            if n:
                dmax, dmin = int(depth.max()), int(depth.min())
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
                if np.count_nonzero(lag):
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
        if width is None and dmax == dmin:  # every request drafts the same chain: closed form per step
            return cost.draft_steps_s(total, n, n, csum, dmax, which)
        if dmax >= 2 and width is not None and dmax == dmin and int(width.min()) == int(width.max()):
            # beams of one depth and width (AdaServe's step): n·w tokens at every step, the contexts' sum
            return cost.draft_steps_s(total, n * int(width[0]), n, csum, dmax, which)
        if dmax >= 2:
            if depth is None or c is None:
                c, depth = (dc, k) if n == dids.size else (dc[spec], k[spec])
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
