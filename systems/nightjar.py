"""Nightjar: a contextual bandit over the speculative length per batch size, and elastic draft memory.

Li et al., "Nightjar: Dynamic Adaptive Speculative Decoding for Large Language Models Serving" (nightjar.txt).
Implemented:
- §4.2 Algorithm 1: ADA-BINGREEDY with independent block/bin/round state per batch size B; Eq. 3's cost-aware
  exploitation with switching cost c_prefill(L_max, B) from an offline table (T_SD − T_base of a prefill, as §4.2
  profiles it); incremental goodput means.
- §5 elastic memory: expand the KV pool when speculation is off and free blocks stay below τ_low for T_persist
  steps; contract and reload the draft asynchronously when the queue is empty and N_free > S_draft + τ_low.
- Fig. 12's ablations: LinUCB and linear Thompson sampling with the batch size as context; ADA-BINGREEDY without
  context.

Each iteration:
  1. vLLM's prefill-prioritized batch scheduler (vLLM 0.8.2's V0 spec-decode path, FCFS, recompute preemption),
     reserving the previous step's γ as lookahead KV slots; while speculation is on, a prefill step runs the draft
     alongside (its KV in sync).
  2. Decode step with batch size B: B's arm selector picks γ ∈ {0..Γ_max}. A new bin explores with probability
     1/√b_B (γ uniform); otherwise Eq. 3: argmin 1/g̃_{B,γ} + I(γ_{t−1} = 0 ∧ γ > 0)·c_prefill(L_max, B)/γ, L_max the
     largest lag of the batch's draft caches. Every decoding request speculates γ tokens.
  3. observe: reward = the step's goodput (tokens emitted / step seconds); update g̃_{B,γ} incrementally and advance
     τ_B/b_B/j_B (a bin ends after √H_B rounds, a block after √H_B bins, then H_B ← 2^(j_B−1)).
  4. (``offload``) elastic memory as a :class:`~repro.sim.plan.MemoryAction` on the next plan.

Deviations:
- Engine: ``engine=vllm_v0`` for Nightjar and every baseline (conf/engine/vllm_v0.yaml). vLLM 0.8.2 ran a draft model
  through its V0 spec-decode worker (V1 drafted n-grams only), whose MQA scorer is off under CUDA graphs, so
  verification is batch expansion.
- Γ_max = 5 (Fig. 2's largest γ; not stated as Nightjar's). B_max = max_num_seqs (256, vLLM's default).
- γ_{t−1} of Eq. 3 is the server's previous decode step's γ, whatever its batch size (the draft caches lag because
  the server stopped speculating). c_prefill is in seconds and 1/g̃ in seconds per token, added as the paper does.
- An unplayed arm (g̃ = 0, 1/0 = ∞) is never exploited, only explored; if every arm is unplayed, γ = 0.
- c_prefill table: input lengths 2^i up to 4,096, batch sizes 2^i up to B_max (§4.2's "geometrically increasing
  batch sizes"); T_SD − T_base = the draft's prefill of B × L tokens on the cost model, looked up at the smallest grid
  point ≥ (L_max, B). The engine charges the draft's actual catch-up when speculation resumes.
- γ is capped at the largest value whose KV slots fit (any vLLM scheduler's OOM guard); the capped γ is the arm
  played and rewarded. While the draft is offloaded or loading, steps run γ = 0 outside the bandit (nothing learned).
- Elastic memory (§5.1): τ_low is a fraction of the KV pool (Fig. 14's "10 % free cache threshold"); T_persist = 5
  steps (not stated). Expansion needs the last decode step's γ = 0.
- S_draft is the blocks the draft's residency costs (capacity without it − with it: its weights and, under vLLM v0's
  layout, its KV share). The paper's (§5, Table 2) is the weights alone; under v0 every block holds the draft's KV
  beside the target's, so a contraction sized on the weights could not return the blocks it needs without preempting.
- Memory costs: the offload is free (a host copy is kept, §5.4); expansion and the reload's dispatch are the engine
  profile's Table 6 values; contraction migrates the used blocks of the reclaimed region; the reload's transfer
  overlaps the steps after it.
- ``selector: adabingreedy_pow2`` (ours): one ADA-BINGREEDY state per power-of-two bucket of batch sizes (1, 2, 3-4,
  5-8, ...), to test whether coarser contexts learn faster; the default is the paper's state per batch size.
- ``selector: authors`` (``nightjar_authors``): the selector of the public fork very likely the authors'
  (lihuahua123/vllm_speculative, ``vllm/core/spec_scheduler.py``, ``ADABinGreedy``; commits by "lirui", figure files
  named like the paper's, c_prefill as §4.2 says), as a review read it; not run by us. Its departures from
  Algorithm 1, all kept:
    - 12 context bins of two batch sizes each (``min((B − 1) // 2, 11)``: every batch of 23 or more is one context);
    - exploration draws γ uniformly from 1..Γ_max (γ = 0 has prior weight 0 in every bin);
    - a hard rule above the bandit: more than 20 requests in the batch and more than 2 arriving per second turn
      speculation off, and nothing is explored or learned;
    - reward = per-request goodput (the step's goodput over its batch size);
    - exploitation is Eq. 3 on Bayesian-smoothed means, prior strength 1.
  Our choices where the review is silent: the arrival rate counts the last ``rate_window_s`` = 10 s; the prior mean is
  the context's mean reward so far times the arm's prior weight (so γ = 0 is never exploited either: only the hard
  rule turns speculation off); Eq. 3's switching term is kept. Its harness warmed the selector with two full passes:
  ``warmup_passes: 2`` runs two unmeasured passes over the same workload first, selector kept
  (:attr:`repro.sim.policy.Policy.warmup_passes`). It ran ``--enforce-eager`` and one script sets Γ_max = 3;
  ``nightjar_authors`` keeps ``vllm_v0`` and Γ_max = 5, so it differs from ``nightjar`` only in the selector.
- LinUCB / LinTS (Fig. 12 ablations): disjoint linear models per arm on (1, B / B_max), rewards scaled by the largest
  seen; α = 1 (LinUCB), v = 0.25 (LinTS); no switching term.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import numpy as np

from repro.cost.model import CostModel
from repro.sim.plan import IDLE, MemoryAction, StepPlan, StepResult
from repro.sim.policy import Policy, PolicyContext
from repro.sim.state import View
from systems.lib import check_positive_int, prefill_prioritized

Selector = Literal["adabingreedy", "adabingreedy_pow2", "adabingreedy_nocontext", "linucb", "lints", "authors"]


# --- Algorithm 1: ADA-BINGREEDY for one context -------------------------------------------------------------------


@dataclass
class BinGreedy:
    """The block/bin/round hierarchy and goodput means of one batch size (Algorithm 1, lines 3 and 6-22)."""

    num_arms: int
    j: int = 1  # block index j_B
    h: int = 1  # block duration H_B = 2^(j_B - 1)
    b: int = 1  # bin index b_B within the block
    tau: int = 1  # round counter τ_B within the bin
    explore: bool = True  # the current bin's type
    means: np.ndarray = field(init=False)  # g̃_{B,γ}, 0 before the first visit
    visits: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.means = np.zeros(self.num_arms)
        self.visits = np.zeros(self.num_arms, dtype=np.int64)

    @property
    def explore_prob(self) -> float:
        """Line 8: a new bin explores with probability 1/√b_B."""
        return 1.0 / math.sqrt(self.b)

    def select(self, rng: np.random.Generator, switch_cost: np.ndarray) -> tuple[int, bool]:
        """Lines 6-14: (γ, explored). ``switch_cost[γ]`` is Eq. 3's second term for each arm."""
        if self.tau == 1:
            self.explore = bool(rng.random() < self.explore_prob)
        if self.explore:
            return int(rng.integers(self.num_arms)), True
        return eq3(self.means, switch_cost), False

    def update(self, arm: int, reward: float) -> None:
        """Lines 15-22: the incremental mean, then the round, bin and block counters."""
        visits = int(self.visits[arm]) + 1
        self.visits[arm] = visits
        mean = float(self.means[arm])
        self.means[arm] = mean + (reward - mean) / visits
        self.tau += 1
        root = math.sqrt(self.h)
        if self.tau > root:  # bin completed
            self.b += 1
            self.tau = 1
            if self.b > root:  # block completed
                self.j += 1
                self.h = 2 ** (self.j - 1)
                self.b = 1


