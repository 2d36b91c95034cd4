"""Token oracle: ground truth for what speculation would achieve, with common random numbers.

The oracle models, for request ``r`` at output position ``t`` (0-based), the draft model's distribution over
its top-``W`` tokens and the target's choice among them (docs/design.md, "Token oracle"):

- **acceptance level.** Each request draws a level ``a_r ~ Beta`` with mean ``a_dataset`` (the table entry
  of the (draft, target) pair, e.g. TurboSpec Table 3) and standard deviation ``spread``. With ``drift`` the
  level starts at ``a_0`` and relaxes to ``a_r``: ``a_r(t) = a_r + (a_0 - a_r)·exp(-t/τ)`` (LAPS-SD Figure
  3: acceptance is unstable early in a request and settles after ~150 tokens). ``a_0`` is drawn either around
  an absolute mean (``a0``) or at an offset below the request's own level (``offset``: ``a_0 = a_r - o_r``,
  ``o_r ~ Normal(offset, offset_spread)``, clipped into [A0_MIN, 1 - A0_MIN]). Off by default.
- **per-position distribution.** The draft's top-1 probability ``p0(r, t) ~ Beta(mean a_r(t), concentration
  κ_pos)``; rank ``j ≥ 1`` gets ``(1 - p0)(1 - q) q^(j-1)`` with ``q = max(decay, 1 - p0/(1 - p0))`` (the
  smallest ratio that keeps the ranks sorted), so ``(1 - p0) q^(W-1)`` of the mass lies outside the top
  ``W``.
- **truth.** The target's token at ``t`` is the draft's rank-``j`` token with probability ``p_j`` (a
  calibrated draft) or none of the top ``W`` (rank ``W``, a "miss"). Hence ``P(rank 0) = E[p0] =
  a_dataset``: a chain's per-token acceptance converges to the configured mean.
- **what the drafter reports.** ``confidence`` γ distorts the reported probabilities: ``∝ p^γ``,
  renormalised over the same top-``W`` mass (γ = 1 calibrated, γ > 1 over-confident, γ < 1 under-confident).
  Truth is always drawn from the true ``p``.
- **acceptance.** A chain of ``k`` accepts the longest prefix of positions whose true rank is 0; a tree
  accepts the longest root path that follows the true ranks (node at depth ``i`` is on the true path iff its
  rank equals the true rank at ``pos + i - 1`` and its parent is on the path).
- **off-path nodes.** A node off the true path (its context differs from the true text) has its own child
  distribution, drawn like a true one (``Beta(a_r(s), κ_pos)`` at its children's position ``s``). Each
  position keeps ``NUM_ALT`` such draws; an off-path node picks one by a hash of (seed, r, divergence
  position, ranks after the divergence), i.e. of its absolute context, so the same context always gets the
  same distribution.
- **common random numbers.** Everything at (r, t) depends only on (seed, r, t): values are generated lazily
  in chunks of ``CHUNK`` positions, each chunk from its own generator seeded by (seed, stream key, r, chunk
  index), so neither the order nor the number of queries, nor the request's length, changes them. (The generators
  are NumPy's ``PCG64(SeedSequence(...))`` ones, set up by :class:`repro.core.seeding.Seeder` for every request at
  once.)
- **streams.** Each proposer draws from a named stream (its ``stream``, :mod:`repro.sim.proposers`): the oracle
  knows streams, not proposer kinds. Built in: ``"draft"`` (the draft model; the pair's table), ``"eagle"`` (same
  mechanics, the EAGLE table) and ``"pld"`` (prompt lookup: at each position a match exists with probability
  ``match``; it proposes ``min(k, match length)`` tokens accepted as a chain with per-token acceptance ``a_r ~
  Beta(accept, spread)``; no match → nothing proposed). :meth:`TokenOracle.add_stream` adds a draft-model stream
  with its own table and seed key (a remote draft server running another draft model, GoodSpeed). Every method
  that scores or drafts takes a stream name or a proposer object (its ``stream`` is used).

Storage is a flat pool per stream: chunk slots addressed through a (request × chunk) table, so a batch
query is a handful of fancy-indexing operations with no per-request Python. Off-path distributions live in a
second store, generated (from their own seeds) only for chunks a beam search reaches, so chain-only runs
never pay for them. Likewise a chain reads only whether the true rank is 0 (the uniform below p0), stored with
the chunk; the ranks themselves are computed from p0 and the uniform once a tree first reads them (the same
values as computing them with the chunk). ``release(rid)`` frees a finished request's chunks.

Deviations (from a real draft model): ranks below the top-1 follow a deterministic geometric profile given
``p0`` (no per-position noise); positions are independent given the request level; off-path distributions
are shared among contexts that hash to the same of the ``NUM_ALT`` draws of a position.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from repro.core.seeding import Seeder
from repro.core.speculation import DRAFT, EAGLE, PLD, CandidateTree, TreeSpec

if TYPE_CHECKING:
    from repro.core.speculation import HasStream as Proposer

CHUNK = 512  # positions generated per (request, chunk); a power of two
ALT_CHUNK = 256  # positions per chunk of off-path distributions (NUM_ALT draws per position)
NUM_ALT = 16  # off-path child distributions kept per position; a power of two
P_FLOOR = 1e-6  # numerical floor on a drawn top-1 probability (keeps every reported probability in (0, 1])
MAX_WIDTH = 127  # ranks are stored as int8

_ALT_MASK = np.uint64(NUM_ALT - 1)
#: a child's rank in the hash of its context: (rank + 1)·0xD1B54A32D192ED03 (wrapping), by rank
_RANK_SALT = (np.arange(1, MAX_WIDTH + 2, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03))
_RANK_SALT.flags.writeable = False
#: Seed keys of the built-in streams (draft model, EAGLE head, prompt lookup): every value of a stream is drawn from
#: generators seeded by (seed, its key, ...), so these keys are part of every result.
DRAFT_KEY, EAGLE_KEY, PLD_KEY = 0, 1, 2
_LEVEL, _CHUNK_KEY, _ALT_KEY = 0, 1, 2
_INIT_SLOTS = 64
_AR = np.arange(4096, dtype=np.int64)
_AR.flags.writeable = False


# --- helpers ----------------------------------------------------------------------------------------------

def _as_seed_seq(seed: np.random.SeedSequence | int) -> np.random.SeedSequence:
    return seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> _U30)) * _MIX_1
    z = (z ^ (z >> _U27)) * _MIX_2
    return z ^ (z >> _U31)


_U27, _U30, _U31 = np.uint64(27), np.uint64(30), np.uint64(31)
_MIX_1, _MIX_2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _beta_mean_sd(rng: np.random.Generator, mean: float, sd: float) -> float:
    """One draw of a Beta with the given mean and standard deviation (``sd = 0``: the mean itself)."""
    if sd <= 0.0:
        return mean
    conc = mean * (1.0 - mean) / sd**2 - 1.0
    return float(rng.beta(mean * conc, (1.0 - mean) * conc))


def _check_mean(name: str, mean: float, sd: float) -> float:
    mean = float(mean)
    if not 0.0 < mean < 1.0:
        raise ValueError(f"{name}: mean {mean} must lie in (0, 1)")
    if sd > 0.0 and sd**2 >= mean * (1.0 - mean):
        raise ValueError(f"{name}: spread {sd} too large for mean {mean} (need spread² < mean·(1 - mean))")
    return mean


def _check_mean_of(what: str, spread: float, dataset: str, mean: float) -> float:
    return _check_mean(f"{what} / {dataset}", mean, spread)


def _per_request(dataset: np.ndarray, table: Mapping[str, Any], default: Any, what: str,
                 value: Callable[[str, Any], Any]) -> list[Any]:
    """Look up each request's dataset in ``table`` (then its ``default`` key, then ``default``)."""
    names, inverse = np.unique(dataset.astype(str), return_inverse=True)
    found = []
    for name in names.tolist():
        entry = table.get(name, table.get("default", default))
        if entry is None:
            raise KeyError(f"no {what} for dataset {name!r} (and no default); add it to conf/oracle")
        found.append(value(name, entry))
    return [found[i] for i in inverse.reshape(-1).tolist()]


