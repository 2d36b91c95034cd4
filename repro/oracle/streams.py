"""The oracle's streams: the seeded values one proposer draws from, over all requests, and their chain scoring.

A proposer draws from a named stream (its ``stream``, :mod:`repro.sim.proposers`): the oracle knows streams, not
proposer kinds. A draft-model stream (:class:`_TokenStream`: the draft model, an EAGLE head, or any stream added
with ``TokenOracle.add_stream``) holds the distributions of :mod:`repro.oracle.distributions`; a recording
(:class:`_TraceStream`) replays a real draft model's; prompt lookup (:class:`_PldStream`) proposes chains only.

A chain reads only whether the true rank is 0 (the uniform below p0), stored with the chunk; the ranks themselves are
computed from p0 and the uniform once a tree first reads them (the same values as computing them with the chunk).
Off-path distributions live in a second store, generated (from their own seeds) only for chunks a beam search
reaches, so chain-only runs never pay for them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from repro.core import jit
from repro.core.seeding import Seeder
from repro.oracle.distributions import A0_MIN, P_FLOOR, _beta_mean_sd, reported_dist, sample_rank, true_dist
from repro.oracle.scoring import TreeReads, _Beam, beam_layers, chain_steps, expand_layers
from repro.oracle.store import (
    _ALT_KEY,
    _AR,
    _CHUNK_KEY,
    _GOLDEN,
    _LEVEL,
    _RANK_SALT,
    ALT_CHUNK,
    CHUNK,
    MEMO,
    NUM_ALT,
    _ChunkStore,
    _mix,
)


class _TokenStream:
    """The draft-distribution model of one stream (a draft model or an EAGLE head) over all requests."""

    def __init__(self, name: str, key: int, base: np.random.SeedSequence, means: np.ndarray, *, spread: float,
                 pos_concentration: float, drift: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None,
                 width: int,
                 decay: float,
                 confidence: float) -> None:
        self.name, self._base, self._sid = name, base, key
        self._means, self._spread = means, spread
        self._kappa, self.width, self._decay, self._gamma = pos_concentration, width, decay, confidence
        n = means.shape[0]
        # per request: drift start (mean or offset, sd), time constant τ (NaN: no drift for the request's dataset)
        # and whether the start is relative to the level
        self._drift = drift if drift is not None and np.isfinite(drift[2]).any() else None
        self._salt = np.uint64(base.generate_state(2, np.uint64)[self._sid % 2]) ^ np.uint64(self._sid + 1)
        self._level = np.full(n, np.nan)
        self._a0 = np.full(n, np.nan)
        # the generators of (seed, key, part, r[, chunk]): NumPy's own seeding, about 5x cheaper (repro.core.seeding)
        self._seeds = {part: Seeder(base, (key, part), n) for part in (_LEVEL, _CHUNK_KEY, _ALT_KEY)}
        # what a chunk's values depend on besides (part, r, chunk) and the request's level: the seed, the stream
        # and κ_pos (the memo's key, :data:`repro.oracle.store.MEMO`)
        entropy = base.entropy if isinstance(base.entropy, int) else tuple(np.asarray(base.entropy).ravel().tolist())
        self._memo_id = (type(self).__name__, entropy, tuple(base.spawn_key), base.pool_size, key,
                         float(pos_concentration))
        # per position: the draft's top-1 probability, the target's uniform, whether the target's token is the
        # draft's top-1 (u < p0: all a chain reads) and the target's rank, computed from p0 and u only once a tree
        # reads ranks (:meth:`_ranks`)
        self.store = _ChunkStore(n, {"p0": ((), np.float32), "u": ((), np.float64), "hit": ((), np.bool_),
                                     "rank": ((), np.int8)}, self._fill)
        self._ranked = False
        # off-path child distributions: generated only for chunks a beam search reaches (own seeds)
        self.alt_store = _ChunkStore(n, {"alt": ((NUM_ALT,), np.float32)}, self._fill_alt, ALT_CHUNK)

    def level(self, rid: int) -> tuple[float, float]:
        """The request's level a_r and its drift start a_0 (drawn on first use, seeded by (seed, r); remembered in
        :data:`~repro.oracle.store.MEMO` by what they depend on: the seed, the stream, the request's mean, the
        spread and its drift's shape)."""
        if math.isnan(self._level[rid]):
            drift = None if self._drift is None or not math.isfinite(self._drift[2][rid]) else \
                (float(self._drift[0][rid]), float(self._drift[1][rid]), bool(self._drift[3][rid]))
            key = (self._memo_id, _LEVEL, rid, float(self._means[rid]), self._spread, drift)
            got = MEMO.recall(key, lambda: {"level": np.array(self._draw_level(rid, drift))})
            self._level[rid], self._a0[rid] = got["level"]
        return float(self._level[rid]), float(self._a0[rid])

    def _draw_level(self, rid: int, drift: tuple[float, float, bool] | None) -> tuple[float, float]:
        rng = self._seeds[_LEVEL].generator(rid)
        level = _beta_mean_sd(rng, float(self._means[rid]), self._spread)
        if drift is None:
            return level, math.nan
        mean, sd, relative = drift
        if relative:  # relative: a_0 = a_r - offset_r, offset_r ~ Normal(offset, sd)
            offset = mean + sd * float(rng.standard_normal()) if sd > 0.0 else mean
            return level, min(max(level - offset, A0_MIN), 1.0 - A0_MIN)
        return level, _beta_mean_sd(rng, mean, sd)

    def _draw_p0(self, rng: np.random.Generator, rid: int, first: int, size: tuple[int, ...]) -> np.ndarray:
        """Top-1 probabilities ~ Beta(mean a_r(t), concentration κ_pos) at positions ``first + i``."""
        a_r, a_0 = self.level(rid)
        k = self._kappa
        if self._drift is None or not math.isfinite(self._drift[2][rid]):
            p0 = rng.beta(a_r * k, (1.0 - a_r) * k, size=size)
        else:  # LAPS-SD Fig. 3: a_r(t) = a_r + (a_0 - a_r)·exp(-t/τ)
            t = first + np.arange(size[0])
            mean = a_r + (a_0 - a_r) * np.exp(-t / float(self._drift[2][rid]))
            mean = mean.reshape(-1, *[1] * (len(size) - 1))
            p0 = rng.beta(mean * k, (1.0 - mean) * k, size=size)
        # np.clip(p0, P_FLOOR, 1 - P_FLOOR), in place on the fresh draws (the same values, NaN included)
        return np.minimum(np.maximum(p0, P_FLOOR, out=p0), 1.0 - P_FLOOR, out=p0).astype(np.float32)

    def _memo_key(self, part: int, rid: int, chunk: int) -> tuple[Any, ...]:
        """Everything the values of chunk ``chunk`` of request ``rid`` in ``part`` depend on: the stream's seed and
        κ_pos, the request's level, drift start and drift time (:meth:`_draw_p0`), and the generator's (part, r,
        chunk)."""
        a_r, a_0 = self.level(rid)
        tau = float(self._drift[2][rid]) if self._drift is not None else math.nan
        return (self._memo_id, part, rid, chunk, a_r, None if math.isnan(a_0) else a_0,
                None if math.isnan(tau) else tau)

    def _draw_chunk(self, rid: int, chunk: int) -> dict[str, np.ndarray]:
        rng = self._seeds[_CHUNK_KEY].generator(rid, chunk)
        p0 = self._draw_p0(rng, rid, chunk * CHUNK, (CHUNK,))
        u = rng.random(CHUNK)
        return {"p0": p0, "u": u, "hit": u < p0.astype(np.float64)}  # rank 0 exactly where u < p0 (sample_rank)

    def _fill(self, rid: int, chunk: int) -> dict[str, np.ndarray]:
        out = MEMO.recall(self._memo_key(_CHUNK_KEY, rid, chunk), lambda: self._draw_chunk(rid, chunk))
        if not self._ranked:
            return {name: out[name] for name in ("p0", "u", "hit")}
        if "rank" not in out:  # (the same arrays: computed once per chunk, kept with it)
            out["rank"] = self._sample_rank(out["p0"], out["u"])
            out["rank"].flags.writeable = False
        return out

    def _sample_rank(self, p0: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The true ranks of a chunk from its stored p0 (float32) and uniforms."""
        return sample_rank(p0.astype(np.float64), u, self.width, self._decay)

    def _ranks(self) -> np.ndarray:
        """The rank pool. Ranks are computed from each chunk's p0 and u once something reads them (a tree; a chain
        needs only whether the rank is 0): from then on as chunks are generated, and at once for those held."""
        pools = self.store.pools
        if not self._ranked:
            self._ranked = True
            table = self.store.table
            for slot in table[table >= 0].tolist():
                part = slice(slot * CHUNK, (slot + 1) * CHUNK)
                pools["rank"][part] = self._sample_rank(pools["p0"][part], pools["u"][part])
        return pools["rank"]

    def _fill_alt(self, rid: int, chunk: int) -> dict[str, np.ndarray]:
        return MEMO.recall(self._memo_key(_ALT_KEY, rid, chunk), lambda: {"alt": self._draw_p0(
            self._seeds[_ALT_KEY].generator(rid, chunk), rid, chunk * ALT_CHUNK, (ALT_CHUNK, NUM_ALT))})

    def true_ranks(self, rids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        idx = self.store.locate(rids, positions)  # may grow the pools: index them afterwards
        return self._ranks()[idx]

    def score_chain(self, rids: np.ndarray, pos: np.ndarray,
                    k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Proposed = k, accepted = leading positions whose true rank is 0, matched = all of them. Positions must be
        >= 0 (checked here, on both paths)."""
        if jit.step_kernels():  # the same, one request at a time, compiled (repro.oracle.kernels.chain_scores)
            store, n = self.store, k.size
            accepted, matched = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
            scores = jit.kernel("repro.oracle.kernels", "chain_scores")

            def score() -> int:
                return int(scores(store.table, store.pools["hit"], store._shift, rids, pos, k, _AR.size, accepted,
                                  matched))

            got = score()
            if got == 0:  # generate the chunks the chains read, and score again
                miss = np.empty((2 * n, 2), dtype=np.int64)
                found = jit.kernel("repro.oracle.kernels", "missing_chunks")(store.table, store._shift, rids, pos, k,
                                                                             miss)
                if found > 0:
                    store.generate(miss[:found].tolist())
                else:  # (chains across more than two chunks): every position's chunk
                    store.locate(rids[:, None], pos[:, None] + _AR[:int(k.max())])
                got = score()
            if got == -1:
                raise ValueError("positions must be >= 0")
            if got == -2:
                raise ValueError(f"chain length {int(k.max())} too long (at most {_AR.size - 1})")
            return k.copy(), accepted, matched
        if pos.size and int(pos.min()) < 0:
            raise ValueError("positions must be >= 0")
        kmax = int(k.max()) if k.size else 0
        if kmax == 0:
            return k.copy(), np.zeros_like(k), np.zeros_like(k)
        if kmax >= _AR.size:
            raise ValueError(f"chain length {kmax} too long (at most {_AR.size - 1})")
        idx = self.store.locate(rids[:, None], pos[:, None] + _AR[:kmax + 1])  # may grow the pools
        hit = self.store.pools["hit"][idx] & (_AR[:kmax + 1] < k[:, None])  # last column: always False
        return k.copy(), hit.argmin(axis=1), hit.sum(axis=1)  # leading positions whose true rank is 0, all of them

    def chain_run(self, rids: np.ndarray, pos: np.ndarray, k: int, steps: int,
                  end: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`score_chain` for ``steps`` successive steps in which every request drafts a chain of ``k`` > 0, each
        starting where the previous step's accepted + 1 tokens end: (accepted, matched), each (steps, requests).
        Whether each of the run's positions is a hit (true rank 0) is read once; each step is then two lookups.
        Positions at or after a request's ``end`` are not read (its values are meaningless once a step would read
        them)."""
        reach = steps * (k + 1)  # a step advances at most k + 1 positions
        last = pos + (reach + k - 1) if end is None else np.minimum(pos + (reach + k - 1), np.maximum(end, pos + 1) - 1)
        idx = self.store.window(rids, pos, reach + k, last)  # may grow the pools: index them afterwards
        return chain_steps(self.store.pools["hit"][idx], k, steps)

    def reported(self, p0: np.ndarray, top: int | None = None) -> np.ndarray:
        """The drafter's reported probabilities of its top W tokens (last axis), or of its ``top`` most probable
        only: the first ``top`` of the W, which a calibrated drafter (γ = 1) gives without computing the rest."""
        if top is not None and self._gamma == 1.0:
            return true_dist(p0, top, self._decay)
        rep = reported_dist(true_dist(p0, self.width, self._decay), self._gamma)
        return rep if top is None else rep[..., :top]

    def accept_prob_sum(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Σ over each chain's k drafted positions of the probability that the target keeps the draft's token
        (the position's p0: the true token is the draft's top-1 with that probability)."""
        kmax = int(k.max()) if k.size else 0
        if kmax == 0:
            return np.zeros(k.shape, dtype=np.float64)
        idx = self.store.locate(rids[:, None], pos[:, None] + _AR[:kmax])
        p0 = self.store.pools["p0"][idx].astype(np.float64)
        return np.where(_AR[:kmax] < k[:, None], p0, 0.0).sum(axis=1)

    def _positions(self, rids: np.ndarray, pos: np.ndarray, depth: int) -> TreeReads:
        """What a tree of ``depth`` layers over each request's next positions reads: the true p0 and rank per
        (request, layer), the off-path pool and its index, and the hash of (seed, r, divergence position) that
        seeds an off-path node's distribution."""
        grid = pos[:, None] + _AR[:depth]
        idx = self.store.locate(rids[:, None], grid)
        alt_idx = self.alt_store.locate(rids[:, None], grid) if depth > 1 else idx
        pools, ranks = self.store.pools, self._ranks()
        div = _mix(self._salt ^ _mix(rids.astype(np.uint64)[:, None] * _GOLDEN
                                     ^ grid.astype(np.uint64)))
        return pools["p0"][idx].astype(np.float64), ranks[idx], self.alt_store.pools["alt"], alt_idx, div

    def beam(self, rids: np.ndarray, pos: np.ndarray, depth: int, width: int) -> _Beam:
        """AdaServe §4.3 Step 1 beam search for a batch: layer 1 = the root's top ``width`` children; each
        later layer = the top ``width`` of the ``width × W`` children of the previous layer by path
        probability (the draft's reported probabilities; :func:`~repro.oracle.scoring.beam_layers`)."""
        if not 1 <= width <= self.width:
            raise ValueError(f"beam width {width} outside 1..{self.width} (the oracle models the draft's top "
                             f"{self.width} tokens; raise oracle.width)")
        if width == 1 and self._gamma == 1.0 and jit.step_kernels():  # a greedy chain, compiled
            prob, path_prob = np.empty((rids.size, depth)), np.empty((rids.size, depth))
            if jit.kernel("repro.oracle.kernels", "greedy_chains")(
                    self.store.table, self.alt_store.table, self.store._shift, self.alt_store._shift,
                    self.store.pools["p0"], self._ranks(), self.alt_store.pools["alt"], self._salt, _RANK_SALT[0],
                    rids, pos, depth, prob, path_prob):
                return _Beam(np.repeat(_AR[None, :depth] - 1, rids.size, axis=0),
                             np.zeros((rids.size, depth), dtype=np.int64), prob, path_prob)
        return beam_layers(self._positions(rids, pos, depth), depth, width, self.reported)

    def expand(self, rids: np.ndarray, pos: np.ndarray, expansion: tuple[int, ...]) -> tuple[_Beam, np.ndarray]:
        """SpecInfer's fixed expansion ⟨k_1, …, k_D⟩ for a batch: every node of layer i − 1 gets its own top
        ``k_i`` children (its ranks 0..k_i − 1), so layer i holds k_1·…·k_i nodes per request. Returns the nodes as
        (n, Σ layer sizes) arrays in BFS order (parent-major, then rank) and each node's depth. Off-path nodes get
        the same context-hashed distributions as in :meth:`beam`."""
        if not expansion or min(expansion) < 1 or max(expansion) > self.width:
            raise ValueError(f"expansion {list(expansion)}: child counts must lie in 1..{self.width} (the oracle "
                             "models the draft's top W tokens; raise oracle.width)")
        return expand_layers(self._positions(rids, pos, len(expansion)), expansion, self.reported,
                             self._decay if self._gamma == 1.0 else None)


