"""The command-line rule (repro.experiments.narrow): the command line always wins, and it narrows what it names."""

from __future__ import annotations

from typing import Any

import pytest

from repro.core.errors import ConfigError
from repro.experiments.grid import group_overrides
from repro.experiments.narrow import UserValue, narrow, parse
from repro.experiments.simulate import CONF_DIR, compose

EXP: dict[str, Any] = {
    "name": "toy",
    "systems": ["vllm", {"system": "static_sd", "label": "k5", "overrides": {"system.k": 5, "system.proposer": "x"}},
                "static_sd_k3"],
    "seeds": [0, 1],
    "case_key": "size",
    "cases": [
        {"label": "7b", "overrides": {"model": "llama2-7b", "tp": 1}, "grid": {"rps": [1.0, 2.0, 4.0]}},
        {"label": "70b", "overrides": {"model": "llama2-70b", "tp": 4}, "grid": {"rps": [0.5, 1.0]}},
    ],
}


def uv(key: str, value: Any, group: bool = False) -> UserValue:
    return UserValue(key, value, f"{key}={value}", added=False, group=group)


def labels(exp: dict[str, Any]) -> list[str]:
    return [e if isinstance(e, str) else e["label"] for e in exp["systems"]]


@pytest.mark.parametrize(
    ("user", "systems", "cases", "lines"),
    [
        ([], ["vllm", "k5", "static_sd_k3"], {"7b": [1.0, 2.0, 4.0], "70b": [0.5, 1.0]}, 0),  # nothing typed
        ([uv("rps", 3)], ["vllm", "k5", "static_sd_k3"], {"7b": [3], "70b": [3]}, 1),  # off-grid value: that value
        ([uv("system", "static_sd_k3", True)], ["static_sd_k3"], {"7b": [1.0, 2.0, 4.0], "70b": [0.5, 1.0]}, 1),
        ([uv("system", "static_sd", True)], ["k5"], {"7b": [1.0, 2.0, 4.0], "70b": [0.5, 1.0]}, 1),  # by config name
        ([uv("system", "turbospec", True)], ["turbospec"], {"7b": [1.0, 2.0, 4.0], "70b": [0.5, 1.0]},
         1),  # a system the experiment does not compare: it alone
        ([uv("model", "llama2-70b", True)], ["vllm", "k5", "static_sd_k3"], {"70b": [0.5, 1.0]}, 1),  # keeps the case
        ([uv("model", "llama2-13b", True)], ["vllm", "k5", "static_sd_k3"],
         {"7b": [1.0, 2.0, 4.0], "70b": [0.5, 1.0]}, 1),  # no case sets it: it replaces every case's value
        ([uv("case", "7b"), uv("rps", 2.0)], ["vllm", "k5", "static_sd_k3"], {"7b": [2.0]}, 2),
        ([uv("rps", [1, 8])], ["vllm", "k5", "static_sd_k3"], {"7b": [1, 8], "70b": [1, 8]}, 1),  # a list: sweeps it
    ],
)
def test_narrowing_table(user: list[UserValue], systems: list[str], cases: dict[str, list[Any]], lines: int) -> None:
    out = narrow(EXP, user)
    assert labels(out.exp) == systems
    assert {c["label"]: c["grid"]["rps"] for c in out.exp["cases"]} == cases
    assert len(out.lines) == lines, out.lines
    assert EXP["cases"][0]["grid"]["rps"] == [1.0, 2.0, 4.0]  # the experiment itself is not modified


def test_a_value_no_case_sets_replaces_it_in_every_case() -> None:
    out = narrow(EXP, [uv("tp", 2)])
    assert all("tp" not in c["overrides"] for c in out.exp["cases"])  # the command line's tp=2 applies
    assert "replaces" in out.lines[0] and "7b: 1" in out.lines[0] and "70b: 4" in out.lines[0]


def test_seed_and_system_entry_keys() -> None:
    out = narrow(EXP, [uv("seed", 1), uv("system.proposer", "eagle")])
    assert out.exp["seeds"] == [1]
    k5 = next(e for e in out.exp["systems"] if isinstance(e, dict))
    assert k5["overrides"] == {"system.k": 5}  # the entry no longer overrides the command line's proposer
    assert len(out.lines) == 2


