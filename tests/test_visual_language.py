"""One visual language for the whole suite: a system's colour comes from one suite-wide mapping, the paper's own system
is drawn last, and no legend, panel title or axis shows a config name where a display name exists. Checked on the
figures of committed quick references, redrawn from their tables."""

from __future__ import annotations

import itertools
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import matplotlib.colors as mcolors
import pytest
import yaml

from repro.experiments import panels
from repro.experiments.check import reference_dir
from repro.experiments.render import redraw
from repro.experiments.results import CONF_DIR

#: one experiment per paper, and those whose entries are labelled (turbospec_fig12, nightjar_fig3, laps_fig7)
EXPERIMENTS = ("adaserve_fig4", "nightjar_fig12", "turbospec_fig12", "laps_fig7", "goodspeed_fig4", "nightjar_fig3")


def _config_names() -> set[str]:
    """Every name that has a display name: the system configs that set one, and the experiments' labelled entries."""
    names = set()
    for path in (CONF_DIR / "system").glob("*.yaml"):
        if "display_name" in (yaml.safe_load(path.read_text()) or {}):
            names.add(path.stem)
    for path in (CONF_DIR / "exp").glob("*.yaml"):
        exp = (yaml.safe_load(path.read_text()) or {}).get("exp") or {}
        for entry in exp.get("systems") or []:
            if isinstance(entry, dict) and entry.get("display_name") and entry.get("label"):
                names.add(str(entry["label"]))
    return names


