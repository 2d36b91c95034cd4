"""Token oracle: acceptance converges to the configured means, trees beat chains, the drafter is calibrated,
common random numbers hold, candidate trees are well formed, prompt lookup behaves per dataset."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.oracle import A0_MIN, P_FLOOR, Drafter, TokenOracle
from repro.sim.plan import CandidateTree, TreeSpec

CONF = Path(__file__).resolve().parents[1] / "conf" / "oracle" / "default.yaml"


def make_oracle(n: int = 200, mean: float = 0.62, seed: int = 0, dataset: str = "sharegpt",
                **kw: object) -> TokenOracle:
    return TokenOracle(seed, np.full(n, dataset, dtype=object), {dataset: mean}, **kw)  # type: ignore[arg-type]


def chain_rate(oracle: TokenOracle, n: int, num_pos: int, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(proposed, accepted) as (n, num_pos) arrays for chains of k starting at every position."""
    rids = np.arange(n)
    out = [oracle.accept_chain(rids, np.full(n, t), np.full(n, k)) for t in range(num_pos)]
    return np.stack([p for p, _ in out], axis=1), np.stack([a for _, a in out], axis=1)


def ancestors(cand: CandidateTree, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = int(cand.parent[node])
    return path[::-1]


def on_true_path(oracle: TokenOracle, cand: CandidateTree) -> np.ndarray:
    """Whether each candidate node lies on the true path (its root path is accepted in full)."""
    return np.array([oracle.accept_tree(TreeSpec(cand, np.array(ancestors(cand, i)))) == cand.depth[i]
                     for i in range(cand.size)])


def zero_chain(cand: CandidateTree) -> np.ndarray:
    """The rank-0 chain inside a candidate tree (as far as beam search kept it)."""
    nodes, parent = [], -1
    for i in range(cand.size):
        if cand.parent[i] == parent and cand.rank[i] == 0:
            nodes.append(i)
            parent = i
    return np.array(nodes, dtype=np.int64)


# --- acceptance converges to the configured mean ------------------------------------------------------------

@pytest.mark.parametrize("mean,spread", [
    (0.30, 0.1),   # low acceptance
    (0.62, 0.1),   # TurboSpec (160M, 7B) ShareGPT
    (0.92, 0.05),  # TurboSpec (1B, 70B) Sonnet
    (0.70, 0.0),   # no per-request spread
])
def test_chain_acceptance_rate_converges_to_mean(mean: float, spread: float) -> None:
    n, num_pos = 400, 250
    proposed, accepted = chain_rate(make_oracle(n, mean, spread=spread), n, num_pos)
    assert (proposed == 1).all()
    # per-request levels dominate the error: se² = spread²/n + mean(1-mean)/(n·num_pos)
    se = np.sqrt(spread**2 / n + mean * (1 - mean) / (n * num_pos))
    assert accepted.sum() / proposed.sum() == pytest.approx(mean, abs=4 * se)


@pytest.mark.parametrize("spread", [0.0, 0.1])
def test_expected_chain_length_matches_product_of_top1_probs(spread: float) -> None:
    n, num_pos, k, mean = 300, 40, 4, 0.62
    oracle = make_oracle(n, mean, spread=spread)
    _, accepted = chain_rate(oracle, n, num_pos, k)
    # E[accepted] = E[Σ_i Π_{j≤i} p0]: the drafter's top-1 probabilities along its chain (γ = 1)
    probs = [oracle.chain_probs_batch(np.arange(n), np.full(n, t), k) for t in range(num_pos)]
    expected = np.stack([np.cumprod(p, axis=1).sum(axis=1) for p in probs], axis=1)
    se = 2 * np.sqrt(accepted.var() / accepted.size)  # ×2: positions of a request share a_r
    assert accepted.mean() == pytest.approx(expected.mean(), abs=4 * se)
    if spread == 0.0:  # positions are independent with E[p0] = mean: E[accepted] = Σ_i mean^i
        assert accepted.mean() == pytest.approx(sum(mean**i for i in range(1, k + 1)), abs=4 * se)


def test_chain_acceptance_is_a_prefix_of_rank0_positions() -> None:
    oracle = make_oracle(50)
    rids = np.arange(50)
    _, a1 = chain_rate(oracle, 50, 20, 1)
    for t in range(12):
        _, a8 = oracle.accept_chain(rids, np.full(50, t), np.full(50, 8))
        expect = np.cumprod(a1[:, t:t + 8], axis=1).sum(axis=1)
        np.testing.assert_array_equal(a8, expect)


def test_drift_starts_at_a0_and_settles_at_the_mean() -> None:
    n = 400
    oracle = make_oracle(n, 0.7, drift={"a0": 0.3, "tau": 20.0})
    _, acc = chain_rate(oracle, n, 5)
    _, late = oracle.accept_chain(np.arange(n), np.full(n, 400), np.ones(n, dtype=np.int64))
    assert acc.mean() < 0.45
    assert late.mean() == pytest.approx(0.7, abs=0.08)


# --- trees --------------------------------------------------------------------------------------------------

def test_wider_trees_accept_more_than_chains_and_contain_them() -> None:
    n, depth = 200, 4
    oracle = make_oracle(n, 0.62)
    rids = np.arange(n)
    totals = {1: 0, 2: 0, 4: 0}
    for t in range(0, 60, 6):
        pos = np.full(n, t)
        _, chain_acc = oracle.accept_chain(rids, pos, np.full(n, depth))
        for width in totals:
            for cand, ca in zip(oracle.candidates_batch(rids, pos, depth, width), chain_acc, strict=True):
                full = oracle.accept_tree(TreeSpec(cand, np.arange(cand.size)))
                sub = zero_chain(cand)
                sub_acc = oracle.accept_tree(TreeSpec(cand, sub))
                assert full >= sub_acc  # the full tree accepts at least its rank-0 chain subset
                assert sub_acc == min(int(ca), sub.size)  # ... which is what a chain of that length accepts
                if width == 1:
                    assert full == ca  # a width-1 beam is the greedy chain
                totals[width] += full
    assert totals[1] < totals[2] < totals[4]


ORACLE_20 = make_oracle(20, 0.62, seed=11)


@settings(max_examples=60, deadline=None, database=None)
@given(rid=st.integers(0, 19), pos=st.integers(0, 600), depth=st.integers(1, 6), width=st.integers(1, 8),
       keep=st.lists(st.booleans(), min_size=48, max_size=48))
def test_accept_tree_of_parent_closed_subsets(rid: int, pos: int, depth: int, width: int,
                                             keep: list[bool]) -> None:
    oracle = ORACLE_20
    cand = oracle.candidates(rid, pos, depth, width)
    chosen: set[int] = set()
    for i in range(cand.size):  # BFS order: a node may be kept only if its parent was
        if keep[i] and (cand.parent[i] < 0 or int(cand.parent[i]) in chosen):
            chosen.add(i)
    nodes = np.array(sorted(chosen), dtype=np.int64)
    acc = oracle.accept_tree(TreeSpec(cand, nodes))
    assert 0 <= acc <= (int(cand.depth[nodes].max()) if nodes.size else 0) <= depth
    assert acc <= oracle.accept_tree(TreeSpec(cand, np.arange(cand.size)))
    sub = zero_chain(cand)
    _, chain = oracle.accept_chain(np.array([rid]), np.array([pos]), np.array([sub.size]))
    assert oracle.accept_tree(TreeSpec(cand, sub)) == chain[0]


@pytest.mark.parametrize("compiled", [False, True])
def test_accept_trees_scores_each_tree_as_on_its_own(use_jit: Any, compiled: bool) -> None:
    # one batch of trees of other requests, depths and widths (and an empty one): each tree's verdict is the
    # deepest selected node whose whole root path follows the true ranks, read from that tree's request alone
    # (compiled: repro.oracle.kernels.accept_paths, on chunks generated by the candidates, and on fresh ones)
    if compiled:
        pytest.importorskip("numba")
    use_jit(compiled)
    oracle = make_oracle(20, 0.62, seed=5)
    stream = oracle._stream("draft")
    trees = []
    for j, (depth, width) in enumerate([(1, 1), (6, 4), (3, 8), (8, 2), (2, 3), (5, 1)]):
        cand = oracle.candidates(3 * j, 37 * j, depth, width)
        nodes = np.arange(cand.size) if j % 2 else zero_chain(cand)[: max(depth - 1, 0)]
        trees.append(TreeSpec(cand, nodes))
    trees.append(TreeSpec(oracle.candidates(19, 5, 3, 2), np.zeros(0, dtype=np.int64)))
    rng = np.random.default_rng(2)
    for j in range(24):  # random subsets, parents kept or not, in any order (the reference sorts them)
        cand = oracle.candidates(j % 20, int(rng.integers(0, 900)), int(rng.integers(1, 8)), int(rng.integers(1, 6)))
        trees.append(TreeSpec(cand, rng.permutation(np.flatnonzero(rng.random(cand.size) < 0.7))))
    want = []
    for t in trees:
        truth = stream.true_ranks(np.array(t.cand.rid), t.cand.pos + np.arange(t.cand.draft_depth))
        kept, best = {-1}, 0
        for i in np.sort(t.nodes).tolist():
            if int(t.cand.parent[i]) in kept and t.cand.rank[i] == truth[t.cand.depth[i] - 1]:
                kept.add(i)
                best = max(best, int(t.cand.depth[i]))
        want.append(best)
    assert oracle.accept_trees(trees) == want == [oracle.accept_tree(t) for t in trees]
    assert oracle.accept_trees(trees[::-1]) == want[::-1]
    assert any(want) and want[6] == 0
    fresh = make_oracle(20, 0.62, seed=5)  # the same draws, no chunk generated yet: the kernel hands over
    assert fresh.accept_trees(trees) == want


# --- calibration --------------------------------------------------------------------------------------------

def reliability(confidence: float) -> list[tuple[float, float, float]]:
    """(mean path_prob, fraction on the true path, standard error) per path-probability bucket."""
    n = 150
    oracle = make_oracle(n, 0.62, seed=3, confidence=confidence)
    pp, hit = [], []
    for t in range(0, 40, 4):
        for cand in oracle.candidates_batch(np.arange(n), np.full(n, t), 3, 3):
            pp.append(cand.path_prob)
            hit.append(on_true_path(oracle, cand))
    p, h = np.concatenate(pp), np.concatenate(hit)
    edges = np.array([0.0, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 1.0])
    out = []
    for lo, hi in itertools.pairwise(edges):
        m = (p >= lo) & (p < hi)
        if m.sum() >= 200:
            f = h[m].mean()
            out.append((float(p[m].mean()), float(f), float(np.sqrt(max(f * (1 - f), 1e-3) / m.sum()))))
    return out


def test_calibrated_drafter_path_probs_match_true_path_frequency() -> None:
    buckets = reliability(1.0)
    assert len(buckets) >= 6
    for mean_pp, freq, se in buckets:
        assert freq == pytest.approx(mean_pp, abs=max(0.03, 4 * se)), buckets


@pytest.mark.parametrize("confidence", [0.4, 2.5])  # under- and over-confident drafter
def test_miscalibrated_drafter_is_detected(confidence: float) -> None:
    gaps = [abs(freq - mean_pp) for mean_pp, freq, _ in reliability(confidence)]
    assert max(gaps) > 0.08


# --- common random numbers ----------------------------------------------------------------------------------

def test_same_seed_same_answers_in_any_order_subset_or_repetition() -> None:
    n = 40
    a, b = make_oracle(n, seed=7), make_oracle(n, seed=7)
    rids = np.arange(n)
    k = np.full(n, 5)
    ref = [a.accept_chain(rids, np.full(n, t), k)[1] for t in range(0, 600, 37)]
    # b: far positions first, reversed order, subsets, repeated calls, releases in between
    got: dict[tuple[int, int], int] = {}
    for t in reversed(range(0, 600, 37)):
        for sub in (rids[::-1][::3], rids[1::3], rids[2::3], rids[::3]):
            _, acc = b.accept_chain(sub, np.full(sub.size, t), np.full(sub.size, 5))
            got.update({(int(r), t): int(x) for r, x in zip(sub, acc, strict=True)})
        b.release(int(rids[t % n]))
    for i, t in enumerate(range(0, 600, 37)):
        np.testing.assert_array_equal(ref[i], [got[(int(r), t)] for r in rids])
    ca = a.candidates_batch(rids, np.full(n, 300), 5, 4)
    cb = [b.candidates(int(r), 300, 5, 4) for r in rids[::-1]][::-1]
    for x, y in zip(ca, cb, strict=True):
        np.testing.assert_array_equal(x.rank, y.rank)
        np.testing.assert_array_equal(x.path_prob, y.path_prob)
    np.testing.assert_array_equal(a.chain_probs(3, 77, 6), b.chain_probs(3, 77, 6))


def test_answers_do_not_depend_on_the_other_requests_or_their_datasets() -> None:
    a = TokenOracle(5, np.array(["sharegpt"] * 10, dtype=object), {"sharegpt": 0.6})
    b = TokenOracle(5, np.array(["sonnet"] * 5 + ["sharegpt"] * 5, dtype=object),
                    {"sharegpt": 0.6, "sonnet": 0.3})
    rids = np.arange(5, 10)
    for t in (0, 255, 256, 1000):
        np.testing.assert_array_equal(a.accept_chain(rids, np.full(5, t), np.full(5, 6))[1],
                                      b.accept_chain(rids, np.full(5, t), np.full(5, 6))[1])


def test_different_seed_differs() -> None:
    n = 100
    _, a = chain_rate(make_oracle(n, seed=1), n, 20, 4)
    _, b = chain_rate(make_oracle(n, seed=2), n, 20, 4)
    assert (a != b).mean() > 0.2


def test_node_probabilities_depend_on_their_path_not_on_the_beam() -> None:
    oracle = make_oracle(10, seed=4)
    for rid in range(10):
        probs: dict[tuple[int, ...], float] = {}
        for width in (1, 2, 3, 5, 8):
            cand = oracle.candidates(rid, 50, 4, width)
            for i in range(cand.size):
                key = tuple(int(cand.rank[j]) for j in ancestors(cand, i))
                prob = float(cand.prob[i])
                assert probs.setdefault(key, prob) == pytest.approx(prob, rel=1e-12)


def test_release_frees_chunks_and_regenerates_identically() -> None:
    oracle = make_oracle(8)
    rids = np.arange(8)
    before = oracle.accept_chain(rids, np.full(8, 500), np.full(8, 7))[1]
    tree = oracle.candidates(3, 500, 4, 3)  # a beam search reaches off-path distributions: their chunks too
    assert oracle.num_live_chunks > 0
    for r in rids:
        oracle.release(int(r))
    assert oracle.num_live_chunks == 0
    np.testing.assert_array_equal(before, oracle.accept_chain(rids, np.full(8, 500), np.full(8, 7))[1])
    again = oracle.candidates(3, 500, 4, 3)
    np.testing.assert_array_equal(tree.prob, again.prob)
    np.testing.assert_array_equal(tree.rank, again.rank)


def test_ranks_computed_once_a_tree_reads_them_equal_those_computed_with_the_chunk() -> None:
    """A chain reads only whether the target's rank is 0 (u < p0); the ranks themselves are computed once a tree
    first reads them, for the chunks already held, and from then on with every chunk. Both orders give the same
    trees, and rank 0 falls exactly where a chain counts a hit."""
    n = 12
    rids = np.arange(n)
    eager, late = make_oracle(n, seed=3), make_oracle(n, seed=3)
    first = eager.candidates_batch(rids, np.full(n, 700), 6, 4)  # ranks from the first chunk on
    for t in (0, 300, 650, 1100):  # chains first: chunks 0-2 generated without ranks, one released in between
        np.testing.assert_array_equal(eager.accept_chain(rids, np.full(n, t), np.full(n, 5))[1],
                                      late.accept_chain(rids, np.full(n, t), np.full(n, 5))[1])
    late.release(4)
    late.accept_chain(rids, np.full(n, 710), np.full(n, 3))
    for x, y in zip(first, late.candidates_batch(rids, np.full(n, 700), 6, 4), strict=True):
        np.testing.assert_array_equal(x.rank, y.rank)
        np.testing.assert_array_equal(x.path_prob, y.path_prob)
    np.testing.assert_array_equal(late.candidates_batch(rids, np.full(n, 40), 8, 2)[3].rank,
                                  eager.candidates_batch(rids, np.full(n, 40), 8, 2)[3].rank)
    stream = late._stream("draft")
    held = stream.store.table[stream.store.table >= 0]
    at = (held[:, None] * stream.store.chunk + np.arange(stream.store.chunk)).ravel()
    assert held.size >= 2 * n
    np.testing.assert_array_equal(stream.store.pools["hit"][at], stream.store.pools["rank"][at] == 0)


# --- candidate trees ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("depth,width", [(1, 1), (1, 4), (3, 2), (8, 4), (5, 8)])
def test_candidate_tree_structure(depth: int, width: int) -> None:
    oracle = make_oracle(30, 0.5)
    for cand in oracle.candidates_batch(np.arange(30), np.arange(30) * 7, depth, width):
        assert (cand.draft_depth, cand.draft_width, cand.size) == (depth, width, depth * width)
        assert (np.diff(cand.depth) >= 0).all()  # BFS order
        assert (np.bincount(cand.depth)[1:] == width).all()  # every layer has `width` nodes
        first = cand.depth == 1
        assert (cand.parent[first] == -1).all()
        np.testing.assert_array_equal(cand.rank[first], np.arange(width))  # the root's top-width children
        child = ~first
        assert (cand.parent[child] < np.arange(cand.size)[child]).all()  # parents precede children
        assert (cand.depth[cand.parent[child]] == cand.depth[child] - 1).all()
        assert ((cand.prob > 0) & (cand.prob <= 1)).all()
        parent_pp = np.where(first, 1.0, cand.path_prob[np.maximum(cand.parent, 0)])
        np.testing.assert_allclose(cand.path_prob, parent_pp * cand.prob)
        assert (cand.path_prob <= parent_pp).all()  # non-increasing along paths
        pairs = set(zip(cand.parent.tolist(), cand.rank.tolist(), strict=True))
        assert len(pairs) == cand.size  # siblings are distinct tokens


def test_beam_keeps_a_prefix_of_each_parents_ranks() -> None:
    # a parent's children are sorted by probability: top-width selection keeps ranks 0..m-1 of each parent
    oracle = make_oracle(20, 0.5)
    for cand in oracle.candidates_batch(np.arange(20), np.zeros(20, dtype=np.int64), 4, 3):
        for p in np.flatnonzero(cand.depth < 4):
            kids = cand.rank[cand.parent == p]
            np.testing.assert_array_equal(kids, np.arange(kids.size))


def _beam_over_all_ranks(oracle: TokenOracle, rids: np.ndarray, pos: np.ndarray, depth: int,
                         width: int) -> tuple[np.ndarray, ...]:
    """The beam search as AdaServe §4.3 states it, every parent's W children scored: (parent, rank, prob,
    path_prob), for comparison with the oracle's beam, which scores each parent's first ``width`` ranks only."""
    from repro.oracle import _ALT_MASK, _RANK_SALT, _mix, _top

    stream = oracle._stream("draft")
    n, W = rids.size, stream.width
    p0_true, rank_true, alt, alt_idx, div = stream._positions(rids, pos, depth)
    on, pp, h = np.ones((n, 1), dtype=bool), np.ones((n, 1)), np.zeros((n, 1), dtype=np.uint64)
    rows = np.arange(n)[:, None]
    out: list[list[np.ndarray]] = [[], [], [], []]
    for i in range(depth):
        node_p0 = p0_true[:, i:i + 1] if i == 0 else np.where(
            on, p0_true[:, i:i + 1], alt[alt_idx[:, i:i + 1], (h & _ALT_MASK).astype(np.int64)])
        rep = stream.reported(node_p0).reshape(n, -1)  # (n, nodes · W)
        cpp = pp.repeat(W, axis=1) * rep
        pick = np.sort(np.argsort(-cpp, axis=1, kind="stable")[:, :width], axis=1)
        assert (pick == _top(cpp, width)).all()
        slot, rk = pick // W, pick % W
        par_on = on[rows, slot]
        h = _mix(np.where(par_on, div[:, i:i + 1], h[rows, slot]) ^ _RANK_SALT[rk])
        on = par_on & (rk == rank_true[:, i:i + 1])
        pp = cpp[rows, pick]
        for acc, val in zip(out, (slot + (i - 1) * width if i else np.full_like(slot, -1), rk, rep[rows, pick], pp),
                            strict=True):
            acc.append(val)
    return tuple(np.concatenate(acc, axis=1) for acc in out)


@pytest.mark.parametrize("confidence", [1.0, 0.6, 1.7])
@pytest.mark.parametrize("depth,width", [(1, 1), (3, 2), (6, 4), (4, 7), (3, 16)])
def test_beam_equals_scoring_every_rank(confidence: float, depth: int, width: int) -> None:
    """The beam scores each parent's first ``width`` ranks only; its trees equal those of scoring all W, bit for
    bit, for calibrated, over- and under-confident drafters, weak ones too (whose top two ranks tie)."""
    for mean in (0.2, 0.5, 0.9):
        oracle = make_oracle(24, mean, seed=5, confidence=confidence)
        rids, pos = np.arange(24), np.arange(24) * 11
        cands = oracle.candidates_batch(rids, pos, depth, width)
        want = _beam_over_all_ranks(oracle, rids, pos, depth, width)
        for name, ref in zip(("parent", "rank", "prob", "path_prob"), want, strict=True):
            got = np.stack([getattr(c, name) for c in cands])
            np.testing.assert_array_equal(got, ref, err_msg=name)


@pytest.mark.parametrize("confidence", [1.0, 0.6])
@pytest.mark.parametrize("mean", [0.05, 0.5, 0.95])
def test_compiled_beam_equals_its_numpy_reference(use_jit: Any, confidence: float, mean: float) -> None:
    """The compiled beam (repro.oracle.kernels.beam) gives the vectorized NumPy beam's trees bit for bit, ties
    included (a weak drafter's top two ranks tie), over batches of every depth and width."""
    pytest.importorskip("numba")
    oracle = make_oracle(40, mean, seed=3, confidence=confidence)
    stream = oracle._stream("draft")
    rng = np.random.default_rng(7)
    for depth, width in [(1, 1), (1, 5), (2, 2), (5, 3), (8, 8), (4, 16), (7, 1)]:
        n = int(rng.integers(1, 41))
        rids, pos = rng.choice(40, n, replace=False), rng.integers(0, 1500, n)
        beams = []
        for on in (True, False):
            use_jit(on)
            beams.append(stream.beam(rids, pos, depth, width))
        for name in ("parent", "rank", "prob", "path_prob"):
            got, want = getattr(beams[0], name), getattr(beams[1], name)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want, err_msg=f"{name} at depth {depth}, width {width}")


