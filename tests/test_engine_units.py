"""Engine and view details a whole run's numbers hide (each pins what a mutant survived, docs/testing.md): the
policies' per-request columns of a multi-replica run, each from the replica the request went to; the view's queues,
read-only and rebuilt only when the engine changed them; a length predictor's inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from repro.sim.deployment import ReplicaSpec
from repro.sim.policy import Policy
from repro.sim.state import RequestState, View
from systems.vllm import VLLM
from tests.conftest import make_cost, make_requests, run

pytestmark = pytest.mark.usefixtures("no_data")


class _Estimates(VLLM):
    """vLLM reporting a per-request column: its own replica's mark for the first ``size`` requests."""

    def __init__(self, mark: float, size: int) -> None:
        super().__init__()
        self.mark, self.size = mark, size

    def request_columns(self) -> Mapping[str, np.ndarray]:
        return {"estimate": np.arange(self.size, dtype=np.int64) * 0 + self.mark}


class _TwoReplicas(Policy):
    """Requests by SLO class to one of two replicas that each report a column (the second for fewer requests)."""

    def __init__(self, n: int) -> None:
        self.pools = [ReplicaSpec(_Estimates(1.0, n), tp=1), ReplicaSpec(_Estimates(2.0, n - 2), tp=1)]

    def replicas(self) -> list[ReplicaSpec]:
        return self.pools

    def route(self, rid: int, slo_class: int, views: list[View]) -> int:
        return slo_class


def test_a_multi_replica_runs_request_columns_come_from_the_replica_each_request_went_to() -> None:
    reqs = make_requests(8, gap_s=0.01)
    reqs["slo_class"] = np.array([0, 1, 1, 0, 1, 0, 1, 1])
    out = run(_TwoReplicas(8), reqs)
    got = out.request_columns["estimate"]
    assert got.dtype == np.float64
    # replica 1 reported only 6 values: its requests 6 and 7 have none (NaN); every other value is its replica's
    assert np.array_equal(got, [1.0, 2.0, 2.0, 1.0, 2.0, 1.0, np.nan, np.nan], equal_nan=True)
    assert list(out.request_columns) == ["estimate"]


def _state(n: int) -> RequestState:
    return RequestState(np.zeros(n), np.full(n, 32), np.full(n, 8), np.full(n, np.inf), np.full(n, np.inf),
                        np.zeros(n, dtype=np.int64))


def _view(s: RequestState) -> View:
    return View(s, block_size=16, max_model_len=4096, cost=make_cost(), drafter=None)


def test_the_views_queues_are_read_only_and_rebuilt_only_when_the_engine_changed_them() -> None:
    s = _state(4)
    view = _view(s)
    s.waiting.extend([2, 0])
    s.queues_changed("waiting")
    first = view.waiting
    assert first.tolist() == [2, 0] and first.dtype == np.int64 and not first.flags.writeable
    with pytest.raises(ValueError):
        first[0] = 3
    assert view.waiting is first  # unchanged since: the same array, not a rebuilt one
    s.waiting.append(3)
    assert view.waiting is first  # (the engine says when it changed a queue)
    s.queues_changed("waiting")
    assert view.waiting.tolist() == [2, 0, 3] and view.waiting is not first
    assert view.running.size == 0 and view.running.dtype == np.int64


class _Predictor:
    def __init__(self) -> None:
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []

    def predict(self, rids: np.ndarray, output_len: np.ndarray) -> np.ndarray:
        self.seen.append((rids, output_len))
        return output_len * 1.5


def test_a_length_predictor_gets_the_int64_ids_and_reference_lengths_and_the_policy_its_int64_estimates() -> None:
    s = _state(3)
    s.output_len[:] = [8, 20, 3]
    pred = _Predictor()
    got = _view(s).predicted_output_len(np.array([2, 1], dtype=np.int32), pred)  # type: ignore[arg-type]
    rids, lens = pred.seen[0]
    assert rids.dtype == np.int64 and rids.tolist() == [2, 1] and lens.tolist() == [3, 20]
    assert got.dtype == np.int64 and got.tolist() == [4, 30]


