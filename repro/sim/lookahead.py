"""The requests of a fast-forwarded run (:mod:`repro.sim.fastforward`) as columns, their steps scored ahead.

Each column holds one request's state at its first step in the run and, scored ahead by the token oracle's chain runs
(:meth:`~repro.oracle.TokenOracle.chain_run`), its advance, accepted and matched draft tokens after each of its steps,
read as the run reaches them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from repro.oracle import TokenOracle
    from repro.sim.proposers import Proposer
    from repro.sim.state import RequestState

RUN_AHEAD_MAX = 2048  # a request's steps scored in one fast-forward (bounds its arrays)
AR_RUN = np.arange(RUN_AHEAD_MAX + 1, dtype=np.int64)  # 0, 1, 2, ...: a run's steps, to index with
NEVER = 1 << 40  # a request's last step while its finish is not scored yet
# a column not in use: rid, gen0, ctx0, rem, first (-1: not joined), last, avail, end, fin
_FILL = np.array([0, 0, 0, 0, -1, NEVER, 0, 0, NEVER], dtype=np.int64)[:, None]


class RunColumns:
    """The requests of a fast-forwarded run, a column each: the plan's, then those the run admits (arrival ``i`` is
    column ``n + i - base``, allocated ahead of its arrival to score it with others). Per column: its id, its tokens
    generated and context at its first step in the run, what it has left to emit, the run's step at which it joined
    (-1: not yet) and, scored ahead by the oracle, after its own ``t`` steps its advance ``ahead[t]`` (at most what it
    had left), the draft tokens accepted ``acc[t]`` and matched ``mat[t]`` (``k`` > 0); ``avail`` of its steps are
    scored, and ``last`` is its finishing step once scored."""

    def __init__(self, s: RequestState, rids: np.ndarray, gen: np.ndarray, ctx: np.ndarray, rem: np.ndarray,
                 k: int, now: float, base: int, expected: int = 0, steps: int = RUN_AHEAD_MAX) -> None:
        self.s, self.k = s, k
        self.steps = steps  # the most steps of a request scored in the run
        self.scored = 0  # the most steps of any request scored so far
        n = int(rids.size)
        self.n0, self.base, self.count = n, base, n
        cap = n + expected
        # rid, gen0, ctx0, rem, first, last, avail, end, fin
        if k:  # nothing scored yet
            zero = np.zeros(n, dtype=np.int64)
            ints = np.array((rids, gen, ctx, rem, zero, zero + NEVER, zero, zero, zero + NEVER))
        else:  # one token a step: nothing to score, each finishes after what it has left
            last = rem - 1
            ints = np.array((rids, gen, ctx, rem, last - last, last, last * 0 + NEVER, rem, last))
        if expected:
            ints = np.concatenate([ints, np.repeat(_FILL, expected, axis=1)], axis=1)
        self._use(ints)
        self.start_at = np.full(cap, now)
        if k:
            self.ahead = self.acc = self.mat = np.zeros((0, steps + 1), dtype=np.int64)
            self._grow_steps(cap)

    def _use(self, ints: np.ndarray) -> None:
        self._ints = ints
        self.rid, self.gen0, self.ctx0, self.rem, self.first = ints[0], ints[1], ints[2], ints[3], ints[4]
        self.last, self.avail, self.end, self.fin = ints[5], ints[6], ints[7], ints[8]

    def _grow(self, cap: int) -> None:
        old = self.rid.size
        ints = np.empty((9, cap), dtype=np.int64)
        ints[:, :old] = self._ints
        ints[:, old:] = _FILL
        self._use(ints)
        start_at = np.zeros(cap)
        start_at[:old] = self.start_at
        self.start_at = start_at
        if self.k:
            self._grow_steps(cap)

    def _grow_steps(self, cap: int) -> None:
        old, w = self.ahead.shape[0], self.scored + 1
        steps = np.empty((3, cap, self.steps + 1), dtype=np.int64)  # ahead, acc, mat: a request's steps side by side
        if old:  # (only what has been scored: the rest of a row is never read before it is written)
            steps[0, :old, :w], steps[1, :old, :w], steps[2, :old, :w] = (
                self.ahead[:, :w], self.acc[:, :w], self.mat[:, :w])
        steps[:, old:, 0] = 0
        self.ahead, self.acc, self.mat = steps[0], steps[1], steps[2]

    def _set(self, c: np.ndarray, rids: np.ndarray, gen: np.ndarray, ctx: np.ndarray, rem: np.ndarray) -> None:
        self.rid[c], self.gen0[c], self.ctx0[c], self.rem[c] = rids, gen, ctx, rem
        if not self.k:  # one token a step: nothing to score
            self.last[c] = rem - 1
            self.avail[c] = NEVER
        self.count = max(self.count, int(c.max()) + 1)

    def expect(self, rids: np.ndarray) -> np.ndarray:
        """Columns for arriving requests ``rids``, as their prefill will leave them (their first token sampled, their
        prompt cached); returns them."""
        c = self.n0 + rids - self.base
        if int(c.max()) >= self.rid.size:
            self._grow(max(int(c.max()) + 1, 2 * self.rid.size))
        s = self.s
        self._set(c, rids, np.ones(rids.size, dtype=np.int64), s.prompt_len[rids], s.output_len[rids] - 1)
        return c

    def join(self, c: np.ndarray, a: int) -> None:
        """Columns ``c`` join the batch at the run's step ``a`` (``start_at``: when that step starts)."""
        self.first[c] = a
        self._bounds(c)

    def _bounds(self, c: np.ndarray) -> None:
        """For columns ``c`` (in the batch): ``end``, one past the last of the run's steps they can say anything
        about (their finishing step, or the last scored), and ``fin``, the run's step at which they finish (once
        scored)."""
        if c.size == 1:
            i = int(c[0])
            first, last = int(self.first[i]), int(self.last[i])
            self.end[i] = first + min(int(self.avail[i]), last + 1)
            self.fin[i] = first + last if last < NEVER else NEVER
            return
        first, last = self.first[c], self.last[c]
        self.end[c] = first + np.minimum(self.avail[c], last + 1)
        self.fin[c] = np.where(last < NEVER, first + last, NEVER)

    def contexts(self, members: np.ndarray, a: int, length: int) -> np.ndarray:
        """The members' contexts in the run's steps ``a`` .. ``a + length - 1`` (steps × members)."""
        if not self.k:  # one token a step (a member's steps end with its finishing step: nothing to cap)
            return (self.ctx0[members] + (a - self.first[members])) + AR_RUN[:length, None]
        return self.ctx0[members] + self.ahead[members, (a - self.first[members]) + AR_RUN[:length, None]]

    def advance(self, c: np.ndarray, took: np.ndarray) -> np.ndarray:
        """What columns ``c`` advanced in their first ``took`` steps."""
        return self.ahead[c, took] if self.k else np.minimum(took, self.rem[c])

    def score(self, oracle: TokenOracle, prop: Proposer, c: np.ndarray, horizon: int) -> bool | None:
        """Score the next ``horizon`` steps of columns ``c`` (:meth:`~repro.oracle.TokenOracle.chain_run`), each
        from where its scored steps end; False where the run's arrays end first, None for a stream without chain
        runs."""
        t0 = self.avail[c]
        ahead0 = self.ahead[c, t0]
        # (a request with r tokens left finishes within r steps)
        h = min(horizon, self.steps - int(t0.max()), int((self.rem[c] - ahead0).max()))
        if h <= 0:
            return False
        run = oracle.chain_run(self.rid[c], self.gen0[c] + ahead0, self.k, h, prop,
                               end=self.s.output_len[self.rid[c]] + self.k)
        if run is None:
            return None
        accepted, matched = run
        rows = t0 + AR_RUN[1:h + 1, None]
        rem = self.rem[c]
        ahead = np.minimum(ahead0 + np.add.accumulate(accepted + 1, axis=0), rem)  # the last step emits what is left
        self.ahead[c, rows] = ahead
        self.acc[c, rows] = self.acc[c, t0] + np.add.accumulate(accepted, axis=0)
        self.mat[c, rows] = self.mat[c, t0] + np.add.accumulate(matched, axis=0)
        done = ahead == rem
        ends = done.any(axis=0)
        if ends.any():
            self.last[c[ends]] = t0[ends] + done[:, ends].argmax(axis=0)
        self.avail[c] = t0 + h
        self.scored = max(self.scored, int(t0.max()) + h)
        joined = c[self.first[c] >= 0]
        if joined.size:
            self._bounds(joined)
        return True
