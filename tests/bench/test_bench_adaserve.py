"""AdaServe's per-iteration selection speed next to the simulated iteration it plans.

Run with ``python -m pytest tests/bench/test_bench_adaserve.py -m bench --benchmark-enable -s``. Setting: 64 decoding
requests, B = 582 (H100, AdaServe Table 1), d = 8, w = 4 (Eq. 8–9 with D_max = 8, W_max = 4 at n = 64), candidate
trees from the token oracle built once in setup. Selection = ranking + SLO-customized + throughput-optimized steps +
TreeSpecs. ``extra_info`` reports the mean selection time beside the cost model's iteration (Llama-2-7B on an H100,
prompt 512 + 128 generated tokens per request: the beam search's 8 draft passes plus the 582-token verify pass).
"""

from __future__ import annotations

import numpy as np
import pytest

from repro.cost.model import CostModel
from repro.cost.spec import load_hardware, load_model
from repro.oracle import TokenOracle
from systems.trees import estimate_step_s, rank_nodes, select_global, select_slo_customized, tree_specs

pytestmark = pytest.mark.bench

N, B, D, W = 64, 582, 8, 4
CONTEXT = 512 + 128


def select(cands: list, target: np.ndarray, key: np.ndarray) -> dict:
    ranked = rank_nodes(cands)
    spare = B - N
    counts = select_slo_customized(ranked, target, key, order="descending", n_max=8, budget=spare)
    counts = select_global(ranked, counts, spare - int(counts.sum()))
    return tree_specs(ranked, counts)


def test_adaserve_selection_64_b582_d8_w4(benchmark: pytest.FixtureRequest) -> None:
    oracle = TokenOracle(0, np.full(N, "alpaca", dtype=object), {"alpaca": 0.62})
    cands = oracle.candidates_batch(np.arange(N), np.arange(N) * 5, D, W)
    rng = np.random.default_rng(0)
    key = rng.uniform(-2.0, 6.0, N)  # A(r): a mix of lagging and comfortable requests
    target = np.minimum(key, D + 1.0) - 1.0
    trees = select(cands, target, key)
    assert N + sum(t.num_nodes for t in trees.values()) == B
    benchmark(select, cands, target, key)  # type: ignore[operator]
    cost = CostModel(load_hardware("h100-80g"), load_model("llama2-7b"), tp=1, draft=load_model("llama-160m"))
    iteration_s = estimate_step_s(cost, N, float(N * CONTEXT), D, W, B)
    mean_s = benchmark.stats.stats.mean  # type: ignore[attr-defined]
    benchmark.extra_info["selection_ms"] = mean_s * 1e3  # type: ignore[attr-defined]
    benchmark.extra_info["simulated_iteration_ms"] = iteration_s * 1e3  # type: ignore[attr-defined]
    benchmark.extra_info["selection_share_of_iteration"] = mean_s / iteration_s  # type: ignore[attr-defined]
    print(f"\nAdaServe selection: {mean_s * 1e3:.3f} ms per iteration; simulated iteration (Llama-2-7B, H100, "
          f"n=64, B=582, d=8, w=4): {iteration_s * 1e3:.2f} ms ({mean_s / iteration_s:.1%})")
