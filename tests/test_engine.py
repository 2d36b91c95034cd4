"""Engine: hand-computable runs, the plan invariants it enforces, preemption, swapping, memory actions, replicas."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from repro.core.speculation import check_trees
from repro.sim.engine import SimulationError
from repro.sim.plan import CandidateTree, MemoryAction, PlanError, StepPlan, TreeSpec, ids
from repro.sim.policy import Policy, ReplicaSpec
from repro.sim.state import Status, View
from systems.static_sd import StaticSD
from systems.vllm import VLLM
from tests.conftest import FixedOracle, make_cost, make_engine, make_requests, run


class Scripted(Policy):
    """Replays a list of plans or plan factories (one per step), then prefills and decodes plainly."""

    uses_draft_model = True

    def __init__(self, *plans: object) -> None:
        self.plans = list(plans)
        self.results: list[object] = []

    def schedule(self, view: View) -> StepPlan:
        if not self.plans:
            if view.waiting.size:
                return _prefill_all(view)
            return StepPlan(decode_ids=view.running)
        p = self.plans.pop(0)
        return p(view) if callable(p) else p  # type: ignore[return-value]

    def observe(self, result: object) -> None:
        self.results.append(result)


def test_single_request_timeline_matches_cost_model() -> None:
    # one request, prompt 32, 5 output tokens: 1 prefill step (first token) + 4 decode steps
    out = run(VLLM(), make_requests(1, prompt_len=32, output_len=5))
    cost = make_cost(draft=None)
    prefill = cost.forward_s(32, 1, prefill_attn_pairs=32 * (0 + 33 / 2), lm_head_tokens=1)
    decodes = [cost.forward_s(1, 1, kv_read_tokens=32 + i + 1, decode_only=True) for i in range(4)]
    s = out.state
    assert out.num_steps == 5
    assert s.first_token_at[0] == pytest.approx(prefill)
    assert s.finish_at[0] == pytest.approx(prefill + sum(decodes))
    assert s.num_generated[0] == 5 and s.status[0] == Status.FINISHED and s.kv_blocks[0] == 0


@pytest.mark.parametrize(("k", "accept", "output_len", "decode_steps"), [
    (3, 2, 10, 3),   # prefill gives token 1; then 3 tokens per step: 4, 7, 10
    (3, 3, 10, 3),   # 4 per step: 5, 9, then capped at 1: 10
    (3, 0, 4, 3),    # nothing accepted: one token per step
    (0, 0, 4, 3),    # k = 0 behaves like plain decoding
    (5, 5, 2, 1),    # the first decode step is capped at the one remaining token
])
def test_speculation_emits_accepted_plus_one_capped(k: int, accept: int, output_len: int, decode_steps: int) -> None:
    out = run(StaticSD(k=k), make_requests(1, output_len=output_len), oracle=FixedOracle(accept))
    s = out.state
    assert s.num_generated[0] == output_len
    assert s.num_decode_steps[0] == decode_steps
    assert s.num_proposed[0] == k * decode_steps
    assert s.num_accepted[0] <= s.num_proposed[0]


def test_speculation_costs_draft_steps() -> None:
    # a k=3 step with a draft costs the proposer's round overhead + 3 draft forwards on top of the verify pass
    pol = StaticSD(k=3)
    eng = make_engine(pol, make_requests(1, output_len=3), oracle=FixedOracle(0), record_steps=True)
    out = eng.run()
    dec = [r for r in out.steps if r.num_decode]
    assert dec and all(r.draft_s > 0 for r in dec)
    cost = eng.replicas[0].cost
    one = cost.forward_s(1, 1, kv_read_tokens=34, decode_only=True, which="draft")
    assert dec[0].draft_s == pytest.approx(cost.spec_round_s() + 3 * one, rel=0.05)


def test_all_requests_finish_and_time_is_monotone() -> None:
    rng = np.random.default_rng(1)
    reqs = make_requests(60, prompt_len=list(rng.integers(4, 600, 60)), output_len=list(rng.integers(1, 200, 60)),
                         gap_s=0.05)
    eng = make_engine(StaticSD(k=4), reqs, oracle=FixedOracle(2), record_steps=True)
    out = eng.run()
    s = out.state
    assert (s.status == Status.FINISHED).all()
    assert (s.num_generated == reqs["output_len"]).all()
    starts = np.array([r.start_at for r in out.steps])
    ends = starts + np.array([r.latency_s for r in out.steps])
    assert (np.diff(starts) > 0).all() and (starts[1:] >= ends[:-1] - 1e-12).all()
    assert (s.first_token_at >= s.arrival_s).all() and (s.finish_at >= s.first_token_at).all()
    assert eng.replicas[0].used_blocks == 0


def test_kv_pressure_preempts_by_recompute_and_everything_finishes() -> None:
    reqs = make_requests(8, prompt_len=60, output_len=100)
    eng = make_engine(VLLM(), reqs, kv_blocks=40)
    out = eng.run()
    s = out.state
    assert (s.status == Status.FINISHED).all()
    assert s.num_preemptions.sum() > 0
    assert (s.num_generated == 100).all()


@pytest.mark.parametrize(("plan", "message"), [
    (StepPlan(decode_ids=ids([0])), "not running"),                                   # decode before prefill
    (StepPlan(prefill_ids=ids([0, 0]), prefill_tokens=ids([16, 16])), "twice"),       # duplicate id
    (StepPlan(prefill_ids=ids([0]), prefill_tokens=ids([0])), "positive"),            # empty chunk
    (StepPlan(prefill_ids=ids([0]), prefill_tokens=ids([33])), "past"),               # chunk past the prompt
    (StepPlan(preempt_ids=ids([1])), "not running"),                                  # preempt a waiting request
    (StepPlan(swap_in_ids=ids([1])), "not swapped"),
    (StepPlan(memory=MemoryAction(reload_draft=True)), "resident"),                   # draft already resident
    (StepPlan(memory=MemoryAction(kv_pool_blocks=10**9)), "capacity"),
])
def test_invalid_plans_are_rejected(plan: StepPlan, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        run(Scripted(plan), make_requests(2, prompt_len=32))


@pytest.mark.parametrize(("plans", "draft", "message"), [
    ([MemoryAction(offload_draft=True), MemoryAction(offload_draft=True)], "llama-160m",
     "offloading a draft model that is not resident"),
    ([MemoryAction(offload_draft=True), MemoryAction(reload_draft=True), MemoryAction(reload_draft=True)],
     "llama-160m", "reloading a draft model that is resident or loading (or not configured)"),  # still loading
    ([MemoryAction(reload_draft=True)], None, "reloading a draft model that is resident or loading (or not "
     "configured)"),
], ids=["offload twice", "reload while loading", "reload without a draft"])
def test_a_memory_action_the_draft_cannot_take_is_refused(plans: list[MemoryAction], draft: str | None,
                                                         message: str) -> None:
    class Plain(Scripted):
        uses_draft_model = draft is not None

    with pytest.raises(PlanError) as err:
        run(Plain(*[StepPlan(memory=m) for m in plans]), make_requests(2, prompt_len=32), draft=draft)
    assert str(err.value) == message


def test_a_memory_action_that_changes_nothing_costs_nothing() -> None:
    pol = Scripted(StepPlan(memory=MemoryAction()), _prefill_all)
    eng = make_engine(pol, make_requests(1, output_len=2), record_steps=True)
    before = eng.replicas[0].total_blocks
    out = eng.run()
    assert out.steps[0].memory_s == 0.0 and eng.replicas[0].total_blocks == before and eng.replicas[0].draft_resident


def test_keeping_the_draft_in_step_without_speculating_charges_no_speculation_round() -> None:
    # draft_sync with k = 0 for every request: the draft's pass over the newest tokens, and no round of proposals
    # (the same seconds as on an engine that charges no rounds); with k = 1 the round is charged
    import dataclasses

    from repro.cost.model import CostModel
    from repro.cost.serving import load_engine
    from repro.cost.spec import load_hardware, load_model
    from repro.sim.proposers import colocated
    from repro.sim.state import RequestState
    from repro.sim.stepcost import StepCoster

    v0 = load_engine("vllm_v0")
    costs = [CostModel(load_hardware("a100-80g"), load_model("llama2-7b"), draft=load_model("llama-160m"),
                       engine=e) for e in (v0, dataclasses.replace(v0, spec_round=False))]
    rid, none = np.arange(3), np.zeros(0, dtype=np.int64)

    def drafting(cost: CostModel, k: int) -> float:
        state = RequestState(**make_requests(3, prompt_len=40))
        state.num_draft_computed[:] = 40
        ks = np.full(3, k, dtype=np.int64)
        plan = StepPlan(decode_ids=rid, k=ks, draft_sync=True)
        return StepCoster(state, cost).draft_s(colocated(cost)["draft"], plan, rid, np.full(3, 40), ks, ks > 0, {},
                                               none, none, draft_resident=True)

    assert costs[0].spec_round_s() > 0 and costs[1].spec_round_s() == 0.0
    assert drafting(costs[0], 0) == drafting(costs[1], 0) > 0.0
    assert drafting(costs[0], 1) == pytest.approx(drafting(costs[1], 1) + costs[0].spec_round_s(), rel=1e-12)


def _prefill_all(view: View) -> StepPlan:
    w = view.waiting
    return StepPlan(prefill_ids=w, prefill_tokens=view.num_tokens(w))


def test_negative_k_and_out_of_kv_are_rejected() -> None:
    bad_k = Scripted(_prefill_all, lambda v: StepPlan(decode_ids=v.running, k=-np.ones(v.running.size, np.int64)))
    with pytest.raises(PlanError, match="non-negative"):
        run(bad_k, make_requests(2))
    with pytest.raises(PlanError, match="out of KV"):
        run(Scripted(_prefill_all), make_requests(4, prompt_len=64), kv_blocks=10)


def _tree(rid: int, pos: int, parent: list[int]) -> CandidateTree:
    n = len(parent)
    depth = np.zeros(n, dtype=np.int64)
    for i, p in enumerate(parent):
        depth[i] = 1 if p < 0 else depth[p] + 1
    rank = np.array([0 if i == 0 or parent[i] != parent[i - 1] else 1 for i in range(n)])
    prob = np.full(n, 0.5)
    return CandidateTree(rid=rid, pos=pos, parent=np.array(parent), depth=depth, rank=rank, prob=prob,
                         path_prob=0.5 ** depth, draft_depth=int(depth.max()), draft_width=2)


def test_tree_must_be_connected_to_its_root() -> None:
    cand = _tree(0, 1, [-1, -1, 0, 0])
    broken = Scripted(_prefill_all, lambda v: StepPlan(decode_ids=ids([0]), k=ids([0]),
                                                       trees={0: TreeSpec(cand, ids([2]))}))
    with pytest.raises(PlanError, match="connected"):
        run(broken, make_requests(1))
    ok = Scripted(_prefill_all, lambda v: StepPlan(decode_ids=ids([0]), k=ids([0]),
                                                   trees={0: TreeSpec(cand, ids([0, 2, 3]))}))
    out = run(ok, make_requests(1, output_len=6), oracle=FixedOracle(5))
    assert out.state.num_proposed[0] == 3 and out.state.num_accepted[0] == 2  # path 0 -> 2 is rank 0 twice


def _first_error(check: Callable[..., None], *args: object) -> str | None:
    try:
        check(*args)
    except PlanError as e:
        return str(e)
    return None


def _one_by_one(specs: list[TreeSpec], rids: list[int], poss: list[int]) -> None:
    for t, r, p in zip(specs, rids, poss, strict=True):
        t.check(r, p)


@pytest.mark.parametrize("compiled", [False, True])
def test_trees_are_checked_together_as_each_alone(use_jit: Any, compiled: bool) -> None:
    """check_trees (the engine's check of a step's trees in one go; compiled: repro.core.kernels.trees_connected)
    raises exactly when a tree's own check would, with the first failing tree's message: random trees, some with
    unknown nodes, a gap to the root or the wrong request."""
    if compiled:
        pytest.importorskip("numba")
    use_jit(compiled)
    rng = np.random.default_rng(0)
    for _ in range(300):
        specs, rids, poss = [], [], []
        for j in range(int(rng.integers(1, 6))):
            n = int(rng.integers(1, 9))
            cand = _tree(j, 3, [-1] + [int(rng.integers(-1, i)) for i in range(1, n)])
            nodes = np.flatnonzero(rng.random(n) < 0.6)
            kind = rng.random()
            if kind < 0.05:
                nodes = np.append(nodes, n if rng.random() < 0.5 else -1)  # an unknown node
            elif kind < 0.15 and nodes.size:  # maybe a gap: a node without its parent
                nodes = np.delete(nodes, int(rng.integers(nodes.size)))
            specs.append(TreeSpec(cand, nodes.astype(np.int64)))
            rids.append(j if rng.random() > 0.03 else j + 1)
            poss.append(3)
        assert _first_error(check_trees, specs, rids, poss) == _first_error(_one_by_one, specs, rids, poss)


def test_swap_preemption_charges_the_host_link_both_ways() -> None:
    pol = Scripted(_prefill_all, StepPlan(preempt_ids=ids([0]), preempt_mode="swap"),
                   StepPlan(swap_in_ids=ids([0])), lambda v: StepPlan(decode_ids=v.running))
    eng = make_engine(pol, make_requests(1, prompt_len=500, output_len=2), record_steps=True)
    out = eng.run()
    swap = eng.replicas[0].cost.swap_s(500)
    assert swap > 0
    mem = [r.memory_s for r in out.steps]
    assert mem[1] == pytest.approx(swap) and mem[2] == pytest.approx(swap)
    assert out.state.num_preemptions[0] == 1 and out.state.status[0] == Status.FINISHED


def test_draft_offload_expands_the_pool_and_reload_is_asynchronous() -> None:
    # step 0 offloads (no transfer: a host copy is kept) and expands the pool; step 1 dispatches the reload, which
    # contracts the pool at once (nothing used: nothing migrates) and makes the draft resident a transfer later
    pol = Scripted(StepPlan(memory=MemoryAction(offload_draft=True)), StepPlan(memory=MemoryAction(reload_draft=True)),
                   _prefill_all, lambda v: StepPlan(decode_ids=v.running))
    seen: list[tuple[bool, bool]] = []
    sched = pol.schedule
    pol.schedule = lambda v: (seen.append((v.draft_resident, v.draft_loading)), sched(v))[1]  # type: ignore
    eng = make_engine(pol, make_requests(1, output_len=2), record_steps=True)
    rep = eng.replicas[0]
    with_draft = rep.total_blocks
    cost = rep.cost
    assert cost.kv_capacity_blocks(draft_resident=False) > with_draft
    out = eng.run()
    eng_prof = cost.engine
    assert [r.memory_s for r in out.steps[:2]] == pytest.approx([eng_prof.kv_expand_s, eng_prof.reload_dispatch_s])
    assert rep.total_blocks == with_draft
    assert seen[:2] == [(True, False), (False, False)]
    assert seen[2] == (False, True)  # the prefill starts 21.9 µs later: the weights are still on the link
    assert rep.draft_resident and rep.draft_ready_at is None


def test_contracting_the_pool_migrates_the_used_blocks_above_its_new_end() -> None:
    cost = make_cost()
    # 8 of 100 blocks used, the pool shrinks to 75: a quarter of the used blocks move (2), each read and written once
    blocks_bytes = 2 * 2 * 16 * cost.model.kv_bytes_per_token
    hw = cost.hardware
    assert cost.kv_migrate_s(2) == pytest.approx(blocks_bytes / (hw.mem_bw_gbs * 1e9 * hw.mem_efficiency)
                                                 + hw.step_overhead_s)
    assert cost.kv_migrate_s(0) == 0.0


def test_draft_catches_up_after_skipped_speculation() -> None:
    # speculate, skip 10 steps without keeping the draft in sync, speculate again: the draft replays what it missed
    def dec(k: int):
        return lambda v: StepPlan(decode_ids=v.running, k=np.full(v.running.size, k, dtype=np.int64))
    def prefill_synced(v: View) -> StepPlan:
        return StepPlan(prefill_ids=v.waiting, prefill_tokens=v.num_tokens(v.waiting), draft_sync=True)
    pol = Scripted(prefill_synced, dec(2), *[dec(0)] * 10, dec(2))
    out = run(pol, make_requests(4, output_len=40), oracle=FixedOracle(0), record_steps=True)
    spec = [r.draft_s for r in out.steps if r.num_proposed]
    assert len(spec) == 2 and spec[1] > spec[0]


class TwoPools(Policy):
    """Routes requests by SLO class to one of two vLLM replicas (SepPipe-like)."""

    def __init__(self) -> None:
        self.pools = [ReplicaSpec(VLLM(), tp=1), ReplicaSpec(VLLM(), tp=1)]

    def replicas(self) -> list[ReplicaSpec]:
        return self.pools

    def route(self, rid: int, slo_class: int, views: list[View]) -> int:
        return slo_class


def test_replicas_route_and_run_independently() -> None:
    reqs = make_requests(10, gap_s=0.01)
    reqs["slo_class"] = np.arange(10) % 2
    out = run(TwoPools(), reqs)
    assert (out.replica_of == reqs["slo_class"]).all()
    assert (out.state.status == Status.FINISHED).all()


class Idle(Policy):
    def schedule(self, view: View) -> StepPlan:
        return StepPlan()


def test_idle_policy_with_waiting_requests_is_an_error() -> None:
    with pytest.raises(SimulationError, match="idled"):
        run(Idle(), make_requests(2))


def test_empty_tree_still_pays_for_its_beam_search() -> None:
    cand = _tree(0, 1, [-1, -1, 0, 0])
    pol = Scripted(_prefill_all, lambda v: StepPlan(decode_ids=ids([0]), k=ids([0]),
                                                    trees={0: TreeSpec(cand, ids([]))}))
    out = run(pol, make_requests(1, output_len=4), record_steps=True)
    first = out.steps[1]
    assert first.num_proposed == 0 and first.draft_s > 0


class NoMatchOracle(FixedOracle):
    """Prompt lookup finds a match only for even request ids (proposing k, accepting none)."""

    def score_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                    proposer: str = "draft") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        proposed = np.where(rids % 2 == 0, k, 0).astype(np.int64)
        return proposed, np.zeros_like(proposed), np.zeros_like(proposed)


def test_prompt_lookup_verifies_only_matched_tokens() -> None:
    # 4 requests ask for k = 5 with prompt lookup; only 2 match: the verify pass scores 4 + 2·5 tokens, not 4 + 4·5
    def dec(v: View) -> StepPlan:
        return StepPlan(decode_ids=v.running, k=np.full(v.running.size, 5, dtype=np.int64), proposer="pld")
    out = run(Scripted(_prefill_all, dec), make_requests(4, output_len=20), oracle=NoMatchOracle(), record_steps=True)
    step = out.steps[1]
    assert step.num_batched_tokens == 4 + 2 * 5 and step.num_proposed == 10 and step.draft_s > 0


def test_draft_sync_replays_what_the_draft_missed() -> None:
    # requests decode 10 steps without speculation and without sync, then one synced step without speculation:
    # the draft must process the 10 missed tokens of each request, not just one
    def dec(sync: bool):
        return lambda v: StepPlan(decode_ids=v.running, draft_sync=sync)
    def prefill_synced(v: View) -> StepPlan:
        return StepPlan(prefill_ids=v.waiting, prefill_tokens=v.num_tokens(v.waiting), draft_sync=True)
    out = run(Scripted(prefill_synced, dec(True), *[dec(False)] * 10, dec(True)), make_requests(4, output_len=40),
              record_steps=True)
    assert out.steps[12].draft_s > out.steps[1].draft_s * 1.3  # step 12 is the second synced decode
    # exactly: each of the 4 requests (prompt 32) has 32 + 11 tokens cached, the draft 32 + 1; it replays the 10 it
    # missed and the last one (11 tokens on 33, causal: Σ 11 · (33 + 12 / 2)), reading the 43 of each and one more
    want = make_cost().forward_s(4 + 40, 4, kv_read_tokens=4 * 43 + 4, prefill_attn_pairs=4 * 11 * (33 + 6.0),
                                 lm_head_tokens=4, decode_only=False, which="draft")
    assert out.steps[12].draft_s == pytest.approx(want, rel=1e-12)
    # ... and a step that speculates one token after the same 10 missed catches up in its first draft pass alike
    spec = lambda v: StepPlan(decode_ids=v.running, k=np.ones(v.running.size, dtype=np.int64))  # noqa: E731
    out = run(Scripted(prefill_synced, dec(True), *[dec(False)] * 10, spec), make_requests(4, output_len=40),
              record_steps=True)
    # (with the round's host bookkeeping, charged to drafting)
    assert out.steps[12].draft_s == pytest.approx(want + make_cost().spec_round_s(), rel=1e-12)


def test_recompute_preemption_reprefills_prompt_and_generated_tokens() -> None:
    # prompt 100, 6 output tokens: prefill (token 1), 2 decodes (tokens 2, 3), preempted by recompute (its KV
    # freed), then re-prefilled: all 103 tokens again, causal pairs 103 · 104 / 2, sampling token 4; 2 decodes finish
    def decode(v: View) -> StepPlan:
        return StepPlan(decode_ids=v.running)

    pol = Scripted(_prefill_all, decode, decode, StepPlan(preempt_ids=ids([0])), _prefill_all, decode, decode)
    eng = make_engine(pol, make_requests(1, prompt_len=100, output_len=6), record_steps=True)
    out = eng.run()
    cost = make_cost(draft=None)
    steps = out.steps
    assert [r.num_batched_tokens for r in steps] == [100, 1, 1, 0, 103, 1, 1]
    reprefill = cost.forward_s(103, 1, prefill_attn_pairs=103 * 104 / 2, lm_head_tokens=1)
    assert steps[4].verify_s == pytest.approx(reprefill)
    assert steps[5].verify_s == pytest.approx(cost.forward_s(1, 1, kv_read_tokens=104, decode_only=True))
    s = out.state
    assert s.num_preemptions[0] == 1 and s.num_generated[0] == 6 and s.status[0] == Status.FINISHED


def test_swap_moves_the_draft_kv_with_the_target_kv() -> None:
    # the draft prefilled alongside the target (draft_sync): its 500 tokens of KV are swapped out and back too
    def prefill_synced(v: View) -> StepPlan:
        return StepPlan(prefill_ids=v.waiting, prefill_tokens=v.num_tokens(v.waiting), draft_sync=True)
    pol = Scripted(prefill_synced, StepPlan(preempt_ids=ids([0]), preempt_mode="swap"),
                   StepPlan(swap_in_ids=ids([0])), lambda v: StepPlan(decode_ids=v.running))
    eng = make_engine(pol, make_requests(1, prompt_len=500, output_len=2), record_steps=True)
    out = eng.run()
    cost = eng.replicas[0].cost
    both = cost.swap_s(500, 500)
    assert both == pytest.approx(500 * (524_288 + 36_864) / 25e9)  # Llama-2-7B + Llama-160M KV over PCIe Gen4
    assert [r.memory_s for r in out.steps[1:3]] == pytest.approx([both, both])


def test_an_engine_without_speculative_chunked_prefill_rejects_a_mixed_step() -> None:
    # vLLM v0 turned chunked prefill off when speculating: a step may prefill or speculate, not both
    def mixed(v: View) -> StepPlan:
        return StepPlan(prefill_ids=ids([1]), prefill_tokens=ids([32]), decode_ids=ids([0]), k=ids([2]))
    def first(v: View) -> StepPlan:
        return StepPlan(prefill_ids=ids([0]), prefill_tokens=v.num_tokens(ids([0])))
    reqs = make_requests(2, output_len=8)
    with pytest.raises(PlanError, match="vllm_v0: a step cannot both prefill and speculate"):
        run(Scripted(first, mixed), reqs, engine="vllm_v0")
    run(Scripted(first, mixed), make_requests(2, output_len=8), engine="vllm_v1")  # v1 mixes them


# --- the View's queues: rebuilt when the engine changes them, not every step --------------------------------------

QUEUE_SCENARIOS = {
    "nightjar (admissions, finishes)": ["system=nightjar", "rps=12", "num_requests=40"],
    "turbospec, KV pressure (recompute preemption)": ["system=turbospec", "rps=8", "num_requests=60", "seed=1",
                                                      "engine.gpu_memory_utilization=0.22"],
    "fcfs_slo, KV pressure (swap out and back in)": ["system=fcfs_slo", "workload=adaserve_mix", "rps=12",
                                                     "num_requests=60", "engine.gpu_memory_utilization=0.22"],
    "vllm fast-forwarded (runs admit arrivals)": ["system=vllm", "rps=6", "num_requests=60"],
    "three replicas (seppipe)": ["system=seppipe", "workload=adaserve_mix", "rps=6", "num_requests=40"],
}


@pytest.mark.usefixtures("no_data")
@pytest.mark.parametrize("overrides", QUEUE_SCENARIOS.values(), ids=QUEUE_SCENARIOS.keys())
def test_the_views_queues_always_show_the_engines(monkeypatch: pytest.MonkeyPatch, overrides: list[str]) -> None:
    """The View rebuilds its queue arrays only when ``RequestState.queues_changed`` says the engine changed them:
    every read of ``waiting``, ``running`` and ``swapped`` over whole runs (admission, finishes, both kinds of
    preemption, swaps back in, fast-forwarded runs that admit, several replicas) equals the queue as it stands."""
    from repro.experiments.simulate import build, compose

    reads = 0
    queue = View._queue

    def checked(self: View, name: str, src: Any) -> np.ndarray:
        nonlocal reads
        reads += 1
        got = queue(self, name, src)
        assert got.tolist() == list(src), name
        return got

    monkeypatch.setattr(View, "_queue", checked)
    out = build(compose(["workload=sharegpt", "seed=2", *overrides])).engine.run()
    assert reads
    if "fcfs_slo" in overrides[0]:
        assert float(out.state.swap_s.sum()) > 0  # (the scenario swaps)
    if "gpu_memory_utilization=0.22" in overrides:
        assert int(out.state.num_preemptions.sum()) > 0


def test_each_memory_action_charges_its_own_part_of_the_step() -> None:
    """Step 0 prefills two requests (the draft's cache in step with them). Step 1 offloads the draft and shrinks the
    pool to half: the used blocks in the reclaimed half move (round(used · half / old) blocks), and the draft's cache
    is dropped. Step 2 reloads the draft and grows the pool to three quarters: the dispatch and the expansion."""
    from repro.sim.plan import MemoryAction

    reqs = make_requests(2, prompt_len=300, output_len=60)
    old = make_engine(Scripted(), reqs).replicas[0].total_blocks
    half, most = old // 2, 3 * old // 4
    pol = Scripted(StepPlan(prefill_ids=ids([0, 1]), prefill_tokens=np.array([300, 300]), draft_sync=True),
                   StepPlan(memory=MemoryAction(offload_draft=True, kv_pool_blocks=half)),
                   StepPlan(memory=MemoryAction(reload_draft=True, kv_pool_blocks=most)))
    seen: list[tuple[float, int, int, bool, bool]] = []
    sched = pol.schedule
    pol.schedule = lambda v: (seen.append((v.now, int(v.num_draft_computed.sum()), int(v.kv_blocks.sum()),  # type: ignore
                                           v.draft_resident, v.draft_loading)), sched(v))[1]
    eng = make_engine(pol, reqs, record_steps=True, fast_forward=False)
    rep = eng.replicas[0]
    out = eng.run()
    cost, prof = rep.cost, rep.cost.engine
    used = seen[1][2]
    assert seen[1][1] == 600 and used == 2 * 19  # 301 slots each (with the first token): 19 blocks of 16
    assert out.steps[1].memory_s == pytest.approx(cost.kv_migrate_s(round(used * (old - half) / old), 16), rel=1e-12)
    assert seen[2][1] == 0 and not seen[2][3]  # the draft and its cache are gone
    assert out.steps[2].memory_s == pytest.approx(prof.reload_dispatch_s + prof.kv_expand_s, rel=1e-12)
    assert rep.total_blocks == most
    ready = out.steps[2].start_at + cost.draft_transfer_s()  # within step 2, which the expansion makes long
    assert out.steps[2].start_at < ready <= seen[3][0] and seen[3][3] and not seen[3][4]


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize("policy", [VLLM, lambda: StaticSD(k=3)])
def test_the_run_counts_its_steps_and_the_requests_they_ran_as_its_step_trace_does(
        policy: Callable[[], Policy], fast_forward: bool) -> None:
    """num_steps and num_scheduled (the mean batch size's two sums) are the step trace's row count and the sum of
    its batch sizes, on the fast path as on the step path."""
    reqs = make_requests(12, prompt_len=list(range(20, 260, 20)), output_len=list(range(5, 65, 5)), gap_s=0.01)
    out = make_engine(policy(), reqs, oracle=FixedOracle(2), record_steps=True, fast_forward=fast_forward).run()
    assert out.num_steps == len(out.steps) > 12
    assert out.num_scheduled == sum(r.num_seqs for r in out.steps) == sum(
        r.num_decode + r.num_prefill for r in out.steps)
    walls = [r.schedule_wall_s for r in out.steps]  # the policy's own CPU time per step, measured: under a second
    assert min(walls) >= 0.0 and max(walls) < 1.0
    if not fast_forward:  # every step was planned by the policy, and timed
        assert min(walls) > 0.0
