"""The league's leaderboard: which policy wins where, an overall ranking, and why a policy is absent from a scenario.

An experiment with an ``exp.league`` block (``conf/exp/league.yaml``) gets, beside its figures and summary.md:

- ``who_wins.csv`` and ``who_wins.png``: per scenario (the case key) and load (``x``), the best policy by the
  ``primary`` metric, its value, the runner-up and the margin (best / runner-up - 1; for a metric where lower is
  better, runner-up / best - 1); the figure is the scenario x load map coloured by the winner.
- ``ranking.csv``: per policy, over every (scenario, load) cell it ran in, its mean rank (1 = best; ties share the
  mean of their ranks) over the ``metrics``, the number of cells it wins by the primary metric, and per metric the
  geometric mean of its value normalized to the cell's best (1.0 = always the best). Sorted by mean rank.
- ``coverage.csv``: policy x scenario, ``ran`` or the reason it cannot run there (``unavailable``).

The block::

    league:
      primary: goodput_tok_s          # the metric the map and the win counts use
      metrics: [goodput_tok_s, slo_attainment, output_throughput, mean_latency_s, p99_latency_s]
      x: load                         # the load column
      unavailable:                    # policies that cannot run, and why (where: the scenarios; default all)
        - {system: goodspeed, reason: "...", where: [...]}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repro.core.errors import ConfigError

#: points.csv columns the league can rank by: (how summary.md names it, whether higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "goodput_tok_s": ("goodput (tok/s)", True),
    "slo_attainment": ("TPOT SLO attainment", True),
    "output_throughput": ("output throughput (tok/s)", True),
    "request_throughput": ("request throughput (req/s)", True),
    "mean_latency_s": ("mean latency (s)", False),
    "p99_latency_s": ("p99 latency (s)", False),
    "mean_tpot_ms": ("mean TPOT (ms)", False),
    "p99_tpot_ms": ("p99 TPOT (ms)", False),
    "mean_ttft_ms": ("mean TTFT (ms)", False),
}
KEYS = ("primary", "metrics", "x", "saturated_from", "tie", "unavailable")
#: metrics that an arrival-bound cell cannot rank: below saturation every policy serves what arrives
THROUGHPUTS = ("output_throughput", "request_throughput")
RAN = "ran"

LIMITS = (
    "What a simulated league can and cannot say: every policy meets the same requests, acceptance draws and cost "
    "model, so the differences are the policies' own; but the cost model prices one engine profile (vLLM V1) from "
    "calibrated figures, acceptance comes from a parametric oracle per dataset and model pair (not a real draft's "
    "tokens), and each policy runs with its paper's defaults, untuned for these scenarios. A margin of a few "
    "percent is within what the open values (python -m repro robustness) move; a ranking that holds across "
    "scenarios and loads is the finding to trust."
)


@dataclass(frozen=True)
class Unavailable:
    system: str
    reason: str
    where: tuple[str, ...] = ()  # the scenarios (case labels); empty: every scenario

    def applies(self, scenario: str) -> bool:
        return not self.where or scenario in self.where


@dataclass(frozen=True)
class LeagueSpec:
    primary: str = "goodput_tok_s"
    metrics: tuple[str, ...] = ("goodput_tok_s", "slo_attainment", "output_throughput", "mean_latency_s",
                                "p99_latency_s")
    x: str = "load"
    saturated_from: float = 1.0  # throughput metrics are ranked only in cells with x at or above this
    tie: float = 0.01  # policies within this fraction of a cell's best are tied with it (the map says so)
    unavailable: tuple[Unavailable, ...] = ()

    @classmethod
    def parse(cls, raw: Any) -> LeagueSpec:
        """Read and check an ``exp.league`` block (ConfigError naming the bad key)."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"exp.league: expected a mapping of {', '.join(KEYS)}, got {raw!r}")
        unknown = sorted(str(k) for k in raw if k not in KEYS)
        if unknown:
            raise ConfigError(f"exp.league: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
        primary = str(raw.get("primary", cls.primary))
        metrics = tuple(str(m) for m in raw.get("metrics", cls.metrics))
        for m in (primary, *metrics):
            if m not in METRICS:
                raise ConfigError(f"exp.league: unknown metric {m!r} (known: {', '.join(METRICS)})")
        items = []
        for i, u in enumerate(raw.get("unavailable") or ()):
            if not isinstance(u, Mapping) or not u.get("system") or not u.get("reason"):
                raise ConfigError(f"exp.league.unavailable[{i}]: needs a system and a reason, got {u!r}")
            where = u.get("where") or ()
            items.append(Unavailable(str(u["system"]), str(u["reason"]),
                                     (str(where),) if isinstance(where, str) else tuple(str(w) for w in where)))
        return cls(primary, metrics, str(raw.get("x", cls.x)), float(raw.get("saturated_from", cls.saturated_from)),
                   float(raw.get("tie", cls.tie)), tuple(items))

    def ranks(self, metric: str, x: Any) -> bool:
        """Whether ``metric`` ranks the policies in a cell at ``x`` (not a throughput below saturation)."""
        return metric not in THROUGHPUTS or float(x) >= self.saturated_from


def better(metric: str) -> bool:
    """Whether a higher value of ``metric`` is better."""
    return METRICS[metric][1]


def _normalized(values: pd.Series, metric: str) -> pd.Series:
    """Each value over the cell's best (higher is better) or the best over it (lower is better): 1.0 = the best."""
    v = values.astype(float)
    if better(metric):
        best = v.max()
        return v / best if best > 0 else pd.Series(1.0, index=v.index)
    best = v.min()
    return best / v.where(v > 0) if best > 0 else pd.Series(1.0, index=v.index)


def winners(points: pd.DataFrame, spec: LeagueSpec, case_key: str) -> pd.DataFrame:
    """Per (scenario, load): the best system by the primary metric, its value, the runner-up and the margin."""
    rows = []
    m, up = spec.primary, better(spec.primary)
    for (scenario, x), cell in points.groupby([case_key, spec.x], sort=False):
        ranked = cell.sort_values([m, "system"], ascending=[not up, True])
        best = ranked.iloc[0]
        second = ranked.iloc[1] if len(ranked) > 1 else None
        margin = math.nan
        if second is not None:
            b, s = float(best[m]), float(second[m])
            margin = (b / s - 1.0 if s > 0 else math.inf) if up else (s / b - 1.0 if b > 0 else math.inf)
        norm = _normalized(ranked[m], m)
        tied = [str(n) for n, v in zip(ranked["system"].iloc[1:], norm.iloc[1:], strict=True) if v >= 1 - spec.tie]
        rows.append({case_key: scenario, spec.x: x, "best": best["system"], m: float(best[m]),
                     "runner_up": None if second is None else second["system"],
                     "runner_up_value": math.nan if second is None else float(second[m]), "margin": margin,
                     "tied": " ".join(tied)})
    return pd.DataFrame(rows)


def ranking(points: pd.DataFrame, spec: LeagueSpec, case_key: str, wins: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per system: cells run, wins by the primary metric (``wins``: :func:`winners` of the same points, if already
    made), mean rank over the metrics, and per metric the geometric mean of its value normalized to the cell's
    best."""
    ranks: list[pd.DataFrame] = []
    norms: list[pd.DataFrame] = []
    for (_, x), cell in points.groupby([case_key, spec.x], sort=False):
        r = pd.DataFrame({"system": cell["system"].to_numpy()})
        n = pd.DataFrame({"system": cell["system"].to_numpy()})
        for m in spec.metrics:
            ranked = spec.ranks(m, x)  # an arrival-bound cell leaves throughput out (NaN: not averaged)
            r[m] = cell[m].rank(ascending=not better(m), method="average").to_numpy() if ranked else np.nan
            n[m] = _normalized(cell[m], m).to_numpy() if ranked else np.nan
        ranks.append(r)
        norms.append(n)
    rank = pd.concat(ranks, ignore_index=True)
    norm = pd.concat(norms, ignore_index=True)
    won = (winners(points, spec, case_key) if wins is None else wins)["best"].value_counts()
    cells = rank.groupby("system", sort=False).size()
    out = pd.DataFrame({"system": cells.index, "cells": cells.to_numpy()})
    out["wins"] = [int(won.get(s, 0)) for s in out["system"]]
    # every (cell, metric) rank counts once: a metric ranked in fewer cells weighs less
    out["mean_rank"] = rank.melt(id_vars="system").groupby("system", sort=False)["value"].mean() \
        .reindex(out["system"]).to_numpy()
    for m in spec.metrics:
        logs = np.log(norm[m].clip(lower=1e-9))  # a NaN (not ranked in that cell) stays out of the mean
        out[f"{m}_vs_best"] = np.exp(logs.groupby(norm["system"], sort=False).mean()).reindex(out["system"]).to_numpy()
    return out.sort_values(["mean_rank", "system"], ignore_index=True)


def coverage(points: pd.DataFrame, systems: Sequence[str], scenarios: Sequence[str], spec: LeagueSpec,
             case_key: str) -> pd.DataFrame:
    """Policy x scenario: ``ran``, or why it cannot run there (``missing`` where neither: a gap nobody explained)."""
    ran = set(zip(points["system"].astype(str), points[case_key].astype(str), strict=True))
    names = list(dict.fromkeys([*systems, *(u.system for u in spec.unavailable)]))
    rows = []
    for s in names:
        row: dict[str, str] = {"system": s}
        for sc in scenarios:
            why = next((u.reason for u in spec.unavailable if u.system == s and u.applies(sc)), None)
            row[sc] = RAN if (s, sc) in ran else (why or "missing")
        rows.append(row)
    return pd.DataFrame(rows)


def who_wins_figure(table: pd.DataFrame, spec: LeagueSpec, case_key: str, out_dir: Path,
                    banner: str | None = None) -> list[Path]:
    """The scenario x load map: a cell one policy wins outright in that policy's colour (the suite's, as in every
    figure) with its margin; a cell where others are within the tie in pale grey, hatched, labelled as a tie."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from repro.experiments import panels

    scenarios = list(dict.fromkeys(table[case_key]))
    loads = sorted(dict.fromkeys(table[spec.x]))
    names = list(dict.fromkeys(table["best"]))
    colors = {n: panels.system_colour(str(n)) for n in names}
    shown = panels.current_shown().names
    fig, ax = plt.subplots(figsize=(1.9 * len(loads) + 3.0, 0.62 * len(scenarios) + 1.6))
    for _, row in table.iterrows():
        i, j = scenarios.index(row[case_key]), loads.index(row[spec.x])
        n_tied = len(str(row["tied"]).split()) if isinstance(row["tied"], str) and row["tied"] else 0
        best = shown.get(str(row["best"]), str(row["best"]))
        if n_tied:  # a tie is no win: no winner's colour, the best named with how many share it
            ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor="#eeeeee", edgecolor=colors[row["best"]],
                                       hatch="///", lw=0.0))
            label = f"tie: {best}\n+ {n_tied} within {spec.tie:.0%}"
        else:
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=colors[row["best"]], alpha=0.85))
            label = best + ("" if not math.isfinite(row["margin"]) else f"\n+{row['margin']:.1%}")
        ax.text(j + 0.5, i + 0.5, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, len(loads))
    ax.set_ylim(len(scenarios), 0)
    ax.set_xticks([j + 0.5 for j in range(len(loads))], [f"{x:g}" for x in loads])
    ax.set_yticks([i + 0.5 for i in range(len(scenarios))], scenarios, fontsize=8)
    ax.set_xlabel(f"{spec.x} (fraction of the scenario's capacity)")
    ax.set_title(f"The league: best by {METRICS[spec.primary][0]}, margin over the runner-up\n"
                 f"(grey, hatched: a tie, more policies within {spec.tie:.0%} of the best)", fontsize=9)
    ax.legend(handles=[Patch(color=colors[n], label=shown.get(str(n), str(n))) for n in names], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    if banner:
        panels.stamp(fig, banner)
    paths = panels.save(fig, out_dir, "who_wins")
    plt.close(fig)
    return paths


def findings(wins: pd.DataFrame, rank: pd.DataFrame, spec: LeagueSpec, case_key: str) -> list[str]:
    """What the tables show, in sentences computed from them."""
    out = []
    counts = wins["best"].value_counts()
    total = len(wins)
    lead = ", ".join(f"`{s}` {n}" for s, n in counts.items())
    out.append(f"Best by {METRICS[spec.primary][0]} in the {total} scenario x load cells: {lead}.")
    tied = int((wins["tied"].fillna("") != "").sum())
    if tied:
        out.append(f"In {tied} of the {total} cells at least one more policy is within {spec.tie:.0%} of the best: "
                   "there the winner is a tie, not a finding (the cell's `tied` column lists them).")
    for x, part in wins.groupby(spec.x, sort=True):
        c = part["best"].value_counts()
        out.append(f"At {spec.x} {x:g}: `{c.index[0]}` wins {c.iloc[0]} of {len(part)} scenarios"
                   + (f" (then {', '.join(f'`{s}` {n}' for s, n in c.iloc[1:].items())})" if len(c) > 1 else "")
                   + f"; median margin {part['margin'].median():.1%}.")
    top = rank.iloc[0]
    out.append(f"Overall, `{top['system']}` has the best mean rank ({top['mean_rank']:.2f} over "
               f"{len(spec.metrics)} metrics and {int(top['cells'])} cells); `{rank.iloc[-1]['system']}` the worst "
               f"({rank.iloc[-1]['mean_rank']:.2f}).")
    return out


def render(out_dir: Path, raw: Mapping[str, Any], case_key: str, systems: Sequence[str], scenarios: Sequence[str],
           points: pd.DataFrame, markdown_table: Callable[..., str],
           banner: str | None = None) -> tuple[list[Path], list[str]]:
    """Write who_wins.csv/.png, ranking.csv and coverage.csv; return the paths and summary.md's sections (tables
    drawn by ``markdown_table``, :func:`repro.experiments.render.markdown_table`)."""
    spec = LeagueSpec.parse(raw)
    pts = points[points[spec.primary].notna()] if spec.primary in points.columns else points.iloc[0:0]
    if pts.empty or case_key not in pts.columns or spec.x not in pts.columns:
        return [], []
    wins = winners(pts, spec, case_key)
    rank = ranking(pts, spec, case_key, wins)
    cover = coverage(pts, systems, scenarios, spec, case_key)
    paths = []
    for name, frame in (("who_wins", wins), ("ranking", rank), ("coverage", cover)):
        path = out_dir / f"{name}.csv"
        frame.to_csv(path, index=False, float_format="%.6g")
        paths.append(path)
    paths += who_wins_figure(wins, spec, case_key, out_dir, banner)
    shown_wins = wins.assign(margin=[f"{m:+.1%}" if math.isfinite(m) else "-" for m in wins["margin"]])
    shown_rank = rank.rename(columns={f"{m}_vs_best": f"{m} / best" for m in spec.metrics})
    aggregation = (f"Ranking: in each (scenario, {spec.x}) cell every policy is ranked on each of "
                   f"{', '.join(METRICS[m][0] for m in spec.metrics)} (1 = best, ties averaged); `mean_rank` is the "
                   f"mean over every ranked (cell, metric) pair, throughput ranked only at {spec.x} >= "
                   f"{spec.saturated_from:g} (below, every policy serves what arrives); `wins` counts the cells "
                   f"it is best in by {METRICS[spec.primary][0]}, and `<metric> / best` is the geometric mean over "
                   "cells of its value normalized to the cell's best (lower-is-better metrics inverted: 1.0 = always "
                   "the best).")
    sections = [
        "## What it shows\n", "".join(f"- {line}\n" for line in findings(wins, rank, spec, case_key)),
        "## Who wins where\n", "![who wins](who_wins.png)\n", markdown_table(shown_wins, index=False),
        "## Overall ranking\n", aggregation + "\n", markdown_table(shown_rank, index=False),
        "## Where each policy runs\n",
        "`ran`: it has points in that scenario; otherwise the reason it cannot run there.\n",
        markdown_table(cover, index=False), "## Limits of a simulated comparison\n", LIMITS + "\n",
    ]
    return paths, sections
