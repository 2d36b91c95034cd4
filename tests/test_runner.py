"""repro.runner: grid expansion, overrides, resume, determinism, calibration (with a fake ``run_point``)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from omegaconf import DictConfig

from repro import claims, runner, simulate
from repro.errors import ConfigError
from repro.metrics import POINT_METRICS, summarize

TEST_EXP = """\
# @package _global_
# Runner test grid: two systems (one with a label and overrides) x rps x draft, two seeds.
num_requests: 20
exp:
  name: grid_test
  title: "runner test grid"
  systems:
    - vllm
    - {system: static_sd, label: sd_k2, overrides: {system.k: 2}}
  grid:
    rps: [1.0, 2.0]
    draft: [llama-160m, llama-68m]
  seeds: [0, 1]
  quick:
    num_requests: 5
    grid: {rps: [2.0]}
    seeds: [0]
  figures:
    - {name: attain, kind: line, x: rps, y: slo_attainment, col: draft, title: "SLO attainment"}
    - {name: tput, kind: bar, x: rps, y: throughput_tok_s}
  claims:
    - {text: "sd_k2 beats vllm", paper: 1.0, kind: ratio_to_best_baseline, metric: throughput_tok_s,
       system: sd_k2, check: ">="}
"""


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    """A copy of the repo's conf/ with the test experiment added."""
    dst = tmp_path / "conf"
    shutil.copytree(runner.CONF_DIR, dst)
    (dst / "exp" / "grid_test.yaml").write_text(TEST_EXP)
    return dst


def fake_requests(cfg: DictConfig) -> pd.DataFrame:
    """A small deterministic request table that depends on seed, rps, system and draft."""
    key = f"{cfg.seed}-{cfg.rps}-{cfg.system._target_}-{cfg.system.get('k')}-{cfg.draft.name}"
    rng = np.random.default_rng([ord(c) for c in key])
    n = int(cfg.num_requests)
    arrival = np.sort(rng.uniform(0, n / float(cfg.rps), n))
    out = rng.integers(2, 50, n)
    first = arrival + rng.uniform(0.01, 0.2, n)
    return pd.DataFrame({
        "rid": np.arange(n), "dataset": "fake", "slo_class": rng.choice(["urgent", "relaxed"], n),
        "arrival_s": arrival, "first_token_at": first, "finish_at": first + out * rng.uniform(0.01, 0.05, n),
        "prompt_len": 10, "output_len": out, "num_proposed": 3 * out, "num_accepted": out,
        "num_decode_steps": out // 2, "num_spec_steps": out // 2, "tpot_slo_s": 0.03, "ttft_slo_s": np.inf,
        "num_preemptions": 0,
    })  # fmt: skip


