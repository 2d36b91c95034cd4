"""The engine's fast path (``repro.sim.fastforward``): a stretch of steps that a ``repeats_plan`` policy would plan
again, computed at once, leaves exactly the state that running the steps one by one leaves.

Every piece it is built from is checked against the step-by-step function it replaces (the cost of a pass, the
target's verification, the drafting, the oracle's chain scores), then whole runs are compared bit for bit with
fast-forward on and off over a table of systems and situations that end runs in each of their ways (arrivals,
finishes, KV pressure and preemption, a simulated-time limit, a step budget, several replicas, both scorers, a draft
model and an EAGLE head)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from repro.cost.step import DecodeBatch, PrefillBatch, verify_pass, verify_run_s, verify_runs_s
from repro.experiments.simulate import build, compose
from repro.oracle import TokenOracle
from repro.sim import fastforward
from repro.sim.engine import SimOutput
from repro.sim.plan import StepPlan
from repro.sim.policy import whole_prompts_that_fit
from repro.sim.proposers import colocated
from repro.sim.state import RequestState
from repro.sim.stepcost import StepCoster, decode_runs_s, draft_runs_s
from tests.conftest import make_cost

# the invariants hold whatever the workload's source: pinned to the embedded statistics (conftest.no_data)
pytestmark = pytest.mark.usefixtures("no_data")

STATE = ("status", "num_generated", "num_computed", "num_draft_computed", "kv_blocks", "first_token_at",
         "first_decode_at", "finish_at", "last_token_at", "num_proposed", "num_accepted", "num_matched",
         "num_decode_steps", "num_spec_steps", "num_preemptions", "service_s", "swap_s")


# --- the pieces ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("hardware", "model", "draft", "tp", "engine"), [
    ("a100-80g", "llama2-7b", "llama-160m", 1, "vllm_v0"),
    ("h100-80g", "llama2-70b", "llama-160m", 4, "vllm_v1"),
    ("l40s", "llama3-8b", "llama3.2-1b", 1, "flexflow"),
])
@pytest.mark.parametrize("which", ["target", "draft", "eagle"])
@pytest.mark.parametrize("decode_only", [True, False])
def test_forward_s_many_equals_forward_s_bit_for_bit(hardware: str, model: str, draft: str, tp: int, engine: str,
                                                      which: Any, decode_only: bool) -> None:
    cost = make_cost(hardware, model, draft, tp=tp, engine=engine)
    rng = np.random.default_rng(7)
    kv = np.concatenate([[0.0, 1.0], rng.integers(1, 2_000_000, 40).astype(np.float64)])
    qp = np.concatenate([[0.0, 5.0], rng.integers(1, 9_000_000, 40).astype(np.float64)])
    for n, s, head in ((1, 1, -1), (37, 37, 37), (512, 64, 64)):
        many = cost.forward_s_many(n, s, kv, qp, head, decode_only, which)
        one = [cost.forward_s(n, s, x, 0.0, head, decode_only, q, which) for x, q in zip(kv, qp, strict=True)]
        assert many.tolist() == one


@pytest.mark.parametrize(("hardware", "model", "draft", "tp", "engine"), [
    ("a100-80g", "llama2-7b", "llama-160m", 1, "vllm_v0"),
    ("h100-80g", "llama2-70b", "llama-160m", 4, "vllm_v1"),
    ("l40s", "llama3-8b", "llama3.2-1b", 1, "flexflow"),
])
@pytest.mark.parametrize("which", ["target", "draft", "eagle"])
def test_draft_steps_s_equals_its_forward_s_passes_bit_for_bit(hardware: str, model: str, draft: str, tp: int,
                                                               engine: str, which: Any) -> None:
    """A draft pass's steps 2..D of n chains or beams of width w (StepCoster._draft_pass, AdaServe's estimate): the
    fixed parts looked up once, the sum the loop of forward_s it replaces, in its order."""
    cost = make_cost(hardware, model, draft, tp=tp, engine=engine)
    rng = np.random.default_rng(3)
    for n, w, last, start in ((1, 1, 1, 0.0), (1, 1, 2, 0.25), (7, 1, 8, 1e-3), (64, 1, 5, 0.0), (300, 1, 12, 2e-2),
                              (5, 4, 8, 0.0), (30, 16, 8, 3e-3), (1, 16, 2, 0.0)):
        csum = float(rng.integers(0, 4_000 * n))
        loop = start
        for j in range(2, last + 1):
            loop += cost.forward_s(n * w, n, kv_read_tokens=csum + j * n, decode_only=True, which=which)
        assert cost.draft_steps_s(start, n * w, n, csum, last, which) == loop


@pytest.mark.parametrize("engine", ["vllm_v0", "vllm_v1", "turbospec_mq", "flexflow"])
@pytest.mark.parametrize("k", [0, 1, 3, 7])
@pytest.mark.parametrize("n", [1, 9, 64, 300])
@pytest.mark.parametrize("layout", ["C", "F", "columns picked"])
def test_verify_run_equals_the_steps_verification(engine: str, k: int, n: int, layout: str) -> None:
    cost = make_cost(engine=engine)
    rng = np.random.default_rng(n + 10 * k)
    ctxs = rng.integers(1, 4000, (6, n)).astype(np.int64)
    if layout == "F":
        ctxs = np.asfortranarray(ctxs)
    elif layout == "columns picked":  # a run's stretch after a finish: the columns of the requests still in it
        wide = rng.integers(1, 4000, (6, n + 3)).astype(np.int64)
        keep = np.ones(n + 3, dtype=bool)
        keep[rng.choice(n + 3, 3, replace=False)] = False
        ctxs = wide[:, keep]
    run, overhead = verify_run_s(cost, k, ctxs)
    none = PrefillBatch(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0.0, np.zeros(0, dtype=bool))
    for i, ctx in enumerate(ctxs):
        dec = DecodeBatch(np.arange(n), ctx, ctx, np.full(n, k, dtype=np.int64), np.full(n, k > 0), {}, None)
        shape, host = verify_pass(cost.engine, none, dec)
        fwd = cost.forward(shape)
        assert run[i] == fwd.total_s + host
        assert overhead == fwd.overhead_s + host  # what the step trace records as the step's fixed costs


@pytest.mark.parametrize(("proposer", "k", "remote"), [("pld", 2, False), ("draft", 0, False), ("draft", 2, True)],
                         ids=["prompt lookup", "k = 0", "remote"])
def test_a_stretch_of_drafting_is_only_a_co_located_models_chain(proposer: str, k: int, remote: bool) -> None:
    from repro.sim.proposers import RemoteDraftServer

    cost = make_cost(engine="vllm_v0")
    prop = RemoteDraftServer(make_cost("l4")) if remote else colocated(cost)[proposer]
    name = "remote" if remote else proposer
    with pytest.raises(ValueError, match=rf"^draft_run_s: proposer '{name}' with k={k} does not draft a model chain "
                                         "here$"):
        draft_runs_s(prop, k, [4], np.full(3, 400.0), [3])


@pytest.mark.parametrize("proposer", ["draft", "eagle"])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_draft_run_equals_the_steps_drafting(proposer: str, k: int) -> None:
    cost = make_cost(engine="vllm_v0")
    n = 12
    state = RequestState(np.zeros(n), np.full(n, 100), np.full(n, 100), np.full(n, np.inf), np.full(n, np.inf),
                         np.zeros(n, dtype=np.int64))
    coster, prop = StepCoster(state, cost), colocated(cost)[proposer]
    rng = np.random.default_rng(k)
    ctxs = rng.integers(1, 3000, (5, n)).astype(np.int64)
    run = coster.draft_run_s(prop, n, k, ctxs.sum(axis=1).astype(np.float64))
    ids = np.arange(n)
    plan = StepPlan(decode_ids=ids, k=np.full(n, k), proposer=proposer, draft_sync=True)
    for i, ctx in enumerate(ctxs):
        state.num_draft_computed[:] = ctx  # the draft's cache holds every computed token: no catch-up
        step = coster.draft_s(prop, plan, ids, ctx, np.full(n, k), np.ones(n, dtype=bool), {},
                              np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), draft_resident=True)
        assert run[i] == step


@pytest.mark.parametrize("engine", ["vllm_v0", "vllm_v1", "flexflow"])
@pytest.mark.parametrize(("proposer", "sync"), [("draft", True), ("draft", False), ("eagle", False)])
def test_prompts_priced_in_a_run_equal_the_steps_prefill(engine: str, proposer: str, sync: bool) -> None:
    """The prefill step a run prices for the requests it admits (``StepCoster.prompts_s``) charges what the step
    by step path charges: ``draft_s`` and the target pass of ``verify_pass``."""
    cost = make_cost(engine=engine)
    n = 3
    state = RequestState(np.zeros(n), np.full(n, 100), np.full(n, 100), np.full(n, np.inf), np.full(n, np.inf),
                         np.zeros(n, dtype=np.int64))
    coster, prop = StepCoster(state, cost), colocated(cost)[proposer]
    none = DecodeBatch(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                       np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), {}, None)
    for tokens in (np.array([517]), np.array([1, 2048, 33])[:n]):
        pids = np.arange(tokens.size)
        plan = StepPlan(prefill_ids=pids, prefill_tokens=tokens, proposer=proposer, draft_sync=sync)
        pre = PrefillBatch(pids, tokens, float((tokens * (0 + (tokens + 1) / 2.0)).sum()),
                           np.ones(tokens.size, dtype=bool), 0.0)
        draft = coster.draft_s(prop, plan, none.ids, none.ctx, none.k, none.drafted, {}, pids, tokens,
                               draft_resident=True) if sync else 0.0
        shape, host = verify_pass(cost.engine, pre, none)
        assert coster.prompts_s(prop, plan, pids, tokens, draft_resident=True) == (
            draft, cost.forward(shape).total_s + host)


@pytest.mark.parametrize("engine", ["vllm_v0", "vllm_v1", "turbospec_mq"])
@pytest.mark.parametrize("proposer", ["draft", "eagle"])
@pytest.mark.parametrize("k", [1, 3])
def test_stretches_priced_together_equal_each_priced_alone(engine: str, proposer: str, k: int) -> None:
    """A segment of a run (stretches over 20, 19, 1 and 7 requests) priced in one evaluation of the pass formula,
    both models' rows at once (``decode_runs_s``), gives each stretch's ``draft_run_s`` and ``verify_run_s``."""
    cost = make_cost(engine=engine)
    prop = colocated(cost)[proposer]
    rng = np.random.default_rng(k)
    blocks = [rng.integers(1, 4000, (steps, n)).astype(np.int64) for steps, n in ((3, 20), (1, 19), (4, 1), (2, 7))]
    for some in (blocks[:1], blocks):
        csum = np.concatenate([b.sum(axis=1) for b in some]).astype(np.float64)
        draft, verify, overheads = decode_runs_s(cost, prop, k, some, csum)
        alone = [verify_run_s(cost, k, b) for b in some]
        assert verify.tolist() == [x for v, _ in alone for x in v.tolist()]
        assert overheads == [o for _, o in alone]
        assert draft.tolist() == [x for b in some for x in draft_runs_s(prop, k, [b.shape[1]], b.sum(axis=1).astype(
            np.float64), [b.shape[0]]).tolist()]
        assert verify_runs_s(cost, k, some)[0].tolist() == verify.tolist()


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize(("first", "ends"), [(900, None), (250, None), (250, 40), (5_000, 40)],
                         ids=["across chunks", "within a chunk", "within a chunk, ends", "far chunks, ends"])
def test_chain_run_equals_successive_chain_scores(k: int, first: int, ends: int | None) -> None:
    """Where every request's positions lie in one chunk, the run looks its chunk up once per request; across chunk
    boundaries (512) per position. With an ``end``, the steps that read only positions before it are exact."""
    n, steps = 30, 40
    dataset = np.array(["sharegpt"] * n, dtype=object)
    run_oracle, step_oracle = (TokenOracle(3, dataset, {"sharegpt": 0.7}) for _ in range(2))
    rids = np.arange(n)
    pos = np.random.default_rng(1).integers(first - 250 if first > 900 else 0, first, n)
    end = pos + (10_000 if ends is None else ends)
    accepted, matched = run_oracle.chain_run(rids, pos, k, steps, end=end)
    at = pos.copy()
    for j in range(steps):
        proposed, acc, mat = step_oracle.score_chain(rids, at, np.full(n, k))
        assert (proposed == k).all()
        exact = at + k < end  # the step reads positions at..at + k
        assert exact.any() or ends is not None
        assert accepted[j][exact].tolist() == acc[exact].tolist() and matched[j][exact].tolist() == mat[exact].tolist()
        at += acc + 1


def test_chain_run_reads_nothing_past_the_end_it_is_given() -> None:
    dataset = np.array(["sharegpt"] * 4, dtype=object)
    oracle = TokenOracle(3, dataset, {"sharegpt": 0.7})
    oracle.chain_run(np.arange(4), np.zeros(4, dtype=np.int64), 3, 400, end=np.full(4, 100))
    assert oracle.num_live_chunks == 4  # positions 0..99: one chunk each, not the 1,600 positions of the run


def test_prompt_lookup_has_no_chain_run() -> None:
    oracle = TokenOracle(3, np.array(["sonnet"], dtype=object), {"sonnet": 0.7},
                         pld={"default": {"match": 0.5, "accept": 0.8}})
    assert oracle.chain_run(np.arange(1), np.zeros(1, dtype=np.int64), 3, 5, "pld") is None


# --- whole runs -------------------------------------------------------------------------------------------------

def _run(overrides: list[str], fast_forward: bool, onward: bool = True,
         through: bool = True) -> tuple[SimOutput, int]:
    """The run and how often its policies planned; ``onward=False``: runs stop at finishes; ``through=False``: runs
    stop before arrivals."""
    built = build(compose(overrides))
    schedules = 0
    for rep in built.engine.replicas:
        rep.fast_forward = rep.fast_forward and fast_forward
        pol, orig = rep.policy, rep.policy.schedule
        pol.keeps_plan_after_finish = pol.keeps_plan_after_finish and onward
        if not through:
            pol.admits = None

        def counted(view: Any, orig: Any = orig) -> StepPlan:
            nonlocal schedules
            schedules += 1
            return orig(view)

        pol.schedule = counted  # type: ignore[method-assign]
    return built.engine.run(), schedules


WORKLOAD = ["workload=sharegpt", "num_requests=60", "seed=1"]
PROFILES = Path(__file__).resolve().parents[1] / "profiles"
SCENARIOS = {
    "vllm": ["system=vllm", "rps=3", *WORKLOAD],
    "sarathi chunked prefill": ["system=sarathi", "rps=4", *WORKLOAD],
    "static k=3, draft model, batch expansion": ["system=static_sd_k3", "rps=4", *WORKLOAD],
    "static k=3 with the step trace": ["system=static_sd_k3", "rps=4", "engine.record_steps=true", *WORKLOAD],
    "vllm with the step trace, a time limit": ["system=vllm", "rps=3", "engine.record_steps=true",
                                               "max_sim_time_s=12.5", *WORKLOAD],
    "static k=5, multi-query scorer": ["system=static_sd_k5", "engine=vllm_v1", "rps=2", *WORKLOAD],
    "static k=3, EAGLE head": ["system=static_sd_eagle_k3", "model=llama3-8b", "hardware=h100-80g", "rps=4",
                               *WORKLOAD],
    "static k=1, offline (every request at t=0)": ["system=static_sd_k1", "rps=1000", *WORKLOAD],
    "vllm, KV pressure (recompute preemption)": ["system=vllm", "rps=8", "engine.gpu_memory_utilization=0.22",
                                                  *WORKLOAD],
    "static k=3, KV pressure": ["system=static_sd_k3", "rps=8", "engine.gpu_memory_utilization=0.23", *WORKLOAD],
    "vllm, a simulated-time limit": ["system=vllm", "rps=3", "max_sim_time_s=9.5", *WORKLOAD],
    "static k=3, a step budget": ["system=static_sd_k3", "rps=3", "max_steps=333", *WORKLOAD],
    "incr_dec behind SepPipe's three replicas": ["system=seppipe", "workload=adaserve_mix", "rps=2",
                                                 "num_requests=60", "seed=1"],
    "fcfs at batch 1 (LAPS-SD's request-level scheduler)": ["system=fcfs", "model=llama2-7b", "model@draft=llama-68m",
                                                           "hardware=l20", "workload=mbpp", "rps=2", "num_requests=30"],
    "lp_sjf, two at a time": ["system=lp_sjf", "system.max_batch=2", "model@draft=llama-68m", "workload=mbpp",
                              "rps=3", "num_requests=30"],
    "prompt lookup (never fast-forwarded)": ["system=static_sd_pld_k3", "workload=sonnet", "rps=2",
                                             "num_requests=30"],
    "static k=3 switching off by batch size (runs stop at finishes)": [
        "system=static_sd_eagle_k3", "system.disable_by_batch_size=4", "model=llama3-8b", "hardware=h100-80g",
        "rps=1", *WORKLOAD],
    "vllm, at most 4 running (admissions refused inside runs)": ["system=vllm", "system.max_num_seqs=4", "rps=3",
                                                                 *WORKLOAD],
    "static k=3, a 30 % KV watermark (admissions refused inside runs)": [
        "system=static_sd_k3", "system.watermark=0.3", "rps=8", "engine.gpu_memory_utilization=0.23", *WORKLOAD],
    "static k=3, bursts (arrivals at one boundary, arrivals during a prefill)": ["system=static_sd_k3", "rps=40",
                                                                                  *WORKLOAD],
    "vLLM V1 scheduler, k=3 draft model, async, CUDA-graph padding": [
        "system=vllm_v1", "system.k=3", "engine.async_scheduling=true", "rps=4", *WORKLOAD],
    "vLLM V1 scheduler, k=2 EAGLE head, KV pressure": [
        "system=vllm_v1", "system.k=2", "system.proposer=eagle", "model=llama3-8b", "hardware=h100-80g", "rps=30",
        "engine.gpu_memory_utilization=0.229", "system.max_num_seqs=256", *WORKLOAD],
    "vLLM V1 scheduler, k=2 EAGLE head, async (arrivals seen two steps later), first drafts, frontend": [
        "system=vllm_v1", "system.k=2", "system.proposer=eagle", "model=llama3-8b", "hardware=h100-80g", "rps=12",
        "engine.async_scheduling=true", *WORKLOAD],
    "vllm at low load (runs go on past finishes)": ["system=vllm", "rps=0.5", *WORKLOAD],
    "static k=3 at low load, batch expansion (runs go on past finishes)": ["system=static_sd_k3", "rps=0.5",
                                                                           *WORKLOAD],
    "vllm in a closed loop of 4 (a finish sends a waiting request)": ["system=vllm", "rps=8", "max_concurrency=4",
                                                                      *WORKLOAD],
    "static k=3 in a closed loop of 1": ["system=static_sd_k3", "rps=2", "max_concurrency=1", *WORKLOAD],
    "laps_sd at batch 1, every request at t=0 (pinned requests run at once)": [
        "system=laps_sd", "model=llama2-7b", "model@draft=llama-68m", "hardware=l20", "workload=mbpp", "rps=1000",
        "num_requests=30"],
    "laps_sd at batch 1 with arrivals (runs stop before each)": [
        "system=laps_sd", "model=llama2-7b", "model@draft=llama-68m", "hardware=l20", "workload=mbpp", "rps=2",
        "num_requests=30"],
    "laps_sd, two at a time, every request at t=0 (runs where the priority order is the running order)": [
        "system=laps_sd", "system.max_batch=2", "model=llama2-7b", "model@draft=llama-68m", "hardware=l20",
        "workload=mbpp", "rps=1000", "num_requests=30"],
    "laps_sd_stable20 (pinned late: few runs)": [
        "system=laps_sd_stable20", "model=llama2-7b", "model@draft=llama-68m", "hardware=l20", "workload=mbpp",
        "rps=1000", "num_requests=30"],
    "static k=3 priced from a measured profile (target and draft tables)": [
        "system=static_sd_k3", "hardware=h100-80g", "cost=profile", f"cost.table={PROFILES}/h100-llama2-7b.csv",
        f"cost.draft_table={PROFILES}/h100-llama2-7b.draft.csv", "rps=4", *WORKLOAD],
}


@pytest.mark.parametrize("overrides", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_fast_forward_equals_step_by_step(overrides: list[str]) -> None:
    slow, asked_slow = _run(overrides, False)
    fast, asked_fast = _run(overrides, True)
    for name in STATE:
        a, b = getattr(slow.state, name), getattr(fast.state, name)
        assert np.array_equal(a, b, equal_nan=True), name
    assert fast.sim_time_s == slow.sim_time_s
    assert fast.num_steps == slow.num_steps
    assert fast.replica_of.tolist() == slow.replica_of.tolist()
    # the step trace, record by record (the policy's planning time aside: a wall clock, and not spent in a run)
    assert len(fast.steps) == len(slow.steps) == (slow.num_steps if "engine.record_steps=true" in overrides else 0)
    for a, b in zip(slow.steps, fast.steps, strict=True):
        assert dataclasses.replace(a, schedule_wall_s=0.0) == dataclasses.replace(b, schedule_wall_s=0.0)
        assert [type(v) for v in dataclasses.astuple(a)] == [type(v) for v in dataclasses.astuple(b)]  # 0 is not 0.0
    assert fast.step_telemetry == slow.step_telemetry
    assert asked_slow >= slow.num_steps  # step by step, the policy plans every step
    if "never" not in " ".join(overrides) and "pld" not in " ".join(overrides):
        # fast-forward ran most steps without asking (some, where the policy promises some plans only)
        assert asked_fast < asked_slow / (1.05 if "laps_sd" in " ".join(overrides) else 2)


LAPS_STATE = ("attained_s", "proposed", "accepted", "spec_rounds", "estimate", "perceptible", "accept_pred",
              "stable_rounds", "stable_tokens")


@pytest.mark.parametrize("name", [k for k in SCENARIOS if k.startswith("laps_sd")])
def test_laps_sd_observes_a_run_as_it_observes_its_steps(name: str) -> None:
    """LAPS-SD promises the plan of a batch of pinned requests (Policy.repeats_some_plans): after a run it holds what
    observe left after each step, bit for bit (its estimates of Eq. 6 read those sums), and most steps ran in runs."""
    policies = {}
    for fast in (False, True):
        built = build(compose(SCENARIOS[name]))
        rep = built.engine.replicas[0]
        rep.fast_forward = rep.fast_forward and fast
        built.engine.run()
        policies[fast] = rep.policy
    slow, fast_ = policies[False], policies[True]
    assert rep.policy.repeats_some_plans and not rep.policy.repeats_plan
    for attr in LAPS_STATE:
        assert np.array_equal(getattr(slow, attr), getattr(fast_, attr), equal_nan=True), attr
    for attr in ("draft_s_sum", "verify_s_sum", "rounds"):
        assert getattr(slow, attr) == getattr(fast_, attr), attr
    assert slow.rates.keys() == fast_.rates.keys() and np.isfinite(slow.estimate).sum() >= 4


@pytest.mark.parametrize("system", ["vllm", "static_sd_k3", "sarathi"])
def test_runs_go_on_past_finishes_where_the_policy_keeps_its_plan(system: str) -> None:
    """With nothing waiting, a finish does not end a run of a policy that keeps its plan for the rest of the batch
    (Policy.keeps_plan_after_finish): the policy is asked far less often, and nothing else changes."""
    overrides = [f"system={system}", "rps=0.5", *WORKLOAD]
    assert build(compose(overrides)).engine.replicas[0].policy.keeps_plan_after_finish
    onward, asked_onward = _run(overrides, True)
    stop, asked_stop = _run(overrides, True, onward=False)
    for name in STATE:
        assert np.array_equal(getattr(onward.state, name), getattr(stop.state, name), equal_nan=True), name
    assert onward.sim_time_s == stop.sim_time_s and onward.num_steps == stop.num_steps
    assert asked_onward < 0.85 * asked_stop  # finishes with nothing waiting asked for no new plan


@pytest.mark.parametrize(("system", "rps"), [("vllm", 4), ("static_sd_k3", 4), ("static_sd_k3", 40)])
def test_runs_go_on_through_arrivals_where_the_policy_declares_how_it_admits(system: str, rps: float) -> None:
    """A policy that declares its admission rule (Policy.admits: vLLM v0's whole prompts, first come first served)
    has its arrivals admitted and prefilled inside the engine's runs: it is asked for a handful of plans instead of
    two per arrival, and nothing else changes."""
    overrides = [f"system={system}", f"rps={rps}", *WORKLOAD]
    assert build(compose(overrides)).engine.replicas[0].policy.admits is not None
    through, asked_through = _run(overrides, True)
    stop, asked_stop = _run(overrides, True, through=False)
    for name in STATE:
        assert np.array_equal(getattr(through.state, name), getattr(stop.state, name), equal_nan=True), name
    assert through.sim_time_s == stop.sim_time_s and through.num_steps == stop.num_steps
    assert asked_stop > 60 and asked_through < asked_stop / 4


@pytest.mark.parametrize(("limit", "value"), [("_RUN_COLUMNS", 12), ("_RUN_STEPS", 24), ("_ADMIT_CAP", 2)])
def test_a_run_whose_arrays_fill_hands_over_to_the_next(monkeypatch: pytest.MonkeyPatch, limit: str,
                                                        value: int) -> None:
    """A run through arrivals takes at most ``_RUN_COLUMNS`` requests and scores at most ``_RUN_STEPS`` of a
    request's steps (bounding its arrays); at either it ends, the policy plans, and the next run goes on. Its arrays
    grow past ``_ADMIT_CAP`` requests as it admits them. Nothing changes."""
    monkeypatch.setattr(fastforward, limit, value)
    overrides = ["system=static_sd_k3", "rps=4", *WORKLOAD]
    slow, _ = _run(overrides, False)
    fast, asked = _run(overrides, True)
    for name in STATE:
        assert np.array_equal(getattr(slow.state, name), getattr(fast.state, name), equal_nan=True), name
    assert fast.sim_time_s == slow.sim_time_s and fast.num_steps == slow.num_steps
    assert asked > 10 or limit == "_ADMIT_CAP"  # runs did end at the limit


@pytest.mark.parametrize("overrides", [["system=sarathi"], ["system=fcfs"], ["system=turbospec"],
                                       ["system=static_sd_k3", "system.disable_by_batch_size=4"]])
def test_policies_that_plan_their_admissions_declare_no_rule(overrides: list[str]) -> None:
    """Chunked prefill (Sarathi-Serve), a request-level order, adaptive systems and speculation that switches off by
    batch size plan their own admissions: runs stop before arrivals there."""
    assert build(compose([*overrides, "num_requests=4"])).engine.replicas[0].policy.admits is None


def test_the_admission_rule_is_the_schedulers() -> None:
    """The engine admits inside runs by the very function vLLM's scheduler admits with (``fcfs_admit`` without
    chunking is ``whole_prompts_that_fit``): head of line, token budget, sequence limit, blocks above the
    watermark."""
    need = [100, 300, 50, 900]
    assert whole_prompts_that_fit(need, token_budget=450, max_new_seqs=8, free_blocks=100, block_size=16) == 3
    assert whole_prompts_that_fit(need, token_budget=399, max_new_seqs=8, free_blocks=100, block_size=16) == 1
    assert whole_prompts_that_fit(need, token_budget=4096, max_new_seqs=2, free_blocks=100, block_size=16) == 2
    assert whole_prompts_that_fit(need, token_budget=4096, max_new_seqs=8, free_blocks=30, block_size=16) == 3
    assert whole_prompts_that_fit(need, token_budget=4096, max_new_seqs=8, free_blocks=29, block_size=16) == 2
    assert whole_prompts_that_fit(need, token_budget=4096, max_new_seqs=0, free_blocks=100, block_size=16) == 0


def test_kv_pressure_scenarios_do_preempt() -> None:
    """The KV-pressure rows above test what they say: their runs preempt."""
    for key in ("vllm, KV pressure (recompute preemption)", "static k=3, KV pressure"):
        out, _ = _run(SCENARIOS[key], True)
        assert out.state.num_preemptions.sum() > 0, key


@pytest.mark.parametrize("system", ["turbospec", "nightjar", "adaserve", "las"])
def test_adaptive_systems_do_not_promise_repeats(system: str) -> None:
    """Systems that adapt each step to what they observed (or to time) never let the engine skip them."""
    built = build(compose([f"system={system}", "num_requests=4"]))
    assert not any(rep.fast_forward for rep in built.engine.replicas)


def test_observers_that_need_single_steps_turn_fast_forward_off() -> None:
    """The step trace takes runs; the round trace and counterfactual arms need every step one by one."""
    for extra in ("engine.record_rounds=true", "engine.counterfactual_arms=3"):
        built = build(compose(["system=vllm", "num_requests=4", "engine.record_steps=true", extra]))
        assert not built.engine.replicas[0].fast_forward, extra
    for extra in ("engine.record_steps=true", "engine.record_steps=false"):
        assert build(compose(["system=vllm", "num_requests=4", extra])).engine.replicas[0].fast_forward

