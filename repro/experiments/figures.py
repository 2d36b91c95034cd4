"""Figures as pure functions of tidy tables (points.csv, requests.parquet, steps.parquet).

Every function takes a DataFrame and column names and returns a matplotlib Figure in one shared paper-like style
(white grid, small fonts, markers, one legend above the panels: :mod:`repro.experiments.panels`). Rows that differ
only by seed are averaged, with the standard deviation over seeds as error bars when there are several.
:func:`draw_figures` draws an experiment's ``exp.figures`` specs and saves each as ``<name>.png`` (150 dpi) and
``<name>.pdf``; the per-request and per-step tables first get the columns that follow from stored ones
(``latency_s``, ``accept_rate``, ..., :mod:`repro.metrics.derived`).

Figure spec keys: ``name`` and ``kind`` (line | bar | cdf | timeline | stacked_bar | claim) are required; ``x``,
``y`` (a column, or a list of columns for stacked_bar and timeline), ``hue`` (default ``system``), ``col``, ``row``,
``style``, ``title``, ``xlabel``, ``ylabel``, ``logx``, ``logy``, ``ylim``, ``hue_order``, ``labels``, ``where``
(``{column: value}`` filters applied first) and, for timelines, ``y2``, ``y2label``, ``bin_s`` and ``rate`` are
optional. A line or bar figure reads points.csv unless ``data`` names another table (``requests``, ``steps`` or
``rounds``: per request, per step, per request per step); ``bins`` (a list of edges) then groups the rows by the bin
their ``x`` falls in, each bin drawn at its centre with the mean ``y`` of its rows (e.g. LAPS-SD Fig. 7's estimation
error by output length). Line figures also take ``markers`` (false: plain lines), ``palette`` (a seaborn palette
name) and ``sharey`` (false: a y axis per panel). ``refs`` draws reference lines (``[{y: 1, label: "1x"}]``). A
``claim`` figure takes ``claims`` (claim texts of ``exp.claims``) and ``labels``, and draws each claim's quantity at
each x with the paper's value (:func:`claim`; the renderer computes its table). Bars never go on a log axis.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from repro.core.errors import ConfigError
from repro.experiments.panels import (
    PANEL_H,
    PANEL_W,
    current_shown,
    decorate,
    facets,
    fit_ticks,
    grid_order,
    legend_state,
    plt,
    relabel_ticks,
    save,
    shared_legend,
    sns,
    stamp,
    system_colour,
    use_style,
)
from repro.metrics.derived import with_derived

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


SEED_COL = "seed"
SPEC_KEYS = {
    "name", "kind", "x", "y", "hue", "col", "row", "style", "title", "xlabel", "ylabel",
    "logx", "logy", "ylim", "hue_order", "where", "labels", "y2", "y2label", "bin_s", "data", "bins", "markers",
    "palette", "sharey", "rate", "refs", "claims",
}  # fmt: skip
#: Tables a figure can read (``data``), and the kinds that may choose one.
TABLES = ("points", "requests", "steps", "rounds")
_CHOOSE_TABLE = ("line", "bar")


def _several_seeds(df: pd.DataFrame, keys: Sequence[str]) -> bool:
    """True when some combination of ``keys`` appears with more than one seed (error bars make sense)."""
    if SEED_COL not in df.columns or df.empty:
        return False
    return bool(df.groupby([k for k in keys if k in df.columns], dropna=False)[SEED_COL].nunique().max() > 1)


def line(
    df: pd.DataFrame,
    x: str,
    y: str,
    hue: str | None = "system",
    col: str | None = None,
    row: str | None = None,
    style: str | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    hue_order: Sequence[Any] | None = None,
    markers: bool = True,
    palette: str | None = None,
    errorbars: bool = True,
    sharey: bool = True,
    **opts: Any,
) -> Figure:
    """Mean ``y`` against ``x`` per ``hue`` (error bars: std over seeds), faceted by ``col``/``row``; ``markers``
    false draws plain lines (dense series such as a round trace), ``palette`` names a seaborn palette (e.g.
    ``deep`` for distinct colours when ``hue`` is numeric, which otherwise gets a sequential one); ``errorbars``
    false drops the error bars (rows that are requests, not seeds), ``sharey`` false gives each panel its own y
    axis."""
    several = errorbars and _several_seeds(df, [x, hue or x, col or x, row or x, style or x])
    errorbar = "sd" if several else None
    order = list(hue_order) if hue_order else (grid_order(df, hue) or None)
    colors: Any = sns.color_palette(palette, n_colors=len(order)) if palette and order else None
    dashes: bool | dict[Any, Any] = style is not None
    shown = current_shown()
    systems = hue == "system" and order is not None
    sizes: dict[Any, float] | None = None
    variants = [v for v in order or () if v in shown.variants] if style is None else []
    if systems and order:  # the suite's variants first and dashed, the paper's own system last, thicker, in its colour
        own = [v for v in order if v in shown.own]
        order = [*variants, *(v for v in order if v not in variants and v not in own), *own]
        colors = {v: system_colour(v) for v in order}
        sizes = {v: 2.2 if v in own else 1.2 for v in order}
        if style is None:
            dashes = {v: (3, 2) if v in variants else "" for v in order}
    elif variants and order:
        order = [*variants, *(v for v in order if v not in variants)]
        dashes = {v: (3, 2) if v in variants else "" for v in order}
        colors = colors or sns.color_palette(n_colors=len(order))
    marks = coincident(df, [k for k in (row, col, x) if k is not None], hue, y, order) if order else {}
    xs: list[Any] = list(pd.unique(df[x])) if x in df.columns else []
    if opts.get("logx") and len(xs) <= 12 and all(isinstance(v, int | float | np.number) for v in xs):
        opts.setdefault("xticks", sorted(float(v) for v in xs))

    def draw(ax: Axes, sub: pd.DataFrame) -> None:
        sns.lineplot(
            data=sub, x=x, y=y, hue=hue, hue_order=order, style=style or hue,
            style_order=order if (variants or systems) and style is None else None,
            size=hue if sizes else None, sizes=sizes, size_order=order if sizes else None,
            markers=markers, dashes=dashes, errorbar=errorbar, err_style="bars", palette=colors, ax=ax,
            legend="full",
        )  # fmt: skip

    with legend_state(marks, hue if hue is not None and not systems and hue in df.columns
                      and pd.api.types.is_numeric_dtype(df[hue]) else ""):
        fig = facets(df, col, row, draw, sharey=sharey)
    return decorate(fig, title, xlabel, ylabel, **opts)


#: how close two series must be, everywhere, to be drawn as one (the later hides the earlier)
COINCIDE_RTOL = 0.01
#: what :func:`coincident` found while the figures were drawn (draw_figures puts it in summary.md's notes)
HIDDEN: list[str] = []


def coincident(df: pd.DataFrame, keys: Sequence[str], hue: str | None, y: str,
               order: Sequence[Any]) -> dict[str, str]:
    """Series that another drawn after it hides (mean y within :data:`COINCIDE_RTOL` at every x of every panel): a
    legend mark per hidden label, " (= IncrDec)", and a note in :data:`HIDDEN`."""
    if hue is None or hue not in df.columns or not keys or len(order) < 2:
        return {}
    table = df.groupby([*keys, hue], sort=False)[y].mean().unstack(hue)
    marks: dict[str, str] = {}
    names = current_shown().names
    for i, a in enumerate(order):
        later = [b for b in order[i + 1:] if a in table.columns and b in table.columns]
        for b in later:
            both = table[[a, b]].dropna()
            if len(both) and np.allclose(both[a], both[b], rtol=COINCIDE_RTOL, atol=1e-12):
                shown_b = names.get(str(b), str(b))
                marks[str(a)] = f" (= {shown_b})"
                HIDDEN.append(f"{names.get(str(a), str(a))} coincides with {shown_b} (within "
                              f"{COINCIDE_RTOL:.0%} at every point), drawn under it")
                break
    return marks


def bar(
    df: pd.DataFrame,
    x: str,
    y: str,
    hue: str | None = "system",
    col: str | None = None,
    row: str | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    hue_order: Sequence[Any] | None = None,
    **opts: Any,
) -> Figure:
    """Grouped bars: mean ``y`` per ``x`` (each panel its own x values) and ``hue`` (error bars: std over seeds)."""
    errorbar = "sd" if _several_seeds(df, [x, hue or x, col or x, row or x]) else None
    order = list(hue_order) if hue_order else (grid_order(df, hue) or None)

    sharey = bool(opts.pop("sharey", True))
    palette = {v: system_colour(v) for v in order} if hue == "system" and order else None

    def draw(ax: Axes, sub: pd.DataFrame) -> None:
        sns.barplot(
            data=sub, x=x, y=y, hue=hue, hue_order=order, order=grid_order(sub, x), errorbar=errorbar, ax=ax,
            palette=palette, saturation=1.0 if palette else 0.75,  # a system's own colour, not a greyed one
        )

    return decorate(facets(df, col, row, draw, sharey=sharey), title, xlabel, ylabel, **opts)


def cdf(
    df_requests: pd.DataFrame,
    value: str,
    hue: str | None = "system",
    col: str | None = None,
    row: str | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = "CDF",
    hue_order: Sequence[Any] | None = None,
    **opts: Any,
) -> Figure:
    """Empirical CDF of a per-request ``value`` (e.g. TPOT) per ``hue``."""
    order = list(hue_order) if hue_order else (grid_order(df_requests, hue) or None)

    palette = {v: system_colour(v) for v in order} if hue == "system" and order else None

    def draw(ax: Axes, sub: pd.DataFrame) -> None:
        sns.ecdfplot(data=sub, x=value, hue=hue, hue_order=order, ax=ax, palette=palette)

    return decorate(facets(df_requests, col, row, draw), title, xlabel, ylabel, **opts)


def timeline(
    steps_df: pd.DataFrame,
    x: str = "start_at",
    y: str | Sequence[str] = "num_batched_tokens",
    hue: str | None = "system",
    col: str | None = None,
    row: str | None = None,
    title: str | None = None,
    xlabel: str | None = "time (s)",
    ylabel: str | None = None,
    hue_order: Sequence[Any] | None = None,
    y2: Sequence[str] | None = None,
    y2label: str | None = None,
    bin_s: float | None = None,
    labels: Sequence[str] | None = None,
    rate: bool = False,
    **opts: Any,
) -> Figure:
    """A per-step quantity over simulated time, one line per ``hue`` (no averaging unless ``bin_s``).

    Several series at once (TurboSpec Fig. 15): ``y`` a list of columns on the left axis and ``y2`` a list on a
    right axis (dashed); then each column is a line (``labels`` names them, in ``y`` then ``y2`` order) and
    ``hue`` is not used — filter to one system with ``where``. ``bin_s`` averages every column over bins of that
    many seconds (NaNs, e.g. the acceptance rate of a step without proposals, are skipped); with ``rate`` it sums
    them per bin and divides by ``bin_s`` instead (a count per step becomes a rate: tokens per second).
    """
    ys = [y] if isinstance(y, str) else list(y)
    y2s = list(y2 or [])
    names = dict(zip([*ys, *y2s], labels, strict=True)) if labels else {}
    multi = len(ys) + len(y2s) > 1
    hue = hue if hue in steps_df.columns and not multi else None
    order = list(hue_order) if hue_order else (grid_order(steps_df, hue) or None)
    twins: list[Axes] = []

    def binned(sub: pd.DataFrame) -> pd.DataFrame:
        if not bin_s:
            return sub
        keys = [(sub[x] // bin_s * bin_s).rename(x), *([sub[hue]] if hue else [])]
        grouped = sub.groupby(keys, sort=True)[[*ys, *y2s]]
        return (grouped.sum() / bin_s).reset_index() if rate else grouped.mean().reset_index()

    def draw(ax: Axes, sub: pd.DataFrame) -> None:
        data = binned(sub)
        if not multi:
            sns.lineplot(
                data=data, x=x, y=ys[0], hue=hue, hue_order=order, estimator=None, drawstyle="steps-post", ax=ax,
                palette={v: system_colour(v) for v in order} if hue == "system" and order else None,
            )
            return
        colors = iter(sns.color_palette(n_colors=len(ys) + len(y2s)))
        for c in ys:
            ax.plot(data[x], data[c], drawstyle="steps-post", color=next(colors), label=names.get(c, c))
        if y2s:
            right = ax.twinx()
            twins.append(right)
            right.grid(False)
            for c in y2s:
                color = next(colors)
                right.plot(data[x], data[c], drawstyle="steps-post", color=color, linestyle="--")
                ax.plot([], [], color=color, linestyle="--", label=names.get(c, c))  # legend entry on the left

    fig = decorate(facets(steps_df, col, row, draw, sharey=False), title, xlabel, ylabel, **opts)
    for right in twins:  # decorate gave the right axes the left label and scales
        right.set_ylabel(y2label or "")
        right.set_yscale("linear")
    if twins:
        fig.tight_layout()
    return fig


def stacked_bar(
    df: pd.DataFrame,
    x: str,
    y: Sequence[str],
    col: str | None = None,
    row: str | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    labels: Sequence[str] | None = None,
    **opts: Any,
) -> Figure:
    """Breakdown bars: the means (over seeds) of columns ``y`` stacked per ``x`` (e.g.
    draft/verify/overhead); ``labels`` names the parts in the legend (default: the column names)."""
    parts = list(y)
    names = list(labels) if labels is not None else parts

    def draw(ax: Axes, sub: pd.DataFrame) -> None:
        means = sub.groupby(x, sort=False)[parts].mean()
        bottom = pd.Series(0.0, index=means.index)
        ticks = [str(v) for v in means.index]
        for p, name in zip(parts, names, strict=True):
            ax.bar(ticks, means[p].to_numpy(), bottom=bottom.to_numpy(), label=name)
            bottom = bottom + means[p]
        ax.set_xlabel(x)

    return decorate(facets(df, col, row, draw), title, xlabel, ylabel, **opts)


def claim(
    df: pd.DataFrame,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    **opts: Any,
) -> Figure:
    """A claim's own quantity at each x (the claims table the renderer builds: ``claim``, ``x``, ``value``,
    ``system``, ``target``, ``paper``, ``relation``): one panel per claim, each system's line (the claim's system and
    its readings) with the paper's value dotted and 1× drawn for a ratio. A ratio near 1 that an absolute figure
    cannot show (AdaServe beside GlobalGreedy, Nightjar beside LinTS) is read here."""
    shown = current_shown()
    order = grid_order(df, "system")
    order = [*(v for v in order if v not in shown.own), *(v for v in order if v in shown.own)]
    colors = {v: system_colour(v) for v in order}
    sizes = {v: 2.2 if v in shown.own else 1.2 for v in order}

    def draw(ax: Axes, sub: pd.DataFrame) -> None:
        here = [v for v in order if v in set(sub["system"])]
        sns.lineplot(data=sub, x="x", y="value", hue="system", hue_order=here, palette=colors, size="system",
                     sizes=sizes, size_order=here, marker="o", ax=ax, legend="full")
        if len(sub) and str(sub["relation"].iloc[0]) == "ratio":
            ax.axhline(1.0, color="0.6", lw=0.7, zorder=1)
        target = float(sub["target"].iloc[0]) if len(sub) else float("nan")
        if np.isfinite(target):
            ax.axhline(target, color="0.25", lw=0.9, ls=":", zorder=1)
            ax.annotate(f"paper: {sub['paper'].iloc[0]}", (1.0, target), xycoords=("axes fraction", "data"),
                        ha="right", va="bottom", fontsize=6, color="0.25")
        if xlabel is None:
            ax.set_xlabel(str(sub["x_name"].iloc[0]) if len(sub) else "")

    fig = facets(df, "claim", None, draw, sharey=False)
    return decorate(fig, title, xlabel, ylabel, **opts)


#: figure kind → (function, which table it reads, the name its y/value argument has).
KINDS: dict[str, tuple[Callable[..., Figure], str, str]] = {
    "line": (line, "points", "y"),
    "bar": (bar, "points", "y"),
    "stacked_bar": (stacked_bar, "points", "y"),
    "cdf": (cdf, "requests", "value"),
    "timeline": (timeline, "steps", "y"),
    "claim": (claim, "claims", "y"),
}


def filter_rows(df: pd.DataFrame, where: Mapping[str, Any] | None) -> pd.DataFrame:
    """Rows of ``df`` whose columns equal the ``where`` values (lists = any of)."""
    for key, value in (where or {}).items():
        if key not in df.columns:
            raise ConfigError(f"where: no column '{key}' (columns: {', '.join(map(str, df.columns))})")
        values = value if isinstance(value, list | tuple) else [value]
        df = df[df[key].isin(values)]
    return df


def check_spec(spec: Mapping[str, Any], columns: Sequence[str]) -> None:
    """Raise :class:`ConfigError` naming the key when a figure spec is malformed or names a missing column."""
    name = spec.get("name", "?")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise ConfigError(
            f"exp.figures[{name}]: unknown key(s) {sorted(unknown)} (known: {sorted(SPEC_KEYS)})"
        )
    if "name" not in spec or spec.get("kind") not in KINDS:
        raise ConfigError(
            f"exp.figures[{name}]: needs a name and a kind in {sorted(KINDS)}, got {spec.get('kind')!r}"
        )
    for key in ("x", "hue", "col", "row", "style"):
        v = spec.get(key)
        if v is not None and v not in columns:
            raise ConfigError(f"exp.figures[{name}].{key}: no column '{v}'")
    for key in ("y", "y2"):
        ys = spec.get(key)
        for y in ys if isinstance(ys, list | tuple) else [ys] if ys is not None else []:
            if y not in columns:
                raise ConfigError(f"exp.figures[{name}].{key}: no column '{y}'")
    if spec.get("kind") in ("bar", "stacked_bar") and spec.get("logy"):
        raise ConfigError(f"exp.figures[{name}].logy: bars start at zero, which a log axis cannot show (drop logy, "
                          "or draw a line)")
    if spec.get("kind") == "bar" and spec.get("x") is not None and spec.get("hue", "system") == spec.get("x"):
        raise ConfigError(f"exp.figures[{name}]: x and hue are both '{spec.get('x')}' (a bar per x value needs no "
                          "hue: set hue to another column)")


def drop_missing_facets(spec: Mapping[str, Any], columns: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The spec without facet keys (col/row/style) naming absent columns — a quick run's grid may lack them —
    and a note per dropped key."""
    out, notes = dict(spec), []
    for key in ("col", "row", "style"):
        if out.get(key) is not None and out[key] not in columns:
            notes.append(f"figure {spec.get('name')}: no column '{out.pop(key)}', drawn without {key}")
    return out, notes


