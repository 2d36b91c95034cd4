"""Speed regressions: each CI benchmark case, as a ratio to the reference loop measured beside it, against the
committed ``baseline.json``; a slowdown beyond ``bench_cases.FACTOR`` fails.

Runs in the default selection (not marked ``bench``): ~10 s on the 2-core dev machine, more where a case is
re-measured. After a deliberate speed change, rewrite the baseline with ``python scripts/bench_baseline.py`` on a
quiet machine and commit it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from bench_cases import (
    CI_CASES,
    FACTOR,
    TABLE_HEADER,
    Case,
    _run_compiled,
    load_baseline,
    measure_for_check,
    table_row,
)


@pytest.fixture(scope="module")
def baseline() -> dict[str, Any]:
    return load_baseline()


@pytest.mark.parametrize("case", CI_CASES, ids=[c.name for c in CI_CASES])
def test_no_speed_regression(case: Case, baseline: dict[str, Any]) -> None:
    ratios = baseline["ratios"]
    assert case.name in ratios, f"{case.name} has no baseline: run python scripts/bench_baseline.py"
    if (case.compiled or case.run is _run_compiled) and importlib.util.find_spec("numba") is None:
        pytest.skip("Numba is not installed: the compiled path runs on NumPy here")
    m = measure_for_check(case, ratios[case.name])
    slowdown = m.ratio / ratios[case.name]
    assert slowdown <= FACTOR, (
        f"{case.name} is {slowdown:.2f}x slower than its baseline (limit {FACTOR}x; {case.doc})\n"
        f"{TABLE_HEADER}\n{table_row(case.name, ratios[case.name], m.ratio)}\n"
        f"case {m.case_s * 1e3:.3f} ms per call, reference loop {m.reference_s * 1e3:.2f} ms "
        f"(baseline: {baseline['provenance']['machine']}, {baseline['provenance']['date']})"
    )


def test_baseline_lists_the_ci_cases(baseline: dict[str, Any]) -> None:
    assert sorted(baseline["ratios"]) == sorted(c.name for c in CI_CASES), \
        "CI cases and baseline.json differ: run python scripts/bench_baseline.py"
