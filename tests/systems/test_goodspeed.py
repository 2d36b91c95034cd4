"""GoodSpeed (Algorithm 1, Eqs. 3-5) and its baselines Fixed-S and Random-S: hand-computable cases."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from repro.sim.plan import StepResult, ids
from systems.edge import EdgeRounds, expected_tokens, gradient_allocation, utility
from systems.random_s import random_composition


@pytest.mark.parametrize("alpha,s,expected", [
    (0.5, 0, 1.0),            # no drafts: the bonus token only
    (0.5, 1, 1.5),            # 1 + α
    (0.5, 3, 1.875),          # 1 + α + α² + α³
    (0.8, 2, 1 + 0.8 + 0.64),
    (0.0, 5, 1.0),
])
def test_expected_tokens(alpha: float, s: int, expected: float) -> None:
    assert float(expected_tokens(alpha, s)) == pytest.approx(expected)


def _brute_force(w: np.ndarray, a: np.ndarray, c: int) -> float:
    best = -np.inf
    for s in itertools.product(range(c + 1), repeat=w.size):
        if sum(s) <= c:
            best = max(best, float((w * expected_tokens(a, np.array(s))).sum()))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_gradient_allocation_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, c = int(rng.integers(1, 5)), int(rng.integers(0, 9))
    w, a = rng.uniform(0.1, 2.0, n), rng.uniform(0.05, 0.95, n)
    s = gradient_allocation(w, a, c)
    assert s.sum() <= c and (s >= 0).all()
    assert float((w * expected_tokens(a, s)).sum()) == pytest.approx(_brute_force(w, a, c))


def test_gradient_allocation_by_hand() -> None:
    # w = (1, 1), α = (0.8, 0.5), C = 3: gains 0.8, 0.5 → 0.64 (S = (1, 0)), 0.5 → (2, 0), then 0.512 > 0.5 → (3, 0)
    assert gradient_allocation(np.array([1.0, 1.0]), np.array([0.8, 0.5]), 3).tolist() == [3, 0]
    # a starved client weighs more: w = (1, 4) → 0.8 vs 2.0 first, then 1.0 vs 0.8, then 0.8 vs 0.5
    assert gradient_allocation(np.array([1.0, 4.0]), np.array([0.8, 0.5]), 3).tolist() == [1, 2]
    # ties go to the lowest index; nothing is spent on a zero gain
    assert gradient_allocation(np.array([1.0, 1.0]), np.array([0.5, 0.5]), 1).tolist() == [1, 0]
    assert gradient_allocation(np.array([1.0]), np.array([0.0]), 4).tolist() == [0]


@pytest.mark.parametrize("total,parts", [(0, 3), (7, 1), (20, 8), (5, 5)])
def test_random_composition_sums_to_the_total(total: int, parts: int) -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        s = random_composition(total, parts, rng)
        assert s.size == parts and s.sum() == total and (s >= 0).all()


def test_random_composition_is_uniform_over_compositions() -> None:
    # 2 into 2 parts: (0, 2), (1, 1), (2, 0), a third each
    rng = np.random.default_rng(1)
    counts = np.bincount([int(random_composition(2, 2, rng)[0]) for _ in range(3000)], minlength=3)
    assert np.allclose(counts / 3000, 1 / 3, atol=0.03)


def _result(decode: list[int], proposed: list[int], accepted: list[int], prefill: list[int] | None = None,
            accept_prob: list[float] | None = None) -> StepResult:
    d = ids(decode)
    acc, prop = np.array(accepted), np.array(proposed)
    return StepResult(0.0, 1.0, d, prop, acc, acc + 1, ids(prefill or []), ids(), 0.0, 0.0, 0.0, 0,
                      accept_prob=np.array(accept_prob) if accept_prob is not None else None)


def test_smoothing_updates_eq3_and_eq4() -> None:
    r = EdgeRounds(3, eta=0.2, beta=0.5, init_acceptance=0.5, init_goodput=1.0)
    r._client = np.array([0, 1, 2, 0])
    r._s = np.array([4, 2, 0])
    # client 0 drafted 4 tokens whose min(1, p/q) sum to 2.4 (mean 0.6) and kept 1; client 1 drafted 2 (sum 1.8,
    # mean 0.9) and kept both; client 2's request 2 computed its prompt (x = 1; no drafts: α̂ unchanged)
    r.observe(_result([0, 1], [4, 2], [1, 2], prefill=[2], accept_prob=[2.4, 1.8]))
    assert r.alpha.tolist() == pytest.approx([0.8 * 0.5 + 0.2 * 0.6, 0.8 * 0.5 + 0.2 * 0.9, 0.5])
    assert r.goodput.tolist() == pytest.approx([0.5 * 1 + 0.5 * 2, 0.5 * 1 + 0.5 * 3, 0.5 * 1 + 0.5 * 1])
    assert r.received.tolist() == [2.0, 3.0, 1.0] and r.rounds == 1
    assert r.mean_utility() == pytest.approx(utility(np.array([2.0, 3.0, 1.0])))


# --- x*: the optimal long-term goodput of problem (1) ----------------------------------------------------------------

def test_optimal_goodput_of_one_server_is_its_whole_budget() -> None:
    from repro.metrics.fairness import optimal_goodput

    assert optimal_goodput(np.array([0.7]), 6).tolist() == pytest.approx([float(expected_tokens(0.7, 6))])


def test_optimal_goodput_of_identical_servers_splits_the_budget() -> None:
    from repro.metrics.fairness import optimal_goodput

    x = optimal_goodput(np.array([0.6, 0.6, 0.6, 0.6]), 8)
    assert x.tolist() == pytest.approx([float(expected_tokens(0.6, 2))] * 4, rel=1e-6)


def test_optimal_goodput_beats_every_pure_allocation_and_mixture() -> None:
    from repro.metrics.fairness import optimal_goodput

    a, c = np.array([0.9, 0.5, 0.3]), 5
    x = optimal_goodput(a, c)
    pure = [expected_tokens(a, np.array(k)) for k in itertools.product(range(c + 1), repeat=3) if sum(k) <= c]
    assert all(utility(x) >= utility(p) - 1e-9 for p in pure)
    rng = np.random.default_rng(0)
    for _ in range(200):  # random mixtures of pure allocations stay below U(x*)
        w = rng.dirichlet(np.ones(len(pure)))
        assert utility(x) >= utility(np.einsum("k,kn->n", w, np.array(pure))) - 1e-9


# --- the round through the engine --------------------------------------------------------------------------------

def _edge_engine(policy: Any, n_req: int = 4, servers: tuple[str, ...] = ("l4", "a100-80g"), **kw: Any) -> Any:
    from repro.cost.spec import load_hardware, load_model
    from repro.sim.deployment import DraftServerSpec
    from tests.conftest import FixedOracle, make_engine, make_requests

    reqs = make_requests(n_req, prompt_len=64, output_len=30)
    reqs["client"] = np.arange(n_req) % len(servers)
    specs = tuple(DraftServerSpec(load_hardware(h), load_model("qwen3-0.6b"), rtt_s=0.002, bandwidth_bps=1e9)
                  for h in servers)
    return make_engine(policy, reqs, oracle=kw.pop("oracle", FixedOracle(2)), hardware="h100-80g",
                       model="qwen3-14b", draft="qwen3-0.6b", engine="vllm_v1", draft_servers=specs,
                       record_steps=True, **kw)


def test_a_round_is_the_slowest_drafter_and_uplink_then_verification_then_the_downlink() -> None:
    from systems.fixed_s import FixedS
    from tests.conftest import spy

    pol = FixedS(capacity=6)
    plans, results = spy(pol)
    eng = _edge_engine(pol)
    eng.run()
    rep = eng.replicas[0]
    servers = rep.proposers.remote
    # round 0 computes both clients' prompts; round 1 drafts S = 3 on each server (one request each)
    p, r = plans[1], results[1]
    assert p.k is not None and p.k.tolist() == [3, 3] and p.draft_server is not None
    assert p.draft_server.tolist() == [0, 1]
    drafts = []
    for srv in servers:  # each server's catch-up (the 64-token prompt + 1), then 2 single-token passes
        c = srv.cost
        first = c.forward_s(65, 1, kv_read_tokens=65, prefill_attn_pairs=65 * 66 / 2, lm_head_tokens=1,
                            decode_only=False, which="draft")
        rest = sum(c.forward_s(1, 1, kv_read_tokens=64 + j, decode_only=True, which="draft") for j in (2, 3))
        drafts.append(first + rest + srv.uplink_s(3))
    assert r.draft_s == pytest.approx(rep.cost.spec_round_s() + max(drafts), rel=1e-9)
    assert drafts[0] > drafts[1]  # the L4 is the slower server: it sets the round
    # FixedOracle(2): each accepts 2 of 3, so each server gets 2 + 1 tokens and the allocation back
    assert r.send_s == pytest.approx(max(s.downlink_s(3) for s in servers))
    assert r.latency_s == pytest.approx(r.draft_s + r.verify_s + r.send_s)


def test_uplink_bytes_grow_with_the_draft_length_times_the_vocabulary() -> None:
    # the same round with S = 1 and S = 5 on one server: the uplink's difference is 4 tokens of (4 + 2·V) bytes
    from repro.sim.proposers import RemoteDraftServer
    from tests.conftest import make_cost

    srv = RemoteDraftServer(make_cost("h100-80g", "qwen3-14b", "qwen3-0.6b"), rtt_s=0.0, bandwidth_bps=8e9)
    assert srv.uplink_s(5) - srv.uplink_s(1) == pytest.approx(4 * (4 + 2 * 151_936) / 1e9)


def test_goodspeed_plays_eq5_on_its_estimates_and_feeds_eq3_with_the_verifiers_acceptance() -> None:
    from systems.goodspeed import GoodSpeed
    from tests.conftest import spy

    pol = GoodSpeed(capacity=6, eta=0.5, beta=0.5)
    plans, results = spy(pol)
    eng = _edge_engine(pol, n_req=2)
    eng.run()
    seen = 0
    for p, r in zip(plans[:len(results)], results, strict=True):
        if p.k is None or not p.k.size or r.accept_prob is None:
            continue
        assert r.accept_prob.shape == r.decode_ids.shape
        assert ((r.accept_prob >= 0) & (r.accept_prob <= r.num_proposed)).all()
        seen += 1
    assert seen
    # the next allocation is Eq. 5 at the state after the last observed round
    rounds = pol.rounds
    s = pol.allocation(np.ones(2, dtype=bool))
    assert s.tolist() == gradient_allocation(1 / rounds.goodput, rounds.alpha, 6).tolist()


def test_each_server_draws_acceptance_from_its_own_model_and_dataset() -> None:
    from repro.experiments.simulate import build, compose

    servers = "[{hardware:l4,model:qwen3-0.6b},{hardware:l4,model:qwen3-1.7b},{hardware:l4,model:qwen3-0.6b}," \
              "{hardware:l4,model:qwen3-1.7b}]"
    b = build(compose(["hardware=h100-80g", "model=qwen3-14b", "model@draft=qwen3-0.6b", "system=goodspeed",
                       "workload=goodspeed_4", "workload.source=embedded", "num_requests=400",
                       f"engine.draft_servers={servers}"]))
    srv = b.deployment.draft_servers  # type: ignore[union-attr]
    assert [s.stream for s in srv] == ["draft", "qwen3-1.7b", "draft", "qwen3-1.7b"]
    client = np.asarray(b.table.client)
    assert client[:8].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]  # dealt round-robin
    assert set(b.table.dataset[client == 2]) == {"cnn_dailymail"}
    levels = {(i, m): np.mean([b.oracle.level(int(r), srv[m]) for r in np.flatnonzero(client == i)])
              for i in (0, 2) for m in (0, 1)}
    # conf/oracle: 0.6B alpaca 0.64, CNN/DM 0.68; 1.7B alpaca 0.70, CNN/DM 0.74 (per-request spread 0.1)
    assert levels[(0, 0)] == pytest.approx(0.64, abs=0.03) and levels[(2, 1)] == pytest.approx(0.74, abs=0.03)
    assert levels[(0, 1)] - levels[(0, 0)] == pytest.approx(0.06, abs=0.03)


def test_awq_int4_streams_a_quarter_of_the_linear_weights() -> None:
    from repro.cost.spec import load_model

    fp16, awq = load_model("llama3-70b"), load_model("llama3-70b-awq")
    rest = fp16.weight_params - fp16.linear_params  # embedding and LM head stay in 16 bits
    assert awq.weight_bytes == fp16.linear_params // 2 + rest * 2
    assert awq.kv_bytes_per_token == fp16.kv_bytes_per_token
    from tests.conftest import make_cost

    a, f = make_cost("h100-80g", "llama3-70b-awq", None), make_cost("h100-80g", "llama3-70b", None)
    assert a.forward_s(8, 8, kv_read_tokens=800, decode_only=True) < 0.4 * f.forward_s(8, 8, kv_read_tokens=800,
                                                                                      decode_only=True)


@pytest.mark.parametrize("goodput,alpha,decoding,expected", [
    ([1.0, 4.0], [0.8, 0.5], [True, True], [3, 0]),   # weights 1, 0.25: gains 0.8, 0.64, 0.512 beat 0.125
    ([4.0, 1.0], [0.8, 0.5], [True, True], [1, 2]),   # weights 0.25, 1: 0.5, then 0.25 vs 0.2, then 0.2 vs 0.125
    ([1.0, 1.0], [0.8, 0.5], [False, True], [0, 3]),  # a client computing its prompt gets nothing
])
def test_goodspeed_allocation_weights_by_the_inverse_smoothed_goodput(goodput: list[float], alpha: list[float],
                                                                       decoding: list[bool], expected: list[int]
                                                                       ) -> None:
    from systems.goodspeed import GoodSpeed

    pol = GoodSpeed(capacity=3)
    pol.rounds = EdgeRounds(2)
    pol.rounds.goodput[:] = goodput
    pol.rounds.alpha[:] = alpha
    assert pol.allocation(np.array(decoding)).tolist() == expected


def test_fixed_s_spends_the_whole_budget_round_robin() -> None:
    """C = 20 over N = 8 servers: 2 each and the 4 left over one each to servers in turn, so every round drafts 20
    and over two rounds every server drafts 5; ``remainder: drop`` (fixed_s_floor) drafts 16."""
    from systems.fixed_s import allocation

    rounds = [allocation(20, 8, r) for r in range(4)]
    assert all(s.sum() == 20 and set(s.tolist()) == {2, 3} for s in rounds)
    assert (rounds[0] + rounds[1]).tolist() == [5] * 8 and rounds[2].tolist() == rounds[0].tolist()
    assert allocation(20, 8, None).tolist() == [2] * 8
    assert allocation(16, 8, 3).tolist() == [2] * 8 and allocation(24, 4, 1).tolist() == [6] * 4


@pytest.mark.parametrize(("system", "drafted"), [("fixed_s", 6), ("fixed_s_floor", 4), ("random_s_whole", 6)])
def test_a_round_of_the_baselines_drafts_their_budget(system: str, drafted: int) -> None:
    """Through the engine: C = 6 over 4 clients drafts 6 tokens a decoding round (1 each and 2 in turn) for the
    whole-budget readings, 4 for the floor."""
    from repro.experiments.simulate import compose, instantiate_system
    from tests.conftest import spy

    pol = instantiate_system(compose([f"system={system}", "system.capacity=6"]).system)
    plans, results = spy(pol)
    _edge_engine(pol, n_req=4, servers=("l4",) * 4).run()
    full = [p.k for p, r in zip(plans, results, strict=False) if p.k is not None and r.decode_ids.size == 4]
    assert full and all(int(k.sum()) == drafted for k in full)


# --- the even split, goodput per second and the measured-acceptance case ---------------------------------------------

def test_even_goodput_is_fixed_s_time_average_and_never_above_the_optimum() -> None:
    """C = 20 over 8 clients at α = 0.5: 2 drafts in half the rounds and 3 in the other half, x = (1.75 + 1.875) / 2
    each, which is also x* (identical clients); with heterogeneous α the even split is below U(x*)."""
    from repro.metrics.fairness import even_goodput, optimal_goodput

    assert even_goodput(np.full(8, 0.5), 20).tolist() == pytest.approx([1.8125] * 8)
    assert even_goodput(np.array([0.6, 0.6, 0.6, 0.6]), 8).tolist() == pytest.approx([1.96] * 4)  # 1 + α + α²
    assert utility(optimal_goodput(np.full(8, 0.5), 20)) == pytest.approx(utility(even_goodput(np.full(8, 0.5), 20)))
    a = np.array([0.684, 0.272, 0.679, 0.504, 0.689, 0.593, 0.734, 0.836])
    assert utility(optimal_goodput(a, 20)) - utility(even_goodput(a, 20)) > 0.2


def test_goodput_per_second_is_the_clients_tokens_over_the_wall_time() -> None:
    """GoodSpeed's goodput per second (output_throughput) = Σ_i (client i's tokens) / the rounds' wall time
    (receiving + verifying + sending), and its utility per second (sum_log_goodput) = U(x̄) + N · log(rounds / wall):
    recomputed here from the run's requests and steps tables."""
    from repro.experiments.simulate import compose, run_point

    servers = "[{hardware:l4,model:qwen3-0.6b},{hardware:l4,model:qwen3-0.6b},{hardware:l4,model:qwen3-0.6b}," \
              "{hardware:l4,model:qwen3-0.6b}]"
    r = run_point(compose(["hardware=h100-80g", "model=qwen3-14b", "model@draft=qwen3-0.6b", "system=fixed_s",
                           "system.capacity=8", "workload=goodspeed_4", "workload.source=embedded",
                           "num_requests=8", "workload.output_len=20", "max_steps=12", "engine.record_steps=true",
                           f"engine.draft_servers={servers}"]))
    m, req, steps = r.metrics, r.requests, r.steps
    assert steps is not None and len(steps) == 12
    wall = float((steps["draft_s"] + steps["verify_s"] + steps["send_s"]).sum())
    assert wall == pytest.approx(m["sim_time_s"])
    tokens = req.groupby("client")["output_len"].sum().reindex(range(4), fill_value=0).to_numpy(dtype=float)
    assert tokens.sum() == pytest.approx(float(steps["num_emitted"].sum()))  # accepted + bonus, prompts' first too
    assert m["output_throughput"] == pytest.approx(tokens.sum() / wall)
    assert m["utility"] == pytest.approx(utility(tokens / 12))
    assert m["sum_log_goodput"] == pytest.approx(utility(tokens / wall))
    assert m["sum_log_goodput"] == pytest.approx(m["utility"] + 4 * np.log(12 / wall))
    assert m["even_gap"] == pytest.approx(m["utility_opt"] - m["utility_even"]) and m["even_gap"] >= -1e-9


