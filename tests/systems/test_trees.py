"""Tree selection pieces (systems/trees.py): AdaServe Figure 2, Eq. 8–9, selection invariants, SpecInfer's shape."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.oracle import TokenOracle
from repro.sim.plan import CandidateTree, TreeSpec
from systems.trees import (
    Ranked,
    depth_width,
    rank_nodes,
    select_equal,
    select_global,
    select_slo_customized,
    slo_targets,
    tree_specs,
)
from tests.conftest import is_closed


def tree(rid: int, parent: list[int], prob: list[float], rank: list[int] | None = None) -> CandidateTree:
    """A candidate tree from parents (-1 = root) and conditional probabilities; parents precede children."""
    par = np.asarray(parent, dtype=np.int64)
    p = np.asarray(prob, dtype=np.float64)
    depth = np.zeros(par.size, dtype=np.int64)
    pp = np.zeros(par.size)
    for i, j in enumerate(par.tolist()):
        depth[i] = 1 if j < 0 else depth[j] + 1
        pp[i] = p[i] if j < 0 else pp[j] * p[i]
    rk = np.asarray(rank if rank is not None else np.zeros(par.size), dtype=np.int64)
    return CandidateTree(rid, 0, par, depth, rk, p, pp, int(depth.max()) if par.size else 0, 2)


def selected(ranked: Any, counts: np.ndarray) -> dict[int, set[int]]:
    return {rid: set(t.nodes.tolist()) for rid, t in tree_specs(ranked, counts).items()}


# --- Figure 2 ---------------------------------------------------------------------------------------------------

# Figure 2: two requests, budget 8, candidate trees of depth 3 and beam width 2 (nodes t1..t6 = indices 0..5,
# two per level). The caption fixes f(t1⁽⁰⁾) = 0.7, f(t1⁽¹⁾) = 0.5, f(t2⁽¹⁾) = 0.4 and the outcome; the other path
# probabilities are chosen consistent with it (the figure's drawing is not in the text).
#   r0: t1 0.7, t2 0.2 | t3 0.5 (t1), t4 0.15 (t1) | t5 0.35 (t3), t6 0.1 (t3)
#   r1: t1 0.5, t2 0.4 | t3 0.3 (t1), t4 0.2 (t2)  | t5 0.15 (t3), t6 0.1 (t4)
FIG2_R0 = tree(0, [-1, -1, 0, 0, 2, 2], [0.7, 0.2, 0.5 / 0.7, 0.15 / 0.7, 0.35 / 0.5, 0.1 / 0.5])
FIG2_R1 = tree(1, [-1, -1, 0, 1, 2, 3], [0.5, 0.4, 0.3 / 0.5, 0.2 / 0.4, 0.15 / 0.3, 0.1 / 0.2])


def test_figure2_worked_example() -> None:
    ranked = rank_nodes([FIG2_R0, FIG2_R1])
    budget, n = 8, 2
    # A_cap(r0) = 0.6, A_cap(r1) = 0.8 (Σ f over speculated nodes; the roots' tokens count on top)
    target = np.array([0.6, 0.8])
    slo = select_slo_customized(ranked, target, target, order="descending", n_max=8, budget=budget - n)
    assert selected(ranked, slo) == {0: {0}, 1: {0, 1}}  # t1⁽⁰⁾; t1⁽¹⁾ + t2⁽¹⁾ (0.5 + 0.4 > 0.8)
    final = select_global(ranked, slo, budget - n - int(slo.sum()))  # remaining budget 3
    # t3⁽⁰⁾ (0.5), t5⁽⁰⁾ (0.35), t3⁽¹⁾ (0.3) join
    assert selected(ranked, final) == {0: {0, 2, 4}, 1: {0, 1, 2}}
    assert n + int(final.sum()) == budget


def test_descending_and_ascending_orders_differ() -> None:
    # two requests, room for 2 nodes: the slower one (larger A) wins when visited first
    a = tree(0, [-1, 0, 1], [0.9, 0.9, 0.9])
    b = tree(1, [-1, 0, 1], [0.9, 0.9, 0.9])
    ranked = rank_nodes([a, b])
    key = np.array([3.0, 1.5])  # A(r): request 0 lags more
    target = np.minimum(key, 3 + 1.0) - 1.0
    desc = select_slo_customized(ranked, target, key, order="descending", n_max=8, budget=2)
    asc = select_slo_customized(ranked, target, key, order="ascending", n_max=8, budget=2)
    assert desc.tolist() == [2, 0]
    assert asc.tolist() == [1, 1]  # request 1 needs one node (0.9 ≥ 0.5), request 0 gets what is left


def test_slo_targets_eq2() -> None:
    # A(r) = (l + t_spec)/t_TPOT − o with l = now − first token, o = generated − 1; A_cap = min(A, d + 1)
    view = SimpleNamespace(now=1.0, first_token_at=np.array([0.5, 0.9, np.nan]),
                           num_generated=np.array([11, 2, 0]), tpot_slo_s=np.array([0.05, 0.01, np.inf]))
    a, target = slo_targets(view, np.arange(3), 0.02, depth=3)  # type: ignore[arg-type]
    assert a == pytest.approx([(0.5 + 0.02) / 0.05 - 10, (0.1 + 0.02) / 0.01 - 1, 0.0])
    assert target == pytest.approx([0.4 - 1.0, 3.0, -1.0])  # 12 − 1 capped at d + 1 = 4, minus the root


@pytest.mark.parametrize(("n", "d_max", "w_max", "budget", "expect"), [
    (1, 8, 4, 582, (8, 4)),    # light load: both at their maxima
    (64, 8, 4, 582, (8, 4)),   # ⌈582/64⌉ = 10, ⌊582/64⌋ = 9: still capped
    (100, 8, 4, 582, (6, 4)),  # ⌈5.82⌉ = 6 < D_max
    (200, 8, 4, 582, (3, 2)),  # ⌈2.91⌉ = 3, ⌊2.91⌋ = 2
    (40, 8, 4, 156, (4, 3)),   # A100: ⌈3.9⌉ = 4, ⌊3.9⌋ = 3
    (156, 8, 4, 156, (1, 1)),  # n = B: one level, one token wide
    (300, 8, 4, 156, (1, 1)),  # n > B: max(1, ·) floors
])
def test_depth_width_eq8_eq9(n: int, d_max: int, w_max: int, budget: int, expect: tuple[int, int]) -> None:
    assert depth_width(n, d_max, w_max, budget) == expect


def test_equal_split() -> None:
    ranked = rank_nodes([FIG2_R0, FIG2_R1, tree(2, [-1], [0.5])])
    counts = select_equal(ranked, 11)  # ⌊11/3⌋ = 3 tokens each: root + 2 nodes (request 2 has only 1)
    assert counts.tolist() == [2, 2, 1]
    assert selected(ranked, counts) == {0: {0, 2}, 1: {0, 1}, 2: {0}}


# --- SpecInfer's fixed expansion --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("expansion", "per_depth"),
    [
        ((1, 1, 3, 1, 1, 1, 1, 1), [1, 1, 3, 3, 3, 3, 3, 3]),  # SpecInfer's default: 20 nodes
        ((2, 2), [2, 4]),
        ((3, 1, 2), [3, 3, 6]),
        ((1,), [1]),
    ],
)
def test_expansion_gives_every_node_its_own_top_k(expansion: tuple[int, ...], per_depth: list[int]) -> None:
    oracle = TokenOracle(0, np.full(8, "x", dtype=object), {"x": 0.6}, width=16)
    for cand in oracle.expansion_batch(np.arange(8), np.arange(8) * 11, expansion):
        assert np.bincount(cand.depth, minlength=len(expansion) + 1)[1:].tolist() == per_depth
        assert cand.size == sum(per_depth) and is_closed(cand, np.arange(cand.size))
        for node in range(cand.size):  # each parent's children are exactly its ranks 0..k-1
            kids = np.flatnonzero(cand.parent == node)
            if kids.size:
                assert sorted(cand.rank[kids].tolist()) == list(range(expansion[int(cand.depth[node])]))
        parent_pp = np.where(cand.parent >= 0, cand.path_prob[np.maximum(cand.parent, 0)], 1.0)
        assert np.allclose(cand.path_prob, parent_pp * cand.prob)  # f(v) = f(parent) · p(v)
        assert cand.draft_depth == len(expansion) and cand.draft_width == max(per_depth)


def test_expansion_accepts_along_the_true_ranks() -> None:
    # The oracle's verdict on a full expansion tree is the longest root path following the true ranks: with
    # ⟨1,1,3,1,...⟩ that is the true top-1 chain through depth 2, then one of three rank branches at depth 3.
    oracle = TokenOracle(0, np.full(64, "x", dtype=object), {"x": 0.6}, width=16)
    cands = oracle.expansion_batch(np.arange(64), np.zeros(64, dtype=np.int64), (1, 1, 3, 1, 1, 1, 1, 1))
    stream = oracle._stream("draft")
    for cand in cands:
        truth = stream.true_ranks(np.array(cand.rid), np.arange(8))
        expected = 0
        for d in range(8):
            allowed = 3 if d == 2 else 1  # ranks the expansion holds at this depth, on the true path
            if truth[d] >= allowed:
                break
            expected = d + 1
        got = oracle.accept_tree(TreeSpec(cand, np.arange(cand.size)))
        assert got == expected, (cand.rid, truth.tolist())


def test_expansion_matches_the_beam_on_shared_nodes() -> None:
    # common random numbers: the expansion's depth-1..2 top-1 path has the beam's path probabilities
    oracle = TokenOracle(1, np.full(4, "x", dtype=object), {"x": 0.6}, width=16)
    exp = oracle.expansion_batch(np.arange(4), np.arange(4), (1, 1, 3))
    beam = oracle.candidates_batch(np.arange(4), np.arange(4), 3, 3)
    for e, b in zip(exp, beam, strict=True):
        assert e.path_prob[0] == pytest.approx(b.path_prob[0]) and e.path_prob[1] == pytest.approx(b.path_prob[3])


@pytest.mark.parametrize("confidence", [1.0, 0.4, 2.5])  # calibrated, under- and over-confident drafter
@pytest.mark.parametrize("expansion", [(3,), (2, 3), (1, 1, 3, 1, 1, 1, 1, 1)])
def test_expansion_reports_what_the_beam_reports(confidence: float, expansion: tuple[int, ...]) -> None:
    # a node's probability is the drafter's reported distribution over all W tokens, its top k kept: exactly the
    # beam's on the nodes both trees hold (the root's children; the true top-1 path)
    oracle = TokenOracle(2, np.full(6, "x", dtype=object), {"x": 0.6}, width=16, confidence=confidence)
    rids, pos = np.arange(6), np.arange(6) * 7
    exp = oracle.expansion_batch(rids, pos, expansion)
    beam = oracle.candidates_batch(rids, pos, len(expansion), 1)
    wide = oracle.candidates_batch(rids, pos, 1, expansion[0])
    for e, b, w in zip(exp, beam, wide, strict=True):
        assert e.prob[:expansion[0]].tolist() == w.prob.tolist()
        top1 = [0] + [int(np.flatnonzero((e.depth == d + 1) & (e.rank == 0))[0]) for d in range(1, len(expansion))]
        assert e.path_prob[top1].tolist() == b.path_prob.tolist()  # the off-path hashes agree too


# --- invariants on random candidate trees -----------------------------------------------------------------------

@st.composite
def random_tree(draw: st.DrawFn, rid: int) -> CandidateTree:
    size = draw(st.integers(0, 14))
    parent = [draw(st.integers(-1, i - 1)) for i in range(size)]
    prob = [draw(st.one_of(st.sampled_from([1.0, 0.5, 0.25]), st.floats(0.01, 1.0))) for _ in range(size)]
    return tree(rid, parent, prob)


@st.composite
def batches(draw: st.DrawFn) -> list[CandidateTree]:
    n = draw(st.integers(1, 6))
    return [draw(random_tree(i)) for i in range(n)]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(cands=batches(), budget=st.integers(1, 60), n_max=st.integers(0, 6),
       order=st.sampled_from(["descending", "ascending"]),
       key=st.lists(st.floats(-3.0, 6.0), min_size=6, max_size=6))
def test_selection_invariants(cands: list[CandidateTree], budget: int, n_max: int, order: Any,
                              key: list[float]) -> None:
    n = len(cands)
    ranked = rank_nodes(cands)
    a = np.asarray(key[:n])
    target = np.minimum(a, 4.0) - 1.0
    spare = max(budget - n, 0)
    slo = select_slo_customized(ranked, target, a, order=order, n_max=n_max, budget=spare)
    # n_max and the budget hold in the SLO step
    assert (slo <= n_max).all() and (slo <= ranked.size).all() and int(slo.sum()) <= spare
    # a request stops as soon as its target is met (no node beyond the first that reaches it)
    for i in range(n):
        if slo[i] > 0:
            assert ranked.pp[i, : slo[i] - 1].sum() < target[i]
    final = select_global(ranked, slo, spare - int(slo.sum()))
    assert (final >= slo).all() and (final <= ranked.size).all()
    # budget: roots + nodes ≤ B whenever a node is selected; spare budget is used up if nodes remain
    assert int(final.sum()) <= spare
    assert int(final.sum()) == min(spare, int(ranked.size.sum()))
    # the global step picks a top set by path probability among what the SLO step left
    cols = np.arange(ranked.pp.shape[1])
    added = (cols >= slo[:, None]) & (cols < final[:, None])
    left = (cols >= final[:, None]) & (cols < ranked.size[:, None])
    if added.any() and left.any():
        assert ranked.pp[added].min() >= ranked.pp[left].max()
    # every request gets its root (a tree, possibly empty: it still paid its beam search); trees rooted there
    trees = tree_specs(ranked, final)
    for i, cand in enumerate(cands):
        t = trees[cand.rid]
        assert t.cand is cand and t.num_nodes == final[i] and np.unique(t.nodes).size == t.num_nodes
        assert is_closed(cand, t.nodes)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(cands=batches(), m=st.integers(0, 80))
def test_global_top_m_is_parent_closed(cands: list[CandidateTree], m: int) -> None:
    # App. A.1: the top-m nodes by path probability (ties toward shallower) are closed under parent
    ranked = rank_nodes(cands)
    counts = select_global(ranked, np.zeros(len(cands), dtype=np.int64), m)
    assert int(counts.sum()) == min(m, int(ranked.size.sum()))
    for rid, t in tree_specs(ranked, counts).items():
        assert is_closed(cands[rid], t.nodes)


def test_slo_selection_stops_when_a_prefix_meets_the_target_exactly() -> None:
    # Σ f of the first two nodes is exactly the target (0.5 + 0.5 = 1.0): a third node must not be taken
    # (cumsum − f rounded below 1.0 for it and took it).
    ranked = Ranked(cands=(), node=np.array([[0, 1, 2]]), pp=np.array([[0.5, 0.5, 0.13489335688193516]]),
                    depth=np.array([[1, 1, 2]]), size=np.array([3]))
    slo = select_slo_customized(ranked, np.array([1.0]), np.array([2.0]), order="descending", n_max=3, budget=5)
    assert slo.tolist() == [2]


def _rank_reference(cands: list[CandidateTree]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """rank_nodes as a lexsort by (−pp, depth, index), for comparison with its shortcut for shared BFS depths."""
    pp = np.stack([c.path_prob for c in cands])
    depth = np.stack([c.depth for c in cands])
    node = np.lexsort((np.broadcast_to(np.arange(pp.shape[1]), pp.shape), depth, -pp), axis=-1)
    return node, np.take_along_axis(pp, node, axis=1), np.take_along_axis(depth, node, axis=1)


def _global_reference(ranked: Ranked, counts: np.ndarray, budget: int) -> np.ndarray:
    """select_global as a lexsort of every node left by (−pp, depth, request, rank), the first ``budget`` taken."""
    out = counts.copy()
    cols = np.arange(ranked.pp.shape[1])
    flat = np.flatnonzero((cols >= counts[:, None]) & (cols < ranked.size[:, None]))
    pp, depth = ranked.pp.ravel()[flat], ranked.depth.ravel()[flat]
    flat = flat[np.lexsort((flat, depth, -pp))[:budget]]
    return out + np.bincount(flat // ranked.pp.shape[1], minlength=ranked.n)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(n=st.integers(1, 8), depth=st.integers(1, 5), width=st.integers(1, 6), budget=st.integers(0, 120),
       coarse=st.booleans(), seed=st.integers(0, 2**16))
def test_ranking_and_global_selection_equal_the_lexsorts_they_replace(n: int, depth: int, width: int, budget: int,
                                                                     coarse: bool, seed: int) -> None:
    """Beams sharing one breadth-first depth array (the drafter's batches) rank by a stable sort of −pp, and the
    global step keeps the nodes above its threshold plus the first tied ones: both equal their lexsorts exactly,
    ties across depths, requests and ranks included."""
    rng = np.random.default_rng(seed)
    m = depth * width
    node_depth = np.repeat(np.arange(1, depth + 1), width)
    pp = rng.random((n, m))
    if coarse:
        pp = np.round(pp, 1) + 0.05  # many equal path probabilities, at equal and different depths
    cands = [CandidateTree(i, 0, np.full(m, -1), node_depth, np.zeros(m, dtype=np.int64), pp[i], pp[i], depth, width)
             for i in range(n)]
    ranked = rank_nodes(cands)
    for got, want in zip((ranked.node, ranked.pp, ranked.depth), _rank_reference(cands), strict=True):
        np.testing.assert_array_equal(got, want)
    counts = rng.integers(0, m + 1, n)
    np.testing.assert_array_equal(select_global(ranked, counts, budget), _global_reference(ranked, counts, budget))


@pytest.mark.parametrize("case", range(40))
def test_compiled_slo_selection_equals_the_numpy_reference(use_jit: Any, case: int) -> None:
    """``select_slo_customized`` compiled (systems.kernels.slo_select) and not: the same
    selection over random rankings, padded rows of unequal size, path probabilities that tie, a target a prefix
    meets exactly, targets at 0, negative, infinite and NaN, and every n_max."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(case)
    n, m = int(rng.integers(1, 12)), int(rng.integers(1, 40))
    pp = np.sort(rng.choice([0.5, 0.25, 0.125, 0.3, 0.1, 1e-3], (n, m)) if case % 2 else rng.random((n, m)),
                 axis=1)[:, ::-1].copy()
    size = rng.integers(0, m + 1, n) if case % 3 else np.full(n, m)
    pp[np.arange(m) >= size[:, None]] = -np.inf
    before = np.concatenate([np.zeros((n, 1)), np.cumsum(np.where(np.isfinite(pp), pp, 0.0), axis=1)], axis=1)
    target = rng.uniform(-0.5, 3.0, n)
    target[0] = before[0, min(2, m)]  # a prefix meets it exactly
    if n > 3:
        target[1:4] = [0.0, np.inf, np.nan]
    ranked = Ranked([], np.zeros((n, m), dtype=np.int64), pp, np.ones((n, m), dtype=np.int64), size)
    key = rng.permutation(n).astype(np.float64)
    for n_max in (0, 1, 3, m, m + 5):
        for order in ("descending", "ascending"):
            budget = int(rng.integers(1, n * m + 2))
            got = []
            for on in (False, True):
                use_jit(on)
                got.append(select_slo_customized(ranked, target, key, order=order, n_max=n_max, budget=budget))
            assert got[0].tolist() == got[1].tolist(), (n_max, order)


@pytest.mark.parametrize("case", range(40))
def test_compiled_global_selection_equals_the_numpy_reference(use_jit: Any, case: int) -> None:
    """``select_global`` compiled (systems.kernels.global_select) and not: the same picks over random rankings with
    padded rows, prefixes already taken (some past the row's size), path probabilities that tie across rows and
    depths at the cut, and budgets from 0 past every node."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(100 + case)
    n, m = int(rng.integers(1, 12)), int(rng.integers(1, 40))
    values = [0.5, 0.25, 0.125, 0.3, 0.1] if case % 2 else rng.random(6).tolist()
    pp = np.sort(rng.choice(values, (n, m)) if case % 4 < 2 else rng.random((n, m)), axis=1)[:, ::-1].copy()
    size = rng.integers(0, m + 1, n) if case % 3 else np.full(n, m)
    pp[np.arange(m) >= size[:, None]] = -np.inf
    depth = np.sort(rng.integers(1, 9, (n, m)), axis=1)
    ranked = Ranked([], np.zeros((n, m), dtype=np.int64), pp, depth, size)
    for _ in range(6):
        counts = rng.integers(0, m + 2, n) if rng.random() < 0.7 else np.zeros(n, dtype=np.int64)
        budget = int(rng.integers(-1, n * m + 3))
        got = []
        for on in (False, True):
            use_jit(on)
            got.append(select_global(ranked, counts, budget).tolist())
        assert got[0] == got[1], (counts.tolist(), budget)
