"""The shared look of every figure: one paper-like style, a grid of panels with one legend on top, and how systems
are named in legends and tick labels.

matplotlib and seaborn are imported on first use (:data:`plt`, :data:`sns`). :func:`showing` sets the display names
and the dashed variants (:class:`Shown`) that :mod:`repro.experiments.figures` draws with.
"""

from __future__ import annotations

import contextlib
import importlib
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pandas as pd
import yaml

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class _Lazy:
    """A module imported on first use: a run that draws no figure never pays for matplotlib and seaborn (about half
    a second of a single point's process)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            import matplotlib

            matplotlib.use("Agg")  # before pyplot: files only, never a window
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


plt: Any = _Lazy("matplotlib.pyplot")
sns: Any = _Lazy("seaborn")

PANEL_W, PANEL_H = 3.2, 2.4  # inches per panel (a paper column is ~3.3 in)


def use_style() -> None:
    """The one shared style: seaborn whitegrid, paper context, small fonts, no legend frame."""
    sns.set_theme(
        style="whitegrid",
        context="paper",
        font_scale=0.9,
        rc={"figure.dpi": 150, "savefig.dpi": 150, "legend.frameon": False, "axes.titlesize": 8},
    )


def grid_order(df: pd.DataFrame, col: str | None) -> list[Any]:
    """Distinct values of ``col`` in order of first appearance (grid order)."""
    return [] if col is None else list(pd.unique(df[col]))


def facets(
    df: pd.DataFrame,
    col: str | None,
    row: str | None,
    draw: Callable[[Axes, pd.DataFrame], None],
    sharey: bool = True,
) -> Figure:
    """A grid of panels, one per (row, col) value, each drawn by ``draw(ax, subset)``; one legend on top."""
    cols, rows = grid_order(df, col) or [None], grid_order(df, row) or [None]
    fig, axes = plt.subplots(
        len(rows), len(cols), figsize=(PANEL_W * len(cols), PANEL_H * len(rows)), squeeze=False,
        sharey=sharey,
    )  # fmt: skip
    for i, rv in enumerate(rows):
        for j, cv in enumerate(cols):
            sub = df
            if row is not None:
                sub = sub[sub[row] == rv]
            if col is not None:
                sub = sub[sub[col] == cv]
            ax = axes[i][j]
            draw(ax, sub)
            ax.set_title(", ".join(f"{k} = {v}" for k, v in ((row, rv), (col, cv)) if k is not None))
    shared_legend(fig, axes.ravel().tolist())
    return fig


def shared_legend(fig: Figure, axes: list[Axes]) -> None:
    """Replace per-panel legends by one legend above the figure."""
    handles, labels = [], []
    for ax in axes:
        h, labs = ax.get_legend_handles_labels()
        legend = ax.get_legend()
        if not h and legend is not None:  # seaborn's ecdfplot/histplot legends hold unlabelled proxy artists
            h = [a for a in legend.legend_handles if a is not None]
            labs = [t.get_text() for t in legend.get_texts()][: len(h)]
        for hh, ll in zip(h, labs, strict=True):
            ll = _SHOWN.names.get(ll, ll)
            if ll not in labels:
                handles.append(hh)
                labels.append(ll)
        if legend is not None:
            legend.remove()
    if handles:
        fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=min(len(labels), 5))
    fig.tight_layout()


def decorate(fig: Figure, title: str | None, xlabel: str | None, ylabel: str | None, **opts: Any) -> Figure:
    """Axis labels, log scales, y limits and the figure title."""
    for ax in fig.axes:
        if xlabel is not None:
            ax.set_xlabel(xlabel)
        if ylabel is not None:
            ax.set_ylabel(ylabel)
        if opts.get("logx"):
            ax.set_xscale("log")
            from matplotlib.ticker import NullFormatter

            ax.xaxis.set_minor_formatter(NullFormatter())  # decade labels only: minor ones overlap
        if opts.get("logy"):
            ax.set_yscale("log")
        if opts.get("ylim") is not None:
            ax.set_ylim(*opts["ylim"])
    if title and len(fig.axes) == 1 and not fig.axes[0].get_title():
        fig.axes[0].set_title(title)  # one panel: the title sits between the legend and the plot
    elif title:
        rows = max(len(leg.get_texts()) for leg in fig.legends) // 5 + 1 if fig.legends else 0
        fig.suptitle(title, y=1.0 + 0.25 * rows / fig.get_figheight(), va="bottom")  # above the legend
    return fig


def save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    """Save ``fig`` as PNG (150 dpi) and PDF (no timestamps, so reruns give the same file); close it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(
        paths[1], bbox_inches="tight", metadata={"CreationDate": None, "Creator": None, "Producer": None}
    )
    plt.close(fig)
    return paths