@pytest.mark.parametrize("mean", [0.05, 0.5, 0.95])
def test_compiled_expansion_equals_its_numpy_reference(use_jit: Any, mean: float) -> None:
    """The compiled fixed expansion (repro.oracle.kernels.expand: a calibrated drafter, at most 3 children a node)
    gives the vectorized NumPy expansion's trees bit for bit; a wider or miscalibrated one stays on NumPy."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(11)
    for confidence in (1.0, 0.6):
        stream = make_oracle(40, mean, seed=5, confidence=confidence)._stream("draft")
        for expansion in [(1,), (3,), (1, 1, 3, 1, 1, 1, 1, 1), (2, 3, 2), (3, 3, 1, 2), (1, 4, 2), (5,)]:
            n = int(rng.integers(1, 41))
            rids, pos = rng.choice(40, n, replace=False), rng.integers(0, 1500, n)
            got = []
            for on in (True, False):
                use_jit(on)
                got.append(stream.expand(rids, pos, expansion))
            (a, depth_a), (b, depth_b) = got
            np.testing.assert_array_equal(depth_a, depth_b)
            for name in ("parent", "rank", "prob", "path_prob"):
                x, y = getattr(a, name), getattr(b, name)
                assert x.dtype == y.dtype and x.shape == y.shape
                np.testing.assert_array_equal(x, y, err_msg=f"{name} of {expansion}, confidence {confidence}")


@pytest.mark.parametrize("mean", [0.1, 0.5, 0.9])
def test_true_dist_equals_its_single_expression(mean: float) -> None:
    """true_dist's large tables (the decay's powers computed once, only raised q raised) hold NumPy's single
    expression bit for bit, over the shapes the oracle asks for (a beam's flat table, an expansion's (n, width))."""
    from repro.oracle.distributions import true_dist
    from repro.oracle.store import _AR

    rng = np.random.default_rng(int(mean * 10))
    for shape in [(2580,), (300, 16), (5000,), (7, 600), (3, 40, 50)]:
        p0 = np.clip(rng.beta(2 * mean, 2 * (1 - mean), shape).astype(np.float32).astype(np.float64), P_FLOOR,
                     1 - P_FLOOR)
        for width in (2, 3, 8, 16):
            for decay in (0.7, 0.4, 0.95):
                rest = 1.0 - p0
                q = np.maximum(decay, 1.0 - p0 / rest)
                p1 = np.minimum(rest * (1.0 - q), p0)
                want = np.concatenate([p0[..., None], p1[..., None] * q[..., None] ** _AR[:width - 1]], axis=-1)
                np.testing.assert_array_equal(true_dist(p0, width, decay), want)


def test_numpy_pow_of_0_and_1_is_exact() -> None:
    """What the compiled expansion relies on: in true_dist's own broadcast, NumPy's q**0 is 1 and q**1 is q for
    every q a p0 gives (two million p0s stored as float32, as the oracle stores them)."""
    rng = np.random.default_rng(0)
    p0 = np.clip(rng.random(2_000_000).astype(np.float32).astype(np.float64), P_FLOOR, 1.0 - P_FLOOR)
    for decay, shape in [(0.7, (-1,)), (0.7, (1000, 2000)), (0.3, (-1,)), (0.95, (4000, 500))]:
        q = np.maximum(decay, 1.0 - p0 / (1.0 - p0)).reshape(shape)
        powers = q[..., None] ** np.arange(2)
        assert (powers[..., 0] == 1.0).all() and (powers[..., 1] == q).all()


def _reads(oracle: TokenOracle) -> list[np.ndarray]:
    """What a chain and a tree read of requests 0-9 at positions 0-1,100 (every chunk field, off-path ones too)."""
    stream = oracle._stream("draft")
    rids, pos = np.arange(10), np.arange(10) * 110
    got = [oracle.accept_chain(rids, pos, np.full(10, 4))[1]]
    beam = stream.beam(rids, pos, 5, 4)
    return [*got, beam.prob, beam.path_prob, beam.rank, stream.true_ranks(rids[:, None], pos[:, None] + np.arange(5))]


@pytest.mark.parametrize("change", [{}, {"mean": 0.3}, {"seed": 1}, {"pos_concentration": 5.0}, {"spread": 0.2},
                                    {"drift": {"offset": 0.2, "tau": 30.0}},
                                    {"drift": {"a0": 0.4, "a0_spread": 0.1, "tau": 30.0}}])
def test_remembered_chunks_are_the_ones_drawn(monkeypatch: pytest.MonkeyPatch, change: dict[str, Any]) -> None:
    """The chunk memo (repro.oracle.store.MEMO) gives an oracle the chunks it would draw: after an oracle of the
    same seed read them (``change`` empty: every chunk comes from the memo) or of another seed, level, κ_pos,
    spread or drift (none may be mistaken for its own), the values equal those of a process without a memo."""
    from repro.oracle import store

    def oracle(**kw: Any) -> TokenOracle:
        args = {"n": 10, "mean": 0.62, "seed": 0, "dataset": "sharegpt", **kw}
        return make_oracle(**args)

    monkeypatch.setattr(store, "MEMO", store.ChunkMemo(64 * 2**20))
    monkeypatch.setattr("repro.oracle.streams.MEMO", store.MEMO)
    _reads(oracle())  # fills the memo
    held = len(store.MEMO)
    assert held > 0
    got = _reads(oracle(**change))
    assert (len(store.MEMO) == held) == (not change)  # the same oracle draws nothing; any other draws its own
    off = store.ChunkMemo(0)
    monkeypatch.setattr("repro.oracle.streams.MEMO", off)
    want = _reads(oracle(**change))
    for x, y in zip(got, want, strict=True):
        np.testing.assert_array_equal(x, y)
    assert len(off) == 0


def test_chunk_memo_keeps_within_its_limit() -> None:
    from repro.oracle.store import ChunkMemo
    memo = ChunkMemo(10_000)
    for i in range(10):
        memo.put(i, {"x": np.zeros(468)})  # 3,744 bytes and 256 of headers each
    assert len(memo) == 2 and memo.get(9) is not None and memo.get(0) is None
    assert not memo.get(9)["x"].flags.writeable  # a remembered chunk cannot change under the runs that read it
    memo.get(8)
    memo.put(10, {"x": np.zeros(468)})
    assert memo.get(8) is not None and memo.get(9) is None  # the least recently used goes first


def test_width_above_oracle_width_is_rejected() -> None:
    oracle = make_oracle(2, width=4)
    assert Drafter(oracle).max_width == 4
    with pytest.raises(ValueError, match="beam width"):
        oracle.candidates(0, 0, 2, 5)


def test_drafter_exposes_only_the_draft_view() -> None:
    oracle = make_oracle(4)
    drafter = Drafter(oracle)
    assert not hasattr(drafter, "accept_chain") and not hasattr(drafter, "accept_tree")
    np.testing.assert_array_equal(drafter.chain_probs(1, 9, 3), oracle.chain_probs(1, 9, 3))
    np.testing.assert_array_equal(drafter.candidates(1, 9, 3, 2).path_prob,
                                  oracle.candidates(1, 9, 3, 2).path_prob)
    rids, pos = np.array([1, 3]), np.array([9, 0])
    np.testing.assert_array_equal(drafter.chain_probs_batch(rids, pos, 3), oracle.chain_probs_batch(rids, pos, 3))
    with pytest.raises(ValueError, match="proposer stream 'eagle' is not configured"):  # the proposer is passed on
        drafter.chain_probs_batch(rids, pos, 3, "eagle")


def test_a_cleared_memo_holds_nothing_and_draws_again() -> None:
    from repro.oracle.store import ChunkMemo

    memo = ChunkMemo(1 << 20)
    memo.put("a", {"x": np.zeros(8)})
    assert len(memo) == 1 and memo._bytes > 0
    memo.clear()
    assert len(memo) == 0 and memo._bytes == 0 and memo.get("a") is None
    assert memo.recall("a", lambda: {"x": np.ones(2)})["x"].tolist() == [1.0, 1.0]


def test_chain_probs_follow_the_width1_beam() -> None:
    oracle = make_oracle(6, confidence=1.7)
    cand = oracle.candidates(2, 33, 6, 1)
    np.testing.assert_allclose(oracle.chain_probs(2, 33, 6), cand.prob)
    assert (cand.rank == 0).all()


# --- prompt lookup ------------------------------------------------------------------------------------------

PLD = {"default": {"match": 0.15, "accept": 0.35, "match_len": 32},
       "cnn_dailymail": {"match": 0.5, "accept": 0.58}, "sharegpt": {"match": 0.2, "accept": 0.4}}


def test_pld_proposes_nothing_without_a_match_and_summarization_beats_chat() -> None:
    n = 300
    ds = np.array(["cnn_dailymail", "sharegpt"] * (n // 2), dtype=object)
    oracle = TokenOracle(0, ds, {"default": 0.6}, pld=PLD)
    rids = np.arange(n)
    prop, acc = [], []
    for t in range(100):
        p, a = oracle.accept_chain(rids, np.full(n, t), np.full(n, 5), proposer="pld")
        prop.append(p)
        acc.append(a)
    p, a = np.stack(prop, 1), np.stack(acc, 1)
    assert (p >= 0).all() and (p <= 5).all() and (a <= p).all()
    assert (a[p == 0] == 0).all()
    summ, chat = ds == "cnn_dailymail", ds == "sharegpt"
    assert (p[summ] == 0).mean() == pytest.approx(0.5, abs=0.03)  # match probability per dataset
    assert (p[chat] == 0).mean() == pytest.approx(0.8, abs=0.03)
    assert a[summ].mean() > 2 * a[chat].mean()


# --- configuration ------------------------------------------------------------------------------------------

def test_missing_dataset_names_dataset_and_pair() -> None:
    with pytest.raises(KeyError, match=r"llama-160m/llama2-7b.*'alpaca'"):
        TokenOracle(0, np.array(["sharegpt", "alpaca"], dtype=object), {"sharegpt": 0.6},
                    pair="llama-160m/llama2-7b")
    oracle = TokenOracle(0, np.array(["alpaca"], dtype=object), {"sharegpt": 0.6}, default_accept=0.5)
    assert oracle.accept_chain(np.array([0]), np.array([0]), np.array([3]))[0][0] == 3


def test_from_cfg_reads_the_tables_and_the_override() -> None:
    cfg = yaml.safe_load(CONF.read_text())
    ds = np.array(["sharegpt"] * 300, dtype=object)
    for draft, targets in cfg["accept"].items():
        for target in targets:
            TokenOracle.from_cfg(cfg, seed=0, dataset=ds, draft=draft, target=target)
    # a pair the tables lack fails when its proposer is used (a non-speculative run needs no table)
    oracle = TokenOracle.from_cfg(cfg, seed=0, dataset=ds, draft="llama-160m", target="qwen2.5-7b")
    with pytest.raises(KeyError, match=r"llama-160m.*qwen2\.5-7b"):
        oracle.accept_chain(np.array([0]), np.array([0]), np.array([2]))
    with pytest.raises(KeyError, match=r"EAGLE.*qwen2\.5-7b"):
        oracle.candidates(0, 0, 2, 2, proposer="eagle")
    assert oracle.accept_chain(np.array([0]), np.array([0]), np.array([2]), proposer="pld")[0][0] <= 2
    cfg["accept_override"] = 0.9
    oracle = TokenOracle.from_cfg(cfg, seed=0, dataset=ds, draft="llama-160m", target="llama2-7b")
    _, acc = chain_rate(oracle, 300, 50)
    assert acc.mean() == pytest.approx(0.9, abs=0.03)
    _, acc = oracle.accept_chain(np.arange(300), np.zeros(300, dtype=np.int64), np.ones(300, dtype=np.int64),
                                 proposer="eagle")
    assert acc.mean() == pytest.approx(0.9, abs=0.06)


def test_unconfigured_proposer_raises() -> None:
    oracle = make_oracle(2)
    with pytest.raises(ValueError, match="eagle"):
        oracle.accept_chain(np.array([0]), np.array([0]), np.array([2]), proposer="eagle")
    with pytest.raises(ValueError, match="pld"):
        oracle.accept_chain(np.array([0]), np.array([0]), np.array([2]), proposer="pld")


def test_pld_rates_per_target_override_the_dataset_table() -> None:
    cfg = yaml.safe_load(CONF.read_text())
    ds = np.array(["cnn_dailymail"] * 2000, dtype=object)

    def pld_rate(target: str) -> float:
        oracle = TokenOracle.from_cfg(cfg, seed=0, dataset=ds, draft=None, target=target)
        prop, acc = oracle.accept_chain(np.arange(2000), np.zeros(2000, dtype=np.int64),
                                        np.ones(2000, dtype=np.int64), proposer="pld")
        return float(acc.sum() / prop.sum())

    # TurboSpec Table 3's CNN/DM column: 0.83 for the 70B target, 0.54 for 7B; targets without an entry keep 0.58
    assert pld_rate("llama3-70b") == pytest.approx(0.83, abs=0.03)
    assert pld_rate("vicuna-7b") == pytest.approx(0.54, abs=0.03)
    assert pld_rate("qwen2.5-7b") == pytest.approx(0.58, abs=0.03)


def test_score_chain_counts_every_matching_position() -> None:
    # matched = every proposed position whose true rank is 0; accepted = the leading run of them
    oracle = TokenOracle(3, np.full(32, "x", dtype=object), {"x": 0.6})
    rids, pos, k = np.arange(32), np.arange(32) * 5, np.full(32, 6)
    proposed, accepted, matched = oracle.score_chain(rids, pos, k)
    truth = oracle._stream("draft").true_ranks(rids[:, None], pos[:, None] + np.arange(6)) == 0
    assert (proposed == 6).all() and (matched == truth.sum(axis=1)).all()
    assert (accepted == np.argmin(np.c_[truth, np.zeros(32, bool)], axis=1)).all()
    assert (matched >= accepted).all() and (matched > accepted).any()
    assert (oracle.accept_chain(rids, pos, k)[1] == accepted).all()


@pytest.mark.parametrize("table", [
    {"chat": {"a0": 0.2, "tau": 30.0}},                                    # a dataset's own shape; others none
    {"chat": {"a0": 0.2, "tau": 30.0}, "code": None},                     # an explicit null
    {"chat": {"a0": 0.2, "tau": 30.0}, "default": None},
])
def test_drift_is_per_dataset(table: dict) -> None:
    # Requests of a dataset without a drift shape draw exactly what an oracle without drift draws for them (common
    # random numbers); those of a dataset with one start near its a0 (0.2 here, against a level of 0.7).
    n = 300
    ds = np.array(["chat", "code"] * (n // 2), dtype=object)
    plain = TokenOracle(0, ds, {"default": 0.7})
    drifting = TokenOracle(0, ds, {"default": 0.7}, drift=table)
    rids, code, chat = np.arange(n), ds == "code", ds == "chat"
    for t in (0, 3, 50):
        _, a_plain = plain.accept_chain(rids, np.full(n, t), np.full(n, 4))
        _, a_drift = drifting.accept_chain(rids, np.full(n, t), np.full(n, 4))
        np.testing.assert_array_equal(a_plain[code], a_drift[code])
    _, first = drifting.accept_chain(rids, np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64))
    assert first[chat].mean() < 0.35 < 0.55 < first[code].mean()


def test_one_drift_shape_applies_to_every_dataset() -> None:
    ds = np.array(["chat", "code"] * 150, dtype=object)
    one = TokenOracle(0, ds, {"default": 0.7}, drift={"a0": 0.2, "tau": 30.0})
    table = TokenOracle(0, ds, {"default": 0.7}, drift={"default": {"a0": 0.2, "tau": 30.0}})
    rids = np.arange(ds.size)
    np.testing.assert_array_equal(one.accept_chain(rids, np.zeros(ds.size, dtype=np.int64), np.full(ds.size, 4))[1],
                                  table.accept_chain(rids, np.zeros(ds.size, dtype=np.int64), np.full(ds.size, 4))[1])


def test_relative_drift_starts_offset_below_each_requests_level() -> None:
    # {offset, tau}: a_0 = a_r - offset per request, so two datasets keep their order from the first token on, and
    # both settle at their own mean; the absolute form {a0, tau} starts every dataset near the same a0.
    n = 400
    ds = np.array(["hi", "lo"] * (n // 2), dtype=object)
    means = {"hi": 0.75, "lo": 0.55}
    rel = TokenOracle(0, ds, means, drift={"offset": 0.3, "tau": 20.0})
    absolute = TokenOracle(0, ds, means, drift={"a0": 0.3, "tau": 20.0})
    rids, zero, one = np.arange(n), np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64)
    hi, lo = ds == "hi", ds == "lo"
    _, first = rel.accept_chain(rids, zero, one)
    assert first[hi].mean() == pytest.approx(0.45, abs=0.07) and first[lo].mean() == pytest.approx(0.25, abs=0.07)
    _, first_abs = absolute.accept_chain(rids, zero, one)
    assert abs(first_abs[hi].mean() - first_abs[lo].mean()) < 0.1
    late = np.mean([rel.accept_chain(rids, np.full(n, t), one)[1] for t in range(300, 400, 10)], axis=0)
    assert late[hi].mean() == pytest.approx(0.75, abs=0.04) and late[lo].mean() == pytest.approx(0.55, abs=0.04)
    # each request's start is exactly its level minus the offset (no spread), clipped into [A0_MIN, 1 - A0_MIN]
    stream = rel._streams["draft"]
    for rid in range(8):
        level, a0 = stream.level(rid)
        assert a0 == pytest.approx(max(level - 0.3, A0_MIN))


def test_relative_drift_spread_and_clip() -> None:
    n = 2000
    ds = np.array(["chat"] * n, dtype=object)
    oracle = TokenOracle(0, ds, {"default": 0.5}, spread=0.1, drift={"offset": 0.2, "offset_spread": 0.15,
                                                                     "tau": 40.0})
    stream = oracle._streams["draft"]
    levels, starts = np.array([stream.level(r) for r in range(n)]).T
    gap = levels - starts
    assert gap.mean() == pytest.approx(0.2, abs=0.02) and gap.std() == pytest.approx(0.15, abs=0.02)
    assert starts.min() >= A0_MIN and starts.max() <= 1 - A0_MIN and (starts == A0_MIN).any()
    # the level is drawn first from the same generator: the same levels as without drift
    plain = TokenOracle(0, ds, {"default": 0.5}, spread=0.1)._streams["draft"]
    np.testing.assert_array_equal(levels, [plain.level(r)[0] for r in range(n)])


@pytest.mark.parametrize(("drift", "message"), [
    ({"chat": {"a0": 0.2}}, "expected {a0, tau"),
    ({"chat": {"a0": 0.2, "tau": 0.0}}, "tau must be > 0"),
    ({"chat": {"a0": 0.2, "tau": 5.0, "shape": 1}}, "expected {a0, tau"),
    ({"chat": {"a0": 0.2, "offset": 0.1, "tau": 5.0}}, "expected {a0, tau"),
    ({"chat": {"offset": 0.2, "a0_spread": 0.1, "tau": 5.0}}, "expected {a0, tau"),
    ({"chat": {"offset": 1.2, "tau": 5.0}}, "offset must lie in"),
    ({"chat": {"offset": 0.2, "offset_spread": -0.1, "tau": 5.0}}, "offset must lie in"),
])
def test_bad_drift_names_the_dataset(drift: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        TokenOracle(0, np.array(["chat"], dtype=object), {"default": 0.7}, drift=drift)
    assert "'chat'" in str(err.value)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(n=st.integers(1, 12), m=st.integers(1, 160), width=st.integers(1, 40),
       ties=st.sampled_from(["none", "coarse", "rows"]),
       seed=st.integers(0, 2**16))
def test_top_equals_the_stable_sort_it_replaces(n: int, m: int, width: int, ties: str, seed: int) -> None:
    """The beam's pick (_top: a partition over wide rows) is the first ``width`` of a stable argsort, in index
    order, ties to the lower index: exactly, on both of its paths (rows narrower and wider than its cut-over)."""
    from repro.oracle import _top

    x = np.random.default_rng(seed).random((n, m))
    if ties == "coarse":
        x = np.round(x, 1)  # many values equal the width-th largest
    elif ties == "rows":
        x[:] = x[:, :1]  # every value of a row equal
    want = np.sort(np.argsort(-x, axis=1, kind="stable")[:, :width], axis=1)
    got = _top(x, width)
    assert got.shape == want.shape and (got == want).all()


def test_a_spread_wide_enough_to_draw_a_level_of_exactly_one_still_runs() -> None:
    """With mean 0.97 and spread 0.17 (allowed: spread² < mean·(1 − mean)) the per-request Beta is U-shaped and its
    draws round to exactly 0 or 1; such a level becomes the nearest one inside (0, 1) instead of failing the run."""
    oracle = TokenOracle(0, np.array(["d"] * 50, dtype=object), {"d": 0.97}, spread=0.17)
    proposed, accepted = oracle.accept_chain(np.arange(50), np.zeros(50, dtype=np.int64), np.full(50, 3))
    levels = np.array([oracle._stream("draft").level(r)[0] for r in range(50)])
    assert ((levels > 0) & (levels < 1)).all() and (proposed == 3).all() and accepted.max() == 3
