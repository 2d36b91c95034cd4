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
    change_over              the system's metric at the highest x less that at the lowest (a trend's sign and size)
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
for a "differs", the claim's ``why``: one sentence naming the mechanism and the number. The number comes from the
run, not from the config: ``why_values`` names quantities the sentence quotes as ``{name}`` (or ``{name:.1%}``),
each a claim-like map evaluated on the same points (it inherits the claim's kind, metric, system, where, x, reduce
and baselines, and overrides what it sets; a ``where`` of its own narrows the claim's)::

    why: "SpecInfer's fixed tree verifies {tokens} tokens per request at 6 req/s and falls behind"
    why_values: {tokens: {kind: value_at, metric: mean_verified_tokens, where: {rps: 6}}}

``why_quick`` replaces ``why`` on a quick run, where the quick grid's own mechanism differs (it stops short of
saturation, runs fewer requests).
"""

from __future__ import annotations

import math
import operator
import re
import string
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from repro.core.errors import ConfigError

_FAMILY = "_family"  # set by evaluate(): the claim's system and its readings (exp.claims_also_for), never baselines
CLAIM_KEYS = {
    "text", "paper", "kind", "metric", "system", "where", "x", "reduce", "lower_is_better", "baselines",
    "baseline", "check", "target", "rel_tol", "abs_tol", "note", "why", "why_quick", "why_values", "stronger",
    "calibrated",
}  # fmt: skip
#: What a ``why_values`` entry inherits from its claim (the rest of the claim is about the verdict, not the run).
_RUN_KEYS = ("kind", "metric", "system", "where", "x", "reduce", "lower_is_better", "baselines", "baseline", _FAMILY)
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


def _relation_series(df: pd.DataFrame, spec: Mapping[str, Any], op: Callable[[Any, Any], Any],
                     best: bool) -> pd.Series:
    """The relation (system op baseline, or op the best other) at each x, before it is reduced."""
    mine = series(df, spec, spec["system"])
    other = _best_other(df, spec) if best else series(df, spec, _others(df, spec)[0])
    both = pd.concat([mine, other], axis=1, join="inner").dropna()
    if both.empty:
        return pd.Series(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = op(both.iloc[:, 0], both.iloc[:, 1])
    return values.replace([np.inf, -np.inf], np.nan)


def _relation(df: pd.DataFrame, spec: Mapping[str, Any], op: Callable[[Any, Any], Any], best: bool) -> float:
    return _reduce(_relation_series(df, spec, op, best), str(spec.get("reduce", "max")))


#: the relation kinds, by the operator and whether the baseline is the best other system
_RELATIONS = {"ratio": (operator.truediv, False), "ratio_to_best_baseline": (operator.truediv, True),
              "diff": (operator.sub, False), "diff_to_best_baseline": (operator.sub, True)}


def per_x(points: pd.DataFrame, spec: Mapping[str, Any], default_x: str | None = None) -> pd.Series:
    """What a claim reduces, at each x: its relation for a ratio or difference, else the system's metric (a claim
    panel draws it with the paper's value beside it)."""
    full = {"x": default_x, **spec}
    evaluate_one(points, full, default_x)  # the same checks, naming the claim
    kind = str(full["kind"])
    if kind in _RELATIONS:
        op, best = _RELATIONS[kind]
        return _relation_series(points, full, op, best)
    return series(points, full, full["system"])


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
    "change_over": lambda df, s: _reduce(series(df, s, s["system"]), "last")
    - _reduce(series(df, s, s["system"]), "first"),
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
#: metric-name fragments of a quantity where less is better (a ratio or difference of one is stronger when lower),
#: unless the name is also a rate where more is better (``goodput_tok_s`` is tokens per second)
_LOWER_BETTER = ("latency", "tpot", "ttft", "time", "_s", "_ms", "regret", "error", "cost", "wait", "delay")
_HIGHER_BETTER = ("goodput", "throughput", "tok_s", "attainment", "speedup", "utility")


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
        lower = any(f in metric for f in _LOWER_BETTER) and not any(f in metric for f in _HIGHER_BETTER)
        return "lower" if spec.get("lower_is_better") or lower else "higher"
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
    if "%" in str(spec.get("paper", "")) and abs(paper / 100 - target) < abs(paper - target):
        paper /= 100  # "< 4 %" against a target of 0.04
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


