"""Render an experiment's results folder: its figures and summary.md, drawn from its tables without simulating.

    python -m repro.render results/NAME [results/OTHER ...]     (also: python -m repro.plot)

reads ``points.csv`` and ``manifest.json`` (and ``requests.parquet`` / ``steps.parquet`` / ``rounds.parquet`` when
present) and writes the figures (PNG + PDF) and ``summary.md`` next to them. The experiment runner calls
:func:`render` too.

summary.md holds the experiment's title and description, a run line (points, seeds, quick, code version), the table
behind each figure (mean of y over seeds, x down, hue across) and the "Paper claims" table
(:mod:`repro.experiments.claims`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from repro.core.errors import ConfigError, ReproError
from repro.experiments import claims, datasources, figures, panels, studies
from repro.experiments.expspec import ExpSpec
from repro.experiments.results import CONF_DIR, engines_line

CALIBRATION_COLS = (
    "table", "x_name", "x", "measured_ms", "modelled_ms", "error_of", "rel_err", "tolerance", "within_tol", "checked",
    "band", "note",
)  # fmt: skip


def _cell(value: Any) -> str:
    """Markdown cell text: floats with 4 significant digits, NaN as an empty cell, pipes escaped."""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame, index: bool = True) -> str:
    """A DataFrame as a GitHub markdown table (pandas' to_markdown needs ``tabulate``, which we do not
    require)."""
    frame = df.reset_index() if index else df
    header = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def figure_table(points: pd.DataFrame, spec: Mapping[str, Any]) -> pd.DataFrame | None:
    """The numbers behind a points figure: mean y over seeds, index (row, col, x), one column per hue
    value."""
    if str(spec.get("kind")) not in figures.KINDS or figures.source_of(spec) != "points":
        return None
    spec, _ = figures.drop_missing_facets(spec, list(points.columns))
    df = figures.filter_rows(points, spec.get("where"))
    x = spec.get("x")
    index = [k for k in (spec.get("row"), spec.get("col"), x) if k is not None]
    ys = spec.get("y")
    if isinstance(ys, list | tuple):
        return df.groupby(index or ["system"], sort=False)[list(ys)].mean()
    hue = spec.get("hue", "system")
    if hue is None or hue not in df.columns:
        return df.groupby(index, sort=False)[[ys]].mean()
    table = df.pivot_table(index=index, columns=hue, values=ys, aggfunc="mean", sort=False)
    table.columns.name = None
    if x is not None and len(index) > 1:  # facets in order of appearance, x ascending within each facet
        facets = index[:-1]
        rank = {k: {v: i for i, v in enumerate(pd.unique(df[k]))} for k in facets}
        flat = table.reset_index()
        order = sorted(range(len(flat)), key=lambda i: (*(rank[k][flat.at[i, k]] for k in facets), flat.at[i, x]))
        table = flat.iloc[order].set_index(index)
    return table


def _exp(manifest: Mapping[str, Any]) -> ExpSpec:
    """The experiment as it ran (manifest.json records its ``exp`` block)."""
    return ExpSpec.parse(manifest.get("config", {}).get("exp", {}))


def _run_line(manifest: Mapping[str, Any], points: pd.DataFrame) -> str:
    seeds = manifest.get("seeds") or []
    return (
        f"{len(points)} points, seeds {seeds}, quick={manifest.get('quick')}, "
        f"code version `{manifest.get('code_version')}`, git `{manifest.get('git_commit')}`, "
        f"{manifest.get('wall_s')} s wall."
    )


def write_summary(
    out_dir: Path, manifest: Mapping[str, Any], points: pd.DataFrame, notes: Sequence[str],
    shown: panels.Shown | None = None, extra: Sequence[str] = (),
) -> Path:
    """summary.md of a sweep: title, description, run line, the systems' names in the figures, ``extra`` sections (a
    league's leaderboard), a table per figure, the paper claims."""
    exp = _exp(manifest)
    own = own_run_title(manifest, points)
    parts = [f"# {own}\n" if own else f"# {exp.name or manifest.get('exp', '')}: {exp.title}\n"]
    sources = manifest.get("data") or []
    warning = datasources.warning(sources)
    if warning:
        parts.append(f"> **{warning}**\n")
    if exp.description:
        parts.append(f"{exp.description}\n")
    if is_validation(exp.name):
        parts.append(f"> **{HELD_OUT}**\n")
    if manifest.get("command_line"):
        parts.append("Command line: `" + " ".join(manifest["command_line"]) + "`\n")
    for line in manifest.get("narrowed") or []:
        parts.append(f"Narrowed: {line}\n")
    engines = engines_line(manifest.get("engines") or {}, bool(manifest.get("engine_warning")))
    if engines:
        text = engines[:1].upper() + engines[1:]
        parts.append(f"> **{text}**\n" if manifest.get("engine_warning") else f"{text}.\n")
    parts.append(_run_line(manifest, points) + "\n")
    if shown is not None and shown.names:
        labels = list(dict.fromkeys(str(v) for v in points["system"]))
        named = [f"`{v}` = {shown.names[v]}" + (" (the suite's variant, dashed)" if v in shown.variants else "")
                 for v in labels if v in shown.names]
        parts.append("Systems in the figures: " + "; ".join(named) + ".\n")
    parts.extend(extra)
    if not exp.figures:  # a run of your own (no experiment, or one without figures): its numbers, per system and point
        parts += results_section(points, manifest.get("grid_keys") or [], own_run_figures(points, manifest.get(
            "grid_keys") or []))
    for spec in exp.figures:
        table = figure_table(points, spec)
        y = spec.get("y")
        parts.append(f"## Figure `{spec.get('name')}`: {spec.get('title') or y}\n")
        parts.append(markdown_table(table) if table is not None else "(drawn from per-request/step tables)\n")
    if exp.claims:
        parts += claims_section(out_dir, manifest, exp, points)
    if sources:
        parts.append("## Data\n")
        parts.append(datasources.markdown(sources))
    run_notes = _distinct(manifest.get("notes") or [])
    if sources:  # the Data section says where the data came from; what a real backend did with it stays
        run_notes = [n for n in run_notes if n.startswith(REAL_BACKEND_NOTES)]
    all_notes = [*run_notes, *notes]
    if all_notes:
        parts.append("## Notes\n")
        parts.append("".join(f"- {n}\n" for n in all_notes))
    path = out_dir / "summary.md"
    path.write_text("\n".join(parts))
    return path


