"""TurboSpec Fig. 15 (§8.1) on the quick experiment: the closed loop follows load and acceptance.

The paper's absolute statements (speculation off from 8 QPS, about 6 tokens on Sonnet) are not reproduced and are
reported in results/turbospec_fig15/summary.md; asserted here is what the controller must do on any hardware: shorter
proposals as the batch grows, longer ones where the measured acceptance is higher, and lower latency than no
speculation throughout.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from repro.experiments.simulate import compose
from repro.metrics.derived import with_derived
from tests.conftest import DATA_MODES, QuickRuns

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=DATA_MODES)
def fig15(request: pytest.FixtureRequest, quick_runs: QuickRuns) -> Path:
    """Checked on the real ShareGPT and Sonnet files (skipped without them) and on the embedded statistics."""
    return quick_runs.get("turbospec_fig15", str(request.param)).out_dir


def _decode_steps(out: Path, scenario: str) -> pd.DataFrame:
    steps = with_derived(pd.read_parquet(out / "steps.parquet"))
    assert steps is not None
    return steps[(steps["system"] == "turbospec") & (steps["scenario"] == scenario) & (steps["num_decode"] > 0)]


def test_latency_below_no_speculation_in_every_scenario(fig15: Path) -> None:
    pts = pd.read_csv(fig15 / "points.csv")
    wide = pts.pivot_table(index=["scenario", "rps"], columns="system", values="mean_latency_s", dropna=False)
    wide = wide.dropna(how="all")
    assert (wide["turbospec"] < wide["vllm"]).all(), wide


def test_proposed_length_falls_as_the_rate_rises(fig15: Path) -> None:
    pts = pd.read_csv(fig15 / "points.csv")
    steady = pts[(pts["system"] == "turbospec") & (pts["scenario"] == "steady ShareGPT")].set_index("rps")
    # 2 -> 32 req/s: the batch grows several-fold; tolerance 0.2 tokens (one step of the per-step k is 1)
    assert steady.loc[32.0, "mean_batch_size"] > 3 * steady.loc[2.0, "mean_batch_size"], steady
    assert steady.loc[32.0, "mean_proposed_len"] < steady.loc[2.0, "mean_proposed_len"] - 0.2, steady
    # within the QPS-change timeline too: the first 24 s (2 req/s) propose more than the last quarter of decoding
    q = _decode_steps(fig15, "QPS change")
    first = q[q["start_at"] < 24.0]
    last = q[q["start_at"] >= q["start_at"].quantile(0.75)]
    assert last["num_seqs"].mean() > first["num_seqs"].mean()
    assert last["mean_k"].mean() < first["mean_k"].mean(), (first["mean_k"].mean(), last["mean_k"].mean())


def test_proposed_length_follows_acceptance_across_the_dataset_switch(fig15: Path) -> None:
    # The premise is the oracle's ground truth, Table 3 (160M, 7B): Sonnet 0.53 < ShareGPT 0.62 per-token acceptance.
    # (The per-step accepted / proposed ratio is not a measure of it: it falls as chains grow, so a controller that
    # lengthens its proposals after the switch holds that ratio flat.) The claim: TurboSpec proposes longer chains
    # after switching to the higher-acceptance dataset. Tolerance: 0.1 tokens.
    oracle = compose(["model@draft=vicuna-160m", "model=llama2-7b"]).oracle.accept["vicuna-160m"]["llama2-7b"]
    assert oracle["sonnet"] < oracle["sharegpt"]
    req = pd.read_parquet(fig15 / "requests.parquet")
    req = req[(req["system"] == "turbospec") & (req["scenario"] == "dataset change")]
    switch = req.loc[req["dataset"] == "sharegpt", "arrival_s"].min()
    d = _decode_steps(fig15, "dataset change")
    before, after = d[d["start_at"] < switch], d[d["start_at"] >= switch + 5.0]
    assert after["mean_k"].mean() > before["mean_k"].mean() + 0.1, (before["mean_k"].mean(), after["mean_k"].mean())