class _Quoted(string.Formatter):
    """``{name}`` of a ``why`` as a number to four significant digits unless the field gives a format."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, float) and math.isnan(value):
            return "n/a"
        return format(value, format_spec) if format_spec else _num(float(value))


def why(points: pd.DataFrame, spec: Mapping[str, Any], default_x: str | None = None, quick: bool = False) -> str:
    """The claim's ``why`` (``why_quick`` on a quick run, where it has one) with its ``why_values`` evaluated on
    ``points`` (module docstring); ConfigError naming the claim and the field for a quantity it does not define or
    cannot evaluate."""
    sentence = str((spec.get("why_quick") if quick else None) or spec.get("why") or "")
    text = spec.get("text", "?")
    values_spec = spec.get("why_values") or {}
    if not isinstance(values_spec, Mapping):
        raise ConfigError(f"exp.claims[{text!r}].why_values: expected {{name: {{kind: ..., metric: ...}}}}")
    values: dict[str, float] = {}
    for name, sub in values_spec.items():
        if not isinstance(sub, Mapping):
            raise ConfigError(f"exp.claims[{text!r}].why_values.{name}: expected a map of claim keys")
        inherited = {k: spec[k] for k in _RUN_KEYS if k in spec}
        where = {**(spec.get("where") or {}), **(sub.get("where") or {})}
        full = {**inherited, **sub, "text": f"{text}: why_values.{name}", **({"where": where} if where else {})}
        values[str(name)] = evaluate_one(points, full, default_x)
    fields = {f for _, f, _, _ in string.Formatter().parse(sentence) if f is not None}
    missing = sorted(fields - set(values))
    if missing:
        raise ConfigError(f"exp.claims[{text!r}].why: {{{missing[0]}}} is not in its why_values "
                          f"({', '.join(sorted(values)) or 'none'})")
    return _Quoted().vformat(sentence, (), values)


#: The claims table's columns (:func:`evaluate`).
COLUMNS = ["claim", "paper", "reproduced", "verdict", "test", "direction", "why"]


#: what a claim's reduction over its x is, as its n/a line says
_REDUCTION = {"max": "maximum", "min": "minimum", "first": "first value", "last": "last value",
              "change": "change"}


def axis_reduction(spec: Mapping[str, Any]) -> str:
    """How a claim reduces over its x: ``max``, ``min``, ``first``, ``last``, ``change`` or ``mean``."""
    kind = str(spec.get("kind"))
    if kind in ("max_over", "min_over"):
        return kind.removesuffix("_over")
    if kind == "change_over":
        return "change"
    return str(spec.get("reduce", "mean" if kind == "value_at" else "max"))


def ranges_over(spec: Mapping[str, Any], default_x: str | None = None) -> str | None:
    """The swept column a claim takes an extreme, an end or a change over ("up to", "at least", "at the highest
    load", "falls with"), or None (no x, or a mean)."""
    x = spec.get("x", default_x)
    return None if x is None or axis_reduction(spec) == "mean" else str(x)


def evaluate(
    claims: Sequence[Mapping[str, Any]], points: pd.DataFrame, default_x: str | None = None,
    also_for: Mapping[str, Sequence[str]] | None = None, quick: bool = False, one_value: Collection[str] = (),
) -> pd.DataFrame:
    """The claims table (:data:`COLUMNS`): one row per claim, and per reading of its system in ``also_for``
    (:func:`expand`); ``why`` is the claim's sentence on a "differs" (empty otherwise; ``why_quick`` with
    ``quick``). A claim that ranges over an axis in ``one_value`` (one the command line narrowed to one value,
    manifest.json's ``narrowed_axes``) is "n/a": not computable on this grid."""
    rows = []
    for spec in expand(claims, also_for):
        value = evaluate_one(points, spec, default_x)
        j = judge(value, spec)
        axis = ranges_over(spec, default_x)
        if axis is not None and axis in one_value and j.verdict not in ("calibrated", "n/a"):
            value = _NAN
            j = Judgement("n/a", f"not computable on this grid: its {_REDUCTION[axis_reduction(spec)]} over {axis} "
                                 f"needs the sweep, and the command line ran one {axis}", "")
        sentence = why(points, spec, default_x, quick)  # evaluated on every row, so a broken why_values fails at once
        rows.append({"claim": spec.get("text", ""), "paper": spec.get("paper", ""), "reproduced": value,
                     "verdict": j.verdict, "test": j.test, "direction": j.direction,
                     "why": sentence if j.verdict == "differs" else ""})  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)
