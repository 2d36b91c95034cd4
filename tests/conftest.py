"""Shared factories: requests, a deterministic oracle double, engines around any policy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from repro import runner
from repro.cost.model import CostModel
from repro.cost.spec import load_hardware, load_model
from repro.engine import Engine, SimOutput
from repro.plan import TreeSpec
from repro.policy import Policy, PolicyContext


class FixedOracle:
    """Test double of the token oracle: every chain accepts ``min(k, accept)`` tokens; a tree accepts the
    depth of its deepest rank-0 path, capped at ``accept``."""

    def __init__(self, accept: int = 0) -> None:
        self.accept = accept
        self.released: list[int] = []
        self.calls: list[tuple[int, int, int]] = []

    def accept_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                     proposer: str = "draft") -> tuple[np.ndarray, np.ndarray]:
        self.calls.extend(zip(rids.tolist(), pos.tolist(), k.tolist(), strict=True))
        k = np.asarray(k, dtype=np.int64)
        return k.copy(), np.minimum(k, self.accept)

    def accept_tree(self, tree: TreeSpec, proposer: str = "draft") -> int:
        cand, depth = tree.cand, 0
        on = {-1}
        for i in sorted(tree.nodes.tolist()):
            if cand.rank[i] == 0 and cand.parent[i] in on:
                on.add(i)
                depth = max(depth, int(cand.depth[i]))
        return min(depth, self.accept)

    def release(self, rid: int) -> None:
        self.released.append(rid)


def make_requests(n: int = 4, prompt_len: int | list[int] = 32, output_len: int | list[int] = 16,
                  gap_s: float = 0.0, tpot_slo_s: float = np.inf) -> dict[str, np.ndarray]:
    """``n`` requests arriving ``gap_s`` apart with the given lengths (scalars or per-request lists)."""
    return {
        "arrival_s": np.arange(n, dtype=np.float64) * gap_s,
        "prompt_len": np.broadcast_to(np.asarray(prompt_len, dtype=np.int64), (n,)).copy(),
        "output_len": np.broadcast_to(np.asarray(output_len, dtype=np.int64), (n,)).copy(),
        "tpot_slo_s": np.full(n, tpot_slo_s),
        "ttft_slo_s": np.full(n, np.inf),
        "slo_class": np.zeros(n, dtype=np.int64),
    }


def make_cost(hardware: str = "a100-80g", model: str = "llama2-7b", draft: str | None = "llama-160m",
              tp: int = 1) -> CostModel:
    return CostModel(load_hardware(hardware), load_model(model), tp=tp,
                     draft=load_model(draft) if draft else None)


def make_engine(policy: Policy, requests: dict[str, np.ndarray] | None = None, *, oracle: Any = None,
                hardware: str = "a100-80g", model: str = "llama2-7b", draft: str | None = "llama-160m",
                tp: int = 1, kv_blocks: int | None = None, **kw: Any) -> Engine:
    """An engine around ``policy`` (bound to a context) with real cost model and a FixedOracle by default."""
    reqs = requests if requests is not None else make_requests()
    cost_of: Callable[[int], CostModel] = lambda t: make_cost(hardware, model, draft, t)  # noqa: E731
    cost = cost_of(tp)
    for pol in [policy] + [r.policy for r in policy.replicas() or []]:
        pol.bind(PolicyContext(hardware=cost.hardware, model=cost.model, draft=cost.draft, tp=tp, cost=cost,
                               rng=np.random.default_rng(0), block_size=16))
    eng = Engine(policy=policy, make_cost=cost_of, oracle=oracle or FixedOracle(), tp=tp, **reqs, **kw)
    if kv_blocks is not None:
        for r in eng.replicas:
            r.total_blocks = kv_blocks
            r._sync_view()
    return eng


def run(policy: Policy, requests: dict[str, np.ndarray] | None = None, **kw: Any) -> SimOutput:
    return make_engine(policy, requests, **kw).run()


@pytest.fixture
def fixed_oracle() -> FixedOracle:
    return FixedOracle()


def run_quick(exp: str, tmp: Path, *extra: str) -> runner.ExperimentResult:
    """Run experiment ``exp`` in quick mode into ``tmp/exp`` with two workers (the claims tests)."""
    overrides = [f"+exp={exp}", "quick=true", f"out_dir={tmp / exp}", "n_jobs=2", *extra]
    with runner.hydra_context():
        cfg = runner.compose_config(overrides)
    return runner.run_experiment(cfg, overrides)
