"""Metrics of a point's step trace (``engine.record_steps``): the papers' per-iteration breakdowns, Nightjar's regret,
GoodSpeed's rounds, Nightjar's elastic-memory operations (:func:`step_extras`, part of
:func:`repro.metrics.summary.summarize`), and the trace's token counts and regret series."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = ["peak_token_rate", "regret", "regret_from_arms", "step_extras", "step_total_tokens"]

_NAN = float("nan")


def step_extras(steps: pd.DataFrame) -> dict[str, float]:
    """The metrics of a (non-empty) step trace, each where the trace has the columns it needs."""
    x: dict[str, float] = {}
    if "num_decode" in steps.columns:
        x.update(_iteration_extras(steps[steps["num_decode"] > 0]))
    if "send_s" in steps.columns and float(steps["send_s"].sum()) > 0:
        x.update(_edge_round_extras(steps))
    if "goodput_est" in steps.columns:
        x.update(_goodput_est_extras(steps))
    if "memory_op" in steps.columns:
        x.update(_memory_extras(steps))
    return x


def _iteration_extras(dec: pd.DataFrame) -> dict[str, float]:
    """Per decoding iteration (``dec``: the steps with at least one decode): AdaServe Fig. 9's and TurboSpec Fig. 16's
    time breakdowns, Nightjar's regret, TurboSpec Fig. 10's mean proposed length."""
    x: dict[str, float] = {}
    # AdaServe Fig. 9's breakdown: small-model (draft) and large-model (verify) time from the cost model,
    # scheduling = the policy's measured CPU time.
    for name, col in (("iter_ms", "latency_s"), ("iter_draft_ms", "draft_s"), ("iter_verify_ms", "verify_s"),
                      ("iter_schedule_ms", "schedule_wall_s")):
        if col in dec.columns:
            x[f"mean_{name}"] = float(dec[col].mean()) * 1e3 if len(dec) else _NAN
    if len(dec) and {"draft_s", "latency_s", "overhead_s"} <= set(dec.columns):
        # TurboSpec Fig. 16's execution-time breakdown of decoding iterations: shares of the draft (proposer),
        # the fixed overheads inside the target pass, and the rest of the target pass
        total = float(dec["latency_s"].sum())
        x["draft_share"] = float(dec["draft_s"].sum()) / total if total > 0 else _NAN
        x["overhead_share"] = float(dec["overhead_s"].sum()) / total if total > 0 else _NAN
        x["target_share"] = 1.0 - x["draft_share"] - x["overhead_share"] if total > 0 else _NAN
    if "cum_regret" in dec.columns and len(dec):
        x.update(_regret_extras(dec))
    if "mean_k" in dec.columns:
        # Mean proposed length per decoding iteration (TurboSpec Fig. 10): the step's mean k over its requests.
        x["mean_proposed_len"] = float(dec["mean_k"].mean()) if len(dec) else _NAN
    return x


def _regret_extras(dec: pd.DataFrame) -> dict[str, float]:
    """Nightjar Eq. 2: cumulative regret against the best uniform chain length of every decode step (the engine's
    counterfactual_arms), per decode step, and how often the step ran the best one."""
    x: dict[str, float] = {}
    scored = dec[dec["best_reward"].notna()]
    x["regret"] = float(scored["cum_regret"].iloc[-1]) if len(scored) else _NAN
    if "cum_regret_fixed" in scored.columns:  # against the best fixed γ per batch size in hindsight
        x["regret_fixed"] = float(scored["cum_regret_fixed"].iloc[-1]) if len(scored) else _NAN
    x["regret_per_step"] = x["regret"] / len(scored) if len(scored) else _NAN
    x["best_arm_share"] = float((scored["mean_k"] == scored["best_arm"]).mean()) if len(scored) else _NAN
    x["regret_share"] = float((scored["best_reward"] - scored["reward"]).sum() / scored["best_reward"].sum()) \
        if len(scored) else _NAN
    if "cum_regret_fixed" in scored.columns and len(scored) >= 4:
        # growth exponent a of R(T) ∝ T^a from R(T) / R(T/2) (1: linear; Theorem 1's Õ(√T): about 0.5)
        r = scored["cum_regret_fixed"].to_numpy(dtype=np.float64)
        half, end = r[len(r) // 2 - 1], r[-1]
        x["regret_exponent"] = float(np.log2(end / half)) if half > 0 and end > 0 else _NAN
    return x


def _edge_round_extras(steps: pd.DataFrame) -> dict[str, float]:
    """GoodSpeed Fig. 3: a run's wall time split into receiving (the slowest draft server's drafting and uplink),
    verifying (the target's pass) and sending (the downlink of accepted tokens and allocations)."""
    x: dict[str, float] = {}
    for name, col in (("receive", "draft_s"), ("verify", "verify_s"), ("send", "send_s")):
        x[f"{name}_time_s"] = float(steps[col].sum())
    wall = float(steps["latency_s"].sum())
    x["send_share"] = x["send_time_s"] / wall if wall > 0 else _NAN
    x["receive_verify_share"] = (x["receive_time_s"] + x["verify_time_s"]) / wall if wall > 0 else _NAN
    # per unit of work: the same phases per token the rounds emitted (a round that drafts less emits less)
    emitted = float(steps["num_emitted"].sum())
    x["wall_ms_per_token"] = 1e3 * wall / emitted if emitted > 0 else _NAN
    x["verify_ms_per_token"] = 1e3 * x["verify_time_s"] / emitted if emitted > 0 else _NAN
    chains = [c for c in steps.columns if c.startswith("S_") and c[2:].isdigit()]
    if chains:  # the longest draft chain of each drafting round: its server's sequential drafting sets the round
        longest = steps[chains].to_numpy(dtype=np.float64).max(axis=1)
        drafting = np.isfinite(longest) & (longest > 0)
        x["mean_longest_chain"] = float(longest[drafting].mean()) if drafting.any() else _NAN
    return x


def _goodput_est_extras(steps: pd.DataFrame) -> dict[str, float]:
    """GoodSpeed Fig. 2: the allocation's expected tokens (x̂ at the smoothed α̂) against the tokens emitted, summed
    over the rounds: the estimator's bias (0 = unbiased)."""
    est = steps["goodput_est"].to_numpy(dtype=np.float64)
    rounds = np.isfinite(est)
    real = float(steps.loc[rounds, "num_emitted"].sum())
    return {"goodput_est_bias": float(est[rounds].sum()) / real - 1.0 if real > 0 else _NAN}


def _memory_extras(steps: pd.DataFrame) -> dict[str, float]:
    """Nightjar Table 6: the elastic-memory operations the run performed and what the engine charged for them
    (memory_s of the step that carried one: 1 = KV expansion (draft offloaded), 2 = contraction + reload)."""
    x: dict[str, float] = {}
    for op, name in ((1.0, "expand"), (2.0, "contract")):
        hit = steps["memory_op"] == op
        x[f"num_{name}"] = float(hit.sum())
        x[f"mean_{name}_ms"] = float(steps.loc[hit, "memory_s"].mean()) * 1e3 if hit.any() else _NAN
    return x


def step_total_tokens(steps: pd.DataFrame) -> pd.Series:
    """A step's ``total_tokens``: prompt tokens it prefilled plus output tokens it emitted (what vLLM's "total token
    throughput" counts, Nightjar's throughput): the batched tokens less the decoding requests' 1 + proposed ones."""
    return steps["num_emitted"] + steps["num_batched_tokens"] - steps["num_decode"] - steps["num_proposed"]


def peak_token_rate(steps: pd.DataFrame, window_s: float) -> float:
    """The largest total token throughput (prompt tokens prefilled + output tokens emitted, per second) over
    consecutive windows of ``window_s`` seconds of the step trace, each step counted in the window it starts in
    (Nightjar Fig. 11's peak; the timeline figure's ``rate`` bins)."""
    if window_s <= 0 or not len(steps):
        return _NAN
    tokens = step_total_tokens(steps).to_numpy(dtype=np.float64)
    bins = (steps["start_at"].to_numpy(dtype=np.float64) // window_s).astype(np.int64)
    return float(np.bincount(bins - bins.min(), weights=tokens).max() / window_s)


def regret(
    chosen_reward: Sequence[float] | np.ndarray, best_reward: Sequence[float] | np.ndarray
) -> np.ndarray:
    """Cumulative regret (Nightjar): ``cumsum(best_reward[t] − chosen_reward[t])`` over rounds t."""
    best = np.asarray(best_reward, dtype=np.float64)
    chosen = np.asarray(chosen_reward, dtype=np.float64)
    return np.cumsum(best - chosen)


def regret_from_arms(rewards: np.ndarray, chosen: Sequence[int] | np.ndarray) -> np.ndarray:
    """Cumulative regret from a (T, K) table of every arm's reward per round and the arm chosen each round.

    The best arm is the one with the highest *total* reward over the series (the fixed comparator of bandit
    regret); pass per-round best rewards to :func:`regret` for the dynamic (per-round best) comparator.
    """
    r = np.asarray(rewards, dtype=np.float64)
    idx = np.asarray(chosen, dtype=np.int64)
    best_arm = int(np.argmax(r.sum(axis=0)))
    return regret(r[np.arange(len(idx)), idx], r[:, best_arm])
