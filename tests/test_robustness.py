"""python -m repro robustness: the design over the open choices, the analysis of which claims hold where, and the
settings' runs (repro.experiments.robustness)."""

from __future__ import annotations

import itertools
from typing import Any

import pandas as pd
import pytest

from repro.experiments.openchoices import OpenChoice
from repro.experiments.robustness import DEPENDS, NOWHERE, ROBUST, analyse, apply_setting, conflicts, design

X = OpenChoice("x", "system.x", 2, "planted", values=(1, 2, 3, 4), systems=("a",))
Y = OpenChoice("y", "hardware.link", 25.0, "planted", range=(10.0, 80.0), scale="log")
Z = OpenChoice("z", "engine", "mq", "planted", values=("mq", "be"))


def _table(rule: dict[str, Any], choices: list[OpenChoice], samples: int = 12) -> pd.DataFrame:
    """robustness.csv's rows for claims whose verdicts follow ``rule`` (claim -> setting values -> holds)."""
    rows = []
    for s in design(choices, samples, seed=1):
        for claim, holds in rule.items():
            ok = holds(s.values)
            rows.append({"setting": s.id, "kind": s.kind, **s.values, "claim": claim, "value": 1.0 if ok else 0.0,
                         "verdict": "holds" if ok else "differs", "held": ok})
    return pd.DataFrame(rows)


def test_a_claim_that_holds_for_one_value_of_one_knob_names_that_knob_and_value() -> None:
    table = _table({"planted": lambda v: v["x"] == 3, "always": lambda v: True, "never": lambda v: False},
                   [X, Y, Z])
    by = {r.claim: r for r in analyse(table, [X, Y, Z])}
    assert by["planted"].klass == DEPENDS and by["planted"].knob == "x" and by["planted"].where == "3"
    assert by["planted"].chosen == "differs" and 0 < by["planted"].share < 0.5
    assert by["always"].klass == ROBUST and by["never"].klass == NOWHERE


def test_a_range_knob_is_named_with_the_third_where_the_claim_holds() -> None:
    table = _table({"fast link": lambda v: v["y"] >= 50}, [X, Y, Z], samples=24)
    (r,) = analyse(table, [X, Y, Z])
    assert r.knob == "y" and r.where == "high"


def test_claims_that_exclude_each_other_are_reported_as_a_conflict() -> None:
    table = _table({"A": lambda v: v["x"] == 3, "B": lambda v: v["x"] != 3, "C": lambda v: v["z"] == "be"},
                   [X, Z], samples=8)  # the full factorial: every pair that can hold together does somewhere
    pairs = conflicts(table)
    assert ("A", "B") in pairs or ("B", "A") in pairs
    assert not {("A", "C"), ("C", "A"), ("B", "C"), ("C", "B")} & set(pairs)  # A and C hold together somewhere


def test_the_design_has_the_chosen_setting_the_scans_and_a_joint_sample() -> None:
    settings = design([X, Y, Z], samples=10, seed=3)
    assert settings[0].kind == "chosen" and dict(settings[0].values) == {"x": 2, "y": 25.0, "z": "mq"}
    oat = [s for s in settings if s.kind == "oat"]
    assert {s.values["x"] for s in oat if s.values["x"] != 2} == {1, 3, 4}  # every other level of the set
    assert {s.values["y"] for s in oat if s.values["y"] != 25.0} == {10.0, 80.0, 28.284271}  # ends and middle (log)
    for s in oat:  # one knob at a time
        assert sum(s.values[c.name] != c.value for c in (X, Y, Z)) == 1
    lhs = [s for s in settings if s.kind == "lhs"]
    assert len(lhs) == 10 and all(10.0 <= s.values["y"] <= 80.0 for s in lhs)
    assert len({tuple(sorted(s.values.items())) for s in settings}) == len(settings)  # no setting twice
    assert design([X, Y, Z], samples=10, seed=3) == settings  # seeded


def test_a_small_discrete_design_is_the_full_factorial() -> None:
    settings = design([X, Z], samples=8, seed=0)
    combos = {(s.values["x"], s.values["z"]) for s in settings}
    assert combos == set(itertools.product(X.values or (), Z.values or ()))


def test_a_setting_scopes_a_systems_knob_to_its_entries_and_others_to_every_point() -> None:
    exp = {"systems": ["a", {"system": "b", "label": "a2"}], "cases": [{"label": "c", "systems": ["a", "b"]}],
           "quick": {"systems": ["a"]}}
    out, overrides = apply_setting(exp, [X, Y, Z], {"x": 4, "y": 40.0, "z": "be"})
    assert overrides == ["hardware.link=40.0", "engine=be"]
    assert out["systems"] == [{"system": "a", "overrides": {"system.x": 4}}, {"system": "b", "label": "a2"}]
    assert out["cases"][0]["systems"][0] == {"system": "a", "overrides": {"system.x": 4}}
    assert out["quick"]["systems"] == [{"system": "a", "overrides": {"system.x": 4}}]
    assert exp["systems"][0] == "a"  # the experiment itself is untouched


