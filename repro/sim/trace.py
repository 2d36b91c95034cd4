"""Step observers: what the engine tells an observer after each step, and the step trace built from it.

The engine's replicas run without observers unless one is asked for; with observers, a replica times its policy's
``schedule`` call (wall clock, not simulated time) and, after each step, hands every observer a :class:`StepEvent`:
the plan, what the policy observes (:class:`~repro.sim.plan.StepResult`) and what only the engine knows (the batches it
charged, the tokens matched past the first rejection, the fixed overheads inside the verify time). The step trace
(``engine.record_steps=true``) is one such observer, :class:`StepTracer`: one :class:`StepRecord` per step per
replica, plus the named values the plan carried (``StepPlan.telemetry``, e.g. the arm a bandit chose), which
:func:`steps_frame` turns into extra columns of the steps table (``steps.parquet``) when some plan carries any.
The round trace (``engine.record_rounds=true``), :class:`RoundTracer`, is another: one row per decoding request per
step (``rounds.parquet``), with the request's running totals, e.g. its acceptance rate over decoding progress (LAPS-SD
Fig. 3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd

from repro.core import jit

if TYPE_CHECKING:
    from repro.cost.step import DecodeBatch, PrefillBatch
    from repro.sim.plan import StepPlan, StepResult
    from repro.sim.state import View


@dataclass(slots=True)
class StepRecord:
    """One row of the step trace."""

    start_at: float
    latency_s: float
    num_seqs: int
    num_decode: int
    num_prefill: int
    num_batched_tokens: int
    num_emitted: int
    num_proposed: int
    num_accepted: int
    num_matched: int  # proposed tokens that are the target's, counted past the first rejection (vLLM v0's metric)
    draft_s: float
    verify_s: float
    overhead_s: float  # fixed costs inside verify_s (per step, layer, request)
    memory_s: float  # swaps and draft offload/reload before the step
    send_s: float  # the downlink to remote draft servers after the target's pass (GoodSpeed)
    mean_k: float
    replica: int
    schedule_wall_s: float  # wall-clock CPU time the policy took to plan the step (not simulated time)


#: The step table's columns that come from :class:`StepRecord` (telemetry may not reuse them).
RECORD_COLUMNS = tuple(f.name for f in fields(StepRecord))


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One executed step as an observer sees it.

    Holds the replica, plan, the policy's observation, the prefill and decode batches the engine charged, matched
    tokens per decoding request, the fixed costs inside ``verify_s``, the policy's wall-clock planning seconds and the
    replica's read-only request state after the step. The decode batch's ``k`` is what was verified (prompt lookup's
    matched tokens, a tree's node count).
    """

    replica: int
    plan: StepPlan
    result: StepResult
    prefill: PrefillBatch
    decode: DecodeBatch
    num_matched: np.ndarray
    overhead_s: float
    schedule_wall_s: float
    view: View | None = None  # the replica's request state after the step (read-only)
    arm_rewards: np.ndarray | None = None  # goodput of each uniform chain length 0..N (engine counterfactual_arms)


@dataclass(frozen=True, slots=True)
class StepRun:
    """Repeated decode steps the fast path ran (:meth:`repro.sim.fastforward.FastForward.run_ahead`), for ``on_run``.

    - Per step (arrays, one entry a step): start, end, drafting and verification seconds, and the batch's tokens
      emitted, proposed, accepted and matched.
    - Shared by every step: replica, plan, decoding requests, tokens through the target, fixed costs inside
      verification, chain length, and the policy's planning seconds for the first step (the others repeat it).
    """

    replica: int
    plan: StepPlan
    start_at: np.ndarray
    end_at: np.ndarray
    draft_s: np.ndarray
    verify_s: np.ndarray
    num_emitted: np.ndarray
    num_proposed: np.ndarray
    num_accepted: np.ndarray
    num_matched: np.ndarray
    num_decode: int
    num_batched_tokens: int
    overhead_s: float
    mean_k: float
    schedule_wall_s: float


class StepObserver(Protocol):
    """Anything the engine calls after each step (``Engine(observers=...)``).

    An observer with ``on_run(run: StepRun)`` takes fast-forwarded runs at once; if any observer lacks it, the engine
    runs every step one by one.
    """

    def on_step(self, event: StepEvent) -> None: ...


