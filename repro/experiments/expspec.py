"""The ``exp`` block of an experiment as a typed value: :class:`ExpSpec`, checked once before anything runs.

An experiment (``conf/exp/NAME.yaml``, the ``exp.*`` keys of conf/config.yaml) describes itself under ``exp``:
``name``, ``title``, ``description``, ``kind`` (sweep | calibration | memory), ``systems``, ``grid``, ``cases`` and
``case_key``, ``seeds``, ``quick``, ``figures``, ``claims`` and ``derived`` (:data:`EXP_KEYS`). :meth:`ExpSpec.parse`
reads the block into typed fields and refuses a key it does not know (``exp.sytems``) or a value of the wrong shape
with one :class:`~repro.core.errors.ConfigError` line naming the key; the runner, the grid expansion
(:mod:`repro.experiments.grid`) and the summary read the fields, never the raw mapping.

Systems
    An ``exp.systems`` entry is a system config name (``vllm``) or a map ``{system: NAME, label: ..., overrides:
    {...}, display_name: ...}``; the label (default: the name) is the points.csv ``system`` column, so labels differ
    within a list; ``display_name`` names the entry in figures (default: its system config's ``display_name``, for a
    label that is a config name) and ``variant: true`` draws it as the suite's own reading (dashed).
Cases
    An ``exp.cases`` entry ``{label, overrides, grid, systems, columns}`` bundles settings that change together (a
    model with its tensor parallelism, its SLOs and its own request rates). Its label fills the ``exp.case_key``
    column (default ``case``; several cases may share a label), its ``grid`` replaces ``exp.grid``, its ``systems``
    (the format of ``exp.systems``) replace the experiment's systems for that case, and its ``columns`` (a map) are
    constant points.csv columns of its points that are not config keys (validate_vllm_v1's Hugging Face ``draft``
    id).
Quick mode
    With ``quick=true``, each ``exp.quick`` entry named in :data:`QUICK_EXP_KEYS` replaces the ``exp`` key of that
    name; any other ``exp.quick`` key is a config override every point gets (``num_requests: 100``), see
    :func:`apply_quick`.
Real backends
    ``exp.requires`` names the Python modules an experiment needs beyond the core (``[torch, transformers]`` for one
    on ``backend=hf``): without them the runner refuses it with the install command and ``repro check`` / ``all``
    skip it, saying so (:meth:`ExpSpec.missing`). ``exp.compare`` restricts ``repro check`` to the points.csv
    columns a measured run reproduces (token counts, not latencies).
Interpolations
    A point's own values (a grid's, a case's or a system entry's ``overrides``, ``exp.quick``'s overrides) may refer
    to other keys only escaped, ``'\\${proposer}'``: the point's config then resolves it. Unescaped, it would resolve
    once, when the block is read, at the experiment's own values, and every point would get the same value
    (:func:`check_frozen_interpolations` refuses it).
Open choices
    ``exp.open`` declares the values the paper leaves open, each with its plausible range and why
    (:mod:`repro.experiments.openchoices`); ``python -m repro robustness NAME`` varies them.
Figures, claims, derived columns
    ``exp.figures`` and ``exp.claims`` are lists of maps, checked where they are drawn
    (:mod:`repro.experiments.figures`) and evaluated (:mod:`repro.experiments.claims`); ``exp.derived`` entries are
    :class:`repro.metrics.derived.Derived`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from repro.core.errors import ConfigError, suggest
from repro.experiments.openchoices import OpenChoice, parse_open
from repro.metrics.derived import Derived, check

#: ``exp.quick`` keys that replace the experiment's own; any other ``exp.quick`` key is a config override.
QUICK_EXP_KEYS = ("systems", "grid", "cases", "seeds", "figures", "claims")
#: Experiment kinds whose points run ``exp.systems`` (a calibration runs none).
SYSTEM_KINDS = ("sweep", "memory")
SEED_KEY = "seed"


@dataclass(frozen=True, slots=True)
class SystemEntry:
    """An ``exp.systems`` entry: config name, the label shown in results, extra overrides."""

    name: str
    label: str
    overrides: tuple[tuple[str, Any], ...] = ()
    display_name: str | None = None  # the legend's name for this entry (default: its system config's display_name)
    variant: bool = False  # the suite's own reading: drawn dashed, under the paper's lines (as a config's variant)


@dataclass(frozen=True, slots=True)
class Case:
    """An ``exp.cases`` entry with the systems it runs (its own, else the experiment's).

    ``label`` None is the one unlabelled case of an experiment without cases.
    """

    label: str | None
    overrides: Mapping[str, Any]
    grid: Mapping[str, Any]
    systems: tuple[SystemEntry, ...]
    columns: Mapping[str, Any] = field(default_factory=dict)  # constant points.csv columns (not config overrides)

    def entry(self, label: str) -> SystemEntry | None:
        """This case's system entry labelled ``label`` (None when the case does not run it)."""
        return next((e for e in self.systems if e.label == label), None)


@dataclass(frozen=True)
class ExpSpec:
    """An experiment's ``exp`` block, typed (see the module docstring).

    ``source`` is the mapping it was read from (manifest.json records it as it was).
    """

    name: str = ""
    title: str = ""
    description: str = ""
    kind: str = "sweep"
    systems: tuple[SystemEntry, ...] = ()
    grid: Mapping[str, Any] = field(default_factory=dict)
    cases: tuple[Case, ...] = ()
    case_key: str = "case"
    seeds: tuple[int, ...] = ()
    quick: Mapping[str, Any] = field(default_factory=dict)
    figures: tuple[Mapping[str, Any], ...] = ()
    claims: tuple[Mapping[str, Any], ...] = ()
    #: a system's readings whose claims are evaluated too ({nightjar: [nightjar_authors]}: every claim about
    #: nightjar gets a row for nightjar_authors, and neither counts as the other's baseline;
    # :mod:`repro.experiments.claims`)
    claims_also_for: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    derived: tuple[Derived, ...] = ()
    requires: tuple[str, ...] = ()  # Python modules the experiment needs (a real backend: torch, transformers)
    compare: tuple[str, ...] = ()  # points.csv columns `repro check` compares (empty: all but the wall-clock ones)
    #: the values the paper leaves open, with their plausible ranges (repro.experiments.openchoices)
    open: tuple[OpenChoice, ...] = ()
    #: a leaderboard over the cases and a load column (repro.experiments.league; conf/exp/league.yaml)
    league: Mapping[str, Any] = field(default_factory=dict)
    source: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ExpSpec:
        """Read and check an ``exp`` block (ConfigError naming the first bad key)."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"exp: expected a mapping of {', '.join(EXP_KEYS)}, got {raw!r}")
        unknown = sorted(str(k) for k in raw if k not in EXP_KEYS)
        if unknown:
            hint = suggest(unknown[0], EXP_KEYS) if len(unknown) == 1 else ""
            raise ConfigError(
                f"exp: unknown key(s) {', '.join('exp.' + k for k in unknown)}{hint} (known: {', '.join(EXP_KEYS)})"
            )
        case_key = _text(raw, "case_key") or "case"
        systems = system_entries(_list(raw, "systems", "system names or {system, label, overrides} maps"))
        grid = _grid(raw.get("grid"), "exp.grid", case_key if raw.get("cases") else None)
        cases = tuple(_case(c, grid, systems, case_key) for c in _list(raw, "cases", "{label, ...} maps"))
        spec = cls(
            name=_text(raw, "name"),
            title=_text(raw, "title"),
            description=_text(raw, "description"),
            kind=_text(raw, "kind") or "sweep",
            systems=systems,
            grid=grid,
            cases=cases,
            case_key=case_key,
            seeds=_seeds(raw.get("seeds")),
            quick=_map(raw.get("quick"), "exp.quick"),
            figures=tuple(_maps(raw, "figures")),
            claims=tuple(_maps(raw, "claims")),
            claims_also_for=_also_for(raw.get("claims_also_for")),
            derived=tuple(Derived.parse(d) for d in _list(raw, "derived", "{name, metric, ...} maps")),
            requires=tuple(str(m) for m in _list(raw, "requires", "Python module names")),
            compare=tuple(str(c) for c in _list(raw, "compare", "points.csv column names")),
            open=parse_open(raw.get("open")),
            league=_map(raw.get("league"), "exp.league"),
            source=raw,
        )
        if spec.league:
            from repro.experiments.league import LeagueSpec

            LeagueSpec.parse(spec.league)
        if raw.get("systems") is not None and spec.kind in SYSTEM_KINDS and not spec.system_labels():
            raise ConfigError("exp.systems: an empty list runs no system (name one or more: exp.systems=[vllm])")
        check(spec.derived, [SEED_KEY, *spec.grid_columns()])
        return spec

    def missing(self) -> list[str]:
        """The modules of ``requires`` this Python cannot import."""
        import importlib.util

        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    def case_list(self) -> tuple[Case, ...]:
        """The cases, or one unlabelled case with ``exp.grid`` and ``exp.systems`` when the experiment has none."""
        return self.cases or (Case(None, {}, self.grid, self.systems),)

    def grid_columns(self) -> list[str]:
        """The swept columns of points.csv: the case key (if there are cases), then every case's constant columns and
        grid keys in order."""
        cols: list[str] = [self.case_key] if self.cases else []
        for case in self.case_list():
            cols.extend(k for k in (*case.columns, *case.grid) if k not in cols)
        return cols

    def system_labels(self) -> list[str]:
        """The labels of every system the experiment runs, in order of first appearance over its cases."""
        return list(dict.fromkeys(e.label for c in self.case_list() for e in c.systems))

    def run_seeds(self) -> tuple[int, ...]:
        """The seeds the points run (``exp.seeds``, else seed 0)."""
        return self.seeds or (0,)


EXP_KEYS = tuple(f.name for f in fields(ExpSpec) if f.name != "source")


def _also_for(raw: Any) -> dict[str, tuple[str, ...]]:
    """``exp.claims_also_for``: a map of system label → list of labels (ConfigError naming it otherwise)."""
    if raw is None:
        return {}
    ok = isinstance(raw, Mapping) and all(isinstance(v, Sequence) and not isinstance(v, str) for v in raw.values())
    if not ok:
        raise ConfigError(f"exp.claims_also_for: expected {{system: [its readings, ...]}}, got {raw!r}")
    return {str(k): tuple(str(x) for x in v) for k, v in raw.items()}


_UNESCAPED = re.compile(r"(?<!\\)\$\{")


def check_frozen_interpolations(raw: Any, where: str = "exp", point: bool = False) -> None:
    """Refuse an unescaped interpolation among a point's own values in the unresolved ``exp`` block ``raw``: in a
    grid, in ``overrides`` (of a case or a system entry) or in ``exp.quick``'s config overrides (``point``: ``raw``
    is one of them). Read with the block, it would take the experiment's own values (``load`` 0.5 for every load of
    the grid), not each point's."""
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            own = point or key in ("grid", "overrides") or (where.endswith(".quick") and key not in QUICK_EXP_KEYS)
            check_frozen_interpolations(value, f"{where}.{key}", own)
    elif isinstance(raw, list | tuple):
        for i, value in enumerate(raw):
            check_frozen_interpolations(value, f"{where}[{i}]", point)
    elif point and isinstance(raw, str) and _UNESCAPED.search(raw):
        escaped = _UNESCAPED.sub(lambda _: "\\${", raw)
        raise ConfigError(f"{where}: '{raw}' would resolve once, when the experiment is read, with the experiment's "
                          f"own values, so every point would get the same value; escape it, '{escaped}', to resolve "
                          "it in each point's config")


