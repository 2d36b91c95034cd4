"""AdaServe's qualitative claims on the quick experiments, each with its stated tolerance.

Quantitative claims the reproduction does not reach (the 1.63-1.74x ratios, EqualGreedy/GlobalGreedy in Fig. 8)
are reported in each experiment's summary.md and in docs/papers/adaserve.md, not asserted here.
"""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import QuickRuns

pytestmark = pytest.mark.slow
BASELINES = ["vllm", "sarathi", "specinfer", "incr_dec"]


# Every claim is checked on the real files (Alpaca, ArXiv, the Azure trace; skipped without them) and on the
# embedded statistics (the `data` fixture of conftest): it must hold on both.


@pytest.fixture(scope="module")
def fig4(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("adaserve_fig4", data).points


def _wide(points: pd.DataFrame, keys: list[str], metric: str = "slo_attainment") -> pd.DataFrame:
    return points.pivot_table(index=keys, columns="system", values=metric, aggfunc="mean")


def test_fig4_adaserve_at_least_every_baseline_at_every_rate(fig4: pd.DataFrame) -> None:
    # tolerance: 0.02 of attainment (80 requests per quick point: one request is 0.0125)
    wide = _wide(fig4, ["model", "rps"])
    for base in BASELINES:
        assert (wide["adaserve"] >= wide[base] - 0.02).all(), f"adaserve below {base}:\n{wide}"


def test_fig4_ratio_to_best_baseline_at_highest_rate(fig4: pd.DataFrame) -> None:
    # Paper: up to 1.63x on Llama-2-7b. Band: AdaServe leads the best baseline by at least 5 % and by no more than
    # 1.5x the paper's ratio (the quick run gives 1.2-1.4x; the full run's maximum lead is 1.59x, see summary.md).
    wide = _wide(fig4[fig4["model"] == "Llama-2-7b"], ["rps"])
    top = wide.loc[wide.index.max()]
    ratio = top["adaserve"] / top[BASELINES].max()
    assert 1.05 <= ratio <= 1.63 * 1.5, wide


def test_fig4_specinfer_falls_behind_as_the_rate_rises(fig4: pd.DataFrame) -> None:
    # Paper: SpecInfer's fixed 20-node trees cost "higher verification latency" at large batches and its attainment
    # collapses at high rates, while AdaServe sizes its trees to the load. Asserted on Llama-2-7b (quick rates 2 and
    # 5): AdaServe's lead over SpecInfer grows by at least 5 % of SpecInfer's attainment from the lowest rate to the
    # highest, and SpecInfer loses more attainment over that range than AdaServe does. A SpecInfer whose tree
    # shrinks with the load, or verification that costs the same at any batch, fails here.
    wide = _wide(fig4[fig4["model"] == "Llama-2-7b"], ["rps"])
    lead = wide["adaserve"] / wide["specinfer"]
    low, high = wide.index.min(), wide.index.max()
    assert lead[high] >= lead[low] + 0.05, wide
    drop = wide.loc[low] - wide.loc[high]
    assert drop["specinfer"] > drop["adaserve"], wide


def test_fig6_adaserve_near_full_attainment_across_stringent_proportions(quick_runs: QuickRuns, data: str) -> None:
    # Paper: "nearly 100 %" across proportions; tolerance: >= 0.9 at every proportion of the quick sweep.
    pts = quick_runs.get("adaserve_fig6", data).points
    wide = _wide(pts, ["model", "urgent_fraction"])
    assert (wide["adaserve"] >= 0.9).all(), wide
    assert (wide["adaserve"] >= wide[["vllm", "incr_dec", "specinfer"]].max(axis=1) - 0.02).all(), wide


def test_fig7_adaserve_beats_slo_aware_batching(quick_runs: QuickRuns, data: str) -> None:
    pts = quick_runs.get("adaserve_fig7", data).points
    wide = _wide(pts, ["rps"])
    assert (wide["adaserve"] >= wide[["fcfs_slo", "stta", "seppipe"]].max(axis=1)).all(), wide


def test_fig8_selection_keeps_the_acceptance_of_global_greedy(quick_runs: QuickRuns, data: str) -> None:
    # AdaServe selects, per request, its most probable candidate nodes (SLO step) and then the globally most probable
    # ones: its tokens accepted per step can trail GlobalGreedy's (which maximizes Σ f(v) alone) only a little.
    # Tolerance: ≥ 0.97x GlobalGreedy's mean accepted length and ≥ EqualGreedy's at every quick point. A selection
    # that spreads the budget at random, or ignores path probabilities, falls below.
    pts = quick_runs.get("adaserve_fig8", data).points
    wide = _wide(pts, ["rps"], "mean_accepted_len")
    assert (wide["adaserve"] >= 0.97 * wide["global_greedy"]).all(), wide
    assert (wide["adaserve"] >= wide["equal_greedy"]).all(), wide


def test_fig10_attains_stricter_than_baseline_slos(quick_runs: QuickRuns, data: str) -> None:
    # Paper: 95 % at 0.8x the baseline latency (tolerance 0.1), where incremental decoding attains nothing.
    pts = quick_runs.get("adaserve_fig10", data).points
    wide = _wide(pts, ["slo_x_baseline"])
    assert wide.loc[0.8, "adaserve"] >= 0.85, wide
    assert wide.loc[0.8, "vllm"] <= 0.1, wide
