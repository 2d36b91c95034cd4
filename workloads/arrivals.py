"""Arrival processes: Poisson, Gamma (bursty), piecewise-rate schedules and trace replay with rescaling.

All functions are vectorized, take an explicit ``numpy.random.Generator`` where they are random, and return arrival
times in seconds from 0, sorted ascending (float64).

- Poisson(rate): i.i.d. exponential inter-arrivals (vLLM ``benchmark_serving --request-rate``).
- Gamma(rate, cv): i.i.d. Gamma inter-arrivals with shape ``1/cv²`` and mean ``1/rate`` (vLLM's ``--burstiness`` is
  ``1/cv²``); cv = 1 is Poisson, cv > 1 is burstier.
- Piecewise schedule: a Poisson process whose rate is constant on consecutive segments ``(duration_s, rate)``, e.g.
  TurboSpec §6 (QPS 1 → 16 → 48 for 40 s each).
- Trace replay: real timestamps (Azure 2023 conv/code = the SplitWise trace, Mooncake, AdaServe artifact, or any
  array), optionally restricted to a window ``[start_s, start_s + window_s)`` (Nightjar's dynamic segment of the
  Azure trace) and rescaled by a constant time factor so that the mean rate hits a target (AdaServe §6.1: "we adjust
  the arrival rate"). Rescaling preserves the trace's burst shape (inter-arrival ratios).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def poisson_arrivals(num_requests: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """``num_requests`` Poisson arrivals at ``rate_per_s`` (first arrival after one exponential gap)."""
    _check_rate(rate_per_s)
    return np.cumsum(rng.exponential(1.0 / rate_per_s, size=num_requests))


def gamma_arrivals(num_requests: int, rate_per_s: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Arrivals with Gamma inter-arrivals of mean ``1/rate_per_s`` and coefficient of variation ``cv``."""
    _check_rate(rate_per_s)
    if cv <= 0:
        raise ValueError(f"gamma arrivals need cv > 0, got {cv}")
    shape = 1.0 / cv**2
    return np.cumsum(rng.gamma(shape, 1.0 / (rate_per_s * shape), size=num_requests))


def piecewise_arrivals(
    segments: Sequence[tuple[float, float]], rng: np.random.Generator, num_requests: int | None = None
) -> np.ndarray:
    """Poisson arrivals with rate ``rate`` during each consecutive ``(duration_s, rate)`` segment.

    The schedule defines the run: all arrivals inside the total duration are returned, capped at the first
    ``num_requests`` when given (so the result may hold fewer than ``num_requests``). A segment with rate
    0 is idle.
    """
    out: list[np.ndarray] = []
    start = 0.0
    for duration_s, rate in segments:
        if duration_s <= 0 or rate < 0:
            raise ValueError(
                f"piecewise segment needs duration_s > 0 and rate >= 0, got ({duration_s}, {rate})"
            )
        # Given the count, Poisson arrivals in an interval are i.i.d. uniform order statistics.
        count = rng.poisson(rate * duration_s)
        out.append(start + np.sort(rng.uniform(0.0, duration_s, size=count)))
        start += duration_s
    times = np.concatenate(out) if out else np.zeros(0)
    return times if num_requests is None else times[:num_requests]


def replay_trace(
    timestamps_s: np.ndarray,
    num_requests: int,
    *,
    target_rate_per_s: float | None = None,
    start_s: float = 0.0,
    window_s: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Replay trace timestamps; return ``(arrival_s, record_index)``.

    Steps: sort; shift so the trace starts at 0; keep ``[start_s, start_s + window_s)`` and shift it to
    0; scale
    take the first ``num_requests`` records; scale time by ``observed_rate / target_rate_per_s`` where
    ``observed_rate = (count - 1) / (t_last - t_first)`` of the replayed records, so the replayed run's
    mean rate
    is the target. When the window holds fewer records than requested, the window is
    repeated back to back (period = window length, or the span plus one mean gap), so a short trace can
    drive a
    long run. ``record_index`` indexes the input array (to align the trace's lengths/SLOs with the arrivals).
    """
    ts = np.asarray(timestamps_s, dtype=np.float64)
    order = np.argsort(ts, kind="stable")
    t = ts[order] - ts[order[0]]
    hi = np.inf if window_s is None else start_s + window_s
    keep = (t >= start_s) & (t < hi)
    if not keep.any():
        raise ValueError(f"trace window [{start_s}, {hi}) s holds no arrivals (trace spans {t[-1]:.1f} s)")
    t, idx = t[keep] - start_s, order[keep]
    span = float(t[-1] - t[0])
    mean_gap = span / (len(t) - 1) if len(t) > 1 and span > 0 else 1.0
    period = window_s if window_s is not None else span + mean_gap
    reps = -(-num_requests // len(t))
    t = (t[None, :] + period * np.arange(reps)[:, None]).ravel()[:num_requests]
    idx = np.tile(idx, reps)[:num_requests]
    if target_rate_per_s is not None:
        _check_rate(target_rate_per_s)
        t = t - t[0]
        if len(t) > 1 and t[-1] > 0:
            t = t * ((len(t) - 1) / t[-1] / target_rate_per_s)
    return t, idx


def _check_rate(rate_per_s: float) -> None:
    if not rate_per_s > 0:
        raise ValueError(f"arrival rate must be > 0 req/s, got {rate_per_s}")
