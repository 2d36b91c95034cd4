"""Discrete-event simulation of one or more serving replicas.

The loop takes events in time order: request arrivals (routed to a replica; at a time, before any step) and replica
steps (a heap of ``(time, seq, replica)``). A replica whose policy declares how it admits (``Policy.admits``) may
admit arrivals itself inside a fast-forwarded run (:meth:`Replica.run_ahead`); the loop then moves on past them.
The replicas are built from the run's :class:`~repro.sim.deployment.Deployment`: each gets its policy, its cost model
(its tensor parallelism) and its proposers (:mod:`repro.sim.proposers`), and its policy is bound with that context. A
replica step asks its policy for a :class:`~repro.sim.plan.StepPlan`, checks the plan, resolves the plan's
proposer to the replica's object, charges the step's time with :mod:`repro.cost.step` under the run's engine profile
(memory actions + drafting + one target forward + the host's speculation work), asks the token oracle how much
speculation is accepted (each request scored on the stream of the proposer that drafted it), applies the result and
tells the policy. Observers (:mod:`repro.sim.trace`, e.g. the step trace) are called after each step only when there
are any. Simulated time never moves backwards. With a real backend (``backend=hf``, :mod:`repro.backends.hf`) the
plan is executed on real models instead: they decide the acceptance, and the step's time is their measured wall
clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from repro.cost.step import DecodeBatch, PrefillBatch, verify_pass, verify_runs_s
from repro.sim.kv import KvPool
from repro.sim.plan import PlanError, StepPlan, StepResult, TreeSpec
from repro.sim.policy import PolicyContext, whole_prompts_that_fit
from repro.sim.proposers import colocated
from repro.sim.state import FINISHED as _FINISHED
from repro.sim.state import RUNNING as _RUNNING
from repro.sim.state import SWAPPED as _SWAPPED
from repro.sim.state import WAITING as _WAITING
from repro.sim.state import RequestState, View
from repro.sim.stepcost import StepCoster, decode_runs_s
from repro.sim.trace import RoundTracer, StepEvent, StepRecord, StepRun, StepTracer

if TYPE_CHECKING:
    from repro.cost.model import CostModel, ForwardCost
    from repro.oracle import Drafter, TokenOracle
    from repro.sim.backend import StepBackend
    from repro.sim.deployment import Deployment
    from repro.sim.policy import Policy, WholePromptAdmission
    from repro.sim.proposers import Proposer, Proposers
    from repro.sim.trace import StepObserver

_ARRIVAL, _STEP = 0, 1  # arrivals at time t are handled before steps starting at t


class SimulationError(RuntimeError):
    """The simulation cannot continue (e.g. the policy idles while requests wait and nothing else will happen)."""


@dataclass
class SimOutput:
    """Everything a run produced: final per-request state, the simulated span and the optional step trace (its
    records, and each step's plan telemetry beside them: :class:`~repro.sim.trace.StepTracer`)."""

    state: RequestState
    replica_of: np.ndarray
    sim_time_s: float
    num_steps: int
    steps: list[StepRecord] = field(default_factory=list)
    num_scheduled: int = 0  # Σ over the steps of the requests each ran: / num_steps, the mean batch size
    step_telemetry: list[Mapping[str, float] | None] = field(default_factory=list)
    request_columns: dict[str, np.ndarray] = field(default_factory=dict)  # the policies' per-request estimates
    rounds: pd.DataFrame | None = None  # the round trace (record_rounds): one row per decoding request per step


class Replica:
    """One serving instance: a policy, its request state, its GPU memory, its cost model and its proposers."""

    def __init__(self, index: int, policy: Policy, state: RequestState, cost: CostModel, oracle: TokenOracle,
                 *, block_size: int, max_model_len: int, proposers: Proposers | None = None,
                 drafter: Drafter | None = None, observers: Sequence[StepObserver] = (),
                 arms: int | None = None, backend: StepBackend | None = None, fast_forward: bool = True) -> None:
        self.index = index
        self.backend = backend  # a real backend executes the steps (time and acceptance) instead of the models
        self.arms = arms  # score every uniform chain length 0..arms of each decode step (regret's comparator)
        self.policy = policy
        self.s = state
        self.cost = cost
        self.oracle = oracle
        self.proposers = proposers if proposers is not None else colocated(cost)
        self._resolve = self.proposers.resolve
        self.coster = StepCoster(state, cost, self.proposers.remote)
        self.observers = tuple(observers)
        # runs of repeated steps computed at once (run_ahead): only where every observer takes runs (the step trace
        # does; the round trace and counterfactual arms need single steps) and the models are simulated
        self.fast_forward = bool(fast_forward and policy.repeats_plan and arms is None and backend is None
                                 and all(hasattr(o, "on_run") for o in self.observers))
        self._run_step_s = 0.0  # the mean step of the last fast-forwarded run (sizes the next one)
        self.draft_resident = bool(policy.uses_draft_model and cost.draft is not None)
        self.draft_ready_at: float | None = None  # when an asynchronous draft reload completes
        self.kv = KvPool(state, cost, block_size=block_size, layout=cost.engine.draft_kv_layout,
                         draft_resident=self.draft_resident)
        if self.kv.total <= 0:
            raise SimulationError(
                f"the model does not fit: {cost.model.name} (tp={cost.tp}) on {cost.hardware.name} leaves no KV memory")
        self._mark = np.zeros(state.n, dtype=np.int64)
        self._arange = np.arange(1024)
        self.busy = False
        self.num_steps = 0
        self.num_scheduled = 0  # Σ over its steps of the requests each step ran (prefilling or decoding)
        self.view = View(state, block_size=block_size, max_model_len=max_model_len, cost=cost,
                         drafter=drafter, replica=index)
        self._sync_view()

    @property
    def total_blocks(self) -> int:
        return self.kv.total

    @total_blocks.setter
    def total_blocks(self, blocks: int) -> None:
        self.kv.total = blocks

    @property
    def used_blocks(self) -> int:
        return self.kv.used

    # ---------------------------------------------------------------------------------------------------------
    def _sync_view(self) -> None:
        v = self.view
        v.free_blocks = self.kv.free
        v.total_blocks = self.kv.total
        v.draft_resident = self.draft_resident
        v.draft_loading = self.draft_ready_at is not None
        v._touch()

    def admit(self, rid: int) -> None:
        self.s.status[rid] = _WAITING
        self.s.waiting.append(rid)
        self.view._touch()

    def has_work(self) -> bool:
        return bool(self.s.waiting or self.s.running or self.s.swapped)

    def step(self, now: float, until: float = math.inf, limit: float | None = None,
             max_steps: int | None = None, arrivals: ArrivalFeed | None = None) -> float | None:
        """Run one iteration starting at ``now``; return its end time, or ``None`` if the policy idles.

        With fast-forward (a policy that :attr:`~repro.sim.policy.Policy.repeats_plan`), a step that the policy will
        repeat runs at once with its repetitions (:meth:`run_ahead`) that start before ``until`` (the next
        arrival) and at most at ``limit``, the replica's steps staying at most ``max_steps``, or, where the policy
        declares how it admits, through the ``arrivals`` it admits on the way; the end of the last one is
        returned."""
        self._draft_arrived(now)
        v = self.view
        v.now = now
        v.step_index = self.num_steps
        observers = self.observers
        wall_s = 0.0
        if observers:  # the policy's own CPU time (AdaServe Fig. 9's "scheduling"), measured not modelled
            t0 = time.perf_counter()
            plan = self.policy.schedule(v)
            wall_s = time.perf_counter() - t0
        else:
            plan = self.policy.schedule(v)
        mem = plan.memory
        if plan.is_idle and mem is None and plan.preempt_ids.size == 0 and plan.swap_in_ids.size == 0:
            return None
        if self.fast_forward:
            end = self.run_ahead(plan, now, until, limit, None if max_steps is None else max_steps - self.num_steps,
                                 wall_s, arrivals)
            if end is not None:
                return end
        result, pre, dec, matched, fwd, host_s, arm_rewards = self._execute(plan, now)
        self.num_steps += 1
        self.num_scheduled += int(pre.ids.size + dec.ids.size)
        self._sync_view()
        if observers:
            event = StepEvent(self.index, plan, result, pre, dec, matched,
                              fwd.overhead_s + host_s if fwd is not None else 0.0, wall_s, v, arm_rewards)
            for obs in observers:
                obs.on_step(event)
        self.policy.observe(result)
        return result.end_at

    # ---------------------------------------------------------------------------------------------------------
    def _execute(self, plan: StepPlan, now: float) -> tuple[StepResult, PrefillBatch, DecodeBatch, np.ndarray,
                                                            ForwardCost | None, float, np.ndarray | None]:
        """Check and charge ``plan``, apply its outcome; return what the policy observes, and for observers the
        batches charged, the matched tokens, the target's pass, the host seconds of speculation and (``arms``) the
        counterfactual goodput of every uniform chain length (:meth:`_arm_rewards`)."""
        self._check_unique(plan.prefill_ids, plan.decode_ids)
        prop = self._resolve(plan.proposer)
        servers = self._placement(plan)
        memory_s = self._memory_actions(plan, now) + self._preempt(plan) + self._swap_in(plan)
        pre = self._begin_prefill(plan)
        dec = self._begin_decode(plan, prop)
        if pre.ids.size and dec.ids.size and not self.cost.engine.spec_with_prefill and dec.k.any():
            raise PlanError(f"engine {self.cost.engine.name}: a step cannot both prefill and speculate (the engine "
                            "runs speculation without chunked prefill)")
        # time: drafting, then one target forward over every scheduled token
        real = self.backend.run_step(self.s, plan, prop, pre, dec) if self.backend is not None else None
        if real is not None:  # measured on real models
            draft_s, verify_s, num_tokens, fwd, host_s = real.draft_s, real.verify_s, real.num_tokens, None, 0.0
        else:
            drafting = bool(dec.drafted.any()) or plan.draft_sync
            draft_s = self.coster.draft_s(prop, plan, dec.ids, dec.ctx, dec.k, dec.drafted, dec.trees, pre.ids,
                                          pre.tokens, draft_resident=self.draft_resident) if drafting else 0.0
            shape, host_s = verify_pass(self.cost.engine, pre, dec)
            fwd = self.cost.forward(shape) if shape.num_seqs else None
            verify_s = fwd.total_s + host_s if fwd is not None else 0.0
            num_tokens = shape.num_tokens
        if plan.host_s < 0.0:
            raise PlanError("host_s must be >= 0")
        draft_s += plan.host_s  # the policy's own host work before drafting, reported with the drafting
        end_at = now + memory_s + draft_s + verify_s
        arm_rewards = self._arm_rewards(plan, prop, pre, dec, memory_s) \
            if self.arms is not None and dec.ids.size and not dec.trees and servers is None and real is None else None
        service = self.s.service_s  # the step's compute is service to every request in it (ids are unique)
        if dec.ids.size:
            service[dec.ids] += draft_s + verify_s
        if pre.ids.size:
            service[pre.ids] += draft_s + verify_s
        # outcome: the oracle's (or the real models') acceptance, tokens emitted, requests finished
        if real is not None:
            proposed, accepted, matched, send_s = real.proposed, real.accepted, real.matched, 0.0
            accept_prob = real.accept_prob if self.policy.observes_accept_prob else None
        else:
            proposed, accepted, matched = self._accept(prop, servers, dec)
            send_s = self._send_s(servers, dec, accepted)
            accept_prob = self._accept_prob(prop, servers, dec) if self.policy.observes_accept_prob else None
        end_at += send_s
        emitted, done_dec = self._apply_decode(plan, prop, dec, proposed, accepted, matched, now, end_at)
        done_pre = self._apply_prefill(plan, prop, pre, end_at)
        fin = np.concatenate([done_dec, done_pre]) if done_pre.size else done_dec
        if fin.size:
            self._finish(fin, end_at)
        self.kv.check()
        result = StepResult(
            start_at=now, end_at=end_at, decode_ids=dec.ids, num_proposed=proposed, num_accepted=accepted,
            num_emitted=emitted, prefill_ids=pre.ids, finished_ids=fin, draft_s=draft_s, verify_s=verify_s,
            memory_s=memory_s, num_batched_tokens=num_tokens, send_s=send_s, accept_prob=accept_prob)
        return result, pre, dec, matched, fwd, host_s, arm_rewards

    def run_ahead(self, plan: StepPlan, now: float, until: float, limit: float | None,
                  budget: int | None, schedule_wall_s: float = 0.0,
                  arrivals: ArrivalFeed | None = None) -> float | None:
        """Fast-forward: ``plan``'s step at ``now`` and its repetitions, computed at once; ``None`` (nothing run) where
        the plan is not one the engine repeats.

        The policy promised (``repeats_plan``) to plan this step again while nothing arrives or finishes and KV
        fits, so each repetition is known without asking it: the same requests, each decoding one token or a chain
        of the same ``k`` that the oracle scores as the step would (:meth:`~repro.oracle.TokenOracle.chain_run`;
        each request's steps are scored once, ahead, and read as the run reaches them). The run ends with the first
        step that finishes a request, before the first that would start at or after ``until`` (an arrival is
        handled first) or after ``limit``, or whose KV would not fit the free blocks (the policy would preempt), and
        after ``budget`` steps. A policy that also :attr:`~repro.sim.policy.Policy.keeps_plan_after_finish` plans the
        same step for the rest of the batch once a request finishes with nothing waiting or swapped, so there (and
        without observers) the run goes on past finishes, each request leaving it after its last step. One that
        also declares how it :attr:`~repro.sim.policy.Policy.admits` arrivals, given the engine's ``arrivals``, has its
        run go on through them: at the first step boundary at or after an arrival, if every request then waiting
        fits the policy's rule, the engine admits them, runs their prefill step as the policy would have planned it
        (:meth:`_prefill`), and the run goes on with them last in the batch; otherwise the run ends there. Step
        times come from the same cost functions, vectorized over a segment of stretches of steps with the same
        requests at a time (:func:`~repro.sim.stepcost.decode_runs_s`, :func:`~repro.cost.step.verify_runs_s`), and
        every running sum is accumulated in step order, so the state afterwards equals that of running the steps one
        by one, bit for bit; observers get the run as a :class:`~repro.sim.trace.StepRun` (``schedule_wall_s``: the
        policy's planning of the first step). Returns the end of the last step run."""
        s, ids_ = self.s, plan.decode_ids
        n = int(ids_.size)
        if (not n or plan.prefill_ids.size or plan.preempt_ids.size or plan.swap_in_ids.size
                or plan.memory is not None or plan.trees or plan.draft_server is not None or plan.host_s != 0.0
                or self.draft_ready_at is not None or ids_.tolist() != s.running):
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
            if prop.which is None or prop.proposes_first or prop.remote or (prop.resident and not self.draft_resident):
                return None
            if prop.keeps_kv and (s.num_draft_computed[ids_] != ctx).any():
                return None
        elif plan.draft_sync:
            return None
        bs = self.kv.block_size
        held = s.kv_blocks[ids_]
        if ((gen < 1) | (ctx != s.prompt_len[ids_] + gen - 1) | ((ctx + (bs - 1)) // bs != held)).any():
            return None
        remaining = s.output_len[ids_] - gen
        # past a finish the run goes on with the others where the policy plans just that (nothing can be admitted)
        onward = self.policy.keeps_plan_after_finish and not self.observers and not s.waiting and not s.swapped
        admits = self.policy.admits if onward and arrivals is not None and budget is None else None
        # how many steps to score ahead: until the first (onward: the last) request must have finished, within the
        # step budget and about as many as fit before ``until`` at the last run's step duration; through arrivals,
        # a fixed horizon, scored again as the run reaches its end
        horizon = int(remaining.max() if onward else remaining.min())
        if budget is not None:
            horizon = min(horizon, budget)
        if admits is not None:
            horizon = min(horizon, _RUN_HORIZON)
        elif until < math.inf and self._run_step_s > 0.0:
            horizon = min(horizon, int((until - now) / self._run_step_s) + 2)
        horizon = max(1, min(horizon, _RUN_AHEAD_MAX))
        base = arrivals.next if arrivals is not None else 0  # arrival i is column n + i - base
        # the run's requests: the plan's, then those it admits
        # (a request's steps scored: as far as the horizon, or, through arrivals, as far as the run's arrays go)
        cols = _Columns(s, ids_, gen, ctx, remaining, k, now, base,
                        min(arrivals.n - base, _ADMIT_CAP) if admits is not None and arrivals is not None else 0,
                        _RUN_STEPS if admits is not None else horizon)
        kv_total = self.kv.total
        other = self.kv.used - int(held.sum())  # blocks of requests outside the run (none where it admits)
        nxt = until  # the next arrival
        members = np.arange(n)  # the columns in the batch, in the running order
        a = 0  # the run's decode steps so far
        t = now  # the clock: the end of the last step run
        prefills = 0
        ends: list[np.ndarray] = []
        drafts: list[np.ndarray] = []
        verifies: list[np.ndarray] = []
        overhead_s = 0.0
        step_s = self._run_step_s  # the mean step of the last stretch (sizes the next segment)
        waiting_start = False  # requests admitted whose first step has not started yet
        admission = _Admission(admits, self._resolve(admits.proposer), k, prop) if admits is not None else None
        while True:
            if nxt <= t:  # an arrival is due before the next step
                if admission is None or arrivals is None or (limit is not None and t > limit):
                    break
                m_new = self._admit_in_run(admission, arrivals, t, cols, members, a, other, kv_total)
                if m_new is None:
                    break  # not everyone waiting fits: the policy plans the next step
                t, joined = m_new
                prefills += 1
                nxt = arrivals.time()
                if joined.size:
                    cols.join(joined, a)
                    members = np.concatenate([members, joined])
                    waiting_start = True
                if joined.size and not admission.in_step:
                    break  # a draft cache the prefill did not fill: the policy plans the catch-up
                continue
            if (limit is not None and t > limit) or not members.size or (budget is not None and a >= budget):
                break
            # a segment of the run: stretches of steps with the same requests one after the other (a request leaves
            # after its finishing step), as far as every request's steps are scored (past a finish only onward),
            # priced at once, then cut at the next arrival
            fin = cols.fin[members]
            open_ = fin == _NEVER  # finish not scored yet
            seg_end = int(cols.end[members].min())
            if onward:
                seg_end = int(cols.end[members[open_]].min()) if open_.any() else int(fin.max()) + 1
            if seg_end <= a:  # some request's steps are not scored yet: score them (and the next arrivals) ahead
                low = members[open_ & (cols.first[members] + cols.avail[members] - a < max(1, horizon // 2))]
                if admits is not None and arrivals is not None:
                    upto = min(cols.count + _ADMIT_AHEAD, n + arrivals.n - base)
                    if upto > cols.count:
                        low = np.concatenate([low, cols.expect(np.arange(base + cols.count - n, base + upto - n))])
                scored = cols.score(self.oracle, prop, low, horizon)
                if scored is None and a == 0 and not prefills:
                    return None  # a stream without chain runs: the step-by-step path
                if not scored:
                    break  # (as far as the run's arrays reach)
                continue
            if waiting_start:  # those admitted since the last step start with this one
                cols.start_at[members[cols.first[members] == a]] = t
                waiting_start = False
            if budget is not None:
                seg_end = min(seg_end, budget)
            seg_end = min(seg_end, a + _RUN_AHEAD_MAX)
            if nxt < math.inf and step_s > 0.0:  # about as many steps as fit before the next arrival
                seg_end = min(seg_end, a + int((nxt - t) / step_s) + 2)
            # its stretches: a request that finishes at step f leaves after it
            bounds = [a, *sorted({f + 1 for f in fin[(fin >= a) & (fin < seg_end - 1)].tolist()}), seg_end]
            blocks: list[np.ndarray] = []
            full = False  # the segment ends where KV runs out
            for s0, s1 in itertools.pairwise(bounds):
                m = members if s0 == a else members[fin >= s0]
                ctxs = cols.contexts(m, s0, s1 - s0)
                # KV: the step's requests must fit 1 + k more tokens each in what is not used by others (contexts
                # only grow within a stretch: if its last step fits, every step does)
                if other + int(((ctxs[-1] + (k + bs)) // bs).sum()) > kv_total:
                    fits = other + ((ctxs + (k + bs)) // bs).sum(axis=1) <= kv_total
                    cut = int(fits.argmin())
                    if cut:
                        blocks.append(ctxs[:cut])
                    full = True
                    break
                blocks.append(ctxs)
            if not blocks:
                if a == 0 and not prefills:
                    return None  # the plan's own step does not fit: the step-by-step path reports it
                break
            length = sum(b.shape[0] for b in blocks)
            if k:
                csum = (blocks[0].sum(axis=1) if len(blocks) == 1
                        else np.concatenate([b.sum(axis=1) for b in blocks])).astype(np.float64)
                draft, verify, overheads = decode_runs_s(self.cost, prop, k, blocks, csum)
                seq = np.empty(2 * length + 1)
                seq[1::2], seq[2::2] = draft, verify
            else:
                verify, overheads = verify_runs_s(self.cost, k, blocks)
                draft = np.zeros(length)
                seq = np.empty(length + 1)
                seq[1:] = verify
            overhead_s = overheads[0]
            seq[0] = t
            times = np.add.accumulate(seq)  # the start, + drafting, + verification, step after step
            end_at = times[2::2] if k else times[1:]
            # the steps that start before ``nxt`` (the first does) and by ``limit``: step i > 0 starts at end_at[i - 1]
            run = int(np.searchsorted(end_at[:-1], nxt)) + 1
            if limit is not None:
                run = min(run, int(np.searchsorted(end_at[:-1], limit, side="right")) + 1)
            ends.append(end_at[:run])
            drafts.append(draft[:run])
            verifies.append(verify[:run])
            step_s = (float(end_at[run - 1]) - t) / run
            a += run
            t = float(end_at[run - 1])
            done = fin < a  # finished within
            if done.any():
                members = members[~done]
                if not onward:
                    break
            if full and run == length:
                break  # the next step's KV does not fit: the policy preempts
        return self._close_run(plan, prop, k, cols, now, t, a, prefills, other, ends, drafts, verifies,
                               overhead_s, schedule_wall_s)

    def _admit_in_run(self, adm: _Admission, arrivals: ArrivalFeed, t: float, cols: _Columns, members: np.ndarray,
                      a: int, other: int, kv_total: int) -> tuple[float, np.ndarray] | None:
        """Inside a run, at the step boundary ``t``: admit the arrivals due by then if every one fits the policy's rule
        (with the run's KV as it stands after ``a`` steps), and run their prefill step (:meth:`_prefill`, the very
        plan the policy would make). Returns the step's end and the columns of the admitted requests that go on to
        decode; ``None`` (nothing done) where not every one fits."""
        s, bs, rule = self.s, self.kv.block_size, adm.rule
        first, last = arrivals.next, arrivals.due(t)
        if cols.n0 + last - cols.base > _RUN_COLUMNS:
            return None  # (the run's arrays are full: a new run takes over)
        need = s.prompt_len[first:last] + s.num_generated[first:last]
        used = other + int(((cols.contexts(members, a, 1)[0] + (bs - 1)) // bs).sum()) if members.size else other
        fit = whole_prompts_that_fit(need.tolist(), token_budget=rule.max_num_batched_tokens,
                                     max_new_seqs=rule.max_num_seqs - members.size,
                                     free_blocks=kv_total - used - int(rule.watermark * kv_total), block_size=bs)
        if fit < last - first:
            return None
        arrivals.next = last
        self.kv.used = used  # the run's blocks as they stand (its requests' own counts are written at its end)
        pids = np.arange(first, last, dtype=np.int64)
        end_at, fin = self._prefill(adm, pids, need, t)
        self.num_steps += 1
        self.num_scheduled += int(pids.size)
        if fin.size:
            pids = pids[s.status[pids] != _FINISHED]
        c = cols.n0 + pids - cols.base
        new = c >= cols.count
        if new.any():
            cols.expect(pids[new])  # (as the prefill leaves them: their first token, their prompt cached)
        return end_at, c

    def _prefill(self, adm: _Admission, pids: np.ndarray, tokens: np.ndarray, now: float) -> tuple[float, np.ndarray]:
        """:meth:`_execute` of the prefill-only step the policy plans for arrivals ``pids`` (whole prompts of
        ``tokens``, nothing cached, never admitted before), as a run admits them: the same terms in the same order,
        without the checks such a plan passes. Returns the step's end and the requests it finished."""
        s, plan, prop = self.s, adm.plan, adm.prop
        s.status[pids] = _RUNNING  # admission (they were never put in the waiting queue)
        s.running.extend(pids.tolist())
        blocks = (tokens + (self.kv.block_size - 1)) // self.kv.block_size  # (the rule kept them within the pool)
        s.kv_blocks[pids] = blocks
        self.kv.used += int(blocks.sum())
        draft_s, verify_s = self.coster.prompts_s(prop, plan, pids, tokens, draft_resident=self.draft_resident)
        draft_s += plan.host_s
        end_at = now + 0.0 + draft_s + verify_s  # (no memory actions: + 0.0, as the step charges them)
        end_at += 0.0  # (nothing sent)
        s.service_s[pids] += draft_s + verify_s
        # _apply_prefill: each prompt completes and samples the request's first token
        s.num_computed[pids] = tokens
        if adm.syncs_draft:
            s.num_draft_computed[pids] = tokens
        s.first_token_at[pids] = end_at
        s.num_generated[pids] = 1
        s.last_token_at[pids] = end_at
        fin = pids[s.output_len[pids] <= 1]
        if fin.size:
            self._finish(fin, end_at)
        self.kv.check()
        return end_at, fin

    def _close_run(self, plan: StepPlan, prop: Proposer, k: int, cols: _Columns, now: float, end: float, steps: int,
                   prefills: int, other: int, ends: list[np.ndarray],
                   drafts: list[np.ndarray], verifies: list[np.ndarray], overhead_s: float,
                   schedule_wall_s: float) -> float:
        """Write a run's ``steps`` decode steps into the request state (its prefill steps are already applied):
        each request's tokens, KV, counters and times, its service summed step by step, the finishes in step order;
        tell observers. Returns ``end``."""
        s, bs = self.s, self.kv.block_size
        plain = cols.count == cols.n0  # only the plan's requests (all from the first step)
        c: np.ndarray | slice
        if plain:
            c = slice(0, cols.n0)
            ci = _AR_RUN[:cols.n0] if cols.n0 <= _AR_RUN.size else np.arange(cols.n0)  # (for 2-d gathers)
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
        self.kv.used = other + int(new_blocks.sum())
        end_at = ends[0] if len(ends) == 1 else np.concatenate(ends)
        draft = drafts[0] if len(drafts) == 1 else np.concatenate(drafts)
        verify = verifies[0] if len(verifies) == 1 else np.concatenate(verifies)
        if not plain and not (took > 0).all():  # admitted at the run's last boundary: only their prefill ran
            c = ci = ci[took > 0]
            first, took, adv, rids = first[took > 0], took[took > 0], adv[took > 0], rids[took > 0]
        # each request's service: what it had, + each of its steps' seconds in turn (+ 0.0 past its last: the same)
        span = int(took.max())
        j = _AR_RUN[:span] if span <= _RUN_AHEAD_MAX else np.arange(span)
        work = np.empty((rids.size, span + 1))
        work[:, 0] = s.service_s[rids]
        step_s = draft + verify if k else verify  # (0.0 + verify without drafting: the same)
        work[:, 1:] = step_s[:span] if plain else step_s[np.minimum(first[:, None] + j, steps - 1)]
        if (took < span).any():
            work[:, 1:] *= j < took[:, None]
        s.service_s[rids] = np.add.accumulate(work, axis=1)[:, -1]
        if k:
            acc, mat = cols.acc[ci, took], cols.mat[ci, took]
            if prop.keeps_kv:
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
            self._finish(rids[fin], end_at[(first + cols.last[c])[fin]])
        self.kv.check()
        self.num_steps += steps
        self.num_scheduled += int(took.sum())
        self._run_step_s = (end - now) / (steps + prefills)
        self._sync_view()
        if self.observers:  # (a run with observers stops at its first finish: every step has the same requests)
            c = np.arange(cols.count)
            n = c.size
            if k:
                emitted = (cols.ahead[c, 1:steps + 1] - cols.ahead[c, :steps]).sum(axis=0)
                accepted = (cols.acc[c, 1:steps + 1] - cols.acc[c, :steps]).sum(axis=0)
                matched = (cols.mat[c, 1:steps + 1] - cols.mat[c, :steps]).sum(axis=0)
            else:
                emitted = np.full(steps, n)
                accepted = matched = np.zeros(steps, dtype=np.int64)
            start_at = np.concatenate([[now], end_at[:-1]])  # (no prefill steps in between: nothing admitted)
            trace = StepRun(self.index, plan, start_at, end_at, draft, verify, emitted, np.full(steps, n * k),
                            accepted, matched, n, n * k + n, overhead_s, float(k), schedule_wall_s)
            for obs in self.observers:
                obs.on_run(trace)  # type: ignore[attr-defined]
        return end

    def _accept_prob(self, prop: Proposer, servers: np.ndarray | None, dec: DecodeBatch) -> np.ndarray:
        """Per decoding request, the verifier's Σ min(1, p/q) over its drafted chain (0 without one; trees and
        prompt lookup: not computed), each on the stream of the proposer that drafted it."""
        out = np.zeros(dec.ids.size)
        chain = dec.k > 0
        if dec.trees or prop.proposes_first or not chain.any():
            return out
        for srv in (np.unique(servers[chain]).tolist() if servers is not None else [-1]):
            m = chain if servers is None else chain & (servers == srv)
            by = prop if srv < 0 else self.proposers.remote[srv]
            out[m] = self.oracle.accept_prob_sum(dec.ids[m], dec.gen[m], dec.k[m], by)
        return out

    def _send_s(self, servers: np.ndarray | None, dec: DecodeBatch, accepted: np.ndarray) -> float:
        """The downlink after verification: every remote draft server that drafted this step gets its requests'
        accepted tokens and its next allocation back (``RemoteDraftServer.downlink_s``); the slowest sets the time."""
        if servers is None or not dec.ids.size:
            return 0.0
        t = 0.0
        drafted = dec.drafted
        for srv in np.unique(servers[drafted & (servers >= 0)]).tolist():
            m = servers == srv
            t = max(t, self.proposers.remote[srv].downlink_s(int(accepted[m].sum()) + int(m.sum())))
        return t

    def _arm_rewards(self, plan: StepPlan, prop: Proposer, pre: PrefillBatch, dec: DecodeBatch,
                     memory_s: float) -> np.ndarray:
        """The goodput (tokens emitted / step seconds) this step would have realized had every decoding request
        speculated a chain of γ, for γ = 0..``arms``: the same batch, memory actions and host work, the same text
        (the oracle's common random numbers), drafting and verification charged as for a real step. NaN for a γ the
        step could not run (a draft that is not resident; KV slots that do not fit). Nothing is applied."""
        s, n = self.s, dec.ids.size
        arms = self.arms or 0
        out = np.full(arms + 1, np.nan)
        remaining = s.output_len[dec.ids] - dec.gen
        bs = self.kv.block_size
        free = self.kv.free
        have = s.kv_blocks[dec.ids]
        for g in range(arms + 1):
            k = np.full(n, g, dtype=np.int64)
            if g:
                if prop.which is not None and prop.resident and not self.draft_resident:
                    continue
                need = np.maximum(-(-(dec.ctx + g + 1) // bs) - have, 0).sum()
                if need > free:
                    continue
            drafted = k > 0
            alt = DecodeBatch(dec.ids, dec.gen, dec.ctx, k, drafted, {}, None)
            draft_s = plan.host_s + (self.coster.draft_s(prop, plan, dec.ids, dec.ctx, k, drafted, {}, pre.ids,
                                                         pre.tokens, draft_resident=self.draft_resident)
                                     if g or plan.draft_sync else 0.0)
            shape, host_s = verify_pass(self.cost.engine, pre, alt)
            secs = memory_s + draft_s + self.cost.forward(shape).total_s + host_s
            accepted = self.oracle.score_chain(dec.ids, dec.gen, k, prop)[1] if g else np.zeros(n, dtype=np.int64)
            out[g] = float(np.minimum(accepted + 1, remaining).sum()) / secs
        return out

    def _begin_prefill(self, plan: StepPlan) -> PrefillBatch:
        """Admit and check the prefill chunks; allocate their KV."""
        s, pids, ptok = self.s, plan.prefill_ids, plan.prefill_tokens
        if pids.size == 0:
            return PrefillBatch(pids, ptok, 0.0, _NO_BOOL)
        if ptok.shape != pids.shape or (ptok <= 0).any():
            raise PlanError("prefill_tokens must give a positive chunk for every prefill id")
        st = s.status[pids]
        bad = (st != _WAITING) & (st != _RUNNING)
        if bad.any():
            raise PlanError(f"prefill of requests not waiting/running: {pids[bad]}")
        for rid in pids[st == _WAITING].tolist():  # admission: waiting -> running
            s.waiting.remove(rid)
            s.running.append(rid)
        s.status[pids] = _RUNNING
        pc = s.num_computed[pids]
        ntok = s.prompt_len[pids] + s.num_generated[pids]
        if (pc + ptok > ntok).any():
            raise PlanError("a prefill chunk goes past the request's tokens")
        self.kv.allocate(pids, pc + ptok)
        return PrefillBatch(pids, ptok, float((ptok * (pc + (ptok + 1) / 2.0)).sum()), pc + ptok == ntok,
                            float(pc.sum()))

    def _begin_decode(self, plan: StepPlan, prop: Proposer) -> DecodeBatch:
        """Check the decoding requests and their speculation; allocate KV for 1 + speculated tokens each."""
        s, dids = self.s, plan.decode_ids
        trees = plan.trees or {}
        n = int(dids.size)
        if n == 0:
            return DecodeBatch(dids, _NO_INT, _NO_INT, _NO_INT, _NO_BOOL, trees, None)
        gen = s.num_generated[dids]
        dc = s.num_computed[dids]
        if ((s.status[dids] != _RUNNING) | (dc != s.prompt_len[dids] + gen - 1)).any():
            raise PlanError("decode of requests that are not running or whose prefill has not finished")
        if plan.k is None:
            k = np.zeros(n, dtype=np.int64)
        else:
            k = np.asarray(plan.k, dtype=np.int64)
            if k.shape != dids.shape or k.min() < 0:
                raise PlanError("k must be a non-negative int per decode id")
        drafted = k > 0  # requests the proposer drafts for (a tree pays its beam search even if nothing is kept)
        first: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        if prop.proposes_first and drafted.any() and not trees:
            # prompt lookup runs before verification: only the tokens a match proposed are verified (and need KV)
            if plan.draft_server is not None:
                raise PlanError(f"proposer {prop.name!r} proposes before verification and cannot share a step "
                                "with remote draft servers")
            proposed = np.zeros(n, dtype=np.int64)
            if self.backend is not None:  # the real tokens' match; accepted when the target verifies them
                proposed[drafted] = self.backend.lookup(dids[drafted], k[drafted])
            else:
                accepted = np.zeros(n, dtype=np.int64)
                matched = np.zeros(n, dtype=np.int64)
                proposed[drafted], accepted[drafted], matched[drafted] = self.oracle.score_chain(
                    dids[drafted], gen[drafted], k[drafted], prop)
                first = (proposed, accepted, matched)
            k = proposed
        if trees:
            k = k.copy()
            for i, rid in enumerate(dids.tolist()):
                t = trees.get(rid)
                if t is not None:
                    _check_tree(t, rid, int(gen[i]))
                    k[i] = t.num_nodes
                    drafted[i] = t.cand.draft_depth > 0
        self.kv.allocate(dids, dc + k + 1)
        return DecodeBatch(dids, gen, dc, k, drafted, trees, first)

    def _accept(self, prop: Proposer, servers: np.ndarray | None,
                dec: DecodeBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draft tokens scored, accepted (the leading ones) and matched (every position whose token is the
        target's; for a tree, the accepted path) per decoding request, from the oracle (chains batched), each request
        on the stream of the proposer that drafted it: the plan's ``prop``, or the remote draft server ``servers``
        placed it on."""
        if dec.first is not None:  # decided before the step (see _begin_decode)
            return dec.first
        n = dec.ids.size
        proposed = np.zeros(n, dtype=np.int64)
        accepted = np.zeros(n, dtype=np.int64)
        matched = np.zeros(n, dtype=np.int64)
        if n == 0 or not dec.k.any():
            return proposed, accepted, matched
        chain = dec.k > 0
        if dec.trees:
            local: list[int] = []  # scored together on the plan's proposer
            for i, rid in enumerate(dec.ids.tolist()):
                t = dec.trees.get(rid)
                if t is not None:
                    chain[i] = False
                    proposed[i] = t.num_nodes
                    if servers is None or servers[i] < 0:
                        local.append(i)
                    else:
                        accepted[i] = matched[i] = self.oracle.accept_tree(t, self.proposers.remote[servers[i]])
            if local:
                got = self.oracle.accept_trees([dec.trees[int(dec.ids[i])] for i in local], prop)
                accepted[local] = matched[local] = got
        if chain.any():
            if servers is None:
                proposed[chain], accepted[chain], matched[chain] = self.oracle.score_chain(
                    dec.ids[chain], dec.gen[chain], dec.k[chain], prop)
            else:
                for srv in np.unique(servers[chain]).tolist():
                    m = chain & (servers == srv)
                    proposed[m], accepted[m], matched[m] = self.oracle.score_chain(
                        dec.ids[m], dec.gen[m], dec.k[m], prop if srv < 0 else self.proposers.remote[srv])
        if (accepted > proposed).any() or (matched > proposed).any():
            raise PlanError("oracle accepted more tokens than proposed")
        return proposed, accepted, matched

    def _placement(self, plan: StepPlan) -> np.ndarray | None:
        """The remote draft server each decoding request drafts on (-1: the plan's proposer, locally), or ``None``
        when the plan places none (or the deployment has no servers: everything drafts locally)."""
        if plan.draft_server is None or not self.proposers.remote:
            return None
        servers = np.asarray(plan.draft_server, dtype=np.int64)
        if servers.shape != plan.decode_ids.shape or (servers.size and servers.max() >= len(self.proposers.remote)):
            raise PlanError(f"draft_server must give a server index below {len(self.proposers.remote)} (or -1) per "
                            "decode id")
        return servers

    def _apply_decode(self, plan: StepPlan, prop: Proposer, dec: DecodeBatch, proposed: np.ndarray,
                      accepted: np.ndarray, matched: np.ndarray, start_at: float,
                      end_at: float) -> tuple[np.ndarray, np.ndarray]:
        """Emit ``accepted + 1`` tokens per decoding request (capped at its remaining length); return the tokens
        emitted and the requests that finished."""
        s, dids = self.s, dec.ids
        if dids.size == 0:
            return _NO_INT, _NO_INT
        gen = dec.gen
        remaining = s.output_len[dids] - gen
        emitted = np.minimum(accepted + 1, remaining)
        s.num_generated[dids] = gen + emitted
        new_computed = dec.ctx + emitted
        s.num_computed[dids] = new_computed
        self.kv.shrink_to(dids, new_computed)  # rejected speculation frees its KV slots
        if prop.keeps_kv:  # the draft's cache now holds what the target's does
            sync = dec.drafted | plan.draft_sync
            s.num_draft_computed[dids[sync]] = new_computed[sync]
        if proposed.any():
            s.num_proposed[dids] += proposed
            s.num_accepted[dids] += accepted
            s.num_matched[dids] += matched
            s.num_spec_steps[dids[proposed > 0]] += 1
        s.num_decode_steps[dids] += 1
        new = dids[np.isnan(s.first_decode_at[dids]) & (gen > 0)]  # a decode step after the first token
        s.first_decode_at[new] = start_at
        s.last_token_at[dids] = end_at
        fresh = gen == 0  # a prompt's last token decoded like any other: its sample is the first token
        if fresh.any():
            s.first_token_at[dids[fresh]] = end_at
        return emitted, dids[emitted == remaining]

    def _apply_prefill(self, plan: StepPlan, prop: Proposer, pre: PrefillBatch, end_at: float) -> np.ndarray:
        """Advance the prefill chunks; a chunk that completes its request's tokens samples one token. Returns the
        requests that finished."""
        s, pids = self.s, pre.ids
        if pids.size == 0:
            return _NO_INT
        s.num_computed[pids] += pre.tokens
        if plan.draft_sync and prop.keeps_kv:
            s.num_draft_computed[pids] = s.num_computed[pids]
        cids = pids[pre.completes]
        if cids.size == 0:
            return _NO_INT
        first = s.num_generated[cids] == 0
        s.first_token_at[cids[first]] = end_at
        s.num_generated[cids] += 1
        s.last_token_at[cids] = end_at
        return cids[s.num_generated[cids] >= s.output_len[cids]]

    def _check_unique(self, pids: np.ndarray, dids: np.ndarray) -> None:
        """No request twice in one step (a later write of ``mark`` hides an earlier duplicate)."""
        both = dids if not pids.size else (pids if not dids.size else np.concatenate([pids, dids]))
        n = both.size
        if n < 2:
            return
        pos = self._arange[:n] if n <= self._arange.size else np.arange(n)
        self._mark[both] = pos
        if (self._mark[both] != pos).any():
            raise PlanError("a request appears twice in one step")

    def _finish(self, rids: np.ndarray, at: float | np.ndarray) -> None:
        """Requests ``rids`` finish at ``at`` (one time, or each its own): their KV and oracle draws are freed."""
        s = self.s
        s.status[rids] = _FINISHED
        s.finish_at[rids] = at
        self.kv.release(rids)
        gone = set(rids.tolist())
        s.running = [r for r in s.running if r not in gone]
        for rid in gone:
            self.oracle.release(rid)
            if self.backend is not None:
                self.backend.release(rid)

    # --- preemption, swapping, memory actions -------------------------------------------------------------------
    def _preempt(self, plan: StepPlan) -> float:
        ids_ = plan.preempt_ids
        if ids_.size == 0:
            return 0.0
        s = self.s
        if (s.status[ids_] != _RUNNING).any():
            raise PlanError("preempting requests that are not running")
        gone = set(ids_.tolist())
        s.running = [r for r in s.running if r not in gone]
        s.num_preemptions[ids_] += 1
        self.kv.release(ids_)
        if plan.preempt_mode == "swap":
            s.status[ids_] = _SWAPPED
            s.swapped.extend(ids_.tolist())
            self._charge_swaps(ids_)
            if self.backend is not None:  # the real caches go to host memory: the copy's measured time
                return self.backend.swap(ids_, to_host=True)
            return self.cost.swap_s(int(s.num_computed[ids_].sum()), self._draft_kv_tokens(ids_))
        if self.backend is not None:
            self.backend.drop(ids_)
        s.status[ids_] = _WAITING
        s.num_computed[ids_] = 0
        s.num_draft_computed[ids_] = 0
        s.waiting.extendleft(reversed(ids_.tolist()))  # to the front, in the order given
        return 0.0

    def _swap_in(self, plan: StepPlan) -> float:
        ids_ = plan.swap_in_ids
        if ids_.size == 0:
            return 0.0
        s = self.s
        if (s.status[ids_] != _SWAPPED).any():
            raise PlanError("swapping in requests that are not swapped out")
        back = set(ids_.tolist())
        s.swapped = [r for r in s.swapped if r not in back]
        s.running.extend(ids_.tolist())
        s.status[ids_] = _RUNNING
        self.kv.allocate(ids_, s.num_computed[ids_])
        self._charge_swaps(ids_)
        if self.backend is not None:
            return self.backend.swap(ids_, to_host=False)
        return self.cost.swap_s(int(s.num_computed[ids_].sum()), self._draft_kv_tokens(ids_))

    def _charge_swaps(self, rids: np.ndarray) -> None:
        """Each request's own share of a swap (its KV, and its draft KV, over the host link): ``swap_s``."""
        s, draft = self.s, self.draft_resident
        for rid in rids.tolist():
            s.swap_s[rid] += self.cost.swap_s(int(s.num_computed[rid]), int(s.num_draft_computed[rid]) if draft else 0)

    def _draft_kv_tokens(self, rids: np.ndarray) -> int:
        """Tokens of the resident draft model's KV the requests hold (swapped with the target's)."""
        return int(self.s.num_draft_computed[rids].sum()) if self.draft_resident else 0

    def _memory_actions(self, plan: StepPlan, now: float) -> float:
        """Apply the plan's :class:`~repro.sim.plan.MemoryAction`; return the seconds it adds to the step."""
        mem = plan.memory
        if mem is None:
            return 0.0
        t = 0.0
        resident_after = self.draft_resident
        if mem.offload_draft:
            if not self.draft_resident:
                raise PlanError("offloading a draft model that is not resident")
            self.draft_resident = resident_after = False  # evicted at once: a host copy is kept (Nightjar §5.4)
            self.s.num_draft_computed[:] = 0  # its KV cache is dropped with it
        if mem.reload_draft:
            if self.draft_resident or self.draft_ready_at is not None or self.cost.draft is None:
                raise PlanError("reloading a draft model that is resident or loading (or not configured)")
            t += self.cost.engine.reload_dispatch_s  # the copy itself runs on its own stream
            self.draft_ready_at = now + self.cost.draft_transfer_s()
            resident_after = True  # its memory is taken now
        old, used = self.kv.total, self.kv.used
        self.kv.resize(mem.kv_pool_blocks, resident_after)
        if self.kv.total > old:
            t += self.cost.engine.kv_expand_s
        elif self.kv.total < old and used:
            # used blocks sit uniformly over the pool: those in the reclaimed region [total, old) move below it
            moved = round(used * (old - self.kv.total) / old)
            t += self.cost.kv_migrate_s(moved, self.kv.block_size)
        return t

    def _draft_arrived(self, now: float) -> None:
        """A reload started earlier completes once its transfer time has passed."""
        if self.draft_ready_at is not None and now >= self.draft_ready_at:
            self.draft_ready_at = None
            self.draft_resident = True
            self._sync_view()

_RUN_AHEAD_MAX = 2048  # a request's steps scored in one fast-forward (bounds its arrays)
_AR_RUN = np.arange(_RUN_AHEAD_MAX + 1, dtype=np.int64)
_RUN_HORIZON = 256  # steps scored ahead at a time in a run that goes on through arrivals
_ADMIT_AHEAD = 32  # arrivals scored ahead with the run's requests (the next chain_run call brings more)
_ADMIT_CAP = 256  # columns set aside at first for the requests a run admits (it grows past them if need be)
_RUN_COLUMNS = 1024  # the most requests in one run (bounds its arrays; the next run goes on from there)
_RUN_STEPS = 512  # the most steps of a request scored in a run through arrivals (a longer one: the next run's)
_NO_INT = np.zeros(0, dtype=np.int64)
_NO_BOOL = np.zeros(0, dtype=bool)


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


_NEVER = 1 << 40  # a request's last step while its finish is not scored yet
# a column not in use: rid, gen0, ctx0, rem, first (-1: not joined), last, avail, end, fin
_FILL = np.array([0, 0, 0, 0, -1, _NEVER, 0, 0, _NEVER], dtype=np.int64)[:, None]


class _Columns:
    """The requests of a fast-forwarded run, a column each: the plan's, then those the run admits (arrival ``i`` is
    column ``n + i - base``, allocated ahead of its arrival to score it with others). Per column: its id, its tokens
    generated and context at its first step in the run, what it has left to emit, the run's step at which it joined
    (-1: not yet) and, scored ahead by the oracle, after its own ``t`` steps its advance ``ahead[t]`` (at most what it
    had left), the draft tokens accepted ``acc[t]`` and matched ``mat[t]`` (``k`` > 0); ``avail`` of its steps are
    scored, and ``last`` is its finishing step once scored."""

    def __init__(self, s: RequestState, rids: np.ndarray, gen: np.ndarray, ctx: np.ndarray, rem: np.ndarray,
                 k: int, now: float, base: int, expected: int = 0, steps: int = _RUN_AHEAD_MAX) -> None:
        self.s, self.k = s, k
        self.steps = steps  # the most steps of a request scored in the run
        self.scored = 0  # the most steps of any request scored so far
        n = int(rids.size)
        self.n0, self.base, self.count = n, base, n
        cap = n + expected
        # rid, gen0, ctx0, rem, first, last, avail, end, fin
        if k:  # nothing scored yet
            zero = np.zeros(n, dtype=np.int64)
            ints = np.array((rids, gen, ctx, rem, zero, zero + _NEVER, zero, zero, zero + _NEVER))
        else:  # one token a step: nothing to score, each finishes after what it has left
            last = rem - 1
            ints = np.array((rids, gen, ctx, rem, last - last, last, last * 0 + _NEVER, rem, last))
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
            self.avail[c] = _NEVER
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
            self.fin[i] = first + last if last < _NEVER else _NEVER
            return
        first, last = self.first[c], self.last[c]
        self.end[c] = first + np.minimum(self.avail[c], last + 1)
        self.fin[c] = np.where(last < _NEVER, first + last, _NEVER)

    def contexts(self, members: np.ndarray, a: int, length: int) -> np.ndarray:
        """The members' contexts in the run's steps ``a`` .. ``a + length - 1`` (steps × members)."""
        if not self.k:  # one token a step (a member's steps end with its finishing step: nothing to cap)
            return (self.ctx0[members] + (a - self.first[members])) + _AR_RUN[:length, None]
        return self.ctx0[members] + self.ahead[members, (a - self.first[members]) + _AR_RUN[:length, None]]

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
        rows = t0 + _AR_RUN[1:h + 1, None]
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


def _check_tree(t: TreeSpec, rid: int, pos: int) -> None:
    cand = t.cand
    if cand.rid != rid or cand.pos != pos:
        raise PlanError(f"tree for request {rid} at position {pos} was drafted for {cand.rid} at {cand.pos}")
    nodes = t.nodes
    if nodes.size == 0:
        return
    if nodes.min() < 0 or nodes.max() >= cand.size:
        raise PlanError(f"tree of request {rid} selects unknown candidate nodes")
    sel = np.zeros(cand.size + 1, dtype=bool)  # index -1 (root) maps to the last slot
    sel[-1] = True
    sel[nodes] = True
    if not sel[cand.parent[nodes]].all():
        raise PlanError(f"tree of request {rid} is not connected to its root")


class Engine:
    """Runs a workload through a deployment (one policy, or the replicas it declares) and returns the final state.

    The engine builds each replica of ``deployment`` (its policy, its cost model at its tensor parallelism, its
    proposers around that cost model and the deployment's remote draft servers) and binds each policy with its
    replica's context and the run's ``rng``; a routing policy (one that declared replicas) is bound first, with the
    deployment's cost model at its ``tp``. ``record_steps`` adds a :class:`~repro.sim.trace.StepTracer` to
    ``observers`` (the run's :class:`SimOutput` then holds its records and telemetry), ``record_rounds`` a
    :class:`~repro.sim.trace.RoundTracer` (its table is ``SimOutput.rounds``). ``counterfactual_arms`` = N scores every
    decode step's uniform chain lengths 0..N as well (:meth:`Replica._arm_rewards`; the step trace then holds each
    step's best and realized goodput and the cumulative regret, Nightjar Eq. 2). ``max_steps`` stops a replica after
    that many steps (GoodSpeed's rounds); ``client`` gives each request's client (``View.client``); ``backend``
    executes every replica's steps on real models (:class:`repro.backends.hf.HfBackend`). ``fast_forward`` lets a
    replica whose policy :attr:`~repro.sim.policy.Policy.repeats_plan` compute a stretch of repeated steps at once
    (:meth:`Replica.run_ahead`; the results are the same either way, only faster).
    """

    def __init__(self, *, arrival_s: np.ndarray, prompt_len: np.ndarray, output_len: np.ndarray,
                 tpot_slo_s: np.ndarray, ttft_slo_s: np.ndarray, slo_class: np.ndarray, deployment: Deployment,
                 oracle: TokenOracle, rng: np.random.Generator, drafter: Drafter | None = None,
                 block_size: int = 16, max_model_len: int = 4096, record_steps: bool = False,
                 record_rounds: bool = False, observers: Sequence[StepObserver] = (),
                 counterfactual_arms: int | None = None, max_sim_time_s: float | None = None,
                 max_steps: int | None = None, client: np.ndarray | None = None,
                 backend: StepBackend | None = None, fast_forward: bool = True) -> None:
        self.arrival_s = np.asarray(arrival_s, dtype=np.float64)
        if self.arrival_s.size and (np.diff(self.arrival_s) < 0).any():
            raise ValueError("arrival times must be sorted")
        self.deployment = deployment
        self.policy = deployment.policy
        self.max_sim_time_s = max_sim_time_s
        self.tracer = StepTracer() if record_steps else None
        self.round_tracer = RoundTracer() if record_rounds else None
        watchers = tuple(o for o in (*observers, self.tracer, self.round_tracer) if o is not None)
        servers = deployment.draft_servers
        self.replicas: list[Replica] = []
        cols = (arrival_s, prompt_len, output_len, tpot_slo_s, ttft_slo_s, slo_class)
        self.max_steps = max_steps
        for i, spec in enumerate(deployment.replicas):
            cost = deployment.cost_model(spec.tp)
            state = RequestState(*cols)
            if client is not None:
                state.client[:] = np.asarray(client, dtype=np.int64)
            self.replicas.append(Replica(i, spec.policy, state, cost, oracle, block_size=block_size,
                                         max_model_len=max_model_len, proposers=colocated(cost, servers),
                                         drafter=drafter, observers=watchers, arms=counterfactual_arms,
                                         backend=backend, fast_forward=fast_forward))
        self.multi = deployment.routed
        if self.multi:
            cost = deployment.cost_model()
            self.policy.bind(PolicyContext(cost=cost, rng=rng, proposers=colocated(cost, servers)))
        for rep in self.replicas:
            rep.policy.bind(PolicyContext(cost=rep.cost, rng=rng, proposers=rep.proposers, replica=rep.index))
        self.replica_of = np.zeros(self.arrival_s.size, dtype=np.int64)

    def run(self) -> SimOutput:
        heap: list[tuple[float, int, int]] = []  # the replicas' next steps: (time, seq, replica)
        seq = itertools.count()
        arrivals = self.arrival_s
        n = int(arrivals.size)
        feed = ArrivalFeed(arrivals)  # arrivals come first at a time; a replica may admit some inside its runs
        reps = self.replicas
        views = [r.view for r in reps]
        through = feed if not self.multi and self.max_steps is None else None
        now = 0.0
        limit = self.max_sim_time_s
        idle_steps = 0
        stopped = False
        while True:
            upcoming = feed.time()
            if heap and heap[0][0] < upcoming:
                t, _, idx = heapq.heappop(heap)
                kind = _STEP
            elif feed.next < n:
                t, kind, idx = upcoming, _ARRIVAL, feed.next
                feed.next += 1
                upcoming = feed.time()
            else:
                break
            if t < now:
                raise SimulationError(f"time went backwards: {t} < {now}")
            if limit is not None and t > limit:
                now, stopped = limit, True
                break
            now = t
            if kind == _ARRIVAL:
                rep = reps[self.policy.route(idx, int(reps[0].s.slo_class[idx]), views)] if self.multi else reps[0]
                self.replica_of[idx] = rep.index
                rep.admit(idx)
                if not rep.busy:
                    rep.busy = True
                    heapq.heappush(heap, (now, next(seq), rep.index))
            else:
                rep = reps[idx]
                if self.max_steps is not None and rep.num_steps >= self.max_steps:
                    stopped = True  # the run's step budget (GoodSpeed's rounds): this replica stops here
                    continue
                end = rep.step(now, upcoming, limit, self.max_steps, through)
                if end is None:
                    rep.busy = False
                else:
                    # a plan with only preemptions/memory actions may take no time, but not forever
                    idle_steps = idle_steps + 1 if end <= now else 0
                    if idle_steps > 1000:
                        raise SimulationError(f"replica {idx} keeps planning steps that take no time")
                    heapq.heappush(heap, (end, next(seq), idx))
        stuck = [] if stopped else [r.index for r in reps if r.has_work()]  # (stopped: by the time limit or budget)
        if stuck:
            r = reps[stuck[0]]
            raise SimulationError(
                f"{type(r.policy).__name__} idled with {len(r.s.waiting)} waiting, {len(r.s.running)} running and "
                f"{len(r.s.swapped)} swapped requests and nothing left to happen")
        tracer = self.tracer
        return SimOutput(state=self._merged(), replica_of=self.replica_of, sim_time_s=now,
                         num_steps=sum(r.num_steps for r in reps), num_scheduled=sum(r.num_scheduled for r in reps),
                         steps=tracer.records if tracer is not None else [],
                         step_telemetry=tracer.telemetry if tracer is not None else [],
                         request_columns=self._request_columns(),
                         rounds=self.round_tracer.frame() if self.round_tracer is not None else None)

    def _request_columns(self) -> dict[str, np.ndarray]:
        """Each replica policy's :meth:`~repro.sim.policy.Policy.request_columns`, for the requests routed to it (NaN
        for the others)."""
        out: dict[str, np.ndarray] = {}
        n = self.arrival_s.size
        for rep in self.replicas:
            for name, values in rep.policy.request_columns().items():
                col = out.setdefault(name, np.full(n, np.nan))
                vals = np.full(n, np.nan)
                m = min(n, np.asarray(values).size)
                vals[:m] = np.asarray(values, dtype=np.float64)[:m]
                mine = self.replica_of == rep.index
                col[mine] = vals[mine]
        return out

    def _merged(self) -> RequestState:
        if len(self.replicas) == 1:
            return self.replicas[0].s
        base = self.replicas[0].s
        for name in ("status", "num_generated", "num_computed", "first_token_at", "first_decode_at", "finish_at",
                     "num_proposed", "num_accepted", "num_matched", "num_decode_steps", "num_spec_steps",
                     "num_preemptions", "last_token_at", "service_s", "swap_s"):
            arr = getattr(base, name)
            for r in self.replicas[1:]:
                mine = self.replica_of == r.index
                arr[mine] = getattr(r.s, name)[mine]
        return base