def test_promises_are_not_inherited_across_a_new_schedule() -> None:
    """The rule itself: overriding schedule, observe, plan_repeats or observe_run voids the parent's promises unless
    the body declares one again (any of the four); a subclass that changes neither keeps its parent's standing."""
    from repro.sim.plan import RunResult, StepPlan, StepResult
    from systems.static_sd import StaticSD

    class Overrides(StaticSD):
        def schedule(self, view: View) -> StepPlan:
            return super().schedule(view)

    class Observes(StaticSD):
        def observe(self, result: StepResult) -> None:
            pass

    class Repeats(StaticSD):
        def plan_repeats(self, plan: StepPlan) -> bool:
            return False

    class Runs(StaticSD):
        def observe_run(self, run: RunResult) -> None:
            pass

    class Below(Overrides):
        pass

    class Kept(StaticSD):
        note = "no behaviour of its own"

    declared: list[type[StaticSD]] = [type(f"Declares_{name}", (Overrides,), {name: True}) for name in
                ("repeats_plan", "keeps_plan_after_finish", "admits", "repeats_some_plans")]
    assert StaticSD.promises_hold and Kept.promises_hold and all(c.promises_hold for c in declared)
    assert not any(c.promises_hold for c in (Overrides, Observes, Repeats, Runs, Below))
    again: type[StaticSD] = type("Again", (Below,), {"repeats_plan": True})
    assert again.promises_hold  # a promise declared again below a void one


def test_a_policy_promising_some_plans_must_observe_their_runs() -> None:
    class Some(VLLM):
        repeats_some_plans = True

    with pytest.raises(NotImplementedError, match=r"^Some promises repeats_some_plans without observe_run$"):
        Some().observe_run(object())  # type: ignore[arg-type]


def test_a_single_replica_policy_routes_everything_to_its_replica() -> None:
    assert VLLM().route(3, 0, []) == 0


def test_a_request_states_arrays_have_one_dtype_each_whatever_the_workload_passes() -> None:
    """Counts are int64 and times float64 from the start (a float count would print as 3.0 in points.csv and index
    nothing), whatever the workload's arrays are: floats for lengths, integers for times here."""
    n = 3
    s = RequestState(np.zeros(n, dtype=np.int64), np.full(n, 32.0), np.full(n, 8.0), np.full(n, 1, dtype=np.int64),
                     np.full(n, 2, dtype=np.int64), np.zeros(n))
    counts = ("num_generated", "num_computed", "num_draft_computed", "client", "kv_blocks", "num_proposed",
              "num_accepted", "num_matched", "num_decode_steps", "num_spec_steps", "num_preemptions")
    ints = ("prompt_len", "output_len", "slo_class", *counts)
    floats = ("arrival_s", "tpot_slo_s", "ttft_slo_s", "first_token_at", "first_decode_at", "finish_at", "service_s",
              "swap_s", "last_token_at")
    for name in ints:
        assert getattr(s, name).dtype == np.int64, name
    assert not any(getattr(s, name).any() for name in counts)
    assert (s.prompt_len.tolist(), s.output_len.tolist()) == ([32] * n, [8] * n)
    for name in floats:
        assert getattr(s, name).dtype == np.float64, name
    assert s.status.dtype == np.int8 and not s.status.any()
    assert np.isnan(s.first_token_at).all() and np.isnan(s.first_decode_at).all() and np.isnan(s.finish_at).all()
    assert np.isnan(s.last_token_at).all() and not s.service_s.any() and not s.swap_s.any()
    assert (list(s.waiting), s.running, s.swapped) == ([], [], [])


def test_a_view_says_which_replica_and_limits_it_shows_and_starts_at_time_and_step_zero() -> None:
    s = _state(2)
    view = View(s, block_size=32, max_model_len=2048, cost=make_cost(), drafter=None, replica=3)
    assert (view.replica, view.block_size, view.max_model_len) == (3, 32, 2048)
    assert (_view(s).replica, view.now, view.step_index, view.free_blocks, view.total_blocks) == (0, 0.0, 0, 0, 0)
    assert type(view.now) is float and view.draft_resident is False and view.draft_loading is False


def test_a_policy_cannot_write_into_the_engines_state_through_its_view() -> None:
    s = _state(2)
    view = _view(s)
    for name in ("arrival_s", "prompt_len", "tpot_slo_s", "ttft_slo_s", "num_generated", "num_accepted"):
        with pytest.raises(ValueError, match="read-only"):
            getattr(view, name)[0] = 1
    s.num_generated[0] = 5  # ... and it sees the engine's writes
    assert view.num_generated[0] == 5


@pytest.mark.parametrize(("blocks", "fits"), [(0, False), (1, True)])
def test_a_replica_whose_model_leaves_no_kv_block_refuses_to_start_naming_the_model_and_gpu(
        monkeypatch: pytest.MonkeyPatch, blocks: int, fits: bool) -> None:
    from repro.sim.kv import KvPool
    from repro.sim.replica import SimulationError
    from tests.conftest import make_engine

    monkeypatch.setattr(KvPool, "capacity", lambda self, draft_resident: blocks)
    if fits:  # one block is a replica that runs (a request at a time, a block of KV at most)
        assert [r.kv.total for r in make_engine(VLLM()).replicas] == [1]
        return
    with pytest.raises(SimulationError, match=r"^the model does not fit: llama2-7b \(tp=1\) on a100-80g leaves no KV "
                                         r"memory$"):
        make_engine(VLLM())


