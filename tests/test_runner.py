"""repro.experiments.runner: sweeps with a fake ``run_point`` (files, quick mode, resume, determinism, cases with their
own systems, exp typos), paper claims, the calibration kind."""

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

from repro.core.errors import ConfigError
from repro.experiments import claims, launch, runner, simulate
from repro.experiments.compose import compose_config, hydra_context
from repro.experiments.expspec import ExpSpec
from repro.experiments.results import CONF_DIR, default_out_dir
from repro.experiments.stopping import Interrupted
from repro.metrics.summary import POINT_METRICS, summarize

# the subject does not depend on where the workload comes from: pinned to the embedded statistics
# (conftest.no_data), so CI's no-data pass need not repeat it
pytestmark = pytest.mark.usefixtures("no_data")

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
    - {name: tput, kind: bar, x: rps, y: output_throughput}
  claims:
    - {text: "sd_k2 beats vllm", paper: 1.0, kind: ratio_to_best_baseline, metric: output_throughput,
       system: sd_k2, check: ">="}
"""


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    """A copy of the repo's conf/ with the test experiment added."""
    dst = tmp_path / "conf"
    shutil.copytree(CONF_DIR, dst)
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
    """Stands in for repro.experiments.simulate.run_point; can fail after ``fail_after`` calls (a simulated kill)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls = 0
        self.fail_after = fail_after

    def __call__(self, cfg: DictConfig, latencies: bool = True) -> simulate.PointResult:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated kill")
        self.calls += 1
        req = fake_requests(cfg)
        sim_time = float(req["finish_at"].max())
        return simulate.PointResult(summarize(req, sim_time), req, None, ["fake workload: embedded table"])


def run(conf_dir: Path, out_dir: Path, *extra: str) -> runner.ExperimentResult:
    overrides = ["+exp=grid_test", f"out_dir={out_dir}", "n_jobs=1", *extra]
    with hydra_context(conf_dir):
        cfg = compose_config(overrides)
    return runner.run_experiment(cfg, overrides, conf_dir=conf_dir)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRunPoint:
    f = FakeRunPoint()
    monkeypatch.setattr(simulate, "run_point", f)
    return f


def test_unknown_grid_key_names_it(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    with pytest.raises(ConfigError, match="not_a_key"):
        run(conf_dir, tmp_path / "out", "+exp.grid.not_a_key=[1]")


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


def test_a_swept_key_set_under_exp_beats_quick(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    run(conf_dir, tmp_path / "q", "quick=true", "exp.grid.rps=[1.0]", "exp.seeds=[1]")
    pts = pd.read_csv(tmp_path / "q" / "points.csv")
    assert set(pts["rps"]) == {1.0} and set(pts["seed"]) == {1} and "draft" not in pts.columns


@pytest.mark.parametrize(
    ("extra", "warned", "noted"),
    [
        (["exp.systems=[vllm,laps_sd]"], True, True),  # the command line compares systems of two papers
        (["exp.systems=[vllm,laps_sd]", "engine=pytorch_mq"], False, False),  # ... on one engine, as asked
        (["exp.systems=[vllm,static_sd]"], False, False),  # one engine
    ],
)
def test_systems_on_different_engines_are_named(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint,
                                                capsys: pytest.CaptureFixture[str], extra: list[str], warned: bool,
                                                noted: bool) -> None:
    res = run(conf_dir, tmp_path / "o", "quick=true", *extra)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning: engine profiles")]
    summary = (tmp_path / "o" / "summary.md").read_text()
    line = "vllm on vllm_v0; laps_sd on pytorch_mq (each system on its own paper's engine, as its config names it); " \
           "engine=NAME runs every system on one"
    assert err == ([f"warning: engine profiles differ: {line}"] if warned else [])
    assert (f"> **Engine profiles differ: {line}**" in summary) == noted
    assert res.manifest["engines"]["vllm"] == ("pytorch_mq" if "engine=pytorch_mq" in extra else "vllm_v0")


def test_an_experiment_comparing_engines_says_so_without_warning(
        conf_dir: Path, tmp_path: Path, fake: FakeRunPoint, capsys: pytest.CaptureFixture[str]) -> None:
    exp = (conf_dir / "exp" / "grid_test.yaml").read_text().replace("    - vllm\n", "    - vllm\n    - laps_sd\n")
    (conf_dir / "exp" / "grid_test.yaml").write_text(exp)
    res = run(conf_dir, tmp_path / "o", "quick=true")
    assert "warning" not in capsys.readouterr().err and "engine_warning" not in res.manifest
    summary = (tmp_path / "o" / "summary.md").read_text()
    assert "\nEngine profiles: vllm, sd_k2 on vllm_v0; laps_sd on pytorch_mq (each system on its paper's engine, as " \
           "the experiment compares them); engine=NAME runs every system on one.\n" in summary


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
    with pytest.raises(Interrupted) as stop:  # Ctrl-C during the sixth point
        run(conf_dir, out)
    assert (stop.value.saved, stop.value.total, stop.value.path) == (5, 16, out / "points.csv")
    assert len(pd.read_csv(out / "points.csv")) == 5  # finished points survived the kill
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["interrupted"] == {"signal": "SIGINT", "points_saved": 5, "points_total": 16}
    with pytest.raises(ConfigError, match=r"holds 5 of this run's 16 points .*resume=true"):
        run(conf_dir, out)  # a plain run would start the unfinished one afresh
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
    def broken(cfg: DictConfig, latencies: bool = True) -> simulate.PointResult:
        raise ConfigError("system config (systems.vllm.VLLM): unexpected keyword argument 'bogus'")

    monkeypatch.setattr(simulate, "run_point", broken)
    # from a worker process, the same error: two workers race, and either of the first two points submitted (a
    # workload's systems go one after another, grid.by_workload) may fail first
    for n_jobs in (1, 2):
        with pytest.raises(ConfigError, match=r"^point (vllm|sd_k2) seed=0 rps=1.0 draft=llama-\S+ \(.*\): .*bogus"):
            run(conf_dir, tmp_path / "o", f"n_jobs={n_jobs}")
        assert not (tmp_path / "o").exists()  # failed before a point finished: nothing written


def test_redraw_from_csv(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    from repro.experiments import render

    out = tmp_path / "out"
    run(conf_dir, out)
    for f in ("attain.png", "summary.md"):
        (out / f).unlink()
    fake.calls = 0
    render.redraw(out)
    assert fake.calls == 0 and (out / "attain.png").exists() and (out / "summary.md").exists()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_another_run_in_the_folder_is_refused_unless_replaced(
    conf_dir: Path, tmp_path: Path, fake: FakeRunPoint
) -> None:
    out = tmp_path / "out"
    run(conf_dir, out)
    before = _files(out)
    for extra in (["system=vllm"], ["system=vllm", "resume=true"], ["num_requests=7"]):
        with pytest.raises(ConfigError, match=r"holds another run of grid_test \(16 points, (8|none) of them in "
                                              r"this run\): give out_dir=DIR .* or overwrite=true"):
            run(conf_dir, out, *extra)
        assert _files(out) == before, extra
    fake.calls = 0
    run(conf_dir, out, "system=vllm", "overwrite=true")
    assert fake.calls == 8 and len(pd.read_csv(out / "points.csv")) == 8
    run(conf_dir, out, "resume=true")  # the other 8 points
    assert fake.calls == 16 and len(pd.read_csv(out / "points.csv")) == 16


def test_a_point_failing_first_leaves_the_folder_untouched(
    conf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    monkeypatch.setattr(simulate, "run_point", FakeRunPoint())
    run(conf_dir, out)
    before = _files(out)

    def broken(cfg: DictConfig, latencies: bool = True) -> simulate.PointResult:
        raise ConfigError("no such trace")

    monkeypatch.setattr(simulate, "run_point", broken)
    with pytest.raises(ConfigError, match="no such trace"):
        run(conf_dir, out)  # the same points: a plain re-run may replace them, once one has finished
    assert _files(out) == before


def test_a_narrowed_run_writes_beside_the_experiment(
    conf_dir: Path, tmp_path: Path, fake: FakeRunPoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "default_out_dir",
                        lambda name, quick, by=(): default_out_dir(name, quick, by, root=tmp_path))
    for extra, folder in [
        ((), "grid_test"),
        (("num_requests=7",), "grid_test@num_requests=7"),  # not a narrowing, but other points: a folder of its own
        (("rps=2", "system=vllm"), "grid_test@rps=2,system=vllm"),
        (("system=vllm", "rps=2.0", "quick=true"), "quick/grid_test@rps=2,system=vllm"),  # as the command line says
        (("n_jobs=2", "save_requests=true"), "grid_test"),  # how to run, not what: the plain folder (same points)
    ]:
        overrides = ["+exp=grid_test", "n_jobs=1", *extra]
        with hydra_context(conf_dir):
            cfg = compose_config(overrides)
        try:
            res = runner.run_experiment(cfg, overrides, conf_dir=conf_dir, log=lambda _: None)
        except ConfigError as exc:
            raise AssertionError(f"{extra}: {exc}") from None
        assert res.out_dir == tmp_path / "runs" / folder and (res.out_dir / "summary.md").is_file()
    assert len(pd.read_csv(tmp_path / "runs" / "grid_test" / "points.csv")) == 16
    long = default_out_dir("default", False, ["exp.systems=[vllm,static_sd_k3]", "workload=trace_file",
                                              "workload.path=my_trace.csv", "workload.arrival.rate_per_s=5"])
    assert len(long.name) < 80 and long.name.startswith("default@exp.systems=_vllm_static_sd_k3_,") and "~" in long.name
    assert long != default_out_dir("default", False, ["exp.systems=[vllm,static_sd_k3]", "workload=trace_file",
                                                      "workload.path=my_trace.csv", "workload.arrival.rate_per_s=6"])


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


def test_claims_also_for_a_systems_readings_and_never_against_them() -> None:
    """exp.claims_also_for {a: [a2]}: each claim about a gets a row for a2 ("[a2]"), and a2 is not a's baseline nor
    a a2's (the paper's baselines, b and c, are)."""
    pts = pd.DataFrame({"system": ["a", "a2", "b", "c"], "rps": 1, "seed": 0, "m": [2.0, 8.0, 1.0, 1.6]})
    spec = [{"text": "a beats the rest", "paper": ">= 1", "kind": "ratio_to_best_baseline", "metric": "m",
             "system": "a"},
            {"text": "b is slow", "paper": 1.0, "kind": "value_at", "metric": "m", "system": "b"}]
    table = claims.evaluate(spec, pts, "rps", {"a": ["a2"]})
    assert table["claim"].tolist() == ["a beats the rest", "a beats the rest [a2]", "b is slow"]
    assert table["reproduced"].tolist() == pytest.approx([2.0 / 1.6, 8.0 / 1.6, 1.0])
    plain = claims.evaluate(spec, pts, "rps")  # without it, a2 is one more baseline of a
    assert plain["reproduced"].tolist() == pytest.approx([2.0 / 8.0, 1.0])
    with pytest.raises(ConfigError, match="claims_also_for"):
        ExpSpec.parse({"claims_also_for": {"a": "a2"}})


# ------------------------------------------------------------------------------------ calibration


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
    with hydra_context(conf_dir):
        cfg = compose_config(overrides)
    pts = runner.run_experiment(cfg, overrides, conf_dir=conf_dir).points
    assert list(pts["panel"]) == ["a", "a", "b", "c"]
    assert [str(v) for v in pts["rps"]] == ["1.0", "2.0", "2.0", "nan"]
    assert pts["config_hash"].iloc[1] == pts["config_hash"].iloc[2] == pts["config_hash"].iloc[3]
    assert pts["output_throughput"].iloc[1] == pts["output_throughput"].iloc[2]


def run_yaml(conf_dir: Path, out_dir: Path, name: str, text: str, *extra: str) -> runner.ExperimentResult:
    """Run the experiment file ``text`` (saved as conf/exp/NAME.yaml) with the fake ``run_point``."""
    (conf_dir / "exp" / f"{name}.yaml").write_text(text)
    overrides = [f"+exp={name}", f"out_dir={out_dir}", "n_jobs=1", *extra]
    with hydra_context(conf_dir):
        cfg = compose_config(overrides)
    return runner.run_experiment(cfg, overrides, conf_dir=conf_dir, log=lambda _: None)


CASE_SYSTEMS = """# @package _global_
num_requests: 20
exp:
  name: case_systems
  systems: [vllm, {system: static_sd, label: sd, overrides: {system.k: 2}}]
  case_key: panel
  cases:
    - {label: a, grid: {rps: [1.0, 2.0]}}
    - {label: b, grid: {rps: [2.0]}, systems: [{system: static_sd, label: sd, overrides: {system.k: 4}}, turbospec]}
  derived:
    - {name: speedup, metric: mean_latency_s, baseline: vllm, invert: true}
