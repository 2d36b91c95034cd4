"""Engine-owned request state (struct of arrays) and the read-only view a policy sees.

Every per-request quantity is a numpy array indexed by request id (the request's index in the workload's
:class:`~workloads.RequestTable`), so the engine updates a whole batch with a few vectorized operations. A policy
reads the same arrays through :class:`View`, where they are read-only; the reference output length (what the request
*will* generate) and the oracle's ground truth are never exposed (an output-length predictor sees the reference
length, and the policy only its estimate: :meth:`View.predicted_output_len`).
"""

from __future__ import annotations

from collections import deque
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from repro.cost.model import CostModel
    from repro.oracle import Drafter


class Status(IntEnum):
    """Lifecycle of a request inside one replica."""

    PENDING = 0  # not arrived yet (or routed to another replica)
    WAITING = 1  # arrived, no KV on the GPU (new, or preempted by recompute)
    RUNNING = 2  # KV on the GPU: prefilling or decoding
    SWAPPED = 3  # preempted by swap: KV in host memory
    FINISHED = 4


#: the statuses as plain ints, for per-step paths (looking up an IntEnum member costs a microsecond or more)
PENDING, WAITING, RUNNING, SWAPPED, FINISHED = (int(s) for s in Status)


_QUEUES = ("waiting", "running", "swapped")
_NO_IDS = np.zeros(0, dtype=np.int64)  # an empty queue, as every view shows it
_NO_IDS.flags.writeable = False


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class RequestState:
    """Mutable per-request arrays, owned by the engine (one instance per replica)."""

    def __init__(self, arrival_s: np.ndarray, prompt_len: np.ndarray, output_len: np.ndarray,
                 tpot_slo_s: np.ndarray, ttft_slo_s: np.ndarray, slo_class: np.ndarray) -> None:
        n = int(arrival_s.shape[0])
        self.n = n
        self.arrival_s = np.asarray(arrival_s, dtype=np.float64)
        self.prompt_len = np.asarray(prompt_len, dtype=np.int64)
        self.output_len = np.asarray(output_len, dtype=np.int64)  # hidden from policies
        self.tpot_slo_s = np.asarray(tpot_slo_s, dtype=np.float64)
        self.ttft_slo_s = np.asarray(ttft_slo_s, dtype=np.float64)
        self.slo_class = np.asarray(slo_class, dtype=np.int64)
        self.status = np.zeros(n, dtype=np.int8)
        self.num_generated = np.zeros(n, dtype=np.int64)
        self.num_computed = np.zeros(n, dtype=np.int64)  # tokens with KV on the GPU (or on the host if swapped)
        self.num_draft_computed = np.zeros(n, dtype=np.int64)  # tokens with KV in the draft model's cache
        self.client = np.zeros(n, dtype=np.int64)  # the client that sent the request (workload.clients; else 0)
        self.kv_blocks = np.zeros(n, dtype=np.int64)
        self.first_token_at = np.full(n, np.nan)
        self.first_decode_at = np.full(n, np.nan)  # start of the first decode step after the first token
        self.finish_at = np.full(n, np.nan)
        self.num_proposed = np.zeros(n, dtype=np.int64)
        self.num_accepted = np.zeros(n, dtype=np.int64)
        self.num_matched = np.zeros(n, dtype=np.int64)  # proposed tokens that are the target's (vLLM v0's count)
        self.num_decode_steps = np.zeros(n, dtype=np.int64)
        self.num_spec_steps = np.zeros(n, dtype=np.int64)
        self.num_preemptions = np.zeros(n, dtype=np.int64)
        self.service_s = np.zeros(n)  # seconds of the steps the request ran in (drafting + verification)
        self.swap_s = np.zeros(n)  # seconds moving the request's KV between GPU and host (out and back in)
        self.last_token_at = np.full(n, np.nan)  # when the request last emitted a token
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.swapped: list[int] = []
        # per queue, bumped by whatever changes it (:meth:`queues_changed`): the View rebuilds a queue's array only
        # then, not every step
        self.queue_versions = {"waiting": 0, "running": 0, "swapped": 0}

    def queues_changed(self, *queues: str) -> None:
        """Say that the named queues changed: ``"waiting"``, ``"running"``, ``"swapped"`` (none named: all three). Every
        change to them must."""
        versions = self.queue_versions
        for name in queues or _QUEUES:
            versions[name] += 1

    @property
    def num_tokens(self) -> np.ndarray:
        return self.prompt_len + self.num_generated


