"""Proposer objects (repro/sim/proposers.py) through the engine and the token oracle: names resolve to the replica's
objects, each kind is scored on its own oracle stream, prompt lookup verifies only what it matched, and remote draft
servers draft and are scored for the requests placed on them (each on its own stream where it names one)."""

from __future__ import annotations

import numpy as np
import pytest

from repro.cost.spec import load_hardware, load_model
from repro.oracle import TokenOracle
from repro.sim.deployment import DraftServerSpec
from repro.sim.plan import PlanError, StepPlan, ids
from repro.sim.policy import Policy
from repro.sim.proposers import DraftModel, EagleHead, PromptLookup, Proposer, RemoteDraftServer, colocated
from repro.sim.state import View
from tests.conftest import FixedOracle, make_cost, make_engine, make_requests, run


class TwoSteps(Policy):
    """Prefills every request, then decodes with ``plan(view)`` (a plan factory) until all finish."""

    uses_draft_model = True

    def __init__(self, plan: object) -> None:
        self.plan = plan

    def schedule(self, view: View) -> StepPlan:
        if view.waiting.size:
            return StepPlan(prefill_ids=view.waiting, prefill_tokens=view.num_tokens(view.waiting), draft_sync=True)
        return self.plan(self, view) if view.running.size else StepPlan()  # type: ignore[operator]


class StreamLog(FixedOracle):
    """FixedOracle that records which stream scored which requests."""

    def __init__(self, accept: int = 1) -> None:
        super().__init__(accept)
        self.streams: list[tuple[str, list[int]]] = []

    def score_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                    proposer: str | Proposer = "draft") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        name = proposer if isinstance(proposer, str) else proposer.stream
        self.streams.append((name, sorted(rids.tolist())))
        return super().score_chain(rids, pos, k, proposer)


def test_a_replica_resolves_names_to_its_objects() -> None:
    cost = make_cost()
    props = colocated(cost)
    assert sorted(props) == ["draft", "eagle", "pld"]
    assert isinstance(props.resolve("draft"), DraftModel) and isinstance(props["eagle"], EagleHead)
    assert isinstance(props.resolve("pld"), PromptLookup) and all(p.cost is cost for p in props.values())
    mine = EagleHead(cost, name="eagle2", stream="draft")
    assert props.resolve(mine) is mine
    with pytest.raises(PlanError, match="unknown proposer 'medusa'"):
        props.resolve("medusa")


@pytest.mark.parametrize(("proposer", "stream"), [("draft", "draft"), ("eagle", "eagle")])
def test_each_kind_is_scored_on_its_stream_and_an_object_equals_its_name(proposer: str, stream: str) -> None:
    def by_name(pol: Policy, v: View) -> StepPlan:
        return StepPlan(decode_ids=v.running, k=np.full(v.running.size, 2, dtype=np.int64), proposer=proposer)

    def by_object(pol: Policy, v: View) -> StepPlan:
        assert pol.ctx.proposers is not None
        return StepPlan(decode_ids=v.running, k=np.full(v.running.size, 2, dtype=np.int64),
                        proposer=pol.ctx.proposers[proposer])

    outs = []
    for plan in (by_name, by_object):
        log = StreamLog()
        outs.append(run(TwoSteps(plan), make_requests(2, output_len=5), oracle=log, record_steps=True))
        assert {name for name, _ in log.streams} == {stream}
    assert [r.latency_s for r in outs[0].steps] == [r.latency_s for r in outs[1].steps]


