"""One serving replica's step: the simulator's reference of what a step does (:class:`Replica`).

1. schedule: the policy plans a :class:`~repro.sim.plan.StepPlan` from its read-only :class:`~repro.sim.state.View`;
2. execute (:meth:`Replica._execute`): check the plan, apply its memory actions, preemptions and swap-ins, allocate
   KV, charge drafting and one target forward under the run's engine profile (:mod:`repro.sim.stepcost`), ask the
   token oracle what the speculation yields (each request on its proposer's stream), emit tokens, finish requests;
3. observe: the observers (:mod:`repro.sim.trace`) get the step, then the policy its
   :class:`~repro.sim.plan.StepResult`.

Before executing, a replica offers the plan to its fast path (:mod:`repro.sim.fastforward`), which may run it and
its repetitions at once with the same results (the engine hands it the arrivals it may admit on the way). With a
real backend (``backend=hf``) the plan runs on real models: they decide the acceptance, and time is their wall clock.
The event loop over replicas and arrivals is :mod:`repro.sim.engine`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from repro.core import jit
from repro.core.speculation import TreeSpec, chain_prefixes, check_trees, trees_at
from repro.cost.model import ForwardShape
from repro.cost.step import DecodeBatch, PrefillBatch, chain_args, verify_args, verify_pass
from repro.sim.fastforward import ArrivalFeed, FastForward
from repro.sim.invariants import InvariantChecker
from repro.sim.kv import KvPool
from repro.sim.plan import PlanError, StepPlan, StepResult
from repro.sim.proposers import colocated
from repro.sim.state import FINISHED as _FINISHED
from repro.sim.state import RUNNING as _RUNNING
from repro.sim.state import WAITING as _WAITING
from repro.sim.state import RequestState, View
from repro.sim.stepcost import StepCoster
from repro.sim.trace import StepEvent

if TYPE_CHECKING:
    from repro.cost.model import CostModel, ForwardCost
    from repro.oracle import Drafter, TokenOracle
    from repro.sim.backend import StepBackend
    from repro.sim.policy import Policy
    from repro.sim.proposers import Proposer, Proposers
    from repro.sim.trace import StepObserver

_NO_INT = np.zeros(0, dtype=np.int64)
_NO_BOOL = np.zeros(0, dtype=bool)
_NO_PREFILL = PrefillBatch(_NO_INT, _NO_INT, 0.0, _NO_BOOL)  # a step without prefill chunks


class SimulationError(RuntimeError):
    """The simulation cannot continue (e.g. the policy idles while requests wait and nothing else will happen)."""


class Replica:
    """One serving instance: a policy, its request state, its GPU memory, its cost model and its proposers."""

    def __init__(self, index: int, policy: Policy, state: RequestState, cost: CostModel, oracle: TokenOracle,
                 *, block_size: int, max_model_len: int, proposers: Proposers | None = None,
                 drafter: Drafter | None = None, observers: Sequence[StepObserver] = (),
                 arms: int | None = None, backend: StepBackend | None = None, fast_forward: bool = True,
                 check_invariants: bool = False) -> None:
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
        # the fast path, only where every observer takes runs (the step trace does; the round trace and
        # counterfactual arms need single steps) and the models are simulated
        self.fast_forward = bool(fast_forward and policy.promises_hold
                                 and (policy.repeats_plan or policy.repeats_some_plans) and arms is None
                                 and backend is None
                                 and all(hasattr(o, "on_run") for o in self.observers))
        self.draft_resident = bool(policy.uses_draft_model and cost.draft is not None)
        self.draft_ready_at: float | None = None  # when an asynchronous draft reload completes
        self.kv = KvPool(state, cost, block_size=block_size, layout=cost.engine.draft_kv_layout,
                         draft_resident=self.draft_resident)
        if self.kv.total <= 0:
            raise SimulationError(
                f"the model does not fit: {cost.model.name} (tp={cost.tp}) on {cost.hardware.name} leaves no KV memory")
        self._mark = np.zeros(state.n, dtype=np.int64)
        self._arange = np.arange(1024)
        # the lean step of chains (_execute_chains): simulated models, nothing that watches single steps
        self._lean = backend is None and arms is None and not self.observers and not policy.observes_accept_prob
        self._sums = np.zeros(3, dtype=np.int64)
        self.busy = False
        # vLLM V1's batch queue under async scheduling (EngineProfile.async_scheduling): step n + 1 is scheduled while
        # step n runs, so a request that arrives during step n is first seen by step n + 2 (_visible)
        self.pipelined = bool(cost.engine.async_scheduling)
        self.pending: list[tuple[float, int]] = []  # (arrival, id): arrived, not yet seen by the scheduler
        self.last_start = self.last_end = -math.inf  # the last step's start and end
        self.stop_at_finish = False  # a finish may send a waiting request (closed loop): runs stop after one
        self.finished: list[np.ndarray] | None = None  # closed loop: the requests finished since the engine looked
        self.num_steps = 0
        self.num_scheduled = 0  # Σ over its steps of the requests each step ran (prefilling or decoding)
        self.view = View(state, block_size=block_size, max_model_len=max_model_len, cost=cost,
                         drafter=drafter, replica=index)
        self.sync_view()
        self.fast_path = FastForward(self)  # runs of repeated steps at once (used where fast_forward)
        # the engine's invariants after every step and run (repro.sim.invariants); None: nothing checked, nothing paid
        self.checker = InvariantChecker(self) if check_invariants else None

    @property
    def total_blocks(self) -> int:
        return self.kv.total

    @total_blocks.setter
    def total_blocks(self, blocks: int) -> None:
        self.kv.total = blocks

    @property
    def used_blocks(self) -> int:
        return self.kv.used

    def sync_view(self) -> None:
        """Show the policy the pool and the draft model as they stand."""
        v = self.view
        v.free_blocks = self.kv.free
        v.total_blocks = self.kv.total
        v.draft_resident = self.draft_resident
        v.draft_loading = self.draft_ready_at is not None

    def admit(self, rid: int, at: float = -math.inf) -> None:
        """Request ``rid`` arrives at ``at``: it waits for the scheduler (pipelined: once a step scheduled after
        ``at`` sees it)."""
        if self.pipelined:
            self.pending.append((at, rid))
            return
        self._wait(rid)

    def _wait(self, rid: int) -> None:
        self.s.status[rid] = _WAITING
        self.s.waiting.append(rid)
        self.s.queues_changed("waiting")

    def _visible(self, now: float, everyone: bool = False) -> None:
        """Show the scheduler of the step starting at ``now`` the requests it can see. Under async scheduling a step
        that follows another at once was scheduled when that one started (vLLM V1's ``step_with_batch_queue``, two
        batches in flight): it sees the arrivals up to that start. After an idle gap, or ``everyone`` (the earlier
        schedule had nothing to run), the engine schedules as the requests come: it sees them all."""
        cutoff = self.last_start if (self.last_end == now and not everyone) else now
        seen = [rid for at, rid in self.pending if at <= cutoff]
        if seen:
            self.pending = [(at, rid) for at, rid in self.pending if at > cutoff]
            for rid in seen:
                self._wait(rid)

    def has_work(self) -> bool:
        return bool(self.s.waiting or self.s.running or self.s.swapped or self.pending)

    def step(self, now: float, until: float = math.inf, limit: float | None = None,
             max_steps: int | None = None, arrivals: ArrivalFeed | None = None) -> float | None:
        """Run one step starting at ``now``: schedule, execute, observe; return its end time, or ``None`` if the policy
        idles. With the fast path, the steps it runs at once instead (:meth:`FastForward.run_ahead
        <repro.sim.fastforward.FastForward.run_ahead>`: before ``until``, the next arrival, or through ``arrivals``;
        by ``limit``; the replica's steps at most ``max_steps``): the end of the last."""
        if not jit.step_kernels():
            jit.stepped()  # (the step kernels engage once Numba is loaded, or after enough steps: repro.core.jit)
        self._draft_arrived(now)
        if self.pending:
            self._visible(now)
        v = self.view
        v.now = now
        v.step_index = self.num_steps
        observers = self.observers
        plan, wall_s = self._schedule(v)
        mem = plan.memory
        if plan.is_idle and mem is None and plan.preempt_ids.size == 0 and plan.swap_in_ids.size == 0:
            if not self.pending:
                return None
            self._visible(now, everyone=True)  # nothing was scheduled ahead: the engine takes the new requests now
            plan, wall_s = self._schedule(v)
            if plan.is_idle and plan.memory is None and plan.preempt_ids.size == 0 and plan.swap_in_ids.size == 0:
                return None
        # (not while arrivals wait to be seen: the next step's scheduler sees them, and plans anew)
        if self.fast_forward and not self.pending and self.policy.plan_repeats(plan):
            end = self.fast_path.run_ahead(plan, now, until, limit,
                                           None if max_steps is None else max_steps - self.num_steps, wall_s, arrivals)
            if end is not None:
                self.last_start, self.last_end = self.fast_path.last_start, end
                if self.checker is not None:
                    self.checker.after_run(now, end)
                return end
        result, pre, dec, matched, fwd, host_s, arm_rewards = self._execute(plan, now)
        self.last_start, self.last_end = now, result.end_at
        self.num_steps += 1
        self.num_scheduled += int(pre.ids.size + dec.ids.size)
        self.sync_view()
        if self.checker is not None:
            self.checker.after_step(plan, result)
        if observers:
            event = StepEvent(self.index, plan, result, pre, dec, matched,
                              fwd.overhead_s + host_s if fwd is not None else 0.0, wall_s, v, arm_rewards)
            for obs in observers:
                obs.on_step(event)
        self.policy.observe(result)
        return result.end_at

    def _schedule(self, v: View) -> tuple[StepPlan, float]:
        """The policy's plan for this step, and its own CPU seconds where observers measure them (AdaServe Fig. 9's
        "scheduling", measured not modelled)."""
        if not self.observers:
            return self.policy.schedule(v), 0.0
        t0 = time.perf_counter()
        plan = self.policy.schedule(v)
        return plan, time.perf_counter() - t0

    def _execute(self, plan: StepPlan, now: float) -> tuple[StepResult, PrefillBatch, DecodeBatch, np.ndarray,
                                                            ForwardCost | None, float, np.ndarray | None]:
        """Check and charge ``plan``, apply its outcome; return what the policy observes, and for observers the
        batches charged, the matched tokens, the target's pass, the host seconds of speculation and (``arms``) the
        counterfactual goodput of every uniform chain length (:meth:`_arm_rewards`)."""
        if self._lean and plan.k is not None and not plan.trees and plan.draft_server is None and plan.memory is None \
                and not (plan.prefill_ids.size or plan.preempt_ids.size or plan.swap_in_ids.size) \
                and plan.host_s >= 0.0 and jit.step_kernels():
            done = self._execute_chains(plan, now)
            if done is not None:
                return done
        if self._lean and plan.trees and plan.k is None and plan.draft_server is None and plan.memory is None \
                and not (plan.prefill_ids.size or plan.preempt_ids.size or plan.swap_in_ids.size) \
                and plan.host_s >= 0.0 and jit.step_kernels():
            done = self._execute_prefixes(plan, now)
            if done is not None:
                return done
        self._check_unique(plan.prefill_ids, plan.decode_ids)
        prop = self._resolve(plan.proposer)
        servers = self.proposers.placement(plan.draft_server, plan.decode_ids)
        # (left to right: a swap moves the draft's KV too where the draft is resident after the memory actions)
        memory_s = (self._memory_actions(plan, now) + self.kv.preempt(plan, self.backend, self.draft_resident)
                    + self.kv.swap_in(plan, self.backend, self.draft_resident)) \
            if plan.memory is not None or plan.preempt_ids.size or plan.swap_in_ids.size else 0.0
        pre = self._begin_prefill(plan)
        dec = self._begin_decode(plan, prop)
        if pre.ids.size and dec.ids.size and not self.cost.engine.spec_with_prefill and np.count_nonzero(dec.k):
            raise PlanError(f"engine {self.cost.engine.name}: a step cannot both prefill and speculate (the engine "
                            "runs speculation without chunked prefill)")
        # time: drafting, then one target forward over every scheduled token
        real = self.backend.run_step(self.s, plan, prop, pre, dec) if self.backend is not None else None
        if real is not None:  # measured on real models
            draft_s, verify_s, num_tokens, fwd, host_s = real.draft_s, real.verify_s, real.num_tokens, None, 0.0
        elif (prompts := self._prompts_s(plan, prop, pre, dec)) is not None:
            draft_s, verify_s = prompts
            num_tokens, fwd, host_s = int(pre.tokens.sum()), None, 0.0
        else:
            drafting = bool(np.count_nonzero(dec.drafted)) or plan.draft_sync
            draft_s = self.coster.draft_s(prop, plan, dec.ids, dec.ctx, dec.k, dec.drafted, dec.trees, pre.ids,
                                          pre.tokens, draft_resident=self.draft_resident) if drafting else 0.0
            args, host_s = verify_args(self.cost.engine, pre, dec)
            num_tokens = args[0]
            if self.observers:  # they see the pass's parts
                fwd = self.cost.forward(ForwardShape(*args)) if args[1] else None
                verify_s = fwd.total_s + host_s if fwd is not None else 0.0
            else:  # the same seconds
                fwd = None
                verify_s = self.cost.pass_s(*args) + host_s if args[1] else 0.0
        if real is None and pre.ids.size and self.cost.engine.draft_tokens > 1:
            first = self._first_drafts_s(prop, pre, dec)
            if first:
                draft_s += first
        if plan.host_s < 0.0:
            raise PlanError("host_s must be >= 0")
        draft_s += plan.host_s  # the policy's own host work before drafting, reported with the drafting
        end_at = now + memory_s + draft_s + verify_s
        arm_rewards = self._arm_rewards(plan, prop, pre, dec, memory_s) \
            if self.arms is not None and dec.ids.size and not dec.trees and servers is None and real is None else None
        # the step's compute is service to every request in it (ids are unique): the decoding ones' in _apply_decode
        if pre.ids.size:
            self.s.service_s[pre.ids] += draft_s + verify_s
        # outcome: the oracle's (or the real models') acceptance, tokens emitted, requests finished
        if real is not None:
            proposed, accepted, matched, send_s = real.proposed, real.accepted, real.matched, 0.0
            accept_prob = real.accept_prob if self.policy.observes_accept_prob else None
        else:
            proposed, accepted, matched = self.proposers.score(self.oracle, prop, servers, dec)
            send_s = self.proposers.downlink_s(servers, dec, accepted)
            accept_prob = (self.proposers.accept_prob(self.oracle, prop, servers, dec)
                           if self.policy.observes_accept_prob else None)
        end_at += send_s
        emitted, done_dec = self._apply_decode(plan, prop, dec, proposed, accepted, matched, now, end_at,
                                               draft_s + verify_s)
        done_pre = self._apply_prefill(plan, prop, pre, end_at)
        fin = np.concatenate([done_dec, done_pre]) if done_pre.size else done_dec
        if fin.size:
            self.finish(fin, end_at)
        self.kv.check()
        result = StepResult(
            start_at=now, end_at=end_at, decode_ids=dec.ids, num_proposed=proposed, num_accepted=accepted,
            num_emitted=emitted, prefill_ids=pre.ids, finished_ids=fin, draft_s=draft_s, verify_s=verify_s,
            memory_s=memory_s, num_batched_tokens=num_tokens, send_s=send_s, accept_prob=accept_prob)
        return result, pre, dec, matched, fwd, host_s, arm_rewards

    def _first_drafts_s(self, prop: Proposer, pre: PrefillBatch, dec: DecodeBatch) -> float:
        """Seconds of the drafter's draft steps 2..k for the requests whose prompt this step completes, where the
        engine releases a first token only with its first k drafts (``EngineProfile.first_token_drafts``; the prompt
        pass, step 1, is the step's drafter pass over the prompt): each step of one token per request, in the same
        passes as the decoding requests' own steps 2..k where those draft k too (their marginal cost), else on its
        own."""
        if prop.which is None or prop.remote:
            return 0.0
        new = pre.completes
        n_new = int(np.count_nonzero(new))
        if not n_new:
            return 0.0
        k = self.cost.engine.draft_tokens
        ctx = float((self.s.num_computed[pre.ids[new]] + pre.tokens[new]).sum())  # (before _apply_prefill)
        n_dec = int(np.count_nonzero(dec.k == k)) if dec.ids.size else 0
        c_dec = float(dec.ctx[dec.k == k].sum()) if n_dec else 0.0
        cost, which = prop.cost, prop.which
        total = 0.0
        for j in range(1, k):
            both = cost.forward_s(n_dec + n_new, n_dec + n_new, c_dec + ctx + j * (n_dec + n_new), 0.0,
                                  n_dec + n_new, True, which=which)
            total += both - (cost.forward_s(n_dec, n_dec, c_dec + j * n_dec, 0.0, n_dec, True, which=which)
                             if n_dec else 0.0)
        return total

    def _prompts_s(self, plan: StepPlan, prop: Proposer, pre: PrefillBatch,
                   dec: DecodeBatch) -> tuple[float, float] | None:
        """(drafting, verification) seconds of a prefill-only step over whole prompts with nothing cached (a scheduler
        without chunked prefill) where nothing watches the pass's parts: ``StepCoster.prompts_s``, the general
        pricing's terms in their order without building batches. ``None`` for any other step."""
        if dec.ids.size or not pre.ids.size or self.observers or self.cost.target_profile is not None \
                or pre.cached != 0.0 or np.count_nonzero(pre.completes) != pre.ids.size:
            return None
        return self.coster.prompts_s(prop, plan, pre.ids, pre.tokens, draft_resident=self.draft_resident)

    def _execute_chains(self, plan: StepPlan, now: float) -> tuple[StepResult, PrefillBatch, DecodeBatch, np.ndarray,
                                                                   None, float, None] | None:
        """:meth:`_execute` of a decode-only step in which every request drafts a chain of the same k > 0 with a
        co-located model whose cache holds its context, or none drafts (a chain system's common steps): the same
        checks, charges and outcome, its per-request reads in one compiled pass (``repro.sim.kernels.chains_begin``)
        and its pricing from their sums. ``None`` (nothing changed) for any other step: the general path takes it."""
        prop = self._resolve(plan.proposer)
        if prop.which is None or prop.proposes_first or prop.remote:
            return None
        s, dids = self.s, plan.decode_ids
        n = int(dids.size)
        k = np.asarray(plan.k, dtype=np.int64)
        if k.shape != dids.shape or not n:
            return None
        chain = int(k[0])  # (the kernel declines chains of other lengths)
        if (plan.draft_sync and not chain) or (chain and prop.resident and not self.draft_resident):
            return None  # (a draft kept in step without drafting; drafting with no draft: the general path's error)
        gen, ctx, sums = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), self._sums
        if not jit.kernel("repro.sim.kernels", "chains_begin")(
                self._mark, s.status, s.num_generated, s.num_computed, s.prompt_len, s.kv_blocks, s.num_draft_computed,
                dids, k, self.kv.block_size, prop.keeps_kv, gen, ctx, sums):
            return None
        added, c_sum, pairs = sums.tolist()
        self.kv.grew(added)
        dec = DecodeBatch(dids, gen, ctx, k, k > 0, {}, None)
        draft_s = (prop.host_s(n) + self.coster.chains_s(prop, n, c_sum, chain) if chain else 0.0) + plan.host_s
        args, host_s = chain_args(self.cost.engine, k, ctx, n if chain else 0, n * chain, chain + 1, c_sum, pairs)
        verify_s = self.cost.pass_s(*args) + host_s if args[1] else 0.0
        end_at = now + 0.0 + draft_s + verify_s  # (no memory actions)
        if chain:
            proposed, accepted, matched = self.oracle.score_chain(dids, gen, k, prop)
            if np.count_nonzero(np.maximum(accepted, matched) > proposed):
                raise PlanError("oracle accepted more tokens than proposed")
        else:
            proposed, accepted, matched = (np.zeros(n, dtype=np.int64) for _ in range(3))
        return self._lean_outcome(plan, prop, dec, (proposed, accepted, matched), now, end_at, draft_s, verify_s,
                                  args[0], host_s)

    def _lean_outcome(self, plan: StepPlan, prop: Proposer, dec: DecodeBatch,
                      scored: tuple[np.ndarray, np.ndarray, np.ndarray], now: float, end_at: float, draft_s: float,
                      verify_s: float, num_tokens: int, host_s: float) -> tuple[StepResult, PrefillBatch, DecodeBatch,
                                                                                np.ndarray, None, float, None]:
        """A lean step's outcome (:meth:`_execute_chains`, :meth:`_execute_prefixes`), applied as :meth:`_execute`
        applies it: tokens emitted, requests finished, the result the policy observes."""
        proposed, accepted, matched = scored
        emitted, fin = self._apply_decode(plan, prop, dec, proposed, accepted, matched, now, end_at, draft_s + verify_s)
        if fin.size:
            self.finish(fin, end_at)
        self.kv.check()
        result = StepResult(
            start_at=now, end_at=end_at, decode_ids=dec.ids, num_proposed=proposed, num_accepted=accepted,
            num_emitted=emitted, prefill_ids=_NO_INT, finished_ids=fin, draft_s=draft_s, verify_s=verify_s,
            memory_s=0.0, num_batched_tokens=num_tokens, send_s=0.0, accept_prob=None)
        return result, _NO_PREFILL, dec, matched, None, host_s, None

    def _execute_prefixes(self, plan: StepPlan, now: float) -> tuple[StepResult, PrefillBatch, DecodeBatch,
                                                                     np.ndarray, None, float, None] | None:
        """:meth:`_execute` of a decode-only step whose trees are each request's first ``c`` nodes of a greedy chain
        drafted to one depth by a co-located model whose cache holds its context
        (:func:`~repro.core.speculation.chain_prefixes`: TETRIS's steps): the same checks, charges and outcome,
        drafting priced as chains of that depth, verification as the general path prices the trees, acceptance read
        as chains. ``None`` (nothing changed) for any other step."""
        prop = self._resolve(plan.proposer)
        if prop.which is None or prop.proposes_first or prop.remote or (prop.resident and not self.draft_resident):
            return None
        s, dids, trees = self.s, plan.decode_ids, plan.trees or {}
        n = int(dids.size)
        found = chain_prefixes(trees, dids.tolist(), s.num_generated[dids].tolist()) if n else None
        if found is None:
            return None
        k, depth = found
        gen, ctx, sums = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), self._sums
        if not jit.kernel("repro.sim.kernels", "chains_begin")(
                self._mark, s.status, s.num_generated, s.num_computed, s.prompt_len, s.kv_blocks, s.num_draft_computed,
                dids, k, self.kv.block_size, prop.keeps_kv, gen, ctx, sums, True):
            return None
        added, c_sum = int(sums[0]), int(sums[1])
        self.kv.grew(added)
        dec = DecodeBatch(dids, gen, ctx, k, np.ones(n, dtype=bool), trees, None)
        draft_s = prop.host_s(n) + self.coster.chains_s(prop, n, c_sum, depth) + plan.host_s
        args, host_s = verify_args(self.cost.engine, _NO_PREFILL, dec)
        verify_s = self.cost.pass_s(*args) + host_s if args[1] else 0.0
        end_at = now + 0.0 + draft_s + verify_s  # (no memory actions)
        proposed = k.copy()
        accepted = self.oracle.accept_prefixes(dids, gen, k, prop)
        matched = accepted.copy()  # (a tree's matched tokens are its accepted path)
        return self._lean_outcome(plan, prop, dec, (proposed, accepted, matched), now, end_at, draft_s, verify_s,
                                  args[0], host_s)

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
                # (each request held ceil(context / block) blocks before the step: a request that reserved
                # more for its own k gives back what γ does not need)
                need = (-(-(dec.ctx + g + 1) // bs) - have).sum()
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
            return _NO_PREFILL
        if ptok.shape != pids.shape or np.count_nonzero(ptok <= 0):
            raise PlanError("prefill_tokens must give a positive chunk for every prefill id")
        st = s.status[pids]
        bad = (st != _WAITING) & (st != _RUNNING)
        if np.count_nonzero(bad):
            raise PlanError(f"prefill of requests not waiting/running: {pids[bad]}")
        for rid in pids[st == _WAITING].tolist():  # admission: waiting -> running
            s.waiting.remove(rid)
            s.running.append(rid)
            s.queues_changed("waiting", "running")
        s.status[pids] = _RUNNING
        pc = s.num_computed[pids]
        ntok = s.prompt_len[pids] + s.num_generated[pids]
        if np.count_nonzero(pc + ptok > ntok):
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
        if jit.step_kernels() and not trees and not prop.proposes_first:  # the same, compiled (repro.sim.kernels)
            k = np.zeros(n, dtype=np.int64) if plan.k is None else np.asarray(plan.k, dtype=np.int64)
            if k.shape == dids.shape:
                gen, ctx = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
                added = jit.kernel("repro.sim.kernels", "decode_begin")(
                    s.status, s.num_generated, s.num_computed, s.prompt_len, s.kv_blocks, dids, k, self.kv.block_size,
                    gen, ctx)
                if added >= 0:
                    self.kv.grew(added)
                    return DecodeBatch(dids, gen, ctx, k, k > 0, trees, None)
            # (a malformed plan: the NumPy path below reports it)
        gen = s.num_generated[dids]
        dc = s.num_computed[dids]
        if np.count_nonzero((s.status[dids] != _RUNNING) | (dc != s.prompt_len[dids] + gen - 1)):
            raise PlanError("decode of requests that are not running or whose prefill has not finished")
        if plan.k is None:
            k = np.zeros(n, dtype=np.int64)
        else:
            k = np.asarray(plan.k, dtype=np.int64)
            if k.shape != dids.shape or k.min() < 0:
                raise PlanError("k must be a non-negative int per decode id")
        drafted = k > 0  # requests the proposer drafts for (a tree pays its beam search even if nothing is kept)
        first: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        if prop.proposes_first and np.count_nonzero(drafted) and not trees:
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
            found = trees_at(trees, dids.tolist())
            at = [i for i, _ in found]
            specs: list[TreeSpec] = [t for _, t in found]
            if specs:
                k[at] = [t.nodes.shape[0] for t in specs]  # each tree's nodes
                drafted[at] = [t.cand.draft_depth > 0 for t in specs]
            check_trees(specs, dids[at].tolist(), gen[at].tolist())
        self.kv.allocate(dids, dc + k + 1)
        return DecodeBatch(dids, gen, dc, k, drafted, trees, first)

    def _apply_decode(self, plan: StepPlan, prop: Proposer, dec: DecodeBatch, proposed: np.ndarray,
                      accepted: np.ndarray, matched: np.ndarray, start_at: float,
                      end_at: float, step_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Emit ``accepted + 1`` tokens per decoding request (capped at its remaining length) and add the step's
        seconds ``step_s`` to its service; return the tokens emitted and the requests that finished."""
        s, dids = self.s, dec.ids
        n = dids.size
        if n == 0:
            return _NO_INT, _NO_INT
        if jit.step_kernels():  # the same, compiled (repro.sim.kernels)
            emitted, finished = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
            delta, done = jit.kernel("repro.sim.kernels", "decode_apply")(
                s.output_len, s.num_generated, s.num_computed, s.kv_blocks, s.num_draft_computed, s.num_proposed,
                s.num_accepted, s.num_matched, s.num_spec_steps, s.num_decode_steps, s.first_decode_at,
                s.last_token_at, s.first_token_at, s.service_s, dids, dec.gen, dec.ctx, dec.drafted,
                np.asarray(proposed, dtype=np.int64), np.asarray(accepted, dtype=np.int64),
                np.asarray(matched, dtype=np.int64), self.kv.block_size,
                (2 if plan.draft_sync else 1) if prop.keeps_kv else 0, step_s, start_at, end_at, emitted, finished)
            self.kv.used += delta
            return emitted, finished[:done]
        s.service_s[dids] += step_s
        gen = dec.gen
        remaining = s.output_len[dids] - gen
        emitted = np.minimum(accepted + 1, remaining)
        s.num_generated[dids] = gen + emitted
        new_computed = dec.ctx + emitted
        s.num_computed[dids] = new_computed
        self.kv.shrink_to(dids, new_computed)  # rejected speculation frees its KV slots
        if prop.keeps_kv:  # the draft's cache now holds what the target's does
            sync = dec.drafted | plan.draft_sync
            if np.count_nonzero(sync) == sync.size:
                s.num_draft_computed[dids] = new_computed
            else:
                s.num_draft_computed[dids[sync]] = new_computed[sync]
        if np.count_nonzero(proposed):
            s.num_proposed[dids] += proposed
            s.num_accepted[dids] += accepted
            s.num_matched[dids] += matched
            s.num_spec_steps[dids[proposed > 0]] += 1
        s.num_decode_steps[dids] += 1
        new = dids[np.isnan(s.first_decode_at[dids]) & (gen > 0)]  # a decode step after the first token
        s.first_decode_at[new] = start_at
        s.last_token_at[dids] = end_at
        fresh = gen == 0  # a prompt's last token decoded like any other: its sample is the first token
        if np.count_nonzero(fresh):
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
        if pids.size + dids.size < 2:
            return
        if jit.step_kernels():  # the same, compiled (repro.sim.kernels.unique_ids)
            if not jit.kernel("repro.sim.kernels", "unique_ids")(self._mark, pids, dids):
                raise PlanError("a request appears twice in one step")
            return
        both = dids if not pids.size else (pids if not dids.size else np.concatenate([pids, dids]))
        n = both.size
        if n < 2:
            return
        pos = self._arange[:n] if n <= self._arange.size else np.arange(n)
        self._mark[both] = pos
        if np.count_nonzero(self._mark[both] != pos):
            raise PlanError("a request appears twice in one step")

    def finish(self, rids: np.ndarray, at: float | np.ndarray) -> None:
        """Requests ``rids`` finish at ``at`` (one time, or each its own): their KV and oracle draws are freed."""
        s = self.s
        s.status[rids] = _FINISHED
        s.finish_at[rids] = at
        if self.finished is not None:
            self.finished.append(rids)
        self.kv.release(rids)
        gone = set(rids.tolist())
        s.running = [r for r in s.running if r not in gone]
        s.queues_changed("running")
        for rid in gone:
            self.oracle.release(rid)
            if self.backend is not None:
                self.backend.release(rid)

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
            self.sync_view()
