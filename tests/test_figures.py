"""Figure functions: every kind draws from a small table; spec mistakes name the key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from repro import figures
from repro.errors import ConfigError


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
    assert figures.save(fig, tmp_path, "t")[0].is_file()


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
        ({"name": "f", "kind": "timeline", "y": "num_seqs", "bins": 2}, "unknown key"),
        ({"name": "f", "kind": "pie"}, "needs a name and a kind"),
    ],
)
def test_spec_errors_name_the_key(spec: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        figures.check_spec(spec, list(_steps().columns))