#: The metrics a run of your own shows first, under vLLM's benchmark names (``vllm bench serve``): column, header
HEADLINE = (
    ("output_throughput", "output tok/s"), ("request_throughput", "req/s"),
    ("mean_ttft_ms", "mean TTFT ms"), ("median_ttft_ms", "median TTFT ms"), ("p99_ttft_ms", "p99 TTFT ms"),
    ("mean_tpot_ms", "mean TPOT ms"), ("median_tpot_ms", "median TPOT ms"), ("p99_tpot_ms", "p99 TPOT ms"),
    ("mean_latency_s", "mean E2E s"), ("p99_latency_s", "p99 E2E s"),
    ("mean_acceptance_length", "acceptance length"), ("completed", "completed"),
)
#: the closing line's metric for such a run
HEADLINE_METRIC = ("output_throughput", "output throughput", "tok/s")


def own_run_title(manifest: Mapping[str, Any], points: pd.DataFrame) -> str:
    """The title of a run without an experiment: what ran, on what (empty for an experiment's run)."""
    if manifest.get("exp") != "default":
        return ""
    cfg = manifest.get("config") or {}
    systems = ", ".join(dict.fromkeys(str(s) for s in points.get("system", ()))) or "no system"
    model = (cfg.get("model") or {}).get("name", "?")
    hardware = (cfg.get("hardware") or {}).get("name", "?")
    n = len(points)
    return f"Your run: {systems} serving {model} on {hardware}, {n} point{'s' if n != 1 else ''}"


def own_run_figures(points: pd.DataFrame, grid: Sequence[str]) -> list[dict[str, Any]]:
    """The figures of a run without figures of its own, where more than one system or point ran: throughput, TPOT
    and p99 latency by system (bars), or along the first swept key (lines)."""
    if len(points) < 2 or "system" not in points.columns:
        return []
    x = str(grid[0]) if grid else "exp"  # without a sweep: one group of bars, a bar per system in its colour
    kind = "line" if grid else "bar"
    ys = [("output_throughput", "Output throughput", "tokens/s"), ("mean_tpot_ms", "Mean TPOT", "TPOT (ms)"),
          ("p99_latency_s", "p99 request latency", "latency (s)")]
    return [{"name": f"results_{y}", "kind": kind, "x": x, "y": y, "hue": "system", "title": title, "ylabel": label,
             "xlabel": x if grid else ""} for y, title, label in ys if y in points.columns]


