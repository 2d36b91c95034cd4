"""Step costing (repro/cost/step.py), hand-computed: the target's verify pass and the drafting before it, locally
and on remote draft servers."""

from __future__ import annotations

import numpy as np
import pytest

from repro.cost.model import CostModel
from repro.cost.step import DecodeBatch, DraftServer, PrefillBatch, StepCoster, verify_shape
from repro.plan import PlanError, StepPlan, ids
from repro.state import RequestState
from tests.conftest import make_cost, make_requests

NO_INT = np.zeros(0, dtype=np.int64)
NO_BOOL = np.zeros(0, dtype=bool)


def _state(contexts: list[int], draft_has: list[int]) -> RequestState:
    """Requests whose target cache holds ``contexts`` tokens and whose draft cache holds ``draft_has``."""
    s = RequestState(**make_requests(len(contexts), prompt_len=contexts))
    s.num_computed[:] = contexts
    s.num_draft_computed[:] = draft_has
    return s


def test_verify_shape_of_a_mixed_step() -> None:
    # a 64-token prefill chunk on 32 cached tokens (completes its prompt) + 2 decodes, one verifying k = 3:
    # tokens 64 + (1 + 3) + 1 = 69; 3 sequences; KV read by the decodes: (100 + 4) + (200 + 1); causal pairs
    # 64 · (32 + 65 / 2); LM head over the 5 decode tokens and the completed prompt's last token
    pre = PrefillBatch(ids([0]), ids([64]), 64 * (32 + 65 / 2), np.array([True]))
    dec = DecodeBatch(ids([1, 2]), ids([5, 9]), ids([100, 200]), ids([3, 0]), np.array([True, False]), {}, None)
    assert verify_shape(pre, dec) == (69, 3, 305.0, 64 * (32 + 65 / 2), 6, False)
    empty = PrefillBatch(NO_INT, NO_INT, 0.0, NO_BOOL)
    assert verify_shape(empty, dec) == (5, 2, 305.0, 0.0, 5, True)  # decode-only: CUDA graphs


def test_chain_drafting_by_hand() -> None:
    # 2 requests at contexts 100 and 200, draft caches up to date (they hold all but the last token), k = 3:
    # pass 1 reads 300 + 2 tokens of KV, passes 2 and 3 read 300 + 2·2 and 300 + 3·2; plus the round's overhead
    cost = make_cost()
    s = _state([100, 200], [100, 200])
    coster = StepCoster(s, cost)
    dids, dc, k = ids([0, 1]), ids([100, 200]), ids([3, 3])
    got = coster.draft_s(StepPlan(decode_ids=dids, k=k), dids, dc, k, k > 0, {}, NO_INT, NO_INT,
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
    got = StepCoster(s, cost).draft_s(StepPlan(decode_ids=dids, k=k), dids, dc, k, k > 0, {}, NO_INT, NO_INT,
                                      draft_resident=True)
    first = cost.forward_s(11, 1, kv_read_tokens=101, prefill_attn_pairs=11 * (90 + 12 / 2), lm_head_tokens=1,
                           decode_only=False, which="draft")
    assert got == pytest.approx(cost.spec_round_s() + first, rel=1e-12)


def test_remote_draft_servers_pay_their_round_trip_and_the_slowest_sets_the_time() -> None:
    # request 0 drafts on server 0 (an A100 5 ms away), request 1 on server 1 (an L4 1 ms away); the step waits for
    # the later of the two, each its own k = 2 chain on its server's cost model
    a100, l4 = make_cost(), make_cost(hardware="l4")
    servers = (DraftServer(cost=a100, rtt_s=0.005), DraftServer(cost=l4, rtt_s=0.001))
    s = _state([100, 100], [100, 100])
    coster = StepCoster(s, make_cost(), servers)
    dids, dc, k = ids([0, 1]), ids([100, 100]), ids([2, 2])
    plan = StepPlan(decode_ids=dids, k=k, draft_server=ids([0, 1]))
    got = coster.draft_s(plan, dids, dc, k, k > 0, {}, NO_INT, NO_INT, draft_resident=False)

    def chain(c: CostModel) -> float:
        return (c.forward_s(1, 1, kv_read_tokens=101, lm_head_tokens=1, decode_only=True, which="draft")
                + c.forward_s(1, 1, kv_read_tokens=102, decode_only=True, which="draft"))

    expect = max(0.005 + chain(a100), 0.001 + chain(l4))
    assert got == pytest.approx(coster.cost.spec_round_s() + expect, rel=1e-12)
    assert chain(l4) > chain(a100)  # the L4 is the slower GPU


def test_a_draft_that_is_not_resident_cannot_draft_locally() -> None:
    s = _state([100], [100])
    dids, dc, k = ids([0]), ids([100]), ids([2])
    with pytest.raises(PlanError, match="not resident"):
        StepCoster(s, make_cost()).draft_s(StepPlan(decode_ids=dids, k=k), dids, dc, k, k > 0, {}, NO_INT, NO_INT,
                                           draft_resident=False)


def test_prompt_lookup_costs_host_time_per_request_asked() -> None:
    cost = make_cost(draft=None)
    s = _state([100, 100, 100], [0, 0, 0])
    dids, dc, k = ids([0, 1, 2]), ids([100, 100, 100]), ids([3, 0, 3])
    got = StepCoster(s, cost).draft_s(StepPlan(decode_ids=dids, k=k, proposer="pld"), dids, dc, k, k > 0, {},
                                      NO_INT, NO_INT, draft_resident=False)
    assert got == pytest.approx(cost.hardware.pld_step_s + 2 * cost.hardware.pld_request_s)
