"""Policies a user writes by subclassing a system of the suite: the bring-your-own-policy example of
docs/recipes.md (``MyPolicy``, which ``tests/test_league.py`` writes into a copy of the project as
``systems/my_policy.py``) and a subclass that only changes a default.

The contract test (``tests/test_systems_contract.py``) runs each with the engine's fast path on and off: a subclass
keeps its parent's fast-path promises only where it leaves the parent's planning alone, or declares them again in its
own body (``repro.sim.policy.Policy.__init_subclass__``).
"""

from __future__ import annotations

import inspect

from repro.sim.plan import StepPlan
from repro.sim.state import View
from systems.static_sd import StaticSD
from systems.vllm import VLLM


class MyPolicy(StaticSD):
    """My policy: speculate 2 tokens while at most 8 requests decode, else none (the recipe's example).

    It declares no fast-path promise: its k follows the batch, so a stretch of steps is not one repeated plan.
    StaticSD's promises cover StaticSD's own ``schedule``; this class overrides it, so the engine asks it at every
    step (docs/adding-a-system.md).
    """

    def schedule(self, view: View) -> StepPlan:
        self.k = 2 if view.running.size <= 8 else 0
        return super().schedule(view)


class SmallBatchVLLM(VLLM):
    """vLLM's scheduler with a smaller batch by default: its planning is VLLM's, so it keeps VLLM's promises."""

    def __init__(self, max_num_seqs: int = 64, max_num_batched_tokens: int = 4096, watermark: float = 0.01) -> None:
        super().__init__(max_num_seqs, max_num_batched_tokens, watermark)


#: each user policy: its target, the system config it is built on, and whether the engine's fast path may run it
USER_POLICIES = {
    "MyPolicy": ("user_policies.MyPolicy", "static_sd", False),
    "SmallBatchVLLM": ("user_policies.SmallBatchVLLM", "vllm", True),
}

MY_POLICY_HEADER = '''"""My policy: speculate 2 tokens while at most 8 requests decode, else none."""

from repro.sim.plan import StepPlan
from repro.sim.state import View
from systems.static_sd import StaticSD


'''


def my_policy_source() -> str:
    """The recipe's example as a user writes it in ``systems/my_policy.py``: this module's ``MyPolicy``."""
    return MY_POLICY_HEADER + inspect.getsource(MyPolicy)
