"""The engine's invariants, checked after every step (``+engine.check_invariants=true``; off by default, and then
nothing here runs: the replica holds no checker).

After each step, and after each run of steps the fast path took at once (:mod:`repro.sim.fastforward`), on every
path a step can take (the generic step, the lean steps, the compiled kernels or their NumPy references):

- **KV blocks.** Every running request holds exactly ``ceil(num_computed / block_size)`` blocks (the step's k + 1
  slots are reserved while it runs and the rejected ones freed at its end); every other request holds none; the
  pool's count equals the sum of the requests' blocks and lies in [0, total].
- **Tokens.** Per step and request: accepted ≤ proposed, and emitted = accepted + 1 (the bonus token), less what
  the request's output length cuts off, which only a request finishing in that step may lose; over the run, no
  request has generated more than its output length, and accepted ≤ proposed.
- **Time.** A step starts no earlier than the replica's previous step ended and ends no earlier than it starts; a
  request's first token comes no earlier than its arrival, its finish no earlier than its first token.
- **Preemption.** A request preempted by recompute is back at the front of the waiting queue, in the order the plan
  gave, with no blocks and no computed tokens (vLLM's rule, :meth:`repro.sim.kv.KvPool.preempt`); one preempted by
  swap is in the swapped queue with no blocks.

A violation stops the run with :class:`InvariantError`, one line naming the replica, the step, the request and the
quantity. ``tests/test_invariants.py`` runs every system config with the checks on, and breaks each check once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from repro.sim.state import FINISHED, RUNNING, SWAPPED, WAITING, RequestState

if TYPE_CHECKING:
    from repro.sim.kv import KvPool
    from repro.sim.plan import StepPlan, StepResult


class Checked(Protocol):
    """What the checks read of a replica (:class:`repro.sim.replica.Replica`)."""

    index: int
    num_steps: int
    s: RequestState
    kv: KvPool

#: slack for comparing simulated times (sums of float seconds)
_EPS = 1e-9


class InvariantError(RuntimeError):
    """An engine invariant does not hold after a step (:mod:`repro.sim.invariants`)."""


class InvariantChecker:
    """The checks of the module docstring for one replica (:attr:`Replica.checker`)."""

    def __init__(self, replica: Checked) -> None:
        self.r = replica
        self.last_end = -np.inf

    def _fail(self, what: str, rid: int | None = None) -> None:
        r = self.r
        who = f", request {rid}" if rid is not None else ""
        raise InvariantError(f"invariant broken: replica {r.index}, step {r.num_steps}{who}: {what}")

    # ------------------------------------------------------------------------------------------- after a step

    def after_step(self, plan: StepPlan, result: StepResult) -> None:
        """The checks after one step the replica executed (``result``: what its policy observes)."""
        if result.start_at < self.last_end - _EPS:
            self._fail(f"step starts at {result.start_at:.9g} s, before the previous step ended at "
                       f"{self.last_end:.9g} s")
        if result.end_at < result.start_at - _EPS:
            self._fail(f"step ends at {result.end_at:.9g} s, before it starts at {result.start_at:.9g} s")
        self.last_end = max(self.last_end, result.end_at)
        self._tokens(result)
        self._preempted(plan)
        self.state()

    def after_run(self, start_at: float, end_at: float) -> None:
        """The checks after a run of steps the fast path took at once (from ``start_at`` to ``end_at``)."""
        if start_at < self.last_end - _EPS:
            self._fail(f"run starts at {start_at:.9g} s, before the previous step ended at {self.last_end:.9g} s")
        if end_at < start_at - _EPS:
            self._fail(f"run ends at {end_at:.9g} s, before it starts at {start_at:.9g} s")
        self.last_end = max(self.last_end, end_at)
        self.state()

    def _tokens(self, res: StepResult) -> None:
        ids = np.asarray(res.decode_ids, dtype=np.int64)
        if ids.size == 0:
            return
        prop, acc, emit = (np.asarray(a, dtype=np.int64) for a in (res.num_proposed, res.num_accepted,
                                                                   res.num_emitted))
        s = self.r.s
        for bad, what in ((acc > prop, "accepted {a} of {p} proposed draft tokens"),
                          (acc < 0, "accepted {a} draft tokens"),
                          (emit < 1, "emitted {e} tokens in a verified step"),
                          (emit > acc + 1, "emitted {e} tokens with {a} drafts accepted (at most accepted + 1)")):
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                self._fail(what.format(a=int(acc[i]), p=int(prop[i]), e=int(emit[i])), int(ids[i]))
        short = emit < acc + 1  # cut off by the output length: only where the request finished with this step
        if short.any():
            cut = ids[short]
            done = (s.status[cut] == FINISHED) & (s.num_generated[cut] == s.output_len[cut])
            if not done.all():
                i = int(np.flatnonzero(short)[np.flatnonzero(~done)[0]])
                self._fail(f"emitted {int(emit[i])} tokens with {int(acc[i])} drafts accepted, and the request did "
                           f"not finish (accepted + 1 expected)", int(ids[i]))

    def _preempted(self, plan: StepPlan) -> None:
        ids = np.asarray(plan.preempt_ids, dtype=np.int64)
        if ids.size == 0:
            return
        s = self.r.s
        if plan.preempt_mode == "swap":
            wrong = ids[s.status[ids] != SWAPPED]
            if wrong.size:
                self._fail("preempted by swap, not in the swapped queue", int(wrong[0]))
            return
        stay = ids[s.status[ids] == WAITING]  # (a request may run again in a later step only)
        if stay.size != ids.size:
            self._fail("preempted by recompute, not waiting after the step", int(ids[s.status[ids] != WAITING][0]))
        front = list(s.waiting)[: ids.size]
        if front != ids.tolist():
            rid = next(int(a) for a, b in zip(ids.tolist(), [*front, *([None] * ids.size)], strict=False) if a != b)
            self._fail(f"preempted by recompute, not at the front of the waiting queue in the plan's order (front: "
                       f"{front[:8]})", rid)
        if (s.num_computed[ids] != 0).any():
            rid = int(ids[np.flatnonzero(s.num_computed[ids] != 0)[0]])
            self._fail(f"preempted by recompute with {int(s.num_computed[rid])} tokens still computed", rid)

    # -------------------------------------------------------------------------------------- the request state

    def state(self) -> None:
        """The state checks: KV blocks, lengths, times (after any step or run)."""
        r = self.r
        s, kv = r.s, r.kv
        blocks = s.kv_blocks
        held = int(blocks.sum())
        if kv.used != held:
            self._fail(f"the pool counts {kv.used} blocks used, the requests hold {held}")
        if not 0 <= kv.used <= kv.total:
            self._fail(f"KV blocks used {kv.used} outside [0, {kv.total}]")
        running = s.status == RUNNING
        bs = kv.block_size
        need = (s.num_computed + (bs - 1)) // bs
        wrong = np.flatnonzero(running & (blocks != need))
        if wrong.size:
            rid = int(wrong[0])
            self._fail(f"kv_blocks {int(blocks[rid])} for {int(s.num_computed[rid])} computed tokens (ceil over "
                       f"blocks of {bs}: {int(need[rid])})", rid)
        idle = np.flatnonzero(~running & (blocks != 0))
        if idle.size:
            rid = int(idle[0])
            self._fail(f"kv_blocks {int(blocks[rid])} held while not running (status {int(s.status[rid])})", rid)
        over = np.flatnonzero(s.num_generated > s.output_len)
        if over.size:
            rid = int(over[0])
            self._fail(f"generated {int(s.num_generated[rid])} tokens of an output length {int(s.output_len[rid])}",
                       rid)
        bad = np.flatnonzero(s.num_accepted > s.num_proposed)
        if bad.size:
            rid = int(bad[0])
            self._fail(f"accepted {int(s.num_accepted[rid])} of {int(s.num_proposed[rid])} proposed in all", rid)
        with np.errstate(invalid="ignore"):
            early = np.flatnonzero(s.first_token_at < s.arrival_s - _EPS)
            if early.size:
                rid = int(early[0])
                self._fail(f"first token at {s.first_token_at[rid]:.9g} s, before its arrival at "
                           f"{s.arrival_s[rid]:.9g} s", rid)
            ended = np.flatnonzero(s.finish_at < s.first_token_at - _EPS)
            if ended.size:
                rid = int(ended[0])
                self._fail(f"finished at {s.finish_at[rid]:.9g} s, before its first token at "
                           f"{s.first_token_at[rid]:.9g} s", rid)
