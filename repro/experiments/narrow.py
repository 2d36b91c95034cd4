"""What a command line does to an experiment: the command line always wins, and it narrows what it names.

The rule (docs/using.md, "Changing one knob"):

- ``system=NAME`` runs only that system: the experiment's entries for config ``NAME`` (or labelled ``NAME``), in
  ``exp.systems`` and in the cases' own systems lists, or ``NAME`` alone when the experiment does not compare it.
  Without an experiment, it is the system that runs.
- ``seed=S`` runs only that seed.
- a key the experiment sweeps (``rps=3``) narrows that axis to the value, in every case, whether or not the value
  was on the grid.
- a key the experiment's cases set (``model=llama2-70b`` in AdaServe Fig. 4) keeps the cases that set that value; if
  none does, the value replaces what every case sets (an error when the cases are labelled by that key).
- ``case=LABEL`` (or ``<case_key>=LABEL``, e.g. ``panel=PLD-Sonnet``) keeps the case with that label.
- a key the experiment's system entries set (``system.proposer``) is the command line's for every entry (those of
  the cases' own systems too).
- any other key (``hardware=h100-80g``, ``num_requests=50``) applies to every point, as Hydra composes it.

Each narrowing is announced on one line (:attr:`Narrowed.lines`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from repro.core.errors import ConfigError
from repro.experiments.expspec import ExpSpec, system_entries
from repro.experiments.validate import KNOBS

#: Command-line keys that say how to run, not what: never narrow anything.
RUN_KEYS = frozenset({"exp", "quick", "n_jobs", "launcher", "resume", "overwrite", "out_dir", "save_requests",
                      "save_columns", "save_step_columns", "hydra"})


@dataclass(frozen=True, slots=True)
class UserValue:
    """One command-line override: the config key it sets (``draft`` for ``model@draft=...``), its value (the
    config name for a group, else the composed value) and whether it was added with ``+``."""

    key: str
    value: Any
    text: str
    added: bool
    group: bool


@dataclass
class Narrowed:
    """An experiment after the command line narrowed it, one line per narrowing, and the command line's values that
    narrowed it (``by``: key and value, in command-line order)."""

    exp: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    by: list[tuple[str, Any]] = field(default_factory=list)
    #: the swept axes the command line narrowed to one value (a claim that ranges over one cannot be computed)
    one_value: list[str] = field(default_factory=list)


def parse(overrides: Sequence[str], cfg: DictConfig | None, groups: Mapping[str, str]) -> list[UserValue]:
    """The command line's overrides as :class:`UserValue` (values read from the composed ``cfg`` when given)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    by_override = {v: k for k, v in groups.items()}  # "model@draft" -> "draft"
    out = []
    for o in parsed:
        if o.is_delete():
            continue
        name = o.key_or_group if not o.package else f"{o.key_or_group}@{o.package}"
        key = by_override.get(name, name)
        group = name in by_override or key in groups or key == "exp"
        if group or cfg is None:
            value: Any = o.value()
        else:
            value = OmegaConf.select(cfg, key, default=o.value())
            if OmegaConf.is_config(value):
                value = OmegaConf.to_container(value, resolve=True)
        out.append(UserValue(key, value, o.input_line or f"{name}={o.value()}", o.is_add(), group))
    return out


def same(a: Any, b: Any) -> bool:
    """Values equal as the grid means them (2 == 2.0; names as strings)."""
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    return str(a) == str(b)