def apply_quick(exp: Mapping[str, Any], quick: bool, keep: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(exp, point_overrides)`` after ``quick``: the experiment with quick values, and overrides for every point.

    ``exp.quick`` entries named in :data:`QUICK_EXP_KEYS` replace the experiment's; its other entries are config
    overrides for every point (e.g. ``num_requests: 100``). Paths in ``keep`` (what the command line set under
    ``exp``: ``grid.rps``, ``systems``) keep ``exp``'s values.
    """
    out = dict(exp)
    extra: dict[str, Any] = {}
    if quick:
        for key, value in (exp.get("quick") or {}).items():
            if key in QUICK_EXP_KEYS:
                out[key] = value
            else:
                extra[key] = value
        for path in keep:
            parts = path.split(".")
            if parts[0] in QUICK_EXP_KEYS and parts[0] in (exp.get("quick") or {}):
                _put(out, parts, exp)
    return out, extra


def _put(out: dict[str, Any], parts: Sequence[str], src: Mapping[str, Any]) -> None:
    """Set ``out`` at the path ``parts`` to ``src``'s value there (copying the maps on the way; nothing when
    ``src`` has none)."""
    value: Any = src
    for p in parts:
        if not isinstance(value, Mapping) or p not in value:
            return
        value = value[p]
    node = out
    for p in parts[:-1]:
        node[p] = dict(node[p]) if isinstance(node.get(p), Mapping) else {}
        node = node[p]
    node[parts[-1]] = value


def system_entries(systems: Sequence[Any], where: str = "exp.systems") -> tuple[SystemEntry, ...]:
    """A systems list (strings or ``{system, label, overrides, display_name, variant}`` maps) as entries with
    distinct labels."""
    out = []
    for entry in systems:
        if isinstance(entry, str):
            out.append(SystemEntry(entry, entry))
            continue
        if not isinstance(entry, Mapping) or "system" not in entry:
            raise ConfigError(f"{where}: entry {entry!r} is neither a name nor a map with a 'system' key")
        unknown = set(entry) - {"system", "label", "overrides", "display_name", "variant"}
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)} in entry for {entry['system']!r}")
        ov = _map(entry.get("overrides"), f"{where}[{entry['system']}].overrides")
        shown = entry.get("display_name")
        out.append(SystemEntry(str(entry["system"]), str(entry.get("label") or entry["system"]), tuple(ov.items()),
                               None if shown is None else str(shown), bool(entry.get("variant", False))))
    labels = [e.label for e in out]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{where}: duplicate labels {labels} (give each entry a distinct 'label')")
    return tuple(out)


# ---------------------------------------------------------------------------------------------- parts


def _case(case: Any, grid: Mapping[str, Any], systems: tuple[SystemEntry, ...], case_key: str) -> Case:
    """An ``exp.cases`` entry; without a grid (or systems) of its own it takes the experiment's."""
    if not isinstance(case, Mapping) or "label" not in case:
        raise ConfigError(f"exp.cases: entry {case!r} needs a 'label'")
    label = str(case["label"])
    unknown = set(case) - {"label", "overrides", "grid", "systems", "columns"}
    if unknown:
        raise ConfigError(f"exp.cases: unknown key(s) {sorted(unknown)} in case {label!r}")
    where = f"exp.cases[{label}]"
    own = case.get("systems")
    if own is not None and not isinstance(own, list | tuple):
        raise ConfigError(f"{where}.systems: expected a list like exp.systems, got {own!r}")
    if own is not None and not own:
        raise ConfigError(f"{where}.systems: an empty list runs no system in this case (name one or more, or drop "
                          "the key: the case then runs exp.systems)")
    columns = _map(case.get("columns"), f"{where}.columns")
    own_grid = _grid(case.get("grid"), f"{where}.grid", case_key) or grid
    clash = sorted(set(columns) & ({"exp", "system", "seed", case_key} | set(own_grid)))
    if clash:
        raise ConfigError(f"{where}.columns: {clash} already name a points.csv column (the case key, a grid key or "
                          "exp/system/seed)")
    return Case(
        label,
        _map(case.get("overrides"), f"{where}.overrides"),
        own_grid,
        systems if own is None else system_entries(own, f"{where}.systems"),
        columns,
    )


