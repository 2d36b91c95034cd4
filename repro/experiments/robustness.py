"""Does a paper claim hold, or only at the setting the suite picked? ``python -m repro robustness NAME``.

The experiment's open choices (``exp.open``, :mod:`repro.experiments.openchoices`) are varied over their declared
ranges; at each setting the whole experiment runs again with the same seeds (common random numbers: only the
setting differs), and every paper claim is evaluated with the functions ``summary.md`` uses
(:func:`repro.experiments.claims.evaluate`).

Settings
    the chosen one; one-at-a-time scans from it (each knob over its levels, the others at their chosen values); and
    a joint design over all knobs: the full factorial where every knob is a set and the product is at most
    ``--samples``, else a Latin hypercube of ``--samples`` settings (seeded by ``--seed``).
Outputs (``runs/robustness/NAME/``, or ``--out``)
    ``robustness.csv``: one row per claim × setting (the setting's values, the claim's value, held or not);
    ``robustness.md``: per claim the share of settings where it holds, its class (*holds robustly*: ≥ 90 %;
    *depends on the setting*, with the deciding knob and the values where it holds; *differs everywhere
    plausible*: 0 %), the knob with the largest effect; the pairs of claims that never hold together; the knobs;
    ``robustness.png``: claims × settings, held or not, the settings ordered by the knob that decides most claims.
    Each setting's own run is kept under ``settings/`` (a stopped study resumes from them with ``--resume``).

The points run on the experiment's launcher (``launcher=local|ray|submitit`` among the extra overrides).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repro.core.errors import ConfigError
from repro.experiments.compose import compose_config, hydra_context, to_dict
from repro.experiments.expspec import ExpSpec, apply_quick
from repro.experiments.openchoices import OpenChoice, show
from repro.experiments.results import atomic_write_text, display_path
from repro.experiments.studies import (
    DEPENDS,
    FULL_SAMPLES,
    NOWHERE,
    QUICK_SAMPLES,
    ROBUST,
    ROBUST_SHARE,
    class_counts,
)


@dataclass(frozen=True)
class Setting:
    """One setting of the open choices: ``kind`` chosen | oat | factorial | lhs, and every knob's value."""

    id: str
    kind: str
    values: Mapping[str, Any]


def design(choices: Sequence[OpenChoice], samples: int, seed: int, levels: int = 3) -> list[Setting]:
    """The chosen setting, the one-at-a-time scans, then the joint design (see the module docstring); no setting
    twice."""
    chosen = {c.name: c.value for c in choices}
    out: list[tuple[str, dict[str, Any]]] = [("chosen", chosen)]
    for c in choices:
        out += [("oat", {**chosen, c.name: v}) for v in c.levels(levels) if v != c.value]
    discrete = all(c.values is not None for c in choices)
    if discrete and math.prod(len(c.values or ()) for c in choices) <= samples:
        out += [("factorial", dict(zip(chosen, combo, strict=True)))
                for combo in itertools.product(*(c.values or () for c in choices))]
    elif choices and samples > 0:
        rng = np.random.default_rng(seed)
        strata = [rng.permutation(samples) for _ in choices]
        for i in range(samples):
            out.append(("lhs", {c.name: c.at((float(s[i]) + rng.random()) / samples)
                                for c, s in zip(choices, strata, strict=True)}))
    seen: set[str] = set()
    settings: list[Setting] = []
    for kind, values in out:
        key = json.dumps(values, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            settings.append(Setting(f"s{len(settings):03d}", kind, values))
    return settings


def escaped(value: Any) -> Any:
    """``value`` (a resolved exp block) with each ``${`` escaped again: the experiment's escaped interpolations, which
    resolving turned into plain text, resolve in each point's config once the block is put back into one."""
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, Mapping):
        return {k: escaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escaped(v) for v in value]
    return value


