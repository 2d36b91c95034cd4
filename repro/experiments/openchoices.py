"""Open choices: the values a run needs that its paper does not give, declared with their plausible range.

An experiment declares them under ``exp.open``, one entry per knob::

    open:
      gamma: {key: system.gamma, systems: [laps_sd], value: 5, values: [3, 5, 10, 20],
              why: "rounds whose acceptance must agree; §4.2 gives no value; Fig. 3 settles after 100-150 tokens"}
      link:  {key: hardware.host_link_gbs, value: 25, range: [16, 80], scale: log, why: "..."}

- ``key``: a dotted key of a point's composed config (``system.gamma``), or a config group (``engine``) whose
  ``values`` are config names.
- ``systems``: the ``exp.systems`` labels whose points take the knob (default: every point). A system's own
  parameter names its systems: the others have no such key.
- ``value``: the value the experiment uses (it must be what the composed config holds).
- ``values`` (a set) or ``range: [lo, hi]`` (numbers; ``integer: true`` rounds, ``scale: log`` spreads levels
  geometrically), containing ``value``.
- ``why``: one line on why that range: a source, a physical bound, the paper's text.

A value the paper gives is not open, nor a key the experiment's grid already varies. ``python -m repro robustness
NAME`` runs the experiment over these ranges (:mod:`repro.experiments.robustness`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from repro.core.errors import ConfigError

OPEN_KEYS = ("key", "systems", "value", "values", "range", "integer", "scale", "why")


@dataclass(frozen=True)
class OpenChoice:
    """One declared open choice (see the module docstring)."""

    name: str
    key: str
    value: Any
    why: str
    values: tuple[Any, ...] | None = None
    range: tuple[float, float] | None = None
    integer: bool = False
    scale: str = "linear"
    systems: tuple[str, ...] = ()

    def levels(self, n: int = 3) -> list[Any]:
        """The values a one-at-a-time scan visits, the chosen value among them: a set with at most ``n`` numbers,
        whole; a longer one at its names (``null``) and ``n`` of its numbers spread over them, ends included; a range
        at ``n`` points spread over it, ends included."""
        if self.values is not None:
            numbers = sorted(v for v in self.values if _number(v))
            if len(numbers) <= n:
                return list(self.values)
            names = [v for v in self.values if not _number(v)]  # e.g. null: the table's own value
            picked = [numbers[round(i * (len(numbers) - 1) / (n - 1))] for i in range(n)]
            return list(dict.fromkeys([*names, *picked, self.value]))
        return list(dict.fromkeys([*(self.at(i / max(n - 1, 1)) for i in range(n)), self.value]))

    def at(self, u: float) -> Any:
        """The value at quantile ``u`` in [0, 1] of the set or the range (a space-filling design's draw)."""
        if self.values is not None:
            return self.values[min(int(u * len(self.values)), len(self.values) - 1)]
        assert self.range is not None
        lo, hi = self.range
        x = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if self.scale == "log" else lo + u * (hi - lo)
        return round(x) if self.integer else round(x, 6)

    def describe(self) -> str:
        """``value`` in ``{a, b}`` / ``[lo, hi]`` (for tables)."""
        where = "{" + ", ".join(show(v) for v in self.values) + "}" if self.values is not None else \
            f"[{self.range[0]:g}, {self.range[1]:g}]{' log' if self.scale == 'log' else ''}"  # type: ignore[index]
        return f"{show(self.value)} in {where}"


def parse_open(raw: Any) -> tuple[OpenChoice, ...]:
    """Read and check ``exp.open`` (ConfigError naming the first bad entry)."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"exp.open: expected a map of knob name -> {{key, value, values|range, why}}, got {raw!r}")
    return tuple(_choice(str(name), spec) for name, spec in raw.items())


def _choice(name: str, spec: Any) -> OpenChoice:
    where = f"exp.open.{name}"
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a map with {', '.join(OPEN_KEYS)}, got {spec!r}")
    unknown = sorted(str(k) for k in spec if k not in OPEN_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(OPEN_KEYS)})")
    for need in ("key", "value", "why"):
        if need not in spec or (need != "value" and spec.get(need) in (None, "")):
            raise ConfigError(f"{where}: needs '{need}'")
    if (spec.get("values") is None) == (spec.get("range") is None):
        raise ConfigError(f"{where}: give either 'values' (a set) or 'range' ([lo, hi])")
    value = spec["value"]
    values = rng = None
    if spec.get("values") is not None:
        if not isinstance(spec["values"], Sequence) or isinstance(spec["values"], str) or len(spec["values"]) < 2:
            raise ConfigError(f"{where}.values: expected a list of at least two values, got {spec['values']!r}")
        values = tuple(spec["values"])
        if value not in values:
            raise ConfigError(f"{where}: value {value!r} is not among values {list(values)}")
    else:
        r = spec["range"]
        if not (isinstance(r, Sequence) and len(r) == 2 and all(_number(x) for x in r) and r[0] < r[1]):
            raise ConfigError(f"{where}.range: expected [lo, hi] with lo < hi, got {r!r}")
        if not _number(value) or not r[0] <= value <= r[1]:
            raise ConfigError(f"{where}: value {value!r} lies outside range {list(r)}")
        rng = (float(r[0]), float(r[1]))
    scale = str(spec.get("scale", "linear"))
    if scale not in ("linear", "log") or (scale == "log" and (rng is None or rng[0] <= 0)):
        raise ConfigError(f"{where}.scale: linear, or log over a positive range; got {scale!r}")
    systems = spec.get("systems") or ()
    if isinstance(systems, str) or not isinstance(systems, Sequence):
        raise ConfigError(f"{where}.systems: expected a list of exp.systems labels, got {systems!r}")
    return OpenChoice(name, str(spec["key"]), value, str(spec["why"]), values, rng, bool(spec.get("integer")), scale,
                      tuple(str(s) for s in systems))


def show(v: Any) -> str:
    """A value as YAML writes it (``null``, ``true``; a NaN, as a CSV gives null back, is null)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "null"
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
