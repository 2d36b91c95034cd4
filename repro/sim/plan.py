"""The contract between a policy and the engine: what a policy may ask for in one step, and what it observes.

A policy's ``schedule(view)`` returns a frozen :class:`StepPlan`; the engine checks it, charges its time from the
cost model, asks the token oracle how much of the speculation the target accepts, applies the result and calls
``observe(result)`` with a :class:`StepResult` holding what a real server would observe.

Vocabulary (vLLM v1's, per request):
    num_tokens     prompt tokens + output tokens generated so far
    num_computed   tokens whose KV is on the GPU (a decoding request has ``num_computed == num_tokens - 1``:
                   its last sampled token is the input of the next step)
    prefill        a step that computes prompt (or, after a recompute preemption, prompt + output) tokens of a
                   request that has not caught up yet; the chunk that reaches ``num_tokens`` samples one token
    decode         a step that scores the request's last token plus its speculation (k chain tokens or a tree's
                   nodes) and emits ``accepted + 1`` tokens (capped at what the request still has to generate)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from repro.core.errors import PlanError as PlanError  # raised where plans are checked; defined below every raiser
from repro.core.speculation import CandidateTree as CandidateTree
from repro.core.speculation import ProposerName as ProposerName
from repro.core.speculation import TreeSpec as TreeSpec

if TYPE_CHECKING:
    from repro.sim.proposers import Proposer

PreemptMode = Literal["recompute", "swap"]

_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False


def _empty() -> np.ndarray:
    return _EMPTY


def ids(values: object = ()) -> np.ndarray:
    """An int64 id array (the type every id field of a plan holds)."""
    arr = np.asarray(values, dtype=np.int64)
    return arr.reshape(-1)


@dataclass(frozen=True, slots=True)
class MemoryAction:
    """Elastic memory for a co-located draft model (Nightjar §5), applied before the step runs.

    ``offload_draft`` evicts the draft's weights from the GPU at once (a copy is kept in host memory, §5.4: no
    transfer) and drops its KV cache (rebuilt by a draft catch-up prefill when a request next speculates).
    ``reload_draft`` starts copying the weights back on an asynchronous stream: the step pays only the dispatch (the
    engine profile's ``reload_dispatch_s``) and the draft becomes resident (``View.draft_resident``) once the host
    link has moved its weights (``CostModel.draft_transfer_s``), overlapped with the steps in between
    (``View.draft_loading`` meanwhile); its memory is taken from the KV pool at once. ``kv_pool_blocks`` sets the
    pool's size (``None``: everything that fits with the draft's residency after the action, so an offload expands
    the pool and a reload contracts it). Growing the pool costs the profile's ``kv_expand_s``; shrinking it migrates
    the used blocks that sit in the reclaimed region (:meth:`repro.cost.model.CostModel.kv_migrate_s`).
    """

    offload_draft: bool = False
    reload_draft: bool = False
    kv_pool_blocks: int | None = None


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What to run in one iteration. Id arrays are int64 request ids (indices into the workload).

    ``k`` gives each decoding request its chain length (aligned with ``decode_ids``; ``None`` = no speculation);
    ``trees`` maps a decoding request to a token tree to verify instead of a chain. ``proposer`` says what produces
    the chain: a name of the replica's proposers (``"draft"``, ``"eagle"``, ``"pld"``: its draft model, EAGLE head or
    prompt lookup) or one of the proposer objects the policy's context holds (:mod:`repro.sim.proposers`).
    ``draft_server`` (aligned with ``decode_ids``) places each request's drafting on one of the deployment's remote
    draft servers (GoodSpeed), which then drafts and is scored for it; -1 (or ``None`` for all) = the plan's proposer.
    ``draft_sync`` runs the draft model over the step's prefill chunks and non-speculating decodes too, keeping its KV
    cache in sync as vLLM does; otherwise a request whose draft cache fell behind pays a draft catch-up (a draft
    prefill of the missing tokens, Nightjar's switching cost) the next time it speculates.
    ``swap_in_ids`` brings swapped-out requests back (their KV is copied host → GPU before the step; they may decode
    in the same step). ``preempt_ids`` are evicted before the step, by recompute (KV freed, the request goes back to
    the front of the waiting queue) or swap (KV copied GPU → host).
    ``host_s`` is CPU time the policy's own per-step work spends on the serving critical path that the engine cannot
    see (e.g. TETRIS ranking every draft token of the batch), modelled by the policy from stated constants; the
    engine adds it to the step (before drafting). The policy's Python run time is never charged.
    ``telemetry`` holds named values the policy wants in the step trace (the arm a bandit chose, a server's token
    allocation): with ``engine.record_steps`` each name becomes a column of the steps table; the engine ignores them.
    """

    prefill_ids: np.ndarray = field(default_factory=_empty)
    prefill_tokens: np.ndarray = field(default_factory=_empty)
    decode_ids: np.ndarray = field(default_factory=_empty)
    k: np.ndarray | None = None
    trees: Mapping[int, TreeSpec] | None = None
    proposer: str | Proposer = "draft"
    draft_sync: bool = False
    draft_server: np.ndarray | None = None
    preempt_ids: np.ndarray = field(default_factory=_empty)
    preempt_mode: PreemptMode = "recompute"
    swap_in_ids: np.ndarray = field(default_factory=_empty)
    memory: MemoryAction | None = None
    host_s: float = 0.0
    telemetry: Mapping[str, float] | None = None

    @property
    def is_idle(self) -> bool:
        """Nothing to compute (the engine then waits for the next arrival)."""
        return self.prefill_ids.size == 0 and self.decode_ids.size == 0

    @property
    def num_seqs(self) -> int:
        return int(self.prefill_ids.size + self.decode_ids.size)


