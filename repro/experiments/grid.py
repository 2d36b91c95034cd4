"""Grid expansion: an experiment's points, each a list of Hydra overrides.

The points of an :class:`~repro.experiments.expspec.ExpSpec` are ``seeds × systems × cases × grid``
(:func:`expand_points`): for each seed, each system label in order of first appearance, each case that runs a system of
that label (a case's own ``systems`` replace the experiment's), the cartesian product of the case's grid values (over
its keys, in their order). A point is a list of Hydra overrides: ``system=NAME``, ``seed=S``, the case's overrides, the
swept values (``rps=2.0``; a key that names a config group selects a config, ``draft`` → ``model@draft=X``,
:func:`group_overrides`) and the system entry's own overrides, in that order; the runner composes them on top of the
command line's overrides. Values are written in Hydra's override grammar by :func:`format_value`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from repro.experiments.expspec import ExpSpec


@dataclass(frozen=True)
class Point:
    """One simulation of an experiment: a system (label) × seed × grid values, as Hydra overrides."""

    index: int
    system: str
    seed: int
    values: tuple[tuple[str, Any], ...]
    overrides: tuple[str, ...]

    def keys(self, exp_name: str) -> dict[str, Any]:
        """The point's identifying columns (``exp, system, seed`` and the swept values)."""
        return {"exp": exp_name, "system": self.system, "seed": self.seed, **dict(self.values)}

    def describe(self) -> str:
        """Short human-readable label, e.g. ``vllm seed=0 rps=2.0``."""
        return " ".join([self.system, f"seed={self.seed}", *(f"{k}={v}" for k, v in self.values)])


def expand_points(spec: ExpSpec, groups: Mapping[str, str], extra: Mapping[str, Any] | None = None) -> list[Point]:
    """Points of an experiment: seeds × systems × cases × grid (see the module docstring).

    ``extra`` overrides come first in every point.
    """
    base = [override(k, v, groups) for k, v in (extra or {}).items()]
    cases = spec.case_list()
    points: list[Point] = []
    for seed in spec.run_seeds():
        for label in spec.system_labels():
            for case in cases:
                entry = case.entry(label)
                if entry is None:
                    continue
                axes = [list(v) if isinstance(v, list | tuple) else [v] for v in case.grid.values()]
                for combo in itertools.product(*axes):
                    swept = tuple(zip(case.grid, combo, strict=True))
                    values = (*case.columns.items(), *swept)
                    values = values if case.label is None else ((spec.case_key, case.label), *values)
                    ov = [
                        *base,
                        f"system={format_value(entry.name)}",
                        f"seed={int(seed)}",
                        *(override(k, v, groups) for k, v in case.overrides.items()),
                        *(override(k, v, groups) for k, v in swept),
                        *(override(k, v, groups) for k, v in entry.overrides),
                    ]
                    points.append(Point(len(points), entry.label, int(seed), values, tuple(ov)))
    return points


def by_workload(points: Sequence[Point], indices: Iterable[int]) -> list[int]:
    """Points ``indices`` reordered so that those of one seed and one set of grid values (the same requests, served
    by each system of the sweep) run one after another, the groups in order of first appearance. Results do not
    depend on the order; a worker then finds the oracle's chunks of those requests in its memo
    (:data:`repro.oracle.store.MEMO`) instead of drawing them again for each system."""
    groups: dict[tuple[int, str], list[int]] = {}
    for i in indices:
        p = points[i]
        groups.setdefault((p.seed, repr(p.values)), []).append(i)
    return [i for group in groups.values() for i in group]


def group_overrides(conf_dir: Path) -> dict[str, str]:
    """Map a config key that names a config group to its override name, from config.yaml's defaults list:
    ``{"model": "model", "draft": "model@draft", "hardware": "hardware", ...}``."""
    return dict(_group_overrides(Path(conf_dir).resolve()))


@functools.lru_cache(maxsize=8)
def _group_overrides(conf_dir: Path) -> tuple[tuple[str, str], ...]:
    main = OmegaConf.to_container(OmegaConf.load(conf_dir / "config.yaml"))
    defaults = main.get("defaults", []) if isinstance(main, dict) else []
    out: dict[str, str] = {}
    for entry in defaults:
        if not isinstance(entry, dict):
            continue
        for name in entry:
            if name.startswith("override ") or name.startswith("hydra/"):
                continue
            group, _, package = name.partition("@")
            out[package or group] = name
    for sub in sorted(p.name for p in conf_dir.iterdir() if p.is_dir()):
        out.setdefault(sub, sub)
    out.pop("exp", None)
    return tuple(out.items())


def override(key: str, value: Any, groups: Mapping[str, str]) -> str:
    """The Hydra override setting ``key`` to ``value``: a group key selects a config (``draft`` →
    ``model@draft``)."""
    return f"{groups.get(key, key)}={format_value(value)}"


_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./")
_KEYWORDS = {"true", "false", "null", "inf", "nan", "-inf", "+inf"}


def format_value(value: Any) -> str:
    """A Python value in Hydra's override grammar (``2.0``, ``true``, ``null``, ``'a b'``, ``[1,2]``,
    ``{a:1}``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    text = str(value)
    if text and set(text) <= _SAFE and text.lower() not in _KEYWORDS and not _is_number(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
