"""LAPS-SD's claims (§3 Figs. 2-3, §5.2 Figs. 5-7) on the quick experiments, each with its stated tolerance.

Claims the reproduction does not reach are reported in each experiment's summary.md; those with a test here are
strict xfails that state the reproduced value: LAPS-SD does not beat LP-SJF (Fig. 5), K beyond 4 changes nothing
(Fig. 6), the switching ratio at 500 tokens and the estimation error are several times the paper's (Figs. 2, 7).
"""

from __future__ import annotations

import pandas as pd
import pytest

from repro import runner
from tests.conftest import QuickRuns

pytestmark = pytest.mark.slow


# Data modes (the `data` fixture of conftest): MBPP is a real file (skipped without it) or its embedded table;
# Chatbot Instruction Prompts and MiniThinky have assumed lengths in both modes.


@pytest.fixture(scope="module")
def fig5(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("laps_fig5", data).points


@pytest.fixture(scope="module")
def fig6(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("laps_fig6", data).points


@pytest.fixture(scope="module")
def fig7(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("laps_fig7", data).points


@pytest.fixture(scope="module")
def fig2(quick_runs: QuickRuns) -> pd.DataFrame:
    return quick_runs.get("laps_fig2", "none").points  # Chatbot's assumed prompts in both modes: pinned to none


@pytest.fixture(scope="module")
def fig3(quick_runs: QuickRuns) -> runner.ExperimentResult:
    return quick_runs.get("laps_fig3", "none")


def _by_dataset(points: pd.DataFrame, metric: str = "mean_latency_s") -> pd.DataFrame:
    """Mean over request counts (and seeds) of ``metric``, one row per dataset, one column per system."""
    return points.pivot_table(index="dataset", columns="system", values=metric, aggfunc="mean")


# --- Fig. 5: average latency vs number of requests ----------------------------------------------------------------


def test_fig5_laps_sd_beats_las_and_fcfs(fig5: pd.DataFrame) -> None:
    # Paper: LAPS-SD always outperforms the others; LAS about 1.45x its latency (31 % lower). Tolerance: per
    # dataset, averaged over the quick run's 10 and 30 requests, LAPS-SD below FCFS's latency (quick run: 0.62-0.94x;
    # FCFS can win a single small MBPP point without the file) and at most 0.8x LAS's (0.35-0.67x).
    wide = _by_dataset(fig5)
    assert (wide["laps_sd"] < wide["fcfs"]).all(), wide
    assert (wide["laps_sd"] <= 0.8 * wide["las"]).all(), wide


def test_fig5_mbpp_is_the_fastest_dataset(fig5: pd.DataFrame) -> None:
    # Paper: MBPP's latency is "significantly shorter" than the other two datasets' (higher acceptance; its outputs
    # are also short). Tolerance: below both for every scheduler.
    wide = _by_dataset(fig5)
    assert (wide.loc["MBPP"] < wide.drop(index="MBPP").min()).all(), wide


@pytest.mark.xfail(strict=True, reason="LP-SJF with the same length predictor (log-normal σ = 0.25) is faster than "
                   "LAPS-SD on every dataset (quick run: LAPS-SD 1.06-1.33x LP-SJF's latency; paper: LP-SJF 1.47x "
                   "slower): output lengths spread far more than acceptance does, so the predicted length orders the "
                   "requests nearly as well as Eq. 6, and LAPS-SD pays its multi-level-queue phase first (full run: "
                   "1.05-1.36x)")
def test_fig5_laps_sd_beats_lp_sjf(fig5: pd.DataFrame) -> None:
    wide = _by_dataset(fig5)
    assert (wide["laps_sd"] < wide["lp_sjf"]).all(), wide


# --- Fig. 6: number of priority queues ------------------------------------------------------------------------------


def test_fig6_latency_first_falls_with_more_queues(fig6: pd.DataFrame) -> None:
    # Paper: the latency first decreases as K grows (more queues approximate SJF). Tolerance: K = 4 at most 0.9x
    # K = 2 for every dataset and request count (quick run: 0.48-0.85x).
    wide = fig6.pivot_table(index=["dataset", "num_requests"], columns="num_queues", values="mean_latency_s")
    assert (wide[4] <= 0.9 * wide[2]).all(), wide


@pytest.mark.xfail(strict=True, reason="K beyond 4 changes nothing here: every request becomes perceptible (γ = 5 "
                   "steady rounds, ≈ 10-20 rounds in) before its attained service reaches S_4 = 1 s, and a perceptible "
                   "request's queue is monotone in its estimate, so more queues only re-label the same SJF order; the "
                   "paper's latency rises again past K = 4-6 (switching overhead)")
def test_fig6_latency_rises_again_with_many_queues(fig6: pd.DataFrame) -> None:
    wide = fig6.pivot_table(index=["dataset", "num_requests"], columns="num_queues", values="mean_latency_s")
    assert (wide[10] > wide[[4, 6]].min(axis=1)).any(), wide


# --- Fig. 2: switching cost ------------------------------------------------------------------------------------------


def test_fig2_switching_cost_grows_with_output_length(fig2: pd.DataFrame) -> None:
    # Paper: the ratio of switching costs to inference time grows with the output length. LAPS-SD switches only
    # non-perceptible requests, whose KV is small: negligible. Tolerance: LAS's ratio at 500 tokens at least 2x its
    # ratio at 100 (quick run: 3.6x); LAPS-SD's below 1 % everywhere (quick run: at most 0.23 %).
    wide = fig2.pivot_table(index="output_len", columns="system", values="switch_overhead")
    assert wide.loc[500, "las"] >= 2 * wide.loc[100, "las"], wide
    assert (wide["laps_sd"] < 0.01).all(), wide


@pytest.mark.xfail(strict=True, reason="LAS switching after every round moves the KV (0.5 MiB a token) out and back "
                   "over a 25 GB/s host link each ≈ 30 ms round: 45 % of the inference time at 500 tokens, against "
                   "the paper's 14.21 %, whose switching frequency is not stated")
def test_fig2_switching_ratio_at_500_tokens(fig2: pd.DataFrame) -> None:
    las = fig2[(fig2["system"] == "las") & (fig2["output_len"] == 500)]["switch_overhead"].iloc[0]
    assert las == pytest.approx(0.1421, rel=0.25)


# --- Fig. 3: acceptance rate over decoding progress ------------------------------------------------------------------


def test_fig3_acceptance_unstable_early_stable_later(fig3: runner.ExperimentResult) -> None:
    # Paper: the acceptance rate is unstable early and stable after ~150 tokens. Tolerance: per request, the range
    # of its running acceptance rate over tokens 150-400 at most 0.15 and at most 0.6x its range over tokens 5-150
    # (quick run: 0.03-0.12 against 0.16-0.80).
    rounds = pd.read_parquet(fig3.out_dir / "rounds.parquet")
    rounds = rounds.assign(rate=rounds["num_accepted"] / rounds["num_proposed"])
    for (_, rid), r in rounds.groupby(["dataset", "rid"]):
        early = r[(r["num_generated"] >= 5) & (r["num_generated"] < 150)]["rate"]
        late = r[r["num_generated"] >= 150]["rate"]
        spread_late, spread_early = late.max() - late.min(), early.max() - early.min()
        assert spread_late <= 0.15 and spread_late <= 0.6 * spread_early, (rid, spread_early, spread_late)


# --- Fig. 7: execution-time estimation -------------------------------------------------------------------------------


def test_fig7_length_prediction_and_acceptance_both_add_error(fig7: pd.DataFrame) -> None:
    # Paper: the estimate combines the predicted length and the predicted acceptance. Tolerance: with a perfect
    # length predictor the error is lower on every dataset (quick run: 0.26-0.31 against 0.33-0.46); most requests
    # get an estimate (at least 80 %). Not asserted: MBPP's error the largest (the full run's largest is MiniThinky's).
    wide = _by_dataset(fig7, "mean_estimate_error")
    assert (wide["laps_sd_exact_length"] < wide["laps_sd"]).all(), wide
    assert (_by_dataset(fig7, "estimated_fraction")["laps_sd"] >= 0.8).all()


@pytest.mark.xfail(strict=True, reason="the estimate is made when a request's acceptance first looks stable (γ = 5, "
                   "δ = 0.05), ≈ 10-20 rounds in, while the oracle's early drift (conf/oracle: τ = 40 tokens) still "
                   "holds it below its level: Eq. 6 overestimates by ≈ 20-25 % on average, and the length predictor "
                   "adds the rest (full run: 31-41 % error against the paper's 7.63-11.21 %)")
def test_fig7_estimation_error_as_in_the_paper(fig7: pd.DataFrame) -> None:
    wide = _by_dataset(fig7, "mean_estimate_error")
    assert (wide["laps_sd"] <= 0.15).all(), wide
