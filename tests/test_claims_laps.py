"""LAPS-SD's claims (§3 Figs. 2-3, §5.2 Figs. 5-7) on the quick experiments, each with its stated tolerance.

Claims the reproduction does not reach are reported in each experiment's summary.md; those with a test here are
strict xfails that state the reproduced value: LAPS-SD does not beat LP-SJF (Fig. 5, requests at t = 0; at parity
under Poisson arrivals), K beyond 4 changes nothing (Fig. 6), the switching ratio at 500 tokens over the modelled
link and the estimation error under the default stability rule are several times the paper's (Figs. 2, 7).
"""

from __future__ import annotations

import pandas as pd
import pytest

from repro.experiments import runner
from tests.conftest import QuickRuns

pytestmark = pytest.mark.slow


# Data modes (the `data` fixture of conftest): MBPP is a real file (skipped without it) or its embedded table;
# Chatbot Instruction Prompts and MiniThinky have assumed lengths in both modes.


@pytest.fixture(scope="module")
def fig5_all(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("laps_fig5", data).points


@pytest.fixture(scope="module")
def fig5(fig5_all: pd.DataFrame) -> pd.DataFrame:
    """Requests at t = 0."""
    return fig5_all[fig5_all["arrivals"] == "t0"]


@pytest.fixture(scope="module")
def fig6(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    points = quick_runs.get("laps_fig6", data).points
    return points[(points["arrivals"] == "t0") & (points["system"] == "laps_sd")]


@pytest.fixture(scope="module")
def fig7_all(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("laps_fig7", data).points


@pytest.fixture(scope="module")
def fig7(fig7_all: pd.DataFrame) -> pd.DataFrame:
    """Requests at t = 0."""
    return fig7_all[fig7_all["arrivals"] == "t0"]


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
    # Paper: LAPS-SD always outperforms the others; LAS about 1.45x its latency (31 % lower). Tolerance: per dataset,
    # averaged over the quick run's 10 and 30 requests at t = 0, LAPS-SD below FCFS's latency on Chatbot and
    # MiniThinky (quick run: 0.60x and 0.75x) and at most 1.05x it on MBPP, whose short outputs spend most of their
    # life in the first queues, where LAPS-SD is FCFS (0.85x with the file, 1.02x without); at most 0.8x LAS's on
    # every dataset (0.36-0.65x).
    wide = _by_dataset(fig5)
    others = wide.drop(index="MBPP")
    assert (others["laps_sd"] < others["fcfs"]).all(), wide
    assert wide.loc["MBPP", "laps_sd"] <= 1.05 * wide.loc["MBPP", "fcfs"], wide
    assert (wide["laps_sd"] <= 0.8 * wide["las"]).all(), wide


def test_fig5_mbpp_is_the_fastest_dataset(fig5: pd.DataFrame) -> None:
    # Paper: MBPP's latency is "significantly shorter" than the other two datasets' (higher acceptance; its outputs
    # are also short). Tolerance: below both for every scheduler.
    wide = _by_dataset(fig5)
    assert (wide.loc["MBPP"] < wide.drop(index="MBPP").min()).all(), wide


def test_fig5_mbpp_has_the_highest_realised_acceptance(fig5: pd.DataFrame) -> None:
    # Paper §5.2: "requests in the MBPP dataset have higher acceptance rates". The oracle's table gives MBPP 0.60
    # against 0.52 / 0.48; the early drift (conf/oracle: a start 0.17 below each request's own level) must keep that
    # order in what the runs realise, not only in the table. Tolerance: MBPP's realised draft acceptance (matched /
    # proposed) at least 0.02 above the best other dataset's, and its accepted / proposed above both (quick run:
    # 0.035 and 0.034 ahead; the absolute start 0.35 ± 0.15 this replaced left it 0.01 ahead at 50 requests, and a
    # start 0.35 below the level reverses MBPP and MiniThinky).
    for metric, lead in (("draft_acceptance_rate", 0.02), ("acceptance_rate", 0.0)):
        wide = _by_dataset(fig5[fig5["system"] == "laps_sd"], metric)["laps_sd"]
        assert wide["MBPP"] > wide.drop(index="MBPP").max() + lead, (metric, wide)


@pytest.mark.xfail(strict=True, reason="with every request at t = 0, LP-SJF with the same length predictor "
                   "(log-normal σ = 0.25) is faster than LAPS-SD on every dataset (full run: LAPS-SD 1.04-1.46x "
                   "LP-SJF's latency; paper: LP-SJF 1.47x slower): every request first runs ≈ 10 rounds in the first "
                   "queues before it is perceptible, all of them before the SJF order applies, while LP-SJF orders "
                   "them from the first step")
def test_fig5_laps_sd_beats_lp_sjf(fig5: pd.DataFrame) -> None:
    wide = _by_dataset(fig5)
    assert (wide["laps_sd"] < wide["lp_sjf"]).all(), wide


def test_fig5_poisson_arrivals_bring_laps_sd_to_parity_with_lp_sjf(fig5_all: pd.DataFrame) -> None:
    # Not a paper claim: the paper never states its arrival process. Under Poisson arrivals at 90 % load few requests
    # wait at once, so LAPS-SD's first-queue phase costs little. Tolerance: per dataset LAPS-SD within 0.9-1.2x
    # LP-SJF's latency under Poisson (quick run: 1.01-1.14x), and closer to it than at t = 0 (1.07-1.47x).
    ratio = {}
    for arrivals, pts in fig5_all.groupby("arrivals"):
        wide = _by_dataset(pts[pts["num_requests"] == 30])
        ratio[arrivals] = wide["laps_sd"] / wide["lp_sjf"]
    assert ratio["poisson"].between(0.9, 1.2).all(), ratio
    assert (ratio["poisson"] < ratio["t0"]).all(), ratio


# --- Fig. 6: number of priority queues ------------------------------------------------------------------------------


def test_fig6_latency_first_falls_with_more_queues(fig6: pd.DataFrame) -> None:
    # Paper: the latency first decreases as K grows (more queues approximate SJF). Tolerance: K = 4 at most 0.85x
    # K = 2 on average over datasets and request counts, and at most 1.02x at every point (quick run: 0.67-0.93x,
    # mean 0.78x, with the MBPP file; without it MBPP's 10 requests are 1.01x, mean 0.80x).
    ratio = fig6.pivot_table(index=["dataset", "num_requests"], columns="num_queues", values="mean_latency_s")
    ratio = ratio[4] / ratio[2]
    assert ratio.mean() <= 0.85 and (ratio <= 1.02).all(), ratio


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


def test_fig2_calibrated_link_scales_the_switching_cost_as_one_over_the_link(fig2: pd.DataFrame) -> None:
    # las_link80 runs LAS over the 80 GB/s link derived from the 25 GB/s run's ratio (25 x 0.454 / 0.1421): the ratio
    # is bytes / (link x service), and nothing else depends on the link, so it is 25/80 of the modelled one at every
    # length (up to points.csv's six digits), and 14.21 % at 500 tokens (a calibration, not a verdict).
    wide = fig2.pivot_table(index="output_len", columns="system", values="switch_overhead")
    assert wide["las_link80"].to_numpy() == pytest.approx(wide["las"].to_numpy() * 25 / 80, rel=1e-5), wide
    assert wide.loc[500, "las_link80"] == pytest.approx(0.1421, rel=0.02), wide


@pytest.mark.xfail(strict=True, reason="LAS switching after every round moves the KV (0.5 MiB a token) out and back "
                   "over the modelled 25 GB/s host link each ≈ 26 ms round: 45 % of the inference time at 500 tokens, "
                   "against the paper's 14.21 %, whose switching frequency, link and engine speed are not stated")
def test_fig2_switching_ratio_at_500_tokens(fig2: pd.DataFrame) -> None:
    las = fig2[(fig2["system"] == "las") & (fig2["output_len"] == 500)]["switch_overhead"].iloc[0]
    assert las == pytest.approx(0.1421, rel=0.25)


# --- Fig. 3: acceptance rate over decoding progress ------------------------------------------------------------------


def test_fig3_acceptance_unstable_early_stable_later(fig3: runner.ExperimentResult) -> None:
    # Paper: the acceptance rate is unstable early and stable after ~150 tokens. A running rate narrows by itself
    # (it averages more rounds), so the range check alone holds without any drift; what the oracle's drift adds is
    # a rate that starts below where it settles (conf/oracle: a start 0.17 ± 0.15 below the request's level, tau =
    # 40 tokens). Tolerance: per request, the range of its running rate over tokens 150-400 at most 0.15 and at most
    # 0.6x its range over tokens 5-150 (quick run: 0.02-0.07 against 0.13-0.63); the rate after 50 tokens below the
    # final one for at least 8 of the 9 requests, by 0.05 on average (quick run: all 9, 0.083; without the drift 5
    # of 9 and 0.018).
    rounds = pd.read_parquet(fig3.out_dir / "rounds.parquet")
    rounds = rounds.assign(rate=rounds["num_accepted"] / rounds["num_proposed"])
    rises = []
    for (_, rid), r in rounds.groupby(["dataset", "rid"]):
        early = r[(r["num_generated"] >= 5) & (r["num_generated"] < 150)]["rate"]
        late = r[r["num_generated"] >= 150]["rate"]
        spread_late, spread_early = late.max() - late.min(), early.max() - early.min()
        assert spread_late <= 0.15 and spread_late <= 0.6 * spread_early, (rid, spread_early, spread_late)
        rises.append(r["rate"].iloc[-1] - r[r["num_generated"] <= 50]["rate"].iloc[-1])
    assert len(rises) == 9 and sum(x > 0 for x in rises) >= 8 and sum(rises) / len(rises) >= 0.05, rises


# --- Fig. 7: execution-time estimation -------------------------------------------------------------------------------


def test_fig7_length_prediction_and_acceptance_both_add_error(fig7: pd.DataFrame) -> None:
    # Paper: the estimate combines the predicted length and the predicted acceptance. Tolerance: with a perfect
    # length predictor the error is lower on every dataset (quick run: 0.20-0.27 against 0.27-0.33); most requests
    # get an estimate (at least 80 %). Not asserted: MBPP's error the largest (no setting makes it so).
    wide = _by_dataset(fig7, "mean_estimate_error")
    assert (wide["laps_sd_exact_length"] < wide["laps_sd"]).all(), wide
    assert (_by_dataset(fig7, "estimated_fraction")["laps_sd"] >= 0.8).all()


def test_fig7_the_stability_rule_decides_the_error_and_costs_latency(fig7: pd.DataFrame) -> None:
    # Not a paper claim: the suite's γ = 5, δ = 0.05 judges requests stable within ≈ 20 tokens, long before Fig. 3's
    # ≈ 150; γ = 20, δ = 0.02 waits ≈ 125 tokens and, with a perfect length predictor, brings the error near the
    # paper's, at a latency cost (Figs. 5 and 7 cannot both hold). Tolerance, per dataset: median stable after at
    # most 30 tokens against at least 100 (quick run: 15-19 against 123-135); the error with a perfect length
    # predictor at most 0.15 and below the default rule's (quick run: 0.07-0.12 against 0.20-0.27); the latency at
    # least 1.15x (quick run: 1.27-1.55x).
    tokens = _by_dataset(fig7, "median_stable_tokens")
    assert (tokens["laps_sd"] <= 30).all() and (tokens["laps_sd_stable20"] >= 100).all(), tokens
    err = _by_dataset(fig7, "mean_estimate_error")
    assert (err["laps_sd_stable20_exact_length"] <= 0.15).all(), err
    assert (err["laps_sd_stable20_exact_length"] < err["laps_sd_exact_length"]).all(), err
    lat = _by_dataset(fig7)
    assert (lat["laps_sd_stable20"] >= 1.15 * lat["laps_sd"]).all(), lat


@pytest.mark.xfail(strict=True, reason="the estimate is made when a request's acceptance first looks stable under "
                   "the suite's γ = 5, δ = 0.05, a median of 10-11 rounds (16-19 tokens) in, long before Fig. 3's "
                   "≈ 150 tokens, while the running rate is still noisy and low (the oracle's drift), and the length "
                   "predictor (σ = 0.25) adds the rest (full run: 29-33 % against the paper's 7.63-11.21 %)")
def test_fig7_estimation_error_as_in_the_paper(fig7: pd.DataFrame) -> None:
    wide = _by_dataset(fig7, "mean_estimate_error")
    assert (wide["laps_sd"] <= 0.15).all(), wide
