"""DSD: dynamic speculative decoding by goodput, one proposal length per step from historical acceptance.

Liu et al., "Optimizing Speculative Decoding for Serving Large Language Models Using Goodput", arXiv:2406.14066
(v1; its later version is TurboSpec, ``systems/turbospec.py``), as Nightjar (Li et al.) ref. [13] describes the
baseline (§6.1): "a linear regression model to predict execution latency and [...] the expected acceptance
rate based on historical statistics. It dynamically selects the speculative length that maximizes the system
goodput, defined as the ratio of the expected number of accepted tokens (accepted length + 1) to the execution
time". Implemented with TurboSpec's pieces, imported: the offline profiler's linear latency model
(``turbospec.profile``), the expected generated tokens (accepted + bonus, ``expected_generated`` inside
``argmax_goodput``), the goodput argmax with its out-of-memory guard and the moving-average acceptance
(``AcceptanceTracker``).

Each iteration:
  1. vLLM's prefill-prioritized batch scheduler (FCFS, recompute preemption), reserving the previous step's γ as
     lookahead KV slots per decoding request; a prefill step runs the draft model alongside the target;
  2. decode step: γ = argmax over 0..max_len of expected generated tokens / predicted step time, for the whole
     batch, at the historical acceptance α (γ whose KV slots do not fit is skipped); every request drafts γ tokens
     with the draft model and one target pass verifies them (γ = 0: plain decoding);
  3. observe: a step that speculated updates α from its accepted / tested tokens; a step with γ = 0 observes
     nothing.

Deviations:
- What makes DSD differ from our TurboSpec: no prefill disabling (every prefill runs the draft) and no probing.
  So once the goodput estimate picks γ = 0 no speculation runs, α stops updating and γ stays 0 for good: the
  "decision deadlock" Nightjar §1 and §7.1 criticise (tests/systems/test_nightjar_baselines.py shows it). It is
  kept on purpose.
- Historical acceptance: TurboSpec's ``AcceptanceTracker``: one global α = accepted / tested tokens (tested =
  accepted + 1 for a chain rejected before its end), token-weighted over the most recent speculating steps that
  hold ``window`` = 256 tested tokens; until then the prior ``init_acceptance`` = 0.7 fills the window. The paper
  says "moving average" without the window or the prior; both as conf/system/turbospec.yaml.
- max_len = 5: Nightjar's Γ_max, the largest γ of its Fig. 2 (the paper's own MAX_LEN is not stated).
- Latency model: TurboSpec's piecewise fit of T_fwd = α·N_context + γ·N_batched + δ (one plane per bucket of
  N_batched) over the run's cost model and engine, plus the draft's k passes and the speculation round's host
  cost; goodput counts every request's 1 + E[accepted] (TurboSpec Eq. 4).
- Lookahead slots: the previous step's γ (0 after a plain step), as in systems/turbospec.py.
- The draft runs on every step (``draft_sync``), γ = 0 decodes included, as vLLM v0's spec-decode worker runs the
  proposer for a step without lookahead slots to keep its KV consistent: a γ = 0 step pays a draft pass and
  re-enabling speculation has no catch-up. The latency model does not charge that pass at γ = 0 (the profiler
  times the proposer for speculating steps only).
- Draft-model proposer only, one γ for every request of the step.
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import IDLE, StepPlan, StepResult
from repro.sim.policy import Policy, PolicyContext
from repro.sim.state import View
from systems.lib import prefill_prioritized
from systems.turbospec import AcceptanceTracker, argmax_goodput, kv_blocks_needed, profile


class DSD(Policy):
    uses_draft_model = True

    def __init__(self, max_len: int = 5, window: int = 256, init_acceptance: float = 0.7, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 4096, watermark: float = 0.01) -> None:
        if max_len < 1:
            raise ValueError("max_len must be >= 1")
        self.max_len = max_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = watermark
        self.acceptance = AcceptanceTracker(window, init_acceptance)
        self._lookahead = 0  # KV slots per decode the batch scheduler reserves: the last step's γ
        self._last_k: np.ndarray | None = None  # the speculating step's γ per request, for observe

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        self.latency = ctx.cost.remember(  # offline linear regression
            ("turbospec.profile", "draft", self.max_len, self.max_num_seqs),
            lambda: profile(ctx.cost, "draft", self.max_len, self.max_num_seqs))

    def schedule(self, view: View) -> StepPlan:
        adm, decode, preempt = prefill_prioritized(
            view, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            watermark=self.watermark, lookahead=self._lookahead)
        self._last_k = None
        if adm.rids.size:
            return StepPlan(prefill_ids=adm.rids, prefill_tokens=adm.tokens, proposer="draft", draft_sync=True)
        if decode.size == 0 and preempt.size == 0:
            return IDLE
        gamma = self.gamma(view, decode, preempt)
        self._lookahead = gamma
        k = np.full(decode.size, gamma, dtype=np.int64)
        if gamma:
            self._last_k = k
        return StepPlan(decode_ids=decode, k=k, proposer="draft", draft_sync=True, preempt_ids=preempt,
                        telemetry={"gamma": float(gamma), "alpha": self.acceptance.alpha})

    def gamma(self, view: View, decode: np.ndarray, preempt: np.ndarray) -> int:
        """The goodput-maximizing γ for ``decode`` at the historical acceptance (0 when nothing decodes)."""
        if decode.size == 0:
            return 0
        free = view.free_blocks + int(view.kv_blocks[preempt].sum())
        need = kv_blocks_needed(view.num_computed[decode], view.kv_blocks[decode], np.ones(decode.size, dtype=bool),
                                view.block_size, self.max_len)
        return argmax_goodput(self.acceptance.alpha, int(decode.size), float(view.num_computed[decode].sum()),
                              self.latency, self.max_len, free, need)

    def observe(self, result: StepResult) -> None:
        if self._last_k is not None and result.decode_ids.size:  # γ = 0: nothing to learn from (the deadlock)
            scored = result.num_batched_tokens - int(result.decode_ids.size)
            self.acceptance.update(self._last_k, result.num_proposed, result.num_accepted, scored)