class StepTracer:
    """The step trace: a :class:`StepRecord` per step, kept per replica (``records`` lists replica 0's steps, then
    replica 1's, ...), and each step's plan telemetry beside it."""

    def __init__(self) -> None:
        self._records: dict[int, list[StepRecord]] = {}
        self._telemetry: dict[int, list[Mapping[str, float] | None]] = {}
        self._regret: dict[int, float] = {}

    def on_step(self, event: StepEvent) -> None:
        res, pre, dec = event.result, event.prefill, event.decode
        n_pre, n_dec = pre.ids.size, dec.ids.size
        if n_dec and jit.step_kernels():  # the same sums, compiled (repro.sim.kernels.step_sums)
            emitted, proposed, accepted, matched, k_sum = jit.kernel("repro.sim.kernels", "step_sums")(
                res.num_emitted, res.num_proposed, res.num_accepted, event.num_matched, dec.k)
        else:
            emitted, proposed, accepted, matched, k_sum = (
                int(res.num_emitted.sum()), int(res.num_proposed.sum()), int(res.num_accepted.sum()),
                int(event.num_matched.sum()), int(dec.k.sum()))
        rec = StepRecord(
            res.start_at, res.end_at - res.start_at, n_pre + n_dec, n_dec, n_pre, res.num_batched_tokens,
            emitted + int(np.count_nonzero(pre.completes)) if n_pre else emitted, proposed, accepted, matched,
            res.draft_s, res.verify_s, event.overhead_s, res.memory_s, res.send_s, k_sum / n_dec if n_dec else 0.0,
            event.replica, event.schedule_wall_s)  # (the integer sum / n: k.mean() bit for bit)
        self._records.setdefault(event.replica, []).append(rec)
        tel = _telemetry(event.plan)
        if event.arm_rewards is not None:
            tel = {**(tel or {}), **self._regret_columns(event.replica, event.arm_rewards, rec)}
        self._telemetry.setdefault(event.replica, []).append(tel or None)

    def on_run(self, run: StepRun) -> None:
        """The records of a fast-forwarded run: each step's as :meth:`on_step` would have made it."""
        recs = self._records.setdefault(run.replica, [])
        n, tokens, ov, k, wall, rep = run.num_decode, run.num_batched_tokens, run.overhead_s, run.mean_k, \
            run.schedule_wall_s, run.replica
        for start, end, emitted, proposed, accepted, matched, draft, verify in zip(
                run.start_at.tolist(), run.end_at.tolist(), run.num_emitted.tolist(), run.num_proposed.tolist(),
                run.num_accepted.tolist(), run.num_matched.tolist(), run.draft_s.tolist(), run.verify_s.tolist(),
                strict=True):
            recs.append(StepRecord(start, end - start, n, n, 0, tokens, emitted, proposed, accepted, matched, draft,
                                   verify, ov, 0.0, 0.0, k, rep, wall))
        self._telemetry.setdefault(run.replica, []).extend(_telemetry(run.plan) for _ in run.start_at)

    def _regret_columns(self, replica: int, rewards: np.ndarray, rec: StepRecord) -> dict[str, float]:
        """A decode step's counterfactual columns.

        Each chain length's goodput (``arm_reward_<γ>``), the best and its γ, the realized goodput (tokens emitted /
        step seconds) and Eq. 2's cumulative regret Σ (best − realized) over the replica's decode steps so far.
        """
        best = int(np.nanargmax(rewards))
        realized = (rec.num_emitted / rec.latency_s) if rec.latency_s > 0 else 0.0
        total = self._regret.get(replica, 0.0) + float(rewards[best]) - realized
        self._regret[replica] = total
        cols = {f"arm_reward_{g}": float(r) for g, r in enumerate(rewards)}
        cols.update(best_arm=float(best), best_reward=float(rewards[best]), reward=realized, cum_regret=total)
        return cols

    @property
    def records(self) -> list[StepRecord]:
        return [rec for i in sorted(self._records) for rec in self._records[i]]

    @property
    def telemetry(self) -> list[Mapping[str, float] | None]:
        """Each record's plan telemetry (``None`` where the plan carried none), aligned with :attr:`records`."""
        return [t for i in sorted(self._telemetry) for t in self._telemetry[i]]


