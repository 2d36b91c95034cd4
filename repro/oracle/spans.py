"""Acceptance spans: a stream whose acceptance is, per request and output position i, the span s[r, i] = the tokens
a verify step starting at i emits given enough drafts (accepted drafts + the bonus token, s >= 1).

Chain scoring with k drafts at position i: proposed k, accepted min(s − 1, k) (so emitted min(s, k + 1)), matched =
accepted (a span says nothing about positions after the first rejection). Chains only: a span holds no draft
distribution, so trees, beams and Σ p/q are refused.

Prompt lookup proposes only where the context's last ``prompt_lookup_min`` tokens occurred earlier in it (vLLM's
n-gram proposer: the longest suffix of ``prompt_lookup_min``..``prompt_lookup_max`` tokens that matches; any longer
match contains the shortest one, so the shortest decides whether there is one). A recorded file's token ids say where
(:func:`lookup_matches`); a step at a position without a match proposes nothing and verifies only its own token. In
SpecDecode-Bench's n-gram spans every position without such a match has a span of 1 (checked over all four files).
Drawn spans then take, per dataset, the fraction p(k) of a chain-k run's steps that find a match (``match``: a list
over k = 1..K) and mean acceptance lengths over those steps: a step at a position matches with probability p(k) and
then draws its span from the curve; otherwise it proposes nothing.

Two sources of spans:

- **recorded** (:func:`read_span_file`): a JSONL file, one record per request, ``prompt_token_ids``,
  ``generated_token_ids`` and per proposer a field ``{"acc_len": [...]}`` (docs/data.md, "Acceptance-span files").
  Request r replays the record its prompt came from (the workload says which: ``RequestTable.record``), so copies of
  one prompt (greedy twins) accept the same. Or, for prompt lookup, spans **computed** from the same record's token
  ids under another version's proposal rule (``proposal: vllm_v0_ngram``: vLLM 0.6's n-gram proposer,
  :func:`ngram_v0_spans`): under greedy decoding the target's output is the recorded one, so a proposal's acceptance
  is exact.
- **measured mean acceptance lengths** L(1..K) (vLLM's 1 + accepted / drafting steps at k = 1..K): per position
  s − 1 = A is drawn i.i.d. with P(A >= j) = L(j) − L(j − 1), L(0) = 1, A <= K, seeded by (seed, stream key, span
  key, chunk) like every stream's common random numbers, the span key being the request's prompt (copies share it).
  A chain of k <= K drafts then accepts min(A, k) and emits L(k) per step in expectation:
  E[min(A, k)] = Σ_{j<=k} P(A >= j) = L(k) − 1. k > K is refused.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from repro.core.seeding import Seeder
from repro.oracle.store import _CHUNK_KEY, CHUNK, _ChunkStore

_SPAN_MAX = 2**15 - 1
_RUN = 16  # the proposed tokens compared at once (ngram_v0_spans)

#: Where a span stream's spans come from (``oracle.spans.<stream>.proposal``): the file's recorded ``field`` spans,
#: or those of vLLM 0.6's n-gram proposal computed from the file's token ids (:func:`ngram_v0_spans`).
PROPOSALS = ("recorded", "vllm_v0_ngram")


def measured_pmf(curve: Sequence[float], what: str) -> np.ndarray:
    """The distribution of A = s − 1 over 0..K from mean acceptance lengths L(1..K): P(A >= j) = L(j) − L(j − 1).

    Refuses a curve that is not a valid one (L(1) in [1, 2], increments non-increasing and in [0, 1])."""
    lengths = np.asarray([float(x) for x in curve], dtype=np.float64)
    if lengths.ndim != 1 or lengths.size == 0:
        raise ValueError(f"{what}: mean acceptance lengths must be a non-empty list [L(1), ..., L(K)]")
    tail = np.diff(np.concatenate([[1.0], lengths]))  # P(A >= j), j = 1..K
    if (tail < -1e-9).any() or (tail > 1 + 1e-9).any() or (np.diff(tail) > 1e-9).any():
        raise ValueError(f"{what}: {lengths.tolist()} is not a mean-acceptance-length curve (need L(1) in [1, 2] "
                         "and increments L(j) - L(j-1) in [0, 1], non-increasing in j)")
    tail = np.clip(tail, 0.0, 1.0)
    ge = np.concatenate([[1.0], tail, [0.0]])  # P(A >= j), j = 0..K+1
    return np.maximum(ge[:-1] - ge[1:], 0.0)


def lookup_matches(prompt: Sequence[int], generated: Sequence[int], min_n: int) -> np.ndarray:
    """Per output position i, whether the context (``prompt`` + ``generated[:i]``) ends in ``min_n`` tokens that
    occurred earlier in it (starting before the suffix itself): where vLLM's n-gram proposer finds a match."""
    tokens = [*prompt, *generated]
    p = len(prompt)
    seen: set[tuple[int, ...]] = set()
    out = np.zeros(len(generated), dtype=bool)
    for c in range(min_n, len(tokens)):
        j = c - min_n - 1  # the n-gram starting at j ends before the suffix's last token: an earlier occurrence
        if j >= 0:
            seen.add(tuple(tokens[j:j + min_n]))
        if c >= p:
            out[c - p] = tuple(tokens[c - min_n:c]) in seen
    return out


