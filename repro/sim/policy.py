"""Base class of every system: ``schedule(view) -> StepPlan`` then ``observe(result)``.

A system is built by Hydra from ``conf/system/<name>.yaml`` (its keys are the constructor's keyword arguments) and
bound to a run with :meth:`Policy.bind`, which hands it its replica's static context (hardware, models, cost model,
proposers, the run's random generator). Systems that split requests over separate replicas (AdaServe's SepPipe)
override :meth:`Policy.replicas`; the run's deployment (:mod:`repro.sim.deployment`) then has one replica per spec, the
engine runs one policy per replica and routes each request with :meth:`Policy.route`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from repro.sim.plan import ProposerName, RunResult, StepPlan, StepResult

if TYPE_CHECKING:
    from repro.cost.model import CostModel
    from repro.sim.proposers import Proposers
    from repro.sim.state import View


#: the fast-path promises a policy class may declare (:class:`Policy`'s docstring) ...
PROMISES = ("repeats_plan", "keeps_plan_after_finish", "admits", "repeats_some_plans")
#: ... and the methods whose code they are promises about
BEHAVIOUR = ("schedule", "observe", "plan_repeats", "observe_run")


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """Static facts about the run a policy may use (no ground truth): the cost model of its replica's GPUs (its
    hardware, target, draft, tp and serving engine are ``cost.hardware``, ``cost.model``, ``cost.draft``, ``cost.tp``
    and ``cost.engine``), the run's seeded random stream, for policies that randomize (the same seed gives the same
    run), its replica's proposers (by name, and the remote draft servers as ``proposers.remote``; ``None`` where the
    policy was bound outside an engine) and its replica's index."""

    cost: CostModel
    rng: np.random.Generator
    proposers: Proposers | None = None
    replica: int = 0


@dataclass(frozen=True, slots=True)
class WholePromptAdmission:
    """How a policy admits the requests that arrive while its repeated decode step runs, where it admits as vLLM
    v0's default scheduler does (``systems/lib.prefill_prioritized``): the waiting requests, first come first
    served, that fit whole (:func:`whole_prompts_that_fit`: ``max_num_batched_tokens`` prompt tokens in the step,
    ``max_num_seqs`` running, KV blocks left above ``watermark`` of the pool) run in a prefill-only step
    ``StepPlan(prefill_ids=..., prefill_tokens=..., proposer=proposer, draft_sync=draft_sync)``."""

    max_num_seqs: int
    max_num_batched_tokens: int
    watermark: float
    proposer: ProposerName = "draft"
    draft_sync: bool = False