def results_section(points: pd.DataFrame, grid: Sequence[str], figs: Sequence[Mapping[str, Any]]) -> list[str]:
    """summary.md's "Results" of a run of your own: the headline metrics per system and point (mean over seeds)."""
    cols = [c for c, _ in HEADLINE if c in points.columns]
    if points.empty or not cols:
        return []
    keys = ["system", *(g for g in grid if g in points.columns and g != "system")]
    table = points.groupby(keys, sort=False)[cols].mean().reset_index()
    table.columns = [*keys, *(dict(HEADLINE)[c] for c in cols)]
    out = ["## Results\n", "Per system and point (mean over seeds): vLLM's benchmark metrics (TTFT: time to first "
           "token; TPOT: time per output token after the first; E2E: a request's whole latency).\n",
           markdown_table(table, index=False)]
    if figs:
        out.append("Figures: " + ", ".join(f"`{f['name']}.png`" for f in figs) + ".\n")
    return out


def headline(points: pd.DataFrame) -> str:
    """The closing line's numbers for a run of your own: the headline metric per system (its mean over points)."""
    col, what, unit = HEADLINE_METRIC
    if col not in points.columns or "system" not in points.columns or points.empty:
        return ""
    means = points.groupby("system", sort=False)[col].mean()
    return f"{what} " + ", ".join(f"{s} {v:,.0f} {unit}" for s, v in means.items())


#: The notes a real backend's points add (what it sent as prompts, its threads), kept beside the Data section
REAL_BACKEND_NOTES = ("prompts:", "backend=")


#: what a validation experiment's figures and summary say of the measurements they are compared with
HELD_OUT_SHORT = "the suite's predictions; the servers' measurements are held by checks outside this repository"
HELD_OUT = ("Every number here is the suite's prediction. The real servers' measurements it is compared with are held "
            "by checks outside this repository (docs/validation.md says what each measured), so that the model cannot "
            "be fitted to them.")


def is_validation(name: str | None) -> bool:
    """An experiment that predicts a real server's measurements (``validate_*``)."""
    return bool(name and name.startswith("validate_"))


#: the paper pages of docs/papers/ by an experiment's name prefix (the long explanations a summary links)
PAPER_PAGES = {"adaserve": "adaserve", "turbospec": "turbospec", "laps": "laps_sd", "nightjar": "nightjar",
               "goodspeed": "goodspeed"}


def claim_panels(specs: Sequence[Mapping[str, Any]], exp: ExpSpec, points: pd.DataFrame,
                 default_x: str | None) -> pd.DataFrame | None:
    """The table the ``claim`` figures draw: for each figure and each claim it names (``claims``: claim texts; a
    claim's readings, ``exp.claims_also_for``, come with it), the claim's quantity at each x (:func:`claims.per_x`),
    with the paper's value; the panel is titled by the figure's ``labels`` or the claim's text. ConfigError naming
    the figure for a text no claim has."""
    rows = []
    expanded = claims.expand(exp.claims, exp.claims_also_for)
    for f in specs:
        if f.get("kind") != "claim":
            continue
        texts = [str(t) for t in f.get("claims") or ()]
        labels = [str(t) for t in f.get("labels") or texts]
        if not texts or len(labels) != len(texts):
            raise ConfigError(f"exp.figures[{f.get('name')}]: a claim figure needs claims (their texts) and as many "
                              "labels, if any")
        for text, label in zip(texts, labels, strict=True):
            found = [c for c in expanded if str(c.get("text", "")) == text
                     or str(c.get("text", "")).startswith(f"{text} [")]
            if not found:
                raise ConfigError(f"exp.figures[{f.get('name')}].claims: no claim reads {text!r}")
            for spec in found:
                values = claims.per_x(points, spec, default_x)
                kind = str(spec.get("kind", ""))
                for x, v in values.items():
                    rows.append({"figure": f["name"], "claim": label, "x": x, "value": float(v),
                                 "system": str(spec["system"]), "target": claims.target_of(spec),
                                 "paper": str(spec.get("paper", "")), "x_name": str(spec.get("x") or default_x),
                                 "relation": "ratio" if kind.startswith("ratio") else kind})
    return pd.DataFrame(rows) if rows else None


