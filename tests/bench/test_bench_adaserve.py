"""AdaServe's per-iteration selection speed next to the simulated iteration it plans.

Run with ``python -m pytest tests/bench/test_bench_adaserve.py -m bench --benchmark-enable -n 0 -s``. Setting: 64
decoding requests, B = 582 (H100, AdaServe Table 1), d = 8, w = 4 (Eq. 8–9 with D_max = 8, W_max = 4 at n = 64),
candidate trees from the token oracle built once in setup. Selection = ranking + SLO-customized + throughput-optimized
steps + TreeSpecs. ``extra_info`` reports the mean selection time beside the cost model's iteration (Llama-2-7B on an
H100, prompt 512 + 128 generated tokens per request: the beam search's 8 draft passes plus the 582-token verify pass),
and the selection's ratio to the reference loop (``bench_cases.py``), comparable with ``baseline.json``.
"""

from __future__ import annotations

import pytest
from bench_cases import ADASERVE_B, ADASERVE_D, ADASERVE_W, CASES, N, ratio_info

from repro.cost.model import CostModel
from repro.cost.spec import load_hardware, load_model
from systems.trees import estimate_step_s

pytestmark = pytest.mark.bench

CONTEXT = 512 + 128


def test_adaserve_selection_64_b582_d8_w4(benchmark: pytest.FixtureRequest) -> None:
    case = CASES["adaserve_selection_64_b582_d8_w4"]
    args = case.setup()
    trees = case.run(*args)
    assert N + sum(t.num_nodes for t in trees.values()) == ADASERVE_B  # type: ignore[attr-defined]
    benchmark(case.run, *args)  # type: ignore[operator]
    cost = CostModel(load_hardware("h100-80g"), load_model("llama2-7b"), tp=1, draft=load_model("llama-160m"))
    iteration_s = estimate_step_s(cost, N, float(N * CONTEXT), ADASERVE_D, ADASERVE_W, ADASERVE_B)
    mean_s = benchmark.stats.stats.mean  # type: ignore[attr-defined]
    benchmark.extra_info["selection_ms"] = mean_s * 1e3  # type: ignore[attr-defined]
    benchmark.extra_info["simulated_iteration_ms"] = iteration_s * 1e3  # type: ignore[attr-defined]
    benchmark.extra_info["selection_share_of_iteration"] = mean_s / iteration_s  # type: ignore[attr-defined]
    benchmark.extra_info.update(ratio_info(case))  # type: ignore[attr-defined]
    print(f"\nAdaServe selection: {mean_s * 1e3:.3f} ms per iteration; simulated iteration (Llama-2-7B, H100, "
          f"n=64, B=582, d=8, w=4): {iteration_s * 1e3:.2f} ms ({mean_s / iteration_s:.1%})")
