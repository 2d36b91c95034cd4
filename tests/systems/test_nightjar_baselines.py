"""Nightjar's dynamic-speculation baselines (§6.1): DSD's goodput argmax and its decision deadlock, BanditSpec's UCB
on fixed reward sequences and through the engine, TETRIS's budgeted selection, its host cost and its chain-shaped
trees, which the vLLM v0 engine charges exactly like chains."""

from __future__ import annotations

import math

import numpy as np
import pytest

from repro.cost.serving import load_engine
from repro.cost.step import DecodeBatch, PrefillBatch, verify_pass
from repro.oracle import Drafter, TokenOracle
from repro.sim.plan import CandidateTree, StepPlan, TreeSpec, ids
from repro.sim.state import View
from repro.sim.trace import StepRecord
from systems.banditspec import UCB, BanditSpec
from systems.dsd import DSD
from systems.static_sd import StaticSD
from systems.tetris import TETRIS, chain_counts, ranking_host_s, select_drafts
from systems.trees import rank_nodes, select_global, tree_specs
from systems.turbospec import LatencyFit, StepLatencyModel
from tests.conftest import FixedOracle, make_engine, make_requests, run, spy

ENGINE = "vllm_v0"  # the engine every config of these baselines names


# --- DSD ----------------------------------------------------------------------------------------------------------


def plane(alpha: float, gamma: float, delta: float) -> LatencyFit:
    """T = alpha·N_context + gamma·N_batched + delta (one bucket)."""
    return LatencyFit(np.array([np.inf]), np.array([alpha]), np.array([gamma]), np.array([delta]))


# target: 10 ms of weights, 60 µs per batched token, 0.5 µs per context token; draft: 0.4 ms + 2 µs per token,
# plus 0.8 ms per speculation round
FIT = StepLatencyModel("draft", plane(5e-7, 6e-5, 1e-2), plane(1e-8, 2e-6, 4e-4), 8e-4, 0.0, 0.0)


def goodput_argmax(alpha: float, batch: int, context: float, max_len: int) -> int:
    """Expected generated tokens / predicted step time, spelled out per γ (ties → the smaller γ)."""
    best, best_g = 0, -1.0
    for k in range(max_len + 1):
        tokens = batch * sum(alpha**i for i in range(k + 1))  # accepted + bonus per request
        t = 5e-7 * context + 6e-5 * batch * (k + 1) + 1e-2
        if k:
            t += 8e-4 + k * (1e-8 * context + 2e-6 * batch + 4e-4)
        if tokens / t > best_g:
            best, best_g = k, tokens / t
    return best


def record_dsd(pol: DSD) -> list[tuple[float, int, float, int]]:
    """(α, batch, Σ context, γ) of every decode step ``pol`` plans."""
    seen: list[tuple[float, int, float, int]] = []
    inner = pol.schedule

    def rec(view: View) -> StepPlan:
        alpha = pol.acceptance.alpha
        plan = inner(view)
        if plan.decode_ids.size:
            assert plan.k is not None and (plan.k == plan.k[0]).all()
            seen.append((alpha, int(plan.decode_ids.size), float(view.num_computed[plan.decode_ids].sum()),
                         int(plan.k[0])))
        return plan

    pol.schedule = rec  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize(("init_acceptance", "batch", "accept", "gammas"), [
    (0.9, 1, 5, {5}),        # accurate drafts, one request: the longest γ (Γ_max = 5)
    (0.5, 8, 1, {3}),        # one token of each chain of 3 accepted: α = 1/2 = the prior
    (0.6, 16, 2, {3}),       # two of three accepted: α = 2/3
    (0.3, 4, 0, {2, 1, 0}),  # nothing accepted: γ shrinks as α falls, to 0
    (0.3, 32, 0, {1, 0}),    # ... faster at batch 32 (32 tested tokens a step)
    (0.4, 64, 1, {1, 5}),    # γ = 1 all accepted → α = 1 → γ = 5, one of five accepted → α = 1/3 → γ = 1 ...
])
def test_dsd_picks_the_goodput_argmax(init_acceptance: float, batch: int, accept: int, gammas: set[int]) -> None:
    pol = DSD(init_acceptance=init_acceptance, window=64)
    eng = make_engine(pol, make_requests(batch, prompt_len=64, output_len=24), oracle=FixedOracle(accept),
                      engine=ENGINE)
    pol.latency = FIT  # the hand latency model instead of the profiled one
    seen = record_dsd(pol)
    eng.run()
    assert seen
    for alpha, b, context, k in seen:
        assert k == goodput_argmax(alpha, b, context, 5), (alpha, b, context)
    assert {k for *_, k in seen} == gammas


