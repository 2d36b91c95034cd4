"""The shared look of every figure: one paper-like style, a grid of panels with one legend on top, and how systems
are named in legends and tick labels.

matplotlib and seaborn are imported on first use (:data:`plt`, :data:`sns`). :func:`showing` sets the display names
and the dashed variants (:class:`Shown`) that :mod:`repro.experiments.figures` draws with.
"""

from __future__ import annotations

import contextlib
import importlib
import textwrap
import zlib
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
            ax.set_title(facet_title(i * len(cols) + j, len(rows) * len(cols), row, rv, col, cv))
    shared_legend(fig, axes.ravel().tolist())
    return fig


def facet_title(index: int, count: int, row: str | None, rv: Any, col: str | None, cv: Any) -> str:
    """A panel's title as a paper's sub-caption: "(a) Llama-2-7b" (the facet values shown by their display names,
    lettered when there are several panels; a number keeps its key: "(b) batch_size = 16")."""
    parts = []
    for key, value in ((row, rv), (col, cv)):
        if key is None:
            continue
        text = _SHOWN.names.get(str(value), str(value))
        parts.append(f"{key} = {text}" if isinstance(value, int | float) and not isinstance(value, bool) else text)
    if not parts:
        return ""
    letter = f"({chr(ord('a') + index)}) " if count > 1 and index < 26 else ""
    return letter + ", ".join(parts)


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
            ll = _SHOWN.names.get(ll, ll) + _SHOWN.marks.get(ll, "")
            if _SHOWN.legend_key:  # a numeric hue: "k = 3", not a bare "3"
                ll = f"{_SHOWN.legend_key} = {ll}"
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
            from matplotlib.ticker import NullFormatter, NullLocator

            ax.xaxis.set_minor_formatter(NullFormatter())
            ticks = opts.get("xticks")
            if ticks:  # the grid's own values (batch sizes 2-64), not decades only
                ax.xaxis.set_minor_locator(NullLocator())
                ax.set_xticks(list(ticks), [f"{v:g}" for v in ticks])
        for ref in opts.get("refs") or ():  # reference lines: 1x, the paper's value
            ax.axhline(float(ref["y"]), color=str(ref.get("color", "0.35")), lw=0.8, ls=":", zorder=1)
            if ref.get("label"):
                ax.annotate(str(ref["label"]), (1.0, float(ref["y"])), xycoords=("axes fraction", "data"),
                            ha="right", va="bottom", fontsize=6, color="0.35")
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
    own: set[str] = field(default_factory=set)  # the paper's own system: its strong colour, drawn last and thicker
    marks: dict[str, str] = field(default_factory=dict)  # a label's legend suffix: " (= IncrDec)" where it coincides
    legend_key: str = ""  # a numeric hue's column: legend entries read "k = 3"


_SHOWN = Shown()


#: The five papers' systems in one fixed strong colour each, the same in every figure of the suite, and no
#: speculation in black; every other system's colour comes from its display name (:func:`system_colour`).
STRONG = {"AdaServe": "#d62728", "TurboSpec": "#1f4e9c", "Nightjar": "#2ca02c", "LAPS-SD": "#8e44ad",
          "GoodSpeed": "#e67e22", "vLLM": "#222222", "vLLM V1": "#222222"}
#: the muted colours other systems are drawn from (none close to a strong one), in the order they are handed out
MUTED = ("#17becf", "#bcbd22", "#8c564b", "#e377c2", "#7f7f7f", "#ff9896", "#6b6ecf", "#c49c94", "#98df8a",
         "#a55194", "#ffbb78", "#aec7e8", "#dbdb8d", "#f7b6d2", "#c5b0d5", "#b5cf6b", "#9edae5", "#e7969c",
         "#637939", "#843c39", "#3182bd", "#fd8d3c", "#756bb1", "#636363")
#: an experiment's name prefix → its paper's system, by display name
PAPER_SYSTEM = {"adaserve": "AdaServe", "turbospec": "TurboSpec", "nightjar": "Nightjar", "laps": "LAPS-SD",
                "goodspeed": "GoodSpeed"}


def system_colour(label: str) -> str:
    """The one colour of a system in every figure: a paper's system and no speculation in their strong colours,
    any other the colour the suite hands its display name (:func:`suite_colours`: two systems of one experiment
    never share one), and a name no experiment shows (a user's own system) one from a hash of it."""
    name = _SHOWN.names.get(str(label), str(label))
    if name in STRONG:
        return STRONG[name]
    assigned = suite_colours()
    return assigned.get(name) or MUTED[zlib.crc32(name.encode()) % len(MUTED)]