@dataclass
class Shown:
    """How systems are shown in figures: display names by label, and the labels drawn as the suite's variants."""

    names: dict[str, str] = field(default_factory=dict)
    variants: set[str] = field(default_factory=set)


_SHOWN = Shown()


def current_shown() -> Shown:
    """The display names and variants figures are drawn with now (:func:`showing`)."""
    return _SHOWN


@contextlib.contextmanager
def showing(shown: Shown) -> Iterator[None]:
    """Draw the figures of this block with ``shown``'s names in legends and tick labels, variants dashed."""
    global _SHOWN
    before, _SHOWN = _SHOWN, shown
    try:
        yield
    finally:
        _SHOWN = before


def shown_systems(labels: Iterable[Any], conf_dir: Path) -> Shown:
    """The display name (``display_name``) and variant flag (``variant``) of each label that names a
    ``conf/system`` config (following its ``defaults`` parent when it sets neither); other labels (an entry's own
    ``label``) are shown as they are."""
    shown = Shown()
    for label in {str(v) for v in labels}:
        node = _system_yaml(label, conf_dir)
        if node is None:
            continue
        name, variant = node.get("display_name"), node.get("variant")
        if name:
            shown.names[label] = str(name)
        if variant:
            shown.variants.add(label)
    return shown


def _system_yaml(name: str, conf_dir: Path, depth: int = 0) -> dict[str, Any] | None:
    path = conf_dir / "system" / f"{name}.yaml"
    if depth > 5 or not path.is_file():
        return None
    try:
        node = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return None
    parents = [d for d in node.get("defaults") or [] if isinstance(d, str) and d != "_self_"]
    if "display_name" not in node and parents:
        parent = _system_yaml(parents[0], conf_dir, depth + 1) or {}
        node = {**{k: parent[k] for k in ("display_name", "variant") if k in parent}, **node}
    return node


def relabel_ticks(fig: Figure) -> None:
    """System labels on an axis (a bar chart with ``x: system``) shown by their display names."""
    if not _SHOWN.names:
        return
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            texts = axis.get_ticklabels()
            if any(t.get_text() in _SHOWN.names for t in texts):
                axis.set_ticks(axis.get_ticklocs())
                axis.set_ticklabels([_SHOWN.names.get(t.get_text(), t.get_text()) for t in texts])


def stamp(fig: Figure, text: str, width: int = 100) -> None:
    """Write ``text`` (a run's overrides, a data fallback) above everything else at the top of ``fig``: above the
    title, the suptitle and the shared legend."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    tops = [box.y1 for box in (ax.get_tightbbox(renderer) for ax in fig.axes) if box is not None]
    tops += [leg.get_window_extent(renderer).y1 for leg in fig.legends]
    if fig._suptitle is not None:  # type: ignore[attr-defined]
        tops.append(fig._suptitle.get_window_extent(renderer).y1)  # type: ignore[attr-defined]
    y = max(tops) / (fig.dpi * fig.get_figheight())
    fig.text(0.5, y + 0.02, "\n".join(textwrap.wrap(text, width)), ha="center", va="bottom", fontsize=7,
             color="darkred")