def test_dsd_profiles_the_cost_model_and_speculates() -> None:
    pol = DSD()
    out = run(pol, make_requests(4, output_len=32), oracle=FixedOracle(3), engine=ENGINE)
    assert out.state.num_proposed.sum() > 0
    assert pol.latency.target(4 * 64, 4) > 0 and pol.acceptance.alpha > 0.7  # 3 of every 4 tested accepted


class LateOracle(FixedOracle):
    """Rejects every draft token before output position ``switch``, accepts every one from there on."""

    def __init__(self, switch: int) -> None:
        super().__init__(0)
        self.switch = switch

    def score_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                    proposer: str = "draft") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = np.asarray(k, dtype=np.int64)
        accepted = np.where(np.asarray(pos) >= self.switch, k, 0)
        return k.copy(), accepted, accepted.copy()


def test_dsd_deadlock_low_prior_never_speculates() -> None:
    # every draft would be accepted, but a prior of 0.05 makes γ = 0 the goodput argmax: nothing is ever drafted, so
    # the acceptance history never sees the truth and γ stays 0 for the whole run
    pol = DSD(init_acceptance=0.05)
    plans, _ = spy(pol)
    out = run(pol, make_requests(4, output_len=48), oracle=FixedOracle(5), engine=ENGINE)
    decode = [p for p in plans if p.decode_ids.size]
    assert len(decode) == 47 and all(p.k is not None and not p.k.any() for p in decode)
    assert out.state.num_proposed.sum() == 0 and pol.acceptance.alpha == 0.05
    speculating = DSD(init_acceptance=0.7)  # the same run from the usual prior speculates
    assert run(speculating, make_requests(4, output_len=48), oracle=FixedOracle(5),
               engine=ENGINE).state.num_proposed.sum() > 0


def test_dsd_deadlock_after_a_bad_phase() -> None:
    # drafts are rejected for the first 8 output positions, then all accepted; DSD switches speculation off
    # during the bad phase and never looks again: γ = 0 and α frozen for every later step
    pol = DSD(window=8)
    seen = record_dsd(pol)
    out = run(pol, make_requests(4, output_len=64), oracle=LateOracle(8), engine=ENGINE)
    ks = [k for *_, k in seen]
    assert ks[0] > 0 and 0 in ks
    off = ks.index(0)
    assert off < 8 and len(ks) - off > 50  # the good phase is long, yet...
    assert all(k == 0 for k in ks[off:])  # ... speculation never comes back
    assert len({alpha for alpha, *_ in seen[off:]}) == 1 and seen[off][0] < 0.2
    assert out.state.num_accepted.sum() == 0


# --- BanditSpec -----------------------------------------------------------------------------------------------------


def bonus(t: int, n: int) -> float:
    return math.sqrt(2.0 * math.log(t) / n)


