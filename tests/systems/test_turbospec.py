"""TurboSpec: the goodput controller (Eq. 1–4, Listing 2), the profiler, the adaptor and the system end to end."""

from __future__ import annotations

import numpy as np
import pytest

from repro.cost.step import decode_pass_s
from repro.experiments.simulate import build, compose
from repro.sim.plan import StepPlan
from repro.sim.state import Status, View
from systems.turbospec import (
    AcceptanceTracker,
    LatencyFit,
    StepLatencyModel,
    argmax_goodput,
    kv_blocks_needed,
    kv_blocks_needed_at,
    profile,
)
from tests.conftest import make_cost

# the subject does not depend on where the workload comes from: pinned to the embedded statistics
# (conftest.no_data), so CI's no-data pass need not repeat it
pytestmark = pytest.mark.usefixtures("no_data")


def plane(alpha: float, gamma: float, delta: float) -> LatencyFit:
    """Eq. (3) as one plane (a single bucket)."""
    return LatencyFit(np.array([np.inf]), np.array([alpha]), np.array([gamma]), np.array([delta]))


# A100-like numbers: the target streams 10 ms of weights, 60 µs per batched token, 0.5 µs per context token;
# the draft pass costs 0.4 ms + 2 µs per token, plus 0.8 ms per speculation round.
FIT = StepLatencyModel("draft", plane(5e-7, 6e-5, 1e-2), plane(1e-8, 2e-6, 4e-4), 8e-4, 0.0, 0.0)


def brute_force_k(alpha: float, batch: int, context: float, max_len: int, fit: StepLatencyModel = FIT) -> int:
    """Eq. (4) and Eq. (2)–(3) spelled out per k."""
    best, best_g = 0, -1.0
    for k in range(max_len + 1):
        tokens = batch * sum(alpha**i for i in range(k + 1))  # (1 − α^(k+1))/(1 − α)
        t_target = fit.target.alpha[0] * context + fit.target.gamma[0] * batch * (k + 1) + fit.target.delta[0]
        d = fit.drafter
        assert d is not None
        t_draft = 0.0 if k == 0 else fit.round_s + k * (d.alpha[0] * context + d.gamma[0] * batch + d.delta[0])
        g = tokens / (t_target + t_draft)
        if g > best_g:
            best, best_g = k, g
    return best


@pytest.mark.parametrize(("alpha", "batch", "context"), [
    (0.7, 1, 512),      # one request, typical acceptance: long proposals
    (0.7, 16, 16 * 512),
    (0.7, 64, 64 * 512),
    (0.9, 8, 8 * 1024),  # accurate proposals
    (0.5, 8, 8 * 1024),
    (0.3, 32, 32 * 256),  # poor acceptance at a medium batch
])
def test_argmax_goodput_matches_brute_force(alpha: float, batch: int, context: float) -> None:
    assert argmax_goodput(alpha, batch, context, FIT, 7) == brute_force_k(alpha, batch, context, 7)


@pytest.mark.parametrize(("batch", "k"), [
    (1, 6),     # weight streaming dominates: speculate long
    (4, 5),
    (16, 4),
    (64, 2),    # batched tokens start to cost compute
    (256, 2),
    (1024, 1),  # compute-bound: almost pure batching
])
def test_k_falls_as_batch_grows(batch: int, k: int) -> None:
    # Fig. 5(a): propose less for large batches (α = 0.7, 128 tokens of context per request)
    assert argmax_goodput(0.7, batch, batch * 128, FIT, 7) == k == brute_force_k(0.7, batch, batch * 128, 7)


@pytest.mark.parametrize(("alpha", "k"), [
    (0.3, 2),  # poor proposals: short
    (0.5, 3),
    (0.7, 5),
    (0.8, 7),  # accurate proposals: up to MAX_LEN
    (0.9, 7),
])
def test_k_rises_with_acceptance(alpha: float, k: int) -> None:
    # Fig. 5(b): propose more for accurate batches (batch 8, 512 tokens of context per request)
    assert argmax_goodput(alpha, 8, 8 * 512, FIT, 7) == k == brute_force_k(alpha, 8, 8 * 512, 7)