"""


def test_a_case_with_its_own_systems(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    res = run_yaml(conf_dir, tmp_path / "o", "case_systems", CASE_SYSTEMS)
    pts = res.points
    # seeds x systems (labels in order of first appearance) x cases that run them x grid
    assert list(zip(pts["system"], pts["panel"], pts["rps"], strict=True)) == [
        ("vllm", "a", 1.0), ("vllm", "a", 2.0), ("sd", "a", 1.0), ("sd", "a", 2.0), ("sd", "b", 2.0),
        ("turbospec", "b", 2.0),
    ]  # fmt: skip
    assert fake.calls == 6 and pts["config_hash"].nunique() == 6  # case b's sd is k = 4, not the experiment's k = 2
    assert res.manifest["systems"] == ["vllm", "sd", "turbospec"]
    lat = pts.set_index(["system", "panel", "rps"])["mean_latency_s"]
    speedup = pts.set_index(["system", "panel", "rps"])["speedup"]
    assert speedup["sd", "a", 2.0] == pytest.approx(lat["vllm", "a", 2.0] / lat["sd", "a", 2.0], rel=1e-5)
    assert math.isnan(speedup["sd", "b", 2.0])  # case b runs no vllm: no baseline
    narrowed = run_yaml(conf_dir, tmp_path / "n", "case_systems", CASE_SYSTEMS, "system=turbospec")
    assert list(zip(narrowed.points["system"], narrowed.points["panel"], strict=True)) == [("turbospec", "b")]
    assert narrowed.manifest["narrowed"] == ["system=turbospec: runs turbospec only (the experiment compares vllm, "
                                             "sd, turbospec)"]


def test_a_typo_in_the_exp_block_is_named(conf_dir: Path, tmp_path: Path, fake: FakeRunPoint) -> None:
    typo = "# @package _global_\nexp:\n  name: typo\n  sytems: [vllm]\n"
    with pytest.raises(ConfigError, match=r"exp\.sytems \(did you mean 'systems'\?\) \(known: name, title") as err:
        run_yaml(conf_dir, tmp_path / "o", "typo", typo)
    assert "\n" not in str(err.value) and fake.calls == 0


def test_save_columns_keeps_rid_and_the_named_columns() -> None:
    req = pd.DataFrame({"rid": [0, 1], "arrival_s": [0.0, 1.0], "finish_at": [2.0, 3.0], "service_s": [1.0, 1.5]})
    assert list(launch.saved_columns(req, None).columns) == list(req.columns)
    assert list(launch.saved_columns(req, ["finish_at", "arrival_s"]).columns) == ["rid", "arrival_s", "finish_at"]
    with pytest.raises(ConfigError, match=r"save_columns: no requests-table column\(s\) \['finsh_at'\]"):
        launch.saved_columns(req, ["finsh_at"])
    with pytest.raises(ConfigError, match="expected a list"):
        launch.saved_columns(req, "finish_at")


def test_time_left_comes_from_the_points_own_rate() -> None:
    """The estimate counts from the first finished point (the wait for it, the workers' start-up, is not a point's
    time), once three more have finished."""
    from repro.experiments.launch import ProgressLines

    lines = ProgressLines("x", total=10, enabled=False)
    lines.t0 = 0.0
    assert lines.left_s(100.0) is None
    for _ in range(4):
        lines.update()
    lines.first = 60.0  # the first point finished after 60 s of start-up
    assert lines.left_s(63.0) == pytest.approx((63.0 - 60.0) / 3 * 6)  # 1 s a point, 6 left