def test_ucb_warm_up_plays_every_arm_once_in_order() -> None:
    ucb = UCB(4)
    for arm, reward in enumerate([5.0, 1.0, 9.0, 3.0]):
        assert ucb.select() == arm == ucb.select()  # select does not change the state
        ucb.update(arm, reward)
    assert ucb.counts.tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(("history", "index", "arm"), [
    # warm-up rewards 2, 4, 1: t = 3, means / max = 0.5, 1, 0.25, one pull each
    ([(0, 2.0), (1, 4.0), (2, 1.0)], [0.5 + bonus(3, 1), 1.0 + bonus(3, 1), 0.25 + bonus(3, 1)], 1),
    # arm 1 again (reward 4): t = 4; its mean stays 1 with half the bonus: still the largest index
    ([(0, 2.0), (1, 4.0), (2, 1.0), (1, 4.0)], [0.5 + bonus(4, 1), 1.0 + bonus(4, 2), 0.25 + bonus(4, 1)], 1),
    # then reward 0 on arm 1: mean 8/3 / 4 = 2/3 over 3 pulls; arm 0's exploration bonus wins
    ([(0, 2.0), (1, 4.0), (2, 1.0), (1, 4.0), (1, 0.0)],
     [0.5 + bonus(5, 1), 2.0 / 3.0 + bonus(5, 3), 0.25 + bonus(5, 1)], 0),
    # a new maximum renormalizes every mean: reward 8 on arm 2 → means 2/8, 4/8, (1 + 8)/2/8; arm 1 leads
    ([(0, 2.0), (1, 4.0), (2, 1.0), (2, 8.0)], [0.25 + bonus(4, 1), 0.5 + bonus(4, 1), 0.5625 + bonus(4, 2)], 1),
])
def test_ucb_index_by_hand(history: list[tuple[int, float]], index: list[float], arm: int) -> None:
    ucb = UCB(3, c=1.0)
    for a, r in history:
        ucb.update(a, r)
    assert ucb.index() == pytest.approx(index)
    assert ucb.select() == arm


@pytest.mark.parametrize("seed", range(10))
def test_ucb_select_is_the_argmax_of_its_index(seed: int) -> None:
    # select's arm-by-arm loop against numpy's argmax over index(): unplayed arms, equal arms (ties), c = 0
    rng = np.random.default_rng(seed)
    for _ in range(200):
        ucb = UCB(int(rng.integers(1, 7)), c=float(rng.choice([0.0, 0.5, 1.0])))
        for _ in range(int(rng.integers(0, 30))):
            arm = int(rng.integers(ucb.counts.size))
            ucb.update(arm, float(rng.choice([0.0, 100.0, 250.0, rng.uniform(0.0, 500.0)])))
        assert ucb.select() == int(np.argmax(ucb.index()))


def test_ucb_is_scale_free_and_c_weighs_exploration() -> None:
    history = [(0, 2.0), (1, 4.0), (2, 1.0), (1, 4.0), (1, 0.0)]
    small, large, greedy = UCB(3), UCB(3), UCB(3, c=0.0)
    for a, r in history:
        small.update(a, r)
        large.update(a, 1000.0 * r)
        greedy.update(a, r)
    assert small.index() == pytest.approx(large.index()) and small.select() == large.select() == 0
    assert greedy.index() == pytest.approx([0.5, 2.0 / 3.0, 0.25]) and greedy.select() == 1  # c = 0: best mean


@pytest.mark.parametrize(("rewards", "c", "arm"), [
    ([3.0, 3.0, 3.0], 1.0, 0),   # all equal: the smallest arm
    ([1.0, 3.0, 3.0], 1.0, 1),   # arms 1 and 2 tie above arm 0
    ([0.0, 0.0, 0.0], 1.0, 0),   # no reward yet: no scale, all equal
    ([1.0, 2.0, 2.0], 0.0, 1),   # greedy tie
])
def test_ucb_ties_go_to_the_smallest_arm(rewards: list[float], c: float, arm: int) -> None:
    ucb = UCB(3, c=c)
    for a, r in enumerate(rewards):
        ucb.update(a, r)
    assert ucb.select() == arm