def test_prompt_lookup_verifies_the_tokens_the_oracle_matched() -> None:
    # 8 requests ask for k = 6 by prompt lookup on the real oracle: the first decode step verifies, per request, the
    # min(6, match length) tokens the pld stream proposes at its position (1, the token after the prompt), no more
    n = 8
    reqs = make_requests(n, output_len=30)
    dataset = np.full(n, "cnn_dailymail", dtype=object)
    pld = {"default": {"match": 0.5, "accept": 0.6, "match_len": 4.0}}

    def oracle() -> TokenOracle:
        return TokenOracle(0, dataset, {"default": 0.6}, pld=pld)

    def lookup(pol: Policy, v: View) -> StepPlan:
        return StepPlan(decode_ids=v.running, k=np.full(v.running.size, 6, dtype=np.int64), proposer="pld")

    out = run(TwoSteps(lookup), reqs, oracle=oracle(), record_steps=True)
    proposed, accepted, matched = oracle().score_chain(np.arange(n), np.ones(n, dtype=np.int64), np.full(n, 6),
                                                       "pld")
    step = out.steps[1]
    assert 0 < proposed.sum() < 6 * n  # some requests matched, not all fully
    assert step.num_batched_tokens == n + int(proposed.sum())
    assert (step.num_proposed, step.num_accepted, step.num_matched) == (
        int(proposed.sum()), int(accepted.sum()), int(matched.sum()))


def test_remote_servers_draft_and_are_scored_for_the_requests_placed_on_them() -> None:
    # two servers: server 0 on the run's draft stream, server 1 on its own stream "qwen"; requests 0 and 1 are placed
    # on them, requests 2 and 3 draft locally: each group is scored on its drafter's stream
    l4, draft = load_hardware("l4"), load_model("llama-160m")
    specs = (DraftServerSpec(l4, draft, rtt_s=0.001), DraftServerSpec(l4, draft, rtt_s=0.003, stream="qwen"))

    def placed(pol: Policy, v: View) -> StepPlan:
        return StepPlan(decode_ids=v.running, k=np.full(v.running.size, 2, dtype=np.int64),
                        draft_server=np.where(v.running == 0, 0, np.where(v.running == 1, 1, -1)))

    log = StreamLog()
    eng = make_engine(TwoSteps(placed), make_requests(4, output_len=3), oracle=log, draft_servers=specs,
                      record_steps=True)
    out = eng.run()
    rep = eng.replicas[0]
    assert all(isinstance(s, RemoteDraftServer) for s in rep.proposers.remote)
    assert [s.stream for s in rep.proposers.remote] == ["draft", "qwen"]
    assert rep.proposers.remote[1].hardware == l4 and rep.proposers.remote[1].rtt_s == 0.003
    assert sorted(log.streams[:3]) == [("draft", [0]), ("draft", [2, 3]), ("qwen", [1])]
    assert out.steps[1].draft_s > 0.003  # the slowest server's round trip is inside the drafting time


def test_a_remote_stream_has_its_own_acceptance_and_leaves_the_others_alone() -> None:
    n = 400
    ds = np.full(n, "sharegpt", dtype=object)
    rids, pos, k = np.arange(n), np.zeros(n, dtype=np.int64), np.full(n, 4)
    plain = TokenOracle(0, ds, {"default": 0.6})
    before = plain.score_chain(rids, pos, k)
    with_remote = TokenOracle(0, ds, {"default": 0.6})
    with_remote.add_stream("weak", {"default": 0.2}, key=7)
    server = RemoteDraftServer(make_cost("l4"), stream="weak")
    weak = with_remote.score_chain(rids, pos, k, server)
    for a, b in zip(before, with_remote.score_chain(rids, pos, k), strict=True):
        np.testing.assert_array_equal(a, b)
    assert weak[2].sum() < 0.6 * before[2].sum()  # matched tokens: the weak draft agrees far less often
    with pytest.raises(ValueError, match="exists"):
        with_remote.add_stream("draft", {"default": 0.5}, key=9)
    with pytest.raises(ValueError, match="key 1 is taken"):
        with_remote.add_stream("other", {"default": 0.5}, key=1)


