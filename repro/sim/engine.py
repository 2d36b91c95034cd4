"""The simulator's loop and its step path: one or more serving replicas, event by event.

:class:`Engine` takes events in time order: the sorted arrivals, each routed to a replica (``Policy.route`` where the
deployment has several) before any step at its time, and the replicas' steps (a heap of ``(time, seq, replica)``).
Simulated time never moves backwards. With ``max_concurrency`` the arrivals are a benchmark client's releases and a
closed loop (:mod:`repro.sim.client`) sends each when one of its slots is free. One step of a
:class:`~repro.sim.replica.Replica` (:mod:`repro.sim.replica`, re-exported here) is the reference of what the
simulator does.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from repro.sim.client import ClosedLoop
from repro.sim.fastforward import ArrivalFeed
from repro.sim.policy import PolicyContext
from repro.sim.proposers import colocated
from repro.sim.replica import Replica, SimulationError
from repro.sim.state import RequestState
from repro.sim.trace import RoundTracer, StepRecord, StepTracer

if TYPE_CHECKING:
    from repro.oracle import Drafter, TokenOracle
    from repro.sim.backend import StepBackend
    from repro.sim.deployment import Deployment
    from repro.sim.trace import StepObserver

_ARRIVAL, _STEP, _FREE = 0, 1, 2  # arrivals (and a closed loop's freed slots) at time t come before steps at t


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
    released_at: np.ndarray | None = None  # closed loop (max_concurrency): each request's release by the client


class Engine:
    """Runs a workload through a deployment (one policy, or the replicas it declares); :meth:`run` returns the output.

    Each replica gets its policy, its cost model (at its tensor parallelism) and its proposers (with the deployment's
    remote draft servers); each policy is bound with its replica's context and the run's ``rng``, a routing policy
    first (with the deployment's cost model). ``record_steps`` and ``record_rounds`` add the step and round traces
    (:mod:`repro.sim.trace`; ``SimOutput.steps`` and ``.rounds``) to ``observers``; ``counterfactual_arms`` = N scores
    every decode step's uniform chain lengths 0..N too (:meth:`Replica._arm_rewards`: the regret of Nightjar Eq. 2);
    ``max_steps`` stops a replica after that many steps (GoodSpeed's rounds); ``client`` gives each request's client
    (``View.client``); ``backend`` runs every step on real models (:class:`repro.backends.hf.HfBackend`);
    ``fast_forward=False`` turns the fast path off (:mod:`repro.sim.fastforward`: the same results, only slower).
    ``check_invariants=True`` checks the engine's invariants after every step (:mod:`repro.sim.invariants`).
    ``max_concurrency`` = C closes the loop (:class:`repro.sim.client.ClosedLoop`, vLLM's ``--max-concurrency``):
    ``arrival_s`` are then the client's releases, at most C requests are in flight, and a request's ``arrival_s`` in
    the output is when it was sent (``SimOutput.released_at``: its release).
    """

    def __init__(self, *, arrival_s: np.ndarray, prompt_len: np.ndarray, output_len: np.ndarray,
                 tpot_slo_s: np.ndarray, ttft_slo_s: np.ndarray, slo_class: np.ndarray, deployment: Deployment,
                 oracle: TokenOracle, rng: np.random.Generator, drafter: Drafter | None = None,
                 block_size: int = 16, max_model_len: int = 4096, record_steps: bool = False,
                 record_rounds: bool = False, observers: Sequence[StepObserver] = (),
                 counterfactual_arms: int | None = None, max_sim_time_s: float | None = None,
                 max_steps: int | None = None, client: np.ndarray | None = None,
                 backend: StepBackend | None = None, fast_forward: bool = True,
                 max_concurrency: int | None = None, check_invariants: bool = False) -> None:
        self.arrival_s = np.asarray(arrival_s, dtype=np.float64)
        if self.arrival_s.size and (np.diff(self.arrival_s) < 0).any():
            raise ValueError("arrival times must be sorted")
        # the API server in front of the engine (EngineProfile.frontend_in_s, frontend_out_s): the loop runs in the
        # engine core's time, where a request arrives frontend_in_s after its send and each output leaves
        # frontend_out_s before the client has it; the output is the client's (_to_client)
        self.frontend_in_s = float(deployment.engine.frontend_in_s)
        self.frontend_out_s = float(deployment.engine.frontend_out_s)
        if self.frontend_in_s:
            self.arrival_s = self.arrival_s + self.frontend_in_s
        if max_concurrency is not None:
            ClosedLoop(max_concurrency, self.arrival_s)  # (checks it)
        self.max_concurrency = max_concurrency
        # closed loop: the requests' arrival at the server is their send, written as they are sent (every replica's
        # state shares this array); the release times stay in self.arrival_s
        self.sent_at = self.arrival_s.copy() if max_concurrency is not None else self.arrival_s
        self.deployment = deployment
        self.policy = deployment.policy
        self.max_sim_time_s = max_sim_time_s
        self.tracer = StepTracer() if record_steps else None
        self.round_tracer = RoundTracer() if record_rounds else None
        watchers = tuple(o for o in (*observers, self.tracer, self.round_tracer) if o is not None)
        servers = deployment.draft_servers
        self.replicas: list[Replica] = []
        cols = (self.sent_at if max_concurrency is not None else self.arrival_s, prompt_len, output_len, tpot_slo_s,
                ttft_slo_s, slo_class)
        self.max_steps = max_steps
        for i, spec in enumerate(deployment.replicas):
            cost = deployment.cost_model(spec.tp)
            state = RequestState(*cols)
            if client is not None:
                state.client[:] = np.asarray(client, dtype=np.int64)
            self.replicas.append(Replica(i, spec.policy, state, cost, oracle, block_size=block_size,
                                         max_model_len=max_model_len, proposers=colocated(cost, servers),
                                         drafter=drafter, observers=watchers, arms=counterfactual_arms,
                                         backend=backend, fast_forward=fast_forward,
                                         check_invariants=check_invariants))
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
        # (through arrivals: not where a step's scheduler sees arrivals late, async scheduling's batch queue)
        can_go_through = not self.multi and self.max_steps is None and not any(r.pipelined for r in self.replicas)
        gate = self._closed_loop()  # the client's slots (None: the open loop, every release sent at once)
        through = feed if can_go_through and gate is None else None
        now = 0.0
        limit = self.max_sim_time_s
        idle_steps = 0
        stopped = False
        while True:
            upcoming = feed.time()
            free_at = math.inf  # closed loop: when the next slot frees
            if gate is not None:
                if gate.never_waits(n - feed.next):  # from here on every release is sent at once: the open loop's
                    self._open_loop()
                    gate = None
                    through = feed if can_go_through else None
                else:
                    free_at = gate.next_free()
            if heap and heap[0][0] < min(upcoming, free_at):
                t, _, idx = heapq.heappop(heap)
                kind = _STEP
            elif free_at <= upcoming and free_at < math.inf:
                t, kind = free_at, _FREE
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
            if kind == _FREE:
                assert gate is not None
                sent = gate.free()  # the request that waited longest is sent in the freed slot
                if sent is None:
                    continue
                idx = sent
            elif kind == _ARRIVAL and gate is not None and not gate.release(idx, now):
                continue  # it waits for a slot
            if kind != _STEP:
                rep = reps[self.policy.route(idx, int(reps[0].s.slo_class[idx]), views)] if self.multi else reps[0]
                self.replica_of[idx] = rep.index
                rep.admit(idx, now)
                if not rep.busy:
                    rep.busy = True
                    heapq.heappush(heap, (now, next(seq), rep.index))
            else:
                rep = reps[idx]
                if self.max_steps is not None and rep.num_steps >= self.max_steps:
                    stopped = True  # the run's step budget (GoodSpeed's rounds): this replica stops here
                    continue
                until = upcoming
                if gate is not None:
                    # a finish sends a waiting request: runs stop at their first finish and before a pending one
                    # (with several replicas, any replica's next step may finish one: single steps)
                    rep.stop_at_finish = bool(gate.queue)
                    if gate.queue:
                        until = math.nextafter(now, math.inf) if self.multi else min(upcoming, free_at)
                end = rep.step(now, until, limit, self.max_steps, through)
                if gate is not None and rep.finished:
                    done_at = rep.s.finish_at[np.concatenate(rep.finished)]
                    # its slot frees when the client has the last output; the next send reaches the engine later still
                    gate.finished((done_at + (self.frontend_out_s + self.frontend_in_s)).tolist()
                                  if self.frontend_in_s or self.frontend_out_s else done_at.tolist())
                    rep.finished.clear()
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
        state = self._merged()
        if self.frontend_in_s or self.frontend_out_s:
            now = self._to_client(state, now)
        return SimOutput(state=state, replica_of=self.replica_of, sim_time_s=now,
                         num_steps=sum(r.num_steps for r in reps), num_scheduled=sum(r.num_scheduled for r in reps),
                         steps=tracer.records if tracer is not None else [],
                         step_telemetry=tracer.telemetry if tracer is not None else [],
                         request_columns=self._request_columns(),
                         rounds=self.round_tracer.frame() if self.round_tracer is not None else None,
                         released_at=(self.arrival_s - self.frontend_in_s)
                         if self.max_concurrency is not None else None)

    def _to_client(self, state: RequestState, end_s: float) -> float:
        """The run as the client sees it through the API server: each request sent ``frontend_in_s`` before the engine
        had it, each output received ``frontend_out_s`` after the engine produced it. Returns the run's end then."""
        state.arrival_s = state.arrival_s - self.frontend_in_s
        for name in ("first_token_at", "first_decode_at", "last_token_at", "finish_at"):
            setattr(state, name, getattr(state, name) + self.frontend_out_s)
        return end_s + self.frontend_out_s

    def _closed_loop(self) -> ClosedLoop | None:
        """A new run's client slots (``max_concurrency``), every request unsent; ``None`` for the open loop."""
        if self.max_concurrency is None:
            return None
        self.sent_at[:] = self.arrival_s
        for rep in self.replicas:
            rep.finished = []
        return ClosedLoop(self.max_concurrency, self.sent_at)

    def _open_loop(self) -> None:
        """The client's slots no longer matter (nobody can wait): the replicas run as in the open loop."""
        for rep in self.replicas:
            rep.finished = None
            rep.stop_at_finish = False

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
