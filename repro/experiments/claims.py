"""Paper claims next to the reproduced values (the "Paper claims" table of summary.md).

An ``exp.claims`` entry is a map::

    {text: "AdaServe attains up to 4.3x the SLO attainment of the best baseline", paper: 4.3,
     kind: ratio_to_best_baseline, metric: slo_attainment, system: adaserve, x: rps, reduce: max,
     check: ">=", target: 2.0}

Common keys: ``text`` (the claim, quoted or paraphrased), ``paper`` (the paper's value: a number or text such as
"4.3x"), ``kind`` (below), ``metric`` (a points.csv column), ``system`` (a label), ``where`` (``{column: value}``
filters), ``x`` (the swept column the claim ranges over; default the experiment's first grid key), ``reduce`` (how
values over x become one: ``max`` | ``min`` | ``mean`` | ``first`` (lowest x) | ``last`` (highest x)),
``lower_is_better`` (for "best" baseline: latency metrics), ``baselines`` (labels to compare against; default all
other systems), ``baseline`` (one label).

``note`` records, beside the verdict, where the paper's own numbers contradict each other or its text and its
authors' code disagree (summary.md shows it), so that a "differs" is not read as the suite's fault alone.

Values are means over seeds (and over any grid key neither filtered by ``where`` nor used as ``x``).

Kinds (each returns one number):
    value_at                 the system's metric (reduced over x)
    max_over / min_over      max / min of the system's metric over x
    argmax / argmin          the x at which the system's metric is largest / smallest
    ratio                    system / baseline at each x, reduced (default max)
    ratio_to_best_baseline   system / best other system at each x, reduced (default max)
    diff                     system − baseline at each x, reduced (default max)
    diff_to_best_baseline    system − best other system at each x, reduced (default max)

Verdict: ``check`` compares the reproduced value with ``target`` (default: ``paper`` when numeric, else the first
number in it): ``approx`` (default; |reproduced − target| ≤ max(rel_tol·|target|, abs_tol), rel_tol 0.25, abs_tol 0),
or ``>=``, ``>``, ``<=``, ``<``. The verdict is ``holds``, ``differs``, or ``n/a`` when the value could not be
computed (e.g. a quick run without the system).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from repro.core.errors import ConfigError

CLAIM_KEYS = {
    "text", "paper", "kind", "metric", "system", "where", "x", "reduce", "lower_is_better", "baselines",
    "baseline", "check", "target", "rel_tol", "abs_tol", "note",
}  # fmt: skip
_NAN = float("nan")
_FAMILY = "_family"  # set by evaluate(): the claim's system and its readings (exp.claims_also_for), never baselines


def _filtered(df: pd.DataFrame, where: Mapping[str, Any] | None) -> pd.DataFrame:
    for key, value in (where or {}).items():
        if key not in df.columns:
            raise ConfigError(f"exp.claims: where key '{key}' is not a points.csv column")
        df = df[df[key].isin(value if isinstance(value, list | tuple) else [value])]
    return df


def series(df: pd.DataFrame, spec: Mapping[str, Any], system: str) -> pd.Series:
    """The system's metric per x (mean over seeds and other keys), sorted by x; a length-1 series
    without x."""
    rows = _filtered(df, spec.get("where"))
    rows = rows[rows["system"].astype(str) == str(system)]
    x = spec.get("x")
    if x is None:
        return pd.Series([rows[spec["metric"]].mean()] if len(rows) else [], dtype=float)
    return rows.groupby(x, sort=True)[spec["metric"]].mean()


def _reduce(values: pd.Series, how: str) -> float:
    values = values.dropna()
    if values.empty:
        return _NAN
    reducers: dict[str, Callable[[pd.Series], Any]] = {
        "max": pd.Series.max,
        "min": pd.Series.min,
        "mean": pd.Series.mean,
        "first": lambda s: s.iloc[0],
        "last": lambda s: s.iloc[-1],
    }
    if how not in reducers:
        raise ConfigError(f"exp.claims: reduce must be one of {sorted(reducers)}, got '{how}'")
    return float(reducers[how](values))


def _others(df: pd.DataFrame, spec: Mapping[str, Any]) -> list[str]:
    if spec.get("baseline") is not None:
        return [str(spec["baseline"])]
    if spec.get("baselines"):
        return [str(b) for b in spec["baselines"]]
    family = {str(spec["system"]), *(str(s) for s in spec.get(_FAMILY) or ())}  # its readings are not baselines
    return [str(s) for s in pd.unique(df["system"].astype(str)) if s not in family]


def _best_other(df: pd.DataFrame, spec: Mapping[str, Any]) -> pd.Series:
    """Per x, the best baseline's metric (max, or min with ``lower_is_better``); empty when none ran (a run
    narrowed to one system)."""
    others = _others(df, spec)
    if not others:
        return pd.Series(dtype=float)
    table = pd.concat({b: series(df, spec, b) for b in others}, axis=1)
    if table.empty:
        return pd.Series(dtype=float)
    return table.min(axis=1) if spec.get("lower_is_better") else table.max(axis=1)


def _relation(df: pd.DataFrame, spec: Mapping[str, Any], op: Callable[[Any, Any], Any], best: bool) -> float:
    mine = series(df, spec, spec["system"])
    other = _best_other(df, spec) if best else series(df, spec, _others(df, spec)[0])
    both = pd.concat([mine, other], axis=1, join="inner").dropna()
    if both.empty:
        return _NAN
    with np.errstate(divide="ignore", invalid="ignore"):
        values = op(both.iloc[:, 0], both.iloc[:, 1])
    return _reduce(values.replace([np.inf, -np.inf], np.nan), str(spec.get("reduce", "max")))


def _arg(df: pd.DataFrame, spec: Mapping[str, Any], largest: bool) -> float:
    s = series(df, spec, spec["system"]).dropna()
    if s.empty or spec.get("x") is None:
        return _NAN
    return float(s.idxmax() if largest else s.idxmin())  # type: ignore[arg-type]


#: claim kind → function (points, spec) → reproduced value.
KINDS: dict[str, Callable[[pd.DataFrame, Mapping[str, Any]], float]] = {
    "value_at": lambda df, s: _reduce(series(df, s, s["system"]), str(s.get("reduce", "mean"))),
    "max_over": lambda df, s: _reduce(series(df, s, s["system"]), "max"),
    "min_over": lambda df, s: _reduce(series(df, s, s["system"]), "min"),
    "argmax": lambda df, s: _arg(df, s, True),
    "argmin": lambda df, s: _arg(df, s, False),
    "ratio": lambda df, s: _relation(df, s, operator.truediv, best=False),
    "ratio_to_best_baseline": lambda df, s: _relation(df, s, operator.truediv, best=True),
    "diff": lambda df, s: _relation(df, s, operator.sub, best=False),
    "diff_to_best_baseline": lambda df, s: _relation(df, s, operator.sub, best=True),
}

_CHECKS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


def target_of(spec: Mapping[str, Any]) -> float:
    """The number a claim is checked against: ``target``, else ``paper`` (or the first number in its text)."""
    for key in ("target", "paper"):
        value = spec.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            m = re.search(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?", value)
            if m:
                return float(m.group())
    return _NAN


def verdict(value: float, spec: Mapping[str, Any]) -> str:
    """``holds`` / ``differs`` / ``n/a`` for a reproduced value (see the module docstring)."""
    target = target_of(spec)
    if math.isnan(value) or math.isnan(target):
        return "n/a"
    check = str(spec.get("check", "approx"))
    if check == "approx":
        tol = max(float(spec.get("rel_tol", 0.25)) * abs(target), float(spec.get("abs_tol", 0.0)))
        return "holds" if abs(value - target) <= tol else "differs"
    if check not in _CHECKS:
        raise ConfigError(f"exp.claims: check must be approx or one of {sorted(_CHECKS)}, got '{check}'")
    return "holds" if _CHECKS[check](value, target) else "differs"


def evaluate_one(points: pd.DataFrame, spec: Mapping[str, Any], default_x: str | None = None) -> float:
    """The reproduced value of one claim."""
    text = spec.get("text", "?")
    unknown = set(spec) - CLAIM_KEYS - {_FAMILY}
    if unknown:
        raise ConfigError(f"exp.claims[{text!r}]: unknown key(s) {sorted(unknown)}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"exp.claims[{text!r}]: kind must be one of {sorted(KINDS)}, got {kind!r}")
    if spec.get("metric") not in points.columns or "system" not in spec:
        raise ConfigError(f"exp.claims[{text!r}]: needs 'system' and a points.csv column as 'metric'")
    full = {"x": default_x, **spec}
    if full["x"] is not None and full["x"] not in points.columns:
        raise ConfigError(f"exp.claims[{text!r}]: x '{full['x']}' is not a points.csv column")
    return KINDS[str(kind)](points, full)


def expand(claims: Sequence[Mapping[str, Any]],
           also_for: Mapping[str, Sequence[str]] | None = None) -> list[Mapping[str, Any]]:
    """The claims as evaluated: each claim about a system of ``also_for`` (``exp.claims_also_for``), then the same
    claim for each of that system's readings, its text ending ``[reading]``; every one knows its family, so a
    system's readings are never its baselines (the paper's baselines are)."""
    out: list[Mapping[str, Any]] = []
    for spec in claims:
        system = str(spec.get("system", ""))
        readings = [str(r) for r in (also_for or {}).get(system, ())]
        if not readings:
            out.append(spec)
            continue
        family = (system, *readings)
        out.append({**spec, _FAMILY: family})
        out += [{**spec, "system": r, "text": f"{spec.get('text', '')} [{r}]", _FAMILY: family} for r in readings]
    return out


def evaluate(
    claims: Sequence[Mapping[str, Any]], points: pd.DataFrame, default_x: str | None = None,
    also_for: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """The claims table: columns ``claim, paper, reproduced, verdict`` (one row per claim, and per reading of its
    system in ``also_for``: :func:`expand`)."""
    rows = []
    for spec in expand(claims, also_for):
        value = evaluate_one(points, spec, default_x)
        rows.append({"claim": spec.get("text", ""), "paper": spec.get("paper", ""), "reproduced": value,
                     "verdict": verdict(value, spec)})  # fmt: skip
    return pd.DataFrame(rows, columns=["claim", "paper", "reproduced", "verdict"])