def whole_prompts_that_fit(need: list[int], *, token_budget: int, max_new_seqs: int, free_blocks: int,
                           block_size: int) -> int:
    """How many of the waiting requests, in queue order, vLLM v0 admits whole: each request's ``need`` (its tokens
    to prefill) must fit the token budget left and its blocks the free blocks left (the watermark already taken
    off), at most ``max_new_seqs`` of them; the first that does not fit stops admission (head of line)."""
    if max_new_seqs <= 0 or token_budget <= 0:
        return 0
    budget, blocks, taken = token_budget, free_blocks, 0
    for n in need[:max_new_seqs]:
        if n <= 0 or n > budget:
            break
        nb = -(-n // block_size)
        if nb > blocks:
            break
        taken += 1
        budget -= n
        blocks -= nb
        if budget <= 0 or blocks <= 0:
            break
    return taken


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One serving replica of a deployment: its policy and its GPUs (tensor parallelism)."""

    policy: Policy
    tp: int


class Policy:
    """A serving system. Subclasses implement :meth:`schedule`; most also :meth:`observe`.

    ``uses_draft_model`` says whether the draft model's weights sit in GPU memory at start (it costs KV capacity;
    where they and the draft's KV live is the engine profile's ``draft_kv_layout``, ``conf/engine``).

    The fast-path promises. Each lets the engine's fast path (:mod:`repro.sim.fastforward`) run a stretch of steps
    without asking the policy; the fast path checks everything else, and its runs equal step-by-step ones bit for bit
    (``tests/test_fast_forward.py``, which every system that makes a promise should have a row in).

    - ``repeats_plan``: once this policy plans a step that decodes every running request (in the running order) with
      one chain length for all, and no trees, remote servers, host seconds, prefill, preemption, swap or memory
      action, it plans the very same step again for as long as no request arrives or finishes and the requests' KV
      for the next step fits the free blocks, and neither ``schedule`` nor ``observe`` changes its state in those
      steps (no random draws, no counters). Systems whose plans follow only the queues and the KV pool make it
      (vLLM's and Sarathi-Serve's schedulers, static speculation, a request-level FCFS or SJF order).
    - ``keeps_plan_after_finish`` (with ``repeats_plan``): when requests of such a step finish while nothing waits or
      is swapped out, its next plan is the same step over the rest of the batch (the chain length does not depend on
      the batch). vLLM's, Sarathi-Serve's and SepPipe's schedulers, static speculation (unless it switches off by
      batch size) and the request-level FCFS and SJF orders make it.
    - ``admits`` (with both): how the policy admits requests that arrive while its repeated step runs
      (:class:`WholePromptAdmission`), and that once such a prefill step has admitted every waiting request, its next
      plan is the repeated decode step again over every running request (the new ones last) with the same chain
      length, ``observe`` changing nothing for either. vLLM's scheduler and static speculation (unless it switches
      off by batch size) declare it. ``None``: the policy plans its own admissions.
    - ``repeats_some_plans``: the policy promises ``repeats_plan``'s repetition for some of its plans only, those for
      which :meth:`plan_repeats` says so, and takes the run of such a plan's steps at once in :meth:`observe_run`,
      ending in the state its ``observe`` would have left after each of them. LAPS-SD makes it for a batch of
      requests that are all pinned (perceptible, run to completion): its plan repeats, and its observations only
      add up.
    """

    uses_draft_model: bool = False
    #: the engine runs with a speculative method configured (vLLM V1's start-up profile then adds the rejection
    #: sampler's dummy pass: :mod:`repro.cost.serving`); False for a system that never speculates
    speculates: bool = True
    observes_accept_prob: bool = False  # ask for StepResult.accept_prob (the verifier's Σ min(1, p/q) per request)
    #: the draft tokens a round may verify across the remote draft servers (GoodSpeed's C), for systems that split
    #: one; a run with per-client requests then reports the optimum of the clients' utility at that budget
    #: (:func:`repro.experiments.simulate.edge_optimum`). None for every other system.
    round_budget: int | None = None
    #: whole passes over the point's workload run before the measured one
    # (:func:`repro.experiments.simulate.run_point`), each : on a fresh engine bound to this same policy object: a
    # policy that keeps what it learned across : :meth:`bind` (Nightjar as its authors' harness warmed it) starts the
    # measured pass warm. 0: none.
    warmup_passes: int = 0
    #: what the run must give the policy, checked before anything runs (:func:`repro.experiments.validate.check_point`):
    #: remote draft servers (``engine.draft_servers``; GoodSpeed's clients draft there) ...
    needs_draft_servers: bool = False
    #: ... and an engine profile that verifies token trees that branch (:attr:`EngineProfile.verifies_trees
    #: <repro.cost.serving.EngineProfile.verifies_trees>`), for a policy that plans them (AdaServe, SpecInfer).
    branching_trees: bool = False
    repeats_plan: bool = False  #: a fast-path promise (see the class docstring)
    keeps_plan_after_finish: bool = False  #: a fast-path promise (see the class docstring)
    admits: WholePromptAdmission | None = None  #: a fast-path promise and the admission rule (see the class docstring)
    repeats_some_plans: bool = False  #: a fast-path promise (see the class docstring)
    #: whether this class's promises are its own (:meth:`__init_subclass__`): False for a subclass that changes how
    #: the policy plans or observes without declaring a promise of its own; the engine then never takes the fast path
    promises_hold: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        """Promises are not inherited across a change of behaviour: a subclass whose own body overrides
        :meth:`schedule`, :meth:`observe`, :meth:`plan_repeats` or :meth:`observe_run` keeps its parents' fast-path
        promises only when its own body declares one of them again (``repeats_plan = True``, ...: each value then
        comes from the usual attribute lookup, as it did before). A subclass that changes neither inherits its
        parent's standing. A promise is a statement about the code of ``schedule`` and ``observe``; a parent's cannot
        cover a child's code (``tests/test_systems_contract.py`` runs a user's subclass both ways)."""
        super().__init_subclass__(**kwargs)
        body = vars(cls)
        if any(name in body for name in PROMISES):
            cls.promises_hold = True
        elif any(name in body for name in BEHAVIOUR):
            cls.promises_hold = False

    def bind(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    def schedule(self, view: View) -> StepPlan:
        raise NotImplementedError

    def observe(self, result: StepResult) -> None:
        """Called after every step with what a real server observes."""

    def plan_repeats(self, plan: StepPlan) -> bool:
        """Whether the fast path may repeat ``plan`` (the class docstring's promises): ``repeats_plan`` by default; a
        policy with ``repeats_some_plans`` says so plan by plan."""
        return self.repeats_plan

    def observe_run(self, run: RunResult) -> None:
        """Called once for a run of the repeated steps of a plan that :meth:`plan_repeats` promised (with
        ``repeats_some_plans``), in place of :meth:`observe` after each of them."""
        raise NotImplementedError(f"{type(self).__name__} promises repeats_some_plans without observe_run")

    def request_columns(self) -> Mapping[str, np.ndarray]:
        """Per-request values the policy estimated, by column name, each an array indexed by request id (NaN where
        it has none): added to the run's requests table, e.g. LAPS-SD's execution-time estimate ``estimate_s``
        (Eq. 6), which :mod:`repro.metrics.summary` compares with the request's service time. None by default."""
        return {}

    # --- multi-replica systems -------------------------------------------------------------------------------
    def replicas(self) -> list[ReplicaSpec] | None:
        """Separate replicas (each with its own policy and GPUs), or ``None`` for one replica run by ``self``."""
        return None

    def route(self, rid: int, slo_class: int, views: list[View]) -> int:
        """Replica index for a request arriving now (only called when :meth:`replicas` returns a list)."""
        return 0