IDLE = StepPlan()


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a real server observes after a step (passed to ``policy.observe``).

    Arrays are aligned with the plan's ``decode_ids``: ``num_proposed`` draft tokens scored, ``num_accepted`` of them
    accepted (the bonus token is not counted), ``num_emitted`` tokens appended (``accepted + 1`` capped at what the
    request still had to generate). Times are simulated seconds: memory actions, drafting (``draft_s``, remote
    servers' uplinks included), verification, then ``send_s`` (the remote servers' downlinks). ``accept_prob``
    (only for a policy whose ``observes_accept_prob`` is set) is what a verifier computes in its pass over every
    drafted position: per request, Σ_j min(1, p_j / q_j) over its drafted tokens (GoodSpeed Eq. 3).
    """

    start_at: float
    end_at: float
    decode_ids: np.ndarray
    num_proposed: np.ndarray
    num_accepted: np.ndarray
    num_emitted: np.ndarray
    prefill_ids: np.ndarray
    finished_ids: np.ndarray
    draft_s: float
    verify_s: float
    memory_s: float
    num_batched_tokens: int
    send_s: float = 0.0  # after the target's pass: the downlink to the remote draft servers (GoodSpeed step 6)
    accept_prob: np.ndarray | None = None  # per decode id: Σ min(1, p/q) over its drafted tokens (policies that ask)

    @property
    def latency_s(self) -> float:
        return self.end_at - self.start_at


@dataclass(frozen=True, slots=True)
class RunResult:
    """A run of one repeated decode step, computed at once by the engine's fast path, as a policy that promised the
    plan (:meth:`Policy.plan_repeats <repro.sim.policy.Policy.plan_repeats>`) observes it
    (:meth:`Policy.observe_run <repro.sim.policy.Policy.observe_run>`): per step, in order, its drafting and
    verification seconds (``StepResult.draft_s`` and ``verify_s`` of each); per request of ``decode_ids``, the steps
    it ran in (from the first) and the draft tokens it proposed and accepted over them; the requests that finished,
    at the run's last step."""

    decode_ids: np.ndarray
    num_steps: np.ndarray
    num_proposed: np.ndarray
    num_accepted: np.ndarray
    draft_s: np.ndarray
    verify_s: np.ndarray
    finished_ids: np.ndarray
