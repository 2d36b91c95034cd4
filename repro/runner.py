"""Experiment runner: expand an experiment's grid into points, run them (in parallel), record points.csv.

An experiment (``conf/exp/NAME.yaml``, the ``exp.*`` keys of conf/config.yaml) names systems, a grid and seeds. Its
points are ``seeds × systems × grid`` (cartesian over the grid keys, in their order); ``quick=true`` first replaces
what ``exp.quick`` says. Each point is a list of Hydra overrides (``system=NAME``, ``seed=S``, ``rps=2.0``,
``model@draft=X`` for the ``draft`` group, plus the system entry's own overrides) composed on top of the user's
command-line overrides with Hydra's compose API. Points run through :func:`repro.simulate.run_point` in a process
pool (``n_jobs``; 1 = in-process).

Files in the output directory:

``points.csv``
    One row per point: ``exp, system, seed``, the swept keys by name, the metrics of
    :data:`repro.metrics.POINT_METRICS` (minus ``sim_time_s``), extra metrics (sorted by name), then ``sim_time_s,
    wall_s, config_hash, code_version``. Each finished point is appended at once (one write of a full line), so a
    killed sweep loses only the points in flight; at the end the file is rewritten in grid order. Floats are written
    with :func:`fmt` (integral values as integers, others with 6 significant digits), so a seed gives a
    byte-identical file apart from ``wall_s``.
``manifest.json``
    The experiment's resolved config, overrides, git commit, code version, package versions, seeds, grid keys,
    n_jobs, quick, wall time, timestamps and the data-source notes the points reported.
``requests.parquet`` / ``steps.parquet``
    With ``save_requests=true``: every point's per-request table (and step trace, when recorded) with the point's
    keys and ``config_hash`` as extra columns.

``resume=true`` keeps rows whose ``(system, config_hash, code_version)`` match a point of this run and computes the
rest; a plain run truncates points.csv first.
"""

from __future__ import annotations

import csv
import fcntl
import functools
import hashlib
import io
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from repro import datasources, narrow
from repro.errors import ConfigError, ReproError
from repro.metrics import LATENCY_COLUMNS, POINT_METRICS
from repro.validate import check_keys, check_point, check_values

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"

#: Keys that control how a run is executed, not what it computes: left out of ``config_hash``.
RUN_CONTROL_KEYS = ("n_jobs", "resume", "out_dir", "quick", "save_requests", "case", "exp", "hydra")
#: ``exp.quick`` keys that replace the experiment's own; any other ``exp.quick`` key is a config override.
QUICK_EXP_KEYS = ("systems", "grid", "cases", "seeds", "figures", "claims")
#: Keys an ``exp`` block may have (a typo in an experiment file is an error, not a silently ignored key).
EXP_KEYS = ("name", "title", "description", "kind", "systems", "grid", "cases", "case_key", "seeds", "quick", "figures",
            "claims", "derived")
KEY_COLS = ("exp", "system", "seed")
TAIL_COLS = ("sim_time_s", "wall_s", "config_hash", "code_version")
CODE_DIRS = ("repro", "systems", "workloads")
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".csv", ".json")
HASH_LEN = 16


# ----------------------------------------------------------------------------------------------- points


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


@dataclass(frozen=True)
class SystemEntry:
    """An ``exp.systems`` entry: config name, the label shown in results, extra overrides."""

    name: str
    label: str
    overrides: tuple[tuple[str, Any], ...] = ()


def system_entries(systems: Sequence[Any]) -> list[SystemEntry]:
    """Normalize ``exp.systems`` (strings or ``{system, label, overrides}`` maps)."""
    out = []
    for entry in systems:
        if isinstance(entry, str):
            out.append(SystemEntry(entry, entry))
            continue
        if not isinstance(entry, Mapping) or "system" not in entry:
            raise ConfigError(f"exp.systems: entry {entry!r} is neither a name nor a map with a 'system' key")
        unknown = set(entry) - {"system", "label", "overrides"}
        if unknown:
            raise ConfigError(
                f"exp.systems: unknown key(s) {sorted(unknown)} in entry for {entry['system']!r}"
            )
        ov = entry.get("overrides") or {}
        out.append(
            SystemEntry(str(entry["system"]), str(entry.get("label") or entry["system"]), tuple(ov.items()))
        )
    labels = [e.label for e in out]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"exp.systems: duplicate labels {labels} (give each entry a distinct 'label')")
    return out


