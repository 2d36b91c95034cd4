"""A replica's paged KV cache: blocks of ``block_size`` tokens, shared by its requests (docs/design.md, "Engine").

The pool's size comes from the cost model (GPU memory left after the weights, by where a draft model's weights and
KV live: :meth:`repro.cost.model.CostModel.kv_capacity_blocks`); each request's block count lives in the request
state (``kv_blocks``), so policies read it through their view. The engine grows a request's blocks when a step
schedules tokens for it, shrinks them when speculation is rejected, and frees them when the request finishes, is
preempted or is swapped out; a policy may resize the pool (a draft offloaded or reloaded, a pool kept smaller).
A plan's preemptions and swap-ins (:meth:`KvPool.preempt`, :meth:`KvPool.swap_in`) move their requests between the
queues with their blocks and return what the host copies take.
Every operation that would need more blocks than the pool has is a :class:`~repro.sim.plan.PlanError`: the policy should
have preempted first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from repro.cost.model import CostModel, DraftKvLayout
from repro.sim.plan import PlanError, StepPlan
from repro.sim.state import RUNNING as _RUNNING
from repro.sim.state import SWAPPED as _SWAPPED
from repro.sim.state import WAITING as _WAITING
from repro.sim.state import RequestState

if TYPE_CHECKING:
    from repro.sim.backend import StepBackend


class KvPool:
    """The blocks of one replica: ``total`` in the pool, ``used`` by its requests."""

    def __init__(self, state: RequestState, cost: CostModel, *, block_size: int, layout: DraftKvLayout,
                 draft_resident: bool) -> None:
        self.s = state
        self.cost = cost
        self.block_size = block_size
        self.layout: DraftKvLayout = layout
        self.total = self.capacity(draft_resident)
        self.used = 0

    def capacity(self, draft_resident: bool) -> int:
        """Blocks that fit with or without a resident draft model (weights and KV)."""
        return self.cost.kv_capacity_blocks(draft_resident=draft_resident, block_size=self.block_size,
                                            layout=self.layout)

    @property
    def free(self) -> int:
        return self.total - self.used

    def allocate(self, rids: np.ndarray, tokens: np.ndarray) -> None:
        """Grow the requests' KV to hold ``tokens`` tokens each (never shrinks)."""
        bs = self.block_size
        cur = self.s.kv_blocks[rids]
        need = np.maximum((tokens + (bs - 1)) // bs, cur)
        self.s.kv_blocks[rids] = need
        self.used += int(need.sum() - cur.sum())
        if self.used > self.total:
            raise PlanError(f"out of KV blocks: the plan needs {self.used} of {self.total} (preempt first)")

    def grew(self, blocks: int) -> None:
        """The requests' KV grew by ``blocks`` in all (:meth:`allocate`'s count, where a compiled kernel wrote the
        requests' blocks)."""
        self.used += blocks
        if self.used > self.total:
            raise PlanError(f"out of KV blocks: the plan needs {self.used} of {self.total} (preempt first)")

    def shrink_to(self, rids: np.ndarray, tokens: np.ndarray) -> None:
        """Shrink the requests' KV to ``tokens`` tokens each (rejected speculation frees its slots)."""
        bs = self.block_size
        need = (tokens + (bs - 1)) // bs
        self.used -= int(self.s.kv_blocks[rids].sum() - need.sum())
        self.s.kv_blocks[rids] = need

    def release(self, rids: np.ndarray) -> None:
        """Free every block of the requests (finished, preempted or swapped out)."""
        self.used -= int(self.s.kv_blocks[rids].sum())
        self.s.kv_blocks[rids] = 0

    def resize(self, blocks: int | None, draft_resident: bool) -> None:
        """Set the pool to ``blocks`` (``None``: everything that fits), between what is used and the capacity."""
        cap = self.capacity(draft_resident)
        target = cap if blocks is None else int(blocks)
        if target > cap or target < self.used:
            raise PlanError(f"KV pool of {target} blocks outside [{self.used} used, {cap} capacity]")
        self.total = target

    def preempt(self, plan: StepPlan, backend: StepBackend | None, draft_resident: bool) -> float:
        """Preempt the plan's ``preempt_ids``: free their blocks and swap them out (to the swapped queue) or drop their
        KV to recompute (to the front of the waiting queue). Returns the seconds the swap's copy takes."""
        ids_ = plan.preempt_ids
        if ids_.size == 0:
            return 0.0
        s = self.s
        if np.count_nonzero(s.status[ids_] != _RUNNING):
            raise PlanError("preempting requests that are not running")
        gone = set(ids_.tolist())
        s.running = [r for r in s.running if r not in gone]
        s.queues_changed("running")
        s.num_preemptions[ids_] += 1
        self.release(ids_)
        if plan.preempt_mode == "swap":
            s.status[ids_] = _SWAPPED
            s.swapped.extend(ids_.tolist())
            s.queues_changed("swapped")
            self._charge_swaps(ids_, draft_resident)
            if backend is not None:  # the real caches go to host memory: the copy's measured time
                return backend.swap(ids_, to_host=True)
            return self.cost.swap_s(int(s.num_computed[ids_].sum()), self._draft_kv_tokens(ids_, draft_resident))
        if backend is not None:
            backend.drop(ids_)
        s.status[ids_] = _WAITING
        s.num_computed[ids_] = 0
        s.num_draft_computed[ids_] = 0
        s.waiting.extendleft(reversed(ids_.tolist()))  # to the front, in the order given
        s.queues_changed("waiting")
        return 0.0

    def swap_in(self, plan: StepPlan, backend: StepBackend | None, draft_resident: bool) -> float:
        """Swap the plan's ``swap_in_ids`` back in (running again, their blocks allocated); returns the copy's seconds.
        """
        ids_ = plan.swap_in_ids
        if ids_.size == 0:
            return 0.0
        s = self.s
        if np.count_nonzero(s.status[ids_] != _SWAPPED):
            raise PlanError("swapping in requests that are not swapped out")
        back = set(ids_.tolist())
        s.swapped = [r for r in s.swapped if r not in back]
        s.running.extend(ids_.tolist())
        s.queues_changed("swapped", "running")
        s.status[ids_] = _RUNNING
        self.allocate(ids_, s.num_computed[ids_])
        self._charge_swaps(ids_, draft_resident)
        if backend is not None:
            return backend.swap(ids_, to_host=False)
        return self.cost.swap_s(int(s.num_computed[ids_].sum()), self._draft_kv_tokens(ids_, draft_resident))

    def _charge_swaps(self, rids: np.ndarray, draft: bool) -> None:
        """Each request's own share of a swap (its KV, and its draft KV, over the host link): ``swap_s``."""
        s = self.s
        for rid in rids.tolist():
            s.swap_s[rid] += self.cost.swap_s(int(s.num_computed[rid]), int(s.num_draft_computed[rid]) if draft else 0)

    def _draft_kv_tokens(self, rids: np.ndarray, draft: bool) -> int:
        """Tokens of the resident draft model's KV the requests hold (swapped with the target's)."""
        return int(self.s.num_draft_computed[rids].sum()) if draft else 0

    def check(self) -> None:
        """The invariant after every step: 0 ≤ used ≤ total."""
        if self.used > self.total or self.used < 0:
            raise PlanError(f"KV blocks used {self.used} outside [0, {self.total}]")