def _drawn(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], dict[str, Any]]:
    """The figures of a quick reference as render draws them, before they are saved, and its manifest."""
    run = tmp_path / name
    shutil.copytree(reference_dir(name, True), run)
    figs: list[Any] = []
    real_save = panels.save

    def keep(fig: Any, out_dir: Path, fig_name: str) -> list[Path]:
        figs.append(fig)
        fig.canvas.draw()
        return real_save(fig, out_dir, fig_name)

    monkeypatch.setattr(panels, "save", keep)
    monkeypatch.setattr("repro.experiments.figures.save", keep)
    with warnings.catch_warnings():  # a hidden series warns; that is test_figures.py's business
        warnings.simplefilter("ignore")
        redraw(run)
    return figs, json.loads((run / "manifest.json").read_text())


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_no_figure_shows_a_config_name_where_a_display_name_exists(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figs, _ = _drawn(name, tmp_path, monkeypatch)
    assert figs
    hidden = _config_names()
    for fig in figs:
        texts = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
        for ax in fig.axes:
            texts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
            texts += [t.get_text() for t in (*ax.get_xticklabels(), *ax.get_yticklabels())]
        shown = {t for t in texts if t} & hidden
        assert not shown, f"{name}: config names in a figure where a display name exists: {sorted(shown)}"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_a_systems_colour_is_the_suites_and_the_papers_system_is_drawn_last(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figs, _ = _drawn(name, tmp_path, monkeypatch)
    with panels.showing(panels.Shown()):
        by_name = {}  # display name -> the suite's colour
        for path in (CONF_DIR / "system").glob("*.yaml"):
            shown = (yaml.safe_load(path.read_text()) or {}).get("display_name")
            if shown:
                by_name[str(shown)] = panels.system_colour(str(shown))
    paper = panels.PAPER_SYSTEM[name.split("_")[0]]
    checked = 0
    for fig in figs:
        for leg in fig.legends:
            for handle, text in zip(leg.legend_handles, leg.get_texts(), strict=True):
                label = text.get_text().split(" (= ")[0]
                colour = handle.get_color() if hasattr(handle, "get_color") else handle.get_facecolor()
                if label in by_name:
                    assert mcolors.same_color(colour, by_name[label]), (name, label)
                    checked += 1
        own = mcolors.to_hex(panels.STRONG[paper])
        for ax in fig.axes:
            series = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1 and ln.get_linestyle() != "None"]
            colours = [mcolors.to_hex(ln.get_color()) for ln in series]
            if own in colours and len(set(colours)) > 1:
                assert colours[-1] == own, f"{name}: {paper} is not drawn last in a panel"
    assert checked or name == "goodspeed_fig4", f"{name}: no system legend entry checked"


def test_one_name_one_colour_whatever_the_figure() -> None:
    with panels.showing(panels.Shown(names={"a": "AdaServe", "b": "SpecInfer"})):
        assert panels.system_colour("a") == panels.STRONG["AdaServe"]
        first = panels.system_colour("b")
    with panels.showing(panels.Shown(names={"zz": "SpecInfer"})):
        assert panels.system_colour("zz") == first
        assert panels.system_colour("SpecInfer") == first


def test_category_ticks_never_overprint() -> None:
    """Long category labels (GoodSpeed Fig. 3's systems, Nightjar Fig. 3's deployments) are wrapped or turned so that
    no two neighbouring tick labels overlap."""
    import pandas as pd

    from repro.experiments.figures import bar

    names = ["7B, RTX 4090", "13B, A100-40G", "32B, 2x L20"]
    df = pd.DataFrame({"deployment": names, "system": ["vllm"] * 3, "y": [1.0, 2.0, 3.0]})
    fig = bar(df, x="deployment", y="y", hue="system")
    panels.fit_ticks(fig)
    fig.canvas.draw()
    labels = fig.axes[0].get_xticklabels()
    if all(t.get_rotation() for t in labels):  # turned: each label's slot runs along its own baseline
        return
    boxes = [t.get_window_extent() for t in labels]
    assert not any(a.overlaps(b) for a, b in itertools.pairwise(boxes))
    assert any("\n" in t.get_text() for t in labels)  # wrapped at their spaces


def test_bars_are_not_drawn_on_a_log_axis() -> None:
    from repro.core.errors import ConfigError
    from repro.experiments.figures import check_spec

    with pytest.raises(ConfigError, match=r"exp.figures\[kv\]\.logy"):
        check_spec({"name": "kv", "kind": "bar", "x": "d", "y": "t", "hue": "system", "logy": True},
                   ["d", "t", "system"])


def test_a_claim_panel_draws_the_claims_own_ratio_with_the_papers_value() -> None:
    """A ``claim`` figure draws what the claim reduces, at each x (AdaServe / the better greedy baseline), one
    panel per claim, with the paper's value and 1x as lines; a text no claim has is refused naming the figure."""
    import pandas as pd

    from repro.core.errors import ConfigError
    from repro.experiments.expspec import ExpSpec
    from repro.experiments.figures import claim
    from repro.experiments.render import claim_panels

    points = pd.DataFrame({"system": ["ada", "ada", "eq", "eq", "gl", "gl"], "rps": [1, 2] * 3,
                           "att": [0.9, 0.5, 0.9, 0.6, 0.8, 0.4]})
    exp = ExpSpec.parse({"name": "x", "claims": [
        {"text": "wins", "paper": ">= 1", "target": 1.0, "check": ">=", "kind": "ratio_to_best_baseline",
         "metric": "att", "system": "ada", "reduce": "min"}]})
    spec = {"name": "c", "kind": "claim", "claims": ["wins"], "labels": ["attainment"]}
    table = claim_panels([spec], exp, points, "rps")
    assert table is not None
    assert list(table["value"]) == pytest.approx([1.0, 0.5 / 0.6])
    fig = claim(table)
    ax = fig.axes[0]
    assert ax.get_title() == "attainment"
    assert {round(float(line.get_ydata()[0]), 6) for line in ax.get_lines() if len(set(line.get_ydata())) == 1} >= {1.0}
    with pytest.raises(ConfigError, match=r"exp.figures\[c\]\.claims: no claim reads 'lost'"):
        claim_panels([{**spec, "claims": ["lost"]}], exp, points, "rps")


def test_no_two_systems_of_one_experiment_share_a_colour() -> None:
    """The suite's mapping gives every display name of an experiment its own colour (Nightjar Fig. 12's authors'
    selector and no-context variant were both light blue under a plain hash)."""
    colours = panels.suite_colours(CONF_DIR)
    for path in sorted((CONF_DIR / "exp").glob("*.yaml")):
        exp = (yaml.safe_load(path.read_text()) or {}).get("exp") or {}
        entries = [e for e in exp.get("systems") or [] if isinstance(e, dict) and e.get("display_name")]
        names = {str(e["display_name"]) for e in entries} - set(panels.STRONG)
        drawn = [colours[n] for n in names]
        assert len(drawn) == len(set(drawn)), f"{path.stem}: two systems share a colour"
    assert colours["Nightjar (authors' selector)"] != colours["Nightjar (no context)"]
