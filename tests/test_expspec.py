"""repro.experiments.expspec: the ``exp`` block's schema refuses an unknown key or a value of the wrong shape on one
line naming it; quick mode replaces keys."""

from __future__ import annotations

from typing import Any

import pytest

from repro.core.errors import ConfigError
from repro.experiments.expspec import (
    EXP_KEYS,
    QUICK_EXP_KEYS,
    ExpSpec,
    SystemEntry,
    apply_quick,
    check_frozen_interpolations,
    system_entries,
)


def test_an_unknown_key_is_named_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        ExpSpec.parse({"name": "x", "sytems": ["vllm"]})
    msg = str(err.value)
    assert msg.startswith("exp: unknown key(s) exp.sytems (did you mean 'systems'?)")
    assert f"(known: {', '.join(EXP_KEYS)})" in msg and "\n" not in msg
    assert {"name", "systems", "grid", "cases", "case_key", "seeds", "quick", "derived"} <= set(EXP_KEYS)


@pytest.mark.parametrize(
    ("exp", "named"),
    [
        ({"seeds": 3}, "exp.seeds: expected a list of integers"),
        ({"seeds": [0, 1.5]}, "exp.seeds"),
        ({"grid": [1, 2]}, "exp.grid: expected a map"),
        ({"grid": {"seed": [1]}}, "exp.grid: 'seed' cannot be a grid key"),
        ({"systems": "vllm"}, "exp.systems: expected a list"),
        ({"systems": [{"system": "vllm", "bogus": 1}]}, r"unknown key\(s\) \['bogus'\] in entry for 'vllm'"),
        ({"systems": ["vllm", "vllm"]}, "duplicate labels"),
        ({"title": ["a"]}, "exp.title: expected a string"),
        ({"requires": "torch"}, "exp.requires: expected a list of Python module names"),
        ({"compare": {"a": 1}}, "exp.compare: expected a list of points.csv column names"),
        ({"cases": [{"grid": {}}]}, "needs a 'label'"),
        ({"cases": [{"label": "a", "sytems": []}]}, r"unknown key\(s\) \['sytems'\] in case 'a'"),
        ({"cases": [{"label": "a", "systems": "vllm"}]}, r"exp.cases\[a\].systems: expected a list"),
        ({"cases": [{"label": "a", "systems": [{"label": "x"}]}]}, r"exp.cases\[a\].systems: entry"),
        ({"figures": ["tpot"]}, "exp.figures: entry 'tpot' is not a map"),
        ({"derived": [{"name": "x", "metric": "lat"}]}, "needs name, metric and one of baseline"),
        ({"derived": [{"name": "x", "metric": "g", "normalize": "k", "baseline": "sd"}]}, "one of baseline"),
        ({"grid": {"k": [1]}, "derived": [{"name": "x", "metric": "g", "normalize": "zz"}]},
         r"exp.derived\[x\].normalize: 'zz' is not a grid column \(\['seed', 'k'\]\)"),
        # empty lists run nothing
        ({"grid": {"rps": []}}, "exp.grid.rps: an empty list sweeps no value"),
        ({"cases": [{"label": "a", "grid": {"rps": []}}]}, r"exp.cases\[a\].grid.rps: an empty list"),
        ({"systems": []}, "exp.systems: an empty list runs no system"),
        ({"systems": ["vllm"], "cases": [{"label": "a", "systems": []}]}, r"exp.cases\[a\].systems: an empty"),
        ({"seeds": []}, "exp.seeds: an empty list runs no seed"),
    ],
)
def test_a_bad_value_names_its_key(exp: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        ExpSpec.parse({"name": "x", **exp})


def test_typed_fields_and_defaults() -> None:
    spec = ExpSpec.parse({"name": "x", "systems": ["vllm", {"system": "static_sd", "overrides": {"system.k": 2}}],
                          "case_key": None, "seeds": [1, 2], "derived": None})
    assert spec.systems == (SystemEntry("vllm", "vllm"), SystemEntry("static_sd", "static_sd", (("system.k", 2),)))
    assert spec.case_key == "case" and spec.seeds == (1, 2) and spec.derived == () and spec.kind == "sweep"
    assert ExpSpec.parse({}).run_seeds() == (0,) and ExpSpec.parse({}).system_labels() == []


def test_cases_take_the_experiments_grid_and_systems_unless_they_have_their_own() -> None:
    spec = ExpSpec.parse({"systems": ["vllm"], "grid": {"rps": [1]}, "cases": [
        {"label": "a"}, {"label": "b", "grid": {"rps": [2], "tp": [1, 2]}, "systems": ["turbospec", "vllm"]}]})
    a, b = spec.cases
    assert a.grid == {"rps": [1]} and [e.label for e in a.systems] == ["vllm"]
    assert b.grid == {"rps": [2], "tp": [1, 2]} and [e.label for e in b.systems] == ["turbospec", "vllm"]
    assert spec.system_labels() == ["vllm", "turbospec"] and spec.grid_columns() == ["case", "rps", "tp"]


def test_quick_replaces_keys_and_adds_overrides() -> None:
    exp = {"grid": {"rps": [1, 2, 3]}, "seeds": [0, 1], "quick": {"grid": {"rps": [2]}, "num_requests": 7}}
    q, extra = apply_quick(exp, True)
    assert q["grid"] == {"rps": [2]} and q["seeds"] == [0, 1] and extra == {"num_requests": 7}
    assert apply_quick(exp, False) == (exp, {})
    assert set(QUICK_EXP_KEYS) <= set(EXP_KEYS)


def test_what_the_command_line_set_under_exp_wins_over_quick() -> None:
    exp: dict[str, Any] = {"grid": {"rps": [1], "k": [1, 2]}, "systems": ["vllm"], "seeds": [3],
                           "quick": {"grid": {"rps": [2], "k": [1]}, "systems": ["sarathi"]}}
    q, _ = apply_quick(exp, True, ["grid.rps", "systems", "seeds"])
    assert q["grid"] == {"rps": [1], "k": [1]} and q["systems"] == ["vllm"] and q["seeds"] == [3]
    assert exp["quick"]["grid"] == {"rps": [2], "k": [1]}  # (the caller's mapping is left as it was)


def test_no_systems_is_fine_where_none_run() -> None:
    assert ExpSpec.parse({"kind": "calibration", "systems": []}).system_labels() == []


def test_system_entries_say_where() -> None:
    with pytest.raises(ConfigError, match=r"exp.cases\[a\].systems: duplicate labels"):
        system_entries(["vllm", {"system": "static_sd", "label": "vllm"}], "exp.cases[a].systems")


@pytest.mark.parametrize(("exp", "named"), [
    ({"cases": [{"label": "a", "overrides": {"load_scale": "${mul:${load},2}"}}]}, "exp.cases[0].overrides.load_scale"),
    ({"grid": {"rps": [1, "${capacity}"]}}, "exp.grid.rps[1]"),
    ({"systems": [{"system": "x", "overrides": {"system.k": "${k}"}}]}, "exp.systems[0].overrides.system.k"),
    ({"cases": [{"label": "a", "systems": [{"system": "x", "overrides": {"a": {"b": ["${k}"]}}}]}]},
     "exp.cases[0].systems[0].overrides.a.b[0]"),
    ({"quick": {"num_requests": "${n}"}}, "exp.quick.num_requests"),
    ({"quick": {"cases": [{"label": "a", "overrides": {"x": "pre${k}"}}]}}, "exp.quick.cases[0].overrides.x"),
])
def test_an_unescaped_interpolation_in_a_points_values_is_refused(exp: dict[str, Any], named: str) -> None:
    """Read with the block, it would take the experiment's own values for every point (the league's dynamic rate
    did: one arrival schedule at all four loads); the message names the key and the escaped form."""
    with pytest.raises(ConfigError) as err:
        check_frozen_interpolations(exp)
    assert str(err.value).startswith(f"{named}: '") and "escape it, '" in str(err.value)
    assert "\\${" in str(err.value).split("escape it, ")[1]


def test_escaped_interpolations_and_those_outside_a_points_values_pass() -> None:
    check_frozen_interpolations({
        "cases": [{"label": "a", "overrides": {"load_scale": "\\${mul:\\${load},2}", "x": "plain"}}],
        "systems": [{"system": "x", "overrides": {"system.k": "\\${k}"}}],
        "grid": {"rps": [1, 2]},
        "quick": {"grid": {"rps": [1]}, "num_requests": 10},
        "figures": [{"name": "f", "where": {"capacity": "${capacity}"}}],  # read once, for the whole experiment
    })
