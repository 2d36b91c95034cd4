"""The league (issue 34): the leaderboard's arithmetic on hand-computable tables, its config block's errors, every
policy accounted for in every scenario of the committed reference, and a policy of one's own brought to it as
docs/adding-a-system.md adds one (``exp.systems=[+NAME]``)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from omegaconf import OmegaConf
from user_policies import my_policy_source

from repro.core.errors import ConfigError
from repro.experiments import check, league
from repro.experiments.expspec import ExpSpec
from repro.experiments.planning import plan_points
from repro.experiments.runner import add_systems, plan_experiment

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def _points() -> pd.DataFrame:
    """Two scenarios x two loads x three systems; a wins everywhere on goodput except (s2, 1.2), where c does."""
    rows = []
    values = {  # (scenario, load): {system: (goodput, throughput, mean latency)}
        ("s1", 0.5): {"a": (100.0, 50.0, 1.0), "b": (80.0, 50.0, 2.0), "c": (50.0, 50.0, 4.0)},
        ("s1", 1.2): {"a": (200.0, 300.0, 2.0), "b": (100.0, 200.0, 3.0), "c": (150.0, 100.0, 4.0)},
        ("s2", 0.5): {"a": (10.0, 5.0, 1.0), "b": (5.0, 5.0, 2.0), "c": (8.0, 5.0, 1.0)},
        ("s2", 1.2): {"a": (30.0, 60.0, 2.0), "b": (20.0, 40.0, 4.0), "c": (40.0, 30.0, 1.0)},
    }
    for (scenario, load), by in values.items():
        for system, (good, thr, lat) in by.items():
            rows.append({"scenario": scenario, "load": load, "system": system, "goodput_tok_s": good,
                         "output_throughput": thr, "mean_latency_s": lat})
    return pd.DataFrame(rows)


SPEC = league.LeagueSpec(metrics=("goodput_tok_s", "output_throughput", "mean_latency_s"))


def test_winners_and_margins() -> None:
    wins = league.winners(_points(), SPEC, "scenario").set_index(["scenario", "load"])
    assert list(wins["best"]) == ["a", "a", "a", "c"]
    assert wins.loc[("s1", 0.5), "runner_up"] == "b" and wins.loc[("s1", 0.5), "margin"] == pytest.approx(0.25)
    assert wins.loc[("s2", 1.2), "margin"] == pytest.approx(40 / 30 - 1)


def test_ranking_leaves_throughput_out_below_saturation() -> None:
    rank = league.ranking(_points(), SPEC, "scenario").set_index("system")
    # a: goodput ranks 1,1,1,2; throughput (only at load 1.2) 1,1; latency 1,1,1.5,2 -> 12.5 / 10
    assert rank.loc["a", "mean_rank"] == pytest.approx(12.5 / 10)
    assert rank.loc["a", "wins"] == 3 and rank.loc["c", "wins"] == 1 and rank.loc["b", "wins"] == 0
    assert rank.index[0] == "a"
    # throughput / best over the two saturated cells only: b = sqrt(200/300 * 40/60)
    assert rank.loc["b", "output_throughput_vs_best"] == pytest.approx(math.sqrt(2 / 3 * 2 / 3))
    # latency, lower is better: c's normalized values 1/4 (4.0 against 1.0), 1/2 (4.0 against 2.0), 1, 1
    assert rank.loc["c", "mean_latency_s_vs_best"] == pytest.approx((1 / 4 * 1 / 2) ** 0.25)
    # throughput counted in every cell would rank the arrival-bound ties too: a then ranks 2 there, not absent
    every = league.ranking(_points(), league.LeagueSpec(metrics=SPEC.metrics, saturated_from=0.0), "scenario")
    assert every.set_index("system")["mean_rank"]["a"] != pytest.approx(rank["mean_rank"]["a"])


def test_coverage_names_a_reason_or_a_gap() -> None:
    spec = league.LeagueSpec(unavailable=(league.Unavailable("g", "needs edge servers"),
                                          league.Unavailable("c", "not on s2", ("s2",))))
    pts = _points()
    cover = league.coverage(pts[~((pts.system == "c") & (pts.scenario == "s2"))], ["a", "b", "c", "d"],
                            ["s1", "s2"], spec, "scenario").set_index("system")
    assert cover.loc["c", "s1"] == league.RAN and cover.loc["c", "s2"] == "not on s2"
    assert cover.loc["g", "s1"] == "needs edge servers"
    assert cover.loc["d", "s2"] == "missing"


@pytest.mark.parametrize(("block", "needle"), [
    ({"primary": "goodness"}, "unknown metric 'goodness'"),
    ({"metrics": ["goodput_tok_s", "p98_latency_s"]}, "p98_latency_s"),
    ({"unavailable": [{"system": "goodspeed"}]}, "exp.league.unavailable[0]: needs a system and a reason"),
    ({"winner": "goodput_tok_s"}, "unknown key(s) winner"),
])
def test_a_bad_league_block_is_named(block: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        ExpSpec.parse({"name": "x", "systems": ["vllm"], "league": block})


def _league_systems() -> tuple[list[str], list[str], league.LeagueSpec]:
    raw: Any = OmegaConf.to_container(OmegaConf.load(CONF / "exp" / "league.yaml"))
    exp = ExpSpec.parse(raw["exp"])
    return exp.system_labels(), [str(c.label) for c in exp.cases], league.LeagueSpec.parse(exp.league)


def test_every_policy_the_issue_names_is_in_the_league() -> None:
    systems, _, spec = _league_systems()
    named = {"adaserve", "turbospec", "nightjar", "nightjar_authors", "laps_sd", "specinfer", "dsd", "banditspec",
             "tetris", "vllm", "static_sd_by_batch", *(f"static_sd_k{k}" for k in range(1, 6))}
    assert named <= set(systems)
    assert "goodspeed" in {u.system for u in spec.unavailable}


@pytest.mark.parametrize("folder", ["league", "quick/league"])
def test_the_reference_accounts_for_every_policy_in_every_scenario(folder: str) -> None:
    ref = ROOT / "results" / folder
    points = pd.read_csv(ref / "points.csv")
    systems, scenarios, spec = _league_systems()
    scenarios = [s for s in scenarios if s in set(points["scenario"])]
    cover = league.coverage(points, systems, scenarios, spec, "scenario")
    assert not (cover[scenarios] == "missing").any().any(), cover
    assert (cover.set_index("system").loc[systems, scenarios] == league.RAN).all().all()
    if folder == "league":  # the quick reference keeps its tables only
        assert (ref / "who_wins.png").is_file() and (ref / "ranking.csv").is_file()


def test_plus_entries_add_to_the_experiments_own_systems() -> None:
    own = OmegaConf.load(CONF / "exp" / "league.yaml").exp
    cfg = OmegaConf.create({"quick": False, "exp": {"systems": ["+my_policy"]}})
    add_systems(cfg, ["+exp=league"], CONF)
    assert list(cfg.exp.systems)[:-1] == OmegaConf.to_container(own.systems)
    assert cfg.exp.systems[-1] == "my_policy"
    quick = OmegaConf.create({"quick": True, "exp": {"systems": ["+my_policy"]}})
    add_systems(quick, ["+exp=adaserve_fig4"], CONF)
    assert list(quick.exp.systems) == [*OmegaConf.load(CONF / "exp" / "adaserve_fig4.yaml").exp.quick.systems,
                                       "my_policy"]
    mixed = OmegaConf.create({"quick": False, "exp": {"systems": ["vllm", "+my_policy"]}})
    with pytest.raises(ConfigError, match="either every entry adds"):
        add_systems(mixed, ["+exp=league"], CONF)
    with pytest.raises(ConfigError, match=r"name the experiment \(\+exp=NAME\)"):
        add_systems(OmegaConf.create({"exp": {"systems": ["+my_policy"]}}), [], CONF)


MY_POLICY = my_policy_source()  # the recipe's example, tests/user_policies.py


def test_bring_your_own_policy_to_the_league(tmp_path: Path) -> None:
    """docs/recipes.md's league recipe as a user runs it in their checkout: systems/my_policy.py and
    conf/system/my_policy.yaml written (docs/adding-a-system.md), then +exp=league 'exp.systems=[+my_policy]'."""
    for part in ("repro", "systems", "workloads", "conf"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "systems" / "my_policy.py").write_text(MY_POLICY)
    (tmp_path / "conf" / "system" / "my_policy.yaml").write_text(
        "defaults:\n  - static_sd\n  - _self_\n\n_target_: systems.my_policy.MyPolicy\ndisplay_name: \"My policy\"\n")
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "repro", "+exp=league", "exp.systems=[+my_policy]", "quick=true",
                          "n_jobs=2", "num_requests=30", f"out_dir={out}"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-3000:]
    points = pd.read_csv(out / "points.csv")
    mine = points[points["system"] == "my_policy"]
    assert len(mine) == points.groupby(["scenario", "load"]).ngroups and (mine["completed"] > 0).all()
    assert "adaserve" in set(points["system"])  # beside the league's own, not instead of them
    assert "my_policy" in set(pd.read_csv(out / "ranking.csv")["system"])
    assert "my_policy" in (out / "summary.md").read_text()


def test_the_manuals_ranking_is_the_references() -> None:
    """docs/league.md's ranking table (rank, policy, mean rank, wins, the three ratios) reads
    results/league/ranking.csv: a regenerated reference that moves the ranking must move the manual too."""
    text = (ROOT / "docs" / "league.md").read_text()
    block = text.split("<!-- league ranking: results/league/ranking.csv")[1].split("\n\n")[0]
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in block.splitlines()[3:]]
    rank = pd.read_csv(ROOT / "results" / "league" / "ranking.csv")
    assert [r[1] for r in rows] == list(rank["system"])
    for r, (_, ref) in zip(rows, rank.iterrows(), strict=True):
        assert [float(r[2]), int(r[3]), float(r[4]), float(r[5]), float(r[6])] == [
            round(ref["mean_rank"], 2), int(ref["wins"]), round(ref["goodput_tok_s_vs_best"], 2),
            round(ref["slo_attainment_vs_best"], 2), round(ref["p99_latency_s_vs_best"], 2)]


def test_the_dynamic_rate_follows_the_load(tmp_path: Path) -> None:
    """The dynamic-rate scenario's arrival schedule is Nightjar's segment scaled to a mean of load x capacity_rps,
    point by point: its case overrides are escaped interpolations, resolved in each point's config. (Written
    unescaped they resolved once, at the experiment's load 0.5, and the four loads ran one schedule.)"""
    cfg, overrides = check._compose("league", False, [])
    points, _, resolved = plan_points(plan_experiment(cfg, overrides, out_dir=tmp_path, log=lambda _: None))
    resolved = [r for p, r in zip(points, resolved, strict=True)
                if p.system == "vllm" and dict(p.values)["scenario"].endswith("dynamic-rate")]
    assert len(resolved) == 4
    for r in resolved:
        segments = r["workload"]["arrival"]["segments"]
        assert r["workload"]["arrival"]["kind"] == "piecewise" and len(segments) == 20
        mean = sum(d * rate for d, rate in segments) / sum(d for d, _ in segments)
        assert mean == pytest.approx(r["load"] * r["capacity_rps"], rel=1e-3)
    assert len({r["load"] for r in resolved}) == 4