def source_of(spec: Mapping[str, Any]) -> str:
    """The table a figure reads: its kind's (:data:`KINDS`), or the one ``data`` names (line and bar figures)."""
    name = spec.get("name", "?")
    kind = str(spec.get("kind"))
    data = spec.get("data")
    if data is None:
        return KINDS[kind][1] if kind in KINDS else "points"
    if data not in TABLES:
        raise ConfigError(f"exp.figures[{name}].data: '{data}' is not one of {', '.join(TABLES)}")
    if kind not in _CHOOSE_TABLE and data != KINDS[kind][1]:
        raise ConfigError(f"exp.figures[{name}].data: a {kind} figure reads {KINDS[kind][1]}; only "
                          f"{' and '.join(_CHOOSE_TABLE)} figures choose their table")
    return str(data)


def binned(df: pd.DataFrame, x: str, edges: Sequence[float], name: str = "?", geometric: bool = False) -> pd.DataFrame:
    """The rows whose ``x`` falls in one of the bins ``edges`` (left-closed), ``x`` replaced by the bin's centre
    (``geometric``: √(left·right), for a log axis, where a bin starting at 0 is drawn at half its right edge)."""
    e = [float(v) for v in edges] if isinstance(edges, list | tuple) else []
    if len(e) < 2 or any(b <= a for a, b in itertools.pairwise(e)):
        raise ConfigError(f"exp.figures[{name}].bins: expected at least two increasing edges, got {edges!r}")
    left, right = np.array(e[:-1]), np.array(e[1:])
    mids = np.where(left > 0, np.sqrt(left * right), right / 2.0) if geometric else (left + right) / 2.0
    code = pd.cut(df[x], e, right=False, labels=False).to_numpy(dtype=np.float64)
    known = np.isfinite(code)
    centres = np.full(len(df), np.nan)
    centres[known] = mids[code[known].astype(np.int64)]
    out = df.assign(**{x: centres})
    return out[out[x].notna()]


