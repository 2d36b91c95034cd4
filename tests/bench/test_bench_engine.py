"""Engine speed: 1,000 ShareGPT requests, Poisson 4 req/s, Llama-2-7B on one A100-80G.

Run with ``pytest tests/bench -m bench --benchmark-enable -n 0``. ``extra_info['sim_per_wall']`` is simulated seconds
per wall-clock second (the issue's targets: >= 200x with vllm, >= 100x with static_sd_k3, one process);
``extra_info['ratio_to_reference']`` is a run's CPU time over the reference loop's (``bench_cases.py``), timed
between the rounds.
"""

from __future__ import annotations

import time

import pytest
from bench_cases import CASES, Measurement, cpu_time_s, paired_ratio, ratio_info, reference_loop

pytestmark = pytest.mark.bench


@pytest.mark.parametrize("system", ["vllm", "static_sd_k3"])
def test_engine_speed(benchmark: pytest.FixtureRequest, system: str) -> None:
    case = CASES[f"engine_{system}_1000"]
    sim_s: list[float] = []
    wall_s: list[float] = []
    cpu_s: list[float] = []
    ref_s: list[float] = []

    def setup() -> tuple[tuple[object, ...], dict[str, object]]:
        args = case.setup()
        ref_s.append(cpu_time_s(reference_loop))  # reference, run, reference, ..., run, reference
        return args, {}

    def target(engine: object) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        out = case.run(engine)
        wall_s.append(time.perf_counter() - t0)
        cpu_s.append(time.process_time() - c0)
        sim_s.append(out.sim_time_s)  # type: ignore[attr-defined]

    reference_loop()
    benchmark.pedantic(target, setup=setup, rounds=3, iterations=1)  # type: ignore[attr-defined]
    ref_s.append(cpu_time_s(reference_loop))
    ratio = min(s / w for s, w in zip(sim_s, wall_s, strict=True))
    benchmark.extra_info["sim_s"] = sim_s[0]  # type: ignore[attr-defined]
    benchmark.extra_info["sim_per_wall"] = ratio  # type: ignore[attr-defined]
    m = Measurement(ratio=paired_ratio(cpu_s, ref_s), case_s=min(cpu_s), reference_s=min(ref_s))
    benchmark.extra_info.update(ratio_info(case, m))  # type: ignore[attr-defined]
    print(f"\n{system}: {sim_s[0]:.1f} simulated s, {min(wall_s):.3f} wall s best, {ratio:.0f}x real time (worst); "
          f"{m.ratio:.1f}x the reference loop")