_SUITE_COLOURS: dict[str, str] = {}


def suite_colours(conf_dir: Path | None = None) -> dict[str, str]:
    """Every display name the experiments show (``conf/exp``, their systems and labelled entries) → its muted
    colour, one mapping for the whole suite: names that appear in one experiment are neighbours, and each name in
    turn (most neighbours first, then by name) takes the first colour in :data:`MUTED` no neighbour holds (greedy
    graph colouring); computed once."""
    if _SUITE_COLOURS and conf_dir is None:
        return _SUITE_COLOURS
    conf = conf_dir or Path(__file__).resolve().parents[2] / "conf"
    together: dict[str, set[str]] = {}
    for path in sorted((conf / "exp").glob("*.yaml")):
        try:
            exp = (yaml.safe_load(path.read_text()) or {}).get("exp") or {}
        except yaml.YAMLError:
            continue
        entries = list(exp.get("systems") or [])
        for case in exp.get("cases") or []:
            entries += list((case or {}).get("systems") or []) if isinstance(case, dict) else []
        names = set()
        for e in entries:
            if isinstance(e, dict):
                name = e.get("display_name") or (_system_yaml(str(e.get("system")), conf) or {}).get("display_name")
            else:
                name = (_system_yaml(str(e), conf) or {}).get("display_name") or str(e)
            if name and str(name) not in STRONG:
                names.add(str(name))
        for n in names:
            together.setdefault(n, set()).update(names - {n})
    out: dict[str, str] = {}
    for n in sorted(together, key=lambda n: (-len(together[n]), n)):
        taken = {out[m] for m in together[n] if m in out}
        free = [c for c in MUTED if c not in taken]
        out[n] = free[0] if free else MUTED[zlib.crc32(n.encode()) % len(MUTED)]
    if conf_dir is None:
        _SUITE_COLOURS.update(out)
    return out


def own_labels(experiment: str, labels: Iterable[Any], names: dict[str, str]) -> set[str]:
    """The labels shown as the experiment's paper's own system (display name exactly the paper's)."""
    paper = PAPER_SYSTEM.get(experiment.split("_")[0])
    return {str(v) for v in labels if paper and names.get(str(v), str(v)) == paper}


def current_shown() -> Shown:
    """The display names and variants figures are drawn with now (:func:`showing`)."""
    return _SHOWN


@contextlib.contextmanager
def legend_state(marks: dict[str, str], key: str) -> Iterator[None]:
    """One figure's legend marks (" (= IncrDec)") and numeric hue key ("k = 3") while its legend is drawn."""
    before = (_SHOWN.marks, _SHOWN.legend_key)
    _SHOWN.marks, _SHOWN.legend_key = marks, key
    try:
        yield
    finally:
        _SHOWN.marks, _SHOWN.legend_key = before


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


def fit_ticks(fig: Figure) -> None:
    """Category tick labels of an x axis (systems, deployments) wrapped at spaces to the width each one has, so
    neighbours never overprint: at the axis's font size, else at four fifths of it; where a word is still too wide
    for its slot, the whole labels turn 30 degrees."""
    fig.canvas.draw()  # tick labels and axes sizes as they will be saved
    for ax in fig.axes:
        texts = [t.get_text() for t in ax.get_xticklabels()]
        if not texts or all(_is_number(t) for t in texts):
            continue
        size = float(ax.get_xticklabels()[0].get_fontsize())
        slot = ax.get_window_extent().width * 72.0 / fig.dpi / len(texts)  # points per tick
        for scale in (1.0, 0.8):
            chars = max(4, int(slot / (0.62 * size * scale)) - 1)  # a character is about 0.6 em; one spare
            wrapped = [textwrap.fill(t, width=chars, break_long_words=False) for t in texts]
            if max(len(w) for t in wrapped for w in t.split("\n")) <= chars:
                if wrapped != texts or scale != 1.0:
                    ax.set_xticks(ax.get_xticks(), wrapped, fontsize=size * scale)
                break
        else:  # a word wider than its slot: the whole labels, turned
            ax.set_xticks(ax.get_xticks(), texts, rotation=30, ha="right", rotation_mode="anchor")


def _is_number(text: str) -> bool:
    """A numeric tick label (or an empty one): not a category."""
    try:
        float(text.replace("\N{MINUS SIGN}", "-") or 0)
    except ValueError:
        return False
    return True


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