def test_prompt_lookup_cannot_share_a_step_with_remote_servers() -> None:
    specs = (DraftServerSpec(load_hardware("l4"), load_model("llama-160m")),)

    def bad(pol: Policy, v: View) -> StepPlan:
        return StepPlan(decode_ids=v.running, k=np.full(v.running.size, 2, dtype=np.int64), proposer="pld",
                        draft_server=ids(np.zeros(v.running.size)))

    with pytest.raises(PlanError, match="before verification"):
        run(TwoSteps(bad), make_requests(2, output_len=3), draft_servers=specs)

    def out_of_range(pol: Policy, v: View) -> StepPlan:
        return StepPlan(decode_ids=v.running, k=np.full(v.running.size, 2, dtype=np.int64),
                        draft_server=ids(np.full(v.running.size, 3)))

    with pytest.raises(PlanError, match="server index below 1"):
        run(TwoSteps(out_of_range), make_requests(2, output_len=3), draft_servers=specs)


class ProbLog:
    """An oracle whose Σ min(1, p/q) is 100 × (a code of the proposer object) + 10 × position + k, per request."""

    def __init__(self, codes: dict[int, int]) -> None:
        self.codes = codes
        self.calls: list[tuple[int, list[int]]] = []

    def accept_prob_sum(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray, proposer: Proposer) -> np.ndarray:
        code = self.codes[id(proposer)]
        self.calls.append((code, rids.tolist()))
        return 100.0 * code + 10.0 * pos + k


def test_accept_prob_is_each_drafted_chains_on_its_drafters_stream() -> None:
    # five requests: 0 and 3 drafted by remote server 1, 1 by server 0, 2 locally, 4 not speculating (k = 0)
    from repro.cost.step import DecodeBatch

    cost = make_cost()
    l4 = make_cost("l4")
    props = colocated(cost, (RemoteDraftServer(l4), RemoteDraftServer(l4, stream="qwen")))
    local = props.resolve("draft")
    codes = {id(local): 1, id(props.remote[0]): 2, id(props.remote[1]): 3}
    rid = np.array([10, 11, 12, 13, 14])
    k = np.array([2, 3, 4, 1, 0])
    dec = DecodeBatch(rid, np.array([5, 6, 7, 8, 9]), np.full(5, 100), k, k > 0, {}, None)
    servers = np.array([1, 0, -1, 1, -1])
    log = ProbLog(codes)
    got = props.accept_prob(log, local, servers, dec)  # type: ignore[arg-type]
    assert got.tolist() == [352.0, 263.0, 174.0, 381.0, 0.0]
    assert sorted(log.calls) == [(1, [12]), (2, [11]), (3, [10, 13])]  # one call per drafter, none for k = 0
    assert props.accept_prob(ProbLog(codes), local, None, dec).tolist() == [152.0, 163.0, 174.0, 181.0, 0.0]  # type: ignore[arg-type]
    none = DecodeBatch(rid, dec.gen, dec.ctx, np.zeros(5, dtype=np.int64), np.zeros(5, dtype=bool), {}, None)
    idle = ProbLog(codes)
    assert props.accept_prob(idle, local, servers, none).tolist() == [0.0] * 5 and not idle.calls  # type: ignore[arg-type]
    trees = DecodeBatch(rid, dec.gen, dec.ctx, k, k > 0, {10: object()}, None)  # type: ignore[dict-item]
    assert props.accept_prob(idle, local, servers, trees).tolist() == [0.0] * 5 and not idle.calls  # type: ignore[arg-type]
    lookup = ProbLog({id(props.resolve("pld")): 4})  # prompt lookup proposes before verification: not computed
    assert props.accept_prob(lookup, props.resolve("pld"), None, dec).tolist() == [0.0] * 5 and not lookup.calls  # type: ignore[arg-type]


def test_a_remote_server_needs_a_positive_link() -> None:
    slow = RemoteDraftServer(make_cost("l4"), bandwidth_bps=0.5)  # any positive rate is a link
    assert slow.bandwidth_bps == 0.5
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=rf"^draft server 'remote': bandwidth_bps must be > 0, not {bad}$"):
            RemoteDraftServer(make_cost("l4"), bandwidth_bps=bad)