def test_a_queue_changed_with_no_name_given_is_every_queue_and_the_view_rebuilds_each() -> None:
    s = _state(3)
    view = _view(s)
    assert (list(view.waiting), list(view.running), list(view.swapped)) == ([], [], [])
    s.waiting.extend([2, 0])
    s.running.append(1)
    s.swapped.append(2)
    assert list(view.waiting) == []  # not said: the View keeps the queue it built
    before = dict(s.queue_versions)
    s.queues_changed("running")
    assert {k for k in before if s.queue_versions[k] != before[k]} == {"running"}
    s.queues_changed()
    assert all(s.queue_versions[k] != before[k] for k in before)
    assert (list(view.waiting), list(view.running), list(view.swapped)) == ([2, 0], [1], [2])


class _Runs:
    def on_step(self, event: object) -> None: ...

    def on_run(self, run: object) -> None: ...


class _Steps:
    def on_step(self, event: object) -> None: ...


@pytest.mark.parametrize(("kw", "policy_attrs", "fast"), [
    ({}, {}, True),  # the defaults: a policy that repeats its plan, simulated models, no observer
    ({"fast_forward": False}, {}, False),
    ({"arms": 3}, {}, False),  # counterfactual arms score single steps
    ({"backend": object()}, {}, False),  # a real backend executes every step
    ({"observers": [_Steps()]}, {}, False),  # an observer of single steps only
    ({"observers": [_Runs(), _Steps()]}, {}, False),
    ({"observers": [_Runs()]}, {}, True),
    ({}, {"repeats_plan": False}, False),
    ({}, {"repeats_plan": False, "repeats_some_plans": True}, True),
    ({}, {"promises_hold": False}, False),  # a subclass that inherited promises it did not declare
])
def test_the_fast_path_is_taken_only_where_every_part_of_the_replica_allows_it(
        kw: dict[str, object], policy_attrs: dict[str, bool], fast: bool) -> None:
    from repro.sim.replica import Replica
    from tests.conftest import FixedOracle

    policy = VLLM()
    for name, value in policy_attrs.items():
        setattr(policy, name, value)
    cost = make_cost()
    r = Replica(0, policy, _state(2), cost, FixedOracle(), block_size=16, max_model_len=4096, **kw)  # type: ignore[arg-type]
    assert r.fast_forward is fast
    assert r.backend is kw.get("backend") and r.checker is None  # the invariants are off by default
    assert r.proposers.resolve is not None and r.kv.total == cost.kv_capacity_blocks(
        draft_resident=r.draft_resident, block_size=16)


@pytest.mark.parametrize(("now", "arrived"), [(4.999, False), (5.0, True), (6.0, True)])
def test_a_draft_reload_completes_once_its_transfer_time_has_passed(now: float, arrived: bool) -> None:
    from repro.sim.replica import Replica
    from tests.conftest import FixedOracle

    r = Replica(0, VLLM(), _state(2), make_cost(), FixedOracle(), block_size=16, max_model_len=4096)
    r.draft_resident, r.draft_ready_at = False, 5.0
    r._draft_arrived(now)
    assert (r.draft_resident, r.draft_ready_at, r.view.draft_resident) == (
        (True, None, True) if arrived else (False, 5.0, r.view.draft_resident))


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize(("pids", "dids", "twice"), [
    ([], [], False), ([3], [], False), ([], [3], False), ([3], [3], True),  # one in each: still a duplicate
    ([0, 1], [], False), ([], [1, 1], True), ([1, 1], [], True), ([0, 2], [1], False), ([0], [1, 2, 0], True),
    ([2], [0, 1], False), ([0, 1, 2], [], False),
])
def test_a_request_twice_in_one_step_is_refused_on_both_kernel_paths(
        use_jit: Any, compiled: bool, pids: list[int], dids: list[int], twice: bool) -> None:
    from repro.sim.plan import PlanError, ids
    from repro.sim.replica import Replica
    from tests.conftest import FixedOracle

    use_jit(compiled)
    r = Replica(0, VLLM(), _state(4), make_cost(), FixedOracle(), block_size=16, max_model_len=4096)
    for _ in range(2):  # (the marks a first check leaves behind mislead no second one)
        if twice:
            with pytest.raises(PlanError, match=r"^a request appears twice in one step$"):
                r._check_unique(ids(pids), ids(dids))
        else:
            r._check_unique(ids(pids), ids(dids))
