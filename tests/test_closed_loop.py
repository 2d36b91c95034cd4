"""The closed loop (``max_concurrency``, vLLM's ``--max-concurrency``): hand-computed runs, its equivalences with the
open loop and with itself step by step, latencies from the send, and its config checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from repro.core.errors import ConfigError
from repro.experiments.simulate import build, compose, requests_frame
from repro.metrics.summary import summarize
from repro.sim.client import ClosedLoop
from repro.sim.engine import SimOutput
from systems.vllm import VLLM
from tests.conftest import make_requests, run

# the subject does not depend on where the workload comes from: pinned to the embedded statistics
# (conftest.no_data), so CI's no-data pass need not repeat it
pytestmark = pytest.mark.usefixtures("no_data")

STATE = ("status", "num_generated", "num_computed", "first_token_at", "first_decode_at", "finish_at",
         "last_token_at", "num_proposed", "num_accepted", "num_decode_steps", "num_preemptions", "service_s")


# --- the client alone ---------------------------------------------------------------------------------------------

def test_the_client_sends_in_release_order_as_slots_free() -> None:
    sent = np.array([0.0, 0.0, 1.0, 2.0])
    gate = ClosedLoop(2, sent)
    assert gate.release(0, 0.0) and gate.release(1, 0.0)  # two slots: both at once
    assert not gate.release(2, 1.0) and not gate.release(3, 2.0)  # both wait, 2 first
    gate.finished([5.0, 3.0])
    assert gate.next_free() == 3.0
    assert gate.free() == 2 and sent[2] == 3.0  # the earliest finish frees a slot: the longest waiter is sent then
    assert gate.free() == 3 and sent[3] == 5.0
    gate.finished([6.0])
    assert gate.free() is None and gate.in_flight == 1  # nobody waits: the slot stays free
    assert gate.never_waits(1) and not gate.never_waits(2)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_the_client_refuses_a_limit_that_is_not_a_positive_integer(bad: Any) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        ClosedLoop(bad, np.zeros(1))


# --- hand-computed runs -----------------------------------------------------------------------------------------

def test_one_slot_serves_the_requests_one_after_the_other() -> None:
    """Four equal requests released together at t = 0 (rate = inf), C = 1: each runs alone for the time T one
    request takes (the open loop's run of a single request), sent as the one before finishes: finishes at T, 2T, 3T,
    4T, every latency T (counted from the send, not the release)."""
    alone = run(VLLM(), make_requests(1, prompt_len=32, output_len=5)).state.finish_at[0]
    out = run(VLLM(), make_requests(4, prompt_len=32, output_len=5), max_concurrency=1)
    s = out.state
    assert s.finish_at.tolist() == pytest.approx([alone, 2 * alone, 3 * alone, 4 * alone])
    assert s.arrival_s[1:].tolist() == s.finish_at[:-1].tolist()  # each sent at the instant the one before finished
    assert (s.finish_at - s.arrival_s).tolist() == pytest.approx([alone] * 4)
    assert out.released_at is not None and out.released_at.tolist() == [0.0] * 4
    assert out.sim_time_s == s.finish_at[-1]


def test_two_slots_serve_the_requests_two_by_two() -> None:
    """The same four requests with C = 2: two batches of two, the second sent when the first finishes."""
    pair = run(VLLM(), make_requests(2, prompt_len=32, output_len=5)).state.finish_at
    s = run(VLLM(), make_requests(4, prompt_len=32, output_len=5), max_concurrency=2).state
    assert s.finish_at[:2].tolist() == pair.tolist()
    assert s.arrival_s.tolist() == [0.0, 0.0, pair[0], pair[1]]
    assert s.finish_at[2:].tolist() == pytest.approx((2 * pair).tolist())


def test_a_request_released_into_a_free_slot_is_sent_at_its_release() -> None:
    """Requests 1 s apart, each done well within 1 s: the limit C = 1 never binds, the run is the open loop's."""
    reqs = make_requests(3, prompt_len=32, output_len=5, gap_s=1.0)
    open_, closed = run(VLLM(), reqs).state, run(VLLM(), reqs, max_concurrency=1).state
    assert closed.arrival_s.tolist() == [0.0, 1.0, 2.0]
    assert closed.finish_at.tolist() == open_.finish_at.tolist()


# --- whole runs from configs ------------------------------------------------------------------------------------

WORKLOAD = ["workload=sharegpt", "num_requests=40", "seed=1"]


def _run(overrides: list[str], fast_forward: bool = True) -> tuple[SimOutput, Any]:
    built = build(compose(overrides))
    for rep in built.engine.replicas:
        rep.fast_forward = rep.fast_forward and fast_forward
    return built.engine.run(), built.table


@pytest.mark.parametrize("system", ["vllm", "static_sd_k3"])
def test_one_slot_never_overlaps_two_requests(system: str) -> None:
    """C = 1 under Poisson releases: no two [send, finish] intervals overlap, and each request is sent at its release
    or at the previous request's finish, whichever is later."""
    out, table = _run([f"system={system}", "rps=2", "max_concurrency=1", *WORKLOAD])
    s = out.state
    sent, fin = s.arrival_s, s.finish_at
    assert (fin[:-1] <= sent[1:]).all()  # (sent in release order)
    expect = np.maximum(table.arrival_s[1:], fin[:-1])
    assert sent[1:].tolist() == expect.tolist() and sent[0] == table.arrival_s[0]
    assert out.released_at is not None and out.released_at.tolist() == table.arrival_s.tolist()
    assert (sent > table.arrival_s).sum() > 10  # (the limit binds: most requests waited)


@pytest.mark.parametrize("limit", [40, 41, 1000])
def test_a_limit_of_at_least_the_requests_is_the_open_loop(limit: int) -> None:
    open_, _ = _run(["system=static_sd_k3", "rps=8", *WORKLOAD])
    closed, _ = _run(["system=static_sd_k3", "rps=8", f"max_concurrency={limit}", *WORKLOAD])
    for name in ("arrival_s", *STATE):
        assert np.array_equal(getattr(open_.state, name), getattr(closed.state, name), equal_nan=True), name
    assert closed.sim_time_s == open_.sim_time_s and closed.num_steps == open_.num_steps


@pytest.mark.parametrize("overrides", [
    ["system=vllm", "rps=4", "max_concurrency=1"],
    ["system=vllm", "rps=8", "max_concurrency=5"],
    ["system=static_sd_k3", "rps=1000", "max_concurrency=4"],  # every request released at once
    ["system=static_sd_k3", "rps=3", "max_concurrency=39"],  # one request can wait, then the limit stops mattering
    ["system=sarathi", "rps=4", "max_concurrency=3"],
    ["system=static_sd_k3", "rps=4", "max_concurrency=3", "engine.record_steps=true"],
    ["system=seppipe", "workload=adaserve_mix", "rps=4", "max_concurrency=3", "num_requests=40", "seed=1"],
], ids=["vllm C=1", "vllm C=5", "static offline C=4", "static C=N-1", "sarathi C=3", "static traced C=3",
        "seppipe's replicas C=3"])
def test_the_fast_path_equals_step_by_step_in_a_closed_loop(overrides: list[str]) -> None:
    ov = [*overrides, *(WORKLOAD if "seed=1" not in overrides else [])]
    slow, _ = _run(ov, fast_forward=False)
    fast, _ = _run(ov, fast_forward=True)
    for name in ("arrival_s", *STATE):
        assert np.array_equal(getattr(slow.state, name), getattr(fast.state, name), equal_nan=True), name
    assert fast.sim_time_s == slow.sim_time_s and fast.num_steps == slow.num_steps
    assert fast.replica_of.tolist() == slow.replica_of.tolist()
    assert len(fast.steps) == len(slow.steps)


def test_latencies_count_from_the_send() -> None:
    """vLLM's TTFT and end-to-end latency start inside the semaphore: the client's wait is not in them. At C = 1 the
    mean latency is the mean time alone on the server; measured from the release it would be far longer."""
    built = build(compose(["system=vllm", "rps=1000", "max_concurrency=1", *WORKLOAD]))
    out = built.engine.run()
    req = requests_frame(out, built.table)
    m = summarize(req, out.sim_time_s, None)
    s = out.state
    assert m["mean_latency_s"] == pytest.approx(float(np.mean(s.finish_at - s.arrival_s)))
    assert m["mean_ttft_ms"] == pytest.approx(float(np.mean(s.first_token_at - s.arrival_s)) * 1e3)
    assert m["mean_latency_s"] < 0.1 * float(np.mean(s.finish_at - req["released_at"]))
    # the benchmark's duration runs from its start to the last completion
    assert m["sim_time_s"] == float(np.max(s.finish_at))
    assert m["request_throughput"] == pytest.approx(40 / float(np.max(s.finish_at)))


@pytest.mark.parametrize("bad", ["0", "-2", "2.5", "true", "many"])
def test_a_bad_limit_is_a_one_line_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"max_concurrency must be a positive integer"):
        build(compose(["system=vllm", f"max_concurrency={bad}", "num_requests=5"]))
