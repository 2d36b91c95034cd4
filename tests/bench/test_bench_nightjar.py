"""Nightjar's arm selection speed (§4.2: "approximately 1e-5 seconds, while the average generation time per token
is 0.034 seconds").

Run with ``python -m pytest tests/bench/test_bench_nightjar.py -m bench --benchmark-enable -n 0 -s``. One decision =
Algorithm 1's select (bin type, uniform draw or Eq. 3 over Γ_max + 1 = 6 arms with the switching term) plus the
reward update, for batch sizes cycling over 1..64 after 10,000 warm-up steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from systems.nightjar import AdaBinGreedy, switch_costs

pytestmark = pytest.mark.bench


def test_nightjar_arm_selection(benchmark: pytest.FixtureRequest) -> None:
    sel = AdaBinGreedy(6)
    rng = np.random.default_rng(0)
    rewards = rng.uniform(500.0, 3000.0, size=(64, 6))
    for t in range(10_000):
        b = 1 + t % 64
        arm, _ = sel.select(b, rng, switch_costs(6, t % 2, 0.01))
        sel.update(b, arm, float(rewards[b - 1, arm]))
    state = {"t": 0}

    def decide() -> int:
        t = state["t"] = state["t"] + 1
        b = 1 + t % 64
        arm, _ = sel.select(b, rng, switch_costs(6, t % 2, 0.01))
        sel.update(b, arm, float(rewards[b - 1, arm]))
        return arm

    benchmark(decide)  # type: ignore[operator]
    mean_s = benchmark.stats.stats.mean  # type: ignore[attr-defined]
    benchmark.extra_info["decision_us"] = mean_s * 1e6  # type: ignore[attr-defined]
    print(f"\nNightjar arm selection + update: {mean_s * 1e6:.1f} µs per step (paper: ≈ 10 µs)")
