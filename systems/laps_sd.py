"""LAPS-SD: Least-Attained/Perceived-Service scheduling of speculative-decoding requests (semi-clairvoyant).

Li, Chen and Li, "Semi-Clairvoyant Scheduling of Speculative Decoding Requests to Minimize LLM Inference Latency"
(arXiv:2505.17074), §4, Algorithm 1 and Figure 4.

- **Queues (§4.2).** K priority queues Q_1..Q_K; Q_j holds requests whose attained service E_i (speculation plus
  verification time spent on them) lies in [S_j^down, S_j^up), with S_j^up = M^(j−1) · S_1^up and
  S_j^down = S_(j−1)^up. New requests enter Q_1 non-perceptible; after every round a request is demoted by E_i.
- **Stability (§4.3).** After each round the request's acceptance rate (accepted over proposed draft tokens since
  it started) is recorded; when the largest difference among its last γ values is below δ the request becomes
  perceptible and its predicted acceptance A_i is their mean.
- **Estimate (Eq. 6).** T̃_i = n·L_i·T_SSM/(n·A_i + 1) + L_i·T_LLM/(n·A_i + 1), L_i the output-length predictor's
  estimate, n the speculation length, T_SSM the draft time per speculated token and T_LLM the verification time per
  round (both the means the scheduler has observed so far).
- **Queues of perceptible requests (§4.1: "changes to the perceptible state and is moved to the corresponding
  queue").** A perceptible request is placed by its *perceived* service T̃_i (the name's "Least-Attained/Perceived-
  Service"), a non-perceptible one by its attained service E_i.
- **Order (§4.3, "multi-state scheduling").** Higher queues first; inside a queue perceptible requests by shortest
  T̃_i (SJF), then non-perceptible ones FCFS. Only non-perceptible requests are preempted: after every round the
  batch is recomputed, and a running non-perceptible request that lost its place is swapped out (its KV goes to
  host memory; the engine charges the transfer over the host link, both ways, Fig. 2's switching cost). The round
  in which a request becomes perceptible is its last as a non-perceptible one: it is moved to its perceived queue
  and competes there; once it runs as a perceptible request it runs to completion.
- **Batch (§3).** ``max_batch: 1`` as the paper; larger values are our extension (the batch is the top
  ``max_batch`` requests in the order above, running perceptible requests kept).

Deviations:
- §4.3's prose swaps the names ("speculation time per token denoted by T_LLM", "a time cost of T_SSM" for
  verification); we follow Eq. 6, whose braces label n·L·T_SSM/(nA+1) speculation and L·T_LLM/(nA+1) verification.
- The paper gives no values for K, M, S_1^up, γ, δ, n or the length predictor's error; ours are in
  ``conf/system/laps_sd.yaml`` with the reason for each. Q_K has no upper threshold (it holds every longer request).
  ``laps_sd_stable20`` is the same algorithm with γ = 20, δ = 0.02, a stability rule consistent with Fig. 3 (requests
  judged stable after ≈ 110-155 tokens rather than ≈ 15); the experiments run both.
- Attained service counts every step the request ran in, prefill included, at the whole step's drafting plus
  verification time (at batch 1 that is the request's own); swap time is not service.
- The paper moves a request that becomes perceptible "to the corresponding queue" without saying which; we read
  the scheme's name: by its perceived service, the total estimate T̃_i of Eq. 6 (not the remaining T̃_i − E_i), on
  the same thresholds. SJF orders perceptible requests by T̃_i too, as §4.3 defines it.
- The decision right after the round that made a request perceptible may swap it out (that is how it moves to its
  perceived queue): it is still non-perceptible when the decision is made. Once it runs a round as a perceptible
  request it is never preempted.
- No request is stable before its first accepted token. Read literally, §4.3 calls a request that accepts nothing
  in its first γ rounds stable (γ rates of 0, spread 0 < δ) with A_i = 0, though acceptance starting at 0 rarely
  stays there (Fig. 3: it settles after about 150 tokens); that was 7 of laps_fig7's 43 default-point estimates, and
  the guard lowers Fig. 7's mean estimation error (tests/systems/test_laps_sd.py fails without it). A request that
  never accepts a token stays non-perceptible (LAS within its queue).
- A request's estimate is made once, when it becomes perceptible, and is the ``estimate_s`` column of the requests
  table (Fig. 7 compares it with the service the request got, ``service_s``); ``stable_rounds`` and
  ``stable_tokens`` say when that was (its speculative rounds and generated tokens).
- T_SSM and T_LLM are observed means over every decode round so far (the paper does not say how it gets them);
  a request becomes perceptible after a round, so they are always defined when Eq. 6 is used.
- The output-length predictor ([Z et al., 2024], a fine-tuned LLM) is modelled as multiplicative log-normal error
  around the reference length (``systems.lib.LogNormalLengthPredictor``), shared with LP-SJF.
- The paper's implementation is its own PyTorch code; the engine profile is ``pytorch_mq`` (the k + 1 tokens
  verified in one multi-query pass, no batch expansion), the same for LAPS-SD, FCFS, LP-SJF and LAS.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from repro.sim.plan import RunResult, StepPlan, StepResult, ids
from repro.sim.policy import Policy, PolicyContext
from repro.sim.state import View
from systems.lib import LogNormalLengthPredictor, check_positive_int, contenders, length_predictor, serve_in_order


def thresholds(num_queues: int, growth: float, first_s: float) -> np.ndarray:
    """§4.2: the K − 1 finite upper thresholds S_j^up = M^(j−1) · S_1^up, j = 1..K−1 (Q_K is unbounded)."""
    return first_s * growth ** np.arange(num_queues - 1, dtype=np.float64)


def queue_of(attained_s: np.ndarray, upper_s: np.ndarray) -> np.ndarray:
    """0-based queue index: Q_j holds S_j^down ≤ E < S_j^up (a request reaching S_j^up is demoted)."""
    return np.searchsorted(upper_s, attained_s, side="right")


def is_stable(rates: list[float] | deque[float], gamma: int, delta: float) -> bool:
    """§4.3: stable when the largest difference among the last ``gamma`` acceptance rates is below ``delta``."""
    if len(rates) < gamma:
        return False
    last = list(rates)[-gamma:]
    return max(last) - min(last) < delta


def estimate_s(pred_len: float | np.ndarray, accept: float | np.ndarray, n: int, t_ssm_s: float,
               t_llm_s: float) -> float | np.ndarray:
    """Eq. (6): T̃ = n·L·T_SSM/(n·A + 1) + L·T_LLM/(n·A + 1) (speculation + verification time)."""
    rounds = np.asarray(pred_len, dtype=np.float64) / (n * np.asarray(accept, dtype=np.float64) + 1.0)
    return rounds * (n * t_ssm_s + t_llm_s)


class LAPSSD(Policy):
    uses_draft_model = True
    repeats_some_plans = True  # a batch of pinned requests (plan_repeats)

    def __init__(self, num_queues: int = 4, growth: float = 2.0, first_threshold_s: float = 0.25, gamma: int = 5,
                 delta: float = 0.05, k: int = 4, length_error_sigma: float = 0.25, max_batch: int = 1) -> None:
        self.num_queues = check_positive_int("num_queues", num_queues)
        if not growth > 1.0:
            raise ValueError(f"growth (M) must be > 1, not {growth!r}")
        if not first_threshold_s > 0.0:
            raise ValueError(f"first_threshold_s (S_1^up) must be > 0, not {first_threshold_s!r}")
        self.gamma = check_positive_int("gamma", gamma)
        if not delta > 0.0:
            raise ValueError(f"delta must be > 0, not {delta!r}")
        self.k = check_positive_int("k", k)
        self.max_batch = check_positive_int("max_batch", max_batch)
        self.delta = delta
        self.upper_s = thresholds(num_queues, growth, first_threshold_s)
        self.predictor = LogNormalLengthPredictor(length_error_sigma)
        self.sigma = length_error_sigma
        self._n = 0
        self._pinned_batch = False  # the last plan's batch: every running request pinned, filling it

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        self.predictor = length_predictor(self.sigma, ctx.rng)
        self._n = 0
        self._pinned_batch = False

    def _grow(self, n: int) -> None:
        """Per-request state, sized to the workload on first sight."""
        if n <= self._n:
            return
        self._n = n
        self.attained_s = np.zeros(n)
        self.perceptible = np.zeros(n, dtype=bool)
        self.fresh = np.zeros(n, dtype=bool)  # became perceptible in the last round (not pinned yet)
        self.accept_pred = np.full(n, np.nan)
        self.estimate = np.full(n, np.inf)
        self.pred_len = np.full(n, -1, dtype=np.int64)
        self.proposed = np.zeros(n, dtype=np.int64)
        self.accepted = np.zeros(n, dtype=np.int64)
        self.spec_rounds = np.zeros(n, dtype=np.int64)  # speculative rounds the request has run
        self.stable_rounds = np.full(n, -1, dtype=np.int64)  # its rounds when it became perceptible (-1: never)
        self.stable_tokens = np.full(n, -1, dtype=np.int64)  # the tokens it had generated then
        self.rates: dict[int, deque[float]] = {}
        self.draft_s_sum = 0.0  # drafting seconds per speculated token, summed over rounds (T_SSM)
        self.verify_s_sum = 0.0  # verification seconds per round (T_LLM)
        self.rounds = 0

    def order(self, view: View, rids: np.ndarray | None = None) -> np.ndarray:
        """``rids`` (default: every contender), highest priority first: queue (by perceived service T̃ if
        perceptible, else by attained service), then perceptible by T̃ (SJF), then the rest FCFS."""
        if rids is None:
            rids = contenders(view)
        if rids.size < 2:
            return rids
        per = self.perceptible[rids]
        est = self.estimate[rids]
        q = queue_of(np.where(per, est, self.attained_s[rids]), self.upper_s)
        key = np.where(per, est, view.arrival_s[rids])
        return rids[np.lexsort((rids, key, ~per, q))]

    def schedule(self, view: View) -> StepPlan:
        self._grow(view.arrival_s.size)
        waiting = view.waiting
        unseen = self.pred_len[waiting] < 0
        if np.count_nonzero(unseen):  # §4.3: the output length is predicted before scheduling
            new = waiting[unseen]
            self.pred_len[new] = view.predicted_output_len(new, self.predictor)
        running = view.running
        # only non-perceptible requests are preempted; one that became perceptible in the last round moves to its
        # perceived queue first (it is not pinned until it runs as a perceptible request)
        settled: list[int] = []
        for rid in running.tolist():  # request by request: the batch is small
            if self.fresh[rid]:
                self.fresh[rid] = False
            elif self.perceptible[rid]:
                settled.append(rid)
        pinned = running if len(settled) == running.size else ids(settled)  # all pinned: no new array
        self._pinned_batch = len(settled) == running.size >= self.max_batch
        # pinned requests that fill the batch are the batch: only their own order matters, not the contenders'
        order = self.order(view, pinned) if pinned.size >= self.max_batch else self.order(view)
        return serve_in_order(view, order, max_batch=self.max_batch, k=self.k, pinned=pinned)

    def request_columns(self) -> dict[str, np.ndarray]:
        """Eq. 6's estimate T̃_i, made when the request became perceptible (NaN for those that never did), and the
        output-length predictor's L_i."""
        if self._n == 0:
            return {}
        stable = self.stable_rounds >= 0
        return {"estimate_s": np.where(np.isfinite(self.estimate), self.estimate, np.nan),
                "predicted_output_len": np.where(self.pred_len >= 0, self.pred_len, -1).astype(np.float64),
                # when the request became perceptible: its speculative rounds and the tokens it had generated then
                # (accepted + one per round + the prefill's), NaN if it never did
                "stable_rounds": np.where(stable, self.stable_rounds, np.nan),
                "stable_tokens": np.where(stable, self.stable_tokens, np.nan)}

    def plan_repeats(self, plan: StepPlan) -> bool:
        """A batch of pinned requests filling ``max_batch`` is served until one finishes (or a request arrives): the
        same plan each step, and ``observe`` only adds up (:meth:`observe_run`)."""
        return self._pinned_batch

    def observe_run(self, run: RunResult) -> None:
        """:meth:`observe` after each step of a run of pinned requests: they are perceptible, so only their
        attained service and counters and the T_SSM and T_LLM sums move, each summed in step order as ``observe``
        sums it (every step proposes ``k`` tokens per request)."""
        step_s = run.draft_s + run.verify_s
        for rid, took in zip(run.decode_ids.tolist(), run.num_steps.tolist(), strict=True):
            self.attained_s[rid] = _in_order(self.attained_s[rid], step_s[:took])
        self.proposed[run.decode_ids] += run.num_proposed
        self.accepted[run.decode_ids] += run.num_accepted
        self.spec_rounds[run.decode_ids] += run.num_steps
        self.rounds += int(run.draft_s.size)
        self.draft_s_sum = float(_in_order(self.draft_s_sum, run.draft_s / self.k))
        self.verify_s_sum = float(_in_order(self.verify_s_sum, run.verify_s))
        for rid in run.finished_ids.tolist():
            self.rates.pop(rid, None)

    def observe(self, result: StepResult) -> None:
        step_s = result.draft_s + result.verify_s  # §4.2: E_i, speculation + verification
        for rid in result.prefill_ids.tolist():
            self.attained_s[rid] += step_s
        # request by request (the batch is small); a request that proposed nothing accepted nothing
        spec: list[int] = []
        for rid, proposed, accepted in zip(result.decode_ids.tolist(), result.num_proposed.tolist(),
                                           result.num_accepted.tolist(), strict=True):
            self.attained_s[rid] += step_s
            self.proposed[rid] += proposed
            self.accepted[rid] += accepted
            if proposed > 0:
                spec.append(rid)
        if not spec:
            return
        self.rounds += 1
        self.draft_s_sum += result.draft_s / self.k
        self.verify_s_sum += result.verify_s
        fresh: list[int] = []
        for rid in spec:
            self.spec_rounds[rid] += 1
            if self.perceptible[rid]:
                continue
            total = int(self.accepted[rid])  # accepted since the request started
            hist = self.rates.setdefault(rid, deque(maxlen=self.gamma))
            hist.append(total / int(self.proposed[rid]))
            # Algorithm 1 lines 11-14, once the request has accepted a token (see Deviations)
            if total > 0 and is_stable(hist, self.gamma, self.delta):
                self.perceptible[rid] = True
                self.fresh[rid] = True
                self.accept_pred[rid] = float(np.mean(hist))
                self.stable_rounds[rid] = self.spec_rounds[rid]
                self.stable_tokens[rid] = total + self.spec_rounds[rid] + 1
                del self.rates[rid]
                fresh.append(rid)
        if fresh:  # Eq. (6) with the observed T_SSM, T_LLM, for the requests that just became perceptible
            rids = np.array(fresh, dtype=np.int64)
            self.estimate[rids] = estimate_s(self.pred_len[rids], self.accept_pred[rids], self.k,
                                             self.draft_s_sum / self.rounds, self.verify_s_sum / self.rounds)
        for rid in result.finished_ids.tolist():
            self.rates.pop(rid, None)


def _in_order(start: float, terms: np.ndarray) -> float:
    """``start`` plus each of ``terms`` in turn (the sum a loop of ``+=`` makes, bit for bit)."""
    if terms.size == 0:
        return start
    return float(np.add.accumulate(np.concatenate([[start], terms]))[-1])
