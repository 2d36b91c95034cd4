"""TurboSpec: closed-loop speculation control that maximizes serving goodput.

Liu et al., "TurboSpec: Closed-loop Speculation Control System for Optimizing LLM Serving Goodput" (earlier title:
"Optimizing Speculative Decoding for Serving Large Language Models Using Goodput"), arXiv:2406.14066. Implemented:
- §4.1 goodput (Eq. 1) and its estimate: batch latency (Eq. 2) from the offline profiler's linear model (Eq. 3),
  generated length from a moving-average acceptance rate (Eq. 4);
- §4.2 Listing 1 (one generation step, with prefill disabling above a learned batch-size threshold and its periodic
  reset) and Listing 2 (ArgMaxGoodput with the out-of-memory guard);
- §4.1.1 prompt lookup: fixed proposal length, verification length chosen by goodput;
- §5.2 offline profiler and online adaptor.

Each iteration (Listing 1):
  line 2     batch = vLLM's prefill-prioritized scheduler (FCFS, recompute preemption);
  lines 3–9  prefill step: the proposer prefills alongside the target unless the batch is larger than the learned
             ``disable_batch_size``; those requests never speculate (no proposer KV); every ``reset_steps``-th
             skipped prefill resets the threshold to ∞;
  lines 10–13 proposed length = ArgMaxGoodput (draft/EAGLE) or FIXED_PROPOSED_LEN (PLD); 0 → normal decode and
             ``disable_batch_size = len(batch)``;
  lines 14–18 propose, verify ``verification_len`` tokens (ArgMaxGoodput for PLD, = proposed otherwise), accept,
             update the moving-average acceptance rate (``observe``).

Deviations:
- Engine: vLLM v0 (``conf/engine/vllm_v0.yaml``, the paper's base): batch-expansion scoring, a draft model's KV split
  as v0 splits it (the draft on the driver GPU, blocks split evenly), no speculation in steps with prefill; the
  profiler times target passes as that engine runs them. The paper is ambiguous: §5.3 describes a multi-query
  verification pass with piecewise CUDA graphs, and Eq. 3 charges each context token's KV once, which fits batch
  expansion only within 79 % (multi-query: 3-8 %; tests/systems/test_turbospec.py), so on vllm_v0 the controller's
  latency model is off at long contexts. vllm_v0 is chosen because Fig. 2's 1.70x step and the switch-off of
  Figs. 9-10 and the tables need it (docs/calibration.md); ``engine=turbospec_mq`` runs the other reading.
- Eq. 3 is fitted piecewise, one (α, γ, δ) per half-octave bucket of N_batched (BUCKET_EDGES): our linear layers
  bend at the roofline knee (docs/design.md, "Cost model"), which one plane misses by up to 25 % between batch 1
  and 2k tokens; per bucket the fit is within a few percent. ``LatencyFit`` with one bucket is the paper's plane.
- Acceptance rate: accepted / tested tokens, tested = accepted + 1 per chain that stopped before its end (Eq. 4's
  maximum-likelihood per-token α; accepted / proposed under-estimates α for k > 1 and feeds back into shorter k).
  Token-weighted over the most recent speculating steps holding ``window`` tested tokens, so its precision does not
  depend on batch size (the paper's "weighted average" gives no weights). ``init_acceptance`` fills the window until
  then, so a few unlucky first chains cannot switch speculation off. One global α (UpdateGlobalAcceptance), one k
  per step for every speculating request.
- Listing 2 loops k = 1..MAX_LEN (best_k = 0 only on OOM); we also evaluate k = 0 (no proposer, no per-round cost),
  which is how Listing 1 line 11 can ever see 0.
- Listing 1 line 4 reads ``True if method == 'PLD' else False``; we read it inverted: PLD has no proposer state, so
  it never skips the proposer prefill. ``len(batch)`` of a prefill step is the batch the prompts join (running +
  admitted), what ``disable_batch_size`` was learned from. The threshold is learned only when some request could
  speculate.
- Lookahead slots: vLLM reserves ``num_speculative_tokens`` per decode; with a varying k we reserve the previous
  step's k (0 after a plain step). Reserving none filled the KV cache under offline load, so the OOM guard forced
  k = 0, set ``disable_batch_size`` and stopped most later requests speculating (L40S offline 1.30x vs 2.18x for
  static k); reserving MAX_LEN costs 12-14 % throughput at acceptance 0.5-0.7 on the L40S.
- Proposer KV is not synced in non-speculating decode steps (``draft_sync`` only on proposer prefills); a lagging
  request catches up (a draft prefill the engine charges) when it next speculates.
- PLD: the engine finds the prompt match inside the step, so the policy cannot see which requests matched before
  choosing the verification length (Fig. 4). ``plan.k`` carries v ≤ FIXED_PROPOSED_LEN for every request (the
  oracle proposes min(v, match)); goodput uses the observed match rate m (Eq. 4 becomes 1 + m·(l(α, v) − 1) per
  request) and the observed fraction of requested slots the engine scores. v = 0 skips the lookup (the paper always
  pays it).
- Probing (ours): after ``probe_steps`` consecutive decode steps without speculation, one step speculates with the
  best k ≥ 1 so the moving average sees the current acceptance (and PLD's match rate); otherwise an estimate below
  break-even would freeze. The paper's PLD always looks up, so it keeps observing; model proposers have only the
  periodic reset, which re-enables proposer prefills but cannot refresh α. ``probe_steps: 0`` turns probing off.
- MAX_LEN, FIXED_PROPOSED_LEN, RESETSTEPS, the window and the initial α are not in the paper; conf/system/turbospec.yaml
  says where each default comes from.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from repro.core import jit
from repro.cost.model import CostModel, Which
from repro.cost.step import decode_pass_s
from repro.sim.plan import IDLE, ProposerName, StepPlan, StepResult
from repro.sim.policy import Policy, PolicyContext
from repro.sim.state import View
from systems.lib import expected_accepted, prefill_prioritized

# N_batched bucket edges of the piecewise fit (upper bounds, tokens per forward)
BUCKET_EDGES = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
PROFILE_CONTEXTS = (32, 128, 512, 1024, 2048, 4096)


# --- offline profiler (§4.1.3 Eq. 3, §5.2) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencyFit:
    """Eq. (3): T_fwd = α·N_context + γ·N_batched + δ, one coefficient triple per bucket of N_batched.

    ``edges[i]`` is the largest N_batched of bucket i (the last bucket also takes anything larger).
    """

    edges: np.ndarray
    alpha: np.ndarray
    gamma: np.ndarray
    delta: np.ndarray
    _lower: list[float] = field(init=False, repr=False, compare=False)  # edges but the last, for bisect
    _coef: list[tuple[float, float, float]] = field(init=False, repr=False, compare=False)  # (α, γ, δ) per bucket

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lower", self.edges[:-1].tolist())
        object.__setattr__(self, "_coef", list(zip(self.alpha.tolist(), self.gamma.tolist(), self.delta.tolist(),
                                                   strict=True)))

    def __call__(self, n_context: np.ndarray | float, n_batched: np.ndarray | float) -> np.ndarray:
        b = np.minimum(np.searchsorted(self.edges, n_batched), self.edges.size - 1)
        return self.alpha[b] * np.asarray(n_context) + self.gamma[b] * np.asarray(n_batched) + self.delta[b]

    def at(self, n_context: float, n_batched: Iterable[float]) -> list[float]:
        """``self(n_context, n_batched)`` in Python floats: the same operations, so the same values, at a fraction
        of numpy's per-call cost for the few points the controller evaluates per step."""
        out = []
        for n in n_batched:
            a, g, d = self._coef[bisect_left(self._lower, n)]  # = min(searchsorted(edges), the last bucket)
            out.append(a * n_context + g * n + d)
        return out