def _telemetry(plan: StepPlan) -> dict[str, float] | None:
    """A copy of the plan's telemetry for one step record (``None`` without any).

    Its names may not be columns the record has.
    """
    tel = plan.telemetry
    if not tel:
        return None
    clash = set(tel) & set(RECORD_COLUMNS)
    if clash:
        raise ValueError(f"plan telemetry {sorted(clash)} would overwrite step trace columns")
    return dict(tel)


def steps_frame(records: list[StepRecord], telemetry: list[Mapping[str, float] | None] | None = None
                ) -> pd.DataFrame:
    """One row per step: the :class:`StepRecord` columns, then one column per telemetry name in the order the
    names first appear (NaN in the steps whose plan did not carry it); no extra column when no plan carried any."""
    frame = pd.DataFrame.from_records(list(map(attrgetter(*RECORD_COLUMNS), records)), columns=list(RECORD_COLUMNS))
    if telemetry and any(telemetry):
        names = list(dict.fromkeys(name for t in telemetry if t for name in t))
        for name in names:
            frame[name] = np.array([float(t.get(name, np.nan)) if t else np.nan for t in telemetry],
                                   dtype=np.float64)
        if "cum_regret" in frame.columns:
            frame["cum_regret_fixed"] = fixed_arm_regret(frame)
    return frame


def fixed_arm_regret(frame: pd.DataFrame) -> np.ndarray:
    """Cumulative regret, per replica, against the best fixed chain length of each batch size in hindsight.

    The comparator of contextual-bandit regret bounds (per context, the arm with the largest total reward). Counted
    over decode steps with counterfactual rewards (``arm_reward_<γ>``); NaN elsewhere. Unlike Eq. 2's per-step best
    (``cum_regret``), a policy can follow it.
    """
    arms = sorted((c for c in frame.columns if c.startswith("arm_reward_")), key=lambda c: int(c.rsplit("_", 1)[1]))
    out = np.full(len(frame), np.nan)
    scored = frame["best_reward"].notna().to_numpy()
    if not arms or not scored.any():
        return out
    sub = frame[scored]
    rewards = sub[arms].to_numpy(dtype=np.float64)
    loss = np.zeros(len(sub))
    for _, idx in sub.groupby(["replica", "num_decode"]).indices.items():
        best = int(np.argmax(np.nansum(rewards[idx], axis=0)))
        loss[idx] = np.nan_to_num(rewards[idx, best], nan=0.0) - sub["reward"].to_numpy()[idx]
    cum = np.zeros(len(sub))
    for _, idx in sub.groupby("replica").indices.items():
        cum[idx] = np.cumsum(loss[idx])
    out[scored] = cum
    return out


#: Columns of the round trace (:class:`RoundTracer`).
ROUND_COLUMNS = ("rid", "replica", "end_at", "k", "accepted", "num_generated", "num_proposed", "num_accepted")


class RoundTracer:
    """The round trace: one row per request that decoded in a step.

    Columns: request id, replica, the step's end, tokens proposed (``k``) and accepted in the step, and the running
    totals after it: ``num_generated`` (first token included), ``num_proposed``, ``num_accepted`` and their ratio
    ``accept_rate``.
    """

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []

    def on_step(self, event: StepEvent) -> None:
        res, view = event.result, event.view
        dec = res.decode_ids
        if dec.size == 0 or view is None:
            return
        self._chunks.append(np.column_stack([
            dec, np.full(dec.size, event.replica), np.full(dec.size, res.end_at), res.num_proposed,
            res.num_accepted, view.num_generated[dec], view.num_proposed[dec], view.num_accepted[dec],
        ]).astype(np.float64))

    def frame(self) -> pd.DataFrame:
        """The trace as a table (:data:`ROUND_COLUMNS`), in step order."""
        data = np.concatenate(self._chunks) if self._chunks else np.zeros((0, len(ROUND_COLUMNS)))
        frame = pd.DataFrame(data, columns=list(ROUND_COLUMNS))
        ints = [c for c in ROUND_COLUMNS if c != "end_at"]
        return frame.astype(dict.fromkeys(ints, np.int64))
