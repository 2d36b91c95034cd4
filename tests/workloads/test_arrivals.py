"""Arrival processes: rates, burstiness, piecewise segments, trace replay and rescaling."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.arrivals import gamma_arrivals, piecewise_arrivals, poisson_arrivals, replay_trace


@pytest.mark.parametrize("rate", [0.5, 4.0, 48.0])
def test_poisson_mean_rate(rate: float) -> None:
    t = poisson_arrivals(20_000, rate, np.random.default_rng(1))
    assert np.all(np.diff(t) >= 0)
    assert len(t) / t[-1] == pytest.approx(rate, rel=0.03)


def test_gamma_rate_and_cv() -> None:
    t = gamma_arrivals(20_000, 2.0, 3.0, np.random.default_rng(2))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert len(t) / t[-1] == pytest.approx(2.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


def test_piecewise_rates_per_segment() -> None:
    # TurboSpec §6: QPS 1 -> 16 -> 48, 40 s each.
    segs = [(40.0, 1.0), (40.0, 16.0), (40.0, 48.0)]
    counts = np.zeros(3)
    for s in range(20):
        t = piecewise_arrivals(segs, np.random.default_rng(s))
        assert np.all(np.diff(t) >= 0) and t[-1] < 120.0
        counts += np.histogram(t, bins=[0, 40, 80, 120])[0]
    rates = counts / 20 / 40.0
    np.testing.assert_allclose(rates, [1.0, 16.0, 48.0], rtol=0.1)


def test_piecewise_cap() -> None:
    t = piecewise_arrivals([(10.0, 10.0)], np.random.default_rng(0), num_requests=5)
    assert len(t) == 5


def test_trace_rescaling_hits_target_rate() -> None:
    ts = np.cumsum(np.random.default_rng(3).exponential(0.2, 5000))  # ~5 req/s
    t, idx = replay_trace(ts, 1000, target_rate_per_s=2.0)
    assert (len(t) - 1) / (t[-1] - t[0]) == pytest.approx(2.0, rel=1e-9)
    np.testing.assert_array_equal(idx, np.arange(1000))
    # rescaling preserves the shape: gaps are proportional to the original ones
    np.testing.assert_allclose(np.diff(t) / np.diff(ts[:1000]), np.diff(t)[0] / np.diff(ts[:2])[0])


def test_trace_window_and_cycling() -> None:
    ts = np.arange(100, dtype=float)  # one per second
    t, idx = replay_trace(ts, 30, start_s=10.0, window_s=10.0)
    assert idx[0] == 10 and idx[9] == 19 and idx[10] == 10  # the window repeats
    np.testing.assert_allclose(t[:12], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    with pytest.raises(ValueError, match="holds no arrivals"):
        replay_trace(ts, 5, start_s=500.0)
