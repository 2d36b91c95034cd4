"""repro.metrics.derived: every derived column from one function, on hand-computed tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from repro.core.errors import ConfigError
from repro.experiments.results import derived_rows
from repro.metrics.derived import Derived, with_derived

SPEEDUP = Derived("speedup", "lat", baseline="vllm", invert=True)


def test_points_columns_by_hand() -> None:
    pts = pd.DataFrame({
        "system": ["vllm", "sd", "sd", "vllm", "sd", "sd"],
        "seed": 0,
        "b": [1, 1, 1, 2, 2, 2],
        "k": [0, 1, 2, 0, 1, 2],
        "lat": [2.0, 1.0, 0.5, 3.0, 2.0, 6.0],
        "g": [1.0, 4.0, 8.0, 1.0, 3.0, 1.5],
    })  # fmt: skip
    specs = [
        SPEEDUP,  # vllm latency / row latency at the same seed and b (k differs, so it is not a key here)
        Derived("norm", "g", normalize="k"),  # g / the system's best g over k at the same seed and b
        Derived("kept", "speedup", normalize="k"),  # an entry reading an earlier one's column
    ]
    out = with_derived(pts, specs, ["seed", "b", "k"])
    # speedup matches on (seed, b, k): vllm runs k = 0 only, so sd rows have no baseline
    assert out["speedup"].tolist()[0] == 1.0 and out["speedup"].isna().tolist() == [False, True, True] * 2
    assert out["norm"].tolist() == [1.0, 0.5, 1.0, 1.0, 1.0, 0.5]  # sd b=1: 4/8, 8/8; sd b=2: 3/3, 1.5/3
    assert out["kept"].tolist()[0] == 1.0 and out["kept"].isna().sum() == 4
    by_b = with_derived(pts, [SPEEDUP], ["seed", "b"])["speedup"].tolist()
    assert by_b == [1.0, 2.0, 4.0, 1.0, 1.5, 0.5]  # 2/2, 2/1, 2/0.5; 3/3, 3/2, 3/6


def test_request_and_step_columns_by_hand() -> None:
    req = pd.DataFrame({"arrival_s": [0.0, 1.0], "first_token_at": [0.5, 1.2], "finish_at": [2.5, np.nan],
                        "output_len": [5, 1], "num_proposed": [4, 0], "num_accepted": [3, 0]})
    out = with_derived(req)
    assert out["latency_s"].tolist()[0] == 2.5 and math.isnan(out["latency_s"].tolist()[1])
    assert out["ttft_ms"].tolist() == pytest.approx([500.0, 200.0])
    assert out["tpot_ms"].tolist()[0] == pytest.approx(500.0)  # (2.5 - 0.5) s / (5 - 1) tokens
    assert out["accept_rate"].tolist()[0] == 0.75 and math.isnan(out["accept_rate"].tolist()[1])
    steps = pd.DataFrame({"latency_s": [0.02], "num_proposed": [4], "num_accepted": [2], "num_matched": [3]})
    out = with_derived(steps)
    assert out["latency_s"].tolist() == [0.02]  # a step's own latency is kept
    assert out["accept_rate"].tolist() == [0.5] and out["draft_acceptance_rate"].tolist() == [0.75]
    assert with_derived(None) is None


def test_switch_ratio_and_estimate_error_by_hand() -> None:
    req = pd.DataFrame({"arrival_s": [0.0, 0.0, 0.0], "first_token_at": [0.1, 0.1, 0.1],
                        "finish_at": [2.0, 3.0, np.nan], "service_s": [2.0, 2.5, 1.0], "swap_s": [0.5, 0.0, 0.1],
                        "estimate_s": [2.5, np.nan, 1.0]})
    out = with_derived(req)
    assert out["switch_ratio"].tolist() == pytest.approx([0.25, 0.0, 0.1])
    err = out["estimate_error"].tolist()
    assert err[0] == pytest.approx(0.25) and math.isnan(err[1]) and math.isnan(err[2])  # no estimate; unfinished


def test_points_csv_text_rows() -> None:
    rows = [
        {"system": "vllm", "seed": "0", "b": "1", "lat": "2"},
        {"system": "sd", "seed": "0", "b": "1", "lat": "3"},
        {"system": "sd", "seed": "0", "b": "2", "lat": "1"},  # no baseline at b=2: nan
    ]
    out = derived_rows(rows, [SPEEDUP, Derived("s2", "speedup", baseline="vllm")], ["seed", "b"])
    # written with 6 significant digits, and the next entry reads that text
    assert [r["speedup"] for r in out] == ["1", "0.666667", "nan"]
    assert [r["s2"] for r in out] == ["1", "0.666667", "nan"]
    assert out[0]["lat"] == "2" and derived_rows(rows, [], ["seed"]) is rows


def test_an_entry_must_be_well_formed() -> None:
    with pytest.raises(ConfigError, match="needs name"):
        Derived.parse({"name": "x", "metric": "lat"})
    with pytest.raises(ConfigError, match="not a grid column"):
        with_derived(pd.DataFrame({"system": ["a"]}), [Derived("x", "g", normalize="zz")], ["seed"])


def test_a_baseline_matched_on_fewer_columns() -> None:
    """``match``: no speculation runs k = 0 only; speculation at every k divides by it at the same seed and C."""
    pts = pd.DataFrame({
        "system": ["none", "sd", "sd", "none", "sd"],
        "seed": 0,
        "c": [1, 1, 1, 2, 2],
        "k": [0, 1, 2, 0, 1],
        "thr": [10.0, 15.0, 20.0, 40.0, 30.0],
    })  # fmt: skip
    spec = Derived.parse({"name": "speedup", "metric": "thr", "baseline": "none", "match": ["c"]})
    assert with_derived(pts, [spec], ["seed", "c", "k"])["speedup"].tolist() == [1.0, 1.5, 2.0, 1.0, 0.75]
    with pytest.raises(ConfigError, match="match"):
        with_derived(pts, [Derived("s", "thr", baseline="none", match=("q",))], ["seed", "c", "k"])
    with pytest.raises(ConfigError):
        Derived.parse({"name": "s", "metric": "thr", "normalize": "k", "match": ["c"]})


def test_a_column_per_the_rows_own_column() -> None:
    """``per``: the row's metric over its own column (goodput per node: SepPipe's three nodes, AdaServe Fig. 7)."""
    df = pd.DataFrame({"system": ["a", "sep"], "seed": [0, 0], "goodput": [60.0, 90.0], "nodes": [1.0, 3.0]})
    out = with_derived(df, [Derived.parse({"name": "per_node", "metric": "goodput", "per": "nodes"})], ["seed"])
    assert list(out["per_node"]) == [60.0, 30.0]
    with pytest.raises(ConfigError, match="one of baseline"):
        Derived.parse({"name": "x", "metric": "g", "per": "nodes", "normalize": "seed"})
