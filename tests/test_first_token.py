"""The path to the first token as vLLM V1 serves it (conf/engine/vllm_v1.yaml): the API server's latency, the batch
queue of async scheduling, and the first drafts a speculating request's first token waits for. Hand-worked runs on
the vLLM V1 profile."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from repro.cost.serving import EngineProfile, load_engine
from repro.cost.spec import load_hardware, load_model
from repro.sim.deployment import Deployment
from repro.sim.engine import Engine, SimOutput
from systems.vllm_v1 import VLLMV1
from tests.conftest import FixedOracle, make_requests

FRONT = 0.005  # each way


def _v1(**changes: object) -> EngineProfile:
    """vLLM V1's profile without the API server's latency, its first drafts and async scheduling, unless given."""
    bare = {"frontend_in_s": 0.0, "frontend_out_s": 0.0, "first_token_drafts": False, "async_scheduling": False}
    return dataclasses.replace(load_engine("vllm_v1"), **{**bare, **changes})  # type: ignore[arg-type]


def _deployment(policy: VLLMV1, engine: EngineProfile) -> Deployment:
    """Llama-3-8B with a Llama-3.2-1B draft on an H100 under ``engine``."""
    return Deployment.of(policy, hardware=load_hardware("h100-80g"), model=load_model("llama3-8b"),
                         draft=load_model("llama3.2-1b"), engine=engine)


def _run(policy: VLLMV1, engine: EngineProfile, reqs: dict[str, np.ndarray], **kw: object) -> SimOutput:
    dep = _deployment(policy, engine)
    return Engine(deployment=dep, oracle=FixedOracle(), rng=np.random.default_rng(0), **reqs, **kw).run()  # type: ignore[arg-type]


def _ttft(out: SimOutput) -> np.ndarray:
    return out.state.first_token_at - out.state.arrival_s


@pytest.mark.parametrize("concurrency", [1, 2])
def test_ttft_in_a_closed_loop_of_two_identical_requests(concurrency: int) -> None:
    """Two identical requests released at t = 0 under ``--max-concurrency C``, on vLLM V1 with async scheduling.

    - C = 1: the first is sent at 0, reaches the idle engine 5 ms later and prefills alone (P1); its first token
      reaches the client 5 ms after the step: TTFT = P1 + 10 ms. The second is sent when the client has the first's
      last token, finds the engine idle, and has the same TTFT.
    - C = 2: both are sent at 0, reach the engine together and prefill in one step (P2): TTFT = P2 + 10 ms each.

    P1 and P2 are the engine's own prefill steps without the API server (the same runs with frontend 0).
    """
    reqs = make_requests(2, prompt_len=64, output_len=8)
    bare = _run(VLLMV1(), _v1(async_scheduling=True), reqs, max_concurrency=concurrency)
    served = _run(VLLMV1(), _v1(async_scheduling=True, frontend_in_s=FRONT, frontend_out_s=FRONT), reqs,
                  max_concurrency=concurrency)
    prefill = _ttft(bare)
    assert _ttft(served) == pytest.approx(prefill + 2 * FRONT, abs=1e-12)
    assert prefill[0] == pytest.approx(prefill[1], abs=1e-12)  # C = 1: each alone; C = 2: together
    if concurrency == 1:  # the second is sent when the client has the first's last token
        assert served.state.arrival_s[1] == pytest.approx(served.state.finish_at[0], abs=1e-12)
        latency = bare.state.finish_at[0] - bare.state.arrival_s[0]
        assert served.sim_time_s == pytest.approx(2 * (latency + 2 * FRONT), abs=1e-12)
    else:
        assert served.state.arrival_s.tolist() == [0.0, 0.0]


@pytest.mark.parametrize(("pipelined", "steps_later"), [(False, 1), (True, 2)])
def test_a_request_arriving_during_a_step_is_scheduled_one_or_two_steps_later(pipelined: bool,
                                                                              steps_later: int) -> None:
    """A request arrives in the middle of step n of another's decoding. Without async scheduling the scheduler sees
    it when step n ends and it prefills in step n + 1; with two batches in flight (async scheduling) step n + 1 was
    scheduled when step n started, so it prefills in step n + 2 (vLLM V1's step_with_batch_queue)."""
    reqs = make_requests(2, prompt_len=64, output_len=[40, 4])
    probe = _run(VLLMV1(), _v1(async_scheduling=pipelined), make_requests(1, prompt_len=64, output_len=40),
                 record_steps=True, fast_forward=False)
    ends = np.array([r.start_at + r.latency_s for r in probe.steps])  # step 0: its prefill; then its decodes
    n = 10  # arrive half-way through step n (the steps of the first request alone)
    reqs["arrival_s"][1] = 0.5 * (ends[n - 1] + ends[n])
    out = _run(VLLMV1(), _v1(async_scheduling=pipelined), reqs, record_steps=True, fast_forward=False)
    prefilled = next(i for i, r in enumerate(out.steps) if i and r.num_prefill)
    assert prefilled == n + steps_later
    step = out.steps[prefilled]
    assert out.state.first_token_at[1] == pytest.approx(step.start_at + step.latency_s, abs=1e-12)


@pytest.mark.parametrize("budget", [8192, 48])
def test_first_token_waits_for_its_first_k_drafts(budget: int) -> None:
    """With k = 3 drafts from a draft model, a request alone (C = 1): its first token is released after the step's
    drafter pass over the prompt and k - 1 = 2 more draft steps of one token each, at contexts 65 and 66, also where
    the prompt completes in a second chunk of 16 after one of 48 (a token budget of 48)."""
    reqs = make_requests(1, prompt_len=64, output_len=8)
    off = _run(VLLMV1(k=3, max_num_batched_tokens=budget), _v1(), reqs)
    on = _run(VLLMV1(k=3, max_num_batched_tokens=budget), _v1(first_token_drafts=True, draft_tokens=3), reqs)
    draft = _deployment(VLLMV1(k=3), _v1()).cost_model()
    two_steps = sum(draft.forward_s(1, 1, 64 + j, 0.0, 1, True, which="draft") for j in (1, 2))
    assert _ttft(on)[0] - _ttft(off)[0] == pytest.approx(two_steps, rel=1e-12)
    assert on.state.finish_at[0] - off.state.finish_at[0] == pytest.approx(two_steps, rel=1e-12)


def test_the_v1_system_sets_up_its_speculative_config() -> None:
    """Under the vLLM V1 profile a system's k is the run's num_speculative_tokens; the draft-model method runs
    without async scheduling, EAGLE keeps it; the capture sizes become multiples of 1 + k."""
    from repro.sim.deployment import scheduled_with

    on = dataclasses.replace(load_engine("vllm_v1"), async_scheduling=True)
    draft = scheduled_with(on, VLLMV1(k=3, proposer="draft"))
    eagle = scheduled_with(on, VLLMV1(k=3, proposer="eagle"))
    assert (draft.async_scheduling, eagle.async_scheduling) == (False, True)
    assert draft.draft_tokens == 3
    assert all(n % 4 == 0 for n in eagle.graph_sizes) and eagle.graph_sizes[:3] == (4, 8, 16)
    assert eagle.graph_sizes[-1] == eagle.graph_max_tokens == 512
    five = scheduled_with(on, VLLMV1(k=4, proposer="eagle"))
    assert five.graph_sizes[-1] == five.graph_max_tokens == 500  # 496 -> 500; 512 -> 515, past the largest size
    assert scheduled_with(on, VLLMV1(k=0)) is on


@pytest.mark.parametrize("decoding", [1, 2])
def test_a_first_tokens_drafts_share_the_passes_of_the_requests_drafting_k(decoding: int) -> None:
    """Request B's prompt completes in a step where ``decoding`` requests decode with k = 3 drafts: B's draft steps 2
    and 3 run in the same passes as theirs (one token each), so the step's drafting grows by their marginal cost,
    the pass with B less the pass without, at the decoders' contexts c (64 + their tokens - 1 each) and B's 64."""
    n = 10
    draft = _deployment(VLLMV1(k=3), _v1()).cost_model()

    def step_of_b(profile: EngineProfile) -> tuple[int, float]:
        probe = _run(VLLMV1(k=3), profile, make_requests(decoding, prompt_len=64, output_len=40), record_steps=True,
                     fast_forward=False)
        ends = np.array([r.start_at + r.latency_s for r in probe.steps])
        reqs = make_requests(decoding + 1, prompt_len=64, output_len=[40] * decoding + [4])
        reqs["arrival_s"][decoding] = 0.5 * (ends[n - 1] + ends[n])
        out = _run(VLLMV1(k=3), profile, reqs, record_steps=True, fast_forward=False)
        i = next(i for i, r in enumerate(out.steps) if i and r.num_prefill)
        assert out.steps[i].num_decode == decoding
        return i, out.steps[i].draft_s

    i_off, off = step_of_b(_v1())
    i_on, on = step_of_b(_v1(first_token_drafts=True, draft_tokens=3))
    assert i_off == i_on == n + 1
    d = decoding
    c = d * (64 + (n + 1) - 1)  # each decoder has emitted n + 1 tokens (FixedOracle accepts none)
    marginal = sum(draft.forward_s(d + 1, d + 1, c + 64 + (d + 1) * j, 0.0, d + 1, True, which="draft")
                   - draft.forward_s(d, d, c + d * j, 0.0, d, True, which="draft") for j in (1, 2))
    assert on - off == pytest.approx(marginal, rel=1e-9)
    assert 0.0 < marginal < sum(draft.forward_s(1, 1, 64 + j, 0.0, 1, True, which="draft") for j in (1, 2))


def test_prompt_lookup_has_no_first_drafts_to_wait_for() -> None:
    reqs = make_requests(1, prompt_len=64, output_len=8)
    off = _run(VLLMV1(k=3, proposer="pld"), _v1(), reqs)
    on = _run(VLLMV1(k=3, proposer="pld"), _v1(first_token_drafts=True, draft_tokens=3), reqs)
    assert _ttft(on)[0] == _ttft(off)[0]
