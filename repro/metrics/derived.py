"""Derived columns: every column computed from other columns rather than simulated, in one place.

:func:`with_derived` adds them to a table; the runner uses it for points.csv and the figure code for the tables it
draws from, so a column means the same wherever it appears. Two kinds:

Row by row, from columns the saved tables store (:data:`TABLE_COLUMNS`; requests.parquet and steps.parquet never
store them, so they are added on load)
    a request's ``latency_s`` (finish − arrival), ``ttft_ms`` and ``tpot_ms``, as
    :func:`repro.metrics.summary.with_latencies` defines them (NaN while unfinished); a step's (or request's)
    ``accept_rate`` = accepted / proposed tokens (the emitted fraction) and ``draft_acceptance_rate`` = matched /
    proposed (vLLM v0's metric, an estimate of the per-token α), NaN when nothing was proposed; a step's
    ``total_tokens`` (:func:`step_total_tokens`); a request's ``switch_ratio`` = swap_s / service_s (LAPS-SD Fig. 2)
    and, where a policy estimated its execution time, ``estimate_error`` (:func:`repro.metrics.summary.estimate_error`,
    LAPS-SD Fig. 7). A column the table already has is kept as it is.
Across rows, an experiment's ``exp.derived`` entries (:class:`Derived`), in order (a later entry may use an earlier
one's column)
    ``{name, metric, baseline, invert, match}``: the row's ``metric`` divided by the ``baseline`` system's at the same
    key values (seed and grid values, or the seed and the columns ``match`` lists when the baseline runs fewer of them:
    no speculation has no k; ``invert``: the baseline's divided by the row's, e.g. a speedup from latencies);
    ``{name, metric, normalize: COLUMN}``: the row's ``metric`` divided by the largest ``metric`` among the rows of
    the same system and key values that differ only in ``COLUMN`` (e.g. goodput as a fraction of the best proposed
    length's, TurboSpec Fig. 5); ``{name, metric, per: COLUMN}``: the row's ``metric`` divided by its own ``COLUMN``
    (goodput per node: ``per: num_replicas``, AdaServe Fig. 7's SepPipe on three nodes). A value that cannot be
    computed (no baseline row, a zero or non-numeric denominator) is NaN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import pandas as pd

from repro.core.errors import ConfigError
from repro.metrics.steps import step_total_tokens
from repro.metrics.summary import LATENCY_COLUMNS, estimate_error, with_latencies

#: Columns of requests / steps tables that follow from stored ones: dropped when a table is saved, added on load.
TABLE_COLUMNS: tuple[str, ...] = (*LATENCY_COLUMNS, "accept_rate", "draft_acceptance_rate", "switch_ratio",
                                  "estimate_error", "total_tokens")
_NAN = float("nan")


@dataclass(frozen=True, slots=True)
class Derived:
    """An ``exp.derived`` entry: a column ``name`` computed from ``metric`` against a ``baseline`` system (``invert``:
    baseline / row), normalized by its best value over the grid column ``normalize``, or divided by the row's own
    column ``per``."""

    name: str
    metric: str
    baseline: str | None = None
    invert: bool = False
    normalize: str | None = None
    match: tuple[str, ...] | None = None
    per: str | None = None

    @classmethod
    def parse(cls, entry: Any) -> Derived:
        """An ``exp.derived`` entry from its map (ConfigError naming the entry when it is malformed)."""
        ok = isinstance(entry, Mapping) and {"name", "metric"} <= set(entry)
        ok = ok and not set(entry) - {"name", "metric", "baseline", "invert", "normalize", "match", "per"}
        ok = ok and ("match" not in entry or ("baseline" in entry and isinstance(entry["match"], Sequence)
                                              and not isinstance(entry["match"], str)))
        if not ok or sum(k in entry for k in ("baseline", "normalize", "per")) != 1:
            shown = dict(entry) if isinstance(entry, Mapping) else entry
            raise ConfigError(f"exp.derived: entry {shown} needs name, metric and one of baseline (and optional "
                              "invert and match: a list of columns), normalize or per")
        norm = entry.get("normalize")
        on = entry.get("match")
        return cls(str(entry["name"]), str(entry["metric"]),
                   None if "baseline" not in entry else str(entry["baseline"]), bool(entry.get("invert")),
                   None if norm is None else str(norm), None if on is None else tuple(str(c) for c in on),
                   None if entry.get("per") is None else str(entry["per"]))


@overload
def with_derived(df: pd.DataFrame, specs: Sequence[Derived] = ..., keys: Sequence[str] = ...) -> pd.DataFrame: ...


@overload
def with_derived(df: None, specs: Sequence[Derived] = ..., keys: Sequence[str] = ...) -> None: ...


def with_derived(
    df: pd.DataFrame | None, specs: Sequence[Derived] = (), keys: Sequence[str] = ()
) -> pd.DataFrame | None:
    """``df`` plus its derived columns (module docstring); None stays None (a table that was not saved).

    First the row-by-row columns its columns allow, then ``specs`` in order, rows matched on ``keys`` (seed and grid
    columns; the specs match ``system`` themselves).
    """
    if df is None:
        return None
    check(specs, keys)
    cols = set(df.columns)
    if {"finish_at", "arrival_s"} <= cols and not set(LATENCY_COLUMNS) & cols:
        df = with_latencies(df)
    if {"num_accepted", "num_proposed"} <= cols and "accept_rate" not in cols:
        proposed = df["num_proposed"].where(df["num_proposed"] > 0)
        rates = {"accept_rate": df["num_accepted"] / proposed}
        if "num_matched" in cols and "draft_acceptance_rate" not in cols:
            rates["draft_acceptance_rate"] = df["num_matched"] / proposed
        df = df.assign(**rates)
    if {"swap_s", "service_s"} <= cols and "switch_ratio" not in cols:
        df = df.assign(switch_ratio=df["swap_s"] / df["service_s"].where(df["service_s"] > 0))
    if {"estimate_s", "service_s", "finish_at"} <= cols and "estimate_error" not in cols:
        df = df.assign(estimate_error=estimate_error(df))
    if cols >= STEP_TOKENS and "total_tokens" not in cols:
        df = df.assign(total_tokens=step_total_tokens(df))
    for spec in specs:
        df = df.assign(**{spec.name: _column(df, spec, keys)})
    return df


STEP_TOKENS = frozenset({"num_emitted", "num_batched_tokens", "num_decode", "num_proposed"})


def check(specs: Sequence[Derived], keys: Sequence[str]) -> None:
    """A ``normalize`` entry, and every ``match`` column, must name one of ``keys`` (the seed and grid columns)."""
    for spec in specs:
        for col in spec.match or ():
            if col not in keys:
                raise ConfigError(f"exp.derived[{spec.name}].match: '{col}' is not a grid column ({list(keys)})")
        if spec.normalize is not None and spec.normalize not in keys:
            raise ConfigError(f"exp.derived[{spec.name}].normalize: '{spec.normalize}' is not a grid column "
                              f"({list(keys)})")


def _column(df: pd.DataFrame, spec: Derived, keys: Sequence[str]) -> list[float]:
    """One ``exp.derived`` column's values, row by row (plain Python floats, so the numbers do not depend on how the
    table is stored)."""
    values = [_as_float(v) for v in _cells(df, spec.metric)]
    if spec.per is not None:
        return [v / d if d else _NAN for v, d in zip(values, (_as_float(c) for c in _cells(df, spec.per)), strict=True)]
    systems = _cells(df, "system")
    if spec.normalize is not None:
        group = [k for k in keys if k != spec.normalize]
        groups = [(s, *g) for s, g in zip(systems, _rows(df, group), strict=True)]
        best: dict[tuple[Any, ...], float] = {}
        for g, v in zip(groups, values, strict=True):
            if v == v:  # not NaN
                best[g] = max(best.get(g, v), v)
        out = []
        for g, v in zip(groups, values, strict=True):
            ref = best.get(g, _NAN)
            out.append(v / ref if ref else _NAN)
        return out
    if spec.match is not None:
        keys = [k for k in keys if k == "seed" or k in spec.match]
    at = _rows(df, keys)
    ref_of = {k: v for k, v, s in zip(at, values, systems, strict=True) if s == spec.baseline}
    out = []
    for k, mine in zip(at, values, strict=True):
        theirs = ref_of.get(k, _NAN)
        try:
            out.append(theirs / mine if spec.invert else mine / theirs)
        except ZeroDivisionError:
            out.append(_NAN)
    return out


def _cells(df: pd.DataFrame, col: str) -> list[Any]:
    """Column ``col`` as a list (empty cells when the table has no such column)."""
    return df[col].tolist() if col in df.columns else [""] * len(df)


def _rows(df: pd.DataFrame, cols: Sequence[str]) -> list[tuple[Any, ...]]:
    """Each row's values of ``cols``, as tuples."""
    return list(zip(*(_cells(df, c) for c in cols), strict=True)) if cols else [()] * len(df)


def _as_float(value: Any) -> float:
    """A cell as a float (NaN when empty or not a number)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return _NAN