def _show(values: Sequence[Any]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def narrow(exp: Mapping[str, Any], user: Sequence[UserValue]) -> Narrowed:
    """Apply the module's rule to ``exp`` (after ``quick``); returns the narrowed experiment and its lines."""
    out = Narrowed({k: (list(v) if isinstance(v, list) else v) for k, v in exp.items()})
    e = out.exp
    if e.get("cases"):  # copies: narrowing never changes the caller's experiment
        e["cases"] = [dict(c) if isinstance(c, Mapping) else c for c in e["cases"]]
    values = {u.key: u for u in user if u.key not in RUN_KEYS}
    default_exp = e.get("name") == "default"
    narrowing: set[str] = set()  # the keys that added a line
    if "system" in values:
        n = len(out.lines)
        _narrow_systems(e, list(e.get("cases") or []), str(values["system"].value), default_exp, out.lines)
        narrowing.update(["system"] if len(out.lines) > n else [])
    if "seed" in values and list(e.get("seeds") or [0]) != [values["seed"].value]:
        before = list(e.get("seeds") or [0])
        e["seeds"] = [int(values["seed"].value)]
        if not default_exp:
            out.lines.append(f"seed={values['seed'].value}: runs that seed only (the experiment runs {_show(before)})")
            narrowing.add("seed")
    cases = list(e.get("cases") or [])
    case_key = str(e.get("case_key") or "case")
    if "case" in values and values["case"].value is not None:
        label = str(values["case"].value)
        if not cases:
            raise ConfigError(f"case={label}: experiment {e.get('name')} has no cases")
        keep = [c for c in cases if str(c.get("label")) == label]
        labels = ", ".join(str(c.get("label")) for c in cases)
        if not keep:
            raise ConfigError(f"{case_key}={label}: no such case (cases: {labels})")
        out.lines.append(f"{case_key}={label}: runs that case only (of {labels})")
        narrowing.add("case")
        cases = keep
    for key, uv in values.items():
        if key in ("system", "seed", "case"):
            continue
        n = len(out.lines)
        if _narrow_grid(e, cases, key, uv, out.lines):
            out.one_value.append(key)
        cases = _narrow_cases(cases, case_key, key, uv, out.lines)
        _free_entries(e, cases, key, uv, out.lines)
        narrowing.update([key] if len(out.lines) > n else [])
    if e.get("cases"):
        e["cases"] = cases
    out.by = [(key, uv.value) for key, uv in values.items() if key in narrowing]
    return out


def _narrow_grid(e: dict[str, Any], cases: list[dict[str, Any]], key: str, uv: UserValue, lines: list[str]) -> bool:
    """Narrow (or sweep) the axis ``key``; whether it now runs one value where the experiment swept several."""
    grids = [g for g in [e.get("grid") or {}, *(c.get("grid") or {} for c in cases)] if key in g]
    sweep = isinstance(uv.value, list | tuple)
    if sweep and not uv.value:
        raise ConfigError(f"{uv.text}: an empty list sweeps nothing (give {key}=[V1,V2,...] or one value)")
    if not grids:
        if sweep and key in KNOBS and KNOBS[key].kind != "str":  # a list for one value: sweep it, grid's last axis
            e["grid"] = {**(e.get("grid") or {}), key: list(uv.value)}
            lines.append(f"{key}={_show(uv.value)}: sweeps {key} over these values")
        return False
    before: list[Any] = []
    for g in grids:
        vals = g[key] if isinstance(g[key], list | tuple) else [g[key]]
        before += [v for v in vals if not any(same(v, b) for b in before)]
    values = list(uv.value) if sweep else [uv.value]
    if e.get("grid") and key in e["grid"]:
        e["grid"] = {**e["grid"], key: values}
    for c in cases:
        if c.get("grid") and key in c["grid"]:
            c["grid"] = {**c["grid"], key: values}
    if sweep:
        lines.append(f"{key}={_show(values)}: sweeps {key} over these values (the experiment sweeps it over "
                     f"{_show(before)})")
    elif not (len(before) == 1 and same(before[0], uv.value)):
        lines.append(f"{key}={uv.value}: runs that value only (the experiment sweeps {key} over {_show(before)})")
        return len(before) > 1
    return False


def _narrow_cases(cases: list[dict[str, Any]], case_key: str, key: str, uv: UserValue,
                  lines: list[str]) -> list[dict[str, Any]]:
    setting = [c for c in cases if key in (c.get("overrides") or {})]
    if not setting:
        return cases
    keep = [c for c in setting if same(c["overrides"][key], uv.value)]
    if keep:
        if len(keep) < len(cases):
            lines.append(f"{key}={uv.value}: runs the {case_key} {', '.join(str(c['label']) for c in keep)} only "
                         f"(of {', '.join(str(c['label']) for c in cases)})")
        return [c for c in cases if c in keep or key not in (c.get("overrides") or {})]
    was = ", ".join(f"{c['label']}: {c['overrides'][key]}" for c in setting)
    if key == case_key:  # the cases are labelled by this key: a replaced value would run under a wrong label
        raise ConfigError(f"{key}={uv.value}: no case of this experiment sets it ({was})")
    for c in setting:
        c["overrides"] = {k: v for k, v in c["overrides"].items() if k != key}
    lines.append(f"{key}={uv.value}: replaces the value each {case_key} sets ({was})")
    return cases


def _system_lists(e: dict[str, Any], cases: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[Any]]]:
    """The systems lists that run, each with the map holding it: each case's own, and ``exp.systems`` unless every
    case has its own."""
    own = [(c, list(c["systems"])) for c in cases if c.get("systems") is not None]
    return own if cases and len(own) == len(cases) else [(e, list(e.get("systems") or [])), *own]


def _narrow_systems(e: dict[str, Any], cases: list[dict[str, Any]], name: str, default_exp: bool,
                    lines: list[str]) -> None:
    """``system=NAME``: every systems list keeps its entries for config or label ``NAME``.

    When no list has one, ``NAME`` alone replaces them all.
    """
    before = ExpSpec.parse(e).system_labels()
    lists = _system_lists(e, cases)
    kept = [[r for r, en in zip(raw, system_entries(raw), strict=True) if name in (en.name, en.label)]
            for _, raw in lists]
    for (holder, _), keep in zip(lists, kept, strict=True):
        holder["systems"] = keep if any(kept) else [name]
    after = ExpSpec.parse(e).system_labels()
    if not default_exp and before != after:
        lines.append(f"system={name}: runs {', '.join(after)} only (the experiment compares {', '.join(before)})")


def _free_entries(e: dict[str, Any], cases: list[dict[str, Any]], key: str, uv: UserValue, lines: list[str]) -> None:
    changed = False
    for holder, raw in _system_lists(e, cases):
        for i, entry in enumerate(raw):
            if isinstance(entry, Mapping) and key in (entry.get("overrides") or {}):
                raw[i] = {**entry, "overrides": {k: v for k, v in entry["overrides"].items() if k != key}}
                changed = True
                holder["systems"] = raw
    if changed:
        lines.append(f"{key}={uv.value}: applies to every system (the experiment's entries set it per system)")