#: conf/oracle/specdecode_bench.yaml: per-token acceptance per (dataset, proposer) from SpecDecode-Bench's recording
MEASURED = {"sdb_gsm8k_eagle3": 0.684, "sdb_gsm8k_ngram": 0.272, "sdb_cnn_eagle3": 0.679, "sdb_cnn_ngram": 0.504,
            "sdb_sharegpt_eagle3": 0.689, "sdb_sharegpt_ngram": 0.593, "sdb_instructcoder_eagle3": 0.734,
            "sdb_instructcoder_ngram": 0.836}


def _measured_script() -> Any:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "make_measured_acceptance.py"
    spec = importlib.util.spec_from_file_location("make_measured_acceptance", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chain_acceptance_is_accepted_over_tested_by_hand() -> None:
    """Spans 1, 5, 3 and 9 cut at 4 drafts: accepted 0, 4, 2, 4 of tested 1, 4, 3, 4 → 10 / 12."""
    assert _measured_script().chain_acceptance(np.array([1, 5, 3, 9]), 4) == pytest.approx(10 / 12)


def test_measured_table_is_what_the_recording_gives() -> None:
    """The committed table (both drafts' servers) equals the estimator on SpecDecode-Bench's files, when present."""
    from repro.experiments.simulate import compose
    from tests.conftest import data_root

    accept = compose(["oracle=specdecode_bench"]).oracle.accept
    for draft, gsm8k in (("llama3.2-1b", 0.82), ("llama3.2-3b", 0.84)):
        table = accept[draft]["llama3-70b-awq"]
        assert {k: table[k] for k in MEASURED} == MEASURED
        assert table["gsm8k"] == gsm8k  # default.yaml's datasets stay
    root = data_root()
    if root is None or not (root / "specdecode_bench").is_dir():
        pytest.skip("needs the data folder's specdecode_bench/")
    got = {k: v[0] for k, v in _measured_script().measured_acceptance(root).items()}
    assert got == MEASURED


def test_measured_case_gives_each_client_its_measured_acceptance() -> None:
    """goodspeed_fig4's measured case: client i gets the i-th label's α on its server, 1B or 3B alike."""
    from repro.experiments.simulate import build, compose

    b = build(compose(["+exp=goodspeed_fig4", "system=goodspeed", "server_set=llama8", "model=llama3-70b-awq",
                       "model@draft=llama3.2-1b", "workload=goodspeed_measured", "oracle=specdecode_bench",
                       "workload.source=embedded"]))
    srv = b.deployment.draft_servers  # type: ignore[union-attr]
    assert [s.stream for s in srv] == ["draft", "llama3.2-3b"] * 4
    client = np.asarray(b.table.client)
    for i, (label, alpha) in enumerate(MEASURED.items()):
        mine = np.flatnonzero(client == i)
        assert set(b.table.dataset[mine]) == {label}
        assert np.mean([b.oracle.level(int(r), srv[i]) for r in mine]) == pytest.approx(alpha, abs=0.03)
