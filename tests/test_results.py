"""repro.experiments.results: deterministic cell text and points.csv written line by line."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from repro.experiments.results import PointsFile, fmt


def test_fmt_is_stable() -> None:
    for v in (0.1, 1 / 3, 12345.6789, 2.0, float("nan"), 1e-9):
        once = fmt(v)
        assert fmt(float(once)) == once
    assert fmt(2.0) == "2" and fmt(1 / 3) == "0.333333" and fmt(None) == "" and fmt(True) == "True"


def test_points_file_widens_its_header(tmp_path: Path) -> None:
    pf = PointsFile(tmp_path / "points.csv", ["exp", "system", "seed"])
    pf.start([])
    pf.append({"exp": "e", "system": "a", "seed": 0, "slo_attainment": 0.5})
    pf.append({"exp": "e", "system": "b", "seed": 0, "slo_attainment": 1.0, "zz_extra": 2.0})  # a new metric
    df = pd.read_csv(tmp_path / "points.csv")
    assert list(df["system"]) == ["a", "b"] and df["zz_extra"].isna().tolist() == [True, False]
    assert list(df.columns[-5:]) == ["zz_extra", "sim_time_s", "wall_s", "config_hash", "code_version"]


def test_a_swept_key_named_like_a_metric_is_one_column(tmp_path: Path) -> None:
    """LAPS-SD sweeps num_requests: the row has one value, so the file has one num_requests column (the key's)."""
    pf = PointsFile(tmp_path / "points.csv", ["exp", "system", "seed", "num_requests"])
    pf.start([])
    pf.append({"exp": "e", "system": "a", "seed": 0, "num_requests": 10, "slo_attainment": 0.5})
    header = (tmp_path / "points.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["exp", "system", "seed", "num_requests", "slo_attainment"]
    assert header.count("num_requests") == 1
