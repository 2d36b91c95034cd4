"""Four engine and policy mechanisms that the reference results alone would guard only through drift (issue 59).

- The compiled decode step's KV growth (``repro.sim.kernels._grow_kv``, inside ``decode_begin`` and ``chains_begin``)
  reserves ``k + 1`` new slots a request, the bonus token's included, exactly as the NumPy path
  (``KvPool.allocate(ids, ctx + k + 1)``) does: pinned at block boundaries on the kernels themselves and through the
  engine's over-commit guard (a plan one block over the pool is a ``PlanError`` on both paths, one that fits is not).
- A prefill's blocks (``KvPool.allocate``) round up: a prompt one token past a block holds one more block, and the
  pool's used count is the sum of the requests' blocks; with the blocks right, the fast path takes the decode step
  after a step-by-step prefill (it checks the blocks a request holds, and would silently decline).
- LinUCB (``systems.nightjar.LinearBandit.select``) scores each arm θ·x + α·√(xᵀA⁻¹x): pinned on the scores
  themselves and on states where the confidence width alone decides (the less-tried of equally good arms wins).
- Recompute preemption (``KvPool.preempt``) puts the request back at the front of the waiting queue (vLLM v0's
  ``waiting.extendleft``), ahead of the requests that were waiting already, which keep their order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from repro.core import jit
from repro.experiments.simulate import build, compose
from repro.sim import kernels
from repro.sim.engine import Engine
from repro.sim.fastforward import FastForward
from repro.sim.kv import KvPool
from repro.sim.plan import PlanError, StepPlan, ids
from repro.sim.policy import Policy
from repro.sim.state import RUNNING, WAITING, RequestState, Status, View
from systems import nightjar
from systems.nightjar import LinearBandit
from systems.vllm import VLLM
from tests.conftest import FixedOracle, make_cost, make_engine, make_requests

BS = 16  # the engine's default block size (Engine(block_size=16))

PlanFactory = Callable[[View], StepPlan]


def _ceil_blocks(tokens: np.ndarray | list[int], bs: int = BS) -> np.ndarray:
    return -(-np.asarray(tokens, dtype=np.int64) // bs)


class _Scripted(Policy):
    """Plays its plan factories one per step, then prefills whatever waits (whole prompts) or decodes the batch."""

    uses_draft_model = True

    def __init__(self, *plans: PlanFactory) -> None:
        self.plans = list(plans)

    def schedule(self, view: View) -> StepPlan:
        if self.plans:
            return self.plans.pop(0)(view)
        if view.waiting.size:
            return _prefill(view)
        return StepPlan(decode_ids=view.running)


def _prefill(view: View, *, draft_sync: bool = False) -> StepPlan:
    w = view.waiting
    return StepPlan(prefill_ids=w, prefill_tokens=view.num_tokens(w), draft_sync=draft_sync)


def _pool(n: int, *, total: int = 10_000) -> tuple[RequestState, KvPool]:
    """A request state of ``n`` requests and a pool of ``total`` blocks of :data:`BS` tokens over it."""
    state = RequestState(np.zeros(n), np.full(n, 64), np.full(n, 8), np.full(n, np.inf), np.full(n, np.inf),
                         np.zeros(n, dtype=np.int64))
    cost = make_cost()
    pool = KvPool(state, cost, block_size=BS, layout=cost.engine.draft_kv_layout, draft_resident=False)
    pool.total = total
    return state, pool


@pytest.fixture
def kernel_names(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the compiled kernels the engine asks for (``repro.core.jit.kernel``), in order."""
    asked: list[str] = []
    kernel = jit.kernel

    def recorded(module: str, name: str) -> Callable[..., Any]:
        asked.append(name)
        return kernel(module, name)

    monkeypatch.setattr(jit, "kernel", recorded)
    yield asked


# --- 1. the compiled decode step's KV growth: k + 1 new slots a request -----------------------------------------