class FakeRunPoint:
    """Stands in for repro.simulate.run_point; can fail after ``fail_after`` calls (a simulated kill)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls = 0
        self.fail_after = fail_after

    def __call__(self, cfg: DictConfig) -> simulate.PointResult:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated kill")
        self.calls += 1
        req = fake_requests(cfg)
        sim_time = float(req["finish_at"].max())
        return simulate.PointResult(summarize(req, sim_time), req, None, ["fake workload: embedded table"])


def run(conf_dir: Path, out_dir: Path, *extra: str) -> runner.ExperimentResult:
    overrides = ["+exp=grid_test", f"out_dir={out_dir}", "n_jobs=1", *extra]
    with runner.hydra_context(conf_dir):
        cfg = runner.compose_config(overrides)
    return runner.run_experiment(cfg, overrides, conf_dir=conf_dir)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRunPoint:
    f = FakeRunPoint()
    monkeypatch.setattr(simulate, "run_point", f)
    return f


# --------------------------------------------------------------------------------------- expansion


def test_expand_points_order_and_overrides(conf_dir: Path) -> None:
    groups = runner.group_overrides(conf_dir)
    assert (
        groups["draft"] == "model@draft" and groups["model"] == "model" and groups["hardware"] == "hardware"
    )
    exp = {"systems": ["vllm", {"system": "static_sd", "label": "k2", "overrides": {"system.k": 2}}],
           "grid": {"rps": [1.0, 2.0], "draft": ["llama-68m"]}, "seeds": [3]}  # fmt: skip
    pts = runner.expand_points(exp, groups)
    assert [(p.system, p.seed, dict(p.values)["rps"]) for p in pts] == [
        ("vllm", 3, 1.0), ("vllm", 3, 2.0), ("k2", 3, 1.0), ("k2", 3, 2.0),
    ]  # fmt: skip
    assert pts[2].overrides == (
        "system=static_sd",
        "seed=3",
        "rps=1.0",
        "model@draft=llama-68m",
        "system.k=2",
    )


def test_cases_bundle_overrides_with_their_own_grid(conf_dir: Path) -> None:
    groups = runner.group_overrides(conf_dir)
    exp = {"systems": ["vllm"], "case_key": "model", "cases": [
        {"label": "7b", "overrides": {"model": "llama2-7b"}, "grid": {"rps": [1.0, 2.0]}},
        {"label": "70b", "overrides": {"model": "llama2-70b", "tp": 4}, "grid": {"rps": [0.5]}},
    ]}  # fmt: skip
    pts = runner.expand_points(exp, groups)
    assert [dict(p.values) for p in pts] == [
        {"model": "7b", "rps": 1.0}, {"model": "7b", "rps": 2.0}, {"model": "70b", "rps": 0.5},
    ]  # fmt: skip
    assert pts[2].overrides == ("system=vllm", "seed=0", "model=llama2-70b", "tp=4", "rps=0.5")
    assert runner.grid_columns(exp) == ["model", "rps"]
    with pytest.raises(ConfigError, match="label"):
        runner.expand_points({"systems": ["vllm"], "cases": [{"grid": {}}]}, groups)


def test_quick_replaces_grid_and_adds_overrides() -> None:
    exp = {"grid": {"rps": [1, 2, 3]}, "seeds": [0, 1], "quick": {"grid": {"rps": [2]}, "num_requests": 7}}
    q, extra = runner.apply_quick(exp, True)
    assert q["grid"] == {"rps": [2]} and q["seeds"] == [0, 1] and extra == {"num_requests": 7}
    assert runner.apply_quick(exp, False) == (exp, {})


@pytest.mark.parametrize(
    ("value", "text"),
    [(2.0, "2.0"), (3, "3"), (True, "true"), (None, "null"), ("llama-68m", "llama-68m"), ("a b", "'a b'"),
     ("1.5", "'1.5'"), ([1, 2], "[1,2]"), ({"a": 1}, "{a:1}"), (float("inf"), "inf")],
)  # fmt: skip
def test_format_value(value: Any, text: str) -> None:
    assert runner.format_value(value) == text


def test_bad_grid_key_and_system_entry() -> None:
    with pytest.raises(ConfigError, match="seed"):
        runner.expand_points({"systems": ["vllm"], "grid": {"seed": [1]}}, {})
    with pytest.raises(ConfigError, match="bogus"):
        runner.system_entries([{"system": "vllm", "bogus": 1}])


def test_unknown_grid_key_names_it(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    with pytest.raises(ConfigError, match="not_a_key"):
        run(conf_dir, tmp_path / "out", "+exp.grid.not_a_key=[1]")


def test_fmt_is_stable() -> None:
    for v in (0.1, 1 / 3, 12345.6789, 2.0, float("nan"), 1e-9):
        once = runner.fmt(v)
        assert runner.fmt(float(once)) == once
    assert runner.fmt(2.0) == "2" and runner.fmt(1 / 3) == "0.333333"


# ---------------------------------------------------------------------------------------- running


def test_sweep_writes_everything(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    out = tmp_path / "out"
    res = run(conf_dir, out, "save_requests=true")
    pts = pd.read_csv(out / "points.csv")
    assert len(pts) == fake.calls == 2 * 2 * 2 * 2
    assert list(pts.columns[:5]) == ["exp", "system", "seed", "rps", "draft"]
    assert set(POINT_METRICS) <= set(pts.columns)
    assert list(pts.columns[-4:]) == ["sim_time_s", "wall_s", "config_hash", "code_version"]
    assert set(pts["system"]) == {"vllm", "sd_k2"}
    assert pts["config_hash"].nunique() == len(pts)
    for f in ("manifest.json", "summary.md", "attain.png", "attain.pdf", "tput.png", "requests.parquet"):
        assert (out / f).exists(), f
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["notes"] == ["fake workload: embedded table"]
    assert manifest["grid_keys"] == ["rps", "draft"] and manifest["seeds"] == [0, 1]
    assert len(pd.read_parquet(out / "requests.parquet")) == 16 * 20
    summary = (out / "summary.md").read_text()
    assert "## Paper claims" in summary and "sd_k2 beats vllm" in summary
    assert "grid_test: 16 points" in res.summary_line()


def test_quick_mode(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    run(conf_dir, tmp_path / "q", "quick=true")
    pts = pd.read_csv(tmp_path / "q" / "points.csv")
    assert len(pts) == 2 and set(pts["rps"]) == {2.0} and set(pts["seed"]) == {0}  # grid replaced whole
    assert "draft" not in pts.columns
    assert set(pts["num_requests"]) == {5}


def test_user_override_beats_quick(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    run(conf_dir, tmp_path / "q", "quick=true", "num_requests=8")
    assert set(pd.read_csv(tmp_path / "q" / "points.csv")["num_requests"]) == {8}


def _without_wall(path: Path) -> list[str]:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    return df.drop(columns="wall_s").to_csv(index=False).splitlines()


def test_byte_identical_apart_from_wall(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    run(conf_dir, tmp_path / "a")
    run(conf_dir, tmp_path / "b", "n_jobs=2")  # the process pool gives the same file
    assert _without_wall(tmp_path / "a" / "points.csv") == _without_wall(tmp_path / "b" / "points.csv")


def test_resume_after_kill(conf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = tmp_path / "ref"
    monkeypatch.setattr(simulate, "run_point", FakeRunPoint())
    run(conf_dir, ref)
    out = tmp_path / "out"
    monkeypatch.setattr(simulate, "run_point", FakeRunPoint(fail_after=5))
    with pytest.raises(KeyboardInterrupt):
        run(conf_dir, out)
    assert len(pd.read_csv(out / "points.csv")) == 5  # finished points survived the kill
    second = FakeRunPoint()
    monkeypatch.setattr(simulate, "run_point", second)
    run(conf_dir, out, "resume=true")
    assert second.calls == 16 - 5
    pts = pd.read_csv(out / "points.csv")
    assert len(pts) == 16 and not pts.duplicated(["system", "seed", "rps", "draft"]).any()
    assert _without_wall(out / "points.csv") == _without_wall(ref / "points.csv")
    # a plain re-run recomputes everything
    third = FakeRunPoint()
    monkeypatch.setattr(simulate, "run_point", third)
    run(conf_dir, out)
    assert third.calls == 16


def test_resume_ignores_a_cut_line(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    out = tmp_path / "out"
    run(conf_dir, out)
    text = (out / "points.csv").read_text()
    (out / "points.csv").write_text(text[: len(text) - 20])  # last line cut mid-write
    fake.calls = 0
    run(conf_dir, out, "resume=true")
    assert fake.calls == 1 and len(pd.read_csv(out / "points.csv")) == 16


def test_config_error_in_point_is_one_line(
    conf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(cfg: DictConfig) -> simulate.PointResult:
        raise ConfigError("system config (systems.vllm.VLLM): unexpected keyword argument 'bogus'")

    monkeypatch.setattr(simulate, "run_point", broken)
    with pytest.raises(ConfigError, match="bogus"):
        run(conf_dir, tmp_path / "o", "n_jobs=2")  # comes back from a worker process as the same error


def test_redraw_from_csv(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    from repro import plot

    out = tmp_path / "out"
    run(conf_dir, out)
    for f in ("attain.png", "summary.md"):
        (out / f).unlink()
    fake.calls = 0
    plot.redraw(out)
    assert fake.calls == 0 and (out / "attain.png").exists() and (out / "summary.md").exists()


# ----------------------------------------------------------------------------------------- claims


def test_claim_kinds() -> None:
    pts = pd.DataFrame({
        "system": ["a", "a", "b", "b", "c", "c"], "rps": [1, 2, 1, 2, 1, 2], "seed": 0,
        "m": [2.0, 6.0, 1.0, 2.0, 1.5, 3.0],
    })  # fmt: skip

    def val(**spec: Any) -> float:
        return claims.evaluate_one(pts, {"metric": "m", "system": "a", **spec}, "rps")

    assert val(kind="ratio_to_best_baseline") == pytest.approx(2.0)  # max(2/1.5, 6/3)
    assert val(kind="ratio_to_best_baseline", reduce="first") == pytest.approx(2 / 1.5)
    assert val(kind="ratio", baseline="b", reduce="last") == pytest.approx(3.0)
    assert val(kind="diff", baseline="b", reduce="min") == pytest.approx(1.0)
    assert val(kind="value_at", where={"rps": 2}) == 6.0
    assert val(kind="max_over") == 6.0 and val(kind="min_over") == 2.0 and val(kind="argmax") == 2
    assert claims.verdict(2.0, {"paper": "2.1x"}) == "holds"
    assert claims.verdict(2.0, {"paper": 4.3}) == "differs"
    assert claims.verdict(2.0, {"paper": 4.3, "check": ">=", "target": 1.5}) == "holds"
    assert claims.verdict(float("nan"), {"paper": 1}) == "n/a"
    with pytest.raises(ConfigError, match="kind"):
        val(kind="nope")
    alone = pts[pts["system"] == "a"]  # a run narrowed to one system: nothing to compare with
    assert math.isnan(claims.evaluate_one(alone, {"metric": "m", "system": "a", "kind": "ratio_to_best_baseline"},
                                          "rps"))


# ------------------------------------------------------------------------------------ calibration


def test_calibration_experiment(tmp_path: Path) -> None:
    out = tmp_path / "cal"
    overrides = ["+exp=calibration", f"out_dir={out}"]
    with runner.hydra_context(runner.CONF_DIR):
        cfg = runner.compose_config(overrides)
    runner.run_experiment(cfg, overrides)
    pts = pd.read_csv(out / "points.csv")
    assert {"table", "kind", "measured_ms", "modelled_ms", "rel_err", "tolerance"} <= set(pts.columns)
    assert (out / "calibration_anchors.png").exists() and (out / "manifest.json").exists()
    assert (
        len(list(out.glob("calibration_*_linear.png")))
        == (pts["kind"] == "linear").groupby(pts["table"]).any().sum()
    )
    assert "within tolerance" in (out / "summary.md").read_text()


def test_derived_speedup_against_a_baseline_system() -> None:
    rows = [
        {"system": "vllm", "seed": "0", "b": "1", "lat": "2"},
        {"system": "sd", "seed": "0", "b": "1", "lat": "1"},
        {"system": "sd", "seed": "0", "b": "2", "lat": "1"},  # no baseline at b=2: nan
    ]
    out = runner.derive(rows, [{"name": "speedup", "metric": "lat", "baseline": "vllm", "invert": True}], ["seed", "b"])
    assert [r["speedup"] for r in out] == ["1", "2", "nan"]
    with pytest.raises(ConfigError, match="needs name"):
        runner.derive(rows, [{"name": "x", "metric": "lat"}], ["seed"])


def test_derived_normalize_over_a_grid_column() -> None:
    rows = [
        {"system": "sd", "seed": "0", "b": "1", "k": "1", "g": "2"},
        {"system": "sd", "seed": "0", "b": "1", "k": "2", "g": "4"},
        {"system": "sd", "seed": "0", "b": "2", "k": "1", "g": "3"},
        {"system": "sd", "seed": "0", "b": "2", "k": "2", "g": "1.5"},
        {"system": "other", "seed": "0", "b": "1", "k": "1", "g": "8"},  # its own group
    ]
    out = runner.derive(rows, [{"name": "norm", "metric": "g", "normalize": "k"}], ["seed", "b", "k"])
    assert [r["norm"] for r in out] == ["0.5", "1", "1", "0.5", "1"]
    with pytest.raises(ConfigError, match="not a grid column"):
        runner.derive(rows, [{"name": "x", "metric": "g", "normalize": "zz"}], ["seed", "b", "k"])
    with pytest.raises(ConfigError, match="either baseline"):
        runner.derive(rows, [{"name": "x", "metric": "g", "normalize": "k", "baseline": "sd"}], ["seed", "k"])


def test_identical_points_from_two_cases_keep_their_own_labels(
    conf_dir: Path, tmp_path: Path, fake: FakeRunPoint
) -> None:
    exp = """# @package _global_
num_requests: 20
exp:
  name: dup_test
  systems: [vllm]
  case_key: panel
  cases:
    - {label: a, grid: {rps: [1.0, 2.0]}}
    - {label: b, grid: {rps: [2.0]}}
    - {label: c, overrides: {rps: 2.0}}
"""
    (conf_dir / "exp" / "dup_test.yaml").write_text(exp)
    overrides = ["+exp=dup_test", f"out_dir={tmp_path / 'o'}", "n_jobs=1"]
    with runner.hydra_context(conf_dir):
        cfg = runner.compose_config(overrides)
    pts = runner.run_experiment(cfg, overrides, conf_dir=conf_dir).points
    assert list(pts["panel"]) == ["a", "a", "b", "c"]
    assert [str(v) for v in pts["rps"]] == ["1.0", "2.0", "2.0", "nan"]
    assert pts["config_hash"].iloc[1] == pts["config_hash"].iloc[2] == pts["config_hash"].iloc[3]
    assert pts["throughput_tok_s"].iloc[1] == pts["throughput_tok_s"].iloc[2]