def claims_section(out_dir: Path, manifest: Mapping[str, Any], exp: ExpSpec, points: pd.DataFrame) -> list[str]:
    """summary.md's "Paper claims": how a paper's wording is read, then per claim its verdict, the test that gave it,
    which way the value lies, its robustness, why it differs and the paper's own inconsistencies."""
    grid = manifest.get("grid_keys") or []
    table = claims.evaluate(exp.claims, points, grid[0] if grid else None, exp.claims_also_for,
                            quick=bool(manifest.get("quick")), one_value=manifest.get("narrowed_axes") or ())
    table["verdict"] = table["verdict"].replace({"calibrated": "calibrated, not a test"})
    out = table[["claim", "paper", "reproduced", "verdict", "test", "direction"]].copy()
    out.columns = ["claim", "paper value", "reproduced value", "verdict", "test", "direction"]
    study, where = studies.find_study(out_dir, exp.name)
    if study:
        out["robustness"] = [robustness_cell(study, c) for c in table["claim"]]
    specs = claims.expand(exp.claims, exp.claims_also_for)
    notes = [str(c.get("note") or "") for c in specs]
    why = ["" if not w else f"Why: {w}" for w in table["why"]]
    out["why it differs; the paper's own numbers"] = [
        " ".join(t for t in (w, f"Paper: {n}" if n else "") if t) for w, n in zip(why, notes, strict=True)]
    counted = table["verdict"].isin(["holds", "differs"])
    held = int((table["verdict"] == "holds").sum())
    parts = ["## Paper claims\n",
             f"{held} of {int(counted.sum())} tested claims hold"
             + (f"; {int((~counted).sum())} not counted (calibrated, or not computable on this grid)"
                if (~counted).any() else "") + ". How a paper's wording is tested: "
             + "; ".join(claims.READINGS) + ". A claim's own tolerance or threshold replaces the default, and the "
             "test column prints the one used. Direction: \"stronger\" / \"weaker\" where the claim has a better "
             "side (the system wins by more / by less than the paper says), else \"above\" / \"below the "
             "paper\".\n"]
    page = PAPER_PAGES.get(exp.name.split("_")[0]) if exp.name else None
    if page:
        parts.append(f"Longer explanations: the paper's page of the manual, `docs/papers/{page}.md`.\n")
    if study:
        parts.append(f"Robustness: {where} ({study['settings']} settings of the open choices, "
                     f"{'quick' if study.get('quick') else 'full'} grid; see its robustness.md)"
                     + (": each cell gives the quick grid's own verdict first, since the grid differs from this "
                        "one's" if study.get("quick") and not manifest.get("quick") else "") + ".\n")
    parts.append(markdown_table(out, index=False))
    return parts


def robustness_cell(study: Mapping[str, Any], claim: str) -> str:
    """A claim's robustness as the claims table shows it: on a quick-grid study the quick grid's own verdict first,
    then its class, share held and deciding knob; "not on the quick grid" where it cannot be computed there."""
    r = (study.get("claims") or {}).get(claim)
    quick = bool(study.get("quick"))
    if not r:
        return "not in the study"
    if r.get("class") in (None, "n/a"):
        return "not on the quick grid" if quick else "not computable"
    knob = f"; {r['knob']}: {r['where']}" if r.get("class") == studies.DEPENDS and r.get("knob") else ""
    head = f"quick grid: {r.get('chosen')}; " if quick else ""
    return f"{head}{r['class']} ({r['share']:.0%}{knob})"