@pytest.mark.usefixtures("no_data")
def test_robustness_runs_an_experiment_over_its_open_choices(tmp_path: Any) -> None:
    from repro.experiments.robustness import run

    lines: list[str] = []
    out = run("nightjar_fig9", quick=True, samples=0, seed=0, out_dir=tmp_path, n_jobs=2,
              say=lines.append, only=["selector"])
    table = pd.read_csv(out / "robustness.csv")
    assert set(table["setting"]) == {"s000", "s001"} and set(table["selector"]) == {"adabingreedy", "authors"}
    md = (out / "robustness.md").read_text()
    assert "| selector | `system.selector` | nightjar |" in md and (out / "robustness.png").stat().st_size > 0
    assert lines[-1].startswith("robustness nightjar_fig9: ") and "claims over 2 settings" in lines[-1]
    # the selector is Nightjar's knob: the second setting runs Nightjar's points only and shares the others
    a, b = (pd.read_csv(out / "settings" / s / "points.csv") for s in ("s000", "s001"))
    shared = next(line for line in lines if "shared with an earlier setting" in line)
    assert f"{len(a) + (b['system'] == 'nightjar').sum()} of {len(a) + len(b)} points run" in shared
    others = a["system"] != "nightjar"
    assert others.any() and a[others].equals(b[b["system"] != "nightjar"])
    assert not set(a[~others]["config_hash"]) & set(b[b["system"] == "nightjar"]["config_hash"])
    from repro.experiments.robustness import redraw

    before = {n: (out / n).read_text() for n in ("robustness.md", "robustness.json")}
    redraw(out, say=lines.append)  # the analysis again from robustness.csv: the same study
    assert {n: (out / n).read_text() for n in before} == before


def _study(claims: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"experiment": "x", "quick": True, "settings": 19, "claims": claims, "conflicts": []}


def test_summary_shows_each_claims_robustness_and_the_papers_own_numbers(tmp_path: Any) -> None:
    """summary.md's claims table gains the study's class per claim (this folder's, else the reference's) and each
    claim's note on the paper's own numbers."""
    import json
    import shutil

    from repro.experiments.check import reference_dir
    from repro.experiments.render import redraw

    ref = reference_dir("laps_fig2", True)
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    manifest = json.loads((run / "manifest.json").read_text())
    claims = manifest["config"]["exp"]["claims"]
    claims[0]["note"] = "the paper's 14.21 % and its Fig. 2 disagree"
    (run / "manifest.json").write_text(json.dumps(manifest))
    first = str(claims[0]["text"])
    (run / "robustness.json").write_text(json.dumps(_study({
        first: {"class": "depends on the setting", "share": 0.25, "knob": "link", "where": "high",
                "chosen": "holds"}})))
    redraw(run)
    text = (run / "summary.md").read_text()
    assert "| robustness | why it differs; the paper's own numbers |" in text
    row = next(line for line in text.splitlines() if line.startswith(f"| {first} |"))
    assert "| quick grid: holds; depends on the setting (25%; link: high) | " in row
    assert row.endswith("Paper: the paper's 14.21 % and its Fig. 2 disagree |")  # after its why, where it differs
    assert "| not in the study |" in text  # the second claim: the study has no row of it
    assert "Robustness: this folder's study (19 settings" in text


def test_the_catalogue_counts_claims_per_class_and_upgrades_old_rows(tmp_path: Any) -> None:
    import json

    from repro.experiments.check import index_markdown

    (tmp_path / "laps_fig5").mkdir()
    (tmp_path / "laps_fig5" / "robustness.json").write_text(json.dumps(_study({
        "a": {"class": "holds robustly"}, "b": {"class": "depends on the setting"},
        "c": {"class": "differs everywhere plausible"}, "d": {"class": "depends on the setting"}})))
    old_row = "| [laps_fig5](laps_fig5/summary.md) | t | 10 | 1 | 2 | 30 | (none) |"  # before the column
    other = "| [smoke](smoke/summary.md) | s | 2 | 0 | 0 | 1 | (none) |"
    text = index_markdown({"laps_fig5": old_row, "smoke": other}, quick=False, results=tmp_path)
    assert "| [laps_fig5](laps_fig5/summary.md) | t | 10 | 1 | 2 | [1 robust, 2 depend, 1 nowhere, 0 n/a]" \
           "(laps_fig5/robustness.md) | 30 | (none) |" in text
    assert "| [smoke](smoke/summary.md) | s | 2 | 0 | 0 | - | 1 | (none) |" in text
    assert "1 experiments studied" in text and "- LAPS-SD: 1 holds robustly, 2 depends on the setting, 1 differs" \
           " everywhere plausible" in text
    assert "Total wall time: 31 s." in text


def test_the_closing_line_counts_the_classes_of_the_study(tmp_path: Any) -> None:
    import json

    from repro.experiments.runner import ExperimentResult

    (tmp_path / "robustness.json").write_text(json.dumps(_study({
        "a": {"class": "holds robustly"}, "b": {"class": "depends on the setting"}, "c": {"class": "n/a"}})))
    res = ExperimentResult("x", tmp_path, pd.DataFrame({"system": ["s"]}), {"systems": ["s"]}, 1, 1.0,
                           {"holds": 1, "differs": 1})
    assert ("paper claims: 1 hold, 1 differ (robustness: 1 robust, 1 depend on the setting, 0 differ everywhere "
            "plausible)") in res.summary_line()


def test_a_study_puts_an_experiments_escaped_interpolations_back_escaped() -> None:
    """A study resolves the exp block (an escaped ``\\${capacity}`` becomes the text ``${capacity}``) and puts it back
    into a point's config: there each must be escaped again, or it would resolve once, with the experiment's own
    values (the runner refuses that: goodspeed_fig2's study failed on it)."""
    from repro.experiments.robustness import escaped

    exp = {"systems": [{"system": "goodspeed", "overrides": {"system.capacity": "${capacity}"}}], "seeds": [0],
           "title": "no interpolation"}
    got = escaped(exp)
    assert got["systems"][0]["overrides"]["system.capacity"] == "\\${capacity}"
    assert got["seeds"] == [0] and got["title"] == "no interpolation"
