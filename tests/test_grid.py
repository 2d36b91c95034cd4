"""repro.experiments.grid: the points of an experiment (seeds × systems × cases × grid) and their Hydra overrides."""

from __future__ import annotations

from typing import Any

import pytest

from repro.core.errors import ConfigError
from repro.experiments.expspec import ExpSpec
from repro.experiments.grid import by_workload, expand_points, format_value, group_overrides
from repro.experiments.results import CONF_DIR

GROUPS = group_overrides(CONF_DIR)


def points(exp: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    return [(p.system, p.seed, dict(p.values)) for p in expand_points(ExpSpec.parse(exp), GROUPS)]


def test_groups_map_keys_to_their_override() -> None:
    assert GROUPS["draft"] == "model@draft" and GROUPS["model"] == "model" and GROUPS["hardware"] == "hardware"


def test_order_and_overrides() -> None:
    exp = {"systems": ["vllm", {"system": "static_sd", "label": "k2", "overrides": {"system.k": 2}}],
           "grid": {"rps": [1.0, 2.0], "draft": ["llama-68m"]}, "seeds": [3]}  # fmt: skip
    assert [(s, seed, v["rps"]) for s, seed, v in points(exp)] == [
        ("vllm", 3, 1.0), ("vllm", 3, 2.0), ("k2", 3, 1.0), ("k2", 3, 2.0),
    ]  # fmt: skip
    assert expand_points(ExpSpec.parse(exp), GROUPS)[2].overrides == (
        "system=static_sd",
        "seed=3",
        "rps=1.0",
        "model@draft=llama-68m",
        "system.k=2",
    )


def test_points_run_grouped_by_their_requests() -> None:
    """by_workload: each seed's grid values served by every system one after another (the oracle's chunks of those
    requests drawn once per worker), groups in order of first appearance; a subset keeps only its own points."""
    exp = {"systems": ["vllm", "static_sd", "dsd"], "grid": {"rps": [1.0, 2.0]}, "seeds": [0, 1]}
    pts = expand_points(ExpSpec.parse(exp), GROUPS)
    order = [(pts[i].seed, dict(pts[i].values)["rps"], pts[i].system) for i in by_workload(pts, range(len(pts)))]
    assert order == [(seed, rps, s) for seed in (0, 1) for rps in (1.0, 2.0) for s in ("vllm", "static_sd", "dsd")]
    assert sorted(by_workload(pts, range(len(pts)))) == list(range(len(pts)))
    assert by_workload(pts, [5, 0, 3]) == [5, 3, 0]  # dsd and static_sd at rps 2.0 (the first given), then vllm at 1.0


def test_cases_bundle_overrides_with_their_own_grid() -> None:
    exp = {"systems": ["vllm"], "case_key": "model", "cases": [
        {"label": "7b", "overrides": {"model": "llama2-7b"}, "grid": {"rps": [1.0, 2.0]}},
        {"label": "70b", "overrides": {"model": "llama2-70b", "tp": 4}, "grid": {"rps": [0.5]}},
    ]}  # fmt: skip
    assert [v for *_, v in points(exp)] == [
        {"model": "7b", "rps": 1.0}, {"model": "7b", "rps": 2.0}, {"model": "70b", "rps": 0.5},
    ]  # fmt: skip
    assert expand_points(ExpSpec.parse(exp), GROUPS)[2].overrides == (
        "system=vllm", "seed=0", "model=llama2-70b", "tp=4", "rps=0.5",
    )  # fmt: skip
    assert ExpSpec.parse(exp).grid_columns() == ["model", "rps"]


def test_a_case_with_its_own_systems_replaces_the_experiments() -> None:
    exp = {
        "systems": ["vllm", {"system": "static_sd", "label": "sd", "overrides": {"system.k": 2}}],
        "seeds": [0, 1],
        "cases": [
            {"label": "draft", "grid": {"rps": [1.0]}},  # the experiment's systems
            {"label": "pld", "grid": {"rps": [1.0]}, "overrides": {"dataset": "cnn"},  # its own: sd (k 3) and turbospec
             "systems": [{"system": "static_sd", "label": "sd", "overrides": {"system.k": 3}}, "turbospec"]},
        ],
    }
    pts = expand_points(ExpSpec.parse(exp), GROUPS)
    # per seed: each label in order of first appearance, then the cases that run it
    assert [(p.seed, p.system, dict(p.values)["case"]) for p in pts] == [
        (0, "vllm", "draft"), (0, "sd", "draft"), (0, "sd", "pld"), (0, "turbospec", "pld"),
        (1, "vllm", "draft"), (1, "sd", "draft"), (1, "sd", "pld"), (1, "turbospec", "pld"),
    ]  # fmt: skip
    assert pts[1].overrides == ("system=static_sd", "seed=0", "rps=1.0", "system.k=2")
    assert pts[2].overrides == ("system=static_sd", "seed=0", "dataset=cnn", "rps=1.0", "system.k=3")
    assert pts[3].overrides == ("system=turbospec", "seed=0", "dataset=cnn", "rps=1.0")


@pytest.mark.parametrize(
    ("value", "text"),
    [(2.0, "2.0"), (3, "3"), (True, "true"), (None, "null"), ("llama-68m", "llama-68m"), ("a b", "'a b'"),
     ("1.5", "'1.5'"), ([1, 2], "[1,2]"), ({"a": 1}, "{a:1}"), (float("inf"), "inf")],
)  # fmt: skip
def test_format_value(value: Any, text: str) -> None:
    assert format_value(value) == text


def test_case_columns_are_constant_columns_not_overrides() -> None:
    """validate_vllm_v1's ``draft`` column: the Hugging Face id, beside the case key, never a config override."""
    exp = {"systems": ["vllm"], "case_key": "method", "cases": [
        {"label": "none", "columns": {"draft": ""}, "grid": {"k": [0]}},
        {"label": "draft_model", "columns": {"draft": "Qwen/Qwen3-1.7B"}, "overrides": {"draft": "qwen3-1.7b"},
         "grid": {"k": [1, 2]}},
    ]}  # fmt: skip
    pts = expand_points(ExpSpec.parse(exp), GROUPS)
    assert [dict(p.values) for p in pts] == [
        {"method": "none", "draft": "", "k": 0},
        {"method": "draft_model", "draft": "Qwen/Qwen3-1.7B", "k": 1},
        {"method": "draft_model", "draft": "Qwen/Qwen3-1.7B", "k": 2},
    ]  # fmt: skip
    assert pts[1].overrides == ("system=vllm", "seed=0", "model@draft=qwen3-1.7b", "k=1")
    assert ExpSpec.parse(exp).grid_columns() == ["method", "draft", "k"]
    with pytest.raises(ConfigError, match="columns"):
        ExpSpec.parse({"systems": ["vllm"], "cases": [{"label": "a", "columns": {"k": 1}, "grid": {"k": [1]}}]})