def draw_figure(spec: Mapping[str, Any], tables: Mapping[str, pd.DataFrame | None]) -> Figure | None:
    """One figure from its spec, or None when the table it reads was not saved (e.g. no requests.parquet)."""
    fn, _, y_arg = KINDS[str(spec.get("kind"))]
    df = tables.get(source_of(spec))
    if df is None:
        return None
    spec, _ = drop_missing_facets(spec, list(df.columns))
    check_spec(spec, list(df.columns))
    args = {k: v for k, v in spec.items() if k not in ("name", "kind", "where", "y", "data", "bins")}
    if spec.get("y") is not None:
        args[y_arg] = spec["y"]
    df = filter_rows(df, spec.get("where"))
    if source_of(spec) != "points" and fn is line:
        args["errorbars"] = False  # the rows are requests, steps or rounds: their spread is not a seed's
    if spec.get("bins") is not None:
        if spec.get("x") is None:
            raise ConfigError(f"exp.figures[{spec.get('name')}].bins: needs an x column to bin")
        df = binned(df, str(spec["x"]), spec["bins"], str(spec.get("name")), geometric=bool(spec.get("logx")))
    return fn(df, **args)


def titled(spec: Mapping[str, Any], caption: str) -> dict[str, Any]:
    """The spec with a title that names the paper and figure (``caption``: "AdaServe Fig. 4", the experiment title's
    head) unless it already does."""
    out = dict(spec)
    title = str(out.get("title") or out.get("y") or "")
    if caption and not title.startswith(caption.split(" ")[0]):
        out["title"] = f"{caption}: {title}" if title else caption
    return out


