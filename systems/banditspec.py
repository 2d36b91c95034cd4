"""BanditSpec: the speculative length as the arm of a UCB bandit, one bandit for the whole run (no context).

Hou et al., "BanditSpec: Adaptive Speculative Decoding via Bandit Algorithms", arXiv:2505.15141, as Nightjar
(Li et al.) ref. [12] describes the baseline (§6.1): it "treats the selection of speculative length as a
Multi-Armed Bandit (MAB) problem, leveraging a variant of the Upper Confidence Bound (UCB) algorithm [...] it does
not explicitly incorporate batch size as a contextual feature"; §6.2: "static BanditSpec is not suitable for
dynamic batch size". Implemented: UCB1 over the arms γ ∈ {0, …, max_len} (:class:`UCB`), rewarded by each decode
step's realized goodput, on vLLM v0 with a draft model.

Each iteration:
  1. γ = the bandit's arm (:meth:`UCB.select`: every arm once in order 0..max_len, then the largest
     mean + c·sqrt(2·ln t / n_γ) on rewards normalized by the largest reward seen);
  2. vLLM's prefill-prioritized batch scheduler (FCFS, recompute preemption) reserving γ lookahead KV slots per
     decoding request; a prefill step runs the draft model alongside the target and plays no arm;
  3. decode step: every request drafts γ tokens with the draft model, one target pass verifies them (γ = 0: plain
     decoding); the plan's telemetry records ``gamma``;
  4. observe: the arm's reward is the step's goodput, Σ tokens emitted / step latency (the steps table's
     ``num_emitted / latency_s`` of the same row).

Deviations:
- Reward: the step's realized goodput (tokens emitted per second of the step, bonus tokens included), Nightjar
  §4.1's reward r_t and the metric it evaluates every baseline by; BanditSpec's own reward is not used.
- One set of arm statistics for the run, shared by every batch size and request (Nightjar's reading: no batch-size
  context), stationary UCB1 (no discount or window) although the reward drifts with the batch size.
- UCB1 (Auer et al. 2002) with rewards normalized by the running maximum reward, so the exploration constant
  c is scale-free; c = 1.0 (ours, UCB1's own constant; the papers give none). Warm-up plays each arm once in order
  0..max_len; ties go to the smallest arm.
- max_len = 5: Nightjar's Γ_max, the largest γ of its Fig. 2.
- The arm is chosen before the batch is scheduled, so vLLM's scheduler reserves its γ lookahead slots (and
  preempts for them); a prefill step does not play it.
- The draft runs on every step (``draft_sync``), arm 0 included, as vLLM v0's spec-decode worker runs the
  proposer for a step without lookahead slots: re-enabling speculation has no catch-up.
"""

from __future__ import annotations

import math

import numpy as np

from repro.sim.plan import IDLE, StepPlan, StepResult
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.lib import prefill_prioritized


class UCB:
    """UCB1 over ``num_arms`` arms with rewards normalized by the largest reward seen (scale-free ``c``)."""

    def __init__(self, num_arms: int, c: float = 1.0) -> None:
        if num_arms < 1 or c < 0:
            raise ValueError("num_arms must be >= 1 and c >= 0")
        self.c = c
        self.counts = np.zeros(num_arms, dtype=np.int64)
        self.sums = np.zeros(num_arms)
        self.max_reward = 0.0

    def index(self) -> np.ndarray:
        """Each arm's upper confidence bound: mean / max reward + c·sqrt(2·ln t / n), +inf for unplayed arms."""
        n = self.counts
        t = int(n.sum())
        scale = self.max_reward if self.max_reward > 0 else 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            ucb = self.sums / n / scale + self.c * np.sqrt(2.0 * math.log(max(t, 1)) / n)
        return np.where(n > 0, ucb, np.inf)

    def select(self) -> int:
        """The arm to play next, without changing state: argmax of :meth:`index`.

        Unplayed arms first, in order; then the largest index (ties → the smallest arm).
        """
        # arm by arm in Python floats, :meth:`index`'s operations in its order (numpy's per-call cost dominates at a
        # handful of arms)
        counts = self.counts.tolist()
        log_t = math.log(max(sum(counts), 1))
        scale = self.max_reward if self.max_reward > 0 else 1.0
        best, best_ucb = 0, -math.inf
        for arm, (n, total) in enumerate(zip(counts, self.sums.tolist(), strict=True)):
            if n == 0:
                return arm
            ucb = total / n / scale + self.c * math.sqrt(2.0 * log_t / n)
            if ucb > best_ucb:
                best, best_ucb = arm, ucb
        return best

    def update(self, arm: int, reward: float) -> None:
        if reward < 0:
            raise ValueError("rewards must be >= 0")
        self.counts[arm] += 1
        self.sums[arm] += reward
        self.max_reward = max(self.max_reward, reward)


class BanditSpec(Policy):
    uses_draft_model = True

    def __init__(self, max_len: int = 5, c: float = 1.0, max_num_seqs: int = 256, max_num_batched_tokens: int = 4096,
                 watermark: float = 0.01) -> None:
        if max_len < 1:
            raise ValueError("max_len must be >= 1")
        self.max_len = max_len
        self.ucb = UCB(max_len + 1, c)  # arm γ = speculative length γ
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = watermark
        self._arm: int | None = None  # the arm the current decode step plays

    def schedule(self, view: View) -> StepPlan:
        gamma = self.ucb.select()
        adm, decode, preempt = prefill_prioritized(
            view, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            watermark=self.watermark, lookahead=gamma)
        self._arm = None
        if adm.rids.size:
            return StepPlan(prefill_ids=adm.rids, prefill_tokens=adm.tokens, proposer="draft", draft_sync=True)
        if decode.size == 0:
            return IDLE if preempt.size == 0 else StepPlan(preempt_ids=preempt)
        self._arm = gamma
        return StepPlan(decode_ids=decode, k=np.full(decode.size, gamma, dtype=np.int64), proposer="draft",
                        draft_sync=True, preempt_ids=preempt, telemetry={"gamma": float(gamma)})

    def observe(self, result: StepResult) -> None:
        if self._arm is not None and result.decode_ids.size and result.latency_s > 0:
            self.ucb.update(self._arm, float(result.num_emitted.sum()) / result.latency_s)