class _TraceStream(_TokenStream):
    """A recorded draft model (``oracle=trace``): per request and output position, the draft's top-1 probability
    and the rank of the target's token among the draft's top tokens, as ``backend=hf backend.record=PATH`` wrote
    them (:meth:`repro.backends.hf.HfBackend.records_frame`). Request ``r`` replays recorded request
    ``r mod (number recorded)``; a chain is then accepted exactly as on the real models. A position the recording
    does not cover counts as a miss (rank ``W``) at the request's mean recorded p0. The request's level a_r is its
    recorded fraction of rank-0 positions. Lower ranks' probabilities follow the oracle's geometric profile given
    the recorded p0, and off-path tree nodes the oracle's own draws at that level (the recording holds the true
    path only)."""

    def __init__(self, name: str, key: int, base: np.random.SeedSequence, record: Any, num_requests: int, *,
                 width: int, pos_concentration: float, decay: float, confidence: float) -> None:
        recorded = np.unique(np.asarray(record["rid"], dtype=np.int64))
        if recorded.size == 0:
            raise ValueError("the acceptance recording is empty (record a run that speculates)")
        self._p0_by: dict[int, np.ndarray] = {}
        self._rank_by: dict[int, np.ndarray] = {}
        level = {}
        for rr, grp in record.groupby("rid", sort=True):
            pos = np.asarray(grp["pos"], dtype=np.int64)
            p0 = np.clip(np.asarray(grp["p0"], dtype=np.float64), P_FLOOR, 1.0 - P_FLOOR)
            rank = np.minimum(np.asarray(grp["rank"], dtype=np.int64), width)
            arr_p0 = np.full(int(pos.max()) + 1, float(p0.mean()), dtype=np.float32)
            arr_rank = np.full(int(pos.max()) + 1, width, dtype=np.int8)
            arr_p0[pos], arr_rank[pos] = p0, rank
            self._p0_by[int(rr)], self._rank_by[int(rr)] = arr_p0, arr_rank
            level[int(rr)] = float(np.clip((rank == 0).mean(), 0.01, 0.99))
        self._map = recorded[np.arange(num_requests) % recorded.size]
        means = np.array([level[int(r)] for r in self._map])
        super().__init__(name, key, base, means, spread=0.0, pos_concentration=pos_concentration, drift=None,
                         width=width, decay=decay, confidence=confidence)
        self._ranked = True  # recorded ranks, filled with every chunk (its u is not used)

    def _fill(self, rid: int, chunk: int) -> dict[str, np.ndarray]:
        rr = int(self._map[rid])
        src_p0, src_rank = self._p0_by[rr], self._rank_by[rr]
        lo = chunk * CHUNK
        p0 = np.full(CHUNK, float(src_p0.mean()), dtype=np.float32)
        rank = np.full(CHUNK, self.width, dtype=np.int8)
        hi = min(lo + CHUNK, src_p0.size)
        if hi > lo:
            p0[: hi - lo], rank[: hi - lo] = src_p0[lo:hi], src_rank[lo:hi]
        return {"p0": p0, "hit": rank == 0, "rank": rank}


