"""TurboSpec Appendix A Tables 4 and 5 (end-to-end latency vs QPS): the paper's qualitative claims on the quick runs.

Issue 4's "Done when": TurboSpec's latency within a few percent of the best static configuration at every QPS, and
never meaningfully worse than no speculation. Quick runs: 30 requests per point, two rows per table: a draft-model
row on ShareGPT at a low and a high QPS, a prompt-lookup row on CNN/DM at QPS 1. The full tables and the claims
that differ there (speculation never fully switched off; the 3.16x headline on the L40S) are in
results/turbospec_table{4,5}/summary.md.
"""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import QuickRuns

pytestmark = pytest.mark.slow
STATIC = ["k1", "k3", "k5", "k7"]
KEYS = ["target_model", "dataset", "rps"]  # a table row (target, dataset) and its QPS
# `source: published` (Table 2's mean ± std): no data file is read, so the numbers are the same with and without
# the data folder; pinned to "none".
DATA = "none"


@pytest.fixture(scope="module", params=["turbospec_table4", "turbospec_table5"])
def table(request: pytest.FixtureRequest, quick_runs: QuickRuns) -> pd.DataFrame:
    return quick_runs.get(str(request.param), DATA).points


def _wide(points: pd.DataFrame, metric: str = "mean_latency_s") -> pd.DataFrame:
    return points.pivot_table(index=KEYS, columns="system", values=metric, aggfunc="mean")


def test_every_system_at_every_point(table: pd.DataFrame) -> None:
    wide = _wide(table)
    assert list(wide.columns.sort_values()) == sorted(["no_spec", *STATIC, "turbospec"])
    assert not wide.isna().any().any(), wide
    assert (table["completed"] == table["num_requests"]).all()  # every request finished
    assert table.loc[table["system"] == "no_spec", "acceptance_rate"].isna().all()  # no speculation at all
    assert table.loc[table["system"] != "no_spec", "acceptance_rate"].gt(0).all()


def test_turbospec_within_a_few_percent_of_the_best_static_k(table: pd.DataFrame) -> None:
    # Paper: TurboSpec "consistently identifies the optimal number of speculative tokens" (§7.1; issue 4: within a
    # few percent of the best static configuration at every QPS). Tolerance: 5 % of the best static k's latency.
    wide = _wide(table)
    ratio = wide["turbospec"] / wide[STATIC].min(axis=1)
    assert (ratio <= 1.05).all(), pd.concat([wide, ratio.rename("ratio")], axis=1)


def test_turbospec_never_meaningfully_worse_than_no_speculation(table: pd.DataFrame) -> None:
    # Tolerance: 5 % of no speculation's latency at every point (the paper: at most the framework's overhead).
    wide = _wide(table)
    assert (wide["turbospec"] <= 1.05 * wide["no_spec"]).all(), wide


def test_speculation_pays_at_low_load(table: pd.DataFrame) -> None:
    # At each row's lowest quick QPS every speculative column beats no speculation (Table 3's acceptance >= 0.54)
    # and TurboSpec gains at least 20 % (speedup >= 1.2; the quick runs give about 1.6-2.2).
    wide = _wide(table, "speedup")
    low = wide.groupby(level=["target_model", "dataset"]).head(1)
    assert (low[[*STATIC, "turbospec"]] > 1.0).all().all(), low
    assert (low["turbospec"] >= 1.2).all(), low


def test_proposed_length_shorter_at_high_load(table: pd.DataFrame) -> None:
    # Speculation is shortened (or switched off) as load grows (§4, Fig. 10): on the draft-model rows TurboSpec's mean
    # proposed length at the highest quick QPS is below its length at the lowest (no tolerance; the quick runs give
    # 3.85 -> 3.69 for 7B and 3.86 -> 3.62 for 33B on ShareGPT). The prompt-lookup rows run at one QPS in quick mode
    # (and prompt lookup's proposal is fixed; only its verified length adapts).
    draft = table[(table["system"] == "turbospec") & (table["dataset"] != "cnn_dailymail")]
    k = _wide(draft, "mean_proposed_len")["turbospec"]
    assert len(k) >= 2, k
    for row, per_row in k.groupby(level=["target_model", "dataset"]):
        assert per_row.iloc[-1] < per_row.iloc[0], (row, per_row)
