"""TurboSpec's micro-benchmark claims (§4.1.2 Fig. 5, §6.1 Fig. 10, §6.2 Fig. 11) on the quick experiments, each
with its stated tolerance.

Claims the reproduction does not reach are reported in each experiment's summary.md; those with a test here are
strict xfails that state the reproduced value (Fig. 10's 7 tokens at batch 1, Fig. 11's offline gains). Not asserted:
speculation fully terminated at batch >= 16 in Fig. 10 (a mean proposed length of about 1-2 remains, with a speedup
within a few % of no speculation).
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
def fig9(quick_runs: QuickRuns) -> pd.DataFrame:
    return quick_runs.get("turbospec_fig9", DATA).points


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


# --- Fig. 9: speedup over no speculation vs batch size (H100, quick: batch 1 and 32, acceptance 0.5 and 0.9) --------


def _fig9(points: pd.DataFrame) -> pd.DataFrame:
    return points.pivot_table(index=["accept", "batch_size"], columns="system", values="speedup")


def test_fig9_speculation_pays_when_light_and_hurts_when_heavy(fig9: pd.DataFrame) -> None:
    # The field's central trade-off (Fig. 9a, acceptance 0.5): a memory-bound batch of 1 gains from k = 3 (asserted
    # > 1.2x) while at batch >= 16 "traditional speculative decoding methods show significant performance
    # deterioration": a batch of 32 verifies 4x the tokens of a decode step (under vLLM v0's batch expansion, 4x the
    # KV reads too) and static k = 3 falls below no speculation (asserted < 0.95x). At acceptance 0.9 k = 3 still pays
    # at batch 32, but less than at batch 1.
    wide = _fig9(fig9)
    assert wide.loc[(0.5, 1), "static_sd_k3"] > 1.2, wide
    assert wide.loc[(0.5, 32), "static_sd_k3"] < 0.95, wide
    assert 1.0 < wide.loc[(0.9, 32), "static_sd_k3"] < wide.loc[(0.9, 1), "static_sd_k3"], wide


def test_fig9_turbospec_backs_off_where_speculation_hurts(fig9: pd.DataFrame) -> None:
    # Paper: TurboSpec "maintains near-baseline efficiency (speedup ≈ 0.97)" where speculation hurts.
    # Tolerance: at acceptance 0.5 and batch 32 within 3 % of no speculation and at least 5 % above static k = 3;
    # a controller stuck at k = 3 (or one that never lowers k with the batch) fails here.
    wide = _fig9(fig9)
    assert wide.loc[(0.5, 32), "turbospec"] >= 0.97, wide
    assert wide.loc[(0.5, 32), "turbospec"] >= 1.05 * wide.loc[(0.5, 32), "static_sd_k3"], wide
    # ... and keeps most of the gain where speculation pays (batch 1: at least 0.9x static k = 3)
    assert (wide.xs(1, level="batch_size")["turbospec"] >= 0.9 * wide.xs(1, level="batch_size")["static_sd_k3"]).all()


# --- Fig. 10: TurboSpec's proposed length vs batch size -------------------------------------------------------------


def test_fig10_proposed_length_rises_with_acceptance(fig10: pd.DataFrame) -> None:
    wide = fig10.pivot_table(index=["gpu", "batch_size"], columns="accept", values="mean_proposed_len")
    # Paper: 3 tokens at acceptance 0.5 and 7 at 0.9 for the same batch size. Asserted: 0.9 proposes at least 1.5
    # tokens more than 0.5 at every GPU and batch size of the quick sweep (smallest gap 1.8, H100 batch 1; a
    # controller that ignores acceptance has a gap of 0), and H100 batch 1 at 0.5 within one token of 3.
    assert (wide[0.9] - wide[0.5] >= 1.5).all(), wide
    assert abs(wide.loc[("H100", 1), 0.5] - 3) <= 1.0, wide


@pytest.mark.xfail(strict=True, reason="H100 batch 1 at acceptance 0.9 proposes 5.5 tokens, not 7 +- 1: one "
                   "256-token request barely fills TurboSpec's acceptance window (it starts from 0.7), and the "
                   "engine's per-token speculation host cost trims the longest proposals; batch 8 proposes 6.8")
def test_fig10_seven_tokens_at_high_acceptance_batch_1(fig10: pd.DataFrame) -> None:
    wide = fig10.pivot_table(index=["gpu", "batch_size"], columns="accept", values="mean_proposed_len")
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


FIG11_BATCH_EXPANSION = (
    "offline throughput (1,000 requests at t = 0, batches of 100+) on vLLM v0's batch-expansion scorer: every "
    "proposed token re-reads its sequence's KV cache, so at these batches speculation pays only at acceptance 0.9 "
    "and short k (L40S k = 3: 1.13x; H100 1024/128 k = 3: 0.98x). The paper's Fig. 11 gains (up to ~2x on the L40S, "
    "1.1-1.5x on the H100) and its Fig. 2 k = 2 step (1.70x the plain step, batch expansion) are not both "
    "reproduced by one verification mechanism here; see docs/simulator.md, 'What the simulator models'")


@pytest.mark.xfail(strict=True, reason=FIG11_BATCH_EXPANSION)
def test_fig11_l40s_near_2x_at_high_acceptance_with_long_proposals(fig11: pd.DataFrame) -> None:
    wide = _speedup(fig11)
    top = wide.loc[("L40S 256/256", 0.9)]
    # Paper: up to nearly 2x at acceptance 0.9 (tolerance 0.3), larger proposed lengths generally better.
    assert abs(top["k=7"] - 2.0) <= 0.3, wide
    assert top["k=7"] > top["k=3"], wide


@pytest.mark.xfail(strict=True, reason=FIG11_BATCH_EXPANSION)
def test_fig11_h100_long_context_gains(fig11: pd.DataFrame) -> None:
    wide = _speedup(fig11)
    h100 = wide.loc[("H100 1024/128", 0.9)]
    # Paper: 1.1x-1.5x across configurations; asserted: above 1.1x for every speculating system at acceptance 0.9
    assert (h100[["k=3", "k=7", "turbospec"]] > 1.1).all(), wide


@pytest.mark.xfail(strict=True, reason=FIG11_BATCH_EXPANSION + " (TurboSpec backs off to 0.92x, not to 1x)")
def test_fig11_turbospec_never_below_no_speculation(fig11: pd.DataFrame) -> None:
    wide = _speedup(fig11)
    # TurboSpec keeps a throughput gain at every GPU and acceptance of the quick sweep
    assert (wide["turbospec"] > 1.0).all(), wide


def test_fig11_turbospec_backs_off_where_long_proposals_lose(fig11: pd.DataFrame) -> None:
    # Where k = 7 loses more than a third of no speculation's throughput (acceptance 0.5 on the L40S: 0.40x),
    # TurboSpec proposes short and keeps at least 0.85x, twice k = 7's (quick run: 0.92x); a controller stuck at a
    # long proposal fails here.
    wide = _speedup(fig11)
    lose = wide["k=7"] < 0.67
    assert lose.any(), wide
    assert (wide.loc[lose, "turbospec"] >= 0.85).all(), wide
    assert (wide.loc[lose, "turbospec"] >= 2 * wide.loc[lose, "k=7"]).all(), wide


@pytest.mark.xfail(strict=True, reason=FIG11_BATCH_EXPANSION + " (L40S acceptance 0.9: TurboSpec 1.00x against "
                   "k = 3's 1.13x)")
def test_fig11_turbospec_competitive_with_the_best_static_k(fig11: pd.DataFrame) -> None:
    wide = _speedup(fig11)
    static = wide[[c for c in wide.columns if c.startswith("k=")]].max(axis=1)
    # Paper: "competitive or superior"; tolerance: at least 0.9 of the best static k at every GPU and acceptance
    assert (wide["turbospec"] >= 0.9 * static).all(), wide


# --- Fig. 16a: the draft's memory (quick grid batch 1, 32) ------------------------------------------------------------


@pytest.fixture(scope="module")
def fig16(quick_runs: QuickRuns) -> pd.DataFrame:
    return quick_runs.get("turbospec_fig16", DATA).points


def test_fig16_draft_memory_grows_with_the_batch_and_not_with_k(fig16: pd.DataFrame) -> None:
    """The batch's footprint holds every request's KV at full length: the draft's own KV grows with the batch as the
    target's does, so its share rises (from its weights alone at batch 1); the proposal length changes neither."""
    share = fig16.pivot_table(index="batch_size", columns="system", values="draft_memory_share")
    assert share.loc[1].iloc[0] < share.loc[32].iloc[0] < 0.05
    assert (share.nunique(axis=1) == 1).all()
    gib = fig16.groupby("batch_size")["batch_memory_gib"].mean()
    assert gib[32] > gib[1] + 5  # 32 x 512 tokens of 7B KV (0.5 MiB a token) is 8 GiB
