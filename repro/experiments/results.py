"""Result files: what an experiment writes to its folder, and where its folders are.

Files in the output directory:

``points.csv``
    One row per point: ``exp, system, seed``, the swept keys by name, the metrics of
    :data:`repro.metrics.summary.POINT_METRICS` (minus ``sim_time_s`` and a swept key's name, e.g.
    ``num_requests``: one column each), extra metrics and derived columns (sorted by name), then
    ``sim_time_s, wall_s, config_hash, code_version``. :class:`PointsFile` appends each finished point at
    once (one write of a full line, under a file lock), so a killed sweep loses only the points in flight, and rewrites
    the file in grid order at the end. Floats are written with :func:`fmt` (integral values as integers, others with 6
    significant digits), so a seed gives a byte-identical file apart from ``wall_s``.
``manifest.json``
    The experiment's resolved config, overrides, git commit, code version, package versions, seeds, grid keys,
    n_jobs, quick, wall time, timestamps, the data-source notes the points reported and each system's engine profile
    (:func:`build_manifest`; :func:`engines_line` says when they differ).
``requests.parquet`` / ``steps.parquet`` / ``rounds.parquet``
    With ``save_requests=true``: every point's per-request table (and step or round trace, when recorded) with the
    point's keys and ``config_hash`` as extra columns (a key replaces a column of the same name, e.g. a case key
    ``dataset``), without the columns that follow from others
    (:data:`repro.metrics.derived.TABLE_COLUMNS`, added again on load) (:func:`save_tables`). Floats are stored as
    float32 (timestamps to ≈ 10 µs at 200 s simulated; points.csv is computed before, from the float64 tables), which
    keeps a reference's per-request table under 1 MB.

``config_hash`` identifies a point's resolved config (without the run-control keys, :data:`RUN_CONTROL_KEYS`) and
``code_version`` the source files that produced it (not the git commit); resume keeps a row when both match. Every
file is written through a temporary file and ``os.replace`` (:func:`atomic_write_text`), so a reader never sees half
of one. A user's run goes to ``runs/NAME``, a narrowed one beside it (:func:`default_out_dir`); the committed
references live in ``results/NAME`` (:func:`reference_dir`). :func:`earlier_run` reads what a folder already holds,
so that a run does not replace another one unasked.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from repro.experiments import datasources
from repro.experiments.expspec import ExpSpec
from repro.metrics.derived import TABLE_COLUMNS, Derived, with_derived
from repro.metrics.summary import POINT_METRICS

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
RESULTS_DIR = REPO_ROOT / "results"

#: Keys that control how a run is executed, not what it computes: left out of ``config_hash``.
RUN_CONTROL_KEYS = ("n_jobs", "launcher", "resume", "overwrite", "out_dir", "quick", "save_requests", "save_columns",
                    "save_step_columns", "case", "exp", "hydra")
KEY_COLS = ("exp", "system", "seed")
#: Keys of a system config that say how it is shown (legends, line style), not what it does: neither the policy's
#: arguments nor part of a point's config hash.
DISPLAY_KEYS = ("display_name", "variant")
TAIL_COLS = ("sim_time_s", "wall_s", "config_hash", "code_version")
CODE_DIRS = ("repro", "systems", "workloads")
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".csv", ".json")
HASH_LEN = 16


# ------------------------------------------------------------------------------------------- folders


#: the longest ``@...`` part of a run's default folder name spelled out in full; a longer one keeps its start and
#: ends in a hash of the whole (:func:`default_out_dir`)
NAME_CHANGES_LEN = 64


def default_out_dir(name: str, quick: bool, changes: Sequence[str] = (), root: Path = REPO_ROOT) -> Path:
    """Where a user's run writes when ``out_dir`` is not given: ``runs/NAME`` (``runs/quick/NAME``), an untracked
    folder; a run whose command line changes anything (``changes``: its ``key=value`` settings, the run-control keys
    left out) writes beside it, to ``runs/NAME@key=value,...`` (sorted; characters other than letters, digits and
    ``._+-=`` become ``_``), so two command lines that compute different things never meet in one folder. Where that
    part would be longer than :data:`NAME_CHANGES_LEN`, its start is kept and a hash of the whole ends it
    (``runs/default@exp.systems=_vllm_static_sd_k3_,workload.arrival.ra~3f9c0a1b``). Only the regeneration commands
    (``repro all``, ``repro check --update``) write ``results/``."""
    if changes:
        part = ",".join(sorted(re.sub(r"[^A-Za-z0-9._+=-]", "_", c) for c in changes))
        if len(part) > NAME_CHANGES_LEN:
            part = part[:NAME_CHANGES_LEN - 9] + "~" + hashlib.sha256(part.encode()).hexdigest()[:8]
        name += "@" + part
    return root / "runs" / ("quick" if quick else "") / name


def setting_text(value: Any) -> str:
    """A command-line value as it names a folder: numbers as :func:`fmt` writes them, lists and maps compactly."""
    if isinstance(value, list | tuple):
        return "[" + ",".join(setting_text(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{setting_text(v)}" for k, v in value.items()) + "}"
    return fmt(value)


def reference_dir(name: str, quick: bool, results: Path = RESULTS_DIR) -> Path:
    """The committed reference of an experiment: ``results/NAME`` (``results/quick/NAME`` for quick mode)."""
    return results / ("quick" if quick else "") / name


def display_path(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it (what a user can paste), else as is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# -------------------------------------------------------------------------------------------- hashes


def config_hash(cfg: DictConfig) -> str:
    """Hash of a point's resolved config without the run-control keys (:data:`RUN_CONTROL_KEYS`)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return dict_hash({str(k): v for k, v in data.items()})