def _distinct(notes: Sequence[str]) -> list[str]:
    """Notes said once each (notes that differ only in numbers, e.g. the point's request rate, count as one)."""
    seen: dict[str, str] = {}
    for n in notes:
        seen.setdefault(re.sub(r"[0-9.]+", "#", n), n)
    return list(seen.values())


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def render_calibration(out_dir: Path, manifest: Mapping[str, Any], points: pd.DataFrame) -> list[Path]:
    """Calibration figures (one per linear table, one for the anchors) and summary.md."""
    paths: list[Path] = []
    linear = points[points["kind"] == "linear"]
    for table, rows in linear.groupby("table", sort=False):
        fig = figures.model_vs_measured(rows, xlabel=str(rows["x_name"].iloc[0]), title=str(table))
        paths += panels.save(fig, out_dir, f"calibration_{_slug(str(table))}")
    for table, rows in points[points["kind"] == "profile"].groupby("table", sort=False):
        fig = figures.measured_vs_modelled(rows, title=str(table))
        paths += panels.save(fig, out_dir, f"calibration_{_slug(str(table))}")
    profiles, points = points[points["kind"] == "profile"], points[points["kind"] != "profile"]
    anchors = points[points["kind"] != "linear"]
    if len(anchors):
        labelled = anchors.assign(table=anchors["table"] + " (" + anchors["x_name"] + "=" + anchors["x"].map(
            lambda v: f"{v:g}") + ")")  # fmt: skip
        paths += panels.save(
            figures.relative_error_bars(labelled, title="anchors"), out_dir, "calibration_anchors"
        )
    within = points["within_tol"].astype(str).str.lower() == "true"
    shown = points.assign(
        rel_err=(points["rel_err"] * 100).round(1), tolerance=(points["tolerance"] * 100).round(1),
        within_tol=within.map({True: "yes", False: "no"}),
    )  # fmt: skip
    if {"band_lo", "band_hi"} <= set(points.columns):  # an unreproducible row's stated error band, in %
        shown["band"] = [f"{100 * lo:+.0f} to {100 * hi:+.0f}" if pd.notna(lo) else ""
                         for lo, hi in zip(points["band_lo"], points["band_hi"], strict=True)]
    cols = [c for c in CALIBRATION_COLS if c in shown.columns]
    text = (
        f"# calibration: {_exp(manifest).title or 'cost model vs published measurements'}\n\n"
        f"{int(within.sum())} of {len(points)} rows within tolerance (rel_err and tolerance in %; a ratio of two "
        "passes is judged on its excess over 1, error_of 'ratio - 1'; an unchecked row, which no consistent model "
        "reproduces, states the error band it is held to).\n\n"
        + markdown_table(shown[cols], index=False)
        + _efficiency_summary(out_dir, paths)
        + _profile_summary(profiles)
    )
    (out_dir / "summary.md").write_text(text)
    return [*paths, out_dir / "summary.md"]


def _efficiency_summary(out_dir: Path, paths: list[Path]) -> str:
    """Weight streaming by matrix size (:func:`repro.cost.calibration.efficiency_table`): a figure and a table, each
    linear-layer table's GEMMs and layer stack beside the stack's measured efficiency."""
    from repro.cost.calibration import efficiency_table

    eff = efficiency_table()
    paths += panels.save(figures.streaming_efficiency(eff), out_dir, "calibration_mem_efficiency")
    shown = eff.assign(matrix_mb=eff["matrix_mb"].round(1), modelled_eff=eff["modelled_eff"].round(3),
                       measured_eff=eff["measured_eff"].round(3))
    return (
        "\n\n## Weight streaming by matrix size\n\n"
        "The share of peak bandwidth each GEMM's weights stream at grows with the matrix on the H100-class GPUs "
        "(`mem_efficiency` for a small one, `mem_efficiency_large` for a large one, halfway at `mem_ramp_us` of "
        "streaming: conf/hardware/h100-80g.yaml); the A100 and A40 tables show no growth (Vidur's A100 Llama-2-70B "
        "TP 4 stack streams at a lower share than its Llama-2-7B), so those GPUs keep one share. Per linear-layer "
        "table: each GEMM's MB per GPU and the model's share, and the stack's (`stack`: its mean GEMM) beside the "
        "measured stack's at the table's fewest tokens (linear and norm kernels).\n\n"
        + markdown_table(shown, index=False)
    )


