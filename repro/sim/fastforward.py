"""The fast path: a replica's repeated decode step and its repetitions, computed at once instead of one by one.

A :class:`~repro.sim.replica.Replica` owns a :class:`FastForward`; its step offers it the plan the policy made, and
:meth:`FastForward.run_ahead` either runs a stretch of steps (returning the end of the last) or declines (``None``,
nothing changed) and the step path runs the plan. What a caller must know:

- It relies on the policy's fast-path promises (``repeats_plan``, ``keeps_plan_after_finish``, ``admits``), written
  once in :class:`~repro.sim.policy.Policy`'s docstring, and checks everything else itself.
- It engages only where every observer takes runs (``on_run``), the models are simulated and no counterfactual arms
  are scored (``Replica.fast_forward``), and only for a plan that decodes every running request, in the running
  order, with one chain length, locally (the draft model or EAGLE head resident with its cache in step, or no
  speculation): no prefill, trees, remote draft server, host seconds, preemption, swap-in, memory action or draft
  reload in flight. It declines where the oracle's stream has no chain runs or the plan's own step does not fit KV.
- A run's steps start before the next arrival and by the time limit (``limit``), at most the step budget of them;
  it stops before the first step whose KV would not fit the free blocks (the policy would preempt), and after the
  first step that finishes a request.
- With ``keeps_plan_after_finish``, nothing waiting or swapped, no observers and no request waiting for a finish
  in a closed loop (``stop_at_finish``), it goes on past finishes, each request leaving after its last step. With
  ``admits`` too, one replica and no step budget (the engine then hands it the ``arrivals``: never while a closed
  loop can hold a request back), it goes on through arrivals: at the first step boundary at or after one, if every
  request then waiting fits the policy's rule, it admits them, prices their prefill step in place
  (:meth:`FastForward._prefill`) and goes on with them last in the batch; otherwise it stops there.
- Other replicas' events do not stop it: replicas share nothing but the router, and a routed deployment's runs stop
  before every arrival, so each replica's view at a routing decision is the step path's.
- Every state array afterwards equals the step path's bit for bit: the same cost functions over arrays
  (:func:`~repro.sim.stepcost.decode_runs_s`, :func:`~repro.cost.step.verify_runs_s`), the oracle's chain scores
  (:meth:`~repro.oracle.TokenOracle.chain_run`), every running sum accumulated in step order
  (``tests/test_fast_forward.py`` checks it). Observers get each run as one :class:`~repro.sim.trace.StepRun`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from repro.cost.step import verify_runs_s
from repro.sim.lookahead import AR_RUN, NEVER, RUN_AHEAD_MAX, RunColumns
from repro.sim.plan import RunResult, StepPlan
from repro.sim.policy import whole_prompts_that_fit
from repro.sim.state import FINISHED as _FINISHED
from repro.sim.state import RUNNING as _RUNNING
from repro.sim.stepcost import decode_runs_s
from repro.sim.trace import StepRun

if TYPE_CHECKING:
    from repro.cost.model import CostModel
    from repro.oracle import TokenOracle
    from repro.sim.kv import KvPool
    from repro.sim.policy import Policy, WholePromptAdmission
    from repro.sim.proposers import Proposer, Proposers
    from repro.sim.state import RequestState
    from repro.sim.stepcost import StepCoster
    from repro.sim.trace import StepObserver

_RUN_HORIZON = 256  # steps scored ahead at a time in a run that goes on through arrivals
_ADMIT_AHEAD = 32  # arrivals scored ahead with the run's requests (the next chain_run call brings more)
_ADMIT_CAP = 256  # columns set aside at first for the requests a run admits (it grows past them if need be)
_RUN_COLUMNS = 1024  # the most requests in one run (bounds its arrays; the next run goes on from there)
_RUN_STEPS = 512  # the most steps of a request scored in a run through arrivals (a longer one: the next run's)


class Host(Protocol):
    """What the fast path reads and writes of the replica that owns it (:class:`repro.sim.replica.Replica`)."""

    index: int
    s: RequestState
    kv: KvPool
    cost: CostModel
    coster: StepCoster
    oracle: TokenOracle
    policy: Policy
    proposers: Proposers
    observers: tuple[StepObserver, ...]
    draft_resident: bool
    draft_ready_at: float | None
    stop_at_finish: bool
    num_steps: int
    num_scheduled: int

    def finish(self, rids: np.ndarray, at: float | np.ndarray) -> None: ...

    def sync_view(self) -> None: ...


@dataclass(slots=True, eq=False)
class _Run:
    """One run as it goes: its requests' columns, the batch, the clock and each step's seconds so far."""

    plan: StepPlan
    prop: Proposer
    k: int  # the chain length of every step (0: one token a step)
    now: float  # when its first step starts
    limit: float | None
    budget: int | None  # its most decode steps
    arrivals: ArrivalFeed | None
    onward: bool  # it goes on past finishes
    admission: _Admission | None  # it goes on through arrivals, admitting them by the policy's rule
    horizon: int  # steps scored ahead at a time
    n: int  # the plan's requests (columns 0 .. n - 1)
    base: int  # arrival i is column n + i - base
    bs: int  # the KV block size
    cols: RunColumns
    kv_total: int
    other: int  # blocks of requests outside the run (none where it admits)
    nxt: float  # the next arrival
    members: np.ndarray  # the columns in the batch, in the running order
    t: float  # the clock: the end of the last step run
    step_s: float  # the mean step of the last stretch (sizes the next segment)
    a: int = 0  # its decode steps so far
    prefills: int = 0  # its prefill steps so far
    ends: list[np.ndarray] = field(default_factory=list)  # each decode step's end, draft and verify seconds
    drafts: list[np.ndarray] = field(default_factory=list)
    verifies: list[np.ndarray] = field(default_factory=list)
    overhead_s: float = 0.0
    waiting_start: bool = False  # requests admitted whose first step has not started yet
    last_start: float = -math.inf  # when its last step (decode or prefill) started


class FastForward:
    """The fast path of one replica (see the module docstring): its repeated decode steps, computed at once."""

    def __init__(self, replica: Host) -> None:
        self.r = replica
        self._resolve = replica.proposers.resolve
        self.last_step_s = 0.0  # the mean step of the last run (sizes the next one)
        self.last_start = -math.inf  # when the last run's last step started

    def run_ahead(self, plan: StepPlan, now: float, until: float, limit: float | None,
                  budget: int | None, schedule_wall_s: float = 0.0,
                  arrivals: ArrivalFeed | None = None) -> float | None:
        """Run ``plan``'s step at ``now`` and its repetitions that start before ``until`` (the next arrival; through
        the ``arrivals`` where the run admits them) and by ``limit``, at most ``budget`` of them; return the end of the
        last, or ``None`` (nothing run) where the plan is not one the fast path repeats. ``schedule_wall_s``: the
        policy's planning of the first step, for observers."""
        rep = self._repeat(plan)
        if rep is None:
            return None
        run = self._start(plan, *rep, now, until, limit, budget, arrivals)
        adm = run.admission
        while True:
            if run.nxt <= run.t:  # an arrival is due before the next step
                if adm is None or arrivals is None or (limit is not None and run.t > limit):
                    break
                if not self._admit(run, adm, arrivals):
                    break
                continue
            members, cols = run.members, run.cols
            if (limit is not None and run.t > limit) or not members.size or (budget is not None and run.a >= budget):
                break
            # a segment of the run: stretches of steps with the same requests one after the other (a request leaves
            # after its finishing step), as far as every request's steps are scored (past a finish only onward),
            # priced at once, then cut at the next arrival
            fin = cols.fin[members]
            open_ = fin == NEVER  # finish not scored yet
            seg_end = int(cols.end[members].min())
            if run.onward:
                seg_end = int(cols.end[members[open_]].min()) if open_.any() else int(fin.max()) + 1
            if seg_end <= run.a:  # some request's steps are not scored yet: score them (and the next arrivals) ahead
                scored = self._score(run, open_)
                if scored is None and run.a == 0 and not run.prefills:
                    return None  # a stream without chain runs: the step-by-step path
                if not scored:
                    break  # (as far as the run's arrays reach)
                continue
            went = self._segment(run, fin, seg_end)
            if went is None:
                return None  # the plan's own step does not fit: the step-by-step path reports it
            if not went:
                break
        return self._close(run, schedule_wall_s)

    def _repeat(self, plan: StepPlan) -> tuple[int, Proposer, np.ndarray, np.ndarray, np.ndarray] | None:
        """The chain length and proposer of a plan the fast path repeats, and its requests' tokens generated,
        contexts and KV blocks; ``None`` for any other plan."""
        r = self.r
        s, ids_ = r.s, plan.decode_ids
        n = int(ids_.size)
        if (not n or plan.prefill_ids.size or plan.preempt_ids.size or plan.swap_in_ids.size
                or plan.memory is not None or plan.trees or plan.draft_server is not None or plan.host_s != 0.0
                or r.draft_ready_at is not None or ids_.tolist() != s.running):
            return None
        if plan.k is None:
            k = 0
        else:  # one chain length for all (a malformed k is left to the step-by-step path to report)
            ks = np.asarray(plan.k)
            if ks.shape != ids_.shape or (ks != ks[0]).any() or ks[0] < 0:
                return None
            k = int(ks[0])
        prop = self._resolve(plan.proposer)
        gen, ctx = s.num_generated[ids_], s.num_computed[ids_]
        if k:
            if prop.which is None or prop.proposes_first or prop.remote or (prop.resident and not r.draft_resident):
                return None
            if prop.keeps_kv and (s.num_draft_computed[ids_] != ctx).any():
                return None
        elif plan.draft_sync:
            return None
        bs = r.kv.block_size
        held = s.kv_blocks[ids_]
        if ((gen < 1) | (ctx != s.prompt_len[ids_] + gen - 1) | ((ctx + (bs - 1)) // bs != held)).any():
            return None
        return k, prop, gen, ctx, held

    def _start(self, plan: StepPlan, k: int, prop: Proposer, gen: np.ndarray, ctx: np.ndarray, held: np.ndarray,
               now: float, until: float, limit: float | None, budget: int | None,
               arrivals: ArrivalFeed | None) -> _Run:
        """A run of ``plan``'s step: its columns, and how far ahead to score its requests' steps."""
        r = self.r
        s, ids_ = r.s, plan.decode_ids
        remaining = s.output_len[ids_] - gen
        # past a finish the run goes on with the others where the policy plans just that (nothing can be admitted,
        # and no finish sends a waiting request: a closed loop's, Replica.stop_at_finish)
        onward = (r.policy.keeps_plan_after_finish and not r.observers and not s.waiting and not s.swapped
                  and not r.stop_at_finish)
        admits = r.policy.admits if onward and arrivals is not None and budget is None else None
        if r.cost.engine.draft_tokens > 1:  # (a prefill step then drafts for its new requests: the step path prices it)
            admits = None
        # how many steps to score ahead: until the first (onward: the last) request must have finished, within the
        # step budget and about as many as fit before ``until`` at the last run's step duration; through arrivals,
        # a fixed horizon, scored again as the run reaches its end
        horizon = int(remaining.max() if onward else remaining.min())
        if budget is not None:
            horizon = min(horizon, budget)
        if admits is not None:
            horizon = min(horizon, _RUN_HORIZON)
        elif until < math.inf and self.last_step_s > 0.0:
            horizon = min(horizon, int((until - now) / self.last_step_s) + 2)
        horizon = max(1, min(horizon, RUN_AHEAD_MAX))
        base = arrivals.next if arrivals is not None else 0  # arrival i is column n + i - base
        # the run's requests: the plan's, then those it admits
        # (a request's steps scored: as far as the horizon, or, through arrivals, as far as the run's arrays go)
        cols = RunColumns(s, ids_, gen, ctx, remaining, k, now, base,
                          min(arrivals.n - base, _ADMIT_CAP) if admits is not None and arrivals is not None else 0,
                          _RUN_STEPS if admits is not None else horizon)
        n = int(ids_.size)
        return _Run(plan, prop, k, now, limit, budget, arrivals, onward,
                    _Admission(admits, self._resolve(admits.proposer), k, prop) if admits is not None else None,
                    horizon, n, base, r.kv.block_size, cols, r.kv.total, r.kv.used - int(held.sum()), until,
                    np.arange(n), now, self.last_step_s)

    def _score(self, run: _Run, open_: np.ndarray) -> bool | None:
        """Score ahead the steps of the batch's requests (``open_``: whose finish is not scored yet) that run out
        soonest, and through arrivals the next arrivals' (:meth:`RunColumns.score`)."""
        cols, members, horizon = run.cols, run.members, run.horizon
        low = members[open_ & (cols.first[members] + cols.avail[members] - run.a < max(1, horizon // 2))]
        arrivals, n, base = run.arrivals, run.n, run.base
        if run.admission is not None and arrivals is not None:
            upto = min(cols.count + _ADMIT_AHEAD, n + arrivals.n - base)
            if upto > cols.count:
                low = np.concatenate([low, cols.expect(np.arange(base + cols.count - n, base + upto - n))])
        return cols.score(self.r.oracle, run.prop, low, horizon)

    def _segment(self, run: _Run, fin: np.ndarray, seg_end: int) -> bool | None:
        """Run the batch's steps from ``run.a`` to before ``seg_end`` (``fin``: the members' finishing steps) that
        fit KV, start before the next arrival and by the time limit. Returns whether the run goes on; ``None``
        (nothing run) where the plan's own step does not fit."""
        cols, members, a, t, k = run.cols, run.members, run.a, run.t, run.k
        if run.waiting_start:  # those admitted since the last step start with this one
            cols.start_at[members[cols.first[members] == a]] = t
            run.waiting_start = False
        if run.budget is not None:
            seg_end = min(seg_end, run.budget)
        seg_end = min(seg_end, a + RUN_AHEAD_MAX)
        nxt, step_s = run.nxt, run.step_s
        if nxt < math.inf and step_s > 0.0:  # about as many steps as fit before the next arrival
            seg_end = min(seg_end, a + int((nxt - t) / step_s) + 2)
        blocks, full = self._stretches(run, fin, seg_end)
        if not blocks:
            if a == 0 and not run.prefills:
                return None
            return False
        length = sum(b.shape[0] for b in blocks)
        if k:
            csum = (blocks[0].sum(axis=1) if len(blocks) == 1
                    else np.concatenate([b.sum(axis=1) for b in blocks])).astype(np.float64)
            draft, verify, overheads = decode_runs_s(self.r.cost, run.prop, k, blocks, csum)
            seq = np.empty(2 * length + 1)
            seq[1::2], seq[2::2] = draft, verify
        else:
            verify, overheads = verify_runs_s(self.r.cost, k, blocks)
            draft = np.zeros(length)
            seq = np.empty(length + 1)
            seq[1:] = verify
        run.overhead_s = overheads[0]
        seq[0] = t
        times = np.add.accumulate(seq)  # the start, + drafting, + verification, step after step
        end_at = times[2::2] if k else times[1:]
        # the steps that start before ``nxt`` (the first does) and by ``limit``: step i > 0 starts at end_at[i - 1]
        ran = int(np.searchsorted(end_at[:-1], nxt)) + 1
        limit = run.limit
        if limit is not None:
            ran = min(ran, int(np.searchsorted(end_at[:-1], limit, side="right")) + 1)
        run.last_start = float(end_at[ran - 2]) if ran > 1 else t
        run.ends.append(end_at[:ran])
        run.drafts.append(draft[:ran])
        run.verifies.append(verify[:ran])
        run.step_s = (float(end_at[ran - 1]) - t) / ran
        run.a = a = a + ran
        run.t = float(end_at[ran - 1])
        done = fin < a  # finished within
        if done.any():
            run.members = members[~done]
            if not run.onward:
                return False
        return not (full and ran == length)  # the next step's KV does not fit: the policy preempts

    def _stretches(self, run: _Run, fin: np.ndarray, seg_end: int) -> tuple[list[np.ndarray], bool]:
        """The contexts of the batch's steps from ``run.a`` to before ``seg_end``, a block (steps × requests) per
        stretch with the same requests (a request that finishes at step f leaves after it), as far as their KV
        fits; and whether it ran out."""
        cols, members, a, k, bs = run.cols, run.members, run.a, run.k, run.bs
        other, kv_total = run.other, run.kv_total
        bounds = [a, *sorted({f + 1 for f in fin[(fin >= a) & (fin < seg_end - 1)].tolist()}), seg_end]
        blocks: list[np.ndarray] = []
        for s0, s1 in itertools.pairwise(bounds):
            m = members if s0 == a else members[fin >= s0]
            ctxs = cols.contexts(m, s0, s1 - s0)
            # KV: the step's requests must fit 1 + k more tokens each in what is not used by others (contexts only
            # grow within a stretch: if its last step fits, every step does)
            if other + int(((ctxs[-1] + (k + bs)) // bs).sum()) > kv_total:
                fits = other + ((ctxs + (k + bs)) // bs).sum(axis=1) <= kv_total
                cut = int(fits.argmin())
                if cut:
                    blocks.append(ctxs[:cut])
                return blocks, True
            blocks.append(ctxs)
        return blocks, False

    def _admit(self, run: _Run, adm: _Admission, arrivals: ArrivalFeed) -> bool:
        """At the step boundary ``run.t``: admit the arrivals due by then if every one fits the policy's rule (with the
        run's KV as it stands), run their prefill step (:meth:`_prefill`, the very plan the policy would make) and
        put those that go on to decode last in the batch. Returns whether the run goes on: not where nothing was
        admitted (not every one fits), nor where their draft caches need the policy's catch-up."""
        r, cols, members, t = self.r, run.cols, run.members, run.t
        s, bs, rule = r.s, r.kv.block_size, adm.rule
        first, last = arrivals.next, arrivals.due(t)
        if cols.n0 + last - cols.base > _RUN_COLUMNS:
            return False  # (the run's arrays are full: a new run takes over)
        need = s.prompt_len[first:last] + s.num_generated[first:last]
        used = run.other + int(((cols.contexts(members, run.a, 1)[0] + (bs - 1)) // bs).sum()) if members.size \
            else run.other
        fit = whole_prompts_that_fit(need.tolist(), token_budget=rule.max_num_batched_tokens,
                                     max_new_seqs=rule.max_num_seqs - members.size,
                                     free_blocks=run.kv_total - used - int(rule.watermark * run.kv_total),
                                     block_size=bs)
        if fit < last - first:
            return False  # not everyone waiting fits: the policy plans the next step
        arrivals.next = last
        r.kv.used = used  # the run's blocks as they stand (its requests' own counts are written at its end)
        pids = np.arange(first, last, dtype=np.int64)
        end_at, fin = self._prefill(adm, pids, need, t)
        run.last_start = t
        r.num_steps += 1
        r.num_scheduled += int(pids.size)
        if fin.size:
            pids = pids[s.status[pids] != _FINISHED]
        joined = cols.n0 + pids - cols.base
        new = joined >= cols.count
        if new.any():
            cols.expect(pids[new])  # (as the prefill leaves them: their first token, their prompt cached)
        run.t = end_at
        run.prefills += 1
        run.nxt = arrivals.time()
        if joined.size:
            cols.join(joined, run.a)
            run.members = np.concatenate([members, joined])
            run.waiting_start = True
            return adm.in_step  # (not: a draft cache the prefill did not fill, the policy plans the catch-up)
        return True

    def _prefill(self, adm: _Admission, pids: np.ndarray, tokens: np.ndarray, now: float) -> tuple[float, np.ndarray]:
        """The step path's execution of the prefill-only step the policy plans for arrivals ``pids`` (whole prompts of
        ``tokens``, nothing cached, never admitted before), as a run admits them: the same terms in the same order,
        without the checks such a plan passes. Returns the step's end and the requests it finished."""
        r = self.r
        s, plan, prop = r.s, adm.plan, adm.prop
        s.status[pids] = _RUNNING  # admission (they were never put in the waiting queue)
        s.running.extend(pids.tolist())
        s.queues_changed("running")
        blocks = (tokens + (r.kv.block_size - 1)) // r.kv.block_size  # (the rule kept them within the pool)
        s.kv_blocks[pids] = blocks
        r.kv.used += int(blocks.sum())
        draft_s, verify_s = r.coster.prompts_s(prop, plan, pids, tokens, draft_resident=r.draft_resident)
        draft_s += plan.host_s
        end_at = now + 0.0 + draft_s + verify_s  # (no memory actions: + 0.0, as the step charges them)
        end_at += 0.0  # (nothing sent)
        s.service_s[pids] += draft_s + verify_s
        # the step's prefill: each prompt completes and samples the request's first token
        s.num_computed[pids] = tokens
        if adm.syncs_draft:
            s.num_draft_computed[pids] = tokens
        s.first_token_at[pids] = end_at
        s.num_generated[pids] = 1
        s.last_token_at[pids] = end_at
        fin = pids[s.output_len[pids] <= 1]
        if fin.size:
            r.finish(fin, end_at)
        r.kv.check()
        return end_at, fin

    def _close(self, run: _Run, schedule_wall_s: float) -> float:
        """Write the run's decode steps into the request state (its prefill steps are already applied): each
        request's tokens, KV, counters and times, its service summed step by step, the finishes in step order; tell
        observers. Returns the end of its last step."""
        r, cols, k, now, steps = self.r, run.cols, run.k, run.now, run.a
        s, bs = r.s, r.kv.block_size
        plain = cols.count == cols.n0  # only the plan's requests (all from the first step)
        c: np.ndarray | slice
        if plain:
            c = slice(0, cols.n0)
            ci = AR_RUN[:cols.n0] if cols.n0 <= AR_RUN.size else np.arange(cols.n0)  # (for 2-d gathers)
            first = cols.first[c]
            took = np.minimum(cols.last[c] + 1, steps)  # steps each request was in
        else:
            c = np.flatnonzero(cols.first[:cols.count] >= 0)  # every column that joined the batch
            first = cols.first[c]
            took = np.minimum(cols.last[c] + 1, steps - first)
            ci = c
        adv = cols.advance(ci, took) if k else took  # (one token a step: a request's steps end with its last)
        rids = cols.rid[c]
        new_computed = cols.ctx0[c] + adv
        s.num_generated[rids] = cols.gen0[c] + adv
        s.num_computed[rids] = new_computed
        new_blocks = (new_computed + (bs - 1)) // bs
        s.kv_blocks[rids] = new_blocks
        r.kv.used = run.other + int(new_blocks.sum())
        ends, drafts, verifies = run.ends, run.drafts, run.verifies
        end_at = ends[0] if len(ends) == 1 else np.concatenate(ends)
        draft = drafts[0] if len(drafts) == 1 else np.concatenate(drafts)
        verify = verifies[0] if len(verifies) == 1 else np.concatenate(verifies)
        if not plain and not (took > 0).all():  # admitted at the run's last boundary: only their prefill ran
            c = ci = ci[took > 0]
            first, took, adv, rids = first[took > 0], took[took > 0], adv[took > 0], rids[took > 0]
        # each request's service: what it had, + each of its steps' seconds in turn (+ 0.0 past its last: the same)
        span = int(took.max())
        j = AR_RUN[:span] if span <= RUN_AHEAD_MAX else np.arange(span)
        work = np.empty((rids.size, span + 1))
        work[:, 0] = s.service_s[rids]
        step_s = draft + verify if k else verify  # (0.0 + verify without drafting: the same)
        work[:, 1:] = step_s[:span] if plain else step_s[np.minimum(first[:, None] + j, steps - 1)]
        if (took < span).any():
            work[:, 1:] *= j < took[:, None]
        s.service_s[rids] = np.add.accumulate(work, axis=1)[:, -1]
        if k:
            acc, mat = cols.acc[ci, took], cols.mat[ci, took]
            if run.prop.keeps_kv:
                s.num_draft_computed[rids] = cols.ctx0[c] + adv
            s.num_proposed[rids] += k * took
            s.num_accepted[rids] += acc
            s.num_matched[rids] += mat
            s.num_spec_steps[rids] += took
        s.num_decode_steps[rids] += took
        fresh = np.isnan(s.first_decode_at[rids])  # their first step after the first token is in this run
        s.first_decode_at[rids[fresh]] = now if plain else cols.start_at[c][fresh]
        s.last_token_at[rids] = end_at[took - 1 if plain else first + took - 1]
        fin = adv == cols.rem[c]
        if fin.any():  # each at the end of its finishing step
            r.finish(rids[fin], end_at[(first + cols.last[c])[fin]])
        r.kv.check()
        r.num_steps += steps
        r.num_scheduled += int(took.sum())
        end = run.t
        self.last_start = run.last_start
        self.last_step_s = (end - now) / (steps + run.prefills)
        r.sync_view()
        if r.observers:
            self._trace(run, end_at, draft, verify, schedule_wall_s)
        if not r.policy.repeats_plan:  # a plan it promised on its own (Policy.repeats_some_plans): it observes the run
            r.policy.observe_run(RunResult(rids, took, k * took, acc if k else np.zeros_like(took), draft[:steps],
                                           verify[:steps], rids[fin]))
        return end

    def _trace(self, run: _Run, end_at: np.ndarray, draft: np.ndarray, verify: np.ndarray,
               schedule_wall_s: float) -> None:
        """Tell the observers the run (a run with observers stops at its first finish: every step has the same
        requests)."""
        cols, k, steps = run.cols, run.k, run.a
        c = np.arange(cols.count)
        n = c.size
        if k:
            emitted = (cols.ahead[c, 1:steps + 1] - cols.ahead[c, :steps]).sum(axis=0)
            accepted = (cols.acc[c, 1:steps + 1] - cols.acc[c, :steps]).sum(axis=0)
            matched = (cols.mat[c, 1:steps + 1] - cols.mat[c, :steps]).sum(axis=0)
        else:
            emitted = np.full(steps, n)
            accepted = matched = np.zeros(steps, dtype=np.int64)
        start_at = np.concatenate([[run.now], end_at[:-1]])  # (no prefill steps in between: nothing admitted)
        trace = StepRun(self.r.index, run.plan, start_at, end_at, draft, verify, emitted, np.full(steps, n * k),
                        accepted, matched, n, n * k + n, run.overhead_s, float(k), schedule_wall_s)
        for obs in self.r.observers:
            obs.on_run(trace)  # type: ignore[attr-defined]


class _Admission:
    """What a run that admits arrivals needs of the policy's rule (:class:`~repro.sim.policy.WholePromptAdmission`):
    the rule, its prefill plan (the drafting reads only its proposer and ``draft_sync``) and proposer, whether that
    prefill fills the draft's cache, and whether the admitted requests can then decode with the run's proposer
    ``prop`` at chain length ``k`` without a catch-up."""

    def __init__(self, rule: WholePromptAdmission, prefill_prop: Proposer, k: int, prop: Proposer) -> None:
        self.rule = rule
        self.plan = StepPlan(proposer=rule.proposer, draft_sync=rule.draft_sync)
        self.prop = prefill_prop
        self.syncs_draft = rule.draft_sync and prefill_prop.keeps_kv
        self.in_step = not (k and prop.keeps_kv) or self.syncs_draft


class ArrivalFeed:
    """The run's arrivals as the engine hands them to a replica whose runs go on through them: their times and the
    next one not yet arrived (a replica that admits some moves it on)."""

    def __init__(self, times: np.ndarray) -> None:
        self.times = times
        self.n = int(times.size)
        self.next = 0

    def time(self) -> float:
        """When the next request arrives (infinity: none left)."""
        return float(self.times[self.next]) if self.next < self.n else math.inf

    def due(self, t: float) -> int:
        """One past the last request that has arrived by ``t``."""
        return int(np.searchsorted(self.times, t, side="right"))