def _grid(value: Any, where: str, case_key: str | None) -> dict[str, Any]:
    """A grid map; ``system``, ``seed``, ``exp`` and the case key are not grid keys."""
    grid = _map(value, where)
    for key, values in grid.items():
        if key in ("system", "seed", "exp", case_key or "exp"):
            raise ConfigError(f"exp.grid: '{key}' cannot be a grid key (use exp.systems / exp.seeds)")
        if isinstance(values, list | tuple) and not values:
            raise ConfigError(f"{where}.{key}: an empty list sweeps no value (give one or more: {where}.{key}=[...])")
    return grid


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key)
    if value is None:
        return ""
    if isinstance(value, Mapping | list | tuple | bool):
        raise ConfigError(f"exp.{key}: expected a string, got {value!r}")
    return str(value)


def _map(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a map, got {value!r}")
    return {str(k): v for k, v in value.items()}


def _list(raw: Mapping[str, Any], key: str, what: str) -> list[Any]:
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise ConfigError(f"exp.{key}: expected a list of {what}, got {value!r}")
    return list(value)


def _maps(raw: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = _list(raw, key, "maps")
    for item in items:
        if not isinstance(item, Mapping):
            raise ConfigError(f"exp.{key}: entry {item!r} is not a map")
    return items


def _seeds(value: Any) -> tuple[int, ...]:
    bad = ConfigError(f"exp.seeds: expected a list of integers, got {value!r}")
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise bad
    if not value:
        raise ConfigError("exp.seeds: an empty list runs no seed (give one or more: exp.seeds=[0])")
    for s in value:
        if isinstance(s, bool) or not isinstance(s, int | float) or not float(s).is_integer():
            raise bad
    return tuple(int(s) for s in value)
