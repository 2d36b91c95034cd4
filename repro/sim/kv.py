"""A replica's paged KV cache: blocks of ``block_size`` tokens, shared by its requests (docs/design.md, "Engine").

The pool's size comes from the cost model (GPU memory left after the weights, by where a draft model's weights and
KV live: :meth:`repro.cost.model.CostModel.kv_capacity_blocks`); each request's block count lives in the request
state (``kv_blocks``), so policies read it through their view. The engine grows a request's blocks when a step
schedules tokens for it, shrinks them when speculation is rejected, and frees them when the request finishes, is
preempted or is swapped out; a policy may resize the pool (a draft offloaded or reloaded, a pool kept smaller).
Every operation that would need more blocks than the pool has is a :class:`~repro.sim.plan.PlanError`: the policy should
have preempted first.
"""

from __future__ import annotations

import numpy as np

from repro.cost.model import CostModel, DraftKvLayout
from repro.sim.plan import PlanError
from repro.sim.state import RequestState


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

    def check(self) -> None:
        """The invariant after every step: 0 ≤ used ≤ total."""
        if self.used > self.total or self.used < 0:
            raise PlanError(f"KV blocks used {self.used} outside [0, {self.total}]")