def eq3(means: np.ndarray, switch_cost: np.ndarray) -> int:
    """Eq. 3: argmin over γ of 1/g̃_γ + switch_cost[γ] (∞ for an arm never observed; ties → the smallest γ)."""
    return _eq3(means.tolist(), switch_cost.tolist())


def _eq3(means: list[float], switch_cost: list[float]) -> int:
    best, best_obj = 0, math.inf  # arm by arm: a handful of arms (numpy's per-call cost dominates at this size)
    for arm, (mean, cost) in enumerate(zip(means, switch_cost, strict=True)):
        obj = (1.0 / max(mean, 1e-300) if mean > 0 else math.inf) + cost
        if obj < best_obj:
            best, best_obj = arm, obj
    return best


def switch_costs(num_arms: int, prev_gamma: int, c_prefill_s: float) -> np.ndarray:
    """Eq. 3's second term per arm: I(γ_{t−1} = 0 ∧ γ > 0) · c_prefill / γ (read-only)."""
    if not (prev_gamma == 0 and c_prefill_s > 0):
        return _no_switch_cost(num_arms)
    out = np.zeros(num_arms)
    out[1:] = c_prefill_s / np.arange(1, num_arms)
    out.flags.writeable = False
    return out


@functools.cache
def _no_switch_cost(num_arms: int) -> np.ndarray:
    out = np.zeros(num_arms)
    out.flags.writeable = False
    return out