def test_banditspec_plays_its_arms_through_the_engine() -> None:
    pol = BanditSpec(max_len=3)
    plans, results = spy(pol)
    eng = make_engine(pol, make_requests(4, output_len=40), oracle=FixedOracle(1), engine=ENGINE, record_steps=True)
    out = eng.run()
    ran = [p for p in plans if not p.is_idle]  # the engine observes every step that ran
    decode = [(p, r) for p, r in zip(ran, results, strict=True) if p.decode_ids.size]
    assert all(p.telemetry is None for p in plans if not p.decode_ids.size)  # a prefill step plays no arm
    gammas = [int(p.telemetry["gamma"]) for p, _ in decode if p.telemetry is not None]
    assert len(gammas) == len(decode) and gammas[:4] == [0, 1, 2, 3]  # warm-up in order
    assert all(p.k is not None and (p.k == g).all() for (p, _), g in zip(decode, gammas, strict=True))
    # every decode step is one play, rewarded by its goodput (tokens emitted / step latency)
    assert pol.ucb.counts.tolist() == np.bincount(gammas, minlength=4).tolist()
    reward = np.array([r.num_emitted.sum() / r.latency_s for _, r in decode])
    assert pol.ucb.sums == pytest.approx(np.bincount(gammas, weights=reward, minlength=4))
    # the steps table carries the arm beside the step
    tel = [t["gamma"] for t in out.step_telemetry if t]
    assert tel == gammas and out.state.num_proposed.sum() == 4 * sum(gammas)


def test_banditspec_without_exploration_exploits_the_best_warm_up_arm() -> None:
    pol = BanditSpec(max_len=3, c=0.0)
    plans, _ = spy(pol)
    run(pol, make_requests(4, output_len=40), oracle=FixedOracle(3), engine=ENGINE)
    gammas = [int(p.telemetry["gamma"]) for p in plans if p.telemetry is not None]
    best = int(np.argmax(pol.ucb.sums / pol.ucb.counts))
    assert best == 3  # every draft accepted: the longest chain has the best goodput
    assert gammas[:4] == [0, 1, 2, 3] and all(g == best for g in gammas[4:])


# --- TETRIS ---------------------------------------------------------------------------------------------------------


def chain(rid: int, probs: list[float], pos: int = 0) -> CandidateTree:
    """A width-1 candidate tree (a chain) with the draft's conditional probabilities ``probs``."""
    n = len(probs)
    p = np.array(probs)
    return CandidateTree(rid, pos, np.arange(n) - 1, np.arange(1, n + 1), np.zeros(n, dtype=np.int64), p,
                         np.cumprod(p), n, 1)


# request 0: path probabilities 0.9, 0.72, 0.36; request 1: 0.6, 0.54, 0.486. By conditional probability request 1's
# deeper tokens (0.9, 0.9) would come first; by path probability they come last.
PAIR = [chain(0, [0.9, 0.8, 0.5]), chain(1, [0.6, 0.9, 0.9])]


@pytest.mark.parametrize(("budget", "expected"), [
    (0, {0: [], 1: []}),
    (1, {0: [0], 1: []}),             # 0.9
    (2, {0: [0, 1], 1: []}),          # + 0.72
    (3, {0: [0, 1], 1: [0]}),         # + 0.6
    (4, {0: [0, 1], 1: [0, 1]}),      # + 0.54
    (5, {0: [0, 1], 1: [0, 1, 2]}),   # + 0.486
    (6, {0: [0, 1, 2], 1: [0, 1, 2]}),
    (9, {0: [0, 1, 2], 1: [0, 1, 2]}),
])
def test_tetris_selects_the_most_probable_tokens_of_the_batch(budget: int, expected: dict[int, list[int]]) -> None:
    trees = select_drafts(PAIR, budget)
    assert {rid: t.nodes.tolist() for rid, t in trees.items()} == expected
    assert all(t.cand is PAIR[rid] for rid, t in trees.items())


def test_tetris_ties_go_to_shallower_tokens_then_earlier_requests() -> None:
    cands = [chain(0, [0.5, 0.5]), chain(1, [0.5, 1.0]), chain(2, [0.25])]  # path 0.5, 0.25 | 0.5, 0.5 | 0.25
    assert {r: t.nodes.tolist() for r, t in select_drafts(cands, 2).items()} == {0: [0], 1: [0], 2: []}
    assert {r: t.nodes.tolist() for r, t in select_drafts(cands, 3).items()} == {0: [0], 1: [0, 1], 2: []}
    # 0.25 twice: request 2's depth-1 token before request 0's depth-2 one
    assert {r: t.nodes.tolist() for r, t in select_drafts(cands, 4).items()} == {0: [0], 1: [0, 1], 2: [0]}