#: contexts either side of block boundaries (1, 2 and 5 blocks), and chain lengths 0, 1, one short of a block, a
#: block and one past it: every way the context plus the k + 1 new tokens can meet a boundary
BOUNDARY_CTX = [c for m in (1, 2, 5) for c in (m * BS - 1, m * BS, m * BS + 1)]
BOUNDARY_K = [0, 1, BS - 1, BS, BS + 1]


@pytest.mark.parametrize("compiled", [False, True], ids=["plain Python", "compiled"])
@pytest.mark.parametrize("k", BOUNDARY_K)
def test_the_decode_kernels_reserve_the_bonus_tokens_slot_at_block_boundaries(compiled: bool, k: int) -> None:
    """``decode_begin`` and ``chains_begin`` (through ``_grow_kv``) grow each request's KV to hold its context and
    ``k + 1`` more tokens, ceil((ctx + k + 1) / block_size) blocks, and return the blocks added: what the NumPy path's
    ``KvPool.allocate(ids, ctx + k + 1)`` writes and counts. Contexts at, one under and one over a block boundary.
    Breaks if ``_grow_kv`` leaves the bonus token's slot unreserved (``ctx + k`` instead of ``ctx + k + 1``): a request
    whose ``ctx + k`` is a multiple of the block size then gets one block too few."""
    if compiled:
        pytest.importorskip("numba")
    n = len(BOUNDARY_CTX)
    ctx = np.array(BOUNDARY_CTX, dtype=np.int64)
    gen = np.full(n, 3, dtype=np.int64)
    prompt = ctx - gen + 1  # a decoding request's context: its prompt and the tokens generated but the last
    held = _ceil_blocks(ctx)  # its blocks after the previous step
    want = _ceil_blocks(ctx + k + 1)
    assert np.count_nonzero(want > _ceil_blocks(ctx + k)), "the cases include a bonus slot past a block"
    dids = np.arange(n, dtype=np.int64)
    ks = np.full(n, k, dtype=np.int64)

    def fn(name: str) -> Callable[..., Any]:
        return jit.kernel("repro.sim.kernels", name) if compiled else getattr(kernels, name)

    blocks = held.copy()
    g, c = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    added = fn("decode_begin")(np.full(n, RUNNING), gen.copy(), ctx.copy(), prompt, blocks, dids, ks, BS, g, c)
    assert blocks.tolist() == want.tolist() and added == int((want - held).sum())
    assert c.tolist() == ctx.tolist() and g.tolist() == gen.tolist()

    blocks = held.copy()
    sums = np.zeros(3, dtype=np.int64)
    took = fn("chains_begin")(np.zeros(n, dtype=np.int64), np.full(n, RUNNING), gen.copy(), ctx.copy(), prompt, blocks,
                              ctx.copy(), dids, ks, BS, True, np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64),
                              sums)
    assert took and blocks.tolist() == want.tolist() and int(sums[0]) == int((want - held).sum())

    state, pool = _pool(n)  # the NumPy path's reference
    state.kv_blocks[:] = held
    pool.used = int(held.sum())
    pool.allocate(dids, ctx + k + 1)
    assert state.kv_blocks.tolist() == want.tolist() and pool.used == int(want.sum())


#: how the decode step reaches the KV growth: (the plan's k, whether the prefill keeps the draft's cache in step,
#: whether a step trace watches (no lean step), the kernel that grows the KV where the kernels are compiled)
DECODE_PATHS = {
    "no k, general step (decode_begin)": (None, False, False, "decode_begin"),
    "k = 0, lean step of chains (chains_begin)": (0, False, False, "chains_begin"),
    "k = 3, lean step of chains (chains_begin)": (3, True, False, "chains_begin"),
    "k = 3, step trace: general step (decode_begin)": (3, True, True, "decode_begin"),
    f"k = {BS}, lean step of chains (chains_begin)": (BS, True, False, "chains_begin"),
    f"k = {BS}, draft cache behind: general step (decode_begin)": (BS, False, False, "decode_begin"),
}