def test_unknown_case_label_is_refused() -> None:
    with pytest.raises(ConfigError, match="size=13b: no such case"):
        narrow(EXP, [uv("case", "13b")])


def test_a_value_for_the_key_labelling_the_cases_must_match_one() -> None:
    # AdaServe Fig. 4 labels its cases by model: running llama2-13b under the label "7b" would be a lie
    with pytest.raises(ConfigError, match="model=llama2-13b: no case of this experiment sets it"):
        narrow({**EXP, "case_key": "model"}, [uv("model", "llama2-13b", True)])


def test_default_experiment_runs_the_chosen_system_silently() -> None:
    out = narrow({"name": "default", "systems": ["vllm"], "grid": {}}, [uv("system", "static_sd_k3", True)])
    assert out.exp["systems"] == ["static_sd_k3"] and out.lines == []


def test_parse_reads_typed_values_and_groups() -> None:
    overrides = ["+exp=smoke", "rps=3", "model@draft=vicuna-160m", "system=static_sd_k5", "quick=true"]
    cfg = compose(overrides)
    got = {u.key: (u.value, u.group) for u in parse(overrides, cfg, group_overrides(CONF_DIR))}
    assert got["rps"] == (3, False)
    assert got["draft"] == ("vicuna-160m", True) and got["system"] == ("static_sd_k5", True)
    assert got["exp"] == ("smoke", True) and got["quick"] == (True, False)


CASE_SYSTEMS: dict[str, Any] = {
    "name": "toy",
    "systems": ["vllm", {"system": "static_sd", "label": "k5", "overrides": {"system.k": 5, "system.proposer": "x"}}],
    "cases": [
        {"label": "a", "grid": {"rps": [1.0]}},
        {"label": "b", "grid": {"rps": [1.0]}, "systems": [
            {"system": "static_sd", "label": "k5", "overrides": {"system.k": 5, "system.proposer": "y"}}, "turbospec"]},
    ],
}


def test_system_narrows_the_cases_own_systems_too() -> None:
    out = narrow(CASE_SYSTEMS, [uv("system", "turbospec", True)])
    assert out.exp["systems"] == [] and [c.get("systems") for c in out.exp["cases"]] == [None, ["turbospec"]]
    assert out.lines == ["system=turbospec: runs turbospec only (the experiment compares vllm, k5, turbospec)"]
    assert CASE_SYSTEMS["cases"][1]["systems"][1] == "turbospec" and len(CASE_SYSTEMS["systems"]) == 2  # unchanged
    out = narrow(CASE_SYSTEMS, [uv("system", "sarathi", True)])  # compared nowhere: it alone, in every case
    assert out.exp["systems"] == ["sarathi"] and out.exp["cases"][1]["systems"] == ["sarathi"]


def test_a_key_the_entries_set_is_freed_in_the_cases_systems_too() -> None:
    out = narrow(CASE_SYSTEMS, [uv("system.proposer", "eagle")])
    k5_top, k5_b = out.exp["systems"][1], out.exp["cases"][1]["systems"][0]
    assert k5_top["overrides"] == k5_b["overrides"] == {"system.k": 5}
    assert CASE_SYSTEMS["cases"][1]["systems"][0]["overrides"]["system.proposer"] == "y"  # the experiment is intact


def test_a_list_for_one_value_sweeps_it() -> None:
    """rps=[1,2] on an experiment that does not sweep rps (the default one): a sweep over both, said in one line;
    an empty list is refused by name."""
    out = narrow({"name": "default", "systems": ["vllm"]}, [uv("rps", [1, 2])])
    assert out.exp["grid"] == {"rps": [1, 2]} and out.lines == ["rps=[1, 2]: sweeps rps over these values"]
    with pytest.raises(ConfigError, match=r"rps=\[\]: an empty list sweeps nothing"):
        narrow({"name": "default", "systems": ["vllm"]}, [uv("rps", [])])
