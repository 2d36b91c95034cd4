"""The oracle's handles: :class:`TokenOracle`, which the engine scores steps with, and :class:`Drafter`, a policy's
view of it (reported probabilities, never true ranks).

Every method that scores or drafts takes a stream name or a proposer object (its ``stream`` is used): ``"draft"``
(the pair's table), ``"eagle"`` (the EAGLE table), ``"pld"`` (prompt lookup) or one added with
:meth:`TokenOracle.add_stream` (a remote draft server running another draft model, GoodSpeed).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from repro.core import jit
from repro.core.errors import MissingTableError
from repro.core.speculation import DRAFT, EAGLE, PLD, CandidateTree, TreeSpec
from repro.oracle.distributions import _check_mean, _check_mean_of, _drift_arrays, _per_request
from repro.oracle.spans import _SpanStream, measured_pmf, read_span_file, recorded_for, span_rule, stand_in_check
from repro.oracle.store import _AR, DRAFT_KEY, EAGLE_KEY, MAX_WIDTH, PLD_KEY, _as_seed_seq
from repro.oracle.streams import _PldStream, _TokenStream, _TraceStream

_STREAM_KEYS = {DRAFT: DRAFT_KEY, EAGLE: EAGLE_KEY, PLD: PLD_KEY}

if TYPE_CHECKING:
    from repro.core.speculation import HasStream


def _positions(pos: np.ndarray, depth: int) -> np.ndarray:
    """Validated int64 start positions for a lookahead of ``depth`` tokens."""
    pos = np.asarray(pos, dtype=np.int64).reshape(-1)
    if not 1 <= depth < _AR.size or (pos.size and int(pos.min()) < 0):
        raise ValueError(f"depth must lie in 1..{_AR.size - 1} and positions be >= 0")
    return pos


#: The key of a recording's own description in its parquet metadata (``DataFrame.attrs``): target, draft, datasets,
#: each recorded request's output length, the recorded width (:meth:`repro.backends.hf.HfBackend.records_frame`).
RECORDING_META = "specrepro_recording"


class TokenOracle:
    """Acceptance ground truth with common random numbers (the model: :mod:`repro.oracle`).

    ``dataset`` holds each request's dataset name (index = request id). ``accept_mean`` maps dataset → mean
    per-token acceptance of the configured (draft, target) pair; a ``"default"`` key or ``default_accept``
    covers datasets not listed (otherwise ``KeyError`` naming the dataset and ``pair``); an empty table
    without default means no draft model (using the ``"draft"`` proposer then raises). ``eagle_accept_mean``
    is the same for an EAGLE head; ``pld`` maps dataset → ``{match, accept, match_len}`` (the ``"default"``
    entry is merged under each). ``width`` = W, the number of draft ranks modelled per position; ``spread`` =
    standard deviation of the per-request level; ``pos_concentration`` = κ_pos of the per-position Beta;
    ``decay`` = ratio of successive lower-rank probabilities; ``confidence`` = γ; ``drift`` = one shape
    (``{a0, tau[, a0_spread]}``: a start around the absolute mean a0, or ``{offset, tau[, offset_spread]}``: a start
    ``offset`` below the request's own level) for every dataset, or a table dataset → shape (or ``None``: no drift;
    a ``"default"`` key covers datasets not listed, which otherwise do not drift), or ``None``.

    A table (draft or EAGLE) whose entries are lists holds measured mean acceptance lengths [L(1), ..., L(K)] per
    dataset instead: the stream then draws acceptance spans (:mod:`repro.oracle.spans`), keyed per request by
    ``span_key`` (its prompt: copies of one prompt accept the same; default: the request id).
    """

    def __init__(self, seed: np.random.SeedSequence | int, dataset: np.ndarray,
                 accept_mean: Mapping[str, float], *, default_accept: float | None = None,
                 eagle_accept_mean: Mapping[str, float] | None = None,
                 pld: Mapping[str, Mapping[str, float]] | None = None, width: int = 16, spread: float = 0.1,
                 pos_concentration: float = 2.0, decay: float = 0.7, confidence: float = 1.0,
                 drift: Mapping[str, Any] | None = None, pair: str = "(draft, target)",
                 span_key: np.ndarray | None = None) -> None:
        if not 1 <= width <= MAX_WIDTH:
            raise ValueError(f"width {width} outside 1..{MAX_WIDTH}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay {decay} must lie in (0, 1)")
        if pos_concentration <= 0.0 or confidence <= 0.0 or spread < 0.0:
            raise ValueError("pos_concentration and confidence must be > 0, spread >= 0")
        base = _as_seed_seq(seed)
        self._base = base
        self._dataset = np.asarray(dataset, dtype=object).reshape(-1)
        self.width = width
        self._spread, self._kappa, self._decay, self._gamma = spread, pos_concentration, decay, confidence
        self._drift = _drift_arrays(self._dataset, drift)
        self._span_key = (np.arange(self._dataset.size, dtype=np.int64) if span_key is None
                          else np.asarray(span_key, dtype=np.int64).reshape(-1))
        self._missing: dict[str, str] = {}  # stream -> why its table is missing (raised on use)
        self._streams: dict[str, _TokenStream | _PldStream | _SpanStream] = {}
        self.notes: list[str] = []  # what a run's notes should say about the oracle's sources (span fallbacks)
        self._keys: set[int] = set()
        tables = ((DRAFT, DRAFT_KEY, accept_mean, default_accept, f"acceptance mean for pair {pair}"),
                  (EAGLE, EAGLE_KEY, eagle_accept_mean, None, "EAGLE acceptance mean"))
        for name, key, table, default, what in tables:
            self._keys.add(key)
            if table is None or (not table and default is None):
                continue
            self._add_token_stream(name, key, table, default, what)
        self._keys.add(PLD_KEY)
        if pld is not None:
            merged = _per_request(self._dataset, pld, None, "prompt-lookup entry",
                                  lambda ds, e: {**pld.get("default", {}), **e})
            match = np.array([float(e["match"]) for e in merged])
            if ((match < 0) | (match > 1)).any():
                raise ValueError("pld match probability must lie in [0, 1]")
            acc = np.array([_check_mean("pld accept", e["accept"], spread) for e in merged])
            mlen = np.array([float(e.get("match_len", 32.0)) for e in merged])
            if (mlen < 1).any():
                raise ValueError("pld match_len must be >= 1")
            self._streams[PLD] = _PldStream(PLD, PLD_KEY, base, match, acc, mlen, spread)

    def _add_token_stream(self, name: str, key: int, table: Mapping[str, float], default: float | None,
                          what: str) -> None:
        if any(isinstance(v, (list, tuple)) or (hasattr(v, "__len__") and not isinstance(v, str))
               for v in table.values()):
            pmf = _per_request(self._dataset, table, None, what, lambda ds, e: measured_pmf(e, f"{what} ({ds})"))
            self._streams[name] = _SpanStream(name, key, self._base, span_key=self._span_key, pmf=pmf)
            return
        means = _per_request(self._dataset, table, default, what,
                             functools.partial(_check_mean_of, what, self._spread))
        self._streams[name] = _TokenStream(
            name, key, self._base, np.asarray(means, dtype=np.float64), spread=self._spread,
            pos_concentration=self._kappa, drift=self._drift, width=self.width, decay=self._decay,
            confidence=self._gamma)

    def add_stream(self, name: str, accept_mean: Mapping[str, float], *, key: int,
                   default_accept: float | None = None) -> None:
        """Add a draft-model stream ``name`` whose per-dataset mean acceptance is ``accept_mean`` (a ``"default"``
        key or ``default_accept`` covering other datasets), drawn from its own seed ``key`` (not a built-in one's:
        0, 1, 2). A proposer whose ``stream`` is ``name`` (e.g. a remote draft server running another draft model)
        is then scored on it; the other streams' values do not change."""
        if name in self._streams or name in (DRAFT, EAGLE, PLD):
            raise ValueError(f"oracle stream {name!r} exists already")
        if key in self._keys:
            raise ValueError(f"oracle stream key {key} is taken (built-in keys: {DRAFT_KEY}, {EAGLE_KEY}, {PLD_KEY})")
        self._add_token_stream(name, key, accept_mean, default_accept, f"acceptance mean of stream {name!r}")
        self._keys.add(key)

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any], *, seed: np.random.SeedSequence | int, dataset: np.ndarray,
                 draft: str | None, target: str, span_key: np.ndarray | None = None,
                 output_len: np.ndarray | None = None) -> TokenOracle:
        """Build from the Hydra ``oracle`` node (conf/oracle/default.yaml) for the (draft, target) pair.

        ``accept[draft][target]`` is the pair's table (``draft=None``: no draft model);
        ``eagle_accept[target]`` the EAGLE head's; ``pld`` prompt lookup's per dataset, with
        ``pld_by_target[target]`` overriding entries where a paper gives the target's own rate; ``accept_override``
        (a float) forces every dataset's mean of both the draft and the EAGLE head (TurboSpec's controlled-acceptance
        benchmarks). A pair missing from the tables raises ``KeyError`` (naming the pair and the known ones) when
        its proposer is first used, so runs that never speculate (or only use prompt lookup) work with any target.
        """
        override = cfg.get("accept_override")
        accept: Mapping[str, float] = {}
        default: float | None = None
        eagle: Mapping[str, float] | None = (cfg.get("eagle_accept") or {}).get(target)
        if override is not None:
            default = float(override)
            eagle = {"default": default}
        missing: dict[str, str] = {}
        table = cfg["accept"]
        if override is None and draft is not None:
            if draft in table and target in table[draft]:
                accept = dict(table[draft][target])
            else:
                pairs = sorted(f"{d}/{t}" for d in table for t in table[d])
                missing[DRAFT] = (f"no acceptance table for draft {draft!r} with target {target!r} in "
                                  f"oracle.accept (known pairs: {pairs})")
        if eagle is None:
            missing[EAGLE] = f"no EAGLE acceptance table for target {target!r} in oracle.eagle_accept"
        drift = cfg.get("drift")
        if drift is not None:
            drift = {str(k): (dict(v) if isinstance(v, Mapping) else v) for k, v in drift.items()}
        oracle = cls(seed, dataset, accept, default_accept=default,
                   eagle_accept_mean=dict(eagle) if eagle is not None else None,
                   pld=_pld_table(cfg, target),
                   width=int(cfg.get("width", 16)), spread=float(cfg.get("spread", 0.1)),
                   pos_concentration=float(cfg.get("pos_concentration", 2.0)),
                   decay=float(cfg.get("decay", 0.7)), confidence=float(cfg.get("confidence", 1.0)),
                   drift=drift, pair=f"{draft}/{target}", span_key=span_key)
        oracle._missing.update(missing)
        if cfg.get("kind", "model") == "trace":
            oracle.use_trace(cfg.get("path"), target=target, draft=draft, output_len=output_len,
                             past=str(cfg.get("past_recording") or "error"))
        return oracle

    def use_trace(self, path: Any, *, target: str | None = None, draft: str | None = None,
                  output_len: np.ndarray | None = None, past: str = "error") -> None:
        """Replace the draft model's stream with a recording (:class:`_TraceStream`) read from ``path`` (a parquet
        file written by ``backend=hf backend.record=PATH``).

        A recording carries what it was made of (:data:`RECORDING_META` in its metadata: the model pair, datasets,
        each recorded request's output length): another ``target`` or ``draft`` than the run's is refused. Run
        request ``r`` replays recorded request ``r mod R``; where its ``output_len`` runs past that recording,
        ``past="error"`` refuses the run (naming how many requests do) and ``past="miss"`` counts the positions past
        it as misses, said in :attr:`notes`. A recording without metadata (written before it had any) is replayed
        without the model pair's check, covering the positions it recorded, said in :attr:`notes`."""
        import pandas as pd

        if not path:
            raise FileNotFoundError("oracle=trace needs oracle.path=PATH: an acceptance recording written by "
                                    "backend=hf backend.record=PATH")
        if past not in ("error", "miss"):
            raise ValueError(f"oracle.past_recording={past!r}: error | miss")
        try:
            record = pd.read_parquet(str(path), columns=["rid", "pos", "rank", "p0"])
        except (FileNotFoundError, OSError) as exc:
            raise FileNotFoundError(f"oracle.path: cannot read the acceptance recording {str(path)!r} ({exc}); "
                                    "write one with backend=hf backend.record=PATH") from None
        meta = record.attrs.get(RECORDING_META)
        if not meta:
            self.notes.append(f"oracle=trace: {path} carries no metadata (an older recording): its model pair is "
                              "not checked, and it covers the positions it recorded")
        else:
            for role, mine in (("target", target), ("draft", draft)):
                theirs = meta.get(role)
                if mine is not None and theirs is not None and str(theirs) != str(mine):
                    raise ValueError(f"oracle.path: {path} was recorded with {role} {theirs!r} "
                                     f"({meta.get('draft')}/{meta.get('target')}), not this run's {mine!r}")
        if output_len is not None and len(record):
            covered = record.groupby("rid")["pos"].max() + 1  # positions 0..max of each recorded request
            if meta and meta.get("output_len"):  # what it was asked to cover (a request the draft never saw past)
                lens = pd.Series(meta["output_len"], dtype="int64")
                covered = pd.concat([covered, lens.reindex(covered.index)], axis=1).max(axis=1).astype("int64")
            rids = covered.index.to_numpy(dtype=np.int64)
            have = covered.to_numpy(dtype=np.int64)[np.arange(len(output_len)) % len(rids)]
            short = np.flatnonzero(np.asarray(output_len, dtype=np.int64) > have)
            if short.size:
                r = int(short[0])
                what = (f"{short.size} of the run's {len(output_len)} requests run past the recording {path} (request "
                        f"{r}: {int(output_len[r])} output tokens, recorded request {int(rids[r % len(rids)])} covers "
                        f"{int(have[r])})")
                if past == "error":
                    raise ValueError(f"oracle.path: {what}: record the same workload, or oracle.past_recording=miss "
                                     "to count the positions past it as misses")
                self.notes.append(f"oracle=trace: {what}; positions past it count as misses "
                                  "(oracle.past_recording=miss)")
        self._streams[DRAFT] = _TraceStream(DRAFT, DRAFT_KEY, self._base, record, self._dataset.size,
                                            width=self.width, pos_concentration=self._kappa, decay=self._decay,
                                            confidence=self._gamma)
        self._missing.pop(DRAFT, None)

    def use_spans(self, cfg: Mapping[str, Any], *, target: str, output_len: np.ndarray,
                  record: np.ndarray | None = None, record_file: Mapping[str, str] | None = None,
                  shown: Mapping[str, str] | None = None) -> None:
        """Replace streams by acceptance spans (:mod:`repro.oracle.spans`) as ``cfg`` (the ``oracle.spans`` node)
        says: per stream (``draft`` | ``eagle`` | ``pld``) ``{field, model, stands_in_for, measured}``.

        A request whose prompt came from a span file (``record[r]`` >= 0, the file ``record_file[its dataset]``)
        replays that record's ``field`` spans; the file's ``model`` (else ``model``) must be ``target`` or
        ``stands_in_for`` must name it, and the record must cover the request's ``output_len``. Any other request
        draws from ``measured[its dataset]`` (mean acceptance lengths L(1..K)): the fallback, said in
        :attr:`notes`; neither is an error naming the request. ``prompt_lookup_min`` (prompt lookup's smallest
        n-gram): a recorded request proposes only where its tokens match (:func:`repro.oracle.spans.lookup_matches`),
        a drawn one at the fraction ``match[its dataset][k - 1]`` of a chain-k step's positions.

        ``proposal`` (``pld`` only): ``recorded`` (the default: the file's ``field`` spans, as above) or
        ``vllm_v0_ngram``: spans and proposing positions computed from each record's token ids under vLLM 0.6's
        n-gram proposal (:func:`repro.oracle.spans.ngram_v0_spans`) with ``prompt_lookup_min`` (default 1),
        ``prompt_lookup_max`` (required) and ``num_speculative_tokens`` (optional: longer chains are refused);
        ``field`` is then not read, and ``measured`` / ``match`` are the rule's statistics for requests without a
        record (:func:`repro.oracle.spans.span_rule`)."""
        n = self._dataset.size
        rec = np.full(n, -1, dtype=np.int64) if record is None else np.asarray(record, dtype=np.int64)
        files = dict(record_file or {})
        for stream, node in cfg.items():
            if node is None:
                continue
            if stream not in _STREAM_KEYS:
                raise ValueError(f"oracle.spans.{stream}: unknown stream (known: {sorted(_STREAM_KEYS)})")
            field = node.get("field")
            rule = span_rule(node, f"oracle.spans.{stream}")
            if rule is not None and stream != PLD:
                raise ValueError(f"oracle.spans.{stream}.proposal: vllm_v0_ngram is prompt lookup's rule (set it on "
                                 f"oracle.spans.{PLD})")
            lookup_min = node.get("prompt_lookup_min") if rule is None else None
            lookup_min = None if lookup_min is None else int(lookup_min)
            recorded: list[np.ndarray | None] = [None] * n
            flags: list[np.ndarray | None] = [None] * n
            for ds, path in files.items():
                rows = np.flatnonzero((self._dataset == ds) & (rec >= 0))
                if not rows.size:
                    continue
                if not field and rule is None:
                    raise ValueError(f"oracle.spans.{stream}.field: name the span field of {path} (e.g. acc_eagle)")
                name = (shown or {}).get(ds, path)
                if rule is None:
                    got_file = read_span_file(str(path), str(field), name, lookup_min)
                else:
                    got_file = read_span_file(str(path), None, name, None, rule)  # (computed from its token ids)
                stand_in_check(got_file.model, node, target, name)
                got = recorded_for(got_file.spans, rec[rows], np.asarray(output_len)[rows], name,
                                   str(field) if rule is None else "vllm_v0_ngram")
                for r, g in zip(rows.tolist(), got, strict=True):
                    recorded[r] = g
                if got_file.proposes is not None:
                    for r in rows.tolist():
                        flags[r] = got_file.proposes[int(rec[r])]
            measured = node.get("measured") or {}
            match_of = node.get("match") or {}
            match: list[np.ndarray | None] = [None] * n
            pmf: list[np.ndarray | None] = [None] * n
            fell_back: set[str] = set()
            for r in range(n):
                if recorded[r] is not None:
                    continue
                ds = str(self._dataset[r])
                curve = measured.get(ds)
                if curve is None:
                    raise ValueError(f"oracle.spans.{stream}: request {r} ({ds}) has no recorded spans (its prompt "
                                     f"came from no span file) and oracle.spans.{stream}.measured has no {ds!r} entry")
                pmf[r] = measured_pmf(curve, f"oracle.spans.{stream}.measured.{ds}")
                if lookup_min is not None or rule is not None:
                    if ds not in match_of:
                        raise ValueError(f"oracle.spans.{stream}.match: no {ds!r} entry (per k, the fraction of a "
                                         "run's steps where prompt lookup finds a match, for spans drawn without a "
                                         "file)")
                    match[r] = np.asarray([float(x) for x in match_of[ds]], dtype=np.float64)
                fell_back.add(ds)
            self._streams[stream] = _SpanStream(stream, _STREAM_KEYS[stream], self._base, span_key=self._span_key,
                                                recorded=recorded, pmf=pmf, proposes=flags, match=match,
                                                limit=None if rule is None else rule.k_max)
            self._missing.pop(stream, None)
            if fell_back:
                self.notes.append(f"oracle: {stream} spans drawn from measured mean acceptance lengths "
                                  f"(oracle.spans.{stream}.measured) for {', '.join(sorted(fell_back))}: no span file")

    def accept_prob_sum(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                        proposer: str | HasStream = DRAFT) -> np.ndarray:
        """Per chain, Σ_j min(1, p_j(s_j) / q_j(s_j)) over its ``k`` drafted tokens as a verifier computes it in its
        one pass over every drafted position (GoodSpeed Eq. 3): here each position's probability that the target
        keeps the draft's token, the sum's expectation. A policy sees it only through ``StepResult.accept_prob``."""
        return self._stream(proposer).accept_prob_sum(np.asarray(rids, dtype=np.int64),
                                                      np.asarray(pos, dtype=np.int64), np.asarray(k, dtype=np.int64))

    def level(self, rid: int, proposer: str | HasStream = DRAFT) -> float:
        """Request ``rid``'s per-token acceptance level a_r on a draft stream: the ground truth a simulation may
        report (GoodSpeed's optimum x*), never something a policy reads."""
        return self._stream(proposer).level(rid)[0]

    def _any_stream(self, proposer: str | HasStream) -> _TokenStream | _PldStream | _SpanStream:
        """The stream a stream name or a proposer (its ``stream``) is scored on."""
        name = proposer if isinstance(proposer, str) else proposer.stream
        stream = self._streams.get(name)
        if stream is None:
            if name in self._missing:
                raise MissingTableError(self._missing[name])
            raise ValueError(f"proposer stream {name!r} is not configured in this oracle "
                             f"(available: {sorted(self._streams)})")
        return stream

    def _stream(self, proposer: str | HasStream) -> _TokenStream:
        """The draft distribution a stream name or a proposer drafts from (trees, beams, reported probabilities)."""
        stream = self._any_stream(proposer)
        if isinstance(stream, _SpanStream):
            raise ValueError(f"proposer stream {stream.name!r} replays acceptance spans: chains only (trees, beams "
                             "and draft probabilities are not supported)")
        if not isinstance(stream, _TokenStream):
            raise ValueError(f"proposer stream {stream.name!r} has no draft distribution (prompt lookup proposes "
                             "chains only)")
        return stream

    def accept_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                     proposer: str | HasStream = DRAFT) -> tuple[np.ndarray, np.ndarray]:
        """(num_proposed, num_accepted) per request for a chain of ``k[i]`` tokens starting at ``pos[i]``.

        Draft/EAGLE: proposed = k, accepted = leading positions whose true rank is 0. PLD: proposed =
        ``min(k, match length)`` (0 without a match), accepted = leading copied tokens the target accepts.
        """
        proposed, accepted, _ = self.score_chain(rids, pos, k, proposer)
        return proposed, accepted

    def score_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                    proposer: str | HasStream = DRAFT) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`accept_chain` plus ``num_matched``: the proposed positions whose token is the target's, whether
        or not an earlier position was rejected (what vLLM v0's ``draft_acceptance_rate`` counts: matched /
        proposed estimates the per-token acceptance α; accepted / proposed is lower, the chain stopping at the
        first rejection)."""
        rids = np.asarray(rids, dtype=np.int64)
        pos = np.asarray(pos, dtype=np.int64)
        k = np.asarray(k, dtype=np.int64)  # k >= 0 (the engine checks plans)
        stream = self._any_stream(proposer)
        if not isinstance(stream, _TokenStream) and pos.size and int(pos.min()) < 0:
            raise ValueError("positions must be >= 0")  # (a draft-model stream checks them as it scores)
        return stream.score_chain(rids, pos, k)

    def chain_run(self, rids: np.ndarray, pos: np.ndarray, k: int, steps: int,
                  proposer: str | HasStream = DRAFT, *, end: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray] | None:
        """What :meth:`score_chain` returns, step after step, when requests ``rids`` at ``pos`` draft a chain of
        ``k`` > 0 in each of ``steps`` steps, each step starting after the previous one's accepted + 1 tokens:
        (accepted, matched) as (steps, requests) arrays (proposed is ``k`` throughout). ``end`` (per request, e.g.
        its output length + k) bounds the positions read: a request's values are exact for the steps that read
        only positions before it. ``None`` for a stream that proposes before verification (prompt lookup, whose
        chains depend on matches)."""
        stream = self._any_stream(proposer)
        if not isinstance(stream, (_TokenStream, _SpanStream)):
            return None
        return stream.chain_run(np.asarray(rids, dtype=np.int64), np.asarray(pos, dtype=np.int64), int(k),
                                int(steps), None if end is None else np.asarray(end, dtype=np.int64))

    def accept_tree(self, tree: TreeSpec, proposer: str | HasStream = DRAFT) -> int:
        """Accepted tokens: depth of the deepest selected node on the true path (ancestors all selected)."""
        return self.accept_trees([tree], proposer)[0]

    def accept_trees(self, trees: list[TreeSpec], proposer: str | HasStream = DRAFT) -> list[int]:
        """:meth:`accept_tree` of several trees, their true ranks read in one pass (each tree's positions only)."""
        out = [0] * len(trees)
        some = [j for j, t in enumerate(trees) if t.nodes.size]
        if not some:
            return out
        cands = [trees[j].cand for j in some]
        n = len(some)
        counts = np.array([trees[j].nodes.shape[0] for j in some], dtype=np.int64)
        sizes = np.array([c.parent.shape[0] for c in cands], dtype=np.int64)  # each candidate tree's size
        # the trees' selected nodes, and their candidates' parents, depths and ranks, one tree after another
        nodes = np.concatenate([trees[j].nodes for j in some]).astype(np.int64, copy=False)
        parents, depths, ranks = (np.concatenate(arrays).astype(np.int64, copy=False)
                                  for arrays in ([c.parent for c in cands], [c.depth for c in cands],
                                                 [c.rank for c in cands]))
        rids = np.array([c.rid for c in cands], dtype=np.int64)
        pos = np.array([c.pos for c in cands], dtype=np.int64)
        if jit.step_kernels():  # the same, one tree at a time, compiled (repro.oracle.kernels.accept_paths)
            stream = self._stream(proposer)
            best = np.empty(n, dtype=np.int64)
            if jit.kernel("repro.oracle.kernels", "accept_paths")(
                    nodes, counts, sizes, parents, depths, ranks, rids, pos, stream.store.table,
                    stream._ranks(), stream.store._shift, best):  # (the rank pool of every chunk held)
                for j, b in zip(some, best.tolist(), strict=True):
                    out[j] = b
                return out
            # (a chunk not generated yet: the NumPy path below generates it)
        base = np.cumsum(sizes) - sizes  # tree i's candidates at base[i] + index in the flat arrays below
        owner = np.repeat(np.arange(n), counts)  # each selected node's tree
        flat = base[owner] + nodes
        depth = depths[flat]
        parent = parents[flat]
        reach = np.maximum.reduceat(depth, np.cumsum(counts) - counts)  # each tree's deepest selected node
        grid = pos[:, None] + np.minimum(_AR[:int(reach.max())], reach[:, None] - 1)  # past its reach: its last
        truth = self._stream(proposer).true_ranks(rids[:, None], grid)
        hit = ranks[flat] == truth[owner, depth - 1]  # the target's token
        # a node is on the accepted path when it is the target's token and its parent is (the root always is),
        # settled a depth at a time: every parent is one layer up
        root = int(sizes.sum())
        on = np.zeros(root + 1, dtype=bool)
        on[root] = True
        up = np.where(parent < 0, root, base[owner] + parent)
        for d in range(1, int(reach.max()) + 1):
            layer = depth == d
            on[flat[layer]] = hit[layer] & on[up[layer]]
        accepted = on[flat]
        best = np.zeros(n, dtype=np.int64)
        np.maximum.at(best, owner[accepted], depth[accepted])  # the deepest accepted node of each tree
        for j, b in zip(some, best.tolist(), strict=True):
            out[j] = b
        return out

    def accept_prefixes(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                        proposer: str | HasStream = DRAFT) -> np.ndarray:
        """:meth:`accept_trees` of trees that are the first ``k[i]`` nodes of each request's greedy chain from
        ``pos[i]`` (:func:`~repro.core.speculation.chain_prefixes`): their leading positions whose true rank is 0, as
        a chain reads them."""
        return self._stream(proposer).score_chain(rids, pos, k)[1]

    def candidates(self, rid: int, pos: int, depth: int, width: int,
                   proposer: str | HasStream = DRAFT) -> CandidateTree:
        """Beam-search candidate tree of ``depth`` × ``width`` (AdaServe §4.3 Step 1) for one request."""
        return self.candidates_batch(np.array([rid]), np.array([pos]), depth, width, proposer)[0]

    def candidates_batch(self, rids: np.ndarray, pos: np.ndarray, depth: int, width: int,
                         proposer: str | HasStream = DRAFT) -> list[CandidateTree]:
        """:meth:`candidates` for a batch, vectorized over requests."""
        rids = np.asarray(rids, dtype=np.int64).reshape(-1)
        pos = _positions(pos, depth)
        beam = self._stream(proposer).beam(rids, pos, depth, width)
        node_depth = np.repeat(np.arange(1, depth + 1, dtype=np.int64), width)
        for arr in (node_depth, beam.parent, beam.rank, beam.prob, beam.path_prob):
            arr.flags.writeable = False
        return [CandidateTree(r, p, par, node_depth, rk, pr, pp, depth, width)  # (a 2-D array iterates its rows)
                for r, p, par, rk, pr, pp in zip(rids.tolist(), pos.tolist(), beam.parent, beam.rank, beam.prob,
                                                 beam.path_prob, strict=True)]

    def expansion_batch(self, rids: np.ndarray, pos: np.ndarray, expansion: tuple[int, ...],
                        proposer: str | HasStream = DRAFT) -> list[CandidateTree]:
        """SpecInfer's fixed tree expansion ⟨k_1, …, k_D⟩ for a batch: every node of depth i − 1 keeps its own
        ``k_i`` most probable children (⟨1,1,3,1,1,1,1,1⟩: 1 + 1 + 3·6 = 20 nodes). The drafting cost is that of
        a beam of the widest layer (``draft_width``) over ``D`` passes."""
        expansion = tuple(int(k) for k in expansion)
        rids = np.asarray(rids, dtype=np.int64).reshape(-1)
        pos = _positions(pos, len(expansion))
        beam, node_depth = self._stream(proposer).expand(rids, pos, expansion)
        for arr in (node_depth, beam.parent, beam.rank, beam.prob, beam.path_prob):
            arr.flags.writeable = False
        widest = int(np.bincount(node_depth).max())
        return [CandidateTree(int(r), int(p), beam.parent[i], node_depth, beam.rank[i], beam.prob[i],
                              beam.path_prob[i], len(expansion), widest)
                for i, (r, p) in enumerate(zip(rids.tolist(), pos.tolist(), strict=True))]

    def chain_probs(self, rid: int, pos: int, k: int, proposer: str | HasStream = DRAFT) -> np.ndarray:
        """The draft's reported top-1 probability at each of the ``k`` steps of its greedy chain."""
        return self.chain_probs_batch(np.array([rid]), np.array([pos]), k, proposer)[0]

    def chain_probs_batch(self, rids: np.ndarray, pos: np.ndarray, k: int,
                          proposer: str | HasStream = DRAFT) -> np.ndarray:
        """:meth:`chain_probs` for a batch: an (n, k) array."""
        rids = np.asarray(rids, dtype=np.int64).reshape(-1)
        if k <= 0:
            return np.zeros((rids.size, 0))
        return self._stream(proposer).beam(rids, _positions(pos, k), k, 1).prob

    def release(self, rid: int) -> None:
        """Free a finished request's generated chunks (values are regenerated identically if asked again)."""
        for stream in self._streams.values():
            stream.store.release(rid)
            if isinstance(stream, _TokenStream):
                stream.alt_store.release(rid)

    @property
    def num_live_chunks(self) -> int:
        """Chunks currently held across streams, off-path ones included (for leak checks)."""
        return sum(s.store.num_chunks + (s.alt_store.num_chunks if isinstance(s, _TokenStream) else 0)
                   for s in self._streams.values())


class Drafter:
    """The draft model's view a policy gets as ``view.drafter``: reported probabilities, never true ranks."""

    __slots__ = ("_oracle",)

    def __init__(self, oracle: TokenOracle) -> None:
        self._oracle = oracle

    @property
    def max_width(self) -> int:
        """The widest beam the drafter supports (the oracle's W)."""
        return self._oracle.width

    def candidates(self, rid: int, pos: int, depth: int, width: int,
                   proposer: str | HasStream = DRAFT) -> CandidateTree:
        return self._oracle.candidates(rid, pos, depth, width, proposer)

    def candidates_batch(self, rids: np.ndarray, pos: np.ndarray, depth: int, width: int,
                         proposer: str | HasStream = DRAFT) -> list[CandidateTree]:
        return self._oracle.candidates_batch(rids, pos, depth, width, proposer)

    def expansion_batch(self, rids: np.ndarray, pos: np.ndarray, expansion: tuple[int, ...],
                        proposer: str | HasStream = DRAFT) -> list[CandidateTree]:
        """Per-parent top-k expansion trees (SpecInfer), see :meth:`TokenOracle.expansion_batch`."""
        return self._oracle.expansion_batch(rids, pos, expansion, proposer)

    def chain_probs(self, rid: int, pos: int, k: int, proposer: str | HasStream = DRAFT) -> np.ndarray:
        return self._oracle.chain_probs(rid, pos, k, proposer)

    def chain_probs_batch(self, rids: np.ndarray, pos: np.ndarray, k: int,
                          proposer: str | HasStream = DRAFT) -> np.ndarray:
        return self._oracle.chain_probs_batch(rids, pos, k, proposer)


def _pld_table(cfg: Mapping[str, Any], target: str) -> dict[str, dict[str, float]] | None:
    """``cfg.pld`` (dataset → {match, accept, match_len}) with ``cfg.pld_by_target[target]``'s entries merged in."""
    if cfg.get("pld") is None:
        return None
    table = {k: dict(v) for k, v in cfg["pld"].items()}
    for ds, entry in ((cfg.get("pld_by_target") or {}).get(target) or {}).items():
        table[ds] = {**table.get(ds, {}), **dict(entry)}
    return table
