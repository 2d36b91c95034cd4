"""Token-oracle speed: the per-step queries the engine and tree policies make.

Run with ``pytest tests/bench/bench_oracle.py -m bench --benchmark-enable``. Targets: ``accept_chain`` for 64
requests with k = 4 in ≲ 30 µs (amortised over a decode run, chunk generation included); ``candidates_batch``
for 64 requests with depth 8 and width 4 in ≲ 2 ms.
"""

from __future__ import annotations

import numpy as np
import pytest

from repro.oracle import TokenOracle

pytestmark = pytest.mark.bench

N = 64


def make_oracle(num_requests: int = N) -> TokenOracle:
    return TokenOracle(0, np.full(num_requests, "sharegpt", dtype=object), {"sharegpt": 0.62})


def test_accept_chain_64_k4_warm(benchmark: pytest.FixtureRequest) -> None:
    oracle = make_oracle()
    rids, pos, k = np.arange(N), np.arange(N) * 3, np.full(N, 4)
    oracle.accept_chain(rids, pos, k)  # generate the chunks once
    benchmark(oracle.accept_chain, rids, pos, k)  # type: ignore[operator]


def test_accept_chain_64_k4_decode_run(benchmark: pytest.FixtureRequest) -> None:
    """500 decode steps of 64 fresh requests advancing by accepted + 1 (chunks generated on the way)."""
    steps = 500

    def setup() -> tuple[tuple[TokenOracle], dict[str, object]]:
        return (make_oracle(),), {}

    def run(oracle: TokenOracle) -> None:
        rids, pos, k = np.arange(N), np.zeros(N, dtype=np.int64), np.full(N, 4)
        for _ in range(steps):
            _, acc = oracle.accept_chain(rids, pos, k)
            pos += acc + 1

    benchmark.pedantic(run, setup=setup, rounds=5)  # type: ignore[attr-defined]
    benchmark.extra_info["us_per_call"] = benchmark.stats.stats.mean / steps * 1e6  # type: ignore[attr-defined]


def test_candidates_batch_64_d8_w4(benchmark: pytest.FixtureRequest) -> None:
    oracle = make_oracle()
    rids, pos = np.arange(N), np.arange(N) * 3
    oracle.candidates_batch(rids, pos, 8, 4)
    benchmark(oracle.candidates_batch, rids, pos, 8, 4)  # type: ignore[operator]
