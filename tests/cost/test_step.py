"""Step costing (repro/cost/step.py), hand-computed: the target's verify pass and the drafting before it, priced
through the proposer objects (repro/sim/proposers.py): locally and on remote draft servers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from repro.cost.model import CostModel, ForwardShape
from repro.cost.serving import EngineProfile, load_engine
from repro.cost.step import DecodeBatch, PrefillBatch, decode_pass_s, verify_pass
from repro.sim.plan import PlanError, StepPlan, ids
from repro.sim.proposers import DraftModel, EagleHead, PromptLookup, RemoteDraftServer
from repro.sim.state import RequestState
from repro.sim.stepcost import StepCoster
from tests.conftest import make_cost, make_requests

NO_INT = np.zeros(0, dtype=np.int64)
NO_BOOL = np.zeros(0, dtype=bool)


def _state(contexts: list[int], draft_has: list[int]) -> RequestState:
    """Requests whose target cache holds ``contexts`` tokens and whose draft cache holds ``draft_has``."""
    s = RequestState(**make_requests(len(contexts), prompt_len=contexts))
    s.num_computed[:] = contexts
    s.num_draft_computed[:] = draft_has
    return s


MQ = EngineProfile(name="mq", scorer="multi_query", verify_graphs=True, graph_max_tokens=512)
BE = EngineProfile(name="be", scorer="batch_expansion", verify_graphs=False, graph_max_tokens=256, expand_seq_s=2e-5,
                   expand_reread=1.0, spec_seq_s=1e-5, spec_token_s=1e-6)


def _dec(k: list[int], ctx: list[int]) -> DecodeBatch:
    n = len(k)
    return DecodeBatch(ids(list(range(1, n + 1))), ids([5] * n), ids(ctx), ids(k), ids(k) > 0, {}, None)


def test_verify_pass_of_a_mixed_step() -> None:
    # a 64-token prefill chunk on 32 cached tokens (completes its prompt) + 2 decodes, one verifying k = 3:
    # tokens 64 + (1 + 3) + 1 = 69; 3 sequences; KV read: the chunk's 32 cached tokens, the decodes' (100 + 4) +
    # (200 + 1); causal pairs 64 · (32 + 65 / 2); query-key pairs of the decodes 4 · (100 + 4) + 1 · (200 + 1); LM
    # head over the 5 decode tokens and the completed prompt's last token; a pass with prefill runs eagerly; the
    # chunk's share (64 tokens, 1 sequence, 32 cached) for a measured profile's pricing
    pre = PrefillBatch(ids([0]), ids([64]), 64 * (32 + 65 / 2), np.array([True]), 32.0)
    dec = _dec([3, 0], [100, 200])
    assert verify_pass(MQ, pre, dec) == (ForwardShape(69, 3, 337.0, 64 * (32 + 65 / 2), 6, False, 617.0, 64, 1, 32.0),
                                         0.0)
    empty = PrefillBatch(NO_INT, NO_INT, 0.0, NO_BOOL)
    assert verify_pass(MQ, empty, dec) == (ForwardShape(5, 2, 305.0, 0.0, 5, True, 617.0), 0.0)
    # an engine that verifies eagerly (vLLM v0's multi-query scorer, FlexFlow): graphs for plain decodes only
    eager = replace(MQ, verify_graphs=False)
    assert verify_pass(eager, empty, dec)[0].decode_only is False
    assert verify_pass(eager, empty, _dec([0, 0], [100, 200]))[0].decode_only is True


def test_batch_expansion_reads_the_kv_k_plus_1_times() -> None:
    # k = 3 on 100 cached tokens becomes 4 single-query sequences reading 101, 102, 103, 104 tokens (4 · 100 + 10);
    # the plain decode beside it reads 201. Host: 4 expanded sequences · 20 µs + 1 speculating sequence · 10 µs +
    # 3 proposed tokens · 1 µs. Single-query passes replay CUDA graphs.
    empty = PrefillBatch(NO_INT, NO_INT, 0.0, NO_BOOL)
    shape, host = verify_pass(BE, empty, _dec([3, 0], [100, 200]))
    assert shape == ForwardShape(5, 5, 611.0, 0.0, 5, True, 611.0)
    assert host == pytest.approx(4 * 2e-5 + 1e-5 + 3 * 1e-6, rel=1e-12)
    # a cache that keeps half of the repeated reads: 100 · (1 + 3 · 0.5) + 10
    half = replace(BE, expand_reread=0.5)
    assert verify_pass(half, empty, _dec([3, 0], [100, 200]))[0].kv_read_tokens == 250.0 + 10.0 + 201.0
    # 64 sequences · (1 + 4) = 320 expanded sequences exceed the 256 captured: eager
    assert verify_pass(BE, empty, _dec([4] * 64, [50] * 64))[0].decode_only is False
    # with nothing speculated the two scorers charge the same pass
    assert verify_pass(BE, empty, _dec([0, 0], [100, 200])) == verify_pass(MQ, empty, _dec([0, 0], [100, 200]))


def test_batch_expansion_costs_more_than_multi_query_and_decode_pass_s_agrees() -> None:
    cost_be = CostModel(make_cost().hardware, make_cost().model, engine=BE)
    cost_mq = CostModel(make_cost().hardware, make_cost().model, engine=MQ)
    empty = PrefillBatch(NO_INT, NO_INT, 0.0, NO_BOOL)
    for cost in (cost_be, cost_mq):
        shape, host = verify_pass(cost.engine, empty, _dec([4] * 8, [300] * 8))
        assert decode_pass_s(cost, 8, 300, 4) == pytest.approx(cost.forward(shape).total_s + host, rel=1e-12)
    assert decode_pass_s(cost_be, 8, 300, 4) > decode_pass_s(cost_mq, 8, 300, 4) * 1.05
    assert decode_pass_s(cost_be, 8, 300, 0) == decode_pass_s(cost_mq, 8, 300, 0)


def test_engine_profiles_load_and_differ_where_the_papers_say() -> None:
    v0, v1, ff = load_engine("vllm_v0"), load_engine("vllm_v1"), load_engine("flexflow")
    assert (v0.scorer, v0.draft_kv_layout, v0.spec_with_prefill) == ("batch_expansion", "vllm_v0", False)
    assert (v1.scorer, v1.verify_graphs, v1.draft_kv_layout) == ("multi_query", True, "spread")
    assert (ff.scorer, ff.verify_graphs) == ("multi_query", False)
    with pytest.raises(TypeError, match="scorrer"):
        EngineProfile.from_cfg({"name": "x", "scorrer": "multi_query"})
    with pytest.raises(ValueError, match="scorer"):
        EngineProfile(scorer="tree")  # type: ignore[arg-type]


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "conf" / "engine").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_engine_config_loads_under_its_file_name(path: Path) -> None:
    assert load_engine(path.stem).name == path.stem


def test_chain_drafting_by_hand() -> None:
    # 2 requests at contexts 100 and 200, draft caches up to date (they hold all but the last token), k = 3:
    # pass 1 reads 300 + 2 tokens of KV, passes 2 and 3 read 300 + 2·2 and 300 + 3·2; plus the round's overhead
    cost = make_cost()
    s = _state([100, 200], [100, 200])
    coster = StepCoster(s, cost)
    dids, dc, k = ids([0, 1]), ids([100, 200]), ids([3, 3])
    got = coster.draft_s(DraftModel(cost), StepPlan(decode_ids=dids, k=k), dids, dc, k, k > 0, {}, NO_INT, NO_INT,
                         draft_resident=True)
    passes = [cost.forward_s(2, 2, kv_read_tokens=302, lm_head_tokens=2, decode_only=True, which="draft")]
    passes += [cost.forward_s(2, 2, kv_read_tokens=300 + j * 2, decode_only=True, which="draft") for j in (2, 3)]
    assert got == pytest.approx(cost.spec_round_s() + sum(passes), rel=1e-12)


def test_a_lagging_draft_catches_up_in_its_first_pass() -> None:
    # the draft's cache misses 10 tokens of request 0: its first pass processes 11 tokens with causal attention
    # over its 90 cached ones (pairs 11 · (90 + 12 / 2)), and is no longer a CUDA-graph decode pass
    cost = make_cost()
    s = _state([100], [90])
    dids, dc, k = ids([0]), ids([100]), ids([1])
    got = StepCoster(s, cost).draft_s(DraftModel(cost), StepPlan(decode_ids=dids, k=k), dids, dc, k, k > 0, {},
                                      NO_INT, NO_INT, draft_resident=True)
    first = cost.forward_s(11, 1, kv_read_tokens=101, prefill_attn_pairs=11 * (90 + 12 / 2), lm_head_tokens=1,
                           decode_only=False, which="draft")
    assert got == pytest.approx(cost.spec_round_s() + first, rel=1e-12)


def test_remote_draft_servers_pay_their_uplink_and_the_slowest_sets_the_time() -> None:
    # request 0 drafts on server 0 (an A100 5 ms away), request 1 on server 1 (an L4 1 ms away); the step waits for
    # the later of the two, each its own k = 2 chain on its server's cost model, then half its round trip (the
    # uplink; the link's bandwidth is unlimited by default, the other half is the downlink after verification)
    a100, l4 = make_cost(), make_cost(hardware="l4")
    servers = (RemoteDraftServer(a100, rtt_s=0.005), RemoteDraftServer(l4, rtt_s=0.001))
    s = _state([100, 100], [100, 100])
    coster = StepCoster(s, make_cost(), servers)
    dids, dc, k = ids([0, 1]), ids([100, 100]), ids([2, 2])
    plan = StepPlan(decode_ids=dids, k=k, draft_server=ids([0, 1]))
    got = coster.draft_s(DraftModel(coster.cost), plan, dids, dc, k, k > 0, {}, NO_INT, NO_INT, draft_resident=False)

    def chain(c: CostModel) -> float:
        return (c.forward_s(1, 1, kv_read_tokens=101, lm_head_tokens=1, decode_only=True, which="draft")
                + c.forward_s(1, 1, kv_read_tokens=102, decode_only=True, which="draft"))

    expect = max(0.0025 + chain(a100), 0.0005 + chain(l4))
    assert got == pytest.approx(coster.cost.spec_round_s() + expect, rel=1e-12)
    assert chain(l4) > chain(a100)  # the L4 is the slower GPU


def test_a_draft_that_is_not_resident_cannot_draft_locally() -> None:
    s = _state([100], [100])
    dids, dc, k = ids([0]), ids([100]), ids([2])
    with pytest.raises(PlanError, match="not resident"):
        StepCoster(s, make_cost()).draft_s(DraftModel(make_cost()), StepPlan(decode_ids=dids, k=k), dids, dc, k,
                                           k > 0, {}, NO_INT, NO_INT, draft_resident=False)


def test_prompt_lookup_costs_host_time_per_request_asked() -> None:
    cost = make_cost(draft=None)
    s = _state([100, 100, 100], [0, 0, 0])
    dids, dc, k = ids([0, 1, 2]), ids([100, 100, 100]), ids([3, 0, 3])
    got = StepCoster(s, cost).draft_s(PromptLookup(cost), StepPlan(decode_ids=dids, k=k, proposer="pld"), dids, dc,
                                      k, k > 0, {}, NO_INT, NO_INT, draft_resident=False)
    assert got == pytest.approx(cost.hardware.pld_step_s + 2 * cost.hardware.pld_request_s)


def test_an_eagle_head_drafts_on_the_targets_gpu_and_never_catches_up() -> None:
    # an EAGLE head keeps no KV cache of its own: a request whose draft cache lags 10 tokens drafts k = 2 with plain
    # single-token passes (reading 100 + 1 and 100 + 2 tokens) on the EAGLE coefficients, plus the round's overhead
    cost = make_cost()
    s = _state([100], [90])
    dids, dc, k = ids([0]), ids([100]), ids([2])
    head = EagleHead(cost)
    got = StepCoster(s, cost).draft_s(head, StepPlan(decode_ids=dids, k=k, proposer="eagle"), dids, dc, k, k > 0, {},
                                      NO_INT, NO_INT, draft_resident=False)
    passes = (cost.forward_s(1, 1, kv_read_tokens=101, lm_head_tokens=1, decode_only=True, which="eagle")
              + cost.forward_s(1, 1, kv_read_tokens=102, decode_only=True, which="eagle"))
    assert got == pytest.approx(cost.spec_round_s() + passes, rel=1e-12)
    assert (head.which, head.resident, head.keeps_kv, head.stream) == ("eagle", False, False, "eagle")


def test_a_remote_server_drafts_on_its_own_hardware_plus_its_round_trip() -> None:
    # every request placed on one L4 server 2 ms away, its draft model on two L4s: the drafting is the server's own
    # passes (its cost model: draft on l4, draft_tp 2) + 1 ms of uplink + the round overhead; the local draft model
    # need not be resident, and a request left local (-1) drafts on the replica's GPU beside it (the slower wins)
    target = make_cost()
    server_cost = CostModel(target.hardware, target.model, draft=target.draft, draft_hardware=make_cost("l4").hardware,
                            draft_tp=2)
    server = RemoteDraftServer(server_cost, name="l4", rtt_s=0.002)
    assert (server.which, server.remote, server.resident, server.keeps_kv) == ("draft", True, False, True)
    s = _state([200, 300], [200, 300])
    coster = StepCoster(s, target, (server,))
    dids, dc, k = ids([0, 1]), ids([200, 300]), ids([1, 1])
    local = DraftModel(target)
    plan = StepPlan(decode_ids=dids, k=k, draft_server=ids([0, 0]))
    got = coster.draft_s(local, plan, dids, dc, k, k > 0, {}, NO_INT, NO_INT, draft_resident=False)
    on_server = server_cost.forward_s(2, 2, kv_read_tokens=502, lm_head_tokens=2, decode_only=True, which="draft")
    assert got == pytest.approx(target.spec_round_s() + 0.001 + on_server, rel=1e-12)
    assert on_server != target.forward_s(2, 2, kv_read_tokens=502, lm_head_tokens=2, decode_only=True,
                                         which="draft")
    mixed = StepPlan(decode_ids=dids, k=k, draft_server=ids([0, -1]))
    got = coster.draft_s(local, mixed, dids, dc, k, k > 0, {}, NO_INT, NO_INT, draft_resident=True)
    here = target.forward_s(1, 1, kv_read_tokens=301, lm_head_tokens=1, decode_only=True, which="draft")
    there = 0.001 + server_cost.forward_s(1, 1, kv_read_tokens=201, lm_head_tokens=1, decode_only=True,
                                          which="draft")
    assert got == pytest.approx(target.spec_round_s() + max(here, there), rel=1e-12)


def test_prompt_lookup_is_host_time_only_even_with_requests_that_do_not_speculate() -> None:
    cost = make_cost(draft=None)
    pld = PromptLookup(cost)
    assert (pld.which, pld.proposes_first, pld.resident, pld.stream) == (None, True, False, "pld")
    assert pld.host_s(3) == pytest.approx(cost.hardware.pld_step_s + 3 * cost.hardware.pld_request_s)
    with pytest.raises(ValueError, match="rtt_s"):
        RemoteDraftServer(cost, rtt_s=-1.0)
    with pytest.raises(ValueError, match="bandwidth_bps"):
        RemoteDraftServer(cost, bandwidth_bps=0.0)


@pytest.mark.parametrize("tokens", [0, 1, 4, 9])
def test_the_uplink_carries_each_draft_with_its_vocabulary_sized_distribution(tokens: int) -> None:
    # GoodSpeed: a server sends S tokens and their fp16 distributions over the draft's vocabulary (Qwen3: 151,936
    # entries, 303,876 bytes a token with its 4-byte id) over a 1 Gbit/s link, after half of a 2 ms round trip
    target = make_cost("h100-80g", "qwen3-14b", "qwen3-0.6b")
    server = RemoteDraftServer(target, rtt_s=0.002, bandwidth_bps=1e9)
    assert server.uplink_s(tokens) == pytest.approx(0.001 + tokens * (4 + 2 * 151_936) * 8 / 1e9)
    assert server.downlink_s(tokens) == pytest.approx(0.001 + (tokens + 1) * 32 / 1e9)