def test_a_remote_servers_uplink_carries_each_drafts_id_and_distribution() -> None:
    server = RemoteDraftServer(make_cost("l4"), rtt_s=0.002, bandwidth_bps=1e9)
    vocab = server.cost.draft.vocab_size  # type: ignore[union-attr]
    assert server.uplink_s(3) == pytest.approx(0.001 + 3 * (4 + 2 * vocab) * 8.0 / 1e9, rel=1e-12)
    bare = RemoteDraftServer(make_cost("l4", draft=None), rtt_s=0.002, bandwidth_bps=1e9)  # no draft spec: ids only
    assert bare.uplink_s(3) == pytest.approx(0.001 + 3 * 4 * 8.0 / 1e9, rel=1e-12)


@pytest.mark.parametrize("kind", ["eagle", "draft", "pld"])
def test_a_proposers_host_work_is_charged_only_to_a_step_that_speculates(kind: str) -> None:
    cost = make_cost(engine="vllm_v0")  # vLLM v0: a speculation round's host work is charged, not hidden
    assert cost.spec_round_s() > 0
    proposer = colocated(cost).resolve(kind)
    want = {"eagle": cost.spec_round_s(), "draft": cost.spec_round_s() + cost.draft_broadcast_s(),
            "pld": cost.pld_s(3)}[kind]
    assert proposer.host_s(3) == want
    assert proposer.host_s(0) == (cost.pld_s(0) if kind == "pld" else 0.0)


class ScoreLog:
    """An oracle whose chains score k proposed, ``accept`` accepted and ``match`` matched tokens, recording which
    proposer (by a code) scored which requests."""

    def __init__(self, codes: dict[int, int], accept: int = 1, match: int = 1) -> None:
        self.codes, self.accept, self.match = codes, accept, match
        self.calls: list[tuple[int, list[int]]] = []

    def score_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                    proposer: Proposer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.calls.append((self.codes[id(proposer)], rids.tolist()))
        k = np.asarray(k, dtype=np.int64)
        return k.copy(), np.minimum(k, self.accept) if self.accept >= 0 else k + 1, (
            np.minimum(k, self.match) if self.match >= 0 else k + 1)


@pytest.mark.parametrize("servers", [None, [1, 0, -1, 1, -1]])
@pytest.mark.parametrize("all_chains", [True, False])
def test_each_chain_is_scored_on_its_drafters_stream_and_an_oracle_accepting_too_much_is_refused(
        servers: list[int] | None, all_chains: bool) -> None:
    from repro.cost.step import DecodeBatch

    cost, l4 = make_cost(), make_cost("l4")
    props = colocated(cost, (RemoteDraftServer(l4), RemoteDraftServer(l4, stream="qwen")))
    local = props.resolve("draft")
    codes = {id(local): 1, id(props.remote[0]): 2, id(props.remote[1]): 3}
    rid = np.array([10, 11, 12, 13, 14])
    k = np.array([2, 3, 4, 1, 2 if all_chains else 0])
    dec = DecodeBatch(rid, np.array([5, 6, 7, 8, 9]), np.full(5, 100), k, k > 0, {}, None)
    srv = None if servers is None else np.array(servers)
    log = ScoreLog(codes, accept=2, match=3)
    proposed, accepted, matched = props.score(log, local, srv, dec)  # type: ignore[arg-type]
    assert proposed.dtype == accepted.dtype == matched.dtype == np.int64
    assert proposed.tolist() == k.tolist() and accepted.tolist() == np.minimum(k, 2).tolist()
    assert matched.tolist() == np.minimum(k, 3).tolist()
    chains = [int(r) for r, kk in zip(rid, k, strict=True) if kk > 0]
    if servers is None:
        assert log.calls == [(1, chains)]  # one call on the plan's proposer, no request without a chain
    else:
        want = {1: [12, 14] if all_chains else [12], 2: [11], 3: [10, 13]}
        assert sorted(log.calls) == sorted(want.items())
    for accept, match in ((-1, 1), (1, -1)):  # one more accepted, or matched, than proposed
        with pytest.raises(PlanError, match=r"^oracle accepted more tokens than proposed$"):
            props.score(ScoreLog(codes, accept, match), local, srv, dec)  # type: ignore[arg-type]