class _PldStream:
    """Prompt lookup decoding: per position, whether the context matches the prompt, the length of the
    continuation it offers and whether the target accepts the copied token."""

    def __init__(self, name: str, key: int, base: np.random.SeedSequence, match: np.ndarray, accept: np.ndarray,
                 match_len: np.ndarray, spread: float) -> None:
        self.name, self._base, self._sid = name, base, key
        self._match, self._accept, self._match_len, self._spread = match, accept, match_len, spread
        self.store = _ChunkStore(match.shape[0], {"match": ((), np.int16), "ok": ((), np.bool_)}, self._fill)
        self._seeds = {part: Seeder(base, (key, part), match.shape[0]) for part in (_LEVEL, _CHUNK_KEY)}

    def _fill(self, rid: int, chunk: int) -> dict[str, np.ndarray]:
        a_r = _beta_mean_sd(self._seeds[_LEVEL].generator(rid), float(self._accept[rid]), self._spread)
        rng = self._seeds[_CHUNK_KEY].generator(rid, chunk)
        has = rng.random(CHUNK) < self._match[rid]
        length = rng.geometric(1.0 / self._match_len[rid], size=CHUNK)  # continuation length, mean match_len
        ok = rng.random(CHUNK) < a_r
        return {"match": np.where(has, np.minimum(length, 2**15 - 1), 0).astype(np.int16), "ok": ok}

    def score_chain(self, rids: np.ndarray, pos: np.ndarray,
                    k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Proposed = ``min(k, match length)``, accepted = leading copied tokens the target accepts, matched = every
        copied token it accepts."""
        store = self.store
        idx = store.locate(rids, pos)  # may grow the pools: index them afterwards
        proposed = np.minimum(k, store.pools["match"][idx]).astype(np.int64)
        kmax = int(proposed.max()) if proposed.size else 0
        if kmax == 0:
            return proposed, np.zeros_like(proposed), np.zeros_like(proposed)
        if kmax >= _AR.size:
            raise ValueError(f"chain length {kmax} too long (at most {_AR.size - 1})")
        idx = store.locate(rids[:, None], pos[:, None] + _AR[:kmax + 1])
        hit = store.pools["ok"][idx] & (_AR[:kmax + 1] < proposed[:, None])  # last column: always False
        return proposed, hit.argmin(axis=1), hit.sum(axis=1)  # leading accepted tokens, every matching one
