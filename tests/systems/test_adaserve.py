"""The tree systems end to end: AdaServe, its ablations (EqualGreedy, GlobalGreedy) and batched SpecInfer."""

from __future__ import annotations

import numpy as np
import pytest

from repro.plan import StepPlan
from repro.simulate import build, compose
from repro.state import Status, View
from systems.trees import is_closed

TREE_SYSTEMS = ["adaserve", "adaserve_asc", "global_greedy", "equal_greedy", "specinfer"]


def run(system: str, *overrides: str) -> tuple[object, list[tuple[int, StepPlan]], object]:
    cfg = compose([f"system={system}", "num_requests=40", "rps=8", "seed=1", "workload=adaserve_mix",
                   "hardware=a100-80g", *overrides])
    built = build(cfg)
    pol = built.engine.replicas[0].policy
    plans: list[tuple[int, StepPlan]] = []
    inner = pol.schedule

    def spy(view: View) -> StepPlan:
        plan = inner(view)
        plans.append((int(view.running.size), plan))
        return plan

    pol.schedule = spy  # type: ignore[method-assign]
    out = built.engine.run()
    return built, plans, out


@pytest.mark.parametrize("system", TREE_SYSTEMS)
def test_tree_system_end_to_end(system: str) -> None:
    built, plans, out = run(system)
    s = out.state  # type: ignore[attr-defined]
    assert (s.status == Status.FINISHED).all()
    assert (s.num_generated == built.table.output_len).all()  # type: ignore[attr-defined]
    assert s.num_proposed.sum() > 0 and s.num_accepted.sum() > 0
    budget = built.cost.budget_tokens  # type: ignore[attr-defined]
    for _, plan in plans:
        trees = plan.trees or {}
        assert set(trees) <= set(plan.decode_ids.tolist())
        for t in trees.values():
            assert is_closed(t.cand, t.nodes)  # empty trees pay their beam search
        tokens = plan.decode_ids.size + sum(t.num_nodes for t in trees.values())
        if system != "specinfer" and plan.decode_ids.size:
            assert tokens <= budget  # Eq. (1): roots + nodes ≤ B
        if system == "specinfer":
            assert all(t.num_nodes <= 20 for t in trees.values())


def test_budget_override_and_full_use() -> None:
    # with a small budget the verify pass holds exactly B tokens whenever candidates suffice
    _, plans, _ = run("adaserve", "system.budget=24")
    sizes = [(p.decode_ids.size, p.decode_ids.size + sum(t.num_nodes for t in (p.trees or {}).values()))
             for _, p in plans if p.decode_ids.size]
    assert all(tok <= max(24, n) for n, tok in sizes)
    assert sum(tok == 24 for n, tok in sizes if n < 24) > 0.5 * sum(n < 24 for n, _ in sizes)
    assert any(tok == n for n, tok in sizes if n >= 24) or all(n < 24 for n, _ in sizes)


def test_no_speculation_when_batch_reaches_budget() -> None:
    _, plans, _ = run("adaserve", "system.budget=2")
    decodes = [p for _, p in plans if p.decode_ids.size >= 2]
    assert decodes and all(not p.trees for p in decodes)


def test_slo_selection_favours_urgent_requests() -> None:
    # AdaServe gives the urgent class (TPOT = baseline latency) more speculation per step than GlobalGreedy does
    def urgent_share(system: str) -> float:
        built, _, out = run(system, "system.budget=64")
        s = out.state  # type: ignore[attr-defined]
        urgent = built.table.slo_class == 0  # type: ignore[attr-defined]
        per_step = s.num_proposed / np.maximum(s.num_decode_steps, 1)
        return float(per_step[urgent].mean() / per_step[~urgent].mean())

    assert urgent_share("adaserve") > urgent_share("global_greedy")


def test_w_max_beyond_drafter_width_is_an_error() -> None:
    with pytest.raises(ValueError, match="w_max"):
        run("adaserve", "system.w_max=16")
