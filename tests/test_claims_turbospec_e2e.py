"""TurboSpec §7 end-to-end claims (Figs. 12-14: EAGLE and prompt lookup) on the quick experiments.

Claims the reproduction does not reach, or reaches only in the full run, are reported in each experiment's summary.md
and not asserted here: EAGLE's proposal share (17.7 % in the paper, ≈ 27 % here), "EAGLE degrades more with batch size
than PLD" (full run, static k = 3: EAGLE keeps 0.63 of its best speedup at batch 64, PLD 0.71 — same direction, but
the quick run's two 8B panels show the opposite). Claims the engine's batch-expansion verification keeps from
reproducing under load (no speculation's long tail in Fig. 13, its "significantly higher latency" in Fig. 14) are
strict xfails stating the reproduced values.
"""

from __future__ import annotations

import pandas as pd
import pytest

from repro.experiments import runner
from repro.metrics.derived import with_derived
from tests.conftest import QuickRuns

pytestmark = pytest.mark.slow
STATIC = ["k1", "k3", "k5"]
STATIC12 = ["static_k1", "static_k3", "static_k5"]  # Fig. 12's quick run


# Checked on the real ShareGPT and Sonnet files (skipped without them) and on the embedded statistics (the `data`
# fixture of conftest).


@pytest.fixture(scope="module")
def fig12(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("turbospec_fig12", data).points


@pytest.fixture(scope="module")
def fig13(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("turbospec_fig13", data).points


@pytest.fixture(scope="module")
def fig14(quick_runs: QuickRuns, data: str) -> runner.ExperimentResult:
    return quick_runs.get("turbospec_fig14", data)


def _wide(points: pd.DataFrame, keys: list[str], metric: str) -> pd.DataFrame:
    return points.pivot_table(index=keys, columns="system", values=metric, aggfunc="mean")


# --- Fig. 12: speedup vs batch size ------------------------------------------------------------------------------


def test_fig12_turbospec_matches_the_static_k(fig12: pd.DataFrame) -> None:
    # Paper: TurboSpec "consistently identifies the optimal number of speculative tokens" in every panel. The quick run
    # has static k = 1, 3, 5. Tolerance: within 5 % of the best static k at batch 64; 10 % at batch 1, where a point is
    # one request: TurboSpec's moving average starts from init_acceptance 0.7 and a ~200-token request barely fills
    # the 256-token window (the full run's worst single-request ratio to the best static k is 0.93).
    wide = _wide(fig12, ["panel", "batch_size"], "speedup")
    ratio = (wide["turbospec"] / wide[STATIC12].max(axis=1)).unstack("batch_size")
    assert (ratio[64] >= 0.95).all(), wide
    assert (ratio[1] >= 0.90).all(), wide


def test_fig12_turbospec_leaves_k3_where_another_k_pays_more(fig12: pd.DataFrame) -> None:
    # Where another static k beats k = 3 by more than 5 % (prompt lookup on Sonnet at batch 1: k = 5), TurboSpec must
    # beat k = 3 too, by at least 3 %: a controller stuck at one proposal length fails here.
    wide = _wide(fig12, ["panel", "batch_size"], "speedup")
    gap = wide[STATIC12].max(axis=1) > 1.05 * wide["static_k3"]
    assert gap.any(), wide
    assert (wide.loc[gap, "turbospec"] >= 1.03 * wide.loc[gap, "static_k3"]).all(), wide


def test_fig12_speculation_pays_at_every_batch_size(fig12: pd.DataFrame) -> None:
    # Fig. 12's speedups stay above 1 for TurboSpec up to the largest batch; asserted: > 1 everywhere, > 1.2 at batch 1,
    # and more at batch 1 than at batch 64 (speedups fall as the batch grows). Prompt lookup on Sonnet at batch 64 is
    # the closest call in quick mode: 1.04 since issue 56's H100 physics (1.06 before).
    wide = _wide(fig12, ["panel", "batch_size"], "speedup")["turbospec"].unstack("batch_size")
    assert (wide > 1.0).all().all(), wide
    assert (wide[1] > 1.2).all(), wide
    assert (wide[1] > wide[64]).all(), wide


def test_fig12_eagle_proposals_cost_more_than_prompt_lookup(fig12: pd.DataFrame) -> None:
    # Paper: three EAGLE tokens ≈ 17.7 % of the step, PLD ≈ 5 % (Llama-3-8B, H100). Asserted: the order and PLD's
    # size (≤ 10 %, twice the paper's value); EAGLE at least twice PLD's share at each batch size.
    share = fig12[fig12["system"] == "static_k3"].pivot_table(index="batch_size", columns="panel",
                                                                values="draft_share")
    assert (share["PLD Sonnet"] <= 0.10).all(), share
    assert (share["EAGLE ShareGPT"] >= 2 * share["PLD Sonnet"]).all(), share


# --- Fig. 13: QPS 1 -> 16 -> 48 ---------------------------------------------------------------------------------


def test_fig13_turbospec_close_to_best_static_and_below_no_spec(fig13: pd.DataFrame) -> None:
    # Paper: TurboSpec achieves lower latencies than the static baselines. Tolerance: mean and p99 latency within 5 %
    # of the best static k per panel, and mean latency below no speculation's (quick run: 0.90x / 0.97x; the full
    # run's 48 QPS phase is longer and TurboSpec ends 1.12x no speculation in its worst panel: summary.md, differs).
    for metric in ("mean_latency_s", "p99_latency_s"):
        wide = _wide(fig13, ["panel"], metric)
        assert (wide["turbospec"] <= 1.05 * wide[STATIC].min(axis=1)).all(), (metric, wide)
    mean = _wide(fig13, ["panel"], "mean_latency_s")
    assert (mean["turbospec"] < mean["no_spec"]).all(), mean


def test_fig13_eagle_instructcode_k5_poor_under_high_qps(fig13: pd.DataFrame) -> None:
    # Paper: in EAGLE-InstructCode k = 5 is poor under high QPS and TurboSpec avoids its long tail. Tolerance: p99
    # below k = 5's; k = 5's mean above the better of k = 1 and k = 3 (the quick run has 6 s at 48 QPS, so the gap
    # is smaller than in the full run's 1.39x).
    p99 = _wide(fig13, ["panel"], "p99_latency_s").loc["EAGLE-IC"]
    assert p99["turbospec"] < p99["k5"], p99
    mean = _wide(fig13, ["panel"], "mean_latency_s").loc["EAGLE-IC"]
    assert mean["k5"] > min(mean["k1"], mean["k3"]), mean


@pytest.mark.xfail(strict=True, reason="under vLLM v0's batch-expansion verification at 48 QPS, speculation gains "
                   "little over no speculation's tail: TurboSpec's p99 is 0.97x no speculation's in the quick run "
                   "(1.12x in the full run), not the paper's visibly shorter tail")
def test_fig13_eagle_instructcode_avoids_the_long_tail_of_no_speculation(fig13: pd.DataFrame) -> None:
    # Paper: TurboSpec avoids the long tails of no speculation. Tolerance: p99 at most 0.85x no speculation's.
    p99 = _wide(fig13, ["panel"], "p99_latency_s").loc["EAGLE-IC"]
    assert p99["turbospec"] <= 0.85 * p99["no_spec"], p99


# --- Fig. 14: dataset switch ------------------------------------------------------------------------------------


def test_fig14_turbospec_robust_across_the_shift(fig14: runner.ExperimentResult) -> None:
    # Paper: TurboSpec keeps low latency across the shift. Tolerance: mean latency within 3 % of the best fixed k per
    # panel, and not above no speculation's.
    mean = _wide(fig14.points, ["panel"], "mean_latency_s")
    assert (mean["turbospec"] <= 1.03 * mean[STATIC].min(axis=1)).all(), mean
    assert (mean["turbospec"] <= mean["no_spec"]).all(), mean


@pytest.mark.xfail(strict=True, reason="at 32 req/s on vLLM v0's batch-expansion verification, no speculation is "
                   "1.13x (EAGLE) and 1.01x (PLD) TurboSpec's mean latency in the quick run (0.95x in the full run), "
                   "not 'significantly higher'")
def test_fig14_no_spec_much_slower(fig14: runner.ExperimentResult) -> None:
    # Paper: no speculation suffers "significantly higher latency"; tolerance: at least 1.2x TurboSpec's mean.
    mean = _wide(fig14.points, ["panel"], "mean_latency_s")
    assert (mean["no_spec"] >= 1.2 * mean["turbospec"]).all(), mean


def test_fig14_each_fixed_k_loses_on_one_side_of_the_eagle_switch(fig14: runner.ExperimentResult) -> None:
    # Paper: fixed speculative lengths "fail to generalize well across the shift". Asserted for EAGLE (InstructCode
    # -> ShareGPT): k = 1 and k = 5 each have a dataset (before or after the switch) where their mean latency is at
    # least 3 % above TurboSpec's, while TurboSpec stays within 3 % of the best fixed k on both. k = 3 is not
    # asserted: in the quick run (5 s per dataset, little queueing) it ties TurboSpec on both sides; the full run
    # has it 8 % slower after the switch (results/turbospec_fig14, per-dataset figure).
    req = with_derived(pd.read_parquet(fig14.out_dir / "requests.parquet"))
    assert req is not None
    req = req[req["panel"] == "EAGLE IC->ShareGPT"]
    by_dataset = req.pivot_table(index="dataset", columns="system", values="latency_s", aggfunc="mean")
    assert set(by_dataset.index) == {"instructcode", "sharegpt"}, by_dataset
    for k in ("k1", "k5"):
        assert (by_dataset[k] >= 1.03 * by_dataset["turbospec"]).any(), (k, by_dataset)
    assert (by_dataset["turbospec"] <= 1.03 * by_dataset[STATIC].min(axis=1)).all(), by_dataset