def _boundary_prompts(k: int) -> list[int]:
    """Prompts whose decode step of chains of ``k`` meets a block boundary each way: the bonus token's slot one past a
    block, the last slot filling a block, one past that, and a context that is a whole number of blocks."""
    return [2 * BS - k, 2 * BS - k - 1, 2 * BS - k + 1, 2 * BS]


def _decode_engine(k: int | None, sync: bool, trace: bool, kv_blocks: int | None = None) -> Engine:
    """An engine over the :func:`_boundary_prompts` of ``k``: one prefill step, then one decode step of chains of ``k``
    (``None``: no k) that emits each request's second and last token (nothing accepted)."""
    prompts = _boundary_prompts(k or 0)

    def decode(v: View) -> StepPlan:
        return StepPlan(decode_ids=v.running, k=None if k is None else np.full(v.running.size, k, dtype=np.int64))

    policy = _Scripted(lambda v: _prefill(v, draft_sync=sync), decode)
    return make_engine(policy, make_requests(len(prompts), prompt_len=prompts, output_len=2), oracle=FixedOracle(0),
                       kv_blocks=kv_blocks, record_steps=trace)


def _peak_blocks(k: int | None) -> int:
    return int(_ceil_blocks(np.array(_boundary_prompts(k or 0)) + (k or 0) + 1).sum())


@pytest.mark.parametrize("compiled", [False, True], ids=["NumPy", "compiled"])
@pytest.mark.parametrize("path", DECODE_PATHS.values(), ids=DECODE_PATHS.keys())
def test_a_decode_step_holds_k_plus_one_new_slots_a_request_on_both_paths(
        use_jit: Any, kernel_names: list[str], compiled: bool, path: tuple[int | None, bool, bool, str]) -> None:
    """Inside a decode step of chains of ``k``, each request holds ceil((ctx + k + 1) / block_size) blocks and the pool
    counts them, whether the step runs on NumPy (``KvPool.allocate``) or compiled (``decode_begin`` or
    ``chains_begin`` and ``KvPool.grew``). Breaks if the compiled ``_grow_kv`` leaves the bonus token's slot
    unreserved: the blocks are right again at the step's end (recomputed from the context), not inside it."""
    if compiled:
        pytest.importorskip("numba")
    use_jit(compiled)
    k, sync, trace, kernel = path
    eng = _decode_engine(k, sync, trace)
    kv = eng.replicas[0].kv
    seen: list[tuple[list[int], int]] = []  # each request's blocks and the pool's count after each growth

    def watched(grow: Callable[..., None]) -> Callable[..., None]:
        def after(*args: Any) -> None:
            grow(*args)
            seen.append((kv.s.kv_blocks.tolist(), kv.used))
        return after

    for name in ("allocate", "grew"):
        setattr(kv, name, watched(getattr(kv, name)))
    out = eng.run()
    assert (out.state.status == Status.FINISHED).all() and out.num_steps == 2
    prompts = np.array(_boundary_prompts(k or 0))
    want = _ceil_blocks(prompts + (k or 0) + 1)
    assert seen[0] == (_ceil_blocks(prompts).tolist(), int(_ceil_blocks(prompts).sum()))  # the prefill
    assert seen[-1] == (want.tolist(), int(want.sum()))  # the decode step, before its outcome
    if compiled:
        assert kernel in kernel_names and (kernel == "chains_begin") == ("decode_begin" not in kernel_names)
    else:
        assert not kernel_names


