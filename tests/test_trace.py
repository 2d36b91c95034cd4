"""Step tracing (repro/trace.py): an optional observer of the engine's steps; plan telemetry in the step table."""

from __future__ import annotations

import numpy as np
import pytest

from repro.plan import StepPlan
from repro.policy import Policy
from repro.simulate import steps_frame
from repro.state import View
from repro.trace import RECORD_COLUMNS, ROUND_COLUMNS, StepEvent
from systems.static_sd import StaticSD
from tests.conftest import FixedOracle, make_engine, make_requests, run


class Bandit(Policy):
    """Prefills, then decodes with k = 1 or 2 alternately, reporting the arm (and, on even steps, a score)."""

    uses_draft_model = True

    def schedule(self, view: View) -> StepPlan:
        if view.waiting.size:
            return StepPlan(prefill_ids=view.waiting, prefill_tokens=view.num_tokens(view.waiting), draft_sync=True)
        if not view.running.size:
            return StepPlan()
        arm = 1 + view.step_index % 2
        tel = {"arm": float(arm)} | ({"score": 0.5} if arm == 1 else {})
        return StepPlan(decode_ids=view.running, k=np.full(view.running.size, arm, dtype=np.int64), telemetry=tel)


class Collect:
    def __init__(self) -> None:
        self.events: list[StepEvent] = []

    def on_step(self, event: StepEvent) -> None:
        self.events.append(event)


def test_tracing_off_records_nothing_and_costs_no_observer() -> None:
    eng = make_engine(StaticSD(k=2), make_requests(3, output_len=5), oracle=FixedOracle(1))
    assert eng.tracer is None and all(r.observers == () for r in eng.replicas)
    out = eng.run()
    assert out.steps == [] and out.step_telemetry == [] and out.num_steps > 0


def test_the_trace_is_the_same_whoever_observes_beside_it() -> None:
    reqs = make_requests(3, output_len=5)
    seen = Collect()
    traced = run(StaticSD(k=2), reqs, oracle=FixedOracle(1), record_steps=True)
    both = run(StaticSD(k=2), reqs, oracle=FixedOracle(1), record_steps=True, observers=[seen])
    assert len(traced.steps) == traced.num_steps == len(seen.events)
    strip = [{k: v for k, v in vars_(r).items() if k != "schedule_wall_s"} for r in traced.steps]
    assert strip == [{k: v for k, v in vars_(r).items() if k != "schedule_wall_s"} for r in both.steps]
    ev = seen.events[1]
    assert ev.replica == 0 and ev.result.num_proposed.sum() == traced.steps[1].num_proposed
    assert list(steps_frame(traced).columns) == list(RECORD_COLUMNS)  # no telemetry: the columns as ever


def vars_(rec: object) -> dict[str, object]:
    return {name: getattr(rec, name) for name in RECORD_COLUMNS}


def test_plan_telemetry_becomes_columns_of_the_step_table() -> None:
    out = run(Bandit(), make_requests(2, output_len=6), oracle=FixedOracle(0), record_steps=True)
    frame = steps_frame(out)
    assert list(frame.columns) == [*RECORD_COLUMNS, "arm", "score"]
    assert np.isnan(frame["arm"].iloc[0])  # the prefill step's plan carried none
    dec = frame[frame["num_decode"] > 0]
    assert (dec["arm"] == dec["mean_k"]).all()  # the arm a step reports is the k it ran
    assert (dec["score"].isna() == (dec["arm"] == 2)).all()
    assert out.step_telemetry[:3] == [None, {"arm": 2.0}, {"arm": 1.0, "score": 0.5}]


def test_telemetry_may_not_overwrite_a_trace_column() -> None:
    class Clash(Bandit):
        def schedule(self, view: View) -> StepPlan:
            return StepPlan(prefill_ids=view.waiting, prefill_tokens=view.num_tokens(view.waiting),
                            telemetry={"latency_s": 1.0}) if view.waiting.size else StepPlan()

    with pytest.raises(ValueError, match="latency_s"):
        run(Clash(), make_requests(1, output_len=1), record_steps=True)
    run(Clash(), make_requests(1, output_len=1))  # without tracing, telemetry is not looked at


def test_the_round_trace_keeps_each_requests_running_totals() -> None:
    # One row per decoding request per step; its running totals end at the request's final counts, and the first
    # token (sampled by the prefill) is counted in num_generated. Chains of 2 accepting 1: 2 tokens a round.
    reqs = make_requests(3, prompt_len=[16, 24, 32], output_len=[7, 5, 9])
    out = run(StaticSD(k=2), reqs, oracle=FixedOracle(1), record_rounds=True)
    rounds = out.rounds
    assert rounds is not None and list(rounds.columns) == list(ROUND_COLUMNS)
    s = out.state
    last = rounds.groupby("rid").last()
    assert last["num_generated"].tolist() == s.num_generated.tolist() == [7, 5, 9]
    assert last["num_proposed"].tolist() == s.num_proposed.tolist()
    assert last["num_accepted"].tolist() == s.num_accepted.tolist()
    r0 = rounds[rounds["rid"] == 0]
    assert r0["num_generated"].tolist() == [3, 5, 7]  # 1 (prefill) + 2 per round
    assert r0["k"].tolist() == [2, 2, 2] and r0["accepted"].tolist() == [1, 1, 1]
    assert (r0["num_proposed"].diff().dropna() == 2).all() and r0["end_at"].is_monotonic_increasing
    assert run(StaticSD(k=2), reqs, oracle=FixedOracle(1)).rounds is None  # off by default