def fit_linear(n_context: np.ndarray, n_batched: np.ndarray, latency_s: np.ndarray,
               edges: tuple[int, ...] = BUCKET_EDGES) -> LatencyFit:
    """Least squares of Eq. (3) in each N_batched bucket (buckets without enough samples borrow a neighbour's)."""
    e = np.asarray(edges, dtype=np.float64)
    bucket = np.minimum(np.searchsorted(e, n_batched), e.size - 1)
    coef = np.full((e.size, 3), np.nan)
    for i in range(e.size):
        m = bucket == i
        if np.count_nonzero(m) < 4:
            continue
        x = np.column_stack([n_context[m], n_batched[m], np.ones(np.count_nonzero(m))])
        coef[i] = np.linalg.lstsq(x, latency_s[m], rcond=None)[0]
    have = np.nonzero(~np.isnan(coef[:, 0]))[0]
    if have.size == 0:
        raise ValueError("profiling produced no bucket with enough samples")
    for i in range(e.size):  # empty bucket: the nearest fitted one
        if np.isnan(coef[i, 0]):
            coef[i] = coef[have[np.abs(have - i).argmin()]]
    return LatencyFit(e, coef[:, 0].copy(), coef[:, 1].copy(), coef[:, 2].copy())


def profile_forward(cost: CostModel, which: Which, max_len: int, max_batch: int) -> LatencyFit:
    """Fit Eq. (3) to ``which``'s passes sampled over batch sizes, contexts and proposal lengths (offline profile).

    N_batched = batch·(k+1) for the target, batch for a proposer pass. A target pass is charged as the engine runs it
    (:func:`repro.cost.step.decode_pass_s`: batch expansion and host-side speculation costs included).
    """
    ks = range(max_len + 1) if which == "target" else (0,)
    batches = np.unique(np.geomspace(1, max_batch, 48).round().astype(int)).tolist()
    rows = []
    for b in batches:
        for c in PROFILE_CONTEXTS:
            for k in ks:
                n = b * (k + 1)
                if which == "target":
                    t = decode_pass_s(cost, b, c, k)
                else:
                    t = cost.forward_s(n, b, kv_read_tokens=b * c + n, lm_head_tokens=n, decode_only=True,
                                       which=which)
                rows.append((b * c, n, t))
    r = np.asarray(rows, dtype=np.float64)
    return fit_linear(r[:, 0], r[:, 1], r[:, 2])