def draw_figures(
    figures: Sequence[Mapping[str, Any]],
    points: pd.DataFrame,
    out_dir: Path,
    requests: pd.DataFrame | None = None,
    steps: pd.DataFrame | None = None,
    banner: str | None = None,
    rounds: pd.DataFrame | None = None,
    caption: str = "",
    claims: pd.DataFrame | None = None,
) -> tuple[list[Path], list[str]]:
    """Draw every figure spec to ``out_dir/<name>.png/.pdf``; returns the files and notes on skipped figures and on
    series another hides. ``banner`` (the run's overrides, a data fallback) is added under every figure's title;
    ``caption`` ("AdaServe Fig. 4") heads every title."""
    if not figures:
        return [], []  # nothing to draw: matplotlib and seaborn are never imported
    use_style()
    tables = {"points": points, "requests": with_derived(requests), "steps": with_derived(steps),
              "rounds": with_derived(rounds), "claims": claims}
    paths: list[Path] = []
    skipped: list[str] = []
    for spec in figures:
        if spec.get("kind") not in KINDS:
            check_spec(spec, list(points.columns))
        source = source_of(spec)
        skipped += drop_missing_facets(spec, list(points.columns))[1] if source == "points" else []
        HIDDEN.clear()
        fig = draw_figure(titled(spec, caption), tables)
        if fig is None:
            skipped.append(f"figure {spec['name']}: its claims cannot be computed on this grid" if source == "claims"
                           else f"figure {spec['name']}: needs {source}.parquet (run with save_requests=true)")
            continue
        for note in dict.fromkeys(HIDDEN):
            skipped.append(f"figure {spec['name']}: {note}")
            warnings.warn(f"figure {spec['name']}: {note}", stacklevel=2)
        relabel_ticks(fig)
        fit_ticks(fig)
        if banner:
            stamp(fig, banner)
        paths += save(fig, out_dir, str(spec["name"]))
    return paths, skipped