class LengthPredictor(Protocol):
    """An output-length predictor (a proxy model, as LP-SJF's and LAPS-SD's): it is handed the reference lengths
    and returns its estimates, error included (``systems.lib.LogNormalLengthPredictor``)."""

    def predict(self, rids: np.ndarray, output_len: np.ndarray) -> np.ndarray: ...


class View:
    """What a policy may read: the state a real server has, read-only.

    ``waiting``/``running``/``swapped`` are int64 id arrays (waiting in queue order: preempted requests first, then
    arrival order; running in admission order). Per-request arrays are indexed by request id. ``drafter`` gives
    candidate token trees (the draft model's knowledge, never the truth); ``cost`` is the backend's cost model,
    which profiling systems may query like a GPU.
    """

    def __init__(self, state: RequestState, *, block_size: int, max_model_len: int, cost: CostModel,
                 drafter: Drafter | None, replica: int = 0) -> None:
        self._s = state
        self.now = 0.0
        self.step_index = 0
        self.replica = replica
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.cost = cost
        self.drafter = drafter
        self.free_blocks = 0
        self.total_blocks = 0
        self.draft_resident = False
        self.draft_loading = False  # an asynchronous reload of the draft's weights is under way
        self.arrival_s = _readonly(state.arrival_s)
        self.prompt_len = _readonly(state.prompt_len)
        self.tpot_slo_s = _readonly(state.tpot_slo_s)
        self.ttft_slo_s = _readonly(state.ttft_slo_s)
        self.slo_class = _readonly(state.slo_class)
        self.num_generated = _readonly(state.num_generated)
        self.num_computed = _readonly(state.num_computed)
        self.num_draft_computed = _readonly(state.num_draft_computed)  # what a real server's draft cache holds
        self.client = _readonly(state.client)  # who sent each request (GoodSpeed: its draft server)
        self.kv_blocks = _readonly(state.kv_blocks)
        self.first_token_at = _readonly(state.first_token_at)
        self.last_token_at = _readonly(state.last_token_at)
        self.num_proposed = _readonly(state.num_proposed)
        self.num_accepted = _readonly(state.num_accepted)
        self.num_decode_steps = _readonly(state.num_decode_steps)
        self.num_preemptions = _readonly(state.num_preemptions)
        self._cache: dict[str, tuple[int, np.ndarray]] = {}  # per queue: the version it shows, its array

    def _queue(self, name: str, src: Any) -> np.ndarray:
        """A queue as a read-only array, rebuilt only when the engine changed it since it was last built."""
        version = self._s.queue_versions[name]
        hit = self._cache.get(name)
        if hit is not None and hit[0] == version:
            return hit[1]
        if src:
            arr = np.fromiter(src, dtype=np.int64, count=len(src))
            arr.flags.writeable = False
        else:
            arr = _NO_IDS
        self._cache[name] = (version, arr)
        return arr

    @property
    def waiting(self) -> np.ndarray:
        return self._queue("waiting", self._s.waiting)

    @property
    def running(self) -> np.ndarray:
        return self._queue("running", self._s.running)

    @property
    def swapped(self) -> np.ndarray:
        return self._queue("swapped", self._s.swapped)

    def num_tokens(self, rids: np.ndarray) -> np.ndarray:
        """Prompt + generated tokens of ``rids`` (the context a decode step extends)."""
        return self._s.prompt_len[rids] + self._s.num_generated[rids]

    def blocks_for(self, rids: np.ndarray, new_tokens: np.ndarray | int) -> np.ndarray:
        """Extra KV blocks ``rids`` need to hold ``new_tokens`` more tokens than they have computed."""
        bs = self.block_size
        need = (self._s.num_computed[rids] + new_tokens + bs - 1) // bs
        return np.maximum(need - self._s.kv_blocks[rids], 0)

    def status(self, rids: np.ndarray) -> np.ndarray:
        return self._s.status[rids]

    def predicted_output_len(self, rids: np.ndarray, predictor: LengthPredictor) -> np.ndarray:
        """``predictor``'s estimate of the output length of ``rids``: what a server running a length predictor
        knows before decoding. The reference length goes to the predictor only; the policy sees its estimate."""
        rids = np.asarray(rids, dtype=np.int64)
        return np.asarray(predictor.predict(rids, self._s.output_len[rids]), dtype=np.int64)
