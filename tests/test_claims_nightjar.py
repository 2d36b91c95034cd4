"""Nightjar's claims (§2 Figs. 2-3, §6 Figs. 9-16, Tables 4-6) on the quick experiments, each with its tolerance.

What reproduces is asserted: speculation pays at low load and hurts at high load on the authors' serving flags (vLLM
0.8.2 V0 with --enforce-eager: the multi-query scorer, no CUDA graphs; Figs. 2, 9), no speculation beats standard SD
once the KV pool bounds the batch (Table 4 with outputs to --max-model-len), a resident draft costs KV capacity (Fig.
3), offloading the draft under pressure raises throughput (Fig. 13), the trace's peak throughput (Fig. 11), Table 6's
expansion cost and a contraction of the same order.
What does not is a strict xfail stating the reproduced value: Nightjar's per-batch-size ADA-BINGREEDY does not match
the best method at high load (Fig. 9), the best fixed γ (Fig. 15) or standard SD's throughput (Table 4): Algorithm 1
still explores a third or more of its steps uniformly over γ = 0..5 after a few thousand steps, and each batch size
learns alone.
"""

from __future__ import annotations

import pandas as pd
import pytest

from repro.cost.spec import load_model
from tests.conftest import QuickRuns, point_value

pytestmark = pytest.mark.slow

GiB = 2**30