def model_vs_measured(
    df: pd.DataFrame, x: str = "x", measured: str = "measured_ms", modelled: str = "modelled_ms",
    title: str | None = None, xlabel: str | None = None, ylabel: str | None = "ms",
) -> Figure:  # fmt: skip
    """A calibration table: the model as a line, the measurements as points."""
    use_style()
    fig, ax = plt.subplots(figsize=(PANEL_W, PANEL_H))
    d = df.sort_values(x)
    ax.plot(d[x], d[modelled], "-", marker=".", label="model")
    ax.scatter(d[x], d[measured], color="black", s=12, zorder=3, label="measured")
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel or "")
    if title:
        ax.set_title(title)
    shared_legend(fig, [ax])
    return fig


def streaming_efficiency(df: pd.DataFrame) -> Figure:
    """Weight-streaming efficiency against GEMM size (log x), one colour per GPU: the model's per-GEMM share (small
    points joined by GPU), each stack's modelled share (hollow) and measured share (filled)."""
    use_style()
    fig, ax = plt.subplots(figsize=(PANEL_W * 1.2, PANEL_H))
    for (gpu, rows), color in zip(df.groupby("gpu", sort=True), ("tab:blue", "tab:orange", "tab:green", "tab:red"),
                                  strict=False):
        mats = rows[rows["matrix"] != "stack"].sort_values("matrix_mb")
        ax.plot(mats["matrix_mb"], mats["modelled_eff"], ".", color=color, alpha=0.6, label=f"{gpu}: GEMMs (model)")
        stack = rows[rows["matrix"] == "stack"]
        ax.scatter(stack["matrix_mb"], stack["modelled_eff"], s=40, facecolors="none", edgecolors=color,
                   label=f"{gpu}: stack (model)")
        ax.scatter(stack["matrix_mb"], stack["measured_eff"], s=30, color=color, marker="x",
                   label=f"{gpu}: stack (measured)")
    ax.set_xscale("log")
    ax.set_xlabel("MB per GEMM per GPU")
    ax.set_ylabel("share of peak bandwidth")
    ax.set_title("weight streaming by matrix size")
    shared_legend(fig, [ax])
    return fig