def test_tetris_chain_ranking_equals_the_tree_ranking() -> None:
    # chain_counts (one sort of the batch's chains) against the general ranking of candidate trees (systems.trees):
    # the same prefixes, ties (rounded probabilities) and degenerate budgets included
    rng = np.random.default_rng(5)
    for _ in range(300):
        n, m = int(rng.integers(1, 40)), int(rng.integers(1, 5))
        cands = [chain(i, np.round(rng.random(m), int(rng.integers(1, 3))).tolist()) for i in range(n)]
        budget = int(rng.integers(-1, n * m + 3))
        ranked = rank_nodes(cands)
        want = select_global(ranked, np.zeros(n, dtype=np.int64), budget)
        got = chain_counts(cands, budget)
        assert got is not None and got.tolist() == want.tolist()
        assert {r: t.nodes.tolist() for r, t in select_drafts(cands, budget).items()} \
            == {r: t.nodes.tolist() for r, t in tree_specs(ranked, want).items()}
    up = CandidateTree(1, 0, np.array([-1, 0]), np.array([1, 2]), np.zeros(2, dtype=np.int64), np.array([0.5, 1.0]),
                       np.array([0.5, 0.6]), 2, 1)
    rising = [chain(0, [0.5, 0.5]), up]
    assert chain_counts(rising, 2) is None  # a path probability that rises: ranked as a tree
    ranked = rank_nodes(rising)
    assert {r: t.nodes.tolist() for r, t in select_drafts(rising, 2).items()} \
        == {r: t.nodes.tolist() for r, t in tree_specs(ranked, select_global(ranked, np.zeros(2, int), 2)).items()}


def oracle_and_drafter(n: int) -> tuple[TokenOracle, Drafter]:
    oracle = TokenOracle(0, np.full(n, "x", dtype=object), {"x": 0.6}, width=4)
    return oracle, Drafter(oracle)


@pytest.mark.parametrize(("batch", "budget_per_seq"), [(1, 2.0), (6, 2.0), (6, 1.5), (5, 0.5)])
def test_tetris_verifies_prefixes_of_the_most_probable_drafts_within_the_budget(batch: int,
                                                                               budget_per_seq: float) -> None:
    pol = TETRIS(gamma=3, budget_per_seq=budget_per_seq)
    plans, results = spy(pol)
    oracle, drafter = oracle_and_drafter(batch)
    run(pol, make_requests(batch, output_len=20), oracle=oracle, drafter=drafter, engine=ENGINE)
    ran = [p for p in plans if not p.is_idle]
    steps = [(p, r) for p, r in zip(ran, results, strict=True) if p.decode_ids.size]
    assert steps
    for p, r in steps:
        assert p.trees is not None and sorted(p.trees) == sorted(p.decode_ids.tolist())
        n = int(p.decode_ids.size)
        counts = np.array([p.trees[rid].num_nodes for rid in p.decode_ids.tolist()])
        assert counts.sum() == min(math.floor(budget_per_seq * n), 3 * n)  # the whole budget C, or every draft
        selected, dropped = [], []
        for rid, c in zip(p.decode_ids.tolist(), counts.tolist(), strict=True):
            t = p.trees[rid]
            assert t.cand.draft_width == 1 and t.cand.draft_depth == 3  # a chain of γ drafted for everyone
            assert t.nodes.tolist() == list(range(c))  # a prefix of its chain
            selected += t.cand.path_prob[:c].tolist()
            dropped += t.cand.path_prob[c:].tolist()
        assert not selected or not dropped or min(selected) >= max(dropped)  # the most probable of the batch
        assert p.host_s == pytest.approx(ranking_host_s(3 * n, 5e-5, 2e-7))
        assert r.num_proposed.tolist() == counts.tolist()


@pytest.mark.parametrize(("batch", "host_s"), [
    (1, 5e-5 + 2e-7 * 3 * math.log2(3)),        # 51 µs
    (8, 5e-5 + 2e-7 * 24 * math.log2(24)),      # 72 µs
    (64, 5e-5 + 2e-7 * 192 * math.log2(192)),   # 0.34 ms
    (256, 5e-5 + 2e-7 * 768 * math.log2(768)),  # 1.52 ms
])
def test_tetris_host_cost_grows_with_the_batch(batch: int, host_s: float) -> None:
    assert ranking_host_s(3 * batch, 5e-5, 2e-7) == pytest.approx(host_s)
    assert ranking_host_s(3 * batch, 5e-5, 2e-7) > ranking_host_s(3 * (batch - 1), 5e-5, 2e-7)
    assert ranking_host_s(0, 5e-5, 2e-7) == 0.0


