"""The replica's KV pool (repro.sim.kv.KvPool) operation by operation, on hand-set request states: preemption by
swap and by recompute (the counts, the queues, the per-request and returned swap seconds with and without a
resident draft's KV, what a real backend is told), swap-in, shrinking, resizing at its bounds and the pool's own
check. Each assertion pins what a mutant of ``kv.py`` survived with the engine tests alone (docs/testing.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from repro.sim.kv import KvPool
from repro.sim.plan import PlanError, StepPlan, ids
from repro.sim.state import RUNNING, SWAPPED, WAITING, RequestState
from tests.conftest import make_cost

pytestmark = pytest.mark.usefixtures("no_data")

BS = 16


class _Backend:
    """A real backend's KV moves, recorded: each swap returns its own seconds."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int], Any]] = []

    def swap(self, rids: np.ndarray, *, to_host: bool) -> float:
        self.calls.append(("swap", rids.tolist(), to_host))
        return 0.125 if to_host else 0.25

    def drop(self, rids: np.ndarray) -> None:
        self.calls.append(("drop", rids.tolist(), None))


def _running(n: int, computed: list[int], draft: list[int], *, resident: bool = True,
             hardware: str = "a100-80g") -> tuple[RequestState, KvPool]:
    """``n`` running requests with ``computed`` target and ``draft`` draft tokens of KV, their blocks allocated."""
    state = RequestState(np.zeros(n), np.full(n, 256), np.full(n, 64), np.full(n, np.inf), np.full(n, np.inf),
                         np.zeros(n, dtype=np.int64))
    cost = make_cost(hardware=hardware)
    pool = KvPool(state, cost, block_size=BS, layout=cost.engine.draft_kv_layout, draft_resident=resident)
    rids = np.arange(n)
    state.status[rids] = RUNNING
    state.running = rids.tolist()
    state.num_computed[rids] = computed
    state.num_draft_computed[rids] = draft
    pool.allocate(rids, state.num_computed[rids])
    return state, pool


def test_a_swap_preemption_moves_the_requests_charges_each_its_share_and_returns_the_copy() -> None:
    state, pool = _running(3, [40, 100, 17], [30, 0, 9])
    cost = pool.cost
    used = pool.used
    secs = pool.preempt(StepPlan(preempt_ids=ids([2, 0]), preempt_mode="swap"), None, draft_resident=True)
    assert state.status.tolist() == [SWAPPED, RUNNING, SWAPPED] and state.running == [1] and state.swapped == [2, 0]
    assert state.num_preemptions.tolist() == [1, 0, 1] and state.kv_blocks.tolist() == [0, 7, 0]
    assert pool.used == used - 3 - 2
    assert secs == cost.swap_s(57, 39) and secs > cost.swap_s(57, 0)  # the draft's KV moves with the target's
    assert state.swap_s.tolist() == [cost.swap_s(40, 30), 0.0, cost.swap_s(17, 9)]
    assert state.num_computed.tolist() == [40, 100, 17] and state.num_draft_computed.tolist() == [30, 0, 9]
    # swapped back in: running again with their blocks, each charged a second copy, the copy's seconds returned
    secs_in = pool.swap_in(StepPlan(swap_in_ids=ids([0, 2])), None, draft_resident=True)
    assert secs_in == cost.swap_s(57, 39)
    assert state.status.tolist() == [RUNNING] * 3 and state.running == [1, 0, 2] and state.swapped == []
    assert state.kv_blocks.tolist() == [3, 7, 2] and pool.used == used
    assert state.swap_s.tolist() == [2 * cost.swap_s(40, 30), 0.0, 2 * cost.swap_s(17, 9)]
    # and out once more: the count and the seconds add up
    pool.preempt(StepPlan(preempt_ids=ids([0]), preempt_mode="swap"), None, draft_resident=True)
    assert state.num_preemptions.tolist() == [2, 0, 1] and state.swap_s[0] == 3 * cost.swap_s(40, 30)


def test_without_a_resident_draft_a_swap_moves_the_targets_kv_alone() -> None:
    state, pool = _running(2, [40, 100], [30, 50], resident=False)
    secs = pool.preempt(StepPlan(preempt_ids=ids([0, 1]), preempt_mode="swap"), None, draft_resident=False)
    assert secs == pool.cost.swap_s(140, 0) < pool.cost.swap_s(140, 80)
    assert state.swap_s.tolist() == [pool.cost.swap_s(40, 0), pool.cost.swap_s(100, 0)]
    assert pool.swap_in(StepPlan(swap_in_ids=ids([1])), None, draft_resident=False) == pool.cost.swap_s(100, 0)