@dataclass(frozen=True, slots=True)
class StepLatencyModel:
    """Eq. (2): T_batch = T_draft + T_target, from the profiled fits.

    Draft model / EAGLE: T_draft = round_s + k·T_fwd(proposer) (k sequential passes, §4.1.3); prompt lookup:
    T_draft = pld_fixed_s + pld_per_seq_s·num_spec (directly profiled, independent of k).
    """

    proposer: ProposerName
    target: LatencyFit
    drafter: LatencyFit | None
    round_s: float
    pld_fixed_s: float
    pld_per_seq_s: float

    def step_s(self, k: np.ndarray, batch: int, num_spec: int, context: float, verify_frac: float = 1.0
               ) -> np.ndarray:
        """Predicted step latency for each proposal length in ``k`` (``num_spec`` of ``batch`` requests
        speculate; ``context`` = Σ cached tokens of the batch)."""
        k = np.asarray(k, dtype=np.float64)
        t = self.target(context, batch + num_spec * verify_frac * k)
        spec = (k > 0) & (num_spec > 0)
        if self.proposer == "pld":
            draft = np.where(spec, self.pld_fixed_s + self.pld_per_seq_s * num_spec, 0.0)
        else:
            assert self.drafter is not None
            ctx_spec = context * num_spec / max(batch, 1)
            draft = np.where(spec, self.round_s + k * self.drafter(ctx_spec, num_spec), 0.0)
        return t + draft

    def step_times(self, max_len: int, batch: int, num_spec: int, context: float, verify_frac: float = 1.0
                   ) -> list[float]:
        """``step_s(arange(max_len + 1), ...)`` as a list of Python floats (the same operations in the same order,
        so the same values)."""
        per_k = num_spec * verify_frac
        t = self.target.at(context, [batch + per_k * k for k in range(max_len + 1)])
        if num_spec <= 0:
            return t
        if self.proposer == "pld":
            pld = self.pld_fixed_s + self.pld_per_seq_s * num_spec
            return t[:1] + [x + pld for x in t[1:]]
        assert self.drafter is not None
        d = self.drafter.at(context * num_spec / max(batch, 1), (num_spec,))[0]
        return t[:1] + [t[k] + (self.round_s + k * d) for k in range(1, max_len + 1)]


def profile(cost: CostModel, proposer: ProposerName, max_len: int, max_batch: int) -> StepLatencyModel:
    """The offline profiler (§5.2): fit the target and the proposer, time the per-round and PLD costs."""
    drafter = None if proposer == "pld" else profile_forward(cost, proposer, max_len, max_batch)
    p0, p1 = cost.pld_s(0), cost.pld_s(1)
    return StepLatencyModel(proposer, profile_forward(cost, "target", max_len, max_batch), drafter,
                            cost.spec_round_s(), p0, p1 - p0)