# --- arm selectors: Nightjar's and the ablations' -----------------------------------------------------------------


class ArmSelector(Protocol):
    def select(self, batch: int, rng: np.random.Generator, switch_cost: np.ndarray) -> tuple[int, bool]: ...

    def update(self, batch: int, arm: int, reward: float) -> None: ...


class AdaBinGreedy:
    """Independent :class:`BinGreedy` state per batch size (``contextual``), or one for every batch size."""

    def __init__(self, num_arms: int, contextual: bool = True, pow2: bool = False) -> None:
        self.num_arms = num_arms
        self.contextual = contextual
        self.pow2 = pow2
        self.state: dict[int, BinGreedy] = {}

    def of(self, batch: int) -> BinGreedy:
        key = (batch if not self.pow2 else 1 << (batch - 1).bit_length()) if self.contextual else 0
        st = self.state.get(key)
        if st is None:
            st = self.state[key] = BinGreedy(self.num_arms)
        return st

    def select(self, batch: int, rng: np.random.Generator, switch_cost: np.ndarray) -> tuple[int, bool]:
        return self.of(batch).select(rng, switch_cost)

    def update(self, batch: int, arm: int, reward: float) -> None:
        self.of(batch).update(arm, reward)


class LinearBandit:
    """Disjoint linear bandits (Li et al. 2010): per arm, ridge regression of the reward on x = (1, B/B_max).

    LinUCB plays argmax θ·x + α·√(xᵀA⁻¹x); linear Thompson sampling (Agrawal and Goyal 2013) plays argmax θ̃·x,
    θ̃ ~ N(θ, v²A⁻¹). Rewards are scaled by the largest seen so far, so α and v are scale-free.
    """

    def __init__(self, num_arms: int, max_batch: int, *, thompson: bool, alpha: float = 1.0, v: float = 0.25) -> None:
        self.num_arms, self.max_batch, self.thompson = num_arms, max_batch, thompson
        self.alpha, self.v = alpha, v
        self.a_inv = np.repeat(np.eye(2)[None], num_arms, axis=0)
        self.bvec = np.zeros((num_arms, 2))
        self.scale = 0.0
        # per arm, the factor of its sampling covariance v²A⁻¹ (mvn_factor), until the arm's A changes
        self._factors: list[np.ndarray | None] = [None] * num_arms

    def features(self, batch: int) -> np.ndarray:
        return np.array([1.0, batch / self.max_batch])

    def select(self, batch: int, rng: np.random.Generator, switch_cost: np.ndarray) -> tuple[int, bool]:
        x = self.features(batch)
        theta = np.einsum("aij,aj->ai", self.a_inv, self.bvec)
        if self.thompson:
            draws = np.array([mvn_draw(rng, theta[a], self._factor(a)) for a in range(self.num_arms)])
            score = draws @ x
        else:
            width = np.sqrt(np.einsum("i,aij,j->a", x, self.a_inv, x))
            score = theta @ x + self.alpha * width
        return int(np.argmax(score)), False

    def _factor(self, arm: int) -> np.ndarray:
        f = self._factors[arm]
        if f is None:
            f = self._factors[arm] = mvn_factor(self.v ** 2 * self.a_inv[arm])
        return f

    def update(self, batch: int, arm: int, reward: float) -> None:
        self.scale = max(self.scale, reward)
        r = reward / self.scale if self.scale > 0 else 0.0
        x = self.features(batch)
        ai = self.a_inv[arm]
        ax = ai @ x
        self.a_inv[arm] = ai - np.outer(ax, ax) / (1.0 + x @ ax)  # Sherman-Morrison
        self._factors[arm] = None
        self.bvec[arm] += r * x