@pytest.fixture(scope="module")
def fig2(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("nightjar_fig2", data).points


@pytest.fixture(scope="module")
def fig9(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("nightjar_fig9", data).points


# --- Figs. 2 and 9: speculation pays at low load, hurts at high load -----------------------------------------------


def test_fig2_speculation_pays_at_low_load_and_hurts_at_high_load(fig2: pd.DataFrame) -> None:
    # Paper: γ = 3 above no speculation at low load, below it at high load (up to 30 % lower). Quick run (200
    # requests): 1.08-1.11x at 5 req/s, 0.935-0.948x at 30 req/s (full run 0.77x). Tolerance: above 1 at 5, at most
    # 0.95 at 30.
    assert point_value(fig2, "static_sd_k3", "thr_vs_ar", rps=5) > 1.0
    assert point_value(fig2, "static_sd_k3", "thr_vs_ar", rps=30) <= 0.95


def test_fig9_speculation_below_no_speculation_at_high_load(fig9: pd.DataFrame) -> None:
    # Paper: at high request rates SD is inferior to no speculation. Quick run (300 requests): γ = 3 at 0.94-0.95x at
    # 20 req/s and 1.02-1.03x at 2 req/s. Tolerance: below 1 at 20, at least 1 at 2.
    assert point_value(fig9, "static_sd_k3", "thr_vs_ar", rps=20) < 1.0
    assert point_value(fig9, "static_sd_k3", "thr_vs_ar", rps=2) >= 1.0


@pytest.mark.xfail(strict=True, reason="Nightjar does not switch speculation off at high load: at 20 req/s it "
                   "reaches 0.91-0.93x the best method's throughput in the quick run (full run, 12-20 req/s: "
                   "0.84-0.91x, where no speculation is best); per batch size, Algorithm 1's blocks restart with an "
                   "exploring bin, so after a few hundred visits a third or more of the steps still draw γ uniformly "
                   "from 0..5")
def test_fig9_nightjar_matches_the_best_method_at_high_load(fig9: pd.DataFrame) -> None:
    best = max(point_value(fig9, s, "total_token_throughput", rps=20) for s in ("vllm", "static_sd_k3"))
    assert point_value(fig9, "nightjar", "total_token_throughput", rps=20) >= 0.99 * best


def test_fig9_the_authors_selector_switches_speculation_off_at_high_load(fig9: pd.DataFrame) -> None:
    # The authors' fork's hard rule (batch > 20 with > 2 req/s arriving: no speculation) is what the printed
    # Algorithm 1 lacks. Quick run at 20 req/s: 1.06-1.09x no speculation's throughput against Nightjar's 0.91-0.93x.
    # Tolerance: at least no speculation's, and above the printed selector's.
    authors = point_value(fig9, "nightjar_authors", "thr_vs_ar", rps=20)
    assert authors >= 1.0 and authors > point_value(fig9, "nightjar", "thr_vs_ar", rps=20)


# --- Fig. 3: a resident draft shrinks the KV cache -----------------------------------------------------------------


def test_fig3_a_resident_draft_takes_its_weights_and_kv_share(quick_runs: QuickRuns) -> None:
    pts = quick_runs.get("nightjar_fig3", "none").points  # the cost model's memory model: no data involved
    seven = pts[pts["deployment"] == "7B, RTX 4090"].set_index("system")
    assert seven.loc["ngram", "kv_tokens"] == seven.loc["no_sd", "kv_tokens"]  # prompt lookup keeps no weights or KV
    assert seven.loc["draft_model", "kv_tokens"] < 0.75 * seven.loc["ngram", "kv_tokens"]  # 89,536 vs 125,952
    assert seven.loc["draft_model", "draft_weights_gib"] == pytest.approx(
        load_model("qwen2.5-0.5b").weight_bytes / GiB, rel=1e-3)


# --- Fig. 13 and Table 6: elastic memory ---------------------------------------------------------------------------


def test_fig13_offloading_the_draft_raises_throughput_under_load(quick_runs: QuickRuns, data: str) -> None:
    # Paper: 6,315.9 vs 5,982.6 tok/s at 35 req/s (1.056x). Quick run (the full run's 480 requests at 35 req/s, seed
    # 0): the draft is offloaded and throughput moves 1.00-1.01x with the printed selector and 1.02-1.04x with the
    # authors' (full run, five seeds: 1.00-1.06x, mean 1.033x, and 1.02-1.06x). Tolerance: one offload or more; the
    # gain at least 0.98x (printed: seed 0 is the full run's lowest) and 1.01x (authors').
    pts = quick_runs.get("nightjar_fig13", data).points
    assert point_value(pts, "nightjar_offload", "num_expand") >= 1
    assert point_value(pts, "nightjar_offload", "offload_gain") >= 0.98
    assert point_value(pts, "nightjar_authors_offload", "num_expand") >= 1
    assert point_value(pts, "nightjar_authors_offload", "offload_gain_authors") >= 1.01


def test_table6_elastic_memory_costs(quick_runs: QuickRuns, data: str) -> None:
    # Paper (32B, 2x L20): expansion 143.9 ms (the engine profile's input), contraction 11.9 ms. Ours: the
    # contraction migrates the used blocks of the reclaimed region at the L20's memory bandwidth (5.0 ms in the
    # quick run). Tolerance: expansion exact; contraction within 4x of the paper's.
    pts = quick_runs.get("nightjar_table6", data).points
    assert point_value(pts, "nightjar_offload", "num_expand") >= 1
    assert point_value(pts, "nightjar_offload", "num_contract") >= 1
    assert point_value(pts, "nightjar_offload", "mean_expand_ms") == pytest.approx(143.9)
    assert 11.9 / 4 <= point_value(pts, "nightjar_offload", "mean_contract_ms") <= 11.9 * 4


# --- Fig. 11 and Tables 4, 15: Nightjar against the baselines ------------------------------------------------------


def test_fig11_peak_throughput_of_the_trace(quick_runs: QuickRuns, data: str) -> None:
    # Paper: Nightjar peaks at about 3,800 tok/s. Quick run (the first 120 arrivals of the trace segment): 3,420-4,060
    # tok/s in 3-s bins, set by the segment's 21 req/s first minute. Tolerance: within 25 %.
    pts = quick_runs.get("nightjar_fig11", data).points
    assert point_value(pts, "nightjar", "peak_total_token_throughput") == pytest.approx(3800, rel=0.25)


@pytest.mark.xfail(strict=True, reason="Nightjar stays below the best fixed γ (quick run at 4 req/s: 0.96-0.99x; "
                   "full run 0.96-1.00x; paper: 1.01-1.16x): its exploration keeps playing γ far from the best")
def test_fig15_nightjar_never_falls_behind_the_best_fixed_gamma(quick_runs: QuickRuns, data: str) -> None:
    pts = quick_runs.get("nightjar_fig15", data).points
    best = max(point_value(pts, s, "total_token_throughput") for s in ("static_sd_k2", "static_sd_k4"))
    assert point_value(pts, "nightjar", "total_token_throughput") >= best


@pytest.mark.xfail(strict=True, reason="Nightjar's throughput is not above standard SD's (γ = 3) under the dynamic "
                   "rate with outputs to --max-model-len: quick run 0.97-0.99x, full run 0.96-1.00x per model and "
                   "dataset (paper: up to 1.148x)")
def test_table4_nightjar_above_standard_sd(quick_runs: QuickRuns, data: str) -> None:
    pts = quick_runs.get("nightjar_table4", data).points
    assert point_value(pts, "nightjar", "vs_sd") >= 1.148 * 0.95


def test_table4_outputs_to_max_model_len_make_the_kv_pool_the_bottleneck(quick_runs: QuickRuns, data: str) -> None:
    # Tables 4-5 run where the server is the bottleneck: every request generates until prompt + output reach
    # --max-model-len 2048 (the authors' --ignore-eos). The KV pool then bounds the batch, and the resident draft's
    # share of it costs standard SD its throughput edge (the paper's tables: no speculation ahead of SD at 7B). Quick
    # run (100 requests, 7B, ShareGPT): every method preempts (47-81 times); batches of 52-53 without a draft against
    # 40-41 with; no speculation 1.02-1.03x SD's throughput (full run 1.14-1.22x). Tolerance: preemptions in both, the
    # batch at least 1.2x, no speculation at least level with SD.
    pts = quick_runs.get("nightjar_table4", data).points
    assert (pts["num_preemptions"] > 0).all()
    assert point_value(pts, "vllm", "mean_batch_size") >= 1.2 * point_value(pts, "sd_k3", "mean_batch_size")
    assert point_value(pts, "vllm", "vs_sd") >= 1.0
    assert (pts["total_output_tokens"] + pts["total_input_tokens"] == 2048 * pts["completed"]).all()
