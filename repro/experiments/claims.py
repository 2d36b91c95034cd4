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

Verdict (:func:`judge`): ``check`` compares the reproduced value with ``target`` (default: ``paper`` when numeric,
else the first number in it). ``approx`` (the default) holds when |reproduced − target| ≤ the claim's tolerance: what
it sets (``abs_tol`` alone: ± that; ``rel_tol`` alone: that share of |target|; both: the wider), else
:data:`DEFAULT_REL_TOL` of |target| or half a unit in the last digit the paper prints, the wider (:data:`READINGS`).
``>=``, ``>``, ``<=``, ``<`` compare with the target as they say. The verdict is ``holds``, ``differs``, ``n/a``
when the value could not be computed (e.g. a quick run without the system), or ``calibrated`` for a claim whose
value is an input of the model or was fitted to the paper (``calibrated``: the reason): it is shown, never counted.

Each row also carries the test as it ran (:attr:`Judgement.test`: "0.9926 ≥ 0.99: the paper's 1 with 1 % slack"),
the direction ("as the paper", "stronger"/"weaker" where the claim has a sense: ``stronger: higher | lower``, else
from its check or, for a ratio or difference, from its metric; "above"/"below the paper" where it has none) and,
for a "differs", the claim's ``why``: one sentence naming the mechanism and the number.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from repro.core.errors import ConfigError

CLAIM_KEYS = {
    "text", "paper", "kind", "metric", "system", "where", "x", "reduce", "lower_is_better", "baselines",
    "baseline", "check", "target", "rel_tol", "abs_tol", "note", "why", "stronger", "calibrated",
}  # fmt: skip
#: The default tolerance of an ``approx`` claim that sets none: this share of the paper's value (or half a unit in
#: the last digit it prints, where that is wider). The papers give their numbers to two significant digits, read
#: off figures whose gridlines resolve about a tenth of the axis; the suite's cost model is held to 5-15 % of the
#: published latency tables (results/calibration). A tenth is the finest reading both support.
DEFAULT_REL_TOL = 0.10
#: How a paper's wording becomes a test (README, docs/using.md and every summary's claims header say it once).
READINGS = (
    f"\"about x\", \"≈ x\" or a bare number: within ±{DEFAULT_REL_TOL:.0%} of x (or half a unit in x's last "
    "printed digit, if wider), unless the claim states its own tolerance",
    "\"up to x\": the largest value over the sweep, read as \"about x\"",
    "\"x-y\": the midpoint ± half the range",
    "\"at least x\", \"≥ x\": at least x itself; a slack below x is the claim's own and is printed",
)
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


def _printed_half_unit(spec: Mapping[str, Any]) -> float:
    """Half a unit in the last digit the paper prints (``paper: 4.3`` → 0.05, ``"about 7"`` → 0.5); 0 when the paper
    gives no number or the claim sets its own ``target``."""
    if spec.get("target") is not None:
        return 0.0
    value = spec.get("paper")
    text = value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    m = re.search(r"[-+]?\d*\.?\d+", text) if not isinstance(value, bool) else None
    if not m or re.search(r"\d[eE][-+]?\d", text):
        return 0.0
    digits = m.group().split(".")
    return 0.5 * 10.0 ** -(len(digits[1]) if len(digits) > 1 else 0)


def tolerance(spec: Mapping[str, Any]) -> tuple[float, str]:
    """An ``approx`` claim's half-width and how it was set (for the printed test)."""
    target = target_of(spec)
    rel, ab = spec.get("rel_tol"), spec.get("abs_tol")
    if rel is None and ab is None:
        half = _printed_half_unit(spec)
        rel_w = DEFAULT_REL_TOL * abs(target)
        if half > rel_w:
            return half, "half a unit in the paper's last digit"
        return rel_w, f"the default ±{DEFAULT_REL_TOL:.0%}"
    widths = []
    if rel is not None:
        widths.append((float(rel) * abs(target), f"the claim's ±{float(rel):.0%}"))
    if ab is not None:
        widths.append((float(ab), f"the claim's ±{_num(float(ab))}"))
    return max(widths, key=lambda w: w[0])


_SYMBOL = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}
_NEGATED = {">=": "<", ">": "≤", "<=": ">", "<": "≥"}
#: metric-name fragments of a quantity where less is better (a ratio or difference of one is stronger when lower)
_LOWER_BETTER = ("latency", "tpot", "ttft", "time", "_s", "_ms", "regret", "error", "cost", "wait", "delay")


