"""LAPS-SD (Algorithm 1) and its baselines FCFS, LP-SJF and LAS: hand-computable cases."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from repro.sim.plan import StepPlan, StepResult, ids
from repro.sim.policy import Policy
from repro.sim.state import RequestState, Status, View
from systems.fcfs import FCFS
from systems.laps_sd import LAPSSD, estimate_s, is_stable, queue_of, thresholds
from systems.las import LAS
from systems.lib import LogNormalLengthPredictor, pending_tokens, serve_in_order
from systems.lp_sjf import LPSJF
from tests.conftest import FixedOracle, make_cost, make_engine, make_requests, spy


def summarize_requests(out: Any) -> dict[str, float]:
    from repro.experiments.simulate import requests_frame
    from repro.metrics.summary import summarize

    table = type("Table", (), {"classes": None, "slo_class": np.zeros(out.state.n, dtype=np.int64),
                               "dataset": "x"})()
    return summarize(requests_frame(out, table), out.sim_time_s)

# the paper's deployment: LLaMA-7B verifying LLaMA-68M's drafts on one L20 (LAPS-SD §5.1)
PAPER = {"hardware": "l20", "model": "llama2-7b", "draft": "llama-68m", "engine": "vllm_v1"}
# KV bytes per token: 2 (K, V) × layers × hidden × 2 bytes: LLaMA-7B 2·32·4096·2, LLaMA-68M 2·2·768·2
KV_7B, KV_68M = 524_288, 6_144
L20_HOST_LINK = 25e9  # bytes/s, conf/hardware/l20.yaml


def run_paper(policy: Policy, reqs: dict[str, np.ndarray], accept: int = 2, **kw: Any) -> tuple[
        Any, list[StepPlan], list[StepResult]]:
    plans, results = spy(policy)
    eng = make_engine(policy, reqs, oracle=FixedOracle(accept), **PAPER, **kw)
    return eng.run(), plans, results


# --- §4.2: thresholds and demotion ----------------------------------------------------------------------------

def test_thresholds_are_exponential() -> None:
    # S_j^up = M^(j-1) S_1^up for j = 1..K-1 (Q_K unbounded): K = 4, M = 2, S_1^up = 0.25 s
    assert thresholds(4, 2.0, 0.25) == pytest.approx([0.25, 0.5, 1.0])
    assert thresholds(3, 3.0, 0.1) == pytest.approx([0.1, 0.3])
    assert thresholds(1, 2.0, 0.25).size == 0


@pytest.mark.parametrize(("attained_s", "queue"), [
    (0.0, 0),     # a new request: Q1
    (0.2499, 0),  # below S_1^up
    (0.25, 1),    # reaching S_1^up demotes to Q2 (S_2^down = S_1^up)
    (0.4999, 1),
    (0.5, 2),
    (0.99, 2),
    (1.0, 3),     # Q_K = Q4 holds everything beyond S_3^up
    (1e6, 3),
])
def test_queue_of_attained_service(attained_s: float, queue: int) -> None:
    assert int(queue_of(np.array([attained_s]), thresholds(4, 2.0, 0.25))[0]) == queue


def test_demotion_after_the_round_that_reaches_the_threshold() -> None:
    # two requests arrive together; request 0 runs (FCFS in Q1) until its attained service reaches S_1^up, then it is
    # demoted to Q2 and request 1 (still in Q1) preempts it: the switch comes after the first round that crosses
    first = 0.3
    pol = LAPSSD(num_queues=2, first_threshold_s=first, gamma=10_000)  # never perceptible: always preemptible
    out, _, results = run_paper(pol, make_requests(2, prompt_len=32, output_len=200))
    served = 0.0
    for res in results:
        ran = np.concatenate([res.prefill_ids, res.decode_ids]).tolist()
        if ran == [1]:
            break
        assert ran == [0]
        assert served < first  # request 0 was still in Q1 when this round was scheduled
        served += res.draft_s + res.verify_s
    assert served >= first  # ... and crossed S_1^up in its last round
    assert out.state.num_preemptions[0] >= 1


# --- §4.3: the stability rule ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("rates", "gamma", "delta", "stable"), [
    ([0.50, 0.52, 0.51, 0.53, 0.50], 5, 0.05, True),   # spread 0.03 < 0.05
    ([0.50, 0.55, 0.51, 0.53, 0.50], 5, 0.05, False),  # spread 0.05 is not below δ
    ([0.50, 0.50, 0.50, 0.50], 5, 0.05, False),        # fewer than γ rounds
    ([0.10, 0.50, 0.50, 0.50, 0.50, 0.50], 5, 0.05, True),  # only the last γ rounds count
    ([0.50, 0.50, 0.50, 0.50, 0.90], 5, 0.05, False),  # the latest round moved
    ([0.3, 0.6], 2, 0.5, True),
    ([0.5, 0.75], 2, 0.25, False),  # a spread of exactly δ is not below it
])
def test_stability_rule(rates: list[float], gamma: int, delta: float, stable: bool) -> None:
    assert is_stable(rates, gamma, delta) is stable


@pytest.mark.parametrize(("accept", "k", "gamma", "rate"), [
    (2, 4, 5, 0.5),   # 2 of 4 accepted every round: the cumulative rate is 0.5 from round 1, stable at round γ
    (1, 4, 3, 0.25),
])
def test_request_becomes_perceptible_after_gamma_steady_rounds(accept: int, k: int, gamma: int, rate: float) -> None:
    pol = LAPSSD(k=k, gamma=gamma, delta=0.01, first_threshold_s=100.0)
    _, _, results = run_paper(pol, make_requests(1, output_len=400), accept=accept)
    rounds = [r for r in results if r.decode_ids.size]
    assert len(rounds) > gamma
    assert bool(pol.perceptible[0])
    assert pol.accept_pred[0] == pytest.approx(rate)  # A_i: the mean of the γ rates
    # and not earlier: a fresh policy stopped after γ − 1 rounds has not called it stable
    early = LAPSSD(k=k, gamma=gamma, delta=0.01, first_threshold_s=100.0)
    run_paper(early, make_requests(1, output_len=1 + (accept + 1) * (gamma - 1)), accept=accept)
    assert not bool(early.perceptible[0])


def test_no_request_is_stable_before_its_first_accepted_token() -> None:
    """γ rounds of nothing accepted are γ equal rates (0), which the literal rule calls stable with A_i = 0; the
    guard waits for an accepted token, and the history that follows it decides."""
    never = LAPSSD(k=2, gamma=4, delta=0.01, first_threshold_s=100.0)
    run_paper(never, make_requests(1, output_len=60), accept=0)
    assert not bool(never.perceptible[0]) and np.isnan(never.accept_pred[0])
    late = LAPSSD(k=4, gamma=3, delta=0.2, first_threshold_s=100.0)
    make_engine(late, make_requests(1, output_len=300), oracle=LateOracle(zeros=5, then=2), **PAPER).run()
    assert bool(late.perceptible[0]) and late.accept_pred[0] > 0.0


class LateOracle(FixedOracle):
    """Accepts nothing for ``zeros`` rounds, then ``then`` draft tokens every round."""

    def __init__(self, zeros: int, then: int) -> None:
        super().__init__(0)
        self.zeros, self.then = zeros, then

    def score_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                    proposer: str = "draft") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.accept = 0 if len(self.calls) < self.zeros else self.then
        return super().score_chain(rids, pos, k, proposer)


class AlternatingOracle(FixedOracle):
    """Accepts 2, 1, 2, 1, ... draft tokens on successive rounds."""

    def score_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                    proposer: str = "draft") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.accept = 2 if len(self.calls) % 2 == 0 else 1
        return super().score_chain(rids, pos, k, proposer)


def test_predicted_acceptance_is_the_mean_over_the_gamma_rounds() -> None:
    # k = 4, accepted 2, 1, 2, 1: cumulative rates 2/4, 3/8, 5/12, 6/16 (spread 0.125 < δ = 0.2 at round γ = 4)
    pol = LAPSSD(k=4, gamma=4, delta=0.2, first_threshold_s=100.0)
    make_engine(pol, make_requests(1, output_len=200), oracle=AlternatingOracle(), **PAPER).run()
    assert bool(pol.perceptible[0])
    assert pol.accept_pred[0] == pytest.approx(np.mean([2 / 4, 3 / 8, 5 / 12, 6 / 16]))


# --- Eq. (6) ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("length", "accept", "n", "t_ssm", "t_llm", "expected"), [
    (100, 0.5, 4, 0.001, 0.020, 100 / 3 * (4 * 0.001 + 0.020)),  # nA + 1 = 3 tokens a round: 33.3 rounds → 0.8 s
    (100, 0.0, 4, 0.001, 0.020, 100 * (0.004 + 0.020)),          # nothing accepted: one token a round
    (100, 1.0, 4, 0.001, 0.020, 20 * (0.004 + 0.020)),           # everything accepted: n + 1 = 5 tokens a round
    (30, 0.25, 2, 0.002, 0.010, 30 / 1.5 * (2 * 0.002 + 0.010)),
])
def test_eq6_estimate(length: int, accept: float, n: int, t_ssm: float, t_llm: float, expected: float) -> None:
    assert estimate_s(length, accept, n, t_ssm, t_llm) == pytest.approx(expected)
    # the two terms as the equation labels them: speculation n·L·T_SSM/(nA+1), verification L·T_LLM/(nA+1)
    spec = n * length * t_ssm / (n * accept + 1)
    verify = length * t_llm / (n * accept + 1)
    assert estimate_s(length, accept, n, t_ssm, t_llm) == pytest.approx(spec + verify)


def test_eq6_uses_the_predicted_length_and_observed_step_times() -> None:
    # σ = 0: the predicted length is the true one; T_SSM and T_LLM are the means over the rounds observed until the
    # request became stable (draft seconds per speculated token, verification seconds per round)
    k, gamma = 4, 5
    pol = LAPSSD(k=k, gamma=gamma, delta=0.01, first_threshold_s=100.0, length_error_sigma=0.0)
    _, _, results = run_paper(pol, make_requests(1, output_len=300), accept=2)
    rounds = [r for r in results if r.decode_ids.size][:gamma]
    t_ssm = np.mean([r.draft_s / k for r in rounds])
    t_llm = np.mean([r.verify_s for r in rounds])
    assert pol.pred_len[0] == 300
    assert pol.estimate[0] == pytest.approx(300 / (k * 0.5 + 1) * (k * t_ssm + t_llm))


def test_the_estimate_reaches_the_requests_table() -> None:
    # Fig. 7 reads Eq. 6's estimate from the requests table (estimate_s; NaN for a request that finished before it
    # became perceptible) and compares it with the service the request got: here the estimate is exact up to the
    # prefill step and the last round (acceptance and step times are constant), so the error is small.
    pol = LAPSSD(k=4, gamma=3, delta=0.01, first_threshold_s=100.0, length_error_sigma=0.0)
    out, _, _ = run_paper(pol, make_requests(2, output_len=[300, 2]), accept=2)
    cols = out.request_columns
    assert cols["estimate_s"][0] == pytest.approx(pol.estimate[0]) and np.isnan(cols["estimate_s"][1])
    assert cols["predicted_output_len"].tolist() == [300.0, 2.0]
    err = abs(cols["estimate_s"][0] - out.state.service_s[0]) / out.state.service_s[0]
    assert err < 0.05
    # when it became perceptible: after γ = 3 rounds of 2 accepted + 1 bonus token each, plus the prefill's token
    assert cols["stable_rounds"][0] == 3 and cols["stable_tokens"][0] == 3 * 3 + 1
    assert np.isnan(cols["stable_rounds"][1]) and np.isnan(cols["stable_tokens"][1])


# --- §4.3: perceptible first, SJF among them, then FCFS -------------------------------------------------------

def _view(n: int, arrival_s: list[float]) -> View:
    reqs = make_requests(n)
    reqs["arrival_s"] = np.asarray(arrival_s, dtype=np.float64)
    state = RequestState(**reqs)
    state.status[:] = Status.WAITING
    state.waiting.extend(range(n))
    return View(state, block_size=16, max_model_len=4096, cost=make_cost(**PAPER), drafter=None)


# thresholds 0.25 / 0.5 / 1.0 s: Q1 [0, 0.25), Q2 [0.25, 0.5), Q3 [0.5, 1.0), Q4 [1.0, ∞)
@pytest.mark.parametrize(("attained", "perceptible", "estimate", "order"), [
    # one queue (Q2 by attained 0.3, Q2 by perceived 0.45 and 0.3): perceptible requests first by shortest T̃
    # (2 then 1), then the others by arrival (0 then 3)
    ([0.3, 0.3, 0.3, 0.3], [False, True, True, False], [np.inf, 0.45, 0.3, np.inf], [2, 1, 0, 3]),
    # SJF is by estimate, not by arrival (all four perceived in Q4)
    ([0.0, 0.0, 0.0, 0.0], [True, True, True, True], [3.0, 1.0, 4.0, 2.0], [1, 3, 0, 2]),
    # a perceptible request sits in the queue of its perceived service, not its attained one: request 2 (attained
    # 0.6, perceived 0.1: Q1) first, request 0 (attained 0.3, perceived 9.0: Q4) last, behind the non-perceptible
    # request 1 (attained 0.3: Q2); in Q1 the perceptible request 2 goes before the non-perceptible request 3
    ([0.3, 0.3, 0.6, 0.0], [True, False, True, False], [9.0, np.inf, 0.1, np.inf], [2, 3, 1, 0]),
    # non-perceptible requests FCFS: arrival 2.0, 0.5, 1.0 → 1, 2, 0
    ([0.0, 0.0, 0.0], [False, False, False], [np.inf] * 3, [1, 2, 0]),
])
def test_order_perceptible_first_then_fcfs(attained: list[float], perceptible: list[bool], estimate: list[float],
                                           order: list[int]) -> None:
    n = len(attained)
    arrival = [2.0, 0.5, 1.0] if n == 3 else [0.0, 1.0, 2.0, 3.0]
    view = _view(n, arrival)
    pol = LAPSSD(num_queues=4, growth=2.0, first_threshold_s=0.25)
    pol._grow(n)
    pol.attained_s[:] = attained
    pol.perceptible[:] = perceptible
    pol.estimate[:] = estimate
    assert pol.order(view).tolist() == order


# --- only non-perceptible requests are preempted --------------------------------------------------------------

@pytest.mark.parametrize(("gamma", "preempted"), [
    (2, False),       # request 0 is perceptible after 2 rounds: request 1, arriving later in Q1, waits for it
    (10_000, True),   # request 0 never becomes perceptible: request 1 preempts it once it is demoted
])
def test_only_non_perceptible_requests_are_preempted(gamma: int, preempted: bool) -> None:
    reqs = make_requests(2, prompt_len=32, output_len=200, gap_s=0.5)  # request 1 arrives after 0.5 s
    pol = LAPSSD(num_queues=3, first_threshold_s=0.05, gamma=gamma, delta=0.01)
    out, _, _ = run_paper(pol, reqs)
    s = out.state
    assert bool(s.num_preemptions[0] > 0) is preempted
    if not preempted:
        assert s.num_preemptions[1] == 0  # (otherwise both end non-perceptible in Q3, FCFS: 0 takes it back)
    assert bool(s.finish_at[0] > s.first_token_at[1]) is preempted  # without preemption 0 finishes before 1 starts


def test_preempted_requests_are_never_perceptible() -> None:
    # A request is preempted only while non-perceptible, or in the decision right after the round that made it
    # perceptible (it moves to the queue of its perceived service then); never after it ran as a perceptible one.
    out_len = [40, 300, 120, 60, 250, 90, 30, 180]
    reqs = make_requests(8, prompt_len=64, output_len=out_len, gap_s=0.2)
    pol = LAPSSD(num_queues=4, first_threshold_s=0.05, gamma=3, delta=0.05)
    checked = []
    schedule = pol.schedule

    def check(view: View) -> StepPlan:
        settled = pol.perceptible & ~pol.fresh if pol._n else np.zeros(0, dtype=bool)
        plan = schedule(view)
        if plan.preempt_ids.size:
            assert not settled[plan.preempt_ids].any()
            assert plan.preempt_mode == "swap"
            checked.append(plan.preempt_ids.size)
        return plan

    pol.schedule = check  # type: ignore[method-assign]
    out = make_engine(pol, reqs, oracle=FixedOracle(1), **PAPER).run()
    assert (out.state.status == Status.FINISHED).all()
    assert checked, "the case must preempt at least once"


def test_a_request_that_becomes_perceptible_moves_to_its_perceived_queue() -> None:
    # Request 0 (300 tokens) runs alone, becomes perceptible after 2 steady rounds (a fixed acceptance gives equal
    # rates) with an estimate far above S_1^up, so it moves to the last queue; request 1 arrives while it is still
    # in Q1 by attained service. With placement by attained service, 0 would be pinned and run to the end first;
    # by perceived service, 1 (non-perceptible, Q1) overtakes it once, then 0 runs to completion unpreempted.
    reqs = make_requests(2, prompt_len=32, output_len=[300, 20], gap_s=0.06)
    pol = LAPSSD(num_queues=3, first_threshold_s=0.5, gamma=2, delta=0.01)
    out, _, _ = run_paper(pol, reqs)
    s = out.state
    assert pol.perceptible[0] and pol.estimate[0] > pol.upper_s[-1]
    assert s.num_preemptions[0] == 1  # moved once, at the transition
    assert s.finish_at[1] < s.finish_at[0]


# --- the cost of a preemption: KV bytes over the host link ---------------------------------------------------

def test_swap_cost_is_kv_bytes_over_the_host_link() -> None:
    # LAS, requests 0 (prompt 32) and 1 (prompt 48) arriving together, nothing accepted (one token a round).
    # step 1: prefill 0. step 2: 1 has less service: swap 0 out (32 tokens of target + draft KV), prefill 1.
    # step 3: 0 has less service (a shorter prefill): swap 1 out (48 tokens), swap 0 back in (32 tokens).
    reqs = make_requests(2, prompt_len=[32, 48], output_len=8)
    _, plans, results = run_paper(LAS(k=4), reqs, accept=0)
    per_token_s = (KV_7B + KV_68M) / L20_HOST_LINK
    assert plans[0].prefill_ids.tolist() == [0] and results[0].memory_s == 0.0
    assert plans[1].preempt_ids.tolist() == [0] and plans[1].prefill_ids.tolist() == [1]
    assert results[1].memory_s == pytest.approx(32 * per_token_s)
    assert plans[2].preempt_ids.tolist() == [1] and plans[2].swap_in_ids.tolist() == [0]
    assert results[2].memory_s == pytest.approx((48 + 32) * per_token_s)
    assert results[2].end_at - results[2].start_at == pytest.approx(
        results[2].memory_s + results[2].draft_s + results[2].verify_s)


def test_service_and_swap_time_per_request() -> None:
    # At batch 1 a request's service_s is the drafting + verification time of the steps it ran in, and its swap_s the
    # transfers of its own KV; summed over requests they are the run's compute and memory time (LAS swaps only).
    reqs = make_requests(3, prompt_len=[32, 48, 40], output_len=[10, 6, 8])
    out, plans, results = run_paper(LAS(k=4), reqs, accept=1)
    s = out.state
    ran = {r: 0.0 for r in range(3)}
    for res in results:
        for rid in np.concatenate([res.prefill_ids, res.decode_ids]).tolist():
            ran[rid] += res.draft_s + res.verify_s
    np.testing.assert_allclose(s.service_s, [ran[r] for r in range(3)])
    assert s.swap_s.sum() == pytest.approx(sum(r.memory_s for r in results))
    per_token_s = (KV_7B + KV_68M) / L20_HOST_LINK
    first_out = plans[1].preempt_ids.tolist()
    assert first_out == [0] and s.swap_s[0] >= 2 * 32 * per_token_s  # out after its prefill, and back in
    metrics = summarize_requests(out)
    assert metrics["switch_overhead"] == pytest.approx(s.swap_s.sum() / s.service_s.sum())


# --- serve_in_order: the per-request form against the vectorized one it replaced --------------------------------

def _serve_in_order_reference(view: View, order: np.ndarray, *, max_batch: int, k: int,
                              pinned: np.ndarray) -> StepPlan:
    """serve_in_order as written before it went request by request (pending_tokens and View.blocks_for)."""
    if order.size == 0:
        return StepPlan()
    pin = set(pinned.tolist())
    rest = [r for r in order.tolist() if r not in pin]
    chosen = [r for r in order.tolist() if r in pin] + rest[: max(max_batch - len(pin), 0)]
    batch_set = set(chosen)
    victims = ids([r for r in view.running.tolist() if r not in batch_set and r not in pin])
    free = view.free_blocks + int(view.kv_blocks[victims].sum())
    kept: list[int] = []
    cand = ids(chosen)
    needs = view.blocks_for(cand, np.maximum(pending_tokens(view, cand), 1 + k)).tolist()
    for rid, need in zip(chosen, needs, strict=True):
        if need > free and rid not in pin:
            break
        free -= need
        kept.append(rid)
    batch = ids(kept)
    st = view.status(batch)
    back = batch[st == Status.SWAPPED]
    todo = pending_tokens(view, batch)
    pre = batch[(st != Status.SWAPPED) & (todo > 1) | (st == Status.WAITING)]
    if pre.size:
        return StepPlan(prefill_ids=pre, prefill_tokens=pending_tokens(view, pre), preempt_ids=victims,
                        preempt_mode="swap", swap_in_ids=back, draft_sync=True)
    return StepPlan(decode_ids=batch, k=np.full(batch.size, k, dtype=np.int64), preempt_ids=victims,
                    preempt_mode="swap", swap_in_ids=back)


def _plan_fields(plan: StepPlan) -> dict[str, Any]:
    return {name: (getattr(plan, name).tolist() if isinstance(getattr(plan, name), np.ndarray)
                   else getattr(plan, name)) for name in StepPlan.__slots__}


@pytest.mark.parametrize("seed", range(40))
def test_serve_in_order_matches_the_vectorized_reference(seed: int) -> None:
    # random queues (waiting requests, running ones prefilling or decoding, swapped ones), KV, order and pins
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 9))
    state = RequestState(**make_requests(n, prompt_len=rng.integers(1, 80, n).tolist()))
    status = rng.choice([Status.WAITING, Status.RUNNING, Status.SWAPPED], n)
    state.status[:] = status
    state.num_generated[:] = np.where(status == Status.WAITING, 0, rng.integers(0, 40, n))
    tokens = state.prompt_len + state.num_generated
    decoding = rng.random(n) < 0.7
    state.num_computed[:] = np.where(status == Status.WAITING, 0,
                                     np.where(decoding, tokens - 1, rng.integers(0, tokens)))
    state.kv_blocks[:] = np.where(status == Status.RUNNING, -(-state.num_computed // 16) + rng.integers(0, 2, n), 0)
    for rid in rng.permutation(n).tolist():
        {Status.WAITING: state.waiting, Status.RUNNING: state.running,
         Status.SWAPPED: state.swapped}[Status(int(status[rid]))].append(rid)
    view = View(state, block_size=16, max_model_len=4096, cost=make_cost(**PAPER), drafter=None)
    view.free_blocks = int(rng.integers(0, 12))
    order = rng.permutation(n).astype(np.int64)
    running = np.asarray(state.running, dtype=np.int64)
    pinned = running[rng.random(running.size) < 0.5]
    for max_batch, k in [(1, 4), (2, 1), (3, 5), (n, 2)]:
        kw: dict[str, Any] = {"max_batch": max_batch, "k": k, "pinned": pinned}
        assert _plan_fields(serve_in_order(view, order, **kw)) == _plan_fields(
            _serve_in_order_reference(view, order, **kw))
        kw["pinned"] = ids()
        assert _plan_fields(serve_in_order(view, order, **kw)) == _plan_fields(
            _serve_in_order_reference(view, order, **kw))


# --- the baselines ---------------------------------------------------------------------------------------------

def test_las_preempts_every_round() -> None:
    # two equal requests: after each round the one that ran has more service, so the other runs the next round
    _, plans, results = run_paper(LAS(k=4), make_requests(2, prompt_len=32, output_len=12), accept=0)
    both = [r.decode_ids.tolist() for r in results if r.decode_ids.size][: 2 * 10]
    assert all(len(d) == 1 for d in both)
    assert all(a != b for a, b in itertools.pairwise(both))
    swaps = [p for p in plans if p.decode_ids.size and p.preempt_ids.size]
    assert len(swaps) >= len(both) - 1


@pytest.mark.parametrize(("policy", "finish_order"), [
    (LPSJF(k=4, length_error_sigma=0.0), [1, 3, 2, 0]),  # shortest predicted output first (σ = 0: the truth)
    (FCFS(k=4), [0, 1, 2, 3]),                             # arrival order
])
def test_non_preemptive_baselines(policy: Policy, finish_order: list[int]) -> None:
    reqs = make_requests(4, prompt_len=32, output_len=[40, 10, 30, 20])
    out, plans, _ = run_paper(policy, reqs)
    assert all(p.preempt_ids.size == 0 for p in plans)  # never preempts
    assert (out.state.num_preemptions == 0).all()
    assert np.argsort(out.state.finish_at).tolist() == finish_order


def test_lp_sjf_never_preempts_a_long_request_for_a_short_one() -> None:
    # the long request starts alone; a much shorter one arriving later waits for it
    reqs = make_requests(2, prompt_len=32, output_len=[300, 5], gap_s=0.1)
    out, _, _ = run_paper(LPSJF(k=4, length_error_sigma=0.0), reqs)
    assert out.state.num_preemptions.sum() == 0
    assert out.state.finish_at[0] < out.state.first_token_at[1]


# --- the length predictor and the configs ----------------------------------------------------------------------

def test_length_predictor() -> None:
    rids = np.arange(6)
    true = np.array([10, 100, 200, 300, 400, 1])
    assert (LogNormalLengthPredictor(0.0, seed=3).predict(rids, true) == true).all()
    a = LogNormalLengthPredictor(0.5, seed=3).predict(rids, true)
    assert (a == LogNormalLengthPredictor(0.5, seed=3).predict(rids[::-1], true[::-1])[::-1]).all()  # per request
    assert (a != true).any() and (a >= 1).all()
    assert (a != LogNormalLengthPredictor(0.5, seed=4).predict(rids, true)).any()


def test_lp_sjf_and_laps_sd_share_the_predictions() -> None:
    reqs = make_requests(6, output_len=[50, 60, 70, 80, 90, 100])
    a, b = LAPSSD(length_error_sigma=0.4), LPSJF(length_error_sigma=0.4)
    make_engine(a, reqs, oracle=FixedOracle(2), **PAPER).run()
    make_engine(b, reqs, oracle=FixedOracle(2), **PAPER).run()
    assert (a.pred_len == b.pred_len).all()


@pytest.mark.parametrize(("cls", "kwargs", "key"), [
    (LAPSSD, {"num_queues": 0}, "num_queues"),
    (LAPSSD, {"growth": 1.0}, "growth"),
    (LAPSSD, {"first_threshold_s": 0.0}, "first_threshold_s"),
    (LAPSSD, {"gamma": 0}, "gamma"),
    (LAPSSD, {"delta": 0.0}, "delta"),
    (LAPSSD, {"max_batch": 0}, "max_batch"),
    (LAPSSD, {"length_error_sigma": -1.0}, "length_error_sigma"),
    (LPSJF, {"length_error_sigma": float("nan")}, "length_error_sigma"),
    (LAS, {"k": 0}, "k"),
    (FCFS, {"max_batch": 2.5}, "max_batch"),
])
def test_bad_config_names_the_key(cls: type, kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        cls(**kwargs)


@pytest.mark.parametrize("policy", [LAPSSD(max_batch=3), LAS(max_batch=3), LPSJF(max_batch=3), FCFS(max_batch=3)])
def test_batched_extension(policy: Policy) -> None:
    reqs = make_requests(8, prompt_len=32, output_len=[40, 10, 30, 20, 50, 15, 25, 35], gap_s=0.05)
    out, plans, _ = run_paper(policy, reqs)
    assert (out.state.status == Status.FINISHED).all()
    assert max(p.num_seqs for p in plans) <= 3
    assert any(p.decode_ids.size > 1 for p in plans)