def dict_hash(data: Mapping[str, Any]) -> str:
    """:func:`config_hash` of a plain resolved config (e.g. a manifest's ``config``)."""
    data = {k: v for k, v in data.items() if k not in RUN_CONTROL_KEYS}
    engine = data.get("engine")
    if isinstance(engine, dict) and "check_invariants" in engine:  # checking a run does not change what it computes
        data["engine"] = {k: v for k, v in engine.items() if k != "check_invariants"}
    if data.get("backend") == {"kind": "sim"}:  # the default backend: hashes as before backends existed
        data.pop("backend")
    system = data.get("system")
    if isinstance(system, dict) and any(k in system for k in DISPLAY_KEYS):  # how a system is shown is not a run
        data["system"] = {k: v for k, v in system.items() if k not in DISPLAY_KEYS}
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


def csv_line(values: Sequence[str]) -> str:
    """One CSV line (quoted where needed, ending in a newline)."""
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
        # a swept key named like a metric (``num_requests``) is one column, where the keys are: the row has one value
        metrics = [m for m in POINT_METRICS if m not in TAIL_COLS and m not in self.key_cols]
        return [*self.key_cols, *metrics, *self.extras, *TAIL_COLS]

    def read_existing(self) -> list[dict[str, str]]:
        """Complete rows of an existing file (a line cut by a kill is dropped)."""
        if not self.path.exists():
            return []
        with self.path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        return [r for r in rows if _complete(r)]

    def start(self, kept: list[dict[str, str]]) -> None:
        """Begin the file (and its folder) with the rows kept from a previous run (none for a plain run)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
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
            line = csv_line([text.get(c, "") for c in self.columns])
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
        text = csv_line(cols) + "".join(csv_line([r.get(c, "") for c in cols]) for r in rows)
        atomic_write_text(self.path, text)


def _complete(row: Mapping[str, Any]) -> bool:
    """A points.csv row written whole (not a line cut by a kill)."""
    return len(row.get("code_version") or "") == HASH_LEN and None not in row


@dataclass(frozen=True, slots=True)
class EarlierRun:
    """The run a results folder already holds (:func:`earlier_run`)."""

    exp: str
    keys: frozenset[tuple[str, str]]  # a sweep's (system, config_hash) per point; else one (kind, config hash)
    sweep: bool


def earlier_run(folder: Path) -> EarlierRun | None:
    """The run ``folder`` holds, or None when it holds none (no points.csv rows and no manifest.json).

    A sweep's points are the ``(system, config_hash)`` of its complete rows; a kind whose points.csv has no config
    hashes (calibration, memory) is one key: its manifest's kind and the :func:`dict_hash` of its config."""
    rows: list[dict[str, str]] = []
    cols: list[str] = []
    if (folder / "points.csv").is_file():
        with (folder / "points.csv").open(newline="") as f:
            reader = csv.DictReader(f)
            rows, cols = list(reader), list(reader.fieldnames or [])
    try:
        meta = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    exp = str(meta.get("exp") or (rows[0].get("exp") if rows else "") or "?")
    if "config_hash" in cols:
        keys = frozenset((r["system"], r["config_hash"]) for r in rows if _complete(r))
        return EarlierRun(exp, keys, True) if keys else None
    if not rows and not meta:
        return None
    config = meta.get("config")
    return EarlierRun(exp, frozenset({(str(meta.get("kind")), dict_hash(config if isinstance(config, dict) else {}))}),
                      False)