A0_MIN = 0.01  # a relative drift start (level − offset) is clipped into [A0_MIN, 1 − A0_MIN]
_DRIFT_KEYS = ({"a0", "tau"}, {"a0", "tau", "a0_spread"}, {"offset", "tau"}, {"offset", "tau", "offset_spread"})


def _drift_arrays(dataset: np.ndarray, drift: Mapping[str, Any] | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Per request, its dataset's drift shape: the start's mean (or offset) and sd, the time constant τ (NaN: no
    drift) and whether the start is relative to the request's level (1.0) or absolute (0.0).

    ``drift`` is one shape for every dataset, or a table dataset → shape or ``None`` (``"default"`` covers the
    datasets not listed; without it they do not drift). A shape is ``{a0, tau[, a0_spread]}`` (the start drawn
    around the absolute mean a0) or ``{offset, tau[, offset_spread]}`` (the start ``offset`` below the request's own
    level, the offset drawn per request with sd ``offset_spread``)."""
    if not drift:
        return None
    table: Mapping[str, Any] = {"default": drift} if "tau" in drift else drift

    def shape(name: str, entry: Any) -> tuple[float, float, float, float]:
        if entry is None:
            return (math.nan, math.nan, math.nan, math.nan)
        if not isinstance(entry, Mapping) or set(entry) not in _DRIFT_KEYS:
            raise ValueError(f"oracle drift for {name!r}: expected {{a0, tau[, a0_spread]}}, "
                             f"{{offset, tau[, offset_spread]}} or null, got {entry!r}")
        tau = float(entry["tau"])
        if not tau > 0.0:
            raise ValueError(f"oracle drift for {name!r}: tau must be > 0 tokens, not {tau}")
        if "offset" in entry:
            offset, osd = float(entry["offset"]), float(entry.get("offset_spread", 0.0))
            if not -1.0 < offset < 1.0 or osd < 0.0:
                raise ValueError(f"oracle drift for {name!r}: offset must lie in (-1, 1) and offset_spread be "
                                 f">= 0, not {offset}, {osd}")
            return (offset, osd, tau, 1.0)
        a0, sd = float(entry["a0"]), float(entry.get("a0_spread", 0.0))
        _check_mean(f"drift a0 of {name!r}", a0, sd)
        return (a0, sd, tau, 0.0)

    names, inverse = np.unique(dataset.astype(str), return_inverse=True)
    found = [shape(name, table.get(name, table.get("default"))) for name in names.tolist()]
    arr = np.array(found, dtype=np.float64).reshape(-1, 4)[inverse.reshape(-1)]
    return arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy(), arr[:, 3].copy()


def true_dist(p0: np.ndarray, width: int, decay: float) -> np.ndarray:
    """The draft's top-``width`` probabilities (last axis, sorted descending) given its top-1 ``p0``."""
    rest = 1.0 - p0
    q = np.maximum(decay, 1.0 - p0 / rest)
    p1 = np.minimum(rest * (1.0 - q), p0)  # = p0 when q is raised: exact, so ties break towards rank 0
    lower = p1[..., None] * q[..., None] ** _AR[:width - 1]
    return np.concatenate([p0[..., None], lower], axis=-1)


def sample_rank(p0: np.ndarray, u: np.ndarray, width: int, decay: float) -> np.ndarray:
    """Inverse CDF of :func:`true_dist` at uniforms ``u``: the target's rank (``width`` = not in the top W).

    The cumulative mass through rank ``j ≥ 1`` is ``p0 + p1 (1 - q^j)/(1 - q)``, so the rank is the smallest
    ``j`` with ``q^j < 1 - (u - p0)(1 - q)/p1``.
    """
    rest = 1.0 - p0
    q = np.maximum(decay, 1.0 - p0 / rest)
    one_q = 1.0 - q
    p1 = np.minimum(rest * one_q, p0)
    y = np.maximum(1.0 - (u - p0) * one_q / p1, 1e-300)
    j = np.floor(np.log(y) / np.log(q)) + 1.0
    return np.where(u < p0, 0, np.minimum(j, width)).astype(np.int8)


def reported_dist(p: np.ndarray, confidence: float) -> np.ndarray:
    """What the drafter reports: ``p^γ`` renormalised to the same total mass (γ = 1: ``p`` itself)."""
    if confidence == 1.0:
        return p
    r = p**confidence
    return r * (p.sum(axis=-1, keepdims=True) / r.sum(axis=-1, keepdims=True))


def _positions(pos: np.ndarray, depth: int) -> np.ndarray:
    """Validated int64 start positions for a lookahead of ``depth`` tokens."""
    pos = np.asarray(pos, dtype=np.int64).reshape(-1)
    if not 1 <= depth < _AR.size or (pos.size and int(pos.min()) < 0):
        raise ValueError(f"depth must lie in 1..{_AR.size - 1} and positions be >= 0")
    return pos


def _top(x: np.ndarray, width: int) -> np.ndarray:
    """Per row of ``x`` (n, m), the column indices of its ``width`` largest values, ties to the lower index, in
    increasing order: ``np.sort(np.argsort(-x, axis=1, kind="stable")[:, :width], axis=1)``, which it equals
    exactly. Over wide rows a partition finds each row's ``width``-th largest value t; the picks are then the values
    above t and, in index order, as many equal to t as are still needed."""
    n, m = x.shape
    if width >= m:
        return np.repeat(_AR[None, :m], n, axis=0)
    if x.size < 512:
        pick = np.argsort(-x, axis=1, kind="stable")[:, :width]
        pick.sort(axis=1)
        return pick
    neg = -x
    t = np.partition(neg, width - 1, axis=1)[:, width - 1:width]
    sel = neg <= t  # at least width per row: more in a row where values tie at t
    if np.count_nonzero(sel) != n * width:  # ties at t beyond the width: the lower indices
        above = neg < t
        tied = neg == t
        more = width - above.sum(axis=1)
        sel = above | (tied & (np.cumsum(tied, axis=1) <= more[:, None]))
    return np.nonzero(sel)[1].reshape(n, width)


# --- storage ----------------------------------------------------------------------------------------------

class _ChunkStore:
    """Per-request chunks of per-position arrays in flat pools; index = ``slot·chunk + offset``."""

    def __init__(self, num_requests: int, fields: Mapping[str, tuple[tuple[int, ...], type]],
                 fill: Callable[[int, int], Mapping[str, np.ndarray]], chunk: int = CHUNK) -> None:
        self._fields = dict(fields)
        self._fill = fill
        self.chunk, self._shift, self._mask = chunk, chunk.bit_length() - 1, chunk - 1
        self.table = np.full((num_requests, 1), -1, dtype=np.int64)
        self.pools: dict[str, np.ndarray] = {
            n: np.zeros((_INIT_SLOTS * chunk, *s), dtype=d) for n, (s, d) in self._fields.items()}
        self._free = list(range(_INIT_SLOTS - 1, -1, -1))
        self._held = 0  # chunks generated and not released

    def locate(self, rids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Flat pool indices of (rids, positions) (broadcast together), generating missing chunks."""
        chunk = positions >> self._shift  # positions must be >= 0 (the public methods check)
        return (self._slots(rids, chunk) << self._shift) | (positions & self._mask)

    def window(self, rids: np.ndarray, first: np.ndarray, length: int, last: np.ndarray) -> np.ndarray:
        """:meth:`locate` of positions ``min(first + j, last)`` for ``j < length`` (each request's next positions up to
        its ``last``; ``first <= last``): (requests, length). Where every request's window lies in one chunk (the
        common case), that chunk's slot is looked up once per request instead of once per position."""
        ar = _AR[:length] if length <= _AR.size else np.arange(length)
        head, tail = first >> self._shift, last >> self._shift
        if not (head == tail).all():
            for d in range(int((tail - head).max()) + 1):  # each request's chunks, generated a column at a time
                self._slots(rids, np.minimum(head + d, tail))
            return self.locate(rids[:, None], np.minimum(first[:, None] + ar, last[:, None]))
        base = (self._slots(rids, head) << self._shift) | (first & self._mask)
        return base[:, None] + np.minimum(ar, (last - first)[:, None])

    def _slots(self, rids: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """The pool slots of chunks (rids, chunk) (broadcast together), generating the missing ones."""
        try:
            slots = self.table[rids, chunk]
        except IndexError:  # a chunk index beyond the table: widen it
            grow = max(int(chunk.max()) + 1, 2 * self.table.shape[1])
            self.table = np.pad(self.table, ((0, 0), (0, grow - self.table.shape[1])), constant_values=-1)
            slots = self.table[rids, chunk]
        if slots.size and slots.min() < 0:
            missing = slots < 0
            rr = (rids if rids.shape == chunk.shape else np.broadcast_to(rids, chunk.shape))[missing].tolist()
            for r, c in sorted(set(zip(rr, chunk[missing].tolist(), strict=True))):
                self._generate(r, c)
            slots = self.table[rids, chunk]
        return slots

    def _generate(self, rid: int, chunk: int) -> None:
        if not self._free:
            cap = self.pools[next(iter(self.pools))].shape[0] // self.chunk
            for name, arr in self.pools.items():
                self.pools[name] = np.concatenate([arr, np.zeros_like(arr)])
            self._free = list(range(2 * cap - 1, cap - 1, -1))
        slot = self._free.pop()
        self._held += 1
        for name, values in self._fill(rid, chunk).items():
            self.pools[name][slot * self.chunk:(slot + 1) * self.chunk] = values
        self.table[rid, chunk] = slot

    def release(self, rid: int) -> None:
        if not self._held:
            return
        row = self.table[rid]
        slots = row[row >= 0].tolist()
        self._free.extend(slots)
        self._held -= len(slots)
        row[:] = -1

    @property
    def num_chunks(self) -> int:
        return self._held


@dataclass(frozen=True, slots=True)
class _Beam:
    """A batch of candidate trees as (n, depth·width) arrays."""

    parent: np.ndarray
    rank: np.ndarray
    prob: np.ndarray
    path_prob: np.ndarray


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
        # per position: the draft's top-1 probability, the target's uniform, whether the target's token is the
        # draft's top-1 (u < p0: all a chain reads) and the target's rank, computed from p0 and u only once a tree
        # reads ranks (:meth:`_ranks`)
        self.store = _ChunkStore(n, {"p0": ((), np.float32), "u": ((), np.float64), "hit": ((), np.bool_),
                                     "rank": ((), np.int8)}, self._fill)
        self._ranked = False
        # off-path child distributions: generated only for chunks a beam search reaches (own seeds)
        self.alt_store = _ChunkStore(n, {"alt": ((NUM_ALT,), np.float32)}, self._fill_alt, ALT_CHUNK)

    def level(self, rid: int) -> tuple[float, float]:
        """The request's level a_r and its drift start a_0 (drawn on first use, seeded by (seed, r))."""
        if math.isnan(self._level[rid]):
            rng = self._seeds[_LEVEL].generator(rid)
            self._level[rid] = _beta_mean_sd(rng, float(self._means[rid]), self._spread)
            if self._drift is not None and math.isfinite(self._drift[2][rid]):
                mean, sd = float(self._drift[0][rid]), float(self._drift[1][rid])
                if self._drift[3][rid]:  # relative: a_0 = a_r - offset_r, offset_r ~ Normal(offset, sd)
                    offset = mean + sd * float(rng.standard_normal()) if sd > 0.0 else mean
                    self._a0[rid] = min(max(self._level[rid] - offset, A0_MIN), 1.0 - A0_MIN)
                else:
                    self._a0[rid] = _beta_mean_sd(rng, mean, sd)
        return float(self._level[rid]), float(self._a0[rid])

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

    def _fill(self, rid: int, chunk: int) -> dict[str, np.ndarray]:
        rng = self._seeds[_CHUNK_KEY].generator(rid, chunk)
        p0 = self._draw_p0(rng, rid, chunk * CHUNK, (CHUNK,))
        u = rng.random(CHUNK)
        out = {"p0": p0, "u": u, "hit": u < p0.astype(np.float64)}  # rank 0 exactly where u < p0 (sample_rank)
        if self._ranked:
            out["rank"] = self._sample_rank(p0, u)
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
        rng = self._seeds[_ALT_KEY].generator(rid, chunk)
        return {"alt": self._draw_p0(rng, rid, chunk * ALT_CHUNK, (ALT_CHUNK, NUM_ALT))}

    def true_ranks(self, rids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        idx = self.store.locate(rids, positions)  # may grow the pools: index them afterwards
        return self._ranks()[idx]

    def score_chain(self, rids: np.ndarray, pos: np.ndarray,
                    k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Proposed = k, accepted = leading positions whose true rank is 0, matched = all of them."""
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
        n = rids.size
        reach = steps * (k + 1)  # a step advances at most k + 1 positions
        last = pos + (reach + k - 1) if end is None else np.minimum(pos + (reach + k - 1), np.maximum(end, pos + 1) - 1)
        idx = self.store.window(rids, pos, reach + k, last)  # may grow the pools: index them afterwards
        hit = self.store.pools["hit"][idx]
        lead = hit[:, :reach].astype(np.int64)  # leading positions whose true rank is 0, at most k
        count = lead.copy()  # positions among the k drafted whose true rank is 0
        alive = hit[:, :reach].copy()
        for i in range(1, k):
            window = hit[:, i:i + reach]
            alive &= window
            lead += alive
            count += window
        # where each step starts, as flat indices into the (requests × reach) arrays: a step at offset p accepts
        # lead[p] tokens and emits one more, so the next starts at p + lead[p] + 1 (never followed past the run)
        base = np.arange(0, n * reach, reach, dtype=np.int64)
        jump = (lead + (base[:, None] + 1) + np.arange(reach)).ravel()
        at = np.empty((steps, n), dtype=np.int64)
        at[0] = cur = base
        for j in range(1, steps):
            at[j] = cur = jump[cur]
        return lead.ravel()[at], count.ravel()[at]

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

    def _positions(self, rids: np.ndarray, pos: np.ndarray,
                   depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What a tree of ``depth`` layers over each request's next positions reads: the true p0 and rank per
        (request, layer), the off-path pool and its index, and the hash of (seed, r, divergence position) that
        seeds an off-path node's distribution."""
        grid = pos[:, None] + _AR[:depth]
        idx = self.store.locate(rids[:, None], grid)
        alt_idx = self.alt_store.locate(rids[:, None], grid) if depth > 1 else idx
        pools, ranks = self.store.pools, self._ranks()
        div = _mix(self._salt ^ _mix(rids.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)
                                     ^ grid.astype(np.uint64)))
        return pools["p0"][idx].astype(np.float64), ranks[idx], self.alt_store.pools["alt"], alt_idx, div

    def beam(self, rids: np.ndarray, pos: np.ndarray, depth: int, width: int) -> _Beam:
        """AdaServe §4.3 Step 1 beam search for a batch: layer 1 = the root's top ``width`` children; each
        later layer = the top ``width`` of the ``width × W`` children of the previous layer by path
        probability (the draft's reported probabilities).

        Only each parent's first ``width`` ranks are scored: a parent's reported probabilities do not increase
        with rank, so a rank at or past ``width`` could be picked only after the ``width`` ranks before it (no
        less probable, and first on ties), which already fill the layer. The picks are those of all ``W``."""
        if not 1 <= width <= self.width:
            raise ValueError(f"beam width {width} outside 1..{self.width} (the oracle models the draft's top "
                             f"{self.width} tokens; raise oracle.width)")
        n = rids.shape[0]
        p0_true, rank_true, alt, alt_idx, div = self._positions(rids, pos, depth)
        out_parent = np.empty((n, depth * width), dtype=np.int64)
        out_rank = np.empty((n, depth * width), dtype=np.int64)
        out_prob = np.empty((n, depth * width))
        out_pp = np.empty((n, depth * width))
        on = np.ones((n, 1), dtype=bool)
        pp = np.ones((n, 1))
        h = np.zeros((n, 1), dtype=np.uint64)
        rows = _AR[:n, None] if n <= _AR.size else np.arange(n)[:, None]  # x[rows, j]: take_along_axis(x, j, 1)
        for i in range(depth):
            # children of the previous layer sit at position pos + i
            node_p0 = p0_true[:, i:i + 1] if i == 0 else np.where(
                on, p0_true[:, i:i + 1], alt[alt_idx[:, i:i + 1], (h & _ALT_MASK).astype(np.int64)])
            rep3 = self.reported(node_p0, width)  # (n, nodes, width): each node's top width of its W
            cpp = (pp[:, :, None] * rep3).reshape(n, node_p0.shape[1] * width)
            rep = rep3.reshape(n, node_p0.shape[1] * width)
            pick = _top(cpp, width)  # BFS: parent-major, then rank
            slot, rk = pick // width, pick % width
            par_on = on[rows, slot]
            base = np.where(par_on, div[:, i:i + 1], h[rows, slot])
            h = _mix(base ^ _RANK_SALT[rk])
            on = par_on & (rk == rank_true[:, i:i + 1])
            pp = cpp[rows, pick]
            cols = slice(i * width, (i + 1) * width)
            out_parent[:, cols] = slot + (i - 1) * width if i else -1
            out_rank[:, cols] = rk
            out_prob[:, cols] = rep[rows, pick]
            out_pp[:, cols] = pp
        return _Beam(out_parent, out_rank, out_prob, out_pp)

    def expand(self, rids: np.ndarray, pos: np.ndarray, expansion: tuple[int, ...]) -> tuple[_Beam, np.ndarray]:
        """SpecInfer's fixed expansion ⟨k_1, …, k_D⟩ for a batch: every node of layer i − 1 gets its own top
        ``k_i`` children (its ranks 0..k_i − 1), so layer i holds k_1·…·k_i nodes per request. Returns the nodes as
        (n, Σ layer sizes) arrays in BFS order (parent-major, then rank) and each node's depth. Off-path nodes get
        the same context-hashed distributions as in :meth:`beam`."""
        if not expansion or min(expansion) < 1 or max(expansion) > self.width:
            raise ValueError(f"expansion {list(expansion)}: child counts must lie in 1..{self.width} (the oracle "
                             "models the draft's top W tokens; raise oracle.width)")
        n, depth = rids.shape[0], len(expansion)
        p0_true, rank_true, alt, alt_idx, div = self._positions(rids, pos, depth)
        layers, parent, rank, node_depth = _expansion_layout(expansion)
        probs, pps = [], []
        on = np.ones((n, 1), dtype=bool)
        pp = np.ones((n, 1))
        h = np.zeros((n, 1), dtype=np.uint64)
        for i, (width, k, slot, rk, salt) in enumerate(layers):
            node_p0 = p0_true[:, i:i + 1] if i == 0 else np.where(
                on, p0_true[:, i:i + 1], alt[alt_idx[:, i:i + 1], (h & _ALT_MASK).astype(np.int64)])
            rep = self.reported(node_p0, k)  # (n, width, k): each node's own top k, rank order
            cpp = (pp[:, :, None] * rep).reshape(n, width * k)
            par_on = on[:, slot]
            base = np.where(par_on, div[:, i:i + 1], h[:, slot])
            h = _mix(base ^ salt)
            on = par_on & (rk == rank_true[:, i:i + 1])
            pp = cpp
            probs.append(rep.reshape(n, width * k))
            pps.append(cpp)
        beam = _Beam(np.repeat(parent[None, :], n, axis=0), np.repeat(rank[None, :], n, axis=0),
                     np.concatenate(probs, axis=1), np.concatenate(pps, axis=1))
        return beam, node_depth.copy()


@functools.lru_cache(maxsize=64)
def _expansion_layout(expansion: tuple[int, ...]) -> tuple[tuple[tuple[int, int, np.ndarray, np.ndarray, np.ndarray],
                                                                 ...], np.ndarray, np.ndarray, np.ndarray]:
    """What a fixed expansion's trees share whatever the requests: per layer (its parents' count, k, each child's
    parent slot and rank, the rank's hash salt), and every node's parent index, rank and depth in BFS order."""
    layers, parents, ranks, depths = [], [], [], []
    width, start = 1, -1  # the previous layer's node count and first node (-1: the root)
    for i, k in enumerate(expansion):
        slot = np.repeat(np.arange(width), k)
        rk = np.tile(np.arange(k), width)
        layers.append((width, k, slot, rk, _RANK_SALT[rk]))
        parents.append(slot + start if i else np.full(width * k, -1))
        ranks.append(rk)
        depths.append(np.full(width * k, i + 1, dtype=np.int64))
        start = start + width if i else 0
        width *= k
    out = (np.concatenate(parents).astype(np.int64), np.concatenate(ranks).astype(np.int64), np.concatenate(depths))
    for arr in (*out, *(a for layer in layers for a in layer[2:])):
        arr.flags.writeable = False
    return tuple(layers), *out


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


# --- public API -------------------------------------------------------------------------------------------

class TokenOracle:
    """Acceptance ground truth with common random numbers (see the module docstring for the model).

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
    """

    def __init__(self, seed: np.random.SeedSequence | int, dataset: np.ndarray,
                 accept_mean: Mapping[str, float], *, default_accept: float | None = None,
                 eagle_accept_mean: Mapping[str, float] | None = None,
                 pld: Mapping[str, Mapping[str, float]] | None = None, width: int = 16, spread: float = 0.1,
                 pos_concentration: float = 2.0, decay: float = 0.7, confidence: float = 1.0,
                 drift: Mapping[str, Any] | None = None, pair: str = "(draft, target)") -> None:
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
        self._missing: dict[str, str] = {}  # stream -> why its table is missing (raised on use)
        self._streams: dict[str, _TokenStream | _PldStream] = {}
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
                 draft: str | None, target: str) -> TokenOracle:
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
                   drift=drift, pair=f"{draft}/{target}")
        oracle._missing.update(missing)
        if cfg.get("kind", "model") == "trace":
            oracle.use_trace(cfg.get("path"))
        return oracle

    def use_trace(self, path: Any) -> None:
        """Replace the draft model's stream with a recording (:class:`_TraceStream`) read from ``path`` (a parquet
        file written by ``backend=hf backend.record=PATH``)."""
        import pandas as pd

        if not path:
            raise FileNotFoundError("oracle=trace needs oracle.path=PATH: an acceptance recording written by "
                                    "backend=hf backend.record=PATH")
        try:
            record = pd.read_parquet(str(path), columns=["rid", "pos", "rank", "p0"])
        except (FileNotFoundError, OSError) as exc:
            raise FileNotFoundError(f"oracle.path: cannot read the acceptance recording {str(path)!r} ({exc}); "
                                    "write one with backend=hf backend.record=PATH") from None
        self._streams[DRAFT] = _TraceStream(DRAFT, DRAFT_KEY, self._base, record, self._dataset.size,
                                            width=self.width, pos_concentration=self._kappa, decay=self._decay,
                                            confidence=self._gamma)
        self._missing.pop(DRAFT, None)

    def accept_prob_sum(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                        proposer: str | Proposer = DRAFT) -> np.ndarray:
        """Per chain, Σ_j min(1, p_j(s_j) / q_j(s_j)) over its ``k`` drafted tokens as a verifier computes it in its
        one pass over every drafted position (GoodSpeed Eq. 3): here each position's probability that the target
        keeps the draft's token, the sum's expectation. A policy sees it only through ``StepResult.accept_prob``."""
        return self._stream(proposer).accept_prob_sum(np.asarray(rids, dtype=np.int64),
                                                      np.asarray(pos, dtype=np.int64), np.asarray(k, dtype=np.int64))

    def level(self, rid: int, proposer: str | Proposer = DRAFT) -> float:
        """Request ``rid``'s per-token acceptance level a_r on a draft stream: the ground truth a simulation may
        report (GoodSpeed's optimum x*), never something a policy reads."""
        return self._stream(proposer).level(rid)[0]

    def _any_stream(self, proposer: str | Proposer) -> _TokenStream | _PldStream:
        """The stream a stream name or a proposer (its ``stream``) is scored on."""
        name = proposer if isinstance(proposer, str) else proposer.stream
        stream = self._streams.get(name)
        if stream is None:
            if name in self._missing:
                raise KeyError(self._missing[name])
            raise ValueError(f"proposer stream {name!r} is not configured in this oracle "
                             f"(available: {sorted(self._streams)})")
        return stream

    def _stream(self, proposer: str | Proposer) -> _TokenStream:
        """The draft distribution a stream name or a proposer drafts from (trees, beams, reported probabilities)."""
        stream = self._any_stream(proposer)
        if not isinstance(stream, _TokenStream):
            raise ValueError(f"proposer stream {stream.name!r} has no draft distribution (prompt lookup proposes "
                             "chains only)")
        return stream

    def accept_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                     proposer: str | Proposer = DRAFT) -> tuple[np.ndarray, np.ndarray]:
        """(num_proposed, num_accepted) per request for a chain of ``k[i]`` tokens starting at ``pos[i]``.

        Draft/EAGLE: proposed = k, accepted = leading positions whose true rank is 0. PLD: proposed =
        ``min(k, match length)`` (0 without a match), accepted = leading copied tokens the target accepts.
        """
        proposed, accepted, _ = self.score_chain(rids, pos, k, proposer)
        return proposed, accepted

    def score_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                    proposer: str | Proposer = DRAFT) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`accept_chain` plus ``num_matched``: the proposed positions whose token is the target's, whether
        or not an earlier position was rejected (what vLLM v0's ``draft_acceptance_rate`` counts: matched /
        proposed estimates the per-token acceptance α; accepted / proposed is lower, the chain stopping at the
        first rejection)."""
        rids = np.asarray(rids, dtype=np.int64)
        pos = np.asarray(pos, dtype=np.int64)
        k = np.asarray(k, dtype=np.int64)  # k >= 0 (the engine checks plans)
        if pos.size and int(pos.min()) < 0:
            raise ValueError("positions must be >= 0")
        return self._any_stream(proposer).score_chain(rids, pos, k)

    def chain_run(self, rids: np.ndarray, pos: np.ndarray, k: int, steps: int,
                  proposer: str | Proposer = DRAFT, *, end: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray] | None:
        """What :meth:`score_chain` returns, step after step, when requests ``rids`` at ``pos`` draft a chain of
        ``k`` > 0 in each of ``steps`` steps, each step starting after the previous one's accepted + 1 tokens:
        (accepted, matched) as (steps, requests) arrays (proposed is ``k`` throughout). ``end`` (per request, e.g.
        its output length + k) bounds the positions read: a request's values are exact for the steps that read
        only positions before it. ``None`` for a stream that proposes before verification (prompt lookup, whose
        chains depend on matches)."""
        stream = self._any_stream(proposer)
        if not isinstance(stream, _TokenStream):
            return None
        return stream.chain_run(np.asarray(rids, dtype=np.int64), np.asarray(pos, dtype=np.int64), int(k),
                                int(steps), None if end is None else np.asarray(end, dtype=np.int64))

    def accept_tree(self, tree: TreeSpec, proposer: str | Proposer = DRAFT) -> int:
        """Accepted tokens: depth of the deepest selected node on the true path (ancestors all selected)."""
        return self.accept_trees([tree], proposer)[0]

    def accept_trees(self, trees: list[TreeSpec], proposer: str | Proposer = DRAFT) -> list[int]:
        """:meth:`accept_tree` of several trees, their true ranks read in one pass (each tree's positions only)."""
        sel = [np.sort(np.asarray(t.nodes, dtype=np.int64)) for t in trees]
        out = [0] * len(trees)
        some = [j for j, nodes in enumerate(sel) if nodes.size]
        if not some:
            return out
        reach = np.array([int(trees[j].cand.depth[sel[j]].max()) for j in some])
        rids = np.array([trees[j].cand.rid for j in some], dtype=np.int64)
        pos = np.array([trees[j].cand.pos for j in some], dtype=np.int64)
        grid = pos[:, None] + np.minimum(_AR[:int(reach.max())], reach[:, None] - 1)  # past its reach: its last
        truth = self._stream(proposer).true_ranks(rids[:, None], grid)
        for j, row in zip(some, truth, strict=True):
            cand, nodes = trees[j].cand, sel[j]
            on_path = {-1}
            best = 0
            for i in nodes[cand.rank[nodes] == row[cand.depth[nodes] - 1]].tolist():  # BFS order: parents first
                if int(cand.parent[i]) in on_path:
                    on_path.add(i)
                    best = max(best, int(cand.depth[i]))
            out[j] = best
        return out

    def candidates(self, rid: int, pos: int, depth: int, width: int,
                   proposer: str | Proposer = DRAFT) -> CandidateTree:
        """Beam-search candidate tree of ``depth`` × ``width`` (AdaServe §4.3 Step 1) for one request."""
        return self.candidates_batch(np.array([rid]), np.array([pos]), depth, width, proposer)[0]

    def candidates_batch(self, rids: np.ndarray, pos: np.ndarray, depth: int, width: int,
                         proposer: str | Proposer = DRAFT) -> list[CandidateTree]:
        """:meth:`candidates` for a batch, vectorized over requests."""
        rids = np.asarray(rids, dtype=np.int64).reshape(-1)
        pos = _positions(pos, depth)
        beam = self._stream(proposer).beam(rids, pos, depth, width)
        node_depth = np.repeat(np.arange(1, depth + 1, dtype=np.int64), width)
        for arr in (node_depth, beam.parent, beam.rank, beam.prob, beam.path_prob):
            arr.flags.writeable = False
        return [CandidateTree(int(r), int(p), beam.parent[i], node_depth, beam.rank[i], beam.prob[i],
                              beam.path_prob[i], depth, width)
                for i, (r, p) in enumerate(zip(rids.tolist(), pos.tolist(), strict=True))]

    def expansion_batch(self, rids: np.ndarray, pos: np.ndarray, expansion: tuple[int, ...],
                        proposer: str | Proposer = DRAFT) -> list[CandidateTree]:
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

    def chain_probs(self, rid: int, pos: int, k: int, proposer: str | Proposer = DRAFT) -> np.ndarray:
        """The draft's reported top-1 probability at each of the ``k`` steps of its greedy chain."""
        return self.chain_probs_batch(np.array([rid]), np.array([pos]), k, proposer)[0]

    def chain_probs_batch(self, rids: np.ndarray, pos: np.ndarray, k: int,
                          proposer: str | Proposer = DRAFT) -> np.ndarray:
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
                   proposer: str | Proposer = DRAFT) -> CandidateTree:
        return self._oracle.candidates(rid, pos, depth, width, proposer)

    def candidates_batch(self, rids: np.ndarray, pos: np.ndarray, depth: int, width: int,
                         proposer: str | Proposer = DRAFT) -> list[CandidateTree]:
        return self._oracle.candidates_batch(rids, pos, depth, width, proposer)

    def expansion_batch(self, rids: np.ndarray, pos: np.ndarray, expansion: tuple[int, ...],
                        proposer: str | Proposer = DRAFT) -> list[CandidateTree]:
        """Per-parent top-k expansion trees (SpecInfer), see :meth:`TokenOracle.expansion_batch`."""
        return self._oracle.expansion_batch(rids, pos, expansion, proposer)

    def chain_probs(self, rid: int, pos: int, k: int, proposer: str | Proposer = DRAFT) -> np.ndarray:
        return self._oracle.chain_probs(rid, pos, k, proposer)

    def chain_probs_batch(self, rids: np.ndarray, pos: np.ndarray, k: int,
                          proposer: str | Proposer = DRAFT) -> np.ndarray:
        return self._oracle.chain_probs_batch(rids, pos, k, proposer)


def _pld_table(cfg: Mapping[str, Any], target: str) -> dict[str, dict[str, float]] | None:
    """``cfg.pld`` (dataset → {match, accept, match_len}) with ``cfg.pld_by_target[target]``'s entries merged in."""
    if cfg.get("pld") is None:
        return None
    table = {k: dict(v) for k, v in cfg["pld"].items()}
    for ds, entry in ((cfg.get("pld_by_target") or {}).get(target) or {}).items():
        table[ds] = {**table.get(ds, {}), **dict(entry)}
    return table