@pytest.mark.parametrize("compiled", [False, True], ids=["NumPy", "compiled"])
@pytest.mark.parametrize("path", DECODE_PATHS.values(), ids=DECODE_PATHS.keys())
def test_a_plan_one_block_over_the_pool_is_a_plan_error_and_one_that_fits_is_not(
        use_jit: Any, compiled: bool, path: tuple[int | None, bool, bool, str]) -> None:
    """The engine's over-commit guard (``KvPool.allocate`` / ``KvPool.grew`` raising ``PlanError``): a decode step
    whose k + 1 new slots a request need one block more than the pool holds is rejected, with and without the compiled
    kernels; a pool of exactly the blocks needed runs it (every request finishes in it, so the step's end fits
    either way: only the guard inside the step can tell). Breaks if the compiled ``_grow_kv`` leaves the bonus
    token's slot unreserved: the guard is then one block a crossing request too lenient, on the compiled path."""
    if compiled:
        pytest.importorskip("numba")
    use_jit(compiled)
    k, sync, trace, _ = path
    peak = _peak_blocks(k)
    assert peak > int(_ceil_blocks(_boundary_prompts(k or 0)).sum())  # (the prefill fits the smaller pool)
    with pytest.raises(PlanError, match="out of KV blocks"):
        _decode_engine(k, sync, trace, kv_blocks=peak - 1).run()
    out = _decode_engine(k, sync, trace, kv_blocks=peak).run()
    assert (out.state.status == Status.FINISHED).all()


# --- 2. a prefill's blocks round up -------------------------------------------------------------------------------

#: prompt lengths at, one under and one over a whole number of blocks (1, 2 and 10 blocks), and a single token
PREFILL_TOKENS = [1, *(c for m in (1, 2, 10) for c in (m * BS - 1, m * BS, m * BS + 1))]


def test_a_prefill_allocates_whole_blocks_rounded_up() -> None:
    """``KvPool.allocate`` gives each request ceil(tokens / block_size) blocks (a prompt one token past a block holds
    one more) and the pool's used count is the sum; a later allocation of fewer tokens never shrinks them. Breaks if
    the rounding goes down (``tokens // block_size``): every prompt not a whole number of blocks loses a block."""
    n = len(PREFILL_TOKENS)
    state, pool = _pool(n)
    rids = np.arange(n, dtype=np.int64)
    tokens = np.array(PREFILL_TOKENS, dtype=np.int64)
    pool.allocate(rids, tokens)
    want = [1, 1, 1, 2, 2, 2, 3, 10, 10, 11]
    assert _ceil_blocks(tokens).tolist() == want
    assert state.kv_blocks.tolist() == want and pool.used == sum(want) == int(state.kv_blocks.sum())
    pool.allocate(rids, np.ones(n, dtype=np.int64))  # never shrinks
    assert state.kv_blocks.tolist() == want and pool.used == sum(want)
    pool.allocate(rids[:1], np.array([BS + 1]))  # grows by what the new tokens need
    assert state.kv_blocks[0] == 2 and pool.used == sum(want) + 1
    with pytest.raises(PlanError, match="out of KV blocks"):  # one block over the pool
        _pool(1, total=2)[1].allocate(ids([0]), np.array([2 * BS + 1]))
    _pool(1, total=3)[1].allocate(ids([0]), np.array([2 * BS + 1]))  # exactly fits


def test_the_engine_prefills_whole_and_chunked_prompts_into_blocks_rounded_up() -> None:
    """Through the engine's prefill step (``Replica._begin_prefill``): whole prompts at and either side of block
    boundaries, and a prompt prefilled in chunks of 17 and 23 tokens, hold ceil(tokens computed / block_size) blocks
    after each step, and the view's free blocks are the pool less their sum. Breaks if ``KvPool.allocate`` rounds
    down."""
    prompts = [*PREFILL_TOKENS, 40]
    n = len(prompts)
    chunked = n - 1
    seen: list[tuple[list[int], int]] = []

    def record(plan: PlanFactory) -> PlanFactory:
        def made(v: View) -> StepPlan:
            seen.append((v.kv_blocks.tolist(), v.total_blocks - v.free_blocks))
            return plan(v)
        return made

    whole = ids(range(chunked))
    policy = _Scripted(
        record(lambda v: StepPlan(prefill_ids=ids([*whole, chunked]), prefill_tokens=ids([*prompts[:-1], 17]))),
        record(lambda v: StepPlan(prefill_ids=ids([chunked]), prefill_tokens=ids([23]))),
        record(lambda v: StepPlan(decode_ids=v.running)))
    out = make_engine(policy, make_requests(n, prompt_len=prompts, output_len=3)).run()
    assert (out.state.status == Status.FINISHED).all()
    after_first = [*_ceil_blocks(prompts[:-1]).tolist(), 2]
    after_second = [*after_first[:-1], 3]
    assert seen[1] == (after_first, sum(after_first))
    assert seen[2] == (after_second, sum(after_second))


