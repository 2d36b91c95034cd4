"""Figure functions: every kind draws from a small table; spec mistakes name the key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from repro.core.errors import ConfigError
from repro.experiments import figures, panels
from repro.experiments.expspec import ExpSpec


def _steps(n: int = 40) -> pd.DataFrame:
    t = np.arange(n) * 0.5
    return pd.DataFrame({
        "system": "turbospec",
        "case": np.where(t < 10, "a", "b"),
        "start_at": t,
        "num_seqs": np.arange(n) % 7,
        "num_batched_tokens": np.arange(n) % 7 * 3,
        "mean_k": np.arange(n) % 4,
        "accept_rate": np.where(np.arange(n) % 3 == 0, np.nan, 0.6),
    })


def test_timeline_several_series_on_two_axes(tmp_path: Path) -> None:
    fig = figures.timeline(_steps(), y=["num_seqs", "num_batched_tokens"], y2=["mean_k", "accept_rate"],
                         y2label="tokens / rate", bin_s=2.0, col="case",
                         labels=["batch", "parallel tokens", "proposed", "acceptance"])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["batch", "parallel tokens", "proposed", "acceptance"]
    assert len(fig.axes) == 4  # two panels, each with a right axis
    assert fig.axes[-1].get_ylabel() == "tokens / rate"
    left = fig.axes[0].get_lines()[0]
    assert len(left.get_xdata()) == 5  # 0-10 s in 2 s bins (panel a)
    assert panels.save(fig, tmp_path, "t")[0].is_file()


def test_timeline_one_series_per_system() -> None:
    df = pd.concat([_steps(), _steps().assign(system="vllm")])
    fig = figures.timeline(df, y="num_seqs")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["turbospec", "vllm"]


def test_cdf_and_stacked_bar_draw() -> None:
    req = pd.DataFrame({"system": ["a"] * 5 + ["b"] * 5, "latency_s": np.arange(10.0)})
    fig = figures.cdf(req, "latency_s")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["a", "b"]
    pts = pd.DataFrame({"system": ["k1", "k3"], "d": [0.2, 0.3], "t": [0.8, 0.7]})
    fig = figures.stacked_bar(pts, x="system", y=["d", "t"], labels=["draft", "target"])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["draft", "target"]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"name": "f", "kind": "timeline", "y": ["num_seqs"], "y2": ["nope"]}, r"\.y2: no column 'nope'"),
        ({"name": "f", "kind": "timeline", "y": "num_seqs", "bin": 2}, "unknown key"),
        ({"name": "f", "kind": "pie"}, "needs a name and a kind"),
    ],
)
def test_spec_errors_name_the_key(spec: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        figures.check_spec(spec, list(_steps().columns))


def _requests() -> pd.DataFrame:
    return pd.DataFrame({"system": ["a"] * 6, "output_len": [10, 40, 60, 90, 150, 400],
                         "estimate_error": [0.1, 0.3, 0.2, 0.4, 0.5, 0.9]})


def test_binned_rows_sit_at_their_bin_centre() -> None:
    out = figures.binned(_requests(), "output_len", [0, 50, 100, 200])
    assert out["output_len"].tolist() == [25.0, 25.0, 75.0, 75.0, 150.0]  # 400 lies outside: dropped
    assert out.groupby("output_len")["estimate_error"].mean().tolist() == pytest.approx([0.2, 0.3, 0.5])
    geo = figures.binned(_requests(), "output_len", [0, 50, 200], geometric=True)
    assert geo["output_len"].tolist() == pytest.approx([25.0, 25.0, 100.0, 100.0, 100.0])  # √(50·200)


@pytest.mark.parametrize(("spec", "match"), [
    ({"name": "f", "kind": "line", "data": "nope", "x": "output_len", "y": "estimate_error"}, "data: 'nope'"),
    ({"name": "f", "kind": "cdf", "data": "steps", "y": "latency_s"}, "a cdf figure reads requests"),
    ({"name": "f", "kind": "line", "data": "requests", "x": "output_len", "y": "estimate_error", "bins": [5]},
     "bins: expected at least two increasing edges"),
])
def test_table_choice_errors_name_the_key(spec: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        figures.draw_figure(spec, {"points": pd.DataFrame(), "requests": _requests(), "steps": _steps()})


def test_a_line_figure_from_the_requests_table() -> None:
    spec = {"name": "f", "kind": "line", "data": "requests", "x": "output_len", "bins": [0, 50, 100, 500],
            "y": "estimate_error", "logx": True}
    fig = figures.draw_figure(spec, {"points": pd.DataFrame(), "requests": _requests(), "steps": None})
    assert fig is not None
    xs = sorted(fig.axes[0].lines[0].get_xdata().tolist())
    assert xs == pytest.approx([25.0, 50.0 ** 0.5 * 100 ** 0.5, (100 * 500) ** 0.5])
    assert figures.draw_figure({**spec, "data": "rounds"}, {"rounds": None}) is None  # not saved: skipped


def test_legends_use_the_papers_names_and_variants_stay_under_the_papers_line() -> None:
    """AdaServe and the suite's recoverable-first reading are equal here: the variant is dashed and drawn first, so
    AdaServe's solid line is on top; legends and bar ticks read the papers' names (conf/system display_name)."""
    from repro.experiments.results import CONF_DIR

    df = pd.DataFrame({"system": ["adaserve_recoverable_first", "adaserve", "static_sd_k3"] * 2,
                       "rps": [1.0] * 3 + [2.0] * 3, "y": [0.9, 0.9, 0.5, 0.8, 0.8, 0.4]})
    shown = panels.shown_systems(df["system"], CONF_DIR)
    assert shown.names == {"adaserve": "AdaServe", "adaserve_recoverable_first": "AdaServe (recoverable first)",
                           "static_sd_k3": "SD (γ = 3)"}
    assert shown.variants == {"adaserve_recoverable_first"}
    with panels.showing(shown):
        fig = figures.line(df, x="rps", y="y")
        lines = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) == 2]
        assert [ln.get_linestyle() for ln in lines] == ["--", "-", "-"]  # the variant first, dashed
        assert [t.get_text() for t in fig.legends[0].get_texts()] == [  # the hidden line says so
            "AdaServe (recoverable first) (= AdaServe)", "AdaServe", "SD (γ = 3)"]
        shown.own = {"adaserve"}  # the paper's own system: last, thicker, in its strong colour
        fig = figures.line(df, x="rps", y="y")
        lines = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) == 2]
        assert [ln.get_linewidth() > 2 for ln in lines] == [False, False, True]
        assert lines[-1].get_color() == panels.STRONG["AdaServe"]
        shown.own = set()
        bars = figures.bar(df, x="system", y="y", hue=None)
        panels.relabel_ticks(bars)
        assert "SD (γ = 3)" in [t.get_text() for t in bars.axes[0].get_xticklabels()]
    plain = figures.line(df, x="rps", y="y")  # outside showing(): config names, nothing dashed
    assert {ln.get_linestyle() for ln in plain.axes[0].get_lines() if len(ln.get_xdata()) == 2} == {"-"}


def test_an_entry_relabelling_a_config_is_named_by_its_display_name(tmp_path: Path) -> None:
    """``{system: static_sd_k3, label: sd_k3, display_name: ...}``: the label stays the points.csv key, the legend and
    summary.md read the entry's display name (``variant: true``: drawn as the suite's own reading); an entry without
    one is shown by its label."""
    from repro.experiments.render import render

    exp = {"name": "t", "title": "t", "systems": [
        "vllm", {"system": "static_sd_k3", "label": "sd_k3", "display_name": "SD (γ = 3)"},
        {"system": "static_sd_k3", "label": "sd_k3_big", "overrides": {"system.k": 5}},
        {"system": "static_sd_k3", "label": "k5", "overrides": {"system.k": 5}, "display_name": "SD (γ = 5)",
         "variant": True}],
        "figures": [{"name": "f", "kind": "line", "x": "rps", "y": "y", "hue": "system"}]}
    points = pd.DataFrame({"exp": "t", "system": ["vllm", "sd_k3", "sd_k3_big", "k5"] * 2, "seed": 0,
                           "rps": [1.0] * 4 + [2.0] * 4, "y": [1.0, 2.0, 3.0, 3.0, 1.5, 2.5, 3.5, 3.5]})
    render(tmp_path, {"exp": "t", "kind": "sweep", "config": {"exp": exp}, "seeds": [0]}, points)
    summary = (tmp_path / "summary.md").read_text()
    assert "`sd_k3` = SD (γ = 3)" in summary and "`vllm` = vLLM" in summary and "`sd_k3_big` =" not in summary
    assert "`k5` = SD (γ = 5) (the suite's variant, dashed)" in summary
    with pytest.raises(ConfigError, match="display_nme"):
        ExpSpec.parse({**exp, "systems": [{"system": "vllm", "display_nme": "x"}]})
