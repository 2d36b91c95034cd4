"""TurboSpec's micro-benchmark claims (§4.1.2 Fig. 5, §6.1 Fig. 10, §6.2 Fig. 11) on the quick experiments, each
with its stated tolerance.

Claims the reproduction does not reach (batch 64 peaking at k = 3 rather than 1-2 in the full Fig. 5 sweep,
speculation never switched off at large batches in Fig. 10, the H100's upper end in Fig. 11) are reported in each
experiment's summary.md, not asserted here.
"""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import QuickRuns

pytestmark = pytest.mark.slow
# Fixed-length workloads (batch_size requests of fixed prompt/output lengths): no data file is read, so the numbers
# are the same with and without the data folder; pinned to "none".
DATA = "none"


@pytest.fixture(scope="module")
def fig5(quick_runs: QuickRuns) -> pd.DataFrame:
    return quick_runs.get("turbospec_fig5", DATA).points


@pytest.fixture(scope="module")
def fig10(quick_runs: QuickRuns) -> pd.DataFrame:
    return quick_runs.get("turbospec_fig10", DATA).points


@pytest.fixture(scope="module")
def fig11(quick_runs: QuickRuns) -> pd.DataFrame:
    return quick_runs.get("turbospec_fig11", DATA).points


def _goodput_by_k(points: pd.DataFrame, **where: float) -> pd.Series:
    rows = points
    for key, value in where.items():
        rows = rows[rows[key] == value]
    return rows.groupby("k")["norm_goodput"].mean()


# --- Fig. 5: normalized goodput vs proposed length (quick grid k = 1, 2, 4, 6) -------------------------------------


def test_fig5_small_batches_propose_more_than_large_batches(fig5: pd.DataFrame) -> None:
    bs1 = _goodput_by_k(fig5, batch_size=1, accept=0.7)
    bs64 = _goodput_by_k(fig5, batch_size=64, accept=0.7)
    # Paper: BS = 1 peaks at k = 4-5, BS = 64 at k = 1-2. Tolerance: one step of the quick grid (4-6 and <= 3;
    # the full sweep's batch 64 peaks at k = 3, 0.3 % above k = 2).
    assert 4 <= bs1.idxmax() <= 6, bs1
    assert bs64.idxmax() <= 3, bs64
    assert bs1.idxmax() > bs64.idxmax(), (bs1, bs64)
    # the large batch loses more to long proposals: at k = 6 it is below the small batch's normalized goodput
    assert bs64.loc[6] < bs1.loc[6] - 0.05, (bs1, bs64)


def test_fig5_accurate_batches_propose_more(fig5: pd.DataFrame) -> None:
    low = _goodput_by_k(fig5, batch_size=16, accept=0.3)
    high = _goodput_by_k(fig5, batch_size=16, accept=0.9)
    # Paper: acceptance 0.9 sustains goodput with longer proposals, 0.3 does better with short ones.
    assert high.idxmax() > low.idxmax(), (low, high)
    assert low.idxmax() <= 2, low
    # at the longest quick k, 0.9 keeps >= 0.9 of its best goodput while 0.3 has lost > 20 % (tolerance 0.1)
    assert high.loc[6] >= 0.9 and low.loc[6] <= 0.8, (low, high)


# --- Fig. 10: TurboSpec's proposed length vs batch size -------------------------------------------------------------


def test_fig10_proposed_length_rises_with_acceptance(fig10: pd.DataFrame) -> None:
    wide = fig10.pivot_table(index=["gpu", "batch_size"], columns="accept", values="mean_proposed_len")
    # Paper: 3 tokens at acceptance 0.5 and 7 at 0.9 for the same batch size; the gap is at least 2 tokens at every
    # GPU and batch size of the quick sweep.
    assert (wide[0.9] - wide[0.5] >= 2.0).all(), wide
    # H100, batch 1: 3 and 7 within one token (the L40S's 4.5 at acceptance 0.5 differs, see summary.md)
    assert abs(wide.loc[("H100", 1), 0.5] - 3) <= 1.0, wide
    assert abs(wide.loc[("H100", 1), 0.9] - 7) <= 1.0, wide


def test_fig10_proposed_length_falls_with_batch_size(fig10: pd.DataFrame) -> None:
    # Paper: inverse relationship between batch size and proposed length. At acceptance 0.5 the proposed length
    # falls monotonically from batch 1 to 64 on both GPUs; at 0.9 the largest batch proposes no more than batch 1.
    for gpu in ("H100", "L40S"):
        for acc, strict in ((0.5, True), (0.9, False)):
            s = fig10[(fig10["gpu"] == gpu) & (fig10["accept"] == acc)].set_index("batch_size")["mean_proposed_len"]
            s = s.sort_index()
            if strict:
                assert s.is_monotonic_decreasing and s.iloc[-1] < s.iloc[0] - 0.5, (gpu, acc, s)
            else:
                assert s.iloc[-1] <= s.iloc[0], (gpu, acc, s)


# --- Fig. 11: offline throughput over no speculation ----------------------------------------------------------------


def _speedup(points: pd.DataFrame) -> pd.DataFrame:
    return points.pivot_table(index=["gpu", "accept"], columns="system", values="speedup")


def test_fig11_l40s_near_2x_at_high_acceptance_with_long_proposals(fig11: pd.DataFrame) -> None:
    wide = _speedup(fig11)
    top = wide.loc[("L40S 256/256", 0.9)]
    # Paper: up to nearly 2x at acceptance 0.9 (tolerance 0.3), larger proposed lengths generally better.
    assert abs(top["k=7"] - 2.0) <= 0.3, wide
    assert top["k=7"] > top["k=3"], wide


def test_fig11_h100_long_context_gains(fig11: pd.DataFrame) -> None:
    wide = _speedup(fig11)
    h100 = wide.loc[("H100 1024/128", 0.9)]
    # Paper: 1.1x-1.5x across configurations; reproduced: above 1.1x for every speculating system (the upper end
    # reaches about 1.8x at acceptance 0.9, see summary.md)
    assert (h100[["k=3", "k=7", "turbospec"]] > 1.1).all(), wide


def test_fig11_turbospec_never_below_no_speculation(fig11: pd.DataFrame) -> None:
    wide = _speedup(fig11)
    # TurboSpec keeps a throughput gain at every GPU and acceptance of the quick sweep
    assert (wide["turbospec"] > 1.0).all(), wide


def test_fig11_turbospec_competitive_with_the_best_static_k(fig11: pd.DataFrame) -> None:
    wide = _speedup(fig11)
    static = wide[[c for c in wide.columns if c.startswith("k=")]].max(axis=1)
    # Paper: "competitive or superior"; tolerance: at least 0.9 of the best static k at every GPU and acceptance
    assert (wide["turbospec"] >= 0.9 * static).all(), wide