#: vLLM points where decode steps follow step-by-step prefills: every request at t = 0 (no step trace: runs go on
#: through finishes), and arrivals under a step trace (runs stop at each arrival, the prefill on the step path)
FAST_POINTS = {
    "vllm, every request at t = 0": ["system=vllm", "rps=1000", "workload=sharegpt", "num_requests=40", "seed=1"],
    "vllm, arrivals, step trace": ["system=vllm", "rps=3", "workload=sharegpt", "num_requests=40", "seed=1",
                                   "engine.record_steps=true"],
}


@pytest.mark.usefixtures("no_data")
@pytest.mark.parametrize("overrides", FAST_POINTS.values(), ids=FAST_POINTS.keys())
def test_the_fast_path_takes_every_decode_step_after_a_prefill(monkeypatch: pytest.MonkeyPatch,
                                                               overrides: list[str]) -> None:
    """The fast path (``FastForward.run_ahead``) runs every decode-only plan vLLM offers it, the first after a step-
    by-step prefill included, and the policy plans far fewer steps than the run takes. The fast path checks that each
    request holds ceil(ctx / block_size) blocks; breaks if ``KvPool.allocate`` rounds a prefill's blocks down: it then
    silently declines the step after each prefill (the step path runs it and the blocks come right again), which no
    result shows."""
    built = build(compose(overrides))
    rep = built.engine.replicas[0]
    assert rep.fast_forward
    offered: list[bool] = []  # per decode-only plan offered: whether the fast path ran it
    run_ahead = FastForward.run_ahead

    def watched(self: FastForward, plan: StepPlan, *args: Any, **kw: Any) -> float | None:
        end = run_ahead(self, plan, *args, **kw)
        if not plan.prefill_ids.size and not plan.preempt_ids.size:
            offered.append(end is not None)
        return end

    monkeypatch.setattr(FastForward, "run_ahead", watched)
    planned = [0]
    schedule = rep.policy.schedule

    def counted(view: View) -> StepPlan:
        planned[0] += 1
        return schedule(view)

    monkeypatch.setattr(rep.policy, "schedule", counted)
    out = built.engine.run()
    assert (out.state.status == Status.FINISHED).all()
    assert offered and all(offered), f"the fast path declined {offered.count(False)} of {len(offered)} decode plans"
    assert planned[0] * 8 < out.num_steps, (planned[0], out.num_steps)  # (today about 1 plan in 16 steps or fewer)
    if "engine.record_steps=true" in overrides:
        assert len(offered) >= 30 and len(out.steps) == out.num_steps  # (a run after each of many prefills)


# --- 3. LinUCB: the mean's estimate plus the confidence width ------------------------------------------------------

def _linucb_by_hand(hist: list[tuple[int, int, float]], num_arms: int, max_batch: int, batch: int,
                    alpha: float) -> np.ndarray:
    """Each arm's LinUCB score at ``batch`` from its history: θ·x + α·√(xᵀA⁻¹x), A = I + Σ x xᵀ, b = Σ r x, each
    reward scaled by the largest seen when it came, x = (1, B / B_max)."""
    x = np.array([1.0, batch / max_batch])
    scores = np.empty(num_arms)
    for arm in range(num_arms):
        a_mat, bvec, top = np.eye(2), np.zeros(2), 0.0
        for b, a, r in hist:
            top = max(top, r)
            if a == arm:
                xi = np.array([1.0, b / max_batch])
                a_mat += np.outer(xi, xi)
                bvec += (r / top if top > 0 else 0.0) * xi
        theta = np.linalg.solve(a_mat, bvec)
        scores[arm] = theta @ x + alpha * np.sqrt(x @ np.linalg.solve(a_mat, x))
    return scores