@pytest.mark.parametrize(("alpha", "batch", "context"), [
    (0.05, 1, 512),           # nothing is accepted: the draft and round cost buy nothing
    (0.05, 32, 32 * 512),
    (0.7, 4096, 4096 * 32),   # huge batch of short contexts: compute-bound, batching beats speculation (§4.1.2 (3))
])
def test_no_speculation_when_it_cannot_pay(alpha: float, batch: int, context: float) -> None:
    assert argmax_goodput(alpha, batch, context, FIT, 7) == 0 == brute_force_k(alpha, batch, context, 7)


def test_kv_blocks_needed_by_hand() -> None:
    # block 16; request A has 15 tokens computed in 1 block, B 32 in 2 blocks, C (not speculating) 10 in 1
    need = kv_blocks_needed(np.array([15, 32, 10]), np.array([1, 2, 1]), np.array([True, True, False]), 16, 3)
    # k=0: A needs 16 slots (1 block, has 1) → 0; B needs 33 → 1; C 11 → 0. k=1: A 17 → 1, B 34 → 1 ...
    assert need.tolist() == [1, 2, 2, 2]


def test_oom_guard_caps_k() -> None:
    free = 2
    need = np.array([0, 1, 2, 3, 3, 4, 5, 6])
    unconstrained = argmax_goodput(0.9, 1, 512, FIT, 7)
    assert unconstrained > 2
    assert argmax_goodput(0.9, 1, 512, FIT, 7, free, need) == 2  # the largest k whose slots fit
    assert argmax_goodput(0.9, 1, 512, FIT, 7, 0, need) == 0