def write_table(path: Path, table: pd.DataFrame) -> None:
    """A whole table as points.csv (every cell through :func:`fmt`), e.g. the calibration table; makes the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = csv_line(list(table.columns)) + "".join(
        csv_line([fmt(v) for v in row]) for row in table.itertuples(index=False)
    )
    atomic_write_text(path, text)


# ------------------------------------------------------------------------------------------- tables


#: The per-point tables :func:`save_tables` writes, in the order of their frames in its ``tables`` tuples.
TABLE_FILES = ("requests.parquet", "steps.parquet", "rounds.parquet")


def save_tables(
    out_dir: Path,
    tables: Sequence[tuple[Mapping[str, Any], pd.DataFrame | None, pd.DataFrame | None, pd.DataFrame | None]],
    kept_hashes: set[str],
) -> None:
    """requests.parquet (and steps.parquet / rounds.parquet if traces exist): the rows an earlier run saved for the
    points resumed (``kept_hashes``), then per point just run, in point order, its table with its key columns (and
    ``config_hash``) in front; ``tables`` holds (keys, requests, steps or None, rounds or None) per point."""
    for j, fname in enumerate(TABLE_FILES):
        parts = []
        for keys, *frames in tables:
            df = frames[j]
            if df is not None:
                df = df.drop(columns=[c for c in TABLE_COLUMNS if c in df.columns])  # derived on load
                parts.append(df.assign(**keys)[[*keys, *(c for c in df.columns if c not in keys)]])  # keys win
        path = out_dir / fname
        if kept_hashes and path.exists():
            old = pd.read_parquet(path)
            parts.insert(0, old[old["config_hash"].isin(kept_hashes)])
        if parts:
            tmp = path.with_name(f".{fname}.tmp")
            table = pd.concat(parts, ignore_index=True)
            table = table.astype({c: "float32" for c in table.columns if table[c].dtype == "float64"})
            table.to_parquet(tmp, index=False, compression="zstd")
            os.replace(tmp, path)


# ----------------------------------------------------------------------------------------- manifest


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


def build_manifest(
    spec: ExpSpec,
    config: Mapping[str, Any],
    *,
    quick: bool,
    n_jobs: int,
    overrides: Sequence[str],
    conf_dir: Path,
    notes: Sequence[str],
    sources: Sequence[Mapping[str, Any]],
    command_line: Sequence[str],
    narrowed: Sequence[str],
    started: datetime,
    narrowed_axes: Sequence[str] = (),
    wall_s: float,
    engines: Mapping[str, str] | None = None,
    engine_warning: bool = False,
) -> dict[str, Any]:
    """manifest.json's content (see the module docstring): ``config`` is the run's resolved config, whose ``exp`` is
    replaced by the experiment as run (after quick mode and the command line's narrowing); ``engines``: each system's
    engine profile, ``engine_warning``: whether they differ where the experiment does not compare them so."""
    return {
        "exp": spec.name,
        "kind": spec.kind,
        "title": spec.title,
        "grid_keys": spec.grid_columns(),
        "systems": spec.system_labels(),
        "seeds": list(spec.seeds),
        "quick": quick,
        "n_jobs": n_jobs,
        "overrides": list(overrides),
        "git_commit": git_commit(),
        "code_version": code_version(conf_dir),
        "versions": package_versions(),
        "notes": list(dict.fromkeys(notes)),
        "data": datasources.collect(list(sources)),
        "command_line": list(command_line),
        "narrowed": list(narrowed),
        "narrowed_axes": list(narrowed_axes),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 3),
        "config": {**config, "exp": spec.source},
        **({"compare": list(spec.compare)} if spec.compare else {}),
        **({"engines": dict(engines)} if engines else {}),
        **({"engine_warning": True} if engine_warning else {}),
    }


def engines_line(engines: Mapping[str, str], warning: bool = False) -> str | None:
    """The line saying that a run's systems (label -> engine profile) run on different engine profiles (None where
    they share one); ``warning``: the experiment does not compare them so (the command line chose the systems)."""
    by_engine: dict[str, list[str]] = {}
    for label, engine in engines.items():
        by_engine.setdefault(engine, []).append(label)
    if len(by_engine) < 2:
        return None
    which = "; ".join(f"{', '.join(labels)} on {engine}" for engine, labels in by_engine.items())
    why = ("each system on its own paper's engine, as its config names it" if warning
           else "each system on its paper's engine, as the experiment compares them")
    return (f"{'engine profiles differ' if warning else 'engine profiles'}: {which} ({why}); engine=NAME runs "
            "every system on one")


def derived_rows(rows: list[dict[str, str]], specs: Sequence[Derived], keys: Sequence[str]) -> list[dict[str, str]]:
    """points.csv's text rows plus the ``exp.derived`` columns (:func:`repro.metrics.derived.with_derived`), each
    written with :func:`~repro.experiments.results.fmt` before the next entry reads it, as a redraw from points.csv
    would see it."""
    if not specs:
        return rows
    cols = list(dict.fromkeys(k for r in rows for k in r))
    table = pd.DataFrame({c: [r.get(c, "") for r in rows] for c in cols}, dtype=object)
    for spec in specs:
        table = with_derived(table, [spec], keys)
        table[spec.name] = [fmt(v) for v in table[spec.name]]
    names = [s.name for s in specs]
    return [{**r, **dict(zip(names, values, strict=True))}
            for r, values in zip(rows, table[names].itertuples(index=False), strict=True)]
