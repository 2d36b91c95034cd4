"""Point set-up speed: composing a sweep's points (issue 15: at most about 10 ms per point).

Run with ``pytest tests/bench -m bench --benchmark-enable -n 0``. ``extra_info['ms_per_point']`` is the runner's
composer (config groups composed once by Hydra, then each point's overrides applied and the config hashed);
``extra_info['hydra_ms_per_point']`` is a full Hydra composition per point, what the runner did before.
"""

from __future__ import annotations

import time

import pytest
from bench_cases import COMPOSE_EXP, compose_points, compose_setup

pytestmark = pytest.mark.bench


def test_compose_speed(benchmark: pytest.FixtureRequest) -> None:
    from repro.experiments.compose import compose_config, hydra_context
    from repro.experiments.results import config_hash

    composer, overrides = compose_setup()
    benchmark.pedantic(compose_points, args=(composer, overrides), rounds=5, iterations=1)  # type: ignore[attr-defined]
    per_point = benchmark.stats.stats.median / len(overrides)  # type: ignore[attr-defined]
    with hydra_context():
        t0 = time.perf_counter()
        for o in overrides[:6]:
            config_hash(compose_config(o))
        hydra = (time.perf_counter() - t0) / 6
    benchmark.extra_info.update(exp=COMPOSE_EXP, ms_per_point=per_point * 1e3,  # type: ignore[attr-defined]
                                hydra_ms_per_point=hydra * 1e3)
    assert per_point < hydra / 3