def apply_quick(exp: Mapping[str, Any], quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The experiment after ``quick`` (its ``exp.quick`` entries replace
    systems/grid/seeds/figures/claims) and
    the config overrides ``exp.quick`` adds to every point (e.g. ``num_requests: 100``)."""
    exp = dict(exp)
    extra: dict[str, Any] = {}
    if quick:
        for key, value in (exp.get("quick") or {}).items():
            if key in QUICK_EXP_KEYS:
                exp[key] = value
            else:
                extra[key] = value
    return exp, extra


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


def override(key: str, value: Any, groups: Mapping[str, str]) -> str:
    """The Hydra override setting ``key`` to ``value``: a group key selects a config (``draft`` →
    ``model@draft``)."""
    return f"{groups.get(key, key)}={format_value(value)}"


def _cases(exp: Mapping[str, Any]) -> list[tuple[str | None, dict[str, Any], dict[str, Any]]]:
    """``exp.cases`` as (label, overrides, grid) triples; without cases, one unlabelled case with ``exp.grid``.

    A case bundles settings that change together (e.g. a model with its tensor parallelism, its SLOs and its own
    request rates); its label becomes the ``exp.case_key`` column (default ``case``)."""
    grid = dict(exp.get("grid") or {})
    cases = exp.get("cases")
    if not cases:
        return [(None, {}, grid)]
    out: list[tuple[str | None, dict[str, Any], dict[str, Any]]] = []
    for case in cases:
        if not isinstance(case, Mapping) or "label" not in case:
            raise ConfigError(f"exp.cases: entry {case!r} needs a 'label'")
        unknown = set(case) - {"label", "overrides", "grid"}
        if unknown:
            raise ConfigError(f"exp.cases: unknown key(s) {sorted(unknown)} in case {case['label']!r}")
        out.append((str(case["label"]), dict(case.get("overrides") or {}), dict(case.get("grid") or grid)))
    return out


def grid_columns(exp: Mapping[str, Any]) -> list[str]:
    """The swept columns of points.csv: the case key (if any) then every grid key, in order."""
    cols: list[str] = []
    if exp.get("cases"):
        cols.append(str(exp.get("case_key") or "case"))
    for _, _, grid in _cases(exp):
        cols.extend(k for k in grid if k not in cols)
    return cols


def expand_points(
    exp: Mapping[str, Any], groups: Mapping[str, str], extra: Mapping[str, Any] | None = None
) -> list[Point]:
    """Points of an experiment: seeds × systems × cases × grid (cartesian over grid keys in order)."""
    cases = _cases(exp)
    case_key = str(exp.get("case_key") or "case")
    for _, _, grid in cases:
        for key in grid:
            if key in ("system", "seed", "exp", case_key if exp.get("cases") else "exp"):
                raise ConfigError(f"exp.grid: '{key}' cannot be a grid key (use exp.systems / exp.seeds)")
    base = [override(k, v, groups) for k, v in (extra or {}).items()]
    points: list[Point] = []
    for seed in exp.get("seeds") or [0]:
        for entry in system_entries(exp.get("systems") or []):
            for label, case_ov, grid in cases:
                axes = [list(v) if isinstance(v, list | tuple) else [v] for v in grid.values()]
                for combo in itertools.product(*axes):
                    swept = tuple(zip(grid, combo, strict=True))
                    values = swept if label is None else ((case_key, label), *swept)
                    ov = [
                        *base,
                        f"system={format_value(entry.name)}",
                        f"seed={int(seed)}",
                        *(override(k, v, groups) for k, v in case_ov.items()),
                        *(override(k, v, groups) for k, v in swept),
                        *(override(k, v, groups) for k, v in entry.overrides),
                    ]
                    points.append(Point(len(points), entry.label, int(seed), values, tuple(ov)))
    return points


# ------------------------------------------------------------------------------------------ composing


def to_dict(node: Any) -> dict[str, Any]:
    """A config node as a plain, resolved dict with string keys."""
    data = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping, got {data!r}")
    return {str(k): v for k, v in data.items()}


def one_line(exc: BaseException) -> str:
    """An exception's message squeezed onto one line (Hydra's messages span several)."""
    lines = []
    for ln in str(exc).splitlines():
        if ln.strip().startswith(("Config search path", "Set the environment variable HYDRA_FULL_ERROR")):
            break
        if ln.strip():
            lines.append(ln.strip())
    return " ".join(lines) if lines else type(exc).__name__


_NOT_IN_STRUCT = re.compile(r"Could not override '([^']+)'")


def explain(exc: BaseException, conf_dir: Path = CONF_DIR) -> str:
    """A Hydra composition error on one line; for a key no config has, say so and suggest the nearest key (Hydra's
    own hint, ``+key=value``, would add the typo as a new key that nothing reads)."""
    m = _NOT_IN_STRUCT.search(str(exc))
    if m:
        key = m.group(1)
        owners = _systems_with(key, conf_dir)
        if owners:  # a knob of some systems, not of the one composed (the default, or an experiment's base)
            shown = ", ".join(owners[:6]) + (f" and {len(owners) - 6} more" if len(owners) > 6 else "")
            return (f"{key}: a key of {shown}, not of the system this run composes; name the system too "
                    f"(system={owners[0]} {key}=...)")
        known = _dotted_keys(conf_dir)
        from repro.validate import suggest

        return f"{key}: not a config key{suggest(key, known)} (python -m repro list shows the config groups)"
    return one_line(exc)


def _systems_with(key: str, conf_dir: Path) -> list[str]:
    """The system configs (conf/system/*.yaml) that have ``key`` (``system.w_max``), by name."""
    if not key.startswith("system.") or not (conf_dir / "system").is_dir():
        return []
    out = []
    for path in sorted((conf_dir / "system").glob("*.yaml")):
        try:
            node = OmegaConf.load(path)
        except Exception:  # a broken file is reported when it is composed
            continue
        if OmegaConf.select(node, key.removeprefix("system."), default=None) is not None:
            out.append(path.stem)
    return out


@functools.lru_cache(maxsize=4)
def _dotted_keys(conf_dir: Path) -> tuple[str, ...]:
    """Every dotted key of conf/config.yaml plus the config group names."""
    node = OmegaConf.to_container(OmegaConf.load(conf_dir / "config.yaml"))
    out: list[str] = list(group_overrides(conf_dir))

    def walk(prefix: str, d: Any) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                if k not in ("defaults", "hydra"):
                    out.append(prefix + str(k))
                    walk(prefix + str(k) + ".", v)

    walk("", node)
    return tuple(out)


@contextmanager
def hydra_context(conf_dir: Path = CONF_DIR) -> Iterator[None]:
    """A Hydra compose context on ``conf_dir`` that restores any enclosing Hydra state (e.g.
    @hydra.main's)."""
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir.resolve()), version_base=None):
            yield
    finally:
        restore_gh_from_backup(backup)


def compose_config(overrides: Sequence[str], where: str = "") -> DictConfig:
    """Compose conf/config.yaml with ``overrides`` inside :func:`hydra_context`; config mistakes →
    ConfigError."""
    try:
        cfg = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"{where}{explain(exc)}") from None
    for key, name in group_overrides(CONF_DIR).items():
        node = cfg.get(key) if key in cfg else None
        if isinstance(node, str):  # e.g. draft=vicuna-160m replaced the group's config by a string
            raise ConfigError(f"{where}{key}={node}: '{key}' is a config group; select it with {name}={node}")
    return cfg


def config_hash(cfg: DictConfig) -> str:
    """Hash of a point's resolved config without the run-control keys (:data:`RUN_CONTROL_KEYS`)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    for key in RUN_CONTROL_KEYS:
        data.pop(key, None)
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LEN]


def code_version(conf_dir: Path = CONF_DIR, root: Path = REPO_ROOT) -> str:
    """Hash of the source files of repro/, systems/, workloads/ and the conf dir (not the git commit)."""
    h = hashlib.sha256()
    trees = [(root / d, d) for d in CODE_DIRS] + [(conf_dir, "conf")]
    for base, name in trees:
        if not base.is_dir():
            continue
        for path in sorted(
            p for p in base.rglob("*") if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts
        ):
            h.update(f"{name}/{path.relative_to(base).as_posix()}\0".encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:HASH_LEN]


# ---------------------------------------------------------------------------------------- points.csv


def fmt(value: Any) -> str:
    """Deterministic CSV text of a value: integral floats as integers, other floats with 6 significant
    digits."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        v = float(value)
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.6g}"
    return str(value)


def _csv_line(values: Sequence[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue()


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and os.replace (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class PointsFile:
    """points.csv while a sweep runs: a header, then one full line appended per finished point.

    Only the main process writes; each append is one ``write`` of a whole line under an exclusive file lock.
    A point reporting a metric missing from the header makes the file be rewritten with the wider header.
    """

    def __init__(self, path: Path, key_cols: Sequence[str]) -> None:
        self.path = path
        self.key_cols = list(key_cols)
        self.extras: list[str] = []
        self.rows: list[dict[str, str]] = []

    @property
    def columns(self) -> list[str]:
        metrics = [m for m in POINT_METRICS if m not in TAIL_COLS]
        return [*self.key_cols, *metrics, *self.extras, *TAIL_COLS]

    def read_existing(self) -> list[dict[str, str]]:
        """Complete rows of an existing file (a line cut by a kill is dropped)."""
        if not self.path.exists():
            return []
        with self.path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        return [r for r in rows if len(r.get("code_version") or "") == HASH_LEN and None not in r]

    def start(self, kept: list[dict[str, str]]) -> None:
        """Begin the file with the rows kept from a previous run (none for a plain run)."""
        self.rows = list(kept)
        self._widen({k for r in kept for k in r})
        self._rewrite(self.rows)

    def append(self, row: Mapping[str, Any]) -> dict[str, str]:
        """Record one finished point (formatted with :func:`fmt`) and return its text row."""
        text = {k: fmt(v) for k, v in row.items()}
        self.rows.append(text)
        if self._widen(set(text)):
            self._rewrite(self.rows)
        else:
            line = _csv_line([text.get(c, "") for c in self.columns])
            with self.path.open("a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                f.write(line)
                f.flush()
                fcntl.flock(f, fcntl.LOCK_UN)
        return text

    def finish(self, ordered: list[dict[str, str]]) -> None:
        """Rewrite the file with exactly ``ordered`` rows (grid order)."""
        self.extras = []
        self._widen({k for r in ordered for k in r})
        self._rewrite(ordered)

    def _widen(self, keys: set[str]) -> bool:
        new = keys - set(self.columns)
        if new:
            self.extras = sorted(set(self.extras) | new)
        return bool(new)

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        cols = self.columns
        text = _csv_line(cols) + "".join(_csv_line([r.get(c, "") for c in cols]) for r in rows)
        atomic_write_text(self.path, text)


# ------------------------------------------------------------------------------------------ running


@dataclass
class Outcome:
    """What a worker sends back for one point."""

    index: int
    metrics: dict[str, float]
    notes: list[str]
    wall_s: float
    requests: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    provenance: list[dict[str, Any]] = field(default_factory=list)


def run_one(index: int, cfg: DictConfig, keep_tables: bool) -> Outcome:
    """Simulate one point (in a worker or in-process); config mistakes come back as :class:`ConfigError`."""
    from repro import simulate

    t0 = time.perf_counter()
    try:
        res = simulate.run_point(cfg)
    except ReproError:
        raise
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(one_line(exc)) from None
    wall = time.perf_counter() - t0
    return Outcome(
        index,
        dict(res.metrics),
        list(res.notes),
        wall,
        res.requests if keep_tables else None,
        res.steps if keep_tables else None,
        list(res.provenance),
    )


@dataclass
class RunContext:
    """Everything an experiment kind needs."""

    cfg: DictConfig
    exp: dict[str, Any]
    overrides: list[str]
    conf_dir: Path
    out_dir: Path
    n_jobs: int
    quick: bool
    quick_overrides: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)  # every point's workload DataSource entries
    narrowed: list[str] = field(default_factory=list)  # one line per narrowing the command line made
    shown_overrides: list[str] = field(default_factory=list)  # the command line, minus run-control keys
    progress: Callable[[], None] | None = None  # an outer progress bar (repro all) instead of this run's own


@dataclass
class ExperimentResult:
    """What :func:`run_experiment` returns (points.csv as a DataFrame, the output dir, the manifest)."""

    name: str
    out_dir: Path
    points: pd.DataFrame
    manifest: dict[str, Any]
    num_run: int
    wall_s: float
    verdicts: dict[str, int] = field(default_factory=dict)  # claims: holds / differs / n/a -> count

    def summary_line(self) -> str:
        """The closing line: points, wall time, paper claims held and differing, the data, where summary.md is."""
        systems = list(self.manifest.get("systems") or [])
        shown = ", ".join(systems[:6]) + (f" and {len(systems) - 6} more" if len(systems) > 6 else "")
        parts = [f"{self.name}: {len(self.points)} points" + (f" of {shown}" if shown else "")
                 + f" in {self.wall_s:.1f} s"]
        if self.num_run < len(self.points):
            parts[0] += f" ({len(self.points) - self.num_run} resumed)"
        if self.verdicts:
            v = self.verdicts
            claims = f"paper claims: {v.get('holds', 0)} hold, {v.get('differs', 0)} differ"
            if v.get("n/a"):
                claims += f", {v['n/a']} not computable here"
            parts.append(claims)
        sources = self.manifest.get("data") or []
        if sources:
            parts.append(f"data: {datasources.short(sources)}")
        return "; ".join(parts) + f" -> {display_path(self.out_dir / 'summary.md')}"


def display_path(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it (what a user can paste), else as is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def claim_verdicts(exp: Mapping[str, Any], points: pd.DataFrame, grid: Sequence[str]) -> dict[str, int]:
    """How many of the experiment's paper claims hold, differ, or cannot be computed from ``points``."""
    specs = exp.get("claims") or []
    if not specs or points.empty:
        return {}
    from repro import claims

    table = claims.evaluate(specs, points, grid[0] if grid else None)
    return {str(k): int(n) for k, n in table["verdict"].value_counts().items()}


def run_sweep(ctx: RunContext) -> tuple[pd.DataFrame, int]:
    """Run the grid's points (skipping resumed ones) and write points.csv; returns it and the number run."""
    exp = ctx.exp
    groups = group_overrides(ctx.conf_dir)
    points = expand_points(exp, groups)
    # exp.quick's config overrides come first, so the user's command line still wins over them.
    base = [*(override(k, v, groups) for k, v in ctx.quick_overrides.items()), *ctx.overrides]
    with hydra_context(ctx.conf_dir):
        cfgs = [compose_config([*base, *p.overrides], where=f"point {p.describe()}: ") for p in points]
    hashes = [config_hash(c) for c in cfgs]
    checked: set[str] = set()
    for p, c, h in zip(points, cfgs, hashes, strict=True):  # refuse an impossible point before anything runs
        if h not in checked:
            checked.add(h)
            check_point(c, where=f"point {p.describe()}: ")
    version = code_version(ctx.conf_dir)
    pf = PointsFile(ctx.out_dir / "points.csv", [*KEY_COLS, *grid_columns(exp)])
    wanted = {(p.system, h) for p, h in zip(points, hashes, strict=True)}
    done: dict[tuple[str, str], dict[str, str]] = {}
    if ctx.cfg.get("resume"):
        for r in pf.read_existing():
            if (r["system"], r["config_hash"]) in wanted and r["code_version"] == version:
                done[(r["system"], r["config_hash"])] = r
    kept_hashes = {h for _, h in done}
    pf.start(list(done.values()))
    todo = [i for i, p in enumerate(points) if (p.system, hashes[i]) not in done]
    keep = [bool(c.get("save_requests")) for c in cfgs]  # per point: a case may turn it off
    keep_tables = any(keep)
    tables: dict[int, Outcome] = {}

    announced: set[str] = set()

    def record(out: Outcome) -> str:
        p = points[out.index]
        row = {**p.keys(exp["name"]), **out.metrics, "wall_s": out.wall_s}
        row.update(config_hash=hashes[out.index], code_version=version)
        done[(p.system, hashes[out.index])] = pf.append(row)
        for src in datasources.collect(out.provenance):  # each data source once, a fallback loudly
            key = repr(sorted(src.items()))
            if key not in announced:
                announced.add(key)
                loud = "WARNING, not the real file: " if src["fallback"] else ""
                tqdm.write(f"[data] {loud}{src['dataset']}: {src['detail']}", file=sys.stderr)
        ctx.notes.extend(out.notes)
        ctx.sources.extend(out.provenance)
        if keep[out.index]:
            tables[out.index] = out
        return f"{p.describe()} slo={out.metrics.get('slo_attainment', float('nan')):.3g}"

    outer = ctx.progress
    bar = tqdm(total=len(points), initial=len(points) - len(todo), desc=exp["name"], unit="pt",
               disable=True if outer else None)
    lines = ProgressLines(exp["name"], len(points), len(points) - len(todo), enabled=bool(bar.disable) and not outer)
    if outer:
        for _ in range(len(points) - len(todo)):
            outer()

    def progress(out: Outcome) -> None:
        bar.set_postfix_str(record(out), refresh=False)
        bar.update()
        lines.update()
        if outer:
            outer()

    try:
        _execute(todo, cfgs, keep, ctx.n_jobs, progress)
    finally:
        bar.close()
    # points whose configs coincide (the same values reached from two cases) share one result, each row under its
    # own keys (e.g. the case label)
    blank = dict.fromkeys(grid_columns(exp), "")
    rows = [{**done[(p.system, h)], **blank, **{k: fmt(v) for k, v in p.keys(exp["name"]).items()}}
            for p, h in zip(points, hashes, strict=True)]
    pf.finish(derive(rows, exp.get("derived") or [], [SEED_KEY, *grid_columns(exp)]))
    if keep_tables:
        _save_tables(ctx, exp["name"], points, hashes, tables, kept_hashes)
    return pd.read_csv(pf.path), len(todo)


SEED_KEY = "seed"


class ProgressLines:
    """Progress for a log file or a pipe (where tqdm's bar is off): a line every ``every_s`` seconds of wall time
    and at the end, ``NAME: 30/90 points, 35 s elapsed, about 70 s left``."""

    def __init__(self, name: str, total: int, done: int = 0, enabled: bool = True, every_s: float = 10.0) -> None:
        self.name, self.total, self.done, self.enabled, self.every_s = name, total, done, enabled, every_s
        self.t0 = self.last = time.perf_counter()
        self.start = done

    def update(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if not self.enabled or (now - self.last < self.every_s and self.done < self.total):
            return
        self.last = now
        elapsed = now - self.t0
        ran = self.done - self.start
        rest = self.total - self.done
        left = f", about {elapsed / ran * rest:.0f} s left" if ran >= max(3, self.total // 20) and rest else ""
        print(f"{self.name}: {self.done}/{self.total} points, {elapsed:.0f} s elapsed{left}", file=sys.stderr,
              flush=True)


def derive(rows: list[dict[str, str]], specs: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> list[dict[str, str]]:
    """Add ``exp.derived`` columns to the finished rows. Two forms:

    - ``{name, metric, baseline, invert}``: the row's ``metric`` divided by the ``baseline`` system's at the same
      seed and grid values (``invert``: the baseline's divided by the row's, e.g. a speedup from latencies);
    - ``{name, metric, normalize: COLUMN}``: the row's ``metric`` divided by the largest ``metric`` among the rows
      of the same system, seed and grid values that differ only in ``COLUMN`` (e.g. goodput as a fraction of the
      best proposed length's, TurboSpec Fig. 5).
    """
    out = [dict(r) for r in rows]
    for spec in specs:
        unknown = set(spec) - {"name", "metric", "baseline", "invert", "normalize"}
        has_ref = ("baseline" in spec) != ("normalize" in spec)
        if unknown or not {"name", "metric"} <= set(spec) or not has_ref:
            raise ConfigError(
                f"exp.derived: entry {dict(spec)} needs name, metric and either baseline (and optional invert) "
                "or normalize"
            )
        metric, name = str(spec["metric"]), str(spec["name"])
        if "normalize" in spec:
            over = str(spec["normalize"])
            if over not in keys:
                raise ConfigError(f"exp.derived[{name}].normalize: '{over}' is not a grid column ({list(keys)})")
            group = ["system", *(k for k in keys if k != over)]
            best: dict[tuple[str, ...], float] = {}
            for r in out:
                g = tuple(r.get(k, "") for k in group)
                v = _as_float(r.get(metric, ""))
                if v == v:  # not NaN
                    best[g] = max(best.get(g, v), v)
            for r in out:
                ref = best.get(tuple(r.get(k, "") for k in group), float("nan"))
                r[name] = fmt(_as_float(r.get(metric, "")) / ref if ref else float("nan"))
            continue
        base = str(spec["baseline"])
        ref_rows = {tuple(r.get(k, "") for k in keys): r.get(metric, "") for r in out if r["system"] == base}
        for r in out:
            try:
                mine, theirs = float(r[metric]), float(ref_rows[tuple(r.get(k, "") for k in keys)])
                value = theirs / mine if spec.get("invert") else mine / theirs
            except (KeyError, ValueError, ZeroDivisionError):
                value = float("nan")
            r[name] = fmt(value)
    return out


def _as_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _execute(
    todo: list[int], cfgs: list[DictConfig], keep: Sequence[bool], n_jobs: int, on_done: Callable[[Outcome], Any]
) -> None:
    """Run points ``todo`` in-process (n_jobs=1) or in a process pool (``keep[i]``: return point i's tables);
    ``on_done`` gets each outcome as it ends."""
    if n_jobs <= 1 or len(todo) <= 1:
        for i in todo:
            on_done(run_one(i, cfgs[i], keep[i]))
        return
    with ProcessPoolExecutor(max_workers=min(n_jobs, len(todo))) as pool:
        pending: set[Future[Outcome]] = {pool.submit(run_one, i, cfgs[i], keep[i]) for i in todo}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for fut in finished:
                    on_done(fut.result())
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


def _save_tables(
    ctx: RunContext,
    name: str,
    points: list[Point],
    hashes: list[str],
    tables: dict[int, Outcome],
    kept_hashes: set[str],
) -> None:
    """requests.parquet (and steps.parquet if traces exist): new points' tables + kept rows of resumed
    points."""
    for attr, fname in (("requests", "requests.parquet"), ("steps", "steps.parquet")):
        parts = []
        for i, out in sorted(tables.items()):
            df = getattr(out, attr)
            if df is not None:
                df = df.drop(columns=[c for c in LATENCY_COLUMNS if c in df.columns])  # derived on load
                keys = {**points[i].keys(name), "config_hash": hashes[i]}
                parts.append(df.assign(**keys)[[*keys, *df.columns]])
        path = ctx.out_dir / fname
        if kept_hashes and path.exists():
            old = pd.read_parquet(path)
            parts.insert(0, old[old["config_hash"].isin(kept_hashes)])
        if parts:
            tmp = path.with_name(f".{fname}.tmp")
            pd.concat(parts, ignore_index=True).to_parquet(tmp, index=False, compression="zstd")
            os.replace(tmp, path)


def run_calibration(ctx: RunContext) -> tuple[pd.DataFrame, int]:
    """The cost model's calibration table (no simulation) as points.csv."""
    try:
        from repro.cost.calibration import calibration_table
    except ImportError as exc:
        raise ReproError(
            f"exp.kind=calibration needs repro.cost.calibration.calibration_table ({exc})"
        ) from None
    table = calibration_table().reset_index(drop=True)
    if "within_tol" not in table.columns:
        table["within_tol"] = table["rel_err"].abs() <= table["tolerance"]
    text = _csv_line(list(table.columns)) + "".join(
        _csv_line([fmt(v) for v in row]) for row in table.itertuples(index=False)
    )
    path = ctx.out_dir / "points.csv"
    atomic_write_text(path, text)
    return pd.read_csv(path), len(table)


#: Experiment kinds: ``exp.kind`` → function running it and returning (points, number of points computed).
KINDS: dict[str, Callable[[RunContext], tuple[pd.DataFrame, int]]] = {
    "sweep": run_sweep,
    "calibration": run_calibration,
}


def default_out_dir(name: str, quick: bool, root: Path = REPO_ROOT) -> Path:
    """Where a user's run writes when ``out_dir`` is not given: ``runs/NAME`` (``runs/quick/NAME``), an untracked
    folder. Only the regeneration commands (``repro all``, ``repro check --update``) write ``results/``."""
    return root / "runs" / ("quick" if quick else "") / name


RESULTS_DIR = REPO_ROOT / "results"


def reference_dir(name: str, quick: bool, results: Path = RESULTS_DIR) -> Path:
    """The committed reference of an experiment: ``results/NAME`` (``results/quick/NAME`` for quick mode)."""
    return results / ("quick" if quick else "") / name


def known_top_keys(conf_dir: Path, exp_name: str | None) -> set[str]:
    """Top-level keys some config defines: conf/config.yaml's, the config groups, and the experiment file's."""
    known = set(group_overrides(conf_dir)) | {"exp", "hydra"}
    for path in [conf_dir / "config.yaml", *([conf_dir / "exp" / f"{exp_name}.yaml"] if exp_name else [])]:
        if path.is_file():
            node = OmegaConf.load(path)
            if isinstance(node, DictConfig):
                known |= {str(k) for k in node if k != "defaults"}
    return known


def run_experiment(
    cfg: DictConfig,
    overrides: Sequence[str] = (),
    conf_dir: Path = CONF_DIR,
    out_dir: Path | None = None,
    log: Callable[[str], None] | None = None,
    progress: Callable[[], None] | None = None,
) -> ExperimentResult:
    """Run the experiment ``cfg.exp`` describes and write its results (points.csv, manifest.json, figures,
    summary.md) to ``out_dir``, else ``cfg.out_dir``, else :func:`default_out_dir`.

    Args:
        cfg: the composed main config (conf/config.yaml + conf/exp/NAME.yaml + command-line overrides).
        overrides: the command-line overrides ``cfg`` was composed from (each point is composed from them
            plus its own); under @hydra.main, ``HydraConfig.get().overrides.task``. They narrow the experiment
            (:mod:`repro.narrow`): a swept key's value runs that value only, ``system=NAME`` that system only.
        conf_dir: the Hydra config directory.
        out_dir: the output folder (the regeneration commands pass the reference folder).
        log: where the narrowing lines go (default: stderr).
        progress: called once per finished point instead of drawing this run's own progress bar.
    """
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    exp_raw = to_dict(cfg.exp)
    unknown = sorted(set(exp_raw) - set(EXP_KEYS))
    if unknown:
        raise ConfigError(
            f"exp: unknown key(s) {', '.join('exp.' + k for k in unknown)} (known: {', '.join(EXP_KEYS)})"
        )
    groups = group_overrides(conf_dir)
    user = narrow.parse(overrides, cfg, groups)
    exp_name = next((str(u.value) for u in user if u.key == "exp"), None)
    check_keys([u.key for u in user if u.added and not u.group], known_top_keys(conf_dir, exp_name))
    quick = bool(cfg.get("quick"))
    exp, quick_overrides = apply_quick(exp_raw, quick)
    check_values(cfg, exp, first=[u.key for u in user])
    check_data_root(cfg)
    narrowed = narrow.narrow(exp, user)
    exp = narrowed.exp
    for line in narrowed.lines:
        say(f"narrowed: {line}")
    kind = str(exp.get("kind", "sweep"))
    if kind not in KINDS:
        raise ConfigError(f"exp.kind: unknown kind '{kind}' (known: {', '.join(KINDS)})")
    out = Path(out_dir or cfg.get("out_dir") or default_out_dir(str(exp["name"]), quick))
    out.mkdir(parents=True, exist_ok=True)
    n_jobs = int(cfg.get("n_jobs") or os.cpu_count() or 1)
    ctx = RunContext(cfg, exp, list(overrides), conf_dir, out, n_jobs, quick, quick_overrides)
    ctx.narrowed = narrowed.lines
    ctx.progress = progress
    ctx.shown_overrides = [u.text for u in user if u.key not in narrow.RUN_KEYS]
    points, num_run = KINDS[kind](ctx)
    manifest = build_manifest(ctx, started, time.perf_counter() - t0)
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2, default=str) + "\n")
    warning = datasources.warning(manifest["data"])
    if warning:
        say(warning)
    from repro import plot

    plot.render(out, manifest, points)
    verdicts = claim_verdicts(exp, points, grid_columns(exp)) if kind == "sweep" else {}
    return ExperimentResult(str(exp["name"]), out, points, manifest, num_run, time.perf_counter() - t0, verdicts)


def check_data_root(cfg: DictConfig) -> None:
    """``$REPRO_DATA`` (or ``workload.data_dir``) must name an existing folder when set (a typo is an error, not a
    silent switch to the embedded statistics)."""
    from workloads import check_data_root as check

    check(OmegaConf.select(cfg, "workload.data_dir", default=None))


# ------------------------------------------------------------------------------------------- manifest


def git_commit(root: Path = REPO_ROOT) -> str | None:
    """The repository's HEAD commit, or None outside a git checkout."""
    try:
        res = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    """Versions of python and the packages that shape results."""
    from importlib import metadata

    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for dist in ("numpy", "pandas", "hydra-core", "omegaconf", "specrepro"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def build_manifest(ctx: RunContext, started: datetime, wall_s: float) -> dict[str, Any]:
    """manifest.json's content (see the module docstring)."""
    resolved = to_dict(ctx.cfg)
    resolved["exp"] = ctx.exp
    return {
        "exp": ctx.exp["name"],
        "kind": ctx.exp.get("kind", "sweep"),
        "title": ctx.exp.get("title", ""),
        "grid_keys": grid_columns(ctx.exp),
        "systems": [e.label for e in system_entries(ctx.exp.get("systems") or [])],
        "seeds": list(ctx.exp.get("seeds") or []),
        "quick": ctx.quick,
        "n_jobs": ctx.n_jobs,
        "overrides": ctx.overrides,
        "git_commit": git_commit(),
        "code_version": code_version(ctx.conf_dir),
        "versions": package_versions(),
        "notes": list(dict.fromkeys(ctx.notes)),
        "data": datasources.collect(ctx.sources),
        "command_line": ctx.shown_overrides,
        "narrowed": ctx.narrowed,
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 3),
        "config": resolved,
    }