def ngram_v0_spans(prompt: Sequence[int], generated: Sequence[int], min_n: int, max_n: int,
                   k_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per output position i, the span of vLLM 0.6's n-gram proposal and whether it proposes: ``(spans, proposes)``.

    The rule is vLLM 0.6.3's ``NGramWorker.sampler_output`` (``vllm/spec_decode/ngram_worker.py``, with
    ``ngram_prompt_lookup_min`` = ``min_n``, default 1 in ``config.py``, and ``ngram_prompt_lookup_max`` = ``max_n``).
    A step at output position i sees the token list ``prompt + generated[:i]`` (length c; vLLM's
    ``seq_data.get_token_ids()``, the prompt and the output so far) and:

    - tries n = min(``max_n``, c − 1) down to ``min_n`` and stops at the first n whose last-n-token suffix occurs
      earlier: an occurrence starting at j <= c − n − 1 (``windows[:-1]`` drops only the suffix itself, so an
      occurrence may overlap it); the longest matching n thus wins, a shorter one is never tried after it;
    - takes the EARLIEST such occurrence j (``matches.max(dim=-1)``: the first index of the maximum) and proposes the
      k tokens from j + n on, the indices clamped to c − 1 (``spec_indices.clamp_(max=len - 1)``): where fewer than k
      tokens follow the match, the proposal repeats the context's last token. It therefore always proposes exactly k
      tokens (Top1Proposer supports proposal lengths 0 or k only), and the first k of a longer proposal are the
      k-token one: one span serves every k;
    - proposes nothing where no n in ``min_n``..``max_n`` matches (the step verifies only its own token).

    Greedy decoding makes the target's output the recorded ``generated``: accepted = the leading proposed tokens equal
    to ``generated[i], generated[i + 1], ...``, and span = accepted + 1 (so a step of k <= ``k_max`` drafts emits
    min(span, k + 1)), cut at the tokens left (``len(generated) − i``); 1 where it proposes nothing. ``k_max`` (None:
    no limit) caps the proposal, so spans are exact for chains of at most ``k_max`` drafts.

    One pass per n: each n-gram's earliest start over the whole token list (an occurrence earlier than a position's
    suffix is earlier than the suffix in any later context too), so no position rescans its context."""
    if isinstance(min_n, bool) or isinstance(max_n, bool) or not 1 <= int(min_n) <= int(max_n):
        raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n (got min_n={min_n}, max_n={max_n})")
    if k_max is not None and int(k_max) < 1:
        raise ValueError(f"k_max must be >= 1 or None (got {k_max})")
    p, g = len(prompt), len(generated)
    tokens = np.asarray([*prompt, *generated], dtype=np.int64).reshape(-1)
    spans = np.ones(g, dtype=np.int64)
    start = np.full(g, -1, dtype=np.int64)  # where position i's proposal starts (j + n), -1: no proposal
    ctx = p + np.arange(g, dtype=np.int64)  # the context's length c at each output position
    # gram[w]: an id of the n-gram tokens[w:w + n] (equal ids: equal n-grams), built n after n from the (n - 1)-gram's
    # id and the next token's
    _, unigram = np.unique(tokens, return_inverse=True)
    unigram = unigram.reshape(-1).astype(np.int64)
    gram = unigram
    for n in range(1, int(max_n) + 1):  # ascending: a longer match overrides (vLLM tries the longest first)
        if tokens.size < n:
            break
        if n > 1:
            _, gram = np.unique(gram[:-1] * (int(unigram.max()) + 1) + unigram[n - 1:], return_inverse=True)
            gram = gram.reshape(-1).astype(np.int64)
        if n < min_n:
            continue
        _, first, inverse = np.unique(gram, return_index=True, return_inverse=True)
        earliest = first[inverse.reshape(-1)]  # per window, the start of its n-gram's earliest occurrence
        suffix = ctx - n  # the window holding each context's last n tokens
        valid = suffix >= 0
        j = np.where(valid, earliest[np.maximum(suffix, 0)], -1)
        hit = valid & (j < suffix)  # an occurrence before the suffix itself
        start[hit] = j[hit] + n
    # accepted: the leading proposed tokens equal to the output's, compared _RUN at a time for every proposing
    # position still matching
    at = np.flatnonzero(start >= 0)
    q, last, left = start[at], p + at - 1, g - at
    lim = left if k_max is None else np.minimum(left, int(k_max))
    accepted = np.zeros(at.size, dtype=np.int64)
    live = np.arange(at.size)
    while live.size:
        t = accepted[live, None] + np.arange(_RUN)
        proposed = tokens[np.minimum(q[live, None] + t, last[live, None])]  # clamped: the last token repeats
        ok = (t < lim[live, None]) & (proposed == tokens[np.minimum(p + at[live, None] + t, tokens.size - 1)])
        run = np.where(ok.all(axis=1), _RUN, ok.argmin(axis=1))
        accepted[live] += run
        live = live[run == _RUN]
    spans[at] = np.minimum(accepted + 1, left)
    return spans, start >= 0


@dataclass(frozen=True)
class NgramV0:
    """vLLM 0.6's n-gram proposal rule (:func:`ngram_v0_spans`): its smallest and largest n-gram and the drafts its
    spans are computed for (None: any number)."""

    min_n: int
    max_n: int
    k_max: int | None = None


def span_rule(node: Mapping[str, Any], where: str) -> NgramV0 | None:
    """The proposal rule of a span stream's config ``node`` (``where``: how to name it, ``oracle.spans.pld``): None
    for the recorded spans (``proposal: recorded``, the default), else :class:`NgramV0` from ``prompt_lookup_min``
    (default 1, vLLM 0.6.3's), ``prompt_lookup_max`` (required, as in vLLM) and ``num_speculative_tokens`` (optional:
    chains of more drafts are then refused). Errors are one line naming the key."""
    proposal = node.get("proposal")
    proposal = "recorded" if proposal is None else proposal
    if not isinstance(proposal, str) or proposal not in PROPOSALS:
        raise ValueError(f"{where}.proposal: {proposal!r} is not a proposal rule (known: {', '.join(PROPOSALS)})")
    if proposal == "recorded":
        for key in ("prompt_lookup_max", "num_speculative_tokens"):
            if node.get(key) is not None:
                raise ValueError(f"{where}.{key}: read only with {where}.proposal: vllm_v0_ngram (recorded spans "
                                 "propose where prompt_lookup_min tokens match)")
        return None

    def whole(key: str, default: int | None, lo: int) -> int | None:
        v = node.get(key)
        if v is None:
            if default is None and key == "prompt_lookup_max":
                raise ValueError(f"{where}.{key}: required with proposal: vllm_v0_ngram (the largest n-gram, e.g. 4)")
            return default
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < lo:
            raise ValueError(f"{where}.{key}: {v!r} must be an integer >= {lo}")
        return int(v)

    lo = whole("prompt_lookup_min", 1, 1)
    hi = whole("prompt_lookup_max", None, 1)
    assert lo is not None and hi is not None
    if lo > hi:
        raise ValueError(f"{where}.prompt_lookup_min: {lo} is larger than prompt_lookup_max {hi}")
    return NgramV0(lo, hi, whole("num_speculative_tokens", None, 1))


@dataclass(frozen=True)
class SpanFile:
    """A span file's records: each one's ``field`` spans (empty without a field; computed ones under a proposal
    rule), prompt length, output length (the shortest of ``generated_token_ids`` and every ``acc_*`` span list it
    holds), the file's ``model`` (None where the records carry none) and, when asked for, where prompt lookup finds a
    match (:func:`lookup_matches`) or the rule proposes."""

    spans: list[np.ndarray]
    prompt_len: np.ndarray
    output_len: np.ndarray
    model: str | None
    proposes: list[np.ndarray] | None = None


@functools.lru_cache(maxsize=16)
def read_span_file(path: str, field: str | None, shown: str | None = None,
                   lookup_min: int | None = None, rule: NgramV0 | None = None) -> SpanFile:
    """Read the JSONL span file ``path`` (docs/data.md, "Acceptance-span files"); ``field``: the proposer's span
    list to keep (``acc_eagle``; None: lengths only); ``lookup_min``: also find prompt lookup's matches with that
    smallest n-gram; ``rule`` (with neither of them): the spans and proposing positions of vLLM 0.6's n-gram
    proposal computed from each record's token ids (:func:`ngram_v0_spans`). Errors are one line naming the file
    (``shown``: how to name it)."""
    if rule is not None and (field is not None or lookup_min is not None):
        raise ValueError("read_span_file: a proposal rule computes its own spans and matches (no field, no "
                         "lookup_min)")
    name = shown or str(path)
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"acceptance-span file {name} not found: provide a JSONL file with one record per "
                                "request {prompt_token_ids, generated_token_ids, <field>: {acc_len}} (docs/data.md)")
    spans: list[np.ndarray] = []
    proposes: list[np.ndarray] = []
    prompt: list[int] = []
    out_len: list[int] = []
    models: set[str] = set()
    with p.open() as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                lens = [len(rec["generated_token_ids"])] + [
                    len(v["acc_len"] if isinstance(v, Mapping) else v) for k, v in rec.items() if k.startswith("acc_")]
                prompt.append(len(rec["prompt_token_ids"]))
                if field is not None:
                    acc = rec[field]["acc_len"] if isinstance(rec[field], Mapping) else rec[field]
                    s = np.asarray(acc, dtype=np.int64)
                    if s.size and int(s.min()) < 1:
                        raise ValueError("spans must be >= 1 (a verify step emits at least its bonus token)")
                    spans.append(np.minimum(s, _SPAN_MAX).astype(np.int16))
                if lookup_min is not None:
                    proposes.append(lookup_matches(rec["prompt_token_ids"], rec["generated_token_ids"], lookup_min))
                if rule is not None:
                    s, fl = ngram_v0_spans(rec["prompt_token_ids"], rec["generated_token_ids"], rule.min_n,
                                           rule.max_n, rule.k_max)
                    spans.append(np.minimum(s, _SPAN_MAX).astype(np.int16))
                    proposes.append(fl)
            except (KeyError, TypeError, ValueError) as exc:
                want = f"{{{field}: {{acc_len: [...]}}}}" if field else "prompt_token_ids and generated_token_ids"
                raise ValueError(f"acceptance-span file {name}, line {line_no}: {type(exc).__name__}: {exc} "
                                 f"(expected {want})") from None
            out_len.append(min(lens))
            if rec.get("model"):
                models.add(str(rec["model"]))
    if not prompt:
        raise ValueError(f"acceptance-span file {name} holds no records")
    if len(models) > 1:
        raise ValueError(f"acceptance-span file {name} mixes models {sorted(models)}")
    return SpanFile(spans, np.asarray(prompt, dtype=np.int64), np.asarray(out_len, dtype=np.int64),
                    models.pop() if models else None,
                    proposes if lookup_min is not None or rule is not None else None)


class _SpanStream:
    """Acceptance spans of one stream over all requests (module docstring): recorded per request, or drawn from a
    measured L(1..K) per request's dataset."""

    def __init__(self, name: str, key: int, base: np.random.SeedSequence, *, span_key: np.ndarray,
                 recorded: Sequence[np.ndarray | None] | None = None,
                 pmf: Sequence[np.ndarray | None] | None = None,
                 proposes: Sequence[np.ndarray | None] | None = None,
                 match: Sequence[np.ndarray | None] | None = None, limit: int | None = None) -> None:
        """``limit``: the most drafts the recorded spans were computed for (a proposal rule's
        ``num_speculative_tokens``; None: any number)."""
        n = span_key.shape[0]
        self.name = name
        # where a request's proposer offers drafts at all (prompt lookup's matches): recorded flags, or for drawn
        # spans the fraction of a chain-k run's steps that match, per k (None: everywhere)
        self._proposes = list(proposes) if proposes is not None else [None] * n
        self._match = list(match) if match is not None else [None] * n
        self.conditional = any(x is not None for x in (*self._proposes, *self._match))
        self._span_key = np.asarray(span_key, dtype=np.int64)
        self._recorded = list(recorded) if recorded is not None else [None] * n
        self._pmf: list[np.ndarray | None] = list(pmf) if pmf is not None else [None] * n
        for r in range(n):
            if self._recorded[r] is None and self._pmf[r] is None:
                raise ValueError(f"oracle stream {name!r}: request {r} has no span source")
        for r in range(n):
            p, q = self._match[r], self._pmf[r]
            if p is not None and (q is None or p.size != q.size - 1 or (p < 0).any() or (p > 1).any()):
                raise ValueError(f"oracle stream {name!r}: request {r}'s match fractions must be one per k of its "
                                 "curve, each in [0, 1]")
        # per request and k - 1, the drawn spans' match fraction (NaN: recorded flags or no match model), so a step
        # scores every request at once
        width = max((p.size for p in self._match if p is not None), default=0)
        self._match_tab = np.full((n, max(width, 1)), np.nan)
        for r, p in enumerate(self._match):
            if p is not None:
                self._match_tab[r, :p.size] = p
        self._cdf = [None if q is None else np.cumsum(q) for q in self._pmf]
        #: the largest chain each request's source scores (K of its measured curve; recorded: ``limit``, else none)
        self._limit = limit
        no_limit = np.iinfo(np.int64).max if limit is None else int(limit)
        self.max_k = np.array([no_limit if q is None else q.size - 1 for q in self._pmf], dtype=np.int64)
        self._seeds = Seeder(base, (key, _CHUNK_KEY), int(self._span_key.max(initial=0)) + 1)
        self.store = _ChunkStore(n, {"span": ((), np.int16), "proposes": ((), np.bool_), "u": ((), np.float64)},
                                 self._fill)

    def _fill(self, rid: int, chunk: int) -> dict[str, np.ndarray]:
        rec, flags = self._recorded[rid], self._proposes[rid]
        lo, hi = chunk * CHUNK, (chunk + 1) * CHUNK
        if rec is not None:  # past the record (never read below the request's output length): one token a step
            out = np.ones(CHUNK, dtype=np.int16)
            part = rec[lo:hi]
            out[:part.size] = part
            prop = np.ones(CHUNK, dtype=bool)
            if flags is not None:
                prop[:] = False
                prop[:flags[lo:hi].size] = flags[lo:hi]
            return {"span": out, "proposes": prop, "u": np.zeros(CHUNK)}
        cdf = self._cdf[rid]
        assert cdf is not None
        rng = self._seeds.generator(int(self._span_key[rid]), chunk)
        u = rng.random(CHUNK)
        a = np.minimum(np.searchsorted(cdf, u, side="right"), cdf.size - 1)  # A with P(A = j) = pmf[j]
        ones = np.ones(CHUNK, dtype=bool)
        if self._match[rid] is None:
            return {"span": (a + 1).astype(np.int16), "proposes": ones, "u": np.zeros(CHUNK)}
        return {"span": (a + 1).astype(np.int16), "proposes": ones, "u": rng.random(CHUNK)}  # matches: u < p(k)

    def _check_k(self, rids: np.ndarray, k: np.ndarray) -> None:
        over = k > self.max_k[rids]
        if over.any():
            i = int(np.flatnonzero(over)[0])
            if self._pmf[int(rids[i])] is None:
                raise ValueError(f"oracle stream {self.name!r}: a chain of {int(k[i])} drafts for request "
                                 f"{int(rids[i])}, but its spans were computed for at most {self._limit} drafts "
                                 f"(oracle.spans.{self.name}.num_speculative_tokens)")
            raise ValueError(f"oracle stream {self.name!r}: a chain of {int(k[i])} drafts for request {int(rids[i])}, "
                             f"but its measured mean acceptance lengths go to k = {int(self.max_k[rids[i]])} only")

    def score_chain(self, rids: np.ndarray, pos: np.ndarray,
                    k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Proposed = k (0 where the proposer finds no match), accepted = matched = min(s − 1, proposed) at each
        request's position."""
        if not k.size or not k.any():
            return k.copy(), np.zeros_like(k), np.zeros_like(k)
        self._check_k(rids, k)
        idx = self.store.locate(rids, pos)  # may grow the pools: index them afterwards
        s = self.store.pools["span"][idx].astype(np.int64)
        if self.conditional:
            pools = self.store.pools
            p = self._match_tab[rids, np.clip(k - 1, 0, self._match_tab.shape[1] - 1)]
            drawn = ~np.isnan(p)  # drawn spans: a match with probability p(k); recorded: the flags
            ok = np.where(drawn, (pools["u"][idx] < np.where(drawn, p, 0.0)) & (k > 0), pools["proposes"][idx])
            proposed = np.where(ok, k, 0)
        else:
            proposed = k.copy()
        accepted = np.minimum(s - 1, proposed)
        return proposed, accepted, accepted.copy()

    def chain_run(self, rids: np.ndarray, pos: np.ndarray, k: int, steps: int,
                  end: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`score_chain` for ``steps`` successive steps of ``k`` drafts each, each starting after the previous
        one's accepted + 1 tokens: (accepted, matched), each (steps, requests). Reads at or past ``end`` are clamped
        to its last position (their values are meaningless once a step would read them)."""
        if self.conditional:
            raise ValueError(f"oracle stream {self.name!r} proposes only where prompt lookup matches: its steps are "
                             "not run ahead (score them one by one)")
        self._check_k(rids, np.full(rids.shape, k, dtype=np.int64))
        last = None if end is None else np.maximum(np.maximum(end, pos + 1) - 1, pos)
        acc = np.empty((steps, rids.size), dtype=np.int64)
        p = pos.copy()
        spans = self.store.pools
        for t in range(steps):
            at = p if last is None else np.minimum(p, last)
            idx = self.store.locate(rids, at)  # may grow the pools: index them afterwards
            acc[t] = np.minimum(spans["span"][idx].astype(np.int64) - 1, k)
            p = p + acc[t] + 1
        return acc, acc.copy()


def recorded_for(spans: list[np.ndarray], record: np.ndarray, output_len: np.ndarray, name: str,
                 stream: str) -> list[np.ndarray | None]:
    """Each request's recorded spans (``None`` where ``record`` is -1), checking that its record covers its output."""
    got: list[np.ndarray | None] = []
    for r, (rec, need) in enumerate(zip(record.tolist(), output_len.tolist(), strict=True)):
        if rec < 0:
            got.append(None)
            continue
        if rec >= len(spans):
            raise ValueError(f"acceptance-span file {name}: request {r} replays record {rec}, the file has "
                             f"{len(spans)}")
        if spans[rec].size < need:
            raise ValueError(f"acceptance-span file {name}: request {r} (record {rec}) generates {need} tokens but "
                             f"the trace's {stream!r} spans cover {spans[rec].size}: give the request an output of at "
                             f"most {spans[rec].size} tokens or a longer trace")
        got.append(spans[rec])
    return got


def stand_in_check(recorded_model: str | None, cfg: Mapping[str, Any], target: str, name: str) -> None:
    """A trace recorded for another model than the run's ``target`` is refused, unless ``cfg.stands_in_for`` names
    the target (a trace standing in for it, e.g. prompt lookup's spans across a model family)."""
    model = recorded_model or cfg.get("model")
    if model is None:
        raise ValueError(f"acceptance-span file {name} names no model: set oracle.spans.<stream>.model to the model "
                         "it was recorded with")
    ok = {str(model)} | {str(m) for m in _as_list(cfg.get("stands_in_for"))}
    if target not in ok:
        raise ValueError(f"acceptance-span file {name} was recorded with {model!r}, not the run's target {target!r} "
                         f"(set oracle.spans.<stream>.stands_in_for: [{target}] if it stands in for it)")


def _as_list(v: Any) -> list[Any]:
    if v is None:
        return []
    return [v] if isinstance(v, str) else list(v)
