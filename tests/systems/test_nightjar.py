"""Nightjar (Algorithm 1, Eq. 3, §5's elastic memory) and its Fig. 12 ablations: hand-computable cases."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from repro.cost.serving import EngineProfile
from repro.experiments.compose import Composer, hydra_context
from repro.sim.plan import MemoryAction
from repro.sim.state import RequestState, View
from systems.nightjar import (
    AdaBinGreedy,
    BinGreedy,
    ElasticMemory,
    LinearBandit,
    Nightjar,
    eq3,
    mvn_draw,
    mvn_factor,
    profile_c_prefill,
    switch_costs,
)
from tests.conftest import FixedOracle, exp_points, make_cost, make_engine, make_requests, spy

# the paper's 7B deployment: DeepSeek-R1-Distill-Qwen-7B + the 0.5B draft on one RTX 4090 (vLLM 0.8.2 V0)
PAPER = {"hardware": "rtx4090", "model": "qwen2.5-7b", "draft": "qwen2.5-0.5b", "engine": "vllm_v0"}


class Seq:
    """A stand-in random generator: ``random()`` returns the given values in turn, ``integers`` a fixed arm."""

    def __init__(self, uniforms: list[float], arm: int = 0) -> None:
        self.u = list(uniforms)
        self.arm = arm

    def random(self) -> float:
        return self.u.pop(0)

    def integers(self, n: int) -> int:
        return self.arm


# --- Algorithm 1's bookkeeping -------------------------------------------------------------------------------------

def test_bins_and_blocks_follow_algorithm_1() -> None:
    # H = 2^(j-1); a bin lasts floor(√H) rounds and a block floor(√H) bins: blocks of 1, 1, 4, 4, 16 rounds
    st = BinGreedy(num_arms=3)
    trace = []
    for _ in range(26):
        trace.append((st.j, st.b, st.tau))
        st.update(0, 1.0)
    assert trace[:11] == [(1, 1, 1), (2, 1, 1), (3, 1, 1), (3, 1, 2), (3, 2, 1), (3, 2, 2), (4, 1, 1), (4, 1, 2),
                          (4, 2, 1), (4, 2, 2), (5, 1, 1)]
    assert trace[10:27:4] == [(5, 1, 1), (5, 2, 1), (5, 3, 1), (5, 4, 1)]
    assert (st.j, st.h, st.b, st.tau) == (6, 32, 1, 1)


@pytest.mark.parametrize("b,p", [(1, 1.0), (2, 1 / math.sqrt(2)), (4, 0.5), (9, 1 / 3)])
def test_a_new_bin_explores_with_probability_one_over_root_b(b: int, p: float) -> None:
    st = BinGreedy(num_arms=4, b=b)
    assert st.explore_prob == pytest.approx(p)
    st.means[:] = [1.0, 3.0, 2.0, 0.5]
    # the bin type is drawn at τ = 1 only: u just below p explores, just above exploits (arm 1, the best)
    assert BinGreedy(4, b=b).select(Seq([p - 1e-9], arm=3), np.zeros(4)) == (3, True)  # type: ignore[arg-type]
    st.tau = 1
    assert st.select(Seq([p + 1e-9]), np.zeros(4)) == (1, False)  # type: ignore[arg-type]
    st.tau = 2  # mid-bin: keeps the bin's type without drawing
    assert st.select(Seq([]), np.zeros(4)) == (1, False)  # type: ignore[arg-type]


def test_goodput_means_are_incremental() -> None:
    st = BinGreedy(num_arms=2)
    for r in (100.0, 200.0, 600.0):
        st.update(1, r)
    assert st.means.tolist() == [0.0, pytest.approx(300.0)] and st.visits.tolist() == [0, 3]


def test_per_batch_size_state_is_independent_unless_contextless() -> None:
    sel = AdaBinGreedy(3)
    sel.update(8, 1, 50.0)
    sel.update(8, 1, 50.0)
    assert sel.of(8).visits[1] == 2 and sel.of(16).visits.sum() == 0 and sel.of(8).j == 3
    flat = AdaBinGreedy(3, contextual=False)
    flat.update(8, 1, 50.0)
    assert flat.of(16).visits[1] == 1
    buckets = AdaBinGreedy(3, pow2=True)  # ours: batch sizes 5-8 share a state, 9-16 the next
    buckets.update(5, 2, 50.0)
    assert buckets.of(8).visits[2] == 1 and buckets.of(9).visits.sum() == 0 and buckets.of(4).visits.sum() == 0


# --- Eq. 3 ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("means,prev,c,expected", [
    # goodput (tok/s) of γ = 0, 1, 2; without the switching term the best goodput wins
    ([1000.0, 1200.0, 1100.0], 1, 0.5, 1),
    # speculation was off: 1/1200 + 0.002/1 = 2.83 ms > 1/1000 = 1 ms: stay at γ = 0
    ([1000.0, 1200.0, 1100.0], 0, 0.002, 0),
    # a tiny switching cost amortized over γ = 2: 1/1100 + 1e-4/2 = 0.959 ms < 1/1200 + 1e-4 = 0.933 ms? no: γ = 1
    ([1000.0, 1200.0, 1100.0], 0, 1e-4, 1),
    # ... but a larger one makes the longer γ cheaper: 1/1150 + 4e-4/2 = 1.07 ms < 1/1200 + 4e-4 = 1.23 ms
    ([1000.0, 1200.0, 1150.0], 0, 4e-4, 0),
    ([500.0, 1200.0, 1150.0], 0, 4e-4, 2),
    # an arm never observed (g̃ = 0) is never exploited
    ([0.0, 0.0, 900.0], 0, 0.0, 2),
    ([0.0, 0.0, 0.0], 1, 0.0, 0),
])
def test_eq3(means: list[float], prev: int, c: float, expected: int) -> None:
    assert eq3(np.array(means), switch_costs(len(means), prev, c)) == expected


def _eq3_vectorized(means: np.ndarray, switch_cost: np.ndarray) -> int:
    """Eq. 3 as numpy writes it (what :func:`eq3`'s arm-by-arm loop replaced)."""
    with np.errstate(divide="ignore"):
        inv = np.where(means > 0, 1.0 / np.maximum(means, 1e-300), np.inf)
    obj = inv + switch_cost
    return int(np.argmin(obj)) if np.isfinite(obj).any() else 0


@pytest.mark.parametrize("seed", range(20))
def test_eq3_matches_the_vectorized_form(seed: int) -> None:
    # unplayed arms (0), ties (repeated means, switching terms that even them out), tiny means and no switching term
    rng = np.random.default_rng(seed)
    for _ in range(200):
        arms = int(rng.integers(1, 8))
        means = rng.choice([0.0, 0.0, 1e-310, 500.0, 1000.0, 1000.0, 1200.0], arms) * rng.choice([1.0, 1.0, 1.5])
        means = np.where(rng.random(arms) < 0.3, rng.uniform(100.0, 2000.0, arms), means)
        costs = switch_costs(arms, int(rng.integers(0, 2)), float(rng.choice([0.0, 1e-4, 4e-4, 1.0 / 6000.0])))
        assert eq3(means, costs) == _eq3_vectorized(means, costs)


def test_switch_term_only_when_speculation_resumes() -> None:
    assert switch_costs(4, 0, 0.03).tolist() == pytest.approx([0.0, 0.03, 0.015, 0.01])
    assert switch_costs(4, 2, 0.03).tolist() == [0.0] * 4


def test_c_prefill_table_is_the_draft_prefill_and_looks_up_the_next_grid_point() -> None:
    cost = make_cost("rtx4090", "qwen2.5-7b", "qwen2.5-0.5b")
    table = profile_c_prefill(cost, 512, 64)
    assert table.lengths.tolist() == [2**i for i in range(10)]
    assert table.batches.tolist() == [2**i for i in range(7)]
    n = 128 * 32
    draft = cost.forward_s(n, 32, 0.0, 32 * 128 * 129 / 2, 32, False, which="draft")
    assert table(128, 32) == pytest.approx(draft)
    assert table(100, 20) == table(128, 32)  # rounded up to the grid
    assert table(0, 32) == 0.0
    assert table(10**6, 10**6) == table.cost_s[-1, -1]


# --- the system through the engine ------------------------------------------------------------------------------------

def test_nightjar_plays_one_gamma_per_step_and_learns_from_realized_goodput() -> None:
    pol = Nightjar(max_gamma=3)
    plans, results = spy(pol)
    make_engine(pol, make_requests(4, output_len=60), oracle=FixedOracle(2), **PAPER).run()
    dec = [(p, r) for p, r in zip(plans[:len(results)], results, strict=True) if p.decode_ids.size]
    assert dec and all(p.k is not None and len(set(p.k.tolist())) == 1 for p, _ in dec)
    assert {p.telemetry["gamma"] for p, _ in dec if p.telemetry} <= {0.0, 1.0, 2.0, 3.0}
    st = pol.selector.of(4)  # type: ignore[attr-defined]
    played = [(int(p.k[0]), float(r.num_emitted.sum()) / r.latency_s) for p, r in dec
              if p.k is not None and r.decode_ids.size == 4]
    for g in range(4):
        rewards = [x for a, x in played if a == g]
        assert st.visits[g] == len(rewards)
        if rewards:
            assert st.means[g] == pytest.approx(np.mean(rewards))


def test_speculation_off_leaves_the_draft_behind_and_resuming_pays_its_catch_up() -> None:
    pol = Nightjar(max_gamma=2)
    plans, results = spy(pol)
    make_engine(pol, make_requests(2, output_len=200), oracle=FixedOracle(1), **PAPER).run()
    # a decode step with γ = 0 does not run the draft; the next γ > 0 step drafts the missed tokens first
    seen = False
    for i in range(1, len(plans)):
        prev, cur = plans[i - 1], plans[i]
        earlier = plans[i - 2].k
        if prev.k is not None and cur.k is not None and prev.k.size == cur.k.size == 2 and earlier is not None \
                and prev.k[0] == 0 and cur.k[0] > 0 and earlier[0] > 0:
            assert not prev.draft_sync
            same_k = [r.draft_s for p, r in zip(plans[:len(results)], results, strict=True)
                      if p.k is not None and p.k.size == 2 and p.k[0] == cur.k[0] and r is not results[i]]
            assert results[i].draft_s > min(same_k)
            seen = True
            break
    assert seen


def _view(free: int, waiting: int, resident: bool, loading: bool = False) -> View:
    st = RequestState(np.zeros(waiting), np.ones(waiting, dtype=np.int64), np.ones(waiting, dtype=np.int64),
                      np.zeros(waiting), np.zeros(waiting), np.zeros(waiting, dtype=np.int64))
    st.waiting.extend(range(waiting))
    v = View(st, block_size=16, max_model_len=4096, cost=make_cost(), drafter=None)
    v.free_blocks, v.draft_resident, v.draft_loading = free, resident, loading
    return v


def test_expansion_needs_speculation_off_and_scarcity_for_t_persist_steps() -> None:
    mem = ElasticMemory(tau_low=100, s_draft=400, persist=3)
    assert mem.action(_view(50, 5, True), spec_off=True) is None
    assert mem.action(_view(50, 5, True), spec_off=True) is None
    assert mem.action(_view(50, 5, True), spec_off=True) == MemoryAction(offload_draft=True)
    mem = ElasticMemory(tau_low=100, s_draft=400, persist=3)
    for free in (50, 50, 150, 50, 50):  # a step with enough free blocks restarts the window
        assert mem.action(_view(free, 5, True), spec_off=True) is None
    mem = ElasticMemory(tau_low=100, s_draft=400, persist=1)
    assert mem.action(_view(50, 5, True), spec_off=False) is None  # speculation on: never offload


@pytest.mark.parametrize("free,waiting,loading,reload", [
    (501, 0, False, True),    # N_free > S_draft + τ_low and nothing waits
    (500, 0, False, False),   # not strictly above
    (900, 1, False, False),   # a request waits
    (900, 0, True, False),    # already loading
])
def test_contraction_hysteresis(free: int, waiting: int, loading: bool, reload: bool) -> None:
    mem = ElasticMemory(tau_low=100, s_draft=400)
    act = mem.action(_view(free, waiting, resident=False, loading=loading), spec_off=True)
    assert (act == MemoryAction(reload_draft=True)) is reload


def test_offload_expands_by_s_draft_and_reload_migrates_the_used_blocks() -> None:
    # τ_low at 98 % of the pool: scarce as soon as ~2 % is used (the six prompts take 2.7 % of the 5,596 blocks); the
    # long requests keep blocks at the reload
    pol = Nightjar(max_gamma=2, offload=True, tau_low=0.98, t_persist=1)
    used: list[int] = []
    sched = pol.schedule
    pol.schedule = lambda v: (used.append(v.total_blocks - v.free_blocks), sched(v))[1]  # type: ignore
    plans, results = spy(pol)
    reqs = make_requests(6, prompt_len=400, output_len=[20, 20, 20, 20, 300, 300])
    eng = make_engine(pol, reqs, oracle=FixedOracle(0), **PAPER)
    rep = eng.replicas[0]
    with_draft = rep.total_blocks
    cost = rep.cost
    without = cost.kv_capacity_blocks(draft_resident=False)
    eng.run()
    acts = [(i, p.memory) for i, p in enumerate(plans) if p.memory is not None]
    assert acts and acts[0][1] == MemoryAction(offload_draft=True)
    i_off = acts[0][0]
    assert results[i_off].memory_s == pytest.approx(cost.engine.kv_expand_s)
    reloads = [i for i, m in acts if m.reload_draft]
    assert reloads, "the queue drained and memory freed up: the draft comes back"
    i_re = reloads[0]
    assert rep.total_blocks == with_draft
    # the reload contracts the pool from `without` to `with_draft` blocks: the used blocks that sat in the
    # reclaimed region (a uniform share of them) migrate below the new end
    moved = round(used[i_re] * (without - with_draft) / without)
    assert moved > 0
    assert results[i_re].memory_s == pytest.approx(cost.engine.reload_dispatch_s + cost.kv_migrate_s(moved))
    # no step speculates while the draft is away (offloaded or on the link)
    for i in range(i_off, i_re + 1):
        assert plans[i].k is None or not plans[i].k.any()


def test_linucb_is_ridge_regression_plus_its_confidence_width() -> None:
    bandit = LinearBandit(2, 64, thompson=False, alpha=0.7)
    rng = np.random.default_rng(1)
    hist: list[tuple[int, int, float]] = []
    for _ in range(30):
        b, arm, r = int(rng.integers(1, 65)), int(rng.integers(2)), float(rng.uniform(100, 300))
        bandit.update(b, arm, r)
        hist.append((b, arm, r))
    scale = max(r for _, _, r in hist)
    assert bandit.scale == scale
    x = np.array([1.0, 40 / 64])
    scores = []
    for arm in range(2):  # A = I + Σ x xᵀ, b = Σ r x with each reward scaled by the largest seen when it came
        a_mat, bvec, top = np.eye(2), np.zeros(2), 0.0
        for bb, aa, r in hist:
            top = max(top, r)
            if aa == arm:
                xi = np.array([1.0, bb / 64])
                a_mat += np.outer(xi, xi)
                bvec += r / top * xi
        theta = np.linalg.solve(a_mat, bvec)
        scores.append(theta @ x + 0.7 * np.sqrt(x @ np.linalg.solve(a_mat, x)))
    assert bandit.select(40, rng, np.zeros(2))[0] == int(np.argmax(scores))
    assert np.allclose(bandit.a_inv[0], np.linalg.inv(np.eye(2) + sum(
        np.outer([1.0, bb / 64], [1.0, bb / 64]) for bb, aa, _ in hist if aa == 0)))


def test_linear_thompson_sampling_concentrates_on_the_better_arm() -> None:
    bandit = LinearBandit(3, 64, thompson=True)
    rng = np.random.default_rng(0)
    for _ in range(300):
        arm, _ = bandit.select(16, rng, np.zeros(3))
        bandit.update(16, arm, [0.4, 1.0, 0.7][arm])
    picks = [bandit.select(16, rng, np.zeros(3))[0] for _ in range(50)]
    assert np.mean(np.array(picks) == 1) > 0.9


def test_thompson_draws_are_numpys_multivariate_normal_bit_for_bit() -> None:
    """The bandit's cached covariance factor gives Generator.multivariate_normal's draws exactly."""
    rng = np.random.default_rng(5)
    covs = [np.eye(2), np.array([[2.0, 0.3], [0.3, 0.5]]), np.array([[1e-9, 0.0], [0.0, 4.0]])]
    bandit = LinearBandit(2, 64, thompson=True)
    for _ in range(40):  # the covariances a bandit's updates produce
        bandit.update(int(rng.integers(1, 65)), int(rng.integers(2)), float(rng.uniform(1, 9)))
        covs.append(bandit.v ** 2 * bandit.a_inv[0].copy())
    for cov in covs:
        mean = rng.normal(size=2)
        ours, numpys = np.random.default_rng(9), np.random.default_rng(9)
        factor = mvn_factor(cov)
        for _ in range(3):
            assert mvn_draw(ours, mean, factor).tobytes() == numpys.multivariate_normal(mean, cov).tobytes()
    with pytest.warns(RuntimeWarning, match="positive-semidefinite"):
        mvn_factor(np.array([[1.0, 2.0], [0.0, 1.0]]))


def test_linear_thompson_sampling_plays_as_with_numpys_sampler() -> None:
    """A run of the bandit picks the arms a bandit drawing with rng.multivariate_normal at every step picks."""
    def reference_select(b: LinearBandit, batch: int, rng: np.random.Generator) -> int:
        x = b.features(batch)
        theta = np.einsum("aij,aj->ai", b.a_inv, b.bvec)
        draws = np.array([rng.multivariate_normal(theta[a], b.v ** 2 * b.a_inv[a]) for a in range(b.num_arms)])
        return int(np.argmax(draws @ x))

    ours, ref = LinearBandit(4, 64, thompson=True), LinearBandit(4, 64, thompson=True)
    r1, r2, rewards = np.random.default_rng(3), np.random.default_rng(3), np.random.default_rng(4)
    for _ in range(200):
        batch = int(rewards.integers(1, 65))
        arm = ours.select(batch, r1, np.zeros(4))[0]
        assert arm == reference_select(ref, batch, r2)
        reward = float(rewards.uniform(0.5, 1.5)) * (1 + arm)
        ours.update(batch, arm, reward)
        ref.update(batch, arm, reward)


def test_config_errors_name_the_knob() -> None:
    with pytest.raises(ValueError, match="selector"):
        Nightjar(selector="ucb")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tau_low"):
        Nightjar(tau_low=1.5)
    with pytest.raises(ValueError, match="max_gamma"):
        Nightjar(max_gamma=0)


# --- the authors' selector (nightjar_authors) ------------------------------------------------------------------------

@pytest.mark.parametrize(("batch", "context"),
                         [(1, 0), (2, 0), (3, 1), (4, 1), (22, 10), (23, 11), (24, 11), (256, 11)])
def test_the_authors_contexts_are_twelve_bins_of_two_batch_sizes(batch: int, context: int) -> None:
    from systems.nightjar import authors_bin

    assert authors_bin(batch) == context


def test_the_authors_selector_never_explores_gamma_zero_and_smooths_its_means() -> None:
    from systems.nightjar import AuthorsBin

    st = AuthorsBin(4)
    rng = np.random.default_rng(0)
    arms = {st.select(rng, np.zeros(4))[0] for _ in range(200) if st.explore}  # b = 1: every bin explores
    assert arms == {1, 2, 3}
    st = AuthorsBin(4)
    st.explore, st.tau = False, 2  # an exploiting bin
    for arm, reward in ((1, 10.0), (1, 10.0), (2, 40.0)):
        st.update(arm, reward)
    st.explore, st.tau = False, 2
    # smoothed means (sum + weight·20) / (n + 1), 20 the context's mean: γ0 0/1 = 0, γ1 40/3, γ2 60/2, γ3 20/1
    assert st.select(rng, np.zeros(4)) == (2, False)
    st.update(3, 1000.0)  # one lucky round: (1000 + 1·mean) / 2 now beats 60/2
    st.explore, st.tau = False, 2
    assert st.select(rng, np.zeros(4))[0] == 3


@pytest.mark.parametrize("num_arms", [4, 6, 9])
def test_the_authors_exploitation_is_eq3_on_numpys_smoothed_means(num_arms: int) -> None:
    """The exploiting bin's choice (its smoothed means worked out in Python floats) is Eq. 3 of the
    NumPy expression, over random states with ties, unvisited arms and switching costs."""
    from systems.nightjar import AuthorsBin

    rng = np.random.default_rng(num_arms)
    for trial in range(300):
        st = AuthorsBin(num_arms)
        st.visits = rng.integers(0, 4, num_arms)
        st.sums = np.round(rng.uniform(0, 50, num_arms), 0 if trial % 2 else 12) * (st.visits > 0)
        cost = np.zeros(num_arms) if trial % 3 else switch_costs(num_arms, 0, float(rng.uniform(0, 0.5)))
        total = int(st.visits.sum())
        prior = st.sums.sum() / total if total else 0.0
        want = eq3((st.sums + st.weight * prior) / (st.visits + 1.0), cost)
        st.explore, st.tau = False, 2
        assert st.select(rng, cost) == (want, False)


def test_the_authors_hard_rule_turns_speculation_off_at_high_load_and_learns_nothing() -> None:
    """Above batch 20 with more than 2 req/s arriving: γ = 0 and no update; below either bound, the bandit plays
    (γ ≥ 1 when it explores). The reward is the per-request goodput."""
    from systems.nightjar import AuthorsSelector

    busy = Nightjar(max_gamma=3, selector="authors")
    plans, results = spy(busy)
    reqs = make_requests(30, output_len=40)
    reqs["arrival_s"] = np.linspace(0.0, 1.0, 30)  # 30 req/s for a second: batch 30 > 20, rate > 2
    make_engine(busy, reqs, oracle=FixedOracle(2), **PAPER).run()
    sel = busy.selector
    assert isinstance(sel, AuthorsSelector)
    big = [p for p, r in zip(plans[:len(results)], results, strict=True) if r.decode_ids.size > 20]
    assert big and all(p.k is None or not p.k.any() for p in big)
    assert all(int(st.visits.sum()) == 0 for key, st in sel.state.items() if key >= 10)  # batches ≥ 21: unlearned
    calm = Nightjar(max_gamma=3, selector="authors")
    plans, results = spy(calm)
    make_engine(calm, make_requests(4, output_len=60), oracle=FixedOracle(2), **PAPER).run()
    dec = [(p, r) for p, r in zip(plans[:len(results)], results, strict=True) if r.decode_ids.size == 4]
    st = calm.selector.of(4)  # type: ignore[union-attr]
    played = [(int(p.k[0]), float(r.num_emitted.sum()) / r.latency_s / 4) for p, r in dec if p.k is not None]
    assert sum(g > 0 for g, _ in played) > 0 and int(st.visits.sum()) == len(played)
    for g in range(4):
        rewards = [x for a, x in played if a == g]
        if rewards:
            assert st.sums[g] == pytest.approx(sum(rewards))


def test_warmup_passes_hand_the_selector_on_to_the_measured_pass() -> None:
    """nightjar_authors runs two unmeasured passes first (its authors' harness): the measured pass starts with what
    they learned, and the printed Nightjar starts cold."""
    from repro.experiments.simulate import build, compose

    cfg = compose(["system=nightjar_authors", "num_requests=30", "rps=4", "workload.source=embedded"])
    built = build(cfg)
    pol = built.engine.policy
    assert pol.warmup_passes == 2
    built.engine.run()
    learned = sum(int(st.visits.sum()) for st in pol.selector.state.values())
    assert learned > 0
    again = build(cfg, pol)  # as run_point does between passes: the same policy, a fresh engine
    assert again.engine.policy.selector is pol.selector
    assert sum(int(st.visits.sum()) for st in pol.selector.state.values()) == learned
    cold = build(compose(["system=nightjar", "num_requests=30", "rps=4", "workload.source=embedded"]))
    cold_pol = cold.engine.policy
    cold.engine.run()
    first = cold_pol.selector
    build(compose(["system=nightjar", "num_requests=30", "rps=4", "workload.source=embedded"]), cold_pol)
    assert cold_pol.selector is not first  # no warm-up: a new selector at every bind


# --- the engine the authors ran ---------------------------------------------------------------------------------------

NIGHTJAR_EXPS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "exp").glob("nightjar_*.yaml"))


@pytest.mark.parametrize("exp", NIGHTJAR_EXPS)
def test_every_method_of_a_nightjar_experiment_runs_on_the_authors_serving_flags(exp: str) -> None:
    # vLLM 0.8.2 V0 with --enforce-eager: the multi-query scorer and no CUDA graph, for Nightjar and every baseline
    # of its experiments alike (one harness); the command line's engine= still chooses another
    with hydra_context():
        spec, points = exp_points(exp)
        if spec.kind != "sweep":
            return
        composer = Composer()
        for p in {points[0].system: points[0], points[-1].system: points[-1]}.values():  # its first and last system
            cfg = composer([f"+exp={exp}", *p.overrides])
            profile = EngineProfile.from_cfg(cfg.engine)
            assert profile.name == "vllm_v0_eager", (p.system, profile.name)
            assert profile.scorer == "multi_query" and profile.graph_max_tokens == 0 and not profile.verify_graphs
        assert composer([f"+exp={exp}", *points[0].overrides, "engine=vllm_v0"]).engine.name == "vllm_v0"