def mvn_factor(cov: np.ndarray) -> np.ndarray:
    """``Generator.multivariate_normal``'s factor A of ``cov`` (its defaults: SVD, ``check_valid='warn'``,
    ``tol=1e-8``): a draw is ``mean + x @ A.T``. Computed once per covariance instead of at every draw (the SVD and
    its check were 70 % of a linear-Thompson step); :func:`mvn_draw` then gives the same values bit for bit."""
    cov = np.array(cov).astype(np.double)
    u, s, vh = np.linalg.svd(cov)
    back = np.dot(vh.T * s, vh)
    tol = 1e-8  # np.allclose(back, cov, rtol=tol, atol=tol), element by element (a handful of them)
    if not all((abs(x - y) <= tol + tol * abs(y) and math.isfinite(y)) or x == y
               for x, y in zip(back.ravel().tolist(), cov.ravel().tolist(), strict=True)):
        warnings.warn("covariance is not symmetric positive-semidefinite.", RuntimeWarning, stacklevel=2)
    return u * np.sqrt(s)


def mvn_draw(rng: np.random.Generator, mean: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """``rng.multivariate_normal(mean, cov)`` given ``cov``'s :func:`mvn_factor`: the same draws of ``rng``, the same
    arithmetic (NumPy 2's ``_generator.pyx``)."""
    d = mean.shape[0]
    x = rng.standard_normal([d]).reshape(-1, d)
    x = np.array(mean) + x @ factor.T
    x.shape = (d,)
    return x


AUTHORS_BINS = 12  # the fork's context bins: two batch sizes each, every batch of 23 or more in the last


def authors_bin(batch: int) -> int:
    """The fork's context of a batch size: ``min((B − 1) // 2, 11)``."""
    return min((batch - 1) // 2, AUTHORS_BINS - 1)


@dataclass
class AuthorsBin(BinGreedy):
    """One context of the authors' selector: Algorithm 1's block/bin/round schedule.

    Explores γ ≥ 1 only (γ = 0 has prior weight 0). Exploits (Eq. 3) Bayesian-smoothed means: prior strength 1,
    shrunk towards the context's mean reward, times the arm's prior weight.
    """

    sums: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sums = np.zeros(self.num_arms)
        self.weight = np.ones(self.num_arms)
        self.weight[0] = 0.0

    def select(self, rng: np.random.Generator, switch_cost: np.ndarray) -> tuple[int, bool]:
        if self.tau == 1:
            self.explore = bool(rng.random() < self.explore_prob)
        if self.explore:
            return 1 + int(rng.integers(self.num_arms - 1)), True
        # NumPy's expression (sums + weight·prior) / (visits + 1) element by element in Python floats (the same
        # operations on a handful of arms; NumPy's per-call cost would dominate), the sum of rewards NumPy's own
        sums, visits = self.sums.tolist(), self.visits.tolist()
        total = sum(visits)
        prior = float(self.sums.sum()) / total if total else 0.0
        smoothed = [(x + w * prior) / (v + 1.0) for x, w, v in zip(sums, self.weight.tolist(), visits, strict=True)]
        return _eq3(smoothed, switch_cost.tolist()), False

    def update(self, arm: int, reward: float) -> None:
        self.sums[arm] += reward
        super().update(arm, reward)


class AuthorsSelector:
    """The authors' arm selector: an :class:`AuthorsBin` per context bin (:func:`authors_bin`) plus an off rule.

    Read from ``ADABinGreedy`` in lihuahua123/vllm_speculative, ``vllm/core/spec_scheduler.py``. Off rule: above
    ``off_batch`` requests with more than ``off_rate`` arrivals per second, γ = 0 and nothing is explored or learned.
    """

    def __init__(self, num_arms: int, off_batch: int = 20, off_rate: float = 2.0) -> None:
        self.num_arms, self.off_batch, self.off_rate = num_arms, off_batch, off_rate
        self.state: dict[int, AuthorsBin] = {}
        self.rate = 0.0  # arrivals per second, set by the policy before each choice

    def of(self, batch: int) -> AuthorsBin:
        key = authors_bin(batch)
        st = self.state.get(key)
        if st is None:
            st = self.state[key] = AuthorsBin(self.num_arms)
        return st

    def off(self, batch: int) -> bool:
        return batch > self.off_batch and self.rate > self.off_rate

    def select(self, batch: int, rng: np.random.Generator, switch_cost: np.ndarray) -> tuple[int, bool]:
        if self.off(batch):
            return 0, False
        return self.of(batch).select(rng, switch_cost)

    def update(self, batch: int, arm: int, reward: float) -> None:
        if not self.off(batch):
            self.of(batch).update(arm, reward)


def make_selector(kind: Selector, num_arms: int, max_batch: int) -> ArmSelector:
    if kind == "authors":
        return AuthorsSelector(num_arms)
    if kind == "adabingreedy":
        return AdaBinGreedy(num_arms)
    if kind == "adabingreedy_pow2":
        return AdaBinGreedy(num_arms, pow2=True)
    if kind == "adabingreedy_nocontext":
        return AdaBinGreedy(num_arms, contextual=False)
    if kind == "linucb":
        return LinearBandit(num_arms, max_batch, thompson=False)
    if kind == "lints":
        return LinearBandit(num_arms, max_batch, thompson=True)
    raise ValueError(f"selector must be adabingreedy | adabingreedy_pow2 | adabingreedy_nocontext | linucb | lints | "
                     f"authors, not {kind!r}")


# --- c_prefill (§4.2, Table 3) --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrefillCostTable:
    """c_prefill(L_max, B) on a grid, profiled offline: T_SD − T_base of a prefill of B requests × L tokens."""

    lengths: np.ndarray
    batches: np.ndarray
    cost_s: np.ndarray  # [len(lengths), len(batches)]

    def __call__(self, l_max: int, batch: int) -> float:
        if l_max <= 0 or batch <= 0:
            return 0.0
        i = min(int(np.searchsorted(self.lengths, l_max)), self.lengths.size - 1)
        j = min(int(np.searchsorted(self.batches, batch)), self.batches.size - 1)
        return float(self.cost_s[i, j])


def prefill_cost(cost: CostModel, tokens: int, batch: int, *, speculative: bool) -> float:
    """One prefill step of ``batch`` prompts of ``tokens`` each: the target's pass, plus (``speculative``) the
    draft's pass over the same tokens, as the engine charges a prefill step that keeps the draft in sync."""
    n = tokens * batch
    pairs = batch * tokens * (tokens + 1) / 2.0
    t = cost.forward_s(n, batch, 0.0, pairs, batch, False)
    if speculative:
        t += cost.forward_s(n, batch, 0.0, pairs, batch, False, which="draft")
    return t


def profile_c_prefill(cost: CostModel, max_len: int, max_batch: int) -> PrefillCostTable:
    lengths = [1]
    while lengths[-1] < max_len:
        lengths.append(lengths[-1] * 2)
    batches = [1]
    while batches[-1] < max_batch:
        batches.append(batches[-1] * 2)
    table = np.array([[prefill_cost(cost, l, b, speculative=True) - prefill_cost(cost, l, b, speculative=False)
                       for b in batches] for l in lengths])
    return PrefillCostTable(np.array(lengths), np.array(batches), table)


# --- §5 elastic memory ----------------------------------------------------------------------------------------------


@dataclass
class ElasticMemory:
    """§5.1's elastic-memory triggers (thresholds in KV blocks).

    - Expand the KV pool (offload the draft): speculation off and fewer than ``tau_low`` blocks free for ``persist``
      consecutive steps.
    - Contract it (reload the draft): nothing waits and more than S_draft + τ_low blocks are free.
    """

    tau_low: int
    s_draft: int
    persist: int = 5
    low_steps: int = 0

    def action(self, view: View, spec_off: bool) -> MemoryAction | None:
        free = view.free_blocks
        if view.draft_resident:
            self.low_steps = self.low_steps + 1 if free < self.tau_low else 0
            if spec_off and self.low_steps >= self.persist:
                self.low_steps = 0
                return MemoryAction(offload_draft=True)
            return None
        self.low_steps = 0
        if not view.draft_loading and view.waiting.size == 0 and free > self.s_draft + self.tau_low:
            return MemoryAction(reload_draft=True)
        return None


# --- the system -----------------------------------------------------------------------------------------------------


class Nightjar(Policy):
    uses_draft_model = True

    def __init__(self, max_gamma: int = 5, selector: Selector = "adabingreedy", switch_cost: bool = True,
                 offload: bool = False, tau_low: float = 0.10, t_persist: int = 5, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 4096, watermark: float = 0.01, warmup_passes: int = 0,
                 rate_window_s: float = 10.0) -> None:
        self.max_gamma = check_positive_int("max_gamma", max_gamma)
        self.num_arms = max_gamma + 1
        self.selector_kind: Selector = selector
        make_selector(selector, self.num_arms, max_num_seqs)  # checks the name early
        self.use_switch_cost = switch_cost
        self.offload = offload
        if not 0.0 <= tau_low < 1.0:
            raise ValueError(f"tau_low must be a fraction of the KV pool in [0, 1), not {tau_low!r}")
        self.tau_low = tau_low
        self.t_persist = check_positive_int("t_persist", t_persist)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = watermark
        if not (isinstance(warmup_passes, int) and warmup_passes >= 0):
            raise ValueError(f"warmup_passes must be a non-negative integer, not {warmup_passes!r}")
        self.warmup_passes = warmup_passes
        if not rate_window_s > 0:
            raise ValueError(f"rate_window_s must be > 0, not {rate_window_s!r}")
        self.rate_window_s = rate_window_s
        self.prev_gamma = 0  # γ of the last decode step
        self._played: tuple[int, int] | None = None  # (batch size, γ) of the step awaiting its reward
        self.selector: ArmSelector | None = None

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        cost = ctx.cost
        if cost.draft is None:
            raise ValueError("nightjar needs a draft model (model pair with a draft)")
        if self.selector is None or not self.warmup_passes:  # a warm-up hands the selector on to the next pass
            self.selector = make_selector(self.selector_kind, self.num_arms, self.max_num_seqs)
        self.prev_gamma, self._played = 0, None
        self._sorted_arrivals: bool | None = None
        self.c_prefill = cost.remember(("nightjar.c_prefill", 4096, self.max_num_seqs),
                                       lambda: profile_c_prefill(cost, 4096, self.max_num_seqs))
        self.memory: ElasticMemory | None = None
        if self.offload:
            with_draft = cost.kv_capacity_blocks(draft_resident=True)
            without = cost.kv_capacity_blocks(draft_resident=False)
            self.memory = ElasticMemory(tau_low=round(self.tau_low * with_draft), s_draft=without - with_draft,
                                        persist=self.t_persist)

    def schedule(self, view: View) -> StepPlan:
        self._played = None
        mem = self.memory.action(view, self.prev_gamma == 0) if self.memory is not None else None
        plan = self._plan(view, mem)
        if self.memory is None or (plan.is_idle and mem is None):
            return plan
        # the step trace tells the elastic-memory operations apart (Table 6): 1 = expansion, 2 = contraction
        op = 0.0 if mem is None else 1.0 if mem.offload_draft else 2.0
        return replace(plan, telemetry={**(plan.telemetry or {}), "memory_op": op})

    def _plan(self, view: View, mem: MemoryAction | None) -> StepPlan:
        resident = view.draft_resident and not (mem is not None and mem.offload_draft)
        adm, decode, preempt = prefill_prioritized(
            view, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            watermark=self.watermark, lookahead=self.prev_gamma if resident else 0)
        if adm.rids.size:
            return StepPlan(prefill_ids=adm.rids, prefill_tokens=adm.tokens, memory=mem,
                            draft_sync=resident and self.prev_gamma > 0)
        if decode.size == 0 and preempt.size == 0:
            return StepPlan(memory=mem) if mem is not None else IDLE
        if not resident or decode.size == 0:
            self.prev_gamma = 0
            return StepPlan(decode_ids=decode, preempt_ids=preempt, memory=mem, telemetry={"gamma": 0.0})
        batch = int(decode.size)
        if isinstance(self.selector, AuthorsSelector):
            self.selector.rate = self._arrival_rate(view)
            if self.selector.off(batch):  # the authors' hard rule: no speculation, nothing explored or learned
                self.prev_gamma = 0
                return StepPlan(decode_ids=decode, preempt_ids=preempt, memory=mem,
                                telemetry={"gamma": 0.0, "explore": 0.0})
        c = 0.0
        if self.use_switch_cost and self.prev_gamma == 0:  # Eq. 3's switching term applies after a γ = 0 step only
            lag = view.num_computed[decode] - view.num_draft_computed[decode]
            c = self.c_prefill(int(lag.max()), batch)
        assert self.selector is not None  # made in bind
        gamma, explored = self.selector.select(batch, self.ctx.rng, switch_costs(self.num_arms, self.prev_gamma, c))
        gamma = self._fits(view, decode, preempt, gamma)
        self.prev_gamma = gamma
        self._played = (batch, gamma)
        return StepPlan(decode_ids=decode, k=np.full(batch, gamma, dtype=np.int64), preempt_ids=preempt,
                        memory=mem, telemetry={"gamma": float(gamma), "explore": float(explored)})

    def _fits(self, view: View, decode: np.ndarray, preempt: np.ndarray, gamma: int) -> int:
        """``gamma`` capped at the largest γ whose KV slots fit once the preempted requests' blocks are freed.

        The batch scheduler kept ``decode`` with 1 + ``prev_gamma`` slots each within those blocks, and the blocks
        needed grow with γ: a γ up to ``prev_gamma`` fits, a larger one steps down to the largest that fits."""
        if gamma <= self.prev_gamma:
            return gamma
        free = view.free_blocks + (int(view.kv_blocks[preempt].sum()) if preempt.size else 0)
        while gamma > self.prev_gamma and int(view.blocks_for(decode, 1 + gamma).sum()) > free:
            gamma -= 1
        return gamma

    def _arrival_rate(self, view: View) -> float:
        """Requests that arrived in the last ``rate_window_s`` seconds, per second (the hard rule's load)."""
        arrivals, now = view.arrival_s, view.now
        if self._sorted_arrivals is None:
            self._sorted_arrivals = bool(np.all(np.diff(arrivals) >= 0))
        if self._sorted_arrivals:  # (a closed loop writes arrival times as it sends: read them each time)
            seen = int(arrivals.searchsorted(now, side="right")
                       - arrivals.searchsorted(now - self.rate_window_s, side="right"))
        else:
            seen = int(np.count_nonzero((arrivals <= now) & (arrivals > now - self.rate_window_s)))
        return seen / self.rate_window_s

    def observe(self, result: StepResult) -> None:
        if self._played is None or result.latency_s <= 0 or self.selector is None:
            return
        batch, gamma = self._played
        goodput = float(result.num_emitted.sum()) / result.latency_s
        if isinstance(self.selector, AuthorsSelector):  # the authors' reward: the per-request goodput
            goodput /= batch
        self.selector.update(batch, gamma, goodput)