class _ArgmaxSpy:
    """``systems.nightjar``'s ``np`` with ``argmax`` recording what it is given (the scores ``select`` ranks)."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def argmax(self, a: Any, *args: Any, **kw: Any) -> Any:
        self.seen.append(np.array(a, dtype=np.float64))
        return np.argmax(a, *args, **kw)


def test_linucb_scores_are_the_ridge_estimate_plus_alpha_times_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LinearBandit.select`` (LinUCB, ``thompson=False``) ranks the arms by θ·x + α·√(xᵀA⁻¹x): its scores equal a hand
    computation from the history for several batch sizes and α, and it plays their argmax, including the states where
    the width changes the winner. Breaks if the exploration term's sign flips or its width changes (e.g. xᵀA⁻¹x
    without the root, or α dropped)."""
    spy = _ArgmaxSpy()
    monkeypatch.setattr(nightjar, "np", spy)
    rng = np.random.default_rng(3)
    hist: list[tuple[int, int, float]] = []
    counts = (9, 1, 4)  # few observations of arm 1: its width is widest
    for arm, times in enumerate(counts):
        for _ in range(times):
            hist.append((int(rng.integers(1, 65)), arm, float(rng.uniform(50, 300))))
    order = rng.permutation(len(hist))
    hist = [hist[i] for i in order]
    decided_by_width = 0
    for alpha in (0.1, 0.7, 2.0):
        bandit = LinearBandit(3, 64, thompson=False, alpha=alpha)
        for b, a, r in hist:
            bandit.update(b, a, r)
        for batch in (1, 16, 40, 64):
            spy.seen.clear()
            arm, switched = bandit.select(batch, rng, np.zeros(3))
            want = _linucb_by_hand(hist, 3, 64, batch, alpha)
            assert len(spy.seen) == 1 and np.allclose(spy.seen[0], want, rtol=1e-12, atol=1e-12), (alpha, batch)
            assert arm == int(np.argmax(want)) and not switched
            decided_by_width += int(np.argmax(_linucb_by_hand(hist, 3, 64, batch, 0.0))) != arm
    assert decided_by_width >= 3  # (the width decides some of these states)


@pytest.mark.parametrize("alpha", [0.05, 1.0, 3.0])
@pytest.mark.parametrize("batch", [1, 32, 64])
def test_linucb_plays_the_less_tried_of_equally_good_arms(alpha: float, batch: int) -> None:
    """With every arm's estimated mean equal (no reward yet: all zero), LinUCB's choice is its confidence width alone:
    the arm tried least wins (the width shrinks with each observation), at any α > 0. Breaks if the exploration
    term's sign flips: the most-tried arm then wins. (The existing test compares the winner after 30 updates, when the
    width no longer decides.)"""
    rng = np.random.default_rng(0)
    counts = [7, 2, 4, 5]
    for least in range(4):
        tries = counts[-least:] + counts[:-least]  # the least-tried arm at each position in turn
        bandit = LinearBandit(4, 64, thompson=False, alpha=alpha)
        for arm, times in enumerate(tries):
            for _ in range(times):
                bandit.update(batch, arm, 0.0)
        assert bandit.select(batch, rng, np.zeros(4))[0] == int(np.argmin(tries)), tries
    fresh = LinearBandit(3, 64, thompson=False, alpha=alpha)  # an arm never tried beats the tried ones
    for arm in (0, 2):
        fresh.update(batch, arm, 0.0)
    assert fresh.select(batch, rng, np.zeros(3))[0] == 1


# --- 4. recompute preemption: back to the front of the waiting queue -------------------------------------------------

def _running_pool(running: list[int], waiting: list[int]) -> tuple[RequestState, KvPool]:
    """A pool whose ``running`` requests each hold 3 blocks (40 tokens computed, 9 generated) and whose ``waiting``
    requests wait, in that order."""
    state, pool = _pool(len(running) + len(waiting))
    run_ids = ids(running)
    state.status[run_ids] = RUNNING
    state.num_computed[run_ids] = 40
    state.num_generated[run_ids] = 9
    state.kv_blocks[run_ids] = 3
    pool.used = 3 * len(running)
    state.running = list(running)
    state.waiting = deque(waiting)
    return state, pool


