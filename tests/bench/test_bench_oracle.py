"""Token-oracle speed: the per-step queries the engine and tree policies make.

Run with ``pytest tests/bench/test_bench_oracle.py -m bench --benchmark-enable -n 0``. Targets: ``accept_chain`` for 64
requests with k = 4 in ≲ 30 µs (amortised over a decode run, chunk generation included); ``candidates_batch``
for 64 requests with depth 8 and width 4 in ≲ 2 ms. ``extra_info['ratio_to_reference']`` is the case's time over
the reference loop's (``bench_cases.py``), comparable with ``baseline.json``.
"""

from __future__ import annotations

import pytest
from bench_cases import CASES, DECODE_STEPS, ratio_info

pytestmark = pytest.mark.bench


def test_accept_chain_64_k4_warm(benchmark: pytest.FixtureRequest) -> None:
    case = CASES["oracle_accept_chain_64_k4_warm"]
    benchmark(case.run, *case.setup())  # type: ignore[operator]
    benchmark.extra_info.update(ratio_info(case))  # type: ignore[attr-defined]


def test_accept_chain_64_k4_decode_run(benchmark: pytest.FixtureRequest) -> None:
    """500 decode steps of 64 fresh requests advancing by accepted + 1 (chunks generated on the way)."""
    case = CASES["oracle_accept_chain_64_k4_decode_run"]
    benchmark.pedantic(case.run, setup=lambda: (case.setup(), {}), rounds=5)  # type: ignore[attr-defined]
    benchmark.extra_info["us_per_call"] = benchmark.stats.stats.mean / DECODE_STEPS * 1e6  # type: ignore[attr-defined]
    benchmark.extra_info.update(ratio_info(case))  # type: ignore[attr-defined]


def test_candidates_batch_64_d8_w4(benchmark: pytest.FixtureRequest) -> None:
    case = CASES["oracle_candidates_batch_64_d8_w4"]
    benchmark(case.run, *case.setup())  # type: ignore[operator]
    benchmark.extra_info.update(ratio_info(case))  # type: ignore[attr-defined]
