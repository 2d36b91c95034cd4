"""Step tracing (repro/sim/trace.py): an optional observer of the engine's steps; plan telemetry in the step table."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from repro.experiments.simulate import steps_frame
from repro.oracle.token_oracle import TokenOracle
from repro.sim.plan import StepPlan
from repro.sim.policy import Policy
from repro.sim.state import View
from repro.sim.trace import RECORD_COLUMNS, ROUND_COLUMNS, StepEvent
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


# --- counterfactual arms: Nightjar's regret (Eq. 2) -------------------------------------------------------------------

def test_the_played_arm_scores_what_the_step_realized_and_the_others_are_counterfactual() -> None:
    # Bandit alternates k = 1, 2 with every chain accepting 1 token: each step's arm_reward_<k> is its realized
    # goodput; k = 0 emits 1 token per request in a shorter step, k = 3 the same 2 tokens in a longer one
    reqs = make_requests(3, output_len=40)
    eng = make_engine(Bandit(), reqs, oracle=FixedOracle(1), record_steps=True, counterfactual_arms=3)
    frame = steps_frame(eng.run())
    dec = frame[frame["num_decode"] == 3]
    full = dec[dec["num_emitted"] == 6]  # no request hit its end (emitted is capped there)
    for _, row in full.iterrows():
        assert row[f"arm_reward_{int(row['arm'])}"] == pytest.approx(row["reward"])
        assert row["reward"] == pytest.approx(row["num_emitted"] / row["latency_s"])
        assert row["arm_reward_0"] < row["arm_reward_1"]  # 3 tokens vs 6 in a step not twice as long
        assert row["arm_reward_3"] < row["arm_reward_2"]  # the same 6 tokens, a longer draft and verify
        assert row["best_arm"] in (1.0, 2.0) and row["best_reward"] == max(row[f"arm_reward_{g}"] for g in range(4))
    regret = (dec["best_reward"] - dec["reward"]).cumsum().to_numpy()
    assert np.allclose(dec["cum_regret"].to_numpy(), regret)
    assert frame.loc[frame["num_decode"] == 0, "best_reward"].isna().all()  # prefill steps are not arms


def test_without_a_resident_draft_only_the_plain_step_is_an_arm() -> None:
    class Plain(Bandit):
        uses_draft_model = False

        def schedule(self, view: View) -> StepPlan:
            plan = super().schedule(view)
            return StepPlan(prefill_ids=plan.prefill_ids, prefill_tokens=plan.prefill_tokens,
                            decode_ids=plan.decode_ids)

    frame = steps_frame(make_engine(Plain(), make_requests(2, output_len=8), oracle=FixedOracle(1),
                                    record_steps=True, counterfactual_arms=2).run())
    dec = frame[frame["num_decode"] > 0]
    assert dec["arm_reward_1"].isna().all() and dec["arm_reward_2"].isna().all()
    assert np.allclose(dec["cum_regret"], 0.0)


def test_fixed_arm_regret_compares_with_the_best_arm_of_each_batch_size_in_hindsight() -> None:

    from repro.sim.trace import fixed_arm_regret

    frame = pd.DataFrame({
        "replica": [0, 0, 0, 0, 0],
        "num_decode": [4, 4, 8, 0, 8],
        "arm_reward_0": [10.0, 10.0, 30.0, np.nan, 30.0],
        "arm_reward_1": [20.0, 5.0, 10.0, np.nan, 50.0],  # batch 4: arm 0 totals 20 < 25; batch 8: arm 1 60 = 60
        "best_reward": [20.0, 10.0, 30.0, np.nan, 50.0],
        "reward": [10.0, 10.0, 10.0, np.nan, 50.0],
    })
    # batch 4's best fixed arm is 1 (25 > 20): losses 20-10, 5-10; batch 8's a tie → arm 0 (the first): 30-10, 30-50
    out = fixed_arm_regret(frame)
    assert out[[0, 1, 2, 4]].tolist() == pytest.approx([10.0, 5.0, 25.0, 5.0]) and np.isnan(out[3])


class Pinned(Policy):
    """Prefills everything, then decodes every running request with a chain of 1 (``uneven``: 3 for even request
    ids, none for odd ones) and 1 ms of host work per step (keeping the draft's cache in step on even steps), except
    at step ``at``, which plays a chain of ``k_at`` for every request."""

    uses_draft_model = True

    def __init__(self, at: int = -1, k_at: int = 1, proposer: str = "draft", uneven: bool = False) -> None:
        super().__init__()
        self.at, self.k_at, self.proposer, self.uneven = at, k_at, proposer, uneven

    def schedule(self, view: View) -> StepPlan:
        if view.waiting.size:
            return StepPlan(prefill_ids=view.waiting, prefill_tokens=view.num_tokens(view.waiting), draft_sync=True)
        if not view.running.size:
            return StepPlan()
        if view.step_index == self.at:
            k = np.full(view.running.size, self.k_at, dtype=np.int64)
        elif self.uneven:
            k = np.where(view.running % 2 == 0, 3, 0).astype(np.int64)
        else:
            k = np.ones(view.running.size, dtype=np.int64)
        return StepPlan(decode_ids=view.running, k=k, host_s=1e-3, draft_sync=view.step_index % 2 == 0,
                        proposer=self.proposer)


def _arm_run(policy: Policy, prompts: list[int], kv_blocks: int | None, engine: str | None = None,
             arms: int | None = None, steps: int | None = None) -> pd.DataFrame:
    """The step table of three requests (output lengths 3, 6, 9: some end inside a chain) on a ShareGPT oracle
    (EAGLE's stream too), with ``arms`` counterfactual arms, stopped after ``steps`` steps."""
    sharegpt = np.array(["sharegpt"] * 3, dtype=object)
    oracle = TokenOracle(7, sharegpt, {"sharegpt": 0.6}, eagle_accept_mean={"sharegpt": 0.8})
    return steps_frame(make_engine(policy, make_requests(3, prompt_len=prompts, output_len=[3, 6, 9]), oracle=oracle,
                                   kv_blocks=kv_blocks, engine=engine, record_steps=True, counterfactual_arms=arms,
                                   max_steps=steps).run())


@pytest.mark.parametrize(("kv_blocks", "engine", "proposer"), [
    (None, None, "draft"), (6, None, "draft"), (7, None, "draft"),
    (None, "vllm_v0", "draft"),  # batch expansion: host work around the verify pass
    (6, "vllm_v1", "eagle"),  # an EAGLE head, on its own oracle stream
], ids=["roomy", "tight 6", "tight 7", "vllm v0", "vllm v1 eagle"])
def test_each_arm_reward_is_what_that_chain_length_would_have_realized(kv_blocks: int | None, engine: str | None,
                                                                        proposer: str) -> None:
    # the counterfactual arm γ of step t is the goodput a run that plays γ at step t realizes there: the same
    # batch, host work, text (the oracle's common random numbers) and output caps; NaN exactly where that step
    # would over-commit the KV pool. Output lengths 3..9 make some requests end inside a chain.
    from repro.sim.plan import PlanError

    def frame(policy: Policy, arms: int | None = None, steps: int | None = None) -> pd.DataFrame:
        return _arm_run(policy, [16, 17, 30], kv_blocks, engine, arms, steps)

    def pinned(at: int = -1, k_at: int = 1) -> Pinned:
        return Pinned(at, k_at, proposer)

    base = frame(pinned(), arms=3)
    assert [c for c in base.columns if c.startswith("arm_reward_")] == [f"arm_reward_{g}" for g in range(4)]
    steps = base.index[base["num_decode"] > 0].tolist()
    assert len(steps) >= 3
    played = 0
    for t in steps:
        for g in range(4):
            want = base.loc[t, f"arm_reward_{g}"]
            if np.isnan(want):
                with pytest.raises(PlanError):
                    frame(pinned(at=t, k_at=g), steps=t + 1)
                continue
            alt = frame(pinned(at=t, k_at=g), steps=t + 1).loc[t]
            assert alt["num_decode"] == base.loc[t, "num_decode"]
            assert want == pytest.approx(alt["num_emitted"] / alt["latency_s"], rel=1e-12), (t, g)
            played += 1
    assert played > len(steps) * 2
    if kv_blocks is not None:
        assert base[[f"arm_reward_{g}" for g in range(4)]].isna().any().any()  # the pool decides some arm
    plain = frame(pinned(), arms=0)  # no chain lengths but the plain step
    assert [c for c in plain.columns if c.startswith("arm_reward_")] == ["arm_reward_0"]


def test_an_arm_fits_where_the_played_plan_reserved_more_for_some_requests() -> None:
    # the played plan gives even requests a chain of 3 and odd ones none, in a pool of 6 blocks of 16: at step 1
    # request 0 (context 14) reserved 14 + 4 slots (2 blocks), request 1 (15) 16 (1 block), request 2 (30) 34
    # (3 blocks), the whole pool. γ = 1 needs 16, 17 and 32 slots, 1 + 2 + 2 blocks: it fits, though request 1
    # needs one block more than it holds
    base = _arm_run(Pinned(uneven=True), [14, 15, 30], kv_blocks=6, arms=3)
    alt = _arm_run(Pinned(at=1, k_at=1, uneven=True), [14, 15, 30], kv_blocks=6, steps=2).loc[1]
    assert base.loc[1, "arm_reward_1"] == pytest.approx(alt["num_emitted"] / alt["latency_s"], rel=1e-12)


def _event(replica: int, *, prefill: int, completes: int, telemetry: dict[str, float] | None = None) -> StepEvent:
    """A hand-built step: 3 decoding requests (k = 1, 2, 4; emitted 2, 3, 1; accepted 1, 2, 0; matched 1, 3, 2)
    beside ``prefill`` chunks of which ``completes`` finish their prompt, every time its own value."""
    from repro.cost.step import DecodeBatch, PrefillBatch
    from repro.sim.plan import StepResult

    ids = np.array([4, 5, 6])
    pre = np.arange(10, 10 + prefill)
    res = StepResult(start_at=2.0, end_at=2.5, decode_ids=ids, num_proposed=np.array([1, 2, 4]),
                     num_accepted=np.array([1, 2, 0]), num_emitted=np.array([2, 3, 1]), prefill_ids=pre,
                     finished_ids=np.array([6]), draft_s=0.125, verify_s=0.25, memory_s=0.0625,
                     num_batched_tokens=77, send_s=0.03125)
    chunks = PrefillBatch(pre, np.full(prefill, 8), 0.0, np.arange(prefill) < completes)
    dec = DecodeBatch(ids, np.array([3, 3, 3]), np.array([40, 41, 42]), np.array([1, 2, 4]), np.ones(3, dtype=bool),
                      {}, None)
    plan = StepPlan(decode_ids=ids, k=dec.k, telemetry=telemetry)
    return StepEvent(replica, plan, res, chunks, dec, np.array([1, 3, 2]), 0.015625, 0.001)


@pytest.mark.parametrize("compiled", [True, False], ids=["kernels", "numpy"])
def test_a_step_record_holds_each_quantity_of_its_step(compiled: bool, use_jit: object) -> None:
    from repro.sim.trace import StepTracer
    from repro.sim.trace import steps_frame as table

    use_jit(compiled)  # type: ignore[operator]
    tracer = StepTracer()
    tracer.on_step(_event(1, prefill=2, completes=1, telemetry={"arm": 2.0}))  # replica 1 first
    tracer.on_step(_event(0, prefill=0, completes=0))
    rec1 = tracer.records[1]  # replica 0's steps, then replica 1's
    assert (rec1.start_at, rec1.latency_s, rec1.num_seqs, rec1.num_decode, rec1.num_prefill) == (2.0, 0.5, 5, 3, 2)
    assert rec1.num_batched_tokens == 77
    assert rec1.num_emitted == 2 + 3 + 1 + 1  # a completed prompt's first token counts
    assert (rec1.num_proposed, rec1.num_accepted, rec1.num_matched) == (7, 3, 6)
    assert (rec1.draft_s, rec1.verify_s, rec1.overhead_s, rec1.memory_s, rec1.send_s) == (
        0.125, 0.25, 0.015625, 0.0625, 0.03125)
    assert (rec1.mean_k, rec1.replica, rec1.schedule_wall_s) == (7 / 3, 1, 0.001)
    rec0 = tracer.records[0]
    assert (rec0.replica, rec0.num_prefill, rec0.num_seqs, rec0.num_emitted) == (0, 0, 3, 6)
    assert tracer.telemetry == [None, {"arm": 2.0}]
    frame = table(tracer.records, tracer.telemetry)
    assert frame["replica"].tolist() == [0, 1]
    assert frame["arm"].isna().tolist() == [True, False] and frame.loc[1, "arm"] == 2.0
    assert list(frame.columns) == [*RECORD_COLUMNS, "arm"]
    assert list(table(tracer.records, [None, None]).columns) == list(RECORD_COLUMNS)
    with pytest.raises(ValueError, match=r"\['num_seqs'\] would overwrite step trace columns"):
        tracer.on_step(_event(0, prefill=0, completes=0, telemetry={"num_seqs": 1.0}))


def test_a_fast_forwarded_run_records_each_step_as_a_step_would() -> None:
    from repro.sim.trace import StepRun, StepTracer

    plan = StepPlan(decode_ids=np.array([1, 2]), k=np.array([2, 2]), telemetry={"arm": 1.0})
    run = StepRun(3, plan, start_at=np.array([1.0, 1.5]), end_at=np.array([1.5, 2.25]),
                  draft_s=np.array([0.1, 0.2]), verify_s=np.array([0.3, 0.4]), num_emitted=np.array([4, 5]),
                  num_proposed=np.array([4, 4]), num_accepted=np.array([2, 3]), num_matched=np.array([3, 4]),
                  num_decode=2, num_batched_tokens=6, overhead_s=0.05, mean_k=2.0, schedule_wall_s=0.002)
    tracer = StepTracer()
    tracer.on_run(run)
    got = [(r.start_at, r.latency_s, r.num_seqs, r.num_decode, r.num_prefill, r.num_batched_tokens, r.num_emitted,
            r.num_proposed, r.num_accepted, r.num_matched, r.draft_s, r.verify_s, r.overhead_s, r.memory_s, r.send_s,
            r.mean_k, r.replica, r.schedule_wall_s) for r in tracer.records]
    assert got == [(1.0, 0.5, 2, 2, 0, 6, 4, 4, 2, 3, 0.1, 0.3, 0.05, 0.0, 0.0, 2.0, 3, 0.002),
                   (1.5, 0.75, 2, 2, 0, 6, 5, 4, 3, 4, 0.2, 0.4, 0.05, 0.0, 0.0, 2.0, 3, 0.002)]
    assert tracer.telemetry == [{"arm": 1.0}, {"arm": 1.0}]


def test_the_round_trace_is_typed_and_empty_without_decodes() -> None:
    from repro.sim.trace import RoundTracer

    tracer = RoundTracer()
    empty = tracer.frame()
    assert list(empty.columns) == list(ROUND_COLUMNS) and len(empty) == 0
    event = _event(0, prefill=0, completes=0)
    tracer.on_step(event)  # no view: nothing to read the running totals from
    assert len(tracer.frame()) == 0
    frame = run(StaticSD(k=2), make_requests(2, output_len=5), oracle=FixedOracle(1), record_rounds=True).rounds
    assert frame is not None and len(frame) > 0
    assert {c: str(t) for c, t in frame.dtypes.items()} == {c: "float64" if c == "end_at" else "int64"
                                                           for c in ROUND_COLUMNS}


def test_a_step_of_no_time_realizes_nothing_and_regret_counts_from_each_replicas_start() -> None:
    from repro.sim.trace import StepTracer

    tracer = StepTracer()
    zero = _event(0, prefill=0, completes=0)
    zero = StepEvent(zero.replica, zero.plan, dataclasses.replace(zero.result, end_at=zero.result.start_at),
                     zero.prefill, zero.decode, zero.num_matched, zero.overhead_s, zero.schedule_wall_s,
                     arm_rewards=np.array([4.0, 6.0]))
    tracer.on_step(zero)
    tracer.on_step(dataclasses.replace(zero, replica=1))  # another replica's regret starts at 0
    tracer.on_step(zero)
    tel = tracer.telemetry
    assert [t["reward"] for t in tel if t] == [0.0, 0.0, 0.0]
    assert [t["cum_regret"] for t in tel if t] == [6.0, 12.0, 6.0]  # replica 0's, then 1's


def test_fixed_arm_regret_ties_and_gaps() -> None:
    # eleven arms, listed out of order: arms 2 and 10 tie on their total (the first by γ wins, 2); a step where the
    # best fixed arm could not run (NaN) realizes nothing against it
    from repro.sim.trace import fixed_arm_regret

    arms = {f"arm_reward_{g}": [0.0, 0.0] for g in range(11)}
    arms["arm_reward_2"], arms["arm_reward_10"] = [5.0, 3.0], [1.0, 7.0]
    cols = dict(sorted(arms.items(), key=lambda kv: kv[0]))  # arm_reward_10 before arm_reward_2
    frame = pd.DataFrame({"replica": [0, 0], "num_decode": [4, 4], **cols, "best_reward": [5.0, 7.0],
                          "reward": [1.0, 2.0]})
    assert fixed_arm_regret(frame).tolist() == [4.0, 5.0]  # arm 2: 5 - 1, then 3 - 2
    frame.loc[1, "arm_reward_2"] = np.nan
    frame.loc[1, "arm_reward_10"] = 2.0  # arm 2 still totals 5 (its NaN counts 0) > arm 10's 3
    assert fixed_arm_regret(frame).tolist() == [4.0, 2.0]  # then 0 - 2
    unscored = pd.DataFrame({"replica": [0], "num_decode": [4], "best_reward": [3.0], "reward": [1.0]})
    assert np.isnan(fixed_arm_regret(unscored)).all()  # no arm columns: nothing to compare with


def test_a_trace_without_telemetry_is_the_record_columns_and_regret_gets_its_fixed_arm_comparator() -> None:
    from repro.sim.trace import fixed_arm_regret
    from repro.sim.trace import steps_frame as table

    out = run(StaticSD(k=2), make_requests(2, output_len=5), oracle=FixedOracle(1), record_steps=True)
    n = len(out.steps)
    for telemetry in (None, [], [None] * n):
        assert list(table(out.steps, telemetry).columns) == list(RECORD_COLUMNS)
    told = [{"cum_regret": float(i), "best_reward": 2.0, "reward": 1.0, "arm_reward_1": 1.0, "arm_reward_2": 2.0}
            for i in range(n)]
    frame = table(out.steps, told)
    assert list(frame.columns) == [*RECORD_COLUMNS, *told[0], "cum_regret_fixed"]
    assert frame["cum_regret"].dtype == np.float64
    want = fixed_arm_regret(frame.drop(columns="cum_regret_fixed"))
    assert frame["cum_regret_fixed"].dtype == np.float64 and (frame["cum_regret_fixed"].to_numpy() == want).all()
    assert want[-1] == n  # arm 2 each step in hindsight: 2 - 1 a step