def apply_setting(exp: Mapping[str, Any], choices: Sequence[OpenChoice],
                  values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(exp, overrides)`` running the experiment at ``values``: a knob of every point becomes a command-line
    override; a knob scoped to ``systems`` joins those entries' ``overrides`` in ``exp.systems``, every case's
    ``systems`` and their quick versions. A system's parameter (``system.*``) declared for every point is scoped
    to every system the experiment runs (the command line's own config has the default system, which may lack it)."""
    out_exp: dict[str, Any] = copy.deepcopy(dict(exp))
    overrides: list[str] = []
    scoped: dict[str, dict[str, Any]] = {}
    every = ExpSpec.parse(exp).system_labels() if any(
        not c.systems and c.key.startswith("system.") for c in choices) else []
    for c in choices:
        v = values[c.name]
        systems = c.systems or (tuple(every) if c.key.startswith("system.") else ())
        if systems:
            for label in systems:
                scoped.setdefault(label, {})[c.key] = v
        else:
            overrides.append(f"{c.key}={_text(v)}")
    if scoped:
        def entries(block: Any) -> Any:
            if not isinstance(block, list):
                return block
            out = []
            for e in block:
                entry: dict[str, Any] = {"system": e} if isinstance(e, str) else dict(e)
                label = str(entry.get("label") or entry.get("system"))
                if label in scoped:
                    entry["overrides"] = {**dict(entry.get("overrides") or {}), **scoped[label]}
                out.append(entry)
            return out

        holders: list[dict[str, Any]] = [out_exp, out_exp.get("quick") or {}]
        for holder in holders:
            if "systems" in holder:
                holder["systems"] = entries(holder["systems"])
            for case in holder.get("cases") or []:
                if isinstance(case, dict) and "systems" in case:
                    case["systems"] = entries(case["systems"])
    return out_exp, overrides


def _text(v: Any) -> str:
    """A value as a command-line override writes it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return repr(v)
    return str(v)


# ------------------------------------------------------------------------------------------------- analysis


@dataclass(frozen=True)
class ClaimRobustness:
    """One claim over the settings."""

    claim: str
    chosen: str  # the chosen setting's verdict
    share: float  # of the settings where it could be computed, the share where it holds (NaN: none)
    klass: str
    knob: str  # the knob whose values explain the most of whether it holds (else: move its value most); "" if none
    effect: float  # the share of the variance of held-or-not its values explain (the correlation ratio, 0-1)
    where: str  # for "depends": the knob's values where it holds in at least half the settings


def classify(share: float) -> str:
    if math.isnan(share):
        return "n/a"
    return ROBUST if share >= ROBUST_SHARE else NOWHERE if share == 0 else DEPENDS


def _level_of(choice: OpenChoice, v: Any) -> Any:
    """A setting's value as a level of its knob: a set's value itself; a range's nearest third (low | mid | high)."""
    if choice.values is not None or choice.range is None:
        return v
    lo, hi = choice.range
    u = (math.log(v / lo) / math.log(hi / lo)) if choice.scale == "log" else (float(v) - lo) / (hi - lo)
    return ("low", "mid", "high")[min(int(u * 3), 2)]


def analyse(table: pd.DataFrame, choices: Sequence[OpenChoice]) -> list[ClaimRobustness]:
    """Per claim of ``table`` (robustness.csv's rows): share held, class, deciding knob and where it holds."""
    out = []
    for claim, rows in table.groupby("claim", sort=False):
        chosen = rows[rows["kind"] == "chosen"]["verdict"]
        known = rows[rows["verdict"].isin(["holds", "differs"])]
        held = known["verdict"] == "holds"
        share = float(held.mean()) if len(known) else float("nan")
        best, effect, where = "", 0.0, ""
        flags = held.astype(float)
        p = float(flags.mean()) if len(flags) else float("nan")
        for c in choices:
            if len(known) == 0 or not 0.0 < p < 1.0:
                break
            level = known[c.name].map(lambda v, c=c: show(_level_of(c, v)))
            groups = flags.groupby(level, sort=False)
            by = groups.mean()
            # the correlation ratio: the share of the variance of held-or-not that the knob's values explain (a
            # value seen once explains little, where a spread of shares would make it decisive)
            eta = float((groups.size() * (by - p) ** 2).sum() / (len(flags) * p * (1.0 - p)))
            if eta > effect + 1e-12:
                best, effect = c.name, eta
                where = ", ".join(str(k) for k, v in by.items() if v >= 0.5)
                if not where:  # nowhere in half the settings: its best value, with its share
                    where = f"{by.idxmax()} ({by.max():.0%})"
        if not best and len(known):  # whether it holds never moves: name the knob that moves its value most
            values = pd.to_numeric(known["value"], errors="coerce")
            spreads = {}
            for c in choices:
                means = values.groupby(known[c.name].map(lambda v, c=c: show(_level_of(c, v)))).mean()
                spreads[c.name] = float(means.max() - means.min()) if len(means) else float("nan")
            spreads = {k: v for k, v in spreads.items() if math.isfinite(v)}
            if spreads:
                best = max(spreads, key=lambda k: spreads[k])
        out.append(ClaimRobustness(str(claim), str(chosen.iloc[0]) if len(chosen) else "n/a", share, classify(share),
                                   best, effect, where))
    return out


def conflicts(table: pd.DataFrame) -> list[tuple[str, str]]:
    """Pairs of claims that each hold somewhere but never in the same setting (where both are computable)."""
    held = table.pivot_table(index="setting", columns="claim", values="held", aggfunc="first", sort=False)
    known = table.assign(k=table["verdict"].isin(["holds", "differs"])).pivot_table(
        index="setting", columns="claim", values="k", aggfunc="first", sort=False)
    names = [c for c in held.columns if bool(held[c].fillna(False).astype(bool).any())]
    out = []
    for a, b in itertools.combinations(names, 2):
        both = known[a].fillna(False).astype(bool) & known[b].fillna(False).astype(bool)
        if both.any() and not (held[a].astype(bool) & held[b].astype(bool) & both).any():
            out.append((a, b))
    return out


# ------------------------------------------------------------------------------------------------- running


def run(name: str, *, quick: bool, samples: int, seed: int, out_dir: Path | None = None,
        extra: Sequence[str] = (), resume: bool = False, n_jobs: int | None = None,
        only: Sequence[str] = (), settings_dir: Path | None = None,
        say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> Path:
    """Run experiment ``name`` over its open choices (``only`` these knobs, if given; the others at their chosen
    values); write robustness.csv, .md and .png; return the folder."""
    from repro.experiments import claims as claims_mod
    from repro.experiments import runner

    t0 = time.perf_counter()
    base = [f"+exp={name}", *(["quick=true"] if quick else []), *extra, *([f"n_jobs={n_jobs}"] if n_jobs else [])]
    with hydra_context():
        cfg = compose_config(base)
    raw = to_dict(cfg.exp)
    spec = ExpSpec.parse(raw)
    if not spec.open:
        raise ConfigError(f"experiment {name} declares no open choices (exp.open): nothing to vary")
    if not spec.claims:
        raise ConfigError(f"experiment {name} states no paper claims (exp.claims): nothing to test over its open "
                          "choices")
    # a knob the quick grid sets itself (exp.quick: num_requests: 200) stays at the quick value in a quick study:
    # varying it would run the full-size workload the quick grid exists to avoid
    run_exp, quick_values = apply_quick(raw, quick)
    held = {c.name: quick_values[c.key] for c in spec.open if c.key in quick_values}
    if held:
        say(f"robustness {name}: {', '.join(sorted(held))} held at the quick grid's value (exp.quick sets it)")
    unknown = sorted(set(only) - {c.name for c in spec.open})
    if unknown:
        raise ConfigError(f"robustness {name}: unknown knob(s) {', '.join(unknown)} (exp.open has "
                          f"{', '.join(c.name for c in spec.open)})")
    varied = [c for c in spec.open if (not only or c.name in only) and c.name not in held]
    fixed = {c.name: held.get(c.name, c.value) for c in spec.open if c not in varied}
    choices = spec.open
    settings = [Setting(s.id, s.kind, {**fixed, **s.values}) for s in design(varied, samples, seed)]
    out = Path(out_dir or Path("runs") / ("quick" if quick else "") / "robustness" / name)
    out.mkdir(parents=True, exist_ok=True)
    say(f"robustness {name}: {len(choices)} open choices ({', '.join(c.name for c in choices)}), "
        f"{len(settings)} settings ({_kinds(settings)}), same seeds -> {display_path(out)}")
    run_spec = ExpSpec.parse(run_exp)
    grid = run_spec.grid_columns()
    rows: list[dict[str, Any]] = []
    memo: dict[tuple[str, str], dict[str, str]] = {}  # a point a setting leaves unchanged runs once per study
    ran = total = 0
    for i, s in enumerate(settings):
        exp, overrides = apply_setting(raw, choices, s.values)
        folder = (settings_dir or out / "settings") / s.id
        points_csv = folder / "points.csv"
        written = {k: _text(v) for k, v in s.values.items()}  # setting.json: what a resumed study checks
        if resume and points_csv.is_file() and (folder / "setting.json").is_file() and json.loads(
                (folder / "setting.json").read_text()) == written:
            points = pd.read_csv(points_csv)
        else:
            with hydra_context():
                scfg = compose_config([*base, *overrides])
            scfg.exp = escaped(exp)
            res = runner.run_experiment(scfg, [*base, *overrides], out_dir=folder, overwrite=True, render=False,
                                        log=lambda line: None, progress=lambda: None, memo=memo)
            points = res.points
            ran, total = ran + res.num_run, total + len(points)
            atomic_write_text(folder / "setting.json", json.dumps(written) + "\n")
        table = claims_mod.evaluate(run_spec.claims, points, grid[0] if grid else None, run_spec.claims_also_for)
        for r in table.itertuples(index=False):
            rows.append({"setting": s.id, "kind": s.kind, **{c.name: s.values[c.name] for c in choices},
                         "claim": r.claim, "value": r.reproduced, "verdict": r.verdict,
                         "held": r.verdict == "holds"})
        say(f"robustness {name}: setting {i + 1}/{len(settings)} ({s.kind}: "
            f"{', '.join(f'{k}={_text(v)}' for k, v in s.values.items())}) "
            f"{int((table['verdict'] == 'holds').sum())}/{len(table)} claims hold")
    if total:
        say(f"robustness {name}: {ran} of {total} points run, {total - ran} shared with an earlier setting")
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "robustness.csv", index=False)
    # the wall time as robustness.json keeps it (to 0.1 s), so that a redraw writes the same robustness.md
    return write_study(out, name, spec, choices, [c.name for c in varied], settings, frame, quick, samples, seed,
                       round(time.perf_counter() - t0, 1), say)


def write_study(out: Path, name: str, spec: ExpSpec, choices: Sequence[OpenChoice], varied: Sequence[str],
                settings: Sequence[Setting], frame: pd.DataFrame, quick: bool, samples: int, seed: int,
                wall_s: float, say: Callable[[str], None]) -> Path:
    """robustness.md, .json and .png of a study from its rows (robustness.csv's); returns ``out``."""
    result = analyse(frame, choices)
    pairs = conflicts(frame)
    atomic_write_text(out / "robustness.md", markdown(name, spec, choices, settings, result, pairs, wall_s, quick))
    draw(frame, result, choices, out / "robustness.png")
    study = {"experiment": name, "quick": quick, "settings": len(settings), "samples": samples, "seed": seed,
             "wall_s": round(wall_s, 1), "knobs": [c.name for c in choices], "varied": list(varied),
             "claims": {r.claim: {"class": r.klass, "share": None if math.isnan(r.share) else round(r.share, 4),
                                  "chosen": r.chosen, "knob": r.knob, "effect": round(r.effect, 4),
                                  "where": r.where} for r in result},
             "conflicts": [list(p) for p in pairs]}
    atomic_write_text(out / "robustness.json", json.dumps(study, indent=1, ensure_ascii=False) + "\n")
    counts = class_counts(study)
    say(f"robustness {name}: {len(result)} claims over {len(settings)} settings in {wall_s:.0f} s: "
        f"{counts[ROBUST]} hold robustly, {counts[DEPENDS]} depend on the setting, {counts[NOWHERE]} differ "
        f"everywhere plausible; {len(pairs)} pairs never hold together -> {display_path(out / 'robustness.md')}")
    return out


def redraw(folder: Path, name: str | None = None,
           say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> Path:
    """Rewrite a study's robustness.md, .json and .png from its robustness.csv and robustness.json (the analysis
    again, nothing re-run), with the experiment's current declarations."""
    meta = json.loads((folder / "robustness.json").read_text())
    name = name or str(meta["experiment"])
    frame = pd.read_csv(folder / "robustness.csv", keep_default_na=False, na_values=[""])
    with hydra_context():
        spec = ExpSpec.parse(to_dict(compose_config([f"+exp={name}"]).exp))
    frame = rejudged(frame, spec)
    frame.to_csv(folder / "robustness.csv", index=False)
    choices = spec.open
    first = frame.drop_duplicates("setting")
    settings = [Setting(str(r["setting"]), str(r["kind"]), {c.name: _value(r[c.name]) for c in choices})
                for _, r in first.iterrows()]
    for c in choices:
        frame[c.name] = frame[c.name].map(_value)
    return write_study(folder, name, spec, choices, list(meta.get("varied") or [c.name for c in choices]), settings,
                       frame, bool(meta.get("quick")), int(meta.get("samples", 0)), int(meta.get("seed", 0)),
                       float(meta.get("wall_s", _md_wall_s(folder))), say)


def rejudged(frame: pd.DataFrame, spec: ExpSpec) -> pd.DataFrame:
    """A study's rows with each stored value judged again by its claim as the experiment declares it now (the
    verdict rule or a tolerance changed; nothing re-run); rows of a claim no longer declared are dropped."""
    from repro.experiments import claims as claims_mod

    by_text = {str(c.get("text", "")): c for c in claims_mod.expand(spec.claims, spec.claims_also_for)}
    frame = frame[frame["claim"].astype(str).isin(by_text)].copy()
    values = pd.to_numeric(frame["value"], errors="coerce")
    frame["verdict"] = [claims_mod.verdict(float(v), by_text[str(c)]) for c, v in zip(frame["claim"], values,
                                                                                      strict=True)]
    frame["held"] = frame["verdict"] == "holds"
    return frame


def _md_wall_s(folder: Path) -> float:
    """The wall time an older robustness.md states (its robustness.json predates the field)."""
    import re

    path = folder / "robustness.md"
    m = re.search(r"seeds, in (\d+) s\.", path.read_text()) if path.is_file() else None
    return float(m.group(1)) if m else 0.0


def _value(v: Any) -> Any:
    """A value as robustness.csv gave it back: null for an empty cell, numbers as numbers."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return {"True": True, "False": False}.get(v, v)
        return int(f) if f.is_integer() and "." not in v else f
    if isinstance(v, float) and v.is_integer():
        return v
    return v


def _kinds(settings: Sequence[Setting]) -> str:
    counts: dict[str, int] = {}
    for s in settings:
        counts[s.kind] = counts.get(s.kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in counts.items())


def markdown(name: str, spec: ExpSpec, choices: Sequence[OpenChoice], settings: Sequence[Setting],
             result: Sequence[ClaimRobustness], pairs: Sequence[tuple[str, str]], wall_s: float, quick: bool) -> str:
    """robustness.md."""
    lines = [f"# Robustness: {name}{' (quick)' if quick else ''}", "",
             f"{spec.title}", "",
             f"The experiment ran at {len(settings)} settings of its {len(choices)} open choices ({_kinds(settings)}), "
             f"every one with the same seeds, in {wall_s:.0f} s. A claim *holds robustly* where it holds in at least "
             f"{ROBUST_SHARE:.0%} of the settings where it can be computed, *differs everywhere plausible* where it "
             "holds in none, and otherwise *depends on the setting*: the deciding knob is the one whose values explain "
             "the most of whether it holds (the correlation ratio: the share of the variance of held-or-not between "
             "the knob's values; a range's values in thirds: low, mid, high), listed with the values where it holds "
             "in at least half the settings (else its best value, with its share).", "",
             "| claim | chosen setting | held in | class | deciding knob | holds at |",
             "|---|---|---|---|---|---|"]
    for r in result:
        share = "-" if math.isnan(r.share) else f"{r.share:.0%}"
        knob = f"{r.knob} ({r.effect:.0%})" if r.knob and r.effect else (f"{r.knob} (value only)" if r.knob else "-")
        lines.append(f"| {_cell(r.claim)} | {r.chosen} | {share} | {r.klass} | {knob} | "
                     f"{r.where if r.klass == DEPENDS else '-'} |")
    lines += ["", "The deciding knob's figure is the share of the variance it explains; \"value only\": whether the "
              "claim holds never moves, and the knob named moves its value the most.", "",
              "## Claims that never hold together", ""]
    lines += [f"- {_cell(a)} **and** {_cell(b)}" for a, b in pairs] or ["None: every pair of claims that holds "
                                                                         "somewhere holds together somewhere."]
    lines += ["", "## Open choices", "", "| knob | key | systems | chosen in | why |", "|---|---|---|---|---|"]
    lines += [f"| {c.name} | `{c.key}` | {', '.join(c.systems) or 'all'} | {c.describe()} | {_cell(c.why)} |"
              for c in choices]
    lines += ["", "`robustness.csv` has every claim's value at every setting; `robustness.png` draws which hold.", ""]
    return "\n".join(lines)


def declarations(name: str, out: Path) -> Path:
    """robustness.md of an experiment that declares open choices but states no paper claim (a figure with nothing to
    test, like laps_fig3): its open choices, and that no setting is run; returns its path."""
    with hydra_context():
        spec = ExpSpec.parse(to_dict(compose_config([f"+exp={name}"]).exp))
    lines = [f"# Robustness: {name}", "", f"{spec.title}", "",
             "This experiment states no paper claim (`exp.claims`), so no setting is run: there is nothing to hold "
             "or differ. Its open choices, for whoever reads its figure:", "",
             "| knob | key | systems | chosen in | why |", "|---|---|---|---|---|",
             *(f"| {c.name} | `{c.key}` | {', '.join(c.systems) or 'all'} | {c.describe()} | {_cell(c.why)} |"
               for c in spec.open), ""]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "robustness.md", "\n".join(lines))
    return out / "robustness.md"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def draw(frame: pd.DataFrame, result: Sequence[ClaimRobustness], choices: Sequence[OpenChoice], path: Path) -> None:
    """Claims × settings, held (green) or not (red; grey: not computable), the settings ordered by the knob that
    decides most claims, then the others."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    decisive: dict[str, int] = {}
    for r in result:
        if r.knob:
            decisive[r.knob] = decisive.get(r.knob, 0) + 1
    order = sorted((c.name for c in choices), key=lambda k: -decisive.get(k, 0))
    settings = frame.drop_duplicates("setting").set_index("setting")
    keyed = settings[order].apply(lambda col: col.map(lambda v: (str(type(v)), v)))
    ids = sorted(settings.index, key=lambda s: tuple(keyed.loc[s]))
    claims = [r.claim for r in result]
    code = {"holds": 1.0, "differs": 0.0}
    grid = np.full((len(claims), len(ids)), np.nan)
    at = {(str(r.claim), str(r.setting)): code.get(str(r.verdict), np.nan) for r in frame.itertuples(index=False)}
    for i, c in enumerate(claims):
        for j, s in enumerate(ids):
            grid[i, j] = at.get((c, s), np.nan)
    fig, ax = plt.subplots(figsize=(max(6, 0.18 * len(ids) + 4), max(2.5, 0.32 * len(claims) + 1.5)))
    cmap = matplotlib.colors.ListedColormap(["#d9534f", "#5cb85c"]).with_extremes(bad="#cccccc")
    ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
    ax.set_yticks(range(len(claims)), [c[:70] + ("…" if len(c) > 70 else "") for c in claims], fontsize=7)
    head = order[0] if order else ""
    ax.set_xticks(range(len(ids)), [f"{settings.loc[s, head]}" if head else s for s in ids], rotation=90, fontsize=6)
    ax.set_xlabel(f"settings, ordered by {', '.join(order[:3])}" + (" ..." if len(order) > 3 else ""))
    ax.set_title("claims held (green) or not (red) at each setting of the open choices", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str]) -> int:
    """``python -m repro robustness NAME [--quick] [--samples N] [--seed S] [--out DIR] [--resume] [key=value ...]``"""
    ap = argparse.ArgumentParser(prog="python -m repro robustness", description=__doc__.splitlines()[0])
    ap.add_argument("name", help="the experiment (conf/exp/NAME.yaml), which declares exp.open")
    ap.add_argument("--quick", action="store_true", help="its quick grid")
    ap.add_argument("--samples", type=int, default=None,
                    help="settings of the joint design (default 8 quick, 24 full)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the space-filling design (not the runs)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default runs/[quick/]robustness/NAME)")
    ap.add_argument("--resume", action="store_true", help="reuse the settings a stopped study finished")
    ap.add_argument("--jobs", type=int, default=None, help="parallel points (default: every core)")
    ap.add_argument("--only", default="", help="vary these knobs only (comma-separated; the others stay chosen)")
    ap.add_argument("--redraw", type=Path, default=None, metavar="DIR",
                    help="rewrite DIR's robustness.md/.json/.png from its robustness.csv (nothing re-run)")
    args, extra = ap.parse_known_args(list(argv))
    bad = [a for a in extra if "=" not in a]
    if bad:
        raise ConfigError(f"robustness: unknown argument {bad[0]!r} (extra arguments are key=value overrides)")
    if args.redraw:
        redraw(args.redraw, args.name)
        return 0
    samples = args.samples if args.samples is not None else (QUICK_SAMPLES if args.quick else FULL_SAMPLES)
    run(args.name, quick=args.quick, samples=samples, seed=args.seed, out_dir=args.out, extra=extra,
        resume=args.resume, n_jobs=args.jobs, only=[k for k in args.only.split(",") if k])
    return 0