def test_recompute_preemption_puts_the_request_at_the_front_of_the_waiting_queue() -> None:
    """``KvPool.preempt`` in recompute mode frees the request's blocks, drops its computed tokens and puts it back at
    the front of the waiting queue (vLLM v0: ``waiting.extendleft``), ahead of the requests already waiting, whose
    order is kept; a later preemption goes ahead of it. Several preempted at once take the front together. Swap mode
    moves the request to the swapped queue and leaves the waiting queue alone. Breaks if a recompute-preempted request
    rejoins at the back (``waiting.extend``)."""
    state, pool = _running_pool([0, 1, 2, 3, 4], [5, 6])
    assert pool.preempt(StepPlan(preempt_ids=ids([2])), None, False) == 0.0
    assert list(state.waiting) == [2, 5, 6] and state.running == [0, 1, 3, 4]
    assert state.status[2] == WAITING and state.num_computed[2] == 0 and state.kv_blocks[2] == 0
    assert state.num_preemptions[2] == 1 and pool.used == 12 == int(state.kv_blocks.sum())
    pool.preempt(StepPlan(preempt_ids=ids([4])), None, False)
    assert list(state.waiting) == [4, 2, 5, 6] and state.running == [0, 1, 3]
    pool.preempt(StepPlan(preempt_ids=ids([3, 1])), None, False)
    assert sorted(list(state.waiting)[:2]) == [1, 3] and list(state.waiting)[2:] == [4, 2, 5, 6]
    assert state.running == [0] and pool.used == 3
    pool.preempt(StepPlan(preempt_ids=ids([0]), preempt_mode="swap"), None, False)
    assert state.swapped == [0] and len(state.waiting) == 6 and state.status[0] == Status.SWAPPED
    assert pool.used == 0 == int(state.kv_blocks.sum())


def test_vllm_readmits_the_requests_it_preempted_before_the_ones_that_were_waiting() -> None:
    """Under KV pressure vLLM preempts by recompute (``KvPool.preempt``): after each preempting step the waiting queue
    is the preempted requests, then the queue as it stood, and the next prefill admits the preempted ones first (its
    scheduler admits from the front). Breaks if preempted requests rejoin the waiting queue at the back: requests
    that never ran would then overtake requests that had been running."""
    policy = VLLM()
    queues: list[list[int]] = []
    plans: list[StepPlan] = []
    schedule = policy.schedule

    def recorded(view: View) -> StepPlan:
        queues.append(view.waiting.tolist())
        plans.append(schedule(view))
        return plans[-1]

    policy.schedule = recorded  # type: ignore[method-assign]
    out = make_engine(policy, make_requests(12, prompt_len=60, output_len=100), kv_blocks=40).run()
    assert (out.state.status == Status.FINISHED).all()
    checked = readmitted = 0
    for i, plan in enumerate(plans[:-1]):
        pre = plan.preempt_ids.tolist()
        if not pre:
            continue
        checked += 1
        after = queues[i + 1]
        assert sorted(after[:len(pre)]) == sorted(pre) and after[len(pre):] == queues[i], (i, pre, queues[i], after)
        nxt = next((p for p in plans[i + 1:] if p.prefill_ids.size or p.preempt_ids.size), None)
        if nxt is not None and nxt.prefill_ids.size:  # the next admission starts with them
            readmitted += 1
            got = nxt.prefill_ids.tolist()[:len(pre)]
            assert got and set(got) <= set(pre), (i, pre, got)
    assert checked >= 5 and readmitted >= 2  # (the scenario preempts, with requests waiting behind)
    assert any(queues[i] for i, p in enumerate(plans) if p.preempt_ids.size)  # (some preempt ahead of waiters)
