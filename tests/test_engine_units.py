"""Engine and view details a whole run's numbers hide (each pins what a mutant survived, docs/testing.md): the
policies' per-request columns of a multi-replica run, each from the replica the request went to; the view's queues,
read-only and rebuilt only when the engine changed them; a length predictor's inputs."""

from __future__ import annotations

from collections.abc import Mapping

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
