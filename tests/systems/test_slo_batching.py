"""AdaServe's continuous-batching baselines: IncrDec (§6.1), SLO-aware FCFS and STTA, SepPipe (§6.3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from repro.experiments.simulate import build, compose, run_point
from repro.sim.policy import Policy
from repro.sim.state import Status
from systems.fcfs_slo import FCFSSLO
from systems.incr_dec import IncrDec
from systems.lib import slo_batch_limit
from systems.seppipe import SepPipe
from systems.stta import STTA, slack_s
from systems.vllm import VLLM
from tests.conftest import make_cost, make_engine, make_requests, run, spy


def decode_s(n: int, ctx: int) -> float:
    """Cost-model latency of a decode step over ``n`` requests of ``ctx`` tokens each."""
    return make_cost().forward_s(n, n, kv_read_tokens=float(n * ctx), decode_only=True)


def with_slos(reqs: dict[str, np.ndarray], slos: list[float]) -> dict[str, np.ndarray]:
    reqs["tpot_slo_s"] = np.asarray(slos, dtype=np.float64)
    return reqs


# --- the dynamic batch size limit ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("slos", "max_num_seqs", "expected"), [
    ([np.inf] * 16, 64, 16),  # no SLO: everything fits, the limit grows to the candidates
    ([0.1] * 16, 64, 16),  # relaxed SLOs (chat, 100 ms): a batch of 16 is far below
    ([np.inf] * 16, 8, 8),  # the hard cap still applies
    ([decode_s(4, 64)] + [0.1] * 15, 64, 4),  # an urgent request first: the batch shrinks to what meets its SLO
    ([0.1] * 15 + [decode_s(4, 64)], 64, 15),  # urgent last in priority order: the prefix before it runs
    ([1e-6] * 16, 64, 1),  # an unattainable SLO still runs one request
])
def test_batch_limit_is_the_largest_prefix_within_the_tightest_slo(slos: list[float], max_num_seqs: int,
                                                                   expected: int) -> None:
    eng = make_engine(VLLM(), with_slos(make_requests(16, prompt_len=64), slos))
    view = eng.replicas[0].view
    assert slo_batch_limit(view, np.arange(16), max_num_seqs=max_num_seqs) == expected


@pytest.mark.parametrize("policy", [FCFSSLO, STTA])
@pytest.mark.parametrize(("urgent_slo", "max_batch"), [
    (np.inf, 8),  # no urgent request: all eight decode together
    (decode_s(3, 48), 3),  # an urgent request running: batches of at most three while it runs
])
def test_batch_shrinks_while_an_urgent_request_runs(policy: type[Policy], urgent_slo: float, max_batch: int) -> None:
    # request 0 is urgent (short), the other seven relaxed; all arrive together
    reqs = with_slos(make_requests(8, prompt_len=32, output_len=[8] + [32] * 7), [urgent_slo] + [1.0] * 7)
    pol = policy()
    _, results = spy(pol)
    out = run(pol, reqs)
    assert (out.state.status == Status.FINISHED).all()
    urgent_end = out.state.finish_at[0]
    during = [r.decode_ids.size for r in results if r.end_at <= urgent_end and r.decode_ids.size]
    after = [r.decode_ids.size for r in results if r.start_at >= urgent_end and r.decode_ids.size]
    assert max(during) == max_batch
    assert 0 in np.concatenate([r.decode_ids for r in results if r.end_at <= urgent_end])
    assert max(after) == 7  # the limit grows back once the urgent request is done


# --- who is preempted ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("policy", "ran", "preempted"), [
    (FCFSSLO, [0, 1], [2, 3]),  # FCFS: the earliest run, the latest arrivals are preempted (here: urgent ones)
    (STTA, [2, 3], [0, 1]),  # STTA: the least slack runs (urgent), the most slack (relaxed) is preempted
])
def test_who_runs_under_the_limit(policy: type[Policy], ran: list[int], preempted: list[int]) -> None:
    # two relaxed requests arrive first, then two urgent ones whose SLO admits batches of two
    reqs = with_slos(make_requests(4, prompt_len=32, output_len=16), [1.0, 1.0] + [decode_s(2, 40)] * 2)
    pol = policy()
    plans, results = spy(pol)
    run(pol, reqs)
    assert sorted(plans[0].prefill_ids.tolist()) == [0, 1, 2, 3]  # every prompt is admitted (prefill first)
    decodes = [r.decode_ids.tolist() for r in results if r.decode_ids.size]
    assert sorted(decodes[0]) == ran  # the decoding iteration runs two, the other two wait
    first_of = {rid: next(i for i, d in enumerate(decodes) if rid in d) for rid in range(4)}
    assert min(first_of[r] for r in preempted) > max(first_of[r] for r in ran)


@pytest.mark.parametrize("preempt_mode", ["swap", "recompute"])
@pytest.mark.parametrize(("policy", "first_victim"), [
    (FCFSSLO, 3),  # FCFS evicts the most recent arrival
    (STTA, 0),  # STTA evicts the request with the most slack (the loosest SLO)
])
def test_kv_pressure_evicts_by_policy_and_everything_finishes(policy: Any, first_victim: int,
                                                              preempt_mode: str) -> None:
    # four requests grow to 6 blocks each (96 tokens) in a pool of 16: someone must leave; SLOs loose enough that
    # the batch limit does not bind, with slack ordered 0 > 1 > 2 > 3
    reqs = with_slos(make_requests(4, prompt_len=32, output_len=64), [10.0, 5.0, 2.0, 1.0])
    pol = policy(preempt_mode=preempt_mode)
    plans, _ = spy(pol)
    eng = make_engine(pol, reqs, kv_blocks=16)
    out = eng.run()
    victims = [p.preempt_ids for p in plans if p.preempt_ids.size]
    assert victims and int(victims[0][0]) == first_victim
    assert all(p.preempt_mode == preempt_mode for p in plans if p.preempt_ids.size)
    if preempt_mode == "swap":  # swapped requests come back through swap_in_ids
        back = np.concatenate([p.swap_in_ids for p in plans])
        assert first_victim in back.tolist()
    assert (out.state.status == Status.FINISHED).all()
    assert (out.state.num_generated == 64).all()
    assert eng.replicas[0].used_blocks == 0


@pytest.mark.parametrize(("evict_unselected", "relaxed_preemptions"), [
    (False, 0),  # preempted from the batch, the relaxed requests keep their KV and wait
    (True, 1),  # evicted (swapped out) the moment the urgent request takes the batch, then swapped back
])
def test_preempted_requests_wait_or_are_evicted(evict_unselected: bool, relaxed_preemptions: int) -> None:
    # three relaxed requests run; an urgent one arrives whose SLO allows only itself in the batch
    reqs = with_slos(make_requests(4, prompt_len=32, output_len=[40, 40, 40, 8]), [1.0, 1.0, 1.0, decode_s(1, 40)])
    reqs["arrival_s"] = np.array([0.0, 0.0, 0.0, 0.1])
    pol = STTA(evict_unselected=evict_unselected)
    _, results = spy(pol)
    out = run(pol, reqs)
    assert (out.state.status == Status.FINISHED).all()
    assert out.state.num_preemptions[:3].tolist() == [relaxed_preemptions] * 3
    while_urgent = [r for r in results if r.start_at >= 0.1 and r.end_at <= out.state.finish_at[3]]
    assert all(r.decode_ids.tolist() in ([], [3]) for r in while_urgent)


def test_stta_slack() -> None:
    # g tokens generated: slack = first_token_at + g·slo − now; none yet: one SLO's worth
    reqs = with_slos(make_requests(3), [0.02, 0.1, np.inf])
    eng = make_engine(STTA(), reqs)
    s = eng.replicas[0].s
    s.num_generated[:] = [5, 0, 3]
    s.first_token_at[:] = [1.0, np.nan, 1.0]
    view = eng.replicas[0].view
    view.now = 1.05
    assert slack_s(view, np.arange(3)) == pytest.approx([1.0 + 5 * 0.02 - 1.05, 0.1, np.inf])


# --- IncrDec ------------------------------------------------------------------------------------------------------

def test_incr_dec_is_vllm_with_flexflow_limits() -> None:
    # with vLLM's limits and ample KV the two schedules coincide
    reqs = make_requests(12, prompt_len=[30, 200, 64] * 4, output_len=[5, 40, 17] * 4, gap_s=0.01)
    a = run(IncrDec(max_num_seqs=256, max_num_batched_tokens=4096), reqs)
    b = run(VLLM(), reqs)
    assert np.array_equal(a.state.finish_at, b.state.finish_at)


def test_incr_dec_prefill_preempts_decoding_and_chunks_long_prompts() -> None:
    reqs = make_requests(3, prompt_len=[32, 32, 700], output_len=20)
    reqs["arrival_s"] = np.array([0.0, 0.0, 0.05])
    pol = IncrDec(max_num_batched_tokens=256)
    plans, _ = spy(pol)
    out = run(pol, reqs)
    assert (out.state.status == Status.FINISHED).all()
    prefill = [p for p in plans if p.prefill_ids.size]
    assert all(p.decode_ids.size == 0 for p in prefill)  # prefill steps stall every decode
    assert [int(p.prefill_tokens.sum()) for p in prefill if 2 in p.prefill_ids.tolist()] == [256, 256, 188]


# --- SepPipe ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("num_replicas", "tp_per_replica", "tps"), [
    (3, 1, [1, 1, 1]),  # one single-GPU pipeline per category (7B/13B: three of the node's four GPUs)
    (3, [2, 1, 1], [2, 1, 1]),  # one 4-GPU node split among three categories
    (2, [1, 1], [1, 1]),  # fewer pipelines than categories: class c -> c mod 2
])
def test_seppipe_routes_by_class_and_each_replica_finishes(num_replicas: int, tp_per_replica: Any,
                                                           tps: list[int]) -> None:
    reqs = make_requests(12, prompt_len=48, output_len=[6, 20, 33] * 4, gap_s=0.005)
    reqs["slo_class"] = np.arange(12) % 3
    pol = SepPipe(num_replicas=num_replicas, tp_per_replica=tp_per_replica)
    eng = make_engine(pol, reqs)
    assert [r.cost.tp for r in eng.replicas] == tps
    assert all(isinstance(r.policy, IncrDec) for r in eng.replicas)
    out = eng.run()
    assert np.array_equal(out.replica_of, reqs["slo_class"] % num_replicas)
    assert (out.state.status == Status.FINISHED).all()
    for r in eng.replicas:
        mine = out.replica_of == r.index
        assert r.num_steps > 0 and (r.s.status[mine] == Status.FINISHED).all() and r.used_blocks == 0


@pytest.mark.parametrize(("kw", "message"), [
    ({"num_replicas": 0}, "num_replicas"),
    ({"num_replicas": 3, "tp_per_replica": [1, 1]}, "tp_per_replica"),
    ({"num_replicas": 2, "tp_per_replica": [1, 0]}, "tp_per_replica"),
])
def test_seppipe_rejects_bad_config(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SepPipe(**kw)


@pytest.mark.parametrize(("overrides", "tps"), [
    ([], [1, 1, 1]),  # tp_per_replica follows the run's tp: one "node" per category
    (["model=llama2-70b", "tp=4"], [4, 4, 4]),  # §6.3: Llama-2-70b, one 4-GPU node per category
    (["system.tp_per_replica=[2,1,1]"], [2, 1, 1]),
])
def test_seppipe_config_builds_one_replica_per_category(overrides: list[str], tps: list[int]) -> None:
    built = build(compose(["system=seppipe", "workload=adaserve_mix", "num_requests=10", *overrides]))
    assert [r.cost.tp for r in built.engine.replicas] == tps
    assert {type(r.policy) for r in built.engine.replicas} == {IncrDec}
    assert built.engine.replicas[0].policy is not built.engine.replicas[1].policy


# --- end to end on the AdaServe workload --------------------------------------------------------------------------

@pytest.mark.parametrize("system", ["incr_dec", "fcfs_slo", "stta", "seppipe"])
def test_end_to_end_on_adaserve_mix(system: str) -> None:
    res = run_point(compose([f"system={system}", "workload=adaserve_mix", "rps=2", "num_requests=60"]))
    reqs = res.requests
    assert reqs["finish_at"].notna().all()
    assert 0.0 <= res.metrics["slo_attainment"] <= 1.0
    assert set(reqs["slo_class"]) == {"urgent", "search", "chat"}
    if system == "seppipe":  # one pipeline per category
        assert reqs.groupby("slo_class")["replica"].nunique().eq(1).all()
        assert reqs["replica"].nunique() == 3


def test_seppipe_itself_schedules_nothing() -> None:
    with pytest.raises(RuntimeError, match=r"^SepPipe only routes: each of its replicas schedules with its own "
                                           r"policy$"):
        SepPipe(num_replicas=2, tp_per_replica=1).schedule(None)  # type: ignore[arg-type]