# --- online adaptor (§4.1.3 Eq. 4, Listing 2) -------------------------------------------------------------------


def expected_generated(alpha: float, max_len: int, batch: int, num_spec: int, match_rate: float = 1.0
                       ) -> list[float]:
    """Eq. (4) summed over the batch, for each k = 0..max_len: non-speculating requests generate 1 token,
    speculating ones 1 + m·(l(α, k) − 1) with l(α, k) = (1 − α^(k+1))/(1 − α) and m the fraction that find a
    proposal. Python floats past the power (a few points per step: numpy's per-call cost would dominate)."""
    return [(batch - num_spec) + num_spec * (1.0 + match_rate * (acc - 1.0))
            for acc in expected_accepted(alpha, np.arange(max_len + 1)).tolist()]


def kv_blocks_needed(num_computed: np.ndarray, kv_blocks: np.ndarray, spec: np.ndarray, block_size: int,
                     max_len: int) -> np.ndarray:
    """Extra KV blocks a decode step needs for each k = 0..max_len.

    1 + k slots per speculating request, 1 per other, given each request's computed tokens and allocated blocks.
    """
    k = np.arange(max_len + 1)[:, None]
    # ⌈(computed + 1 + k·spec) / block⌉ = (computed + block + k·spec) // block: the constants added before broadcasting
    need = (num_computed + block_size + k * spec) // block_size - kv_blocks
    return np.maximum(need, 0).sum(axis=1)


def kv_blocks_needed_at(num_computed: np.ndarray, kv_blocks: np.ndarray, spec: np.ndarray, block_size: int,
                        k: int) -> int:
    """``kv_blocks_needed(...)[k]``: the extra KV blocks of one proposal length."""
    need = (num_computed + block_size + k * spec) // block_size - kv_blocks
    return int(np.maximum(need, 0).sum())


def argmax_goodput(alpha: float, batch: int, context: float, fit: StepLatencyModel, max_len: int,
                   free_blocks: int | None = None, blocks_needed: np.ndarray | None = None, *,
                   num_spec: int | None = None, match_rate: float = 1.0, verify_frac: float = 1.0,
                   min_k: int = 0) -> int:
    """Listing 2: the k in min_k..max_len maximizing goodput (Eq. 1, 2, 4); 0 if none fits.

    Goodput = expected generated tokens / predicted step time. A k whose KV slots do not fit
    (``blocks_needed[k] > free_blocks``) is skipped.
    """
    ns = batch if num_spec is None else num_spec
    # in Python floats (max_len + 1 points: numpy's per-call cost would dominate), with the operations of the array
    # form in its order, so the same values and choice (tests/systems/test_turbospec.py holds it to that form)
    gen = expected_generated(alpha, max_len, batch, ns, match_rate)
    step = fit.step_times(max_len, batch, ns, context, verify_frac)
    need = None if free_blocks is None or blocks_needed is None else np.asarray(blocks_needed).tolist()
    best, best_g = 0, -math.inf
    for k in range(min_k, max_len + 1):
        if need is not None and need[k] > free_blocks:  # line 5: OOM guard
            continue
        g = gen[k] / step[k] if step[k] else math.inf  # numpy's x / 0 for x ≥ 1 generated token
        if not g < math.inf:  # NaN or +inf: numpy's argmax would pick it, and it is not finite
            return 0
        if g > best_g:  # ties → the smallest k
            best, best_g = k, g
    return best


