"""``backend=hf``: the engine's steps executed on real models with PyTorch + transformers.

The engine (:mod:`repro.sim.engine`) still asks the policy for a plan, checks it, keeps the request state and the KV
block accounting; :class:`HfBackend` executes what the plan asks on a target model and a draft model and reports what
happened, in place of the cost model (time) and the token oracle (acceptance). A policy never knows which backend
runs it. Per step:

- **drafting** (measured as ``draft_s``): for each speculating request, the draft model first catches its KV cache up
  to the request's last token (every true token it has not seen), then proposes its chain greedily, one token per
  pass, batched over requests (``proposer: draft``); prompt lookup (``pld``) proposes the continuation of the latest
  earlier occurrence of the text's last n-gram (n = 3, 2, 1) in the request's real tokens; token trees come from the
  policy's ``view.drafter``, here :class:`RealDrafter`, whose beam search (AdaServe §4.3 Step 1) and fixed expansions
  (SpecInfer) run on the draft model and carry their token ids (``CandidateTree.tokens``). Drafting the policy's
  drafter did while scheduling the step is charged to the step too.
- **one target pass** (measured as ``verify_s``) over every scheduled token of the step: prefill chunks (chunked
  prefill included) and, per decoding request, its last token followed by its chain or tree, in one ragged batch: each
  sequence attends to its own KV cache and, inside its new tokens, to its ancestors only (a causal mask for chunks and
  chains, the tree attention mask for trees; positions = context + depth).
- **acceptance**: greedy (``temperature: 0``): the longest drafted path whose every token is the target's argmax
  given its prefix, then the target's own next token (the bonus); at ``temperature > 0`` chains use speculative
  (rejection) sampling: accept d with probability min(1, p(d)/q(d)), else sample from norm(max(0, p − q)). The KV
  of the accepted path is kept, the rest dropped.

Each request holds a slot in the target's and the draft's KV pools (:class:`~repro.backends.kvslots.KvSlots`: one
buffer per model, allocated ahead, written and read in place by every pass; what a pass wrote is kept only once the
step commits it, so rejected tokens cost no copy). The target's cache is cut back to the engine's ``num_computed``
at the start of a step and a recompute preemption drops both caches, so the request's tokens are recomputed for
real; the draft's cache only ever holds true tokens. Prompts are each request's own, as the target's tokenizer
encodes its dataset's text or ids, where the dataset has them and the model's vocabulary holds the tokenizer's
(:mod:`workloads.prompts`); elsewhere deterministic random token ids of the workload's prompt lengths (the ``tiny``
stand-ins' vocabulary is 512 ids, so they always get those). The step's time is the measured wall clock of its model
passes (``torch.cuda.synchronize`` around each phase on a GPU), so the engine's clock, and with it every request's
TTFT and TPOT, advances by what the hardware took.

With ``record`` the backend keeps, per request and output position, the draft's top-``w`` tokens and probabilities on
the true context and the target's token there: :meth:`HfBackend.records_frame`, the recording ``oracle=trace``
replays in the simulator (:mod:`repro.oracle`).

Deviations (from a serving engine):
    - a pass is padded to its longest run of new tokens, and a pool of slots × the longest sequence stands for paged
      attention (no CUDA graphs either): the timings show the model on this device, not vLLM's kernels; use
      ``python -m repro.profile`` + ``cost=profile`` for engine-grade tables; the pool grows (a copy of it) inside
      the measured step that first needs more room, a handful of times a run, where a serving engine sizes its pool
      once at start-up;
    - tree candidates are recomputed per beam layer (the draft sees the partial tree each layer) instead of being
      cached; chains draft incrementally;
    - the draft's memory actions (Nightjar) are not physically moved: their time is the cost model's; the KV block
      accounting (admission, preemption) is the engine's simulated pool for the configured GPU; a swap moves the
      caches for real (its measured time is the step's), but each request's ``swap_s`` column stays the model's;
    - tree verification is greedy only (``temperature > 0`` is for chains);
    - the policy's own Python time is not charged (as in the simulator).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from repro.backends.kvslots import KvSlots
from repro.backends.models import require_torch
from repro.backends.ragged import Item, Runner, chain_mask, tree_mask
from repro.sim.backend import Executed
from repro.sim.plan import CandidateTree, PlanError

if TYPE_CHECKING:
    import pandas as pd

    from repro.cost.step import DecodeBatch, PrefillBatch
    from repro.sim.plan import StepPlan
    from repro.sim.proposers import Proposer
    from repro.sim.state import RequestState

PLD_NGRAMS = (3, 2, 1)  # prompt lookup: the n-gram sizes tried, longest first
#: A decoding request's drafts: (tokens, parent of each (-1: the root), q of each (None: a point mass), the draft's
#: logits at each chain position (for the record)).
_Spec = tuple[list[int], list[int], list[Any], list[Any]]


class HfBackend:
    """Executes an engine's plans on a target and (optionally) a draft model (module docstring).

    ``prompt_len`` gives each request's prompt length; ``prompts`` its token ids where its dataset has them
    (:mod:`workloads.prompts`), else it is random token ids seeded by (``seed``, request).
    ``record``: keep the draft's top-``record_width`` distribution at every output position it saw on the true
    context (:meth:`records_frame`).
    """

    def __init__(self, target: Any, draft: Any | None, prompt_len: np.ndarray, *, seed: int = 0,
                 temperature: float = 0.0, record: bool = False, record_width: int = 16,
                 max_width: int = 16, prompts: list[list[int] | None] | None = None) -> None:
        self.torch, _ = require_torch()
        self.target = Runner(target)
        self.draft = Runner(draft) if draft is not None else None
        if self.draft is not None and self.draft.vocab != self.target.vocab:
            raise ValueError(f"draft vocabulary ({self.draft.vocab}) differs from the target's ({self.target.vocab})")
        self.prompt_len = np.asarray(prompt_len, dtype=np.int64)
        self.prompts = prompts  # per request: its prompt's token ids (workloads.prompts), None: random ids
        self.prompt_note = ""  # one line for the point's notes: what the prompts are (workloads.prompts.Prompts.how)
        if prompts is not None and any(p is not None and len(p) != int(n) for p, n in zip(prompts, self.prompt_len,
                                                                                         strict=True)):
            raise ValueError("a prompt's token ids differ in length from its prompt_len")
        self.seed, self.temperature = int(seed), float(temperature)
        self.record, self.record_width, self.max_width = bool(record), int(record_width), int(max_width)
        self.gen = self.torch.Generator(device="cpu").manual_seed(self.seed)
        self.toks: dict[int, list[int]] = {}  # prompt + output tokens the engine has emitted
        self.beyond: dict[int, list[int]] = {}  # target tokens verified past a request's end (the record's truth)
        self.tkv = self.target.kv  # the target's and the draft's KV pools (a slot per request)
        self.dkv = self.draft.kv if self.draft is not None else KvSlots(self.torch, 0, 0, 0, None, None)
        self.lookup_tokens: dict[int, list[int]] = {}  # prompt-lookup proposals of the step being planned
        self.pending_draft_s = 0.0  # drafting the policy's drafter did while the step was being scheduled
        self.rec: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
        self.done_tokens: dict[int, list[int]] = {}  # finished requests' output tokens (for tests and records)
        self.warm_up()

    def warm_up(self) -> None:
        """One untimed pass of each model (a prompt, then a decode against its cache), as a serving engine warms up
        before it serves: the process's one-off costs (lazy initialisation, first allocations, kernel selection)
        stay out of the first request's measured TTFT."""
        torch = self.torch
        with torch.inference_mode():
            for runner in (self.target, self.draft):
                if runner is None:
                    continue
                runner.forward([Item(-1, 0, [0, 1, 2, 3], [0, 1, 2, 3], chain_mask(torch, 4, runner.device))])
                runner.kv.commit(-1, 4)
                runner.forward([Item(-1, 4, [4], [4], chain_mask(torch, 1, runner.device))])
                runner.kv.pop(-1)

    # ---------------------------------------------------------------------------------------------- tokens
    def tokens(self, rid: int) -> list[int]:
        """The request's real tokens (prompt + emitted output)."""
        t = self.toks.get(rid)
        if t is None:
            given = self.prompts[rid] if self.prompts is not None else None
            if given is not None:
                t = self.toks[rid] = [int(x) for x in given]
            else:
                rng = np.random.default_rng([self.seed, rid])
                t = self.toks[rid] = rng.integers(0, self.target.vocab, int(self.prompt_len[rid])).tolist()
        return t

    def output_tokens(self, rid: int) -> list[int]:
        if rid in self.done_tokens:
            return self.done_tokens[rid]
        return self.tokens(rid)[int(self.prompt_len[rid]):]

    def release(self, rid: int) -> None:
        """A finished request: free its caches, keep its output tokens. When recording, the draft first reads the
        request's last tokens it never saw (outside any step's time), so the recording covers every output
        position."""
        if self.record and self.draft is not None and rid in self.toks:
            with self.torch.inference_mode():
                self.catch_up([rid], [len(self.toks[rid])])
        self.done_tokens[rid] = self.output_tokens(rid)
        for d in (self.tkv, self.dkv, self.lookup_tokens):
            d.pop(rid, None)
        self.toks.pop(rid, None)

    def drop(self, rids: np.ndarray) -> None:
        """A recompute preemption: the requests' caches are freed (their tokens are recomputed when they return)."""
        for rid in rids.tolist():
            self.tkv.pop(rid, None)
            self.dkv.pop(rid, None)

    def swap(self, rids: np.ndarray, *, to_host: bool) -> float:
        """A swap preemption (``to_host``) or a swap-in: the requests' target and draft caches move between the
        device and host memory; returns the measured seconds."""
        t0 = self._sync()
        with self.torch.inference_mode():
            for rid in rids.tolist():
                for d in (self.tkv, self.dkv):
                    if rid in d:
                        d.swap(rid, to_host)
        return self._sync() - t0

    def _sync(self) -> float:
        if self.target.device.type == "cuda":
            self.torch.cuda.synchronize()
        return time.perf_counter()

    # ------------------------------------------------------------------------------------------- drafting
    def _record(self, rid: int, logits: Any, first_index: int) -> None:
        """Keep the draft's top-w at output positions predicted by ``logits`` (row j predicts token index
        ``first_index + j``; indices before the prompt's end are skipped)."""
        if not self.record:
            return
        p = int(self.prompt_len[rid])
        probs = self.torch.softmax(logits, dim=-1)
        top = self.torch.topk(probs, min(self.record_width, probs.shape[-1]), dim=-1)
        ids, vals = top.indices.cpu().numpy().astype(np.int32), top.values.cpu().numpy().astype(np.float32)
        store = self.rec.setdefault(rid, {})
        for j in range(logits.shape[0]):
            t = first_index + j - p
            if t >= 0:
                store[t] = (ids[j], vals[j])

    def catch_up(self, rids: Sequence[int], upto: Sequence[int]) -> list[Any]:
        """Run the draft over each request's true tokens it has not seen, through index ``upto[i] - 1``; return the
        draft's logits at the last of them (the distribution of token index ``upto[i]``)."""
        assert self.draft is not None
        torch = self.torch
        items, out, need = [], [], []
        for rid, n in zip(rids, upto, strict=True):
            toks = self.tokens(rid)
            have = min(self.dkv.length(rid), n - 1)  # all there: recompute the last token's logits from before it
            new = toks[have:n]
            items.append(Item(rid, have, new, list(range(have, n)), chain_mask(torch, len(new), self.draft.device)))
            need.append((rid, have, n))
        logits = self.draft.forward(items)
        for (rid, have, n), lg in zip(need, logits, strict=True):
            self.dkv.commit(rid, n)
            self._record(rid, lg, have + 1)
            out.append(lg[-1])
        return out

    def _pick(self, logits: Any) -> tuple[int, Any]:
        """The draft's token at a position (argmax; sampled at temperature) and its distribution q."""
        torch = self.torch
        if self.temperature > 0:
            q = torch.softmax(logits / self.temperature, dim=-1)
            return int(torch.multinomial(q.cpu(), 1, generator=self.gen)), q
        return int(logits.argmax()), None

    def draft_chains(self, rids: list[int], ks: list[int]) -> tuple[list[list[int]], list[list[Any]], list[Any]]:
        """Greedy (or sampled) chains of ``ks[i]`` tokens after each request's last token: tokens, their q's (at
        temperature) and the draft's logits at every chain position (for the record)."""
        assert self.draft is not None
        torch = self.torch
        ctx = [len(self.tokens(r)) for r in rids]
        first = self.catch_up(rids, ctx)
        chains: list[list[int]] = [[] for _ in rids]
        qs: list[list[Any]] = [[] for _ in rids]
        lgs: list[list[Any]] = [[lg] for lg in first]
        for i, lg in enumerate(first):
            tok, q = self._pick(lg)
            chains[i].append(tok)
            qs[i].append(q)
        for step in range(1, max(ks)):
            live = [i for i, k in enumerate(ks) if k > step]
            items = [Item(rids[i], ctx[i] + step - 1, [chains[i][-1]], [ctx[i] + step - 1],
                          chain_mask(torch, 1, self.draft.device)) for i in live]
            logits = self.draft.forward(items)
            for i, lg in zip(live, logits, strict=True):
                self.dkv.commit(rids[i], ctx[i] + step)
                tok, q = self._pick(lg[-1])
                chains[i].append(tok)
                qs[i].append(q)
                lgs[i].append(lg[-1])
        return chains, qs, lgs

    def lookup(self, rids: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """Prompt lookup for each request: the tokens after the latest earlier occurrence of its last n-gram
        (n = 3, 2, 1), at most ``ks[i]`` of them; returns how many each proposes (0: no match)."""
        out = np.zeros(rids.size, dtype=np.int64)
        for i, (rid, k) in enumerate(zip(rids.tolist(), ks.tolist(), strict=True)):
            toks = self.tokens(rid)
            prop: list[int] = []
            for n in PLD_NGRAMS:
                if len(toks) <= n:
                    continue
                tail = toks[-n:]
                for s in range(len(toks) - n - 1, -1, -1):
                    if toks[s:s + n] == tail:
                        prop = toks[s + n: s + n + k]
                        break
                if prop:
                    break
            self.lookup_tokens[rid] = prop
            out[i] = len(prop)
        return out

    @property
    def drafter(self) -> RealDrafter:
        return RealDrafter(self)

    # ------------------------------------------------------------------------------------------------ step
    def run_step(self, s: RequestState, plan: StepPlan, prop: Proposer, pre: PrefillBatch,
                 dec: DecodeBatch) -> Executed:
        """Execute one checked step (module docstring); emit its tokens into the backend's token lists."""
        with self.torch.inference_mode():
            return self._run_step(s, plan, prop, pre, dec)

    def _run_step(self, s: RequestState, plan: StepPlan, prop: Proposer, pre: PrefillBatch,
                  dec: DecodeBatch) -> Executed:
        for rid in [*pre.ids.tolist(), *dec.ids.tolist()]:  # the target's cache never runs ahead of the engine
            c = int(s.num_computed[rid])
            if self.tkv.length(rid) > c:
                self.tkv.crop(rid, c)
            self.tokens(rid)  # a new request's prompt is made here, outside the step's measured time
        t0 = self._sync()
        draft_s = self.pending_draft_s
        self.pending_draft_s = 0.0
        trees = dec.trees or {}  # drafted by the policy's drafter while it scheduled the step
        spec = self._draft_step(s, plan, prop, pre, dec, trees)
        t1 = self._sync()
        if spec or plan.draft_sync:
            draft_s += t1 - t0
        items = self._target_items(s, pre, dec, trees, spec)
        logits = self.target.forward(items) if items else []
        t2 = self._sync()
        npre = pre.ids.size
        for j, rid in enumerate(pre.ids.tolist()):
            self.tkv.commit(rid, items[j].start + len(items[j].tokens))
            if pre.completes[j]:
                self.tokens(rid).append(self._sample(logits[j][-1]))
        proposed, accepted, matched, accept_prob = self._accept(s, dec, spec, logits[npre:], items[npre:])
        return Executed(draft_s=draft_s, verify_s=t2 - t1, proposed=proposed, accepted=accepted, matched=matched,
                        accept_prob=accept_prob, num_tokens=sum(len(it.tokens) for it in items))

    def _draft_step(self, s: RequestState, plan: StepPlan, prop: Proposer, pre: PrefillBatch, dec: DecodeBatch,
                    trees: Mapping[int, Any]) -> dict[int, _Spec]:
        """Draft the chains of the decoding requests without a tree (draft model or prompt lookup), by index in
        ``dec``; with ``plan.draft_sync`` the draft's caches then catch up with the target's."""
        n = dec.ids.size
        spec: dict[int, _Spec] = {}
        chain_i = [i for i in range(n) if dec.k[i] > 0 and int(dec.ids[i]) not in trees]
        if chain_i:
            rids = [int(dec.ids[i]) for i in chain_i]
            if prop.proposes_first:
                for i, rid in zip(chain_i, rids, strict=True):
                    toks = self.lookup_tokens.pop(rid, [])[: int(dec.k[i])]
                    spec[i] = (toks, list(range(-1, len(toks) - 1)), [None] * len(toks), [])
            else:
                if prop.which != "draft" or self.draft is None:
                    raise PlanError(f"backend=hf drafts with its draft model or prompt lookup, not {prop.name!r}"
                                    + ("" if self.draft is not None else " (no draft model configured)"))
                chains, qs, lgs = self.draft_chains(rids, [int(dec.k[i]) for i in chain_i])
                for i, toks, q, lg in zip(chain_i, chains, qs, lgs, strict=True):
                    spec[i] = (toks, list(range(-1, len(toks) - 1)), q, lg)
        if plan.draft_sync and self.draft is not None:  # keep the draft's cache in step with the target's
            sync = [int(r) for r in pre.ids.tolist()]
            ends = [int(s.num_computed[r] + t) for r, t in zip(pre.ids.tolist(), pre.tokens.tolist(), strict=True)]
            plain = [int(dec.ids[i]) for i in range(n) if i not in spec and int(dec.ids[i]) not in trees]
            if sync or plain:
                self.catch_up(sync + plain, ends + [len(self.tokens(r)) for r in plain])
        return spec

    def _target_items(self, s: RequestState, pre: PrefillBatch, dec: DecodeBatch, trees: Mapping[int, Any],
                      spec: dict[int, _Spec]) -> list[Item]:
        """The step's one target pass: each prefill chunk, then each decoding request's last token followed by its
        chain or tree (a tree's entry is added to ``spec``)."""
        torch = self.torch
        items: list[Item] = []
        dev = self.target.device
        for rid, chunk in zip(pre.ids.tolist(), pre.tokens.tolist(), strict=True):
            c = int(s.num_computed[rid])
            toks = self.tokens(rid)[c:c + chunk]
            items.append(Item(rid, c, toks, list(range(c, c + chunk)), chain_mask(torch, chunk, dev)))
        for i, rid in enumerate(dec.ids.tolist()):
            toks = self.tokens(rid)
            ctx = len(toks) - 1
            t = trees.get(rid)
            if t is not None:
                if t.cand.tokens is None:
                    raise PlanError(f"request {rid}: a tree from a simulated drafter has no tokens (backend=hf "
                                    "verifies trees its own view.drafter built)")
                nodes = np.sort(np.asarray(t.nodes, dtype=np.int64))
                where = {int(v): j for j, v in enumerate(nodes.tolist())}
                parents = [where[int(p)] if p >= 0 else -1 for p in t.cand.parent[nodes].tolist()]
                spec[i] = (t.cand.tokens[nodes].tolist(), parents, [None] * nodes.size, [])
            new, parents = spec[i][:2] if i in spec else ([], [])
            depth = [0]
            for p in parents:
                depth.append(depth[p + 1] + 1 if p >= 0 else 1)
            items.append(Item(rid, ctx, [toks[-1], *new], [ctx + d for d in depth], tree_mask(torch, parents, dev)))
        for it in items:
            if self.tkv.length(it.rid) != it.start:
                raise RuntimeError(f"backend=hf: request {it.rid}'s target cache holds {self.tkv.length(it.rid)} "
                                   f"tokens, its pass starts at {it.start}")
        return items

    def _accept(self, s: RequestState, dec: DecodeBatch, spec: Mapping[int, _Spec], logits: Sequence[Any],
                items: Sequence[Item]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Verify each decoding request's drafts against the target's ``logits``, keep the accepted path's KV and
        emit its tokens; returns (proposed, accepted, matched, accept_prob) per request."""
        n = dec.ids.size
        proposed = np.zeros(n, dtype=np.int64)
        accepted = np.zeros(n, dtype=np.int64)
        matched = np.zeros(n, dtype=np.int64)
        accept_prob = np.zeros(n)
        for i, rid in enumerate(dec.ids.tolist()):
            lg = logits[i]
            new, parents, qs, dlg = spec.get(i, ([], [], [], []))
            keep, out = self._verify(lg, new, parents, qs)
            acc = len(out) - 1
            proposed[i], accepted[i] = len(new), acc
            if new and all(p == j - 1 for j, p in enumerate(parents)):  # a chain: every position the target agrees
                am = lg[:-1].argmax(dim=-1).tolist()
                matched[i] = sum(int(a == b) for a, b in zip(am, new, strict=True))
                if dlg:
                    accept_prob[i] = self._accept_prob(lg, new, dlg)
            else:
                matched[i] = acc
            self.tkv.keep(rid, items[i].start, keep)
            self._emit(s, rid, out, acc, dlg)
        return proposed, accepted, matched, accept_prob

    def _emit(self, s: RequestState, rid: int, out: list[int], acc: int, dlg: list[Any]) -> None:
        """Append a verified request's tokens (as many as its output has left) and cut both caches back to what was
        emitted; tokens past the end are kept for the record."""
        toks = self.tokens(rid)
        remaining = int(s.output_len[rid] - s.num_generated[rid])
        emit = min(len(out), remaining)
        ctx = len(toks) - 1
        if self.record and dlg:  # the draft's distributions on the true context (positions of the kept path)
            for j in range(1, min(acc, len(dlg) - 1) + 1):
                self._record(rid, dlg[j][None], ctx + 1 + j)
        toks.extend(out[:emit])
        if emit < len(out):
            self.beyond[rid] = out[emit:]
        if self.tkv.length(rid) > ctx + emit:  # a capped last step keeps only what was emitted
            self.tkv.crop(rid, ctx + emit)
        limit = ctx + 1 + min(acc, emit)  # the draft keeps true, emitted tokens only (d_1..d_j with j <= both)
        if self.dkv.length(rid) > limit:
            self.dkv.crop(rid, limit)

    def _sample(self, logits: Any) -> int:
        if self.temperature > 0:
            p = self.torch.softmax(logits / self.temperature, dim=-1).cpu()
            return int(self.torch.multinomial(p, 1, generator=self.gen))
        return int(logits.argmax())

    def _accept_prob(self, lg: Any, new: list[int], dlg: list[Any]) -> float:
        """Σ_j min(1, p_j(d_j) / q_j(d_j)) over the drafted chain (GoodSpeed Eq. 3), at temperature 1."""
        torch = self.torch
        p = torch.softmax(lg[: len(new)], dim=-1)
        q = torch.softmax(torch.stack(dlg[: len(new)]), dim=-1)
        d = torch.tensor(new, device=p.device)[:, None]
        return float(torch.clamp(p.gather(1, d) / q.gather(1, d), max=1.0).sum())

    def _verify(self, lg: Any, new: list[int], parents: list[int], qs: list[Any]) -> tuple[list[int], list[int]]:
        """Walk the drafted tree from the root (row 0 of ``lg``): the rows whose KV is kept (root + accepted path)
        and the tokens emitted (accepted drafts + the target's next token). Greedy: follow the child that is the
        target's argmax. At temperature (chains): speculative sampling, accept d with probability min(1, p(d)/q(d))
        (a copied prompt-lookup token is a point mass, q(d) = 1), else sample norm(max(0, p - q)) and stop."""
        torch = self.torch
        children: dict[int, list[int]] = {}
        for j, p in enumerate(parents):
            children.setdefault(p, []).append(j)
        keep, out, cur = [0], [], -1
        while True:
            row = lg[cur + 1]
            kids = children.get(cur, [])
            if self.temperature <= 0 or not kids:
                want = self._sample(row)
                out.append(want)
                nxt = next((j for j in kids if new[j] == want), None)
                if nxt is None:
                    return keep, out
                keep.append(nxt + 1)
                cur = nxt
                continue
            if len(kids) > 1:
                raise PlanError("backend=hf verifies trees greedily only (set backend.temperature=0)")
            j = kids[0]
            d = new[j]
            p = torch.softmax(row / self.temperature, dim=-1)
            q = qs[j]
            if q is None:
                q = torch.zeros_like(p)
                q[d] = 1.0
            if float(torch.rand(1, generator=self.gen)) < min(1.0, float(p[d] / q[d])):
                keep.append(j + 1)
                out.append(d)
                cur = j
                continue
            resid = torch.clamp(p - q, min=0.0)
            resid = resid if float(resid.sum()) > 0 else p
            out.append(int(torch.multinomial((resid / resid.sum()).cpu(), 1, generator=self.gen)))
            return keep, out

    # ------------------------------------------------------------------------------------------ recording
    def records_frame(self) -> pd.DataFrame:
        """One row per (request, output position) where the draft's distribution on the true context and the
        target's token are both known: ``rid, pos, rank`` (of the target's token among the draft's top w; ``w`` if
        not among them), ``p0`` (the draft's top-1 probability), ``target_token``, ``top_tokens`` and ``top_probs``
        (the draft's top w)."""
        import pandas as pd

        rows = []
        for rid, store in sorted(self.rec.items()):
            truth = self.output_tokens(rid) + self.beyond.get(rid, [])
            for t, (ids, vals) in sorted(store.items()):
                if t >= len(truth):
                    continue
                hit = np.flatnonzero(ids == truth[t])
                rows.append((rid, t, int(hit[0]) if hit.size else ids.size, float(vals[0]), truth[t], ids.tolist(),
                             vals.tolist()))
        return pd.DataFrame(rows, columns=["rid", "pos", "rank", "p0", "target_token", "top_tokens", "top_probs"])


class RealDrafter:
    """``view.drafter`` on the real draft model: candidate trees with their token ids (module docstring). Time spent
    here is charged to the step being scheduled."""

    __slots__ = ("_b",)

    def __init__(self, backend: HfBackend) -> None:
        self._b = backend

    @property
    def max_width(self) -> int:
        return self._b.max_width

    def _check(self, proposer: Any) -> None:
        name = proposer if isinstance(proposer, str) else getattr(proposer, "which", None)
        if name != "draft" or self._b.draft is None:
            raise PlanError(f"backend=hf draws candidate trees from its draft model only (asked: {proposer!r})")

    def _expand(self, rids: Sequence[int], layer_width: Any, per_parent: Any, depth: int) -> list[CandidateTree]:
        """Grow trees layer by layer; ``per_parent(i)`` children are drawn per node of layer i - 1 and
        ``layer_width(i)`` (None: all) of them kept by path probability."""
        with self._b.torch.inference_mode():
            return self._expand_trees(rids, layer_width, per_parent, depth)

    def _expand_trees(self, rids: Sequence[int], layer_width: Any, per_parent: Any,
                      depth: int) -> list[CandidateTree]:
        b = self._b
        torch = b.torch
        assert b.draft is not None
        t0 = b._sync()
        ctx = [len(b.tokens(r)) for r in rids]
        roots = b.catch_up(rids, ctx)
        trees: list[dict[str, list[Any]]] = []
        for root in roots:
            tr: dict[str, list[Any]] = {k: [] for k in ("parent", "depth", "rank", "prob", "pp", "tok")}
            trees.append(tr)
            self._grow(tr, [root], [-1], [1.0], 1, per_parent(1), layer_width(1))
        for i in range(2, depth + 1):
            items, last = [], []
            for r, c, tr in zip(rids, ctx, trees, strict=True):
                par = tr["parent"]
                items.append(Item(r, b.dkv.length(r), list(tr["tok"]), [c + d - 1 for d in tr["depth"]],
                                  tree_mask(torch, par, b.draft.device)[1:, 1:]))
                last.append([j for j, d in enumerate(tr["depth"]) if d == i - 1])
            logits = b.draft.forward(items)
            for tr, lg, prev in zip(trees, logits, last, strict=True):
                self._grow(tr, [lg[j] for j in prev], prev, [tr["pp"][j] for j in prev], i, per_parent(i),
                           layer_width(i))
        b.pending_draft_s += b._sync() - t0
        out = []
        for r, c, tr in zip(rids, ctx, trees, strict=True):
            arr = {k: np.asarray(v) for k, v in tr.items()}
            widest = int(np.bincount(arr["depth"]).max())
            out.append(CandidateTree(int(r), c - int(b.prompt_len[r]), arr["parent"].astype(np.int64),
                                     arr["depth"].astype(np.int64), arr["rank"].astype(np.int64),
                                     arr["prob"].astype(np.float64), arr["pp"].astype(np.float64), depth, widest,
                                     tokens=arr["tok"].astype(np.int64)))
        return out

    def _grow(self, tr: dict[str, list[Any]], rows: list[Any], parents: list[int], pps: list[float], depth: int,
              k: int, keep: int | None) -> None:
        torch = self._b.torch
        cand = []
        for row, par, pp in zip(rows, parents, pps, strict=True):
            top = torch.topk(torch.softmax(row, dim=-1), k)
            for rank, (p, tok) in enumerate(zip(top.values.tolist(), top.indices.tolist(), strict=True)):
                cand.append((pp * p, par, rank, p, tok))
        order = sorted(range(len(cand)), key=lambda j: -cand[j][0])[: keep or len(cand)]
        for j in sorted(order):  # BFS: parent-major, then rank
            pp, par, rank, p, tok = cand[j]
            for key, v in zip(("parent", "depth", "rank", "prob", "pp", "tok"), (par, depth, rank, p, pp, tok),
                              strict=True):
                tr[key].append(v)

    def candidates(self, rid: int, pos: int, depth: int, width: int, proposer: Any = "draft") -> CandidateTree:
        return self.candidates_batch(np.array([rid]), np.array([pos]), depth, width, proposer)[0]

    def candidates_batch(self, rids: np.ndarray, pos: np.ndarray, depth: int, width: int,
                         proposer: Any = "draft") -> list[CandidateTree]:
        """AdaServe §4.3 Step 1 beam search: each layer keeps the ``width`` most probable paths."""
        self._check(proposer)
        return self._expand([int(r) for r in np.asarray(rids).reshape(-1)], lambda i: width, lambda i: width, depth)

    def expansion_batch(self, rids: np.ndarray, pos: np.ndarray, expansion: tuple[int, ...],
                        proposer: Any = "draft") -> list[CandidateTree]:
        """SpecInfer's fixed expansion: every node of layer i − 1 keeps its own ``expansion[i-1]`` top children."""
        self._check(proposer)
        exp = tuple(int(k) for k in expansion)
        return self._expand([int(r) for r in np.asarray(rids).reshape(-1)], lambda i: None, lambda i: exp[i - 1],
                            len(exp))

    def chain_probs(self, rid: int, pos: int, k: int, proposer: Any = "draft") -> np.ndarray:
        return self.chain_probs_batch(np.array([rid]), np.array([pos]), k, proposer)[0]

    def chain_probs_batch(self, rids: np.ndarray, pos: np.ndarray, k: int, proposer: Any = "draft") -> np.ndarray:
        rids = np.asarray(rids).reshape(-1)
        if k <= 0:
            return np.zeros((rids.size, 0))
        return np.stack([t.prob for t in self.candidates_batch(rids, pos, k, 1, proposer)])
