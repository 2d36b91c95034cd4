"""Experiment runner: expand an experiment's grid into points, run them (in parallel), record points.csv.

An experiment (``conf/exp/NAME.yaml``, the ``exp.*`` keys of conf/config.yaml) names systems, a grid and
seeds.
Its points are ``seeds × systems × grid`` (cartesian over the grid keys, in their order); ``quick=true`` first
replaces what ``exp.quick`` says. Each point is a list of Hydra overrides (``system=NAME``, ``seed=S``,
``rps=2.0``,
``model@draft=X`` for the ``draft`` group, plus the system entry's own overrides) composed on top of the
user's
command-line overrides with Hydra's compose API. Points run through :func:`repro.simulate.run_point` in a
process
pool (``n_jobs``; 1 = in-process).

Files in the output directory:

``points.csv``
    One row per point: ``exp, system, seed``, the swept keys by name, the metrics of
    :data:`repro.metrics.POINT_METRICS` (minus ``sim_time_s``), extra metrics (sorted by name), then
    ``sim_time_s,
    wall_s, config_hash, code_version``. Each finished point is appended at once (one write of a full
    line), so a
    killed sweep loses only the points in flight; at the end the file is rewritten in grid order. Floats are
    written with :func:`fmt` (integral values as integers, others with 6 significant digits), so a seed
    gives a
    byte-identical file apart from ``wall_s``.
``manifest.json``
    The experiment's resolved config, overrides, git commit, code version, package versions, seeds, grid keys,
    n_jobs, quick, wall time, timestamps and the data-source notes the points reported.
``requests.parquet`` / ``steps.parquet``
    With ``save_requests=true``: every point's per-request table (and step trace, when recorded) with the
    point's
    keys and ``config_hash`` as extra columns.

``resume=true`` keeps rows whose ``(system, config_hash, code_version)`` match a point of this run and
computes the
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

import numpy as np
import pandas as pd
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from repro.errors import ConfigError, ReproError
from repro.metrics import POINT_METRICS

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"

#: Keys that control how a run is executed, not what it computes: left out of ``config_hash``.
RUN_CONTROL_KEYS = ("n_jobs", "resume", "out_dir", "quick", "save_requests", "exp", "hydra")
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
        raise ConfigError(f"{where}{one_line(exc)}") from None
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


@dataclass
class ExperimentResult:
    """What :func:`run_experiment` returns (points.csv as a DataFrame, the output dir, the manifest)."""

    name: str
    out_dir: Path
    points: pd.DataFrame
    manifest: dict[str, Any]
    num_run: int
    wall_s: float

    def summary_line(self) -> str:
        """One line for the terminal: ``NAME: N points in X s → DIR (best METRIC: ...)``."""
        line = f"{self.name}: {len(self.points)} points in {self.wall_s:.1f} s → {self.out_dir}/"
        best = _best(self.points, self.manifest.get("config", {}).get("exp", {}))
        return f"{line} ({best})" if best else line


def lower_is_better(metric: str) -> bool:
    """Latency-like metrics (``*_ms``, ``*_s`` durations, ``*latency*``) are better when lower."""
    duration = metric.endswith("_s") and not metric.endswith("_tok_s")
    return "latency" in metric or metric.endswith("_ms") or duration


def _best(points: pd.DataFrame, exp: Mapping[str, Any]) -> str:
    figures = exp.get("figures") or []
    metric = next((f.get("y") for f in figures if isinstance(f.get("y"), str)), "slo_attainment")
    if metric not in points.columns or "system" not in points.columns or points[metric].isna().all():
        return ""
    values = points[metric].to_numpy(dtype=float)
    lower = lower_is_better(metric)
    row = points.iloc[int(np.nanargmin(values) if lower else np.nanargmax(values))]
    where = " ".join(f"{k}={row[k]}" for k in grid_columns(exp) if k in points.columns)
    return f"best {metric}: {row[metric]:.4g} by {row['system']}" + (f" at {where}" if where else "")


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
        for note in out.notes:  # announce each data source once (e.g. an embedded fallback) in the log
            shape = re.sub(r"[0-9.]+", "#", note)  # notes differing only in numbers (rates) are said once
            if shape not in announced:
                announced.add(shape)
                tqdm.write(f"[data] {note}", file=sys.stderr)
        ctx.notes.extend(out.notes)
        if keep[out.index]:
            tables[out.index] = out
        return f"{p.describe()} slo={out.metrics.get('slo_attainment', float('nan')):.3g}"

    bar = tqdm(total=len(points), initial=len(points) - len(todo), desc=exp["name"], unit="pt", disable=None)

    def progress(out: Outcome) -> None:
        bar.set_postfix_str(record(out), refresh=False)
        bar.update()

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


def run_experiment(
    cfg: DictConfig, overrides: Sequence[str] = (), conf_dir: Path = CONF_DIR
) -> ExperimentResult:
    """Run the experiment ``cfg.exp`` describes and write its results (points.csv, manifest.json, figures,
    summary.md) to ``cfg.out_dir`` (default ``results/<exp.name>``).

    Args:
        cfg: the composed main config (conf/config.yaml + conf/exp/NAME.yaml + command-line overrides).
        overrides: the command-line overrides ``cfg`` was composed from (each point is composed from them
            plus its own); under @hydra.main, ``HydraConfig.get().overrides.task``.
        conf_dir: the Hydra config directory.
    """
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    exp_raw = to_dict(cfg.exp)
    unknown = sorted(set(exp_raw) - set(EXP_KEYS))
    if unknown:
        raise ConfigError(
            f"exp: unknown key(s) {', '.join('exp.' + k for k in unknown)} (known: {', '.join(EXP_KEYS)})"
        )
    quick = bool(cfg.get("quick"))
    exp, quick_overrides = apply_quick(exp_raw, quick)
    kind = str(exp.get("kind", "sweep"))
    if kind not in KINDS:
        raise ConfigError(f"exp.kind: unknown kind '{kind}' (known: {', '.join(KINDS)})")
    out_dir = Path(cfg.get("out_dir") or REPO_ROOT / "results" / str(exp["name"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    n_jobs = int(cfg.get("n_jobs") or os.cpu_count() or 1)
    ctx = RunContext(cfg, exp, list(overrides), conf_dir, out_dir, n_jobs, quick, quick_overrides)
    points, num_run = KINDS[kind](ctx)
    manifest = build_manifest(ctx, started, time.perf_counter() - t0)
    atomic_write_text(out_dir / "manifest.json", json.dumps(manifest, indent=2, default=str) + "\n")
    from repro import plot

    plot.render(out_dir, manifest, points)
    return ExperimentResult(str(exp["name"]), out_dir, points, manifest, num_run, time.perf_counter() - t0)


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
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 3),
        "config": resolved,
    }