def argmax_goodput_arrays(alpha: float, batch: int, context: float, fit: StepLatencyModel, max_len: int,
                          free_blocks: int | None = None, blocks_needed: np.ndarray | None = None, *,
                          num_spec: int | None = None, match_rate: float = 1.0, verify_frac: float = 1.0,
                          min_k: int = 0) -> int:
    """Listing 2 over numpy arrays, every k at once (the clear form :func:`argmax_goodput` computes in floats)."""
    ns = batch if num_spec is None else num_spec
    ks = np.arange(max_len + 1)
    a = np.clip(np.asarray(alpha, dtype=np.float64), 1e-9, 1 - 1e-9)
    gen = (batch - ns) + ns * (1.0 + match_rate * ((1.0 - a ** (ks + 1)) / (1.0 - a) - 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        goodput = gen / fit.step_s(ks, batch, ns, context, verify_frac)
    goodput[:min_k] = -np.inf
    if free_blocks is not None and blocks_needed is not None:
        goodput[np.asarray(blocks_needed)[: max_len + 1] > free_blocks] = -np.inf
    best = int(np.argmax(goodput))
    return best if np.isfinite(goodput[best]) else 0


@pytest.mark.parametrize("proposer", ["draft", "pld"])
def test_argmax_goodput_equals_the_array_form(proposer: str) -> None:
    # the per-step form (Python floats) against the array form: the same floats, so the same k, over the profiled
    # piecewise fit (every bucket), OOM guards, probes and degenerate latencies (0: goodput +inf, NaN)
    cost = make_cost("a100-80g", "llama2-7b", "llama-160m")
    fits = [profile(cost, proposer, 7, 256), FIT,
            StepLatencyModel("draft", plane(0.0, 0.0, 0.0), plane(0, 0, 0), 0, 0, 0),
            StepLatencyModel("draft", plane(1e-7, -1e-4, 1e-3), plane(0, 0, 0), 1e-4, 0, 0),
            StepLatencyModel("draft", plane(np.nan, 1e-5, 1e-3), plane(0, 0, 0), 1e-4, 0, 0)]
    rng = np.random.default_rng(3)
    for i in range(3000):
        fit = fits[i % len(fits)]
        batch = int(rng.integers(1, 300))
        ns = int(rng.integers(0, batch + 1))
        alpha = float(rng.choice([0.0, 1.0, rng.random()]))
        max_len = int(rng.integers(1, 11))
        need = np.cumsum(rng.integers(0, 3, max_len + 1))
        free = int(rng.integers(0, 2 * need[-1] + 1)) if rng.random() < 0.5 else None
        kw = dict(num_spec=ns, match_rate=float(rng.random()), verify_frac=float(rng.random()),
                  min_k=int(rng.integers(0, 2)))
        context = float(rng.integers(0, 4096) * batch)
        assert argmax_goodput(alpha, batch, context, fit, max_len, free, need, **kw) \
            == argmax_goodput_arrays(alpha, batch, context, fit, max_len, free, need, **kw)
        assert np.array_equal(fit.step_times(max_len, batch, ns, context, kw["verify_frac"]),
                              fit.step_s(np.arange(max_len + 1), batch, ns, context, kw["verify_frac"]), equal_nan=True)


def test_kv_blocks_needed_equals_the_slot_form() -> None:
    rng = np.random.default_rng(4)
    for _ in range(200):
        n, bs, max_len = int(rng.integers(1, 50)), int(rng.choice([1, 4, 16])), int(rng.integers(0, 10))
        computed = rng.integers(0, 3000, n)
        blocks = (computed + 1 + bs - 1) // bs + rng.integers(-1, 2, n)
        spec = rng.random(n) < 0.7
        k = np.arange(max_len + 1)[:, None]
        slots = computed[None, :] + 1 + k * spec[None, :].astype(np.int64)  # 1 + k slots per speculating request
        want = np.maximum((slots + bs - 1) // bs - blocks[None, :], 0).sum(axis=1)
        assert kv_blocks_needed(computed, blocks, spec, bs, max_len).tolist() == want.tolist()
        assert [kv_blocks_needed_at(computed, blocks, spec, bs, k) for k in range(max_len + 1)] == want.tolist()


FIT_TOL = 0.06  # Eq. 3 is linear in the batch's context; the KV read's efficiency η(V) is not (up to 4.9 % here)


@pytest.mark.parametrize(("hardware", "model", "draft"), [
    ("a100-80g", "llama2-7b", "llama-160m"),
    ("h100-80g", "llama3-8b", "llama3.2-1b"),
])
def test_profiler_fit_reproduces_cost_model(hardware: str, model: str, draft: str) -> None:
    cost = make_cost(hardware, model, draft)
    rng = np.random.default_rng(7)
    for proposer in ("draft", "eagle"):
        fit = profile(cost, proposer, 7, 256)
        for _ in range(300):  # held-out shapes: batch, context and k off the profiling grid
            b, c, k = int(rng.integers(1, 200)), int(rng.integers(40, 3000)), int(rng.integers(0, 8))
            n = b * (k + 1)
            true_t = decode_pass_s(cost, b, c, k)
            assert fit.target(b * c, n) == pytest.approx(true_t, rel=FIT_TOL)
            true_d = cost.forward_s(b, b, kv_read_tokens=b * c + b, decode_only=True, which=proposer)
            assert fit.drafter is not None
            assert fit.drafter(b * c, b) == pytest.approx(true_d, rel=0.05)
    pld = profile(cost, "pld", 7, 256)
    assert pld.pld_fixed_s + 10 * pld.pld_per_seq_s == pytest.approx(cost.pld_s(10))


@pytest.mark.parametrize(("engine", "worst_lo", "worst_hi"), [
    ("vllm_v1", 0.0, 0.06),  # multi-query verification: each context token's KV loaded once, as Eq. 3 charges it
    ("turbospec_mq", 0.0, 0.1),  # ... with graphs up to 256 tokens only: larger passes run eagerly (a step)
    ("vllm_v0", 0.3, 2.0),  # batch expansion re-reads a sequence's KV per proposed token: a context x k term
])
def test_eq3_fits_multi_query_engines_and_misfits_batch_expansion(engine: str, worst_lo: float, worst_hi: float
                                                                  ) -> None:
    # TurboSpec's Eq. 3 (alpha * N_context + gamma * N_batched + delta per bucket) "accurately predicts" the target's
    # pass (Fig. 6): on the engines whose verification reads the KV once its worst error is within 6-10 % (3.2 % and
    # 8.2 % measured); under batch expansion it is not (79 %): the evidence for conf/engine/turbospec_mq.yaml.
    cost = make_cost("h100-80g", "llama2-7b", "llama-160m", engine=engine)
    fit = profile(cost, "draft", 7, 64).target
    worst = max(abs(float(fit(b * c, b * (k + 1))) / decode_pass_s(cost, b, c, k) - 1)
                for b in (1, 4, 16, 32, 64) for c in (128, 512, 1024, 2048) for k in (0, 1, 3, 7))
    assert worst_lo <= worst <= worst_hi, worst


def _step(tracker: AcceptanceTracker, rng: np.random.Generator, alpha: float, n: int = 8, k: int = 4) -> None:
    """One step of n chains of k whose tokens are accepted i.i.d. with probability alpha."""
    ok = rng.random((n, k + 1)) < alpha
    ok[:, k] = False
    acc = ok.argmin(axis=1)
    tracker.update(np.full(n, k), np.full(n, k), acc, n * k)


def test_moving_average_tracks_a_step_change() -> None:
    tracker = AcceptanceTracker(window=200, init_acceptance=0.7)
    assert tracker.alpha == 0.7  # prior before any observation
    rng = np.random.default_rng(0)
    for _ in range(200):
        _step(tracker, rng, 0.8)
    assert tracker.alpha == pytest.approx(0.8, abs=0.05)  # accepted / tested is unbiased for chains
    seen = []
    for _ in range(40):  # ≈ 11 tested tokens per step at α = 0.3: the window turns over in ≈ 20 steps
        _step(tracker, rng, 0.3)
        seen.append(tracker.alpha)
    assert seen[0] > 0.7 and seen[10] < 0.65 and seen[-1] == pytest.approx(0.3, abs=0.06)


def test_prior_fills_the_window_until_it_is_full() -> None:
    tracker = AcceptanceTracker(window=10, init_acceptance=0.7)
    tracker.update(np.array([4]), np.array([4]), np.array([0]), 4)  # one chain rejected at its first token
    assert tracker.alpha == pytest.approx((0 + 0.7 * 9) / 10)  # 1 tested token, 9 prior


def test_tracker_ignores_steps_without_speculation() -> None:
    tracker = AcceptanceTracker(window=4, init_acceptance=0.6)
    tracker.update(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64), 0)
    assert tracker.alpha == 0.6
    # PLD: 2 of 4 requests found a match; 3 of the 5 proposed tokens accepted, both chains stopped early
    tracker.update(np.full(4, 3), np.array([3, 0, 2, 0]), np.array([2, 0, 1, 0]), 12)
    assert tracker.match_rate == 0.5 and tracker.alpha == pytest.approx(3 / 5)


# --- end to end -----------------------------------------------------------------------------------------------


def run(system: str, *overrides: str, n: int = 40, rps: float = 8.0) -> tuple[object, list[StepPlan]]:
    cfg = compose([f"system={system}", f"num_requests={n}", f"rps={rps}", "seed=0", "workload.source=embedded",
                   *overrides])
    built = build(cfg)
    pol = built.engine.replicas[0].policy
    plans: list[StepPlan] = []
    inner = pol.schedule

    def spy(view: View) -> StepPlan:
        plan = inner(view)
        plans.append(plan)
        return plan

    pol.schedule = spy  # type: ignore[method-assign]
    out = built.engine.run()
    return out, plans


@pytest.mark.parametrize("system", ["turbospec", "turbospec_eagle", "turbospec_pld"])
def test_turbospec_end_to_end(system: str) -> None:
    out, plans = run(system)
    s = out.state  # type: ignore[attr-defined]
    assert (s.status == Status.FINISHED).all()
    assert s.num_proposed.sum() > 0 and s.num_accepted.sum() > 0
    ks = np.concatenate([p.k for p in plans if p.k is not None])
    assert ks.max() <= 7 and np.unique(ks).size > 1  # k adapts within MAX_LEN


def test_pld_verification_length_within_fixed_proposal() -> None:
    _, plans = run("turbospec_pld", "system.pld_proposed_len=2")
    ks = np.concatenate([p.k for p in plans if p.k is not None])
    assert ks.max() <= 2 and all(not p.draft_sync for p in plans)


def test_prefill_disabling_learns_threshold_and_skips_proposer() -> None:
    # acceptance 0.05: speculation never pays, so the threshold is learned and proposer prefills are skipped
    _, plans = run("turbospec", "oracle.accept_override=0.05", n=60, rps=16.0)
    skipped: set[int] = set()
    prefills = [p for p in plans if p.prefill_ids.size]
    assert any(p.draft_sync for p in prefills) and any(not p.draft_sync for p in prefills)
    for p in plans:
        if p.prefill_ids.size and not p.draft_sync:
            skipped.update(p.prefill_ids.tolist())
        elif p.k is not None:  # requests whose proposer prefill was skipped never speculate (§4.2)
            mine = np.isin(p.decode_ids, list(skipped))
            assert (p.k[mine] == 0).all()
    assert skipped


def test_threshold_reset_after_reset_steps() -> None:
    _, plans = run("turbospec", "oracle.accept_override=0.05", "system.reset_steps=3", n=60, rps=16.0)
    n_skip = sum(1 for p in plans if p.prefill_ids.size and not p.draft_sync)
    assert n_skip >= 3  # several skips, with resets re-enabling proposer prefills in between
    assert sum(1 for p in plans if p.prefill_ids.size and p.draft_sync) > 1


# --- paper claim: TurboSpec tracks the best static k without sweeping it (§7.1, Fig. 12) ---------------------

TOLERANCE = 0.05  # mean latency within 5 % of the best static k, and of vLLM (no speculation)
STATIC = {"turbospec": "static_sd_k{}", "turbospec_eagle": "static_sd_eagle_k{}", "turbospec_pld": "static_sd_pld_k{}"}


def mean_latency(system: str, rps: float) -> float:
    cfg = compose([f"system={system}", "num_requests=150", f"rps={rps}", "seed=1", "workload=sharegpt",
                   "workload.source=embedded"])
    s = build(cfg).engine.run().state
    return float((s.finish_at - s.arrival_s).mean())


# On vLLM v0 (batch expansion, host costs) at 16 req/s TurboSpec with EAGLE switches speculation off while static
# EAGLE k = 1 still gains 7 % over no speculation: 8.16 s vs 7.74 s (+5.4 %), a miss the note and summary report.
EAGLE_HIGH_LOAD = pytest.mark.xfail(strict=True, reason="TurboSpec-EAGLE 5.4 % behind static EAGLE k = 1 at 16 req/s")


@pytest.mark.parametrize("rps", [2.0, 16.0])  # low and high load on Llama-2-7B / A100
@pytest.mark.parametrize("system", sorted(STATIC))
def test_latency_within_tolerance_of_best_static_and_vllm(system: str, rps: float, request: pytest.FixtureRequest
                                                          ) -> None:
    if system == "turbospec_eagle" and rps == 16.0:
        request.applymarker(EAGLE_HIGH_LOAD)
    ours = mean_latency(system, rps)
    best_static = min(mean_latency(STATIC[system].format(k), rps) for k in (1, 3, 5, 7))
    assert ours <= best_static * (1 + TOLERANCE)
    assert ours <= mean_latency("vllm", rps) * (1 + TOLERANCE)


@pytest.mark.parametrize(("accept", "n", "big_off", "small_k"),
                         [(0.3, 256, 0.9, 0.0), (0.5, 256, 0.9, 0.0), (0.7, 200, 0.0, 1.0)])
def test_speculation_switched_off_at_high_load_when_it_cannot_pay(accept: float, n: int, big_off: float,
                                                                   small_k: float) -> None:
    # §6.1 / Fig. 9a: one batch of 256 fixed 256/256 requests on an A100 (vLLM v0: batch expansion, host costs).
    # At acceptance 0.3 and 0.5 a chain does not pay while 128 or more requests decode together: at least 90 % of
    # those steps run without speculation (and the requests whose draft prefill was skipped never speculate, §4.2's
    # prefill disabling). At 0.7 it pays: TurboSpec keeps proposing as the batch drains (k >= 1 on average). That
    # case runs 200 requests, whose 102,400 tokens fit the 7,011-block pool (112,176 tokens): 256 overfill it, up to
    # 238 requests then decode at once, and a quarter of the steps at batch >= 128 play k = 0 (Listing 2's goodput,
    # with free blocks for the proposal), the regime the 0.3 and 0.5 cases test.
    cfg = compose(["system=turbospec", "hardware=a100-80g", "workload=fixed", f"oracle.accept_override={accept}",
                   "rps=inf", f"num_requests={n}", "engine.record_steps=true", "seed=0"])
    steps = build(cfg).engine.run().steps
    big = np.array([r.mean_k for r in steps if r.num_decode >= 128])
    small = np.array([r.mean_k for r in steps if 0 < r.num_decode <= 8])
    assert big.size > 50 and small.size > 5
    assert (big == 0).mean() >= big_off, np.unique(big, return_counts=True)
    assert small.mean() >= small_k, small
    if accept == 0.7:
        assert (big == 0).mean() < 0.1  # it pays at every batch size: not switched off
