"""What the engine asks of a real backend that executes its steps on real models instead of the cost model and the
token oracle (``backend=hf``: :class:`repro.backends.hf.HfBackend`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from repro.cost.step import DecodeBatch, PrefillBatch
    from repro.sim.plan import StepPlan
    from repro.sim.proposers import Proposer
    from repro.sim.state import RequestState


@dataclass
class Executed:
    """What the backend measured and decided for one step (arrays aligned with the step's decode ids)."""

    draft_s: float
    verify_s: float
    proposed: np.ndarray
    accepted: np.ndarray
    matched: np.ndarray
    accept_prob: np.ndarray
    num_tokens: int


class StepBackend(Protocol):
    """Runs a replica's checked steps and owns the real caches; the engine keeps sequencing and bookkeeping."""

    def run_step(self, s: RequestState, plan: StepPlan, prop: Proposer, pre: PrefillBatch,
                 dec: DecodeBatch) -> Executed:
        """Execute one step: measure its drafting and verification seconds, decide what the target accepts."""
        ...

    def lookup(self, rids: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """Prompt lookup's proposals (tokens matched) for ``rids``, at most ``ks`` each."""
        ...

    def release(self, rid: int) -> None:
        """Free a finished request's caches."""
        ...

    def drop(self, rids: np.ndarray) -> None:
        """Drop preempted requests' caches (recompute preemption)."""
        ...

    def swap(self, rids: np.ndarray, *, to_host: bool) -> float:
        """Move requests' caches to host memory or back; the copy's measured seconds."""
        ...