class AcceptanceTracker:
    """Moving averages of acceptance α, match rate m and scored-slot fraction over the last ``window`` tested tokens.

    α = accepted / tested tokens; m = requests that got a proposal / requests asked to propose; the third is the
    fraction of requested verification slots the engine scored. Until ``window`` tokens (requests, for m) are seen,
    the prior (``init_acceptance``; m = 1) fills the window.
    """

    def __init__(self, window: int, init_acceptance: float) -> None:
        if window < 1 or not 0.0 <= init_acceptance < 1.0:
            raise ValueError("window must be >= 1 and init_acceptance in [0, 1)")
        self.window = window
        self.init_acceptance = init_acceptance
        # per step and summed, as Python ints (six numbers a step): accepted, tested, matched, asked, scored, planned
        self._steps: deque[tuple[int, int, int, int, int, int]] = deque()
        self._sum = [0] * 6

    def update(self, k: np.ndarray, num_proposed: np.ndarray, num_accepted: np.ndarray, scored: int) -> None:
        if jit.step_kernels():  # the same counts, compiled (systems.kernels.acceptance_counts)
            num_asked, accepted, rejected, got, k_sum = jit.kernel("systems.kernels", "acceptance_counts")(
                k, num_proposed, num_accepted)
            if num_asked:
                self._add((accepted, accepted + rejected, got, num_asked, int(scored), k_sum))
            return
        asked = k > 0
        num_asked = int(np.count_nonzero(asked))
        if not num_asked:
            return
        accepted = int(num_accepted.sum())
        tested = accepted + int(np.count_nonzero(num_accepted < num_proposed))  # the first rejection ends the chain
        proposed = num_proposed if num_asked == k.size else num_proposed[asked]
        self._add((accepted, tested, int(np.count_nonzero(proposed > 0)), num_asked, int(scored), int(k.sum())))

    def _add(self, row: tuple[int, int, int, int, int, int]) -> None:
        self._steps.append(row)
        self._sum = [t + x for t, x in zip(self._sum, row, strict=True)]
        # drop the oldest steps while the rest still hold a full window (at most ``window`` steps)
        while len(self._steps) > self.window or (
                len(self._steps) > 1 and self._sum[1] - self._steps[0][1] >= self.window):
            self._sum = [t - x for t, x in zip(self._sum, self._steps.popleft(), strict=True)]

    @staticmethod
    def _filled(hits: int, n: int, prior: float, window: int) -> float:
        return (hits + prior * max(window - n, 0)) / max(n, window)

    @property
    def alpha(self) -> float:
        return self._filled(self._sum[0], self._sum[1], self.init_acceptance, self.window)

    @property
    def match_rate(self) -> float:
        return self._filled(self._sum[2], self._sum[3], 1.0, self.window)

    @property
    def verify_frac(self) -> float:
        return self._sum[4] / self._sum[5] if self._sum[5] else 1.0


# --- the system (Listing 1) ---------------------------------------------------------------------------------------