def _profile_summary(rows: pd.DataFrame) -> str:
    """The committed GPU profiles' rows in brief: per profile and pass kind, the model's error against the measured
    pass, whole and as GPU work alone (every row is in points.csv)."""
    if rows.empty:
        return ""
    whole = rows["modelled_ms"] / rows["measured_ms"] - 1.0
    gpu = rows["modelled_gpu_ms"] / rows["measured_ms"] - 1.0
    bare = rows["modelled_bare_ms"] / rows["measured_ms"] - 1.0 if "modelled_bare_ms" in rows else whole * float("nan")
    d = rows.assign(whole=whole * 100, gpu=gpu * 100, bare=bare * 100)
    table = d.groupby(["table", "pass"], sort=False).agg(
        passes=("x", "size"), measured_ms=("measured_ms", lambda s: f"{s.min():.3g}-{s.max():.3g}"),
        whole_median=("whole", "median"), bare_median=("bare", "median"), gpu_median=("gpu", "median"),
        gpu_min=("gpu", "min"),
        gpu_max=("gpu", "max")).round(1).reset_index()
    return (
        "\n\n## Committed GPU profiles (profiles/, unchecked)\n\n"
        "Passes of the papers' architectures with random weights, measured by `python -m repro.profile` (a plain "
        "PyTorch decoder, no serving engine around it; CUDA graphs where the profile says so), against the analytic "
        "model of the same pass on that GPU. `whole`: the model's pass with its fixed costs (per step, layer and "
        "sequence: a serving engine's, fitted to vLLM), in %; `bare`: that pass less the engine's host work per step "
        "and sequence, which the bare decoder does not do, in %; `gpu`: its GPU work alone (linear layers, attention, "
        "LM head), in %. Every pass is a row of points.csv; one figure per profile.\n\n"
        + markdown_table(table, index=False)
    )


def _read_optional(path: Path) -> pd.DataFrame | None:
    return pd.read_parquet(path) if path.exists() else None


def render(out_dir: Path, manifest: Mapping[str, Any], points: pd.DataFrame) -> list[Path]:
    """Draw an experiment's figures and write its summary.md (dispatching on the experiment kind)."""
    if manifest.get("kind") == "calibration":
        return render_calibration(out_dir, manifest, points)
    exp = _exp(manifest)
    requests = _read_optional(out_dir / "requests.parquet")
    steps = _read_optional(out_dir / "steps.parquet")
    rounds = _read_optional(out_dir / "rounds.parquet")
    banner = datasources.banner(manifest.get("data") or [], manifest.get("command_line") or [])
    shown = panels.shown_systems(points["system"] if "system" in points.columns else (), CONF_DIR)
    entries = [e for c in exp.case_list() for e in c.systems]
    shown.names.update({e.label: e.display_name for e in entries if e.display_name})
    shown.variants.update(e.label for e in entries if e.variant)
    labels = points["system"] if "system" in points.columns else ()
    shown.own = panels.own_labels(exp.name or str(manifest.get("exp", "")), labels, shown.names)
    caption = str(exp.title or "").split(":")[0] if ":" in str(exp.title or "") else ""
    specs: Sequence[Mapping[str, Any]] = exp.figures or own_run_figures(points, manifest.get("grid_keys") or [])
    if is_validation(exp.name):  # a prediction drawn alone must say where the measurements it answers to are
        specs = [{**f, "title": f"{f.get('title') or f.get('y')}\n({HELD_OUT_SHORT})"} for f in specs]
    grid = manifest.get("grid_keys") or []
    claim_rows = claim_panels(specs, exp, points, grid[0] if grid else None)
    specs = [{**f, "where": {"figure": f["name"]}} if f.get("kind") == "claim" else f for f in specs]
    with panels.showing(shown):
        paths, skipped = figures.draw_figures(specs, points, out_dir, requests, steps, banner, rounds,
                                              caption=caption, claims=claim_rows)
    extra: list[str] = []
    if exp.league:
        from repro.experiments import league

        scenarios = [str(c.label) for c in exp.case_list() if c.label is not None]
        with panels.showing(shown):
            more, extra = league.render(out_dir, exp.league, exp.case_key, exp.system_labels(), scenarios, points,
                                        markdown_table, banner)
        paths = [*paths, *more]
    return [*paths, write_summary(out_dir, manifest, points, skipped, shown, extra)]


def redraw(results_dir: Path) -> list[Path]:
    """Re-render ``results_dir`` from its points.csv and manifest.json."""
    for name in ("points.csv", "manifest.json"):
        if not (results_dir / name).exists():
            raise ReproError(
                f"{results_dir / name}: not found (is {results_dir} an experiment's results folder?)"
            )
    manifest = json.loads((results_dir / "manifest.json").read_text())
    return render(results_dir, manifest, pd.read_csv(results_dir / "points.csv"))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m repro.render DIR [DIR ...]``: redraw each results folder."""
    parser = argparse.ArgumentParser(prog="python -m repro.render", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="results folder(s), e.g. results/adaserve_fig4")
    args = parser.parse_args(argv)
    try:
        for d in args.results:
            paths = redraw(d)
            print(f"{d}: redrew {len(paths)} files")
    except ReproError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