def test_tetris_charges_its_host_cost_per_step() -> None:
    # full budget (C = B·γ) and no host cost: TETRIS verifies exactly static SD's chains, step for step (the width-1
    # trees are drafted and scored like chains); with its host cost every step is longer by exactly host_s
    reqs = make_requests(6, prompt_len=[40, 80, 120, 160, 200, 240], output_len=[12, 16, 20, 24, 28, 32])

    def steps(pol: StaticSD | TETRIS) -> tuple[list[StepPlan], list[StepRecord]]:
        plans, _ = spy(pol)
        oracle, drafter = oracle_and_drafter(6)
        out = run(pol, reqs, oracle=oracle, drafter=drafter, engine=ENGINE, record_steps=True)
        return [p for p in plans if not p.is_idle], out.steps

    _, ref = steps(StaticSD(k=3))
    _, free = steps(TETRIS(gamma=3, budget_per_seq=3.0, host_fixed_s=0.0, host_per_token_log_s=0.0))
    plans, paid = steps(TETRIS(gamma=3, budget_per_seq=3.0))
    assert len(ref) == len(free) == len(paid)
    for a, b, c, p in zip(ref, free, paid, plans, strict=True):
        assert (b.num_accepted, b.num_proposed, b.num_emitted) == (a.num_accepted, a.num_proposed, a.num_emitted)
        assert b.draft_s == pytest.approx(a.draft_s) and b.verify_s == pytest.approx(a.verify_s)
        assert c.latency_s == pytest.approx(a.latency_s + p.host_s)
        assert p.host_s > 0 or not p.decode_ids.size


# --- the engine: a chain-shaped tree is verified like a chain -------------------------------------------------------


def decode_batch(k: list[int], trees: dict[int, TreeSpec]) -> DecodeBatch:
    n = len(k)
    kk = np.array(k, dtype=np.int64)
    return DecodeBatch(ids(range(n)), np.full(n, 5, dtype=np.int64), np.array([100, 300, 700][:n]), kk, kk > 0,
                       trees, None)


NO_PREFILL = PrefillBatch(ids(), ids(), 0.0, np.zeros(0, dtype=bool))


def wide(rid: int, nodes: int) -> CandidateTree:
    """A width-2 beam holding ``nodes`` nodes (depth ⌈nodes/2⌉)."""
    depth = np.repeat(np.arange(1, nodes // 2 + 2), 2)[:nodes]
    parent = np.array([-1 if d == 1 else 2 * (d - 2) for d in depth])
    return CandidateTree(rid, 5, parent, depth, np.tile([0, 1], nodes)[:nodes], np.full(nodes, 0.5),
                         0.5**depth, int(depth.max()), 2)


@pytest.mark.parametrize("k", [[1], [3], [5], [3, 0, 5], [2, 4, 1]])
def test_width_one_tree_costs_like_a_chain_under_batch_expansion(k: list[int]) -> None:
    profile = load_engine(ENGINE)
    assert profile.scorer == "batch_expansion"
    chains = verify_pass(profile, NO_PREFILL, decode_batch(k, {}))
    trees = {i: TreeSpec(chain(i, [0.5] * max(n, 1), pos=5), ids(range(n))) for i, n in enumerate(k)}
    as_trees = verify_pass(profile, NO_PREFILL, decode_batch(k, trees))
    assert as_trees == chains
    # a tree that branches is still one multi-token query: fewer sequences than its expansion
    branching = {i: TreeSpec(wide(i, n), ids(range(n))) for i, n in enumerate(k) if n}
    shape, _ = verify_pass(profile, NO_PREFILL, decode_batch(k, branching))
    assert shape.num_seqs == len(k) < chains[0].num_seqs