class TurboSpec(Policy):

    def __init__(self, proposer: ProposerName = "draft", max_len: int = 7, window: int = 256,
                 init_acceptance: float = 0.7, pld_proposed_len: int = 10, prefill_disabling: bool = True,
                 reset_steps: int = 20, probe_steps: int = 50, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 4096, watermark: float = 0.01) -> None:
        if proposer not in ("draft", "eagle", "pld"):
            raise ValueError(f"proposer must be draft | eagle | pld, got {proposer!r}")
        if max_len < 1 or pld_proposed_len < 1 or reset_steps < 1 or probe_steps < 0:
            raise ValueError("max_len, pld_proposed_len and reset_steps must be >= 1, probe_steps >= 0")
        self.proposer: ProposerName = proposer
        self.max_len = max_len
        self.pld_proposed_len = pld_proposed_len
        self.prefill_disabling = prefill_disabling
        self.reset_steps = reset_steps
        self.probe_steps = probe_steps
        self._plain_steps = 0  # consecutive decode steps that could have speculated but did not
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = watermark
        self.uses_draft_model = proposer == "draft"
        self.acceptance = AcceptanceTracker(window, init_acceptance)
        self.disable_batch_size = float("inf")
        self.skip_cnt = 0
        self.no_proposer: set[int] = set()  # requests whose proposer prefill was skipped: never speculate
        self._last_k: np.ndarray | None = None
        self._lookahead = 0  # KV slots per decode the batch scheduler reserves: the last step's proposed length

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        # offline profiler (§5.2): coefficients inspectable as self.latency.target.alpha etc.
        self.latency = ctx.cost.remember(("turbospec.profile", self.proposer, self.max_len, self.max_num_seqs),
                                         lambda: profile(ctx.cost, self.proposer, self.max_len, self.max_num_seqs))

    def schedule(self, view: View) -> StepPlan:
        # line 2: vLLM's batch scheduler, reserving the last proposed length as lookahead slots (the OOM guard
        # then checks the slots of every candidate k)
        adm, decode, preempt = prefill_prioritized(
            view, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            watermark=self.watermark, lookahead=self._lookahead)
        self._last_k = None
        if adm.rids.size:  # lines 3–9: prefill, with or without the proposer's prefill
            run_proposer_prefill = self.proposer != "pld"
            if self.prefill_disabling and run_proposer_prefill \
                    and view.running.size + adm.rids.size > self.disable_batch_size:
                self.skip_cnt += 1
                run_proposer_prefill = False
                self.no_proposer.update(adm.rids.tolist())
                if self.skip_cnt % self.reset_steps == 0:
                    self.disable_batch_size = float("inf")
            else:
                self.no_proposer.difference_update(adm.rids.tolist())
            return StepPlan(prefill_ids=adm.rids, prefill_tokens=adm.tokens, proposer=self.proposer,
                            draft_sync=run_proposer_prefill and self.proposer == "draft")
        if decode.size == 0 and preempt.size == 0:
            return IDLE
        spec = np.fromiter((r not in self.no_proposer for r in decode.tolist()), dtype=bool, count=decode.size) \
            if self.no_proposer else np.ones(decode.size, dtype=bool)
        num_spec = int(np.count_nonzero(spec))
        probe = 0 < self.probe_steps <= self._plain_steps and num_spec > 0
        k = self._goodput_k(view, decode, spec, num_spec, preempt, min_k=1 if probe else 0)  # lines 10 and 15
        self._plain_steps = self._plain_steps + 1 if k == 0 and num_spec else 0
        self._lookahead = k
        if k == 0:  # lines 11–13: normal decode; remember the batch size at which speculation stopped paying
            if num_spec and self.proposer != "pld":  # PLD's proposal length is fixed, never 0 (line 26)
                self.disable_batch_size = decode.size
            return StepPlan(decode_ids=decode, preempt_ids=preempt, proposer=self.proposer)
        ks = np.where(spec, k, 0).astype(np.int64)  # lines 14–16: propose and score
        self._last_k = ks
        return StepPlan(decode_ids=decode, k=ks, proposer=self.proposer, preempt_ids=preempt)

    def _goodput_k(self, view: View, decode: np.ndarray, spec: np.ndarray, num_spec: int, preempt: np.ndarray,
                   min_k: int = 0) -> int:
        """GetProposedLen / GetVerificationLen: ArgMaxGoodput for draft and EAGLE proposals (``num_spec`` of the
        ``decode`` requests, those of ``spec``, speculate).

        For PLD the proposal is FIXED_PROPOSED_LEN and ArgMaxGoodput picks the verification length (≤ the proposal).
        """
        if decode.size == 0 or not num_spec:
            return 0
        max_len = min(self.max_len, self.pld_proposed_len) if self.proposer == "pld" else self.max_len
        free = view.free_blocks + (int(view.kv_blocks[preempt].sum()) if preempt.size else 0)
        bs = view.block_size
        # no request needs fewer blocks for a longer proposal: when the longest fits, the guard drops no k
        if jit.step_kernels():  # the same reads, compiled (systems.kernels.blocks_and_context)
            at_max, context = jit.kernel("systems.kernels", "blocks_and_context")(
                view.num_computed, view.kv_blocks, decode, spec, bs, max_len)
        else:
            at_max = kv_blocks_needed_at(view.num_computed[decode], view.kv_blocks[decode], spec, bs, max_len)
            context = view.num_computed[decode].sum()
        need = None if at_max <= free else kv_blocks_needed(view.num_computed[decode], view.kv_blocks[decode], spec,
                                                             bs, max_len)
        acc = self.acceptance
        return argmax_goodput(acc.alpha, int(decode.size), float(context), self.latency,
                              max_len, free, need, num_spec=num_spec,
                              match_rate=acc.match_rate if self.proposer == "pld" else 1.0,
                              verify_frac=acc.verify_frac, min_k=min_k)

    def observe(self, result: StepResult) -> None:
        # lines 17–18: UpdateGlobalAcceptance
        if self._last_k is not None and result.decode_ids.size:
            scored = result.num_batched_tokens - int(result.decode_ids.size)
            self.acceptance.update(self._last_k, result.num_proposed, result.num_accepted, scored)
        if self.no_proposer and result.finished_ids.size:
            self.no_proposer.difference_update(result.finished_ids.tolist())