def measured_vs_modelled(
    df: pd.DataFrame, measured: str = "measured_ms", modelled: str = "modelled_ms", gpu: str = "modelled_gpu_ms",
    kind: str = "pass", title: str | None = None,
) -> Figure:  # fmt: skip
    """A measured profile against the model, one point per pass (log-log, coloured by pass kind): the model's whole
    pass (filled) and its GPU work alone (hollow), with the diagonal and ±25 %."""
    use_style()
    fig, ax = plt.subplots(figsize=(PANEL_W * 1.2, PANEL_W * 1.2))
    for (name, rows), color in zip(df.groupby(kind, sort=True), ("tab:blue", "tab:orange", "tab:green", "tab:red"),
                                   strict=False):
        ax.scatter(rows[measured], rows[modelled], s=10, color=color, label=f"{name}: whole pass")
        ax.scatter(rows[measured], rows[gpu], s=14, facecolors="none", edgecolors=color, label=f"{name}: GPU work")
    lo = float(min(df[measured].min(), df[gpu].min())) * 0.8
    hi = float(max(df[measured].max(), df[modelled].max())) * 1.25
    line = [lo, hi]
    ax.plot(line, line, color="black", lw=0.8)
    for f in (0.75, 1.25):
        ax.plot(line, [v * f for v in line], color="grey", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("modelled (ms)")
    if title:
        ax.set_title(title, fontsize=8)
    shared_legend(fig, [ax])
    return fig


def relative_error_bars(
    df: pd.DataFrame, label: str = "table", err: str = "rel_err", tol: str = "tolerance",
    title: str | None = None,
) -> Figure:  # fmt: skip
    """Calibration anchors in one unit-free panel: (modelled / measured − 1) in % per row, one bar each,
    with the row's tolerance as grey ticks (blue bars are within it, red ones outside)."""
    use_style()
    d = df.reset_index(drop=True)
    pct, band = d[err].to_numpy() * 100, d[tol].to_numpy() * 100
    fig, ax = plt.subplots(figsize=(2 * PANEL_W, 0.22 * len(d) + 1.0))
    ypos = range(len(d))
    colors = ["tab:blue" if abs(e) <= b else "tab:red" for e, b in zip(pct, band, strict=True)]
    ax.barh(list(ypos), pct, color=colors)
    ax.scatter(band, list(ypos), marker="|", color="grey", s=80, label="± tolerance")
    ax.scatter(-band, list(ypos), marker="|", color="grey", s=80)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(list(ypos), [str(v) for v in d[label]])
    ax.invert_yaxis()
    ax.set_xlabel("modelled / measured − 1 (%)")
    if title:
        ax.set_title(title)
    shared_legend(fig, [ax])
    return fig