def test_a_recompute_preemption_drops_the_kv_and_a_real_backend_is_told_what_moves() -> None:
    state, pool = _running(3, [40, 100, 17], [30, 20, 9])
    be: Any = _Backend()
    assert pool.preempt(StepPlan(preempt_ids=ids([1]), preempt_mode="recompute"), be, draft_resident=True) == 0.0
    assert be.calls == [("drop", [1], None)]
    assert state.status[1] == WAITING and list(state.waiting) == [1] and state.num_preemptions.tolist() == [0, 1, 0]
    assert state.num_computed[1] == 0 and state.num_draft_computed[1] == 0 and state.kv_blocks[1] == 0
    assert state.swap_s[1] == 0.0
    assert pool.preempt(StepPlan(preempt_ids=ids([2]), preempt_mode="swap"), be, draft_resident=True) == 0.125
    assert be.calls[-1] == ("swap", [2], True)
    assert pool.swap_in(StepPlan(swap_in_ids=ids([2])), be, draft_resident=True) == 0.25
    assert be.calls[-1] == ("swap", [2], False)
    assert state.swap_s[2] == 2 * pool.cost.swap_s(17, 9)  # each request's share is the model's, either way


def test_moving_requests_in_the_wrong_state_is_a_plan_error_naming_it() -> None:
    state, pool = _running(2, [40, 100], [0, 0])
    state.status[0] = WAITING
    with pytest.raises(PlanError, match=r"^preempting requests that are not running$"):
        pool.preempt(StepPlan(preempt_ids=ids([0]), preempt_mode="swap"), None, True)
    with pytest.raises(PlanError, match=r"^swapping in requests that are not swapped out$"):
        pool.swap_in(StepPlan(swap_in_ids=ids([1])), None, True)
    assert pool.preempt(StepPlan(), None, True) == 0.0 and pool.swap_in(StepPlan(), None, True) == 0.0


def test_shrinking_frees_the_rejected_blocks_and_the_pool_checks_its_bounds() -> None:
    state, pool = _running(2, [40, 100], [0, 0])
    assert state.kv_blocks.tolist() == [3, 7] and pool.used == 10
    pool.shrink_to(ids([0, 1]), np.array([17, 96]))
    assert state.kv_blocks.tolist() == [2, 6] and pool.used == 8
    pool.check()
    pool.used = pool.total + 1
    with pytest.raises(PlanError, match=rf"^KV blocks used {pool.total + 1} outside \[0, {pool.total}\]$"):
        pool.check()
    pool.used = -1
    with pytest.raises(PlanError, match=r"used -1 outside"):
        pool.check()


def test_the_pool_resizes_between_what_is_used_and_the_capacity() -> None:
    _, pool = _running(2, [40, 100], [0, 0])
    cap = pool.capacity(True)
    pool.resize(pool.used, True)  # exactly what is used: allowed
    assert pool.total == pool.used == 10
    pool.resize(None, True)
    assert pool.total == cap
    pool.resize(cap, True)
    for bad in (pool.used - 1, cap + 1):
        with pytest.raises(PlanError, match=rf"KV pool of {bad} blocks outside \[10 used, {cap} capacity\]"):
            pool.resize(bad, True)
    assert pool.total == cap


def test_a_plans_ids_are_one_flat_int64_array() -> None:
    got = ids(np.array([[3.0, 1.0], [2.0, 0.0]]))
    assert got.dtype == np.int64 and got.tolist() == [3, 1, 2, 0]
    assert ids(5).tolist() == [5] and ids().shape == (0,) and ids().dtype == np.int64
    assert ids([True, False]).dtype == np.int64


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("resident", [True, False])
def test_the_pools_capacity_is_the_cost_models_at_its_own_block_size(block_size: int, resident: bool) -> None:
    state = RequestState(np.zeros(1), np.full(1, 8), np.full(1, 8), np.full(1, np.inf), np.full(1, np.inf),
                         np.zeros(1, dtype=np.int64))
    cost = make_cost(draft="llama-68m")
    pool = KvPool(state, cost, block_size=block_size, layout=cost.engine.draft_kv_layout, draft_resident=resident)
    want = cost.kv_capacity_blocks(draft_resident=resident, block_size=block_size)
    assert pool.capacity(resident) == want and pool.total == want
    assert pool.capacity(not resident) == cost.kv_capacity_blocks(draft_resident=not resident, block_size=block_size)