def _num(v: float) -> str:
    return f"{v:.4g}"


def sense(spec: Mapping[str, Any]) -> str | None:
    """Which way a claim gets stronger: ``higher`` or ``lower`` (``stronger``; else an inequality's own way; else,
    for a ratio or difference, lower for a metric where less is better and higher otherwise); None when the claim
    names a value with no better side (a proposal length, an argmax)."""
    if spec.get("stronger") is not None:
        way = str(spec["stronger"])
        if way not in ("higher", "lower"):
            raise ConfigError(f"exp.claims[{spec.get('text', '?')!r}].stronger: 'higher' or 'lower', got {way!r}")
        return way
    check = str(spec.get("check", "approx"))
    if check in (">=", ">"):
        return "higher"
    if check in ("<=", "<"):
        return "lower"
    if str(spec.get("kind", "")).startswith(("ratio", "diff")):
        metric = str(spec.get("metric", "")).lower()
        return "lower" if spec.get("lower_is_better") or any(f in metric for f in _LOWER_BETTER) else "higher"
    return None


@dataclass(frozen=True)
class Judgement:
    """A claim's verdict with the test that gave it and which way the value lies from the paper's."""

    verdict: str
    test: str
    direction: str


def judge(value: float, spec: Mapping[str, Any]) -> Judgement:
    """The verdict of a reproduced value, its test as text and its direction (see the module docstring)."""
    target = target_of(spec)
    check = str(spec.get("check", "approx"))
    if check != "approx" and check not in _CHECKS:
        raise ConfigError(f"exp.claims: check must be approx or one of {sorted(_CHECKS)}, got '{check}'")
    if spec.get("calibrated"):
        return Judgement("calibrated", f"calibrated, not a test: {spec['calibrated']}", "")
    if math.isnan(value) or math.isnan(target):
        return Judgement("n/a", "not computable on this grid" if math.isnan(value) else "no number to test", "")
    paper = target_of({"paper": spec.get("paper")})
    if check == "approx":
        width, how = tolerance(spec)
        ok = abs(value - target) <= width + 1e-12 * max(1.0, abs(target))
        test = (f"{_num(value)} {'within' if ok else 'outside'} {_num(target)} ± {_num(width)} "
                f"[{_num(target - width)}, {_num(target + width)}]: {how}")
    else:
        ok = bool(_CHECKS[check](value, target))
        test = f"{_num(value)} {_SYMBOL[check] if ok else _NEGATED[check]} {_num(target)}"
        if not math.isnan(paper) and paper != target:
            slack = abs(target - paper) / abs(paper) if paper else float("nan")
            test += (f": the paper's {_num(paper)} with {slack:.0%} slack" if math.isfinite(slack)
                     else f": the paper's {_num(paper)}, the claim's target")
    verdict = "holds" if ok else "differs"
    way = sense(spec)
    if ok:
        direction = "as the paper"
    elif way is None:
        direction = "above the paper" if value > target else "below the paper"
    else:
        direction = "stronger" if (value > target) == (way == "higher") else "weaker"
    return Judgement(verdict, test, direction)


def verdict(value: float, spec: Mapping[str, Any]) -> str:
    """``holds`` / ``differs`` / ``n/a`` / ``calibrated`` for a reproduced value (:func:`judge`)."""
    return judge(value, spec).verdict


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


#: The claims table's columns (:func:`evaluate`).
COLUMNS = ["claim", "paper", "reproduced", "verdict", "test", "direction", "why"]


def evaluate(
    claims: Sequence[Mapping[str, Any]], points: pd.DataFrame, default_x: str | None = None,
    also_for: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """The claims table (:data:`COLUMNS`): one row per claim, and per reading of its system in ``also_for``
    (:func:`expand`); ``why`` is the claim's sentence on a "differs" (empty otherwise)."""
    rows = []
    for spec in expand(claims, also_for):
        value = evaluate_one(points, spec, default_x)
        j = judge(value, spec)
        rows.append({"claim": spec.get("text", ""), "paper": spec.get("paper", ""), "reproduced": value,
                     "verdict": j.verdict, "test": j.test, "direction": j.direction,
                     "why": str(spec.get("why") or "") if j.verdict == "differs" else ""})  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)
