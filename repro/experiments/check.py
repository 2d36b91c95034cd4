"""Regression tracking and the catalogue: ``python -m repro check`` and ``python -m repro all``.

``check [NAME ...] [--quick] [--tolerance REL] [--update]``
    re-runs each experiment (all of ``conf/exp`` when none is named) into ``runs/check/[quick/]NAME`` and compares
    its points.csv cell by cell with the committed reference, ``results/NAME`` (``results/quick/NAME`` with
    ``--quick``). Rows are matched on ``exp, system, seed`` and the grid columns; every other column is compared,
    exactly by default or within ``REL`` relative tolerance, except the wall-clock ones (:data:`WALL_CLOCK`). It
    prints one line per experiment and a table of what changed (experiment, system, point, metric, old, new), and
    exits 1 on any difference. ``--update`` writes the new run as the reference instead (a change made on purpose).
    A reference written with the previous release's metric names is read in today's
    (:data:`repro.metrics.summary.RENAMED`, :func:`read_reference`).
``all [--quick]``
    regenerates every reference (one progress bar over all points) and writes ``results/INDEX.md``
    (``results/quick/INDEX.md``; ``INDEX.nodata.md`` when run without the data folder): per experiment the paper
    claims held and differing, the wall time and links to the figures. This is what to run before a deadline.

Both run their experiments on one shared worker pool (:func:`run_many`): the next experiments' points are submitted
while one runs, and a point two experiments share runs once.

Data. A reference records where its workload came from (``manifest.json``: ``data``). A reference made without
the data folder (``REPRO_DATA`` at an empty folder: embedded statistics) is kept beside the main one as
``nodata/`` when its sources differ, and a run is compared with the reference whose sources it shares; a run
whose sources match neither fails with the sources that differ (e.g. token counts estimated because a tokenizer
package is missing). Quick references keep points.csv, manifest.json and summary.md only.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from repro.core.errors import ReproError
from repro.experiments import launch, planning, robustness, runner, studies
from repro.experiments.catalogue import index_markdown, index_rows, read_index_rows
from repro.experiments.compose import compose_config, hydra_context, to_dict
from repro.experiments.expspec import ExpSpec, apply_quick
from repro.experiments.grid import expand_points, group_overrides
from repro.experiments.results import CONF_DIR, KEY_COLS, REPO_ROOT, RESULTS_DIR, display_path, reference_dir
from repro.metrics.summary import RENAMED

#: Columns that measure this machine's wall clock or book-keeping, never compared.
WALL_CLOCK = frozenset({"wall_s", "mean_iter_schedule_ms", "config_hash", "code_version"})
#: What a quick reference keeps.
QUICK_FILES = ("points.csv", "manifest.json", "summary.md")
NODATA = "nodata"
MAX_ROWS = 25  # changed cells printed per experiment


def experiments(conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / "exp").glob("*.yaml"))


@dataclass(frozen=True, slots=True)
class Change:
    """One cell that differs (``old``/``new`` empty for a missing row or column)."""

    exp: str
    system: str
    point: str
    metric: str
    old: str
    new: str


@dataclass
class Outcome:
    """One experiment's check."""

    exp: str
    reference: Path | None
    changes: list[Change] = field(default_factory=list)
    problem: str = ""  # no reference, data sources differ
    skipped: str = ""  # not run here (an experiment whose modules this Python lacks: ExpSpec.requires)
    wall_s: float = 0.0
    num_points: int = 0

    @property
    def ok(self) -> bool:
        return not self.changes and not self.problem


# ------------------------------------------------------------------------------------------------ comparing


def _close(old: str, new: str, tol: float) -> bool:
    if old == new:
        return True
    try:
        a, b = float(old), float(new)
    except ValueError:
        return False
    if math.isnan(a) and math.isnan(b):
        return True
    return tol > 0 and abs(a - b) <= tol * max(abs(a), abs(b))


def compare(old: pd.DataFrame, new: pd.DataFrame, keys: Sequence[str], tol: float = 0.0,
            only: Sequence[str] = ()) -> list[Change]:
    """Cells of ``new`` that differ from ``old`` (both read as text), rows matched on ``keys``; ``only``: compare
    just these columns (an experiment's ``exp.compare``)."""
    keys = [k for k in keys if k in old.columns or k in new.columns]
    exp = str(old["exp"].iloc[0]) if "exp" in old.columns and len(old) else ""

    def index(df: pd.DataFrame) -> dict[tuple[str, ...], dict[str, str]]:
        rows = [{str(k): str(v) for k, v in r.items()} for r in df.fillna("").to_dict("records")]
        return {tuple(r.get(k, "") for k in keys): r for r in rows}

    a, b = index(old), index(new)
    cols = [c for c in dict.fromkeys([*old.columns, *new.columns]) if c not in WALL_CLOCK and c not in keys
            and (not only or c in only)]
    out: list[Change] = []

    def label(key: tuple[str, ...]) -> tuple[str, str]:
        d = dict(zip(keys, key, strict=True))
        point = " ".join(f"{k}={v}" for k, v in d.items() if k not in ("exp", "system"))
        return d.get("system", ""), point

    for key in dict.fromkeys([*a, *b]):
        system, point = label(key)
        if key not in b:
            out.append(Change(exp, system, point, "(row)", "present", "missing"))
            continue
        if key not in a:
            out.append(Change(exp, system, point, "(row)", "missing", "present"))
            continue
        for c in cols:
            o, n = str(a[key].get(c, "")), str(b[key].get(c, ""))
            if not _close(o, n, tol):
                out.append(Change(exp, system, point, c, o, n))
    return out


def read_reference(path: Path) -> pd.DataFrame:
    """A reference's points.csv as text, in today's column names: a column named as in the previous release
    (:data:`repro.metrics.summary.RENAMED`) gets its new name, unless the file has that name already (a duplicate of
    it, dropped); a column that repeats an earlier one's name (a swept key named like a metric) is dropped."""
    with path.open(newline="") as f:
        header = next(csv.reader(f), [])
    df = pd.read_csv(path, dtype=str, keep_default_na=False, header=None, skiprows=1, names=range(len(header)))
    names: list[str] = []
    keep: list[int] = []
    for i, col in enumerate(header):
        name = RENAMED.get(col, col)
        if name in names or (name != col and name in header):
            continue
        names.append(name)
        keep.append(i)
    out = df[keep]
    out.columns = names
    return out


def signature(manifest: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """Where a run's workload came from, as compared between a run and a reference."""
    return sorted({(str(d["dataset"]), str(d["kind"]), bool(d["fallback"])) for d in manifest.get("data") or []})


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def pick_reference(ref: Path, manifest: Mapping[str, Any]) -> tuple[Path | None, str]:
    """The reference folder whose data sources match the run's (``ref`` or ``ref/nodata``), or why none does."""
    mine = signature(manifest)
    candidates = [d for d in (ref, ref / NODATA) if (d / "points.csv").is_file()]
    if not candidates:
        return None, f"no reference in {display_path(ref)} (create it with --update)"
    for d in candidates:
        if signature(read_manifest(d)) == mine:
            return d, ""
    theirs = signature(read_manifest(candidates[0]))
    diff = sorted(set(mine) ^ set(theirs))
    shown = ", ".join(f"{'run' if s in mine else 'reference'}: {s[0]} {s[1]}{' (fallback)' if s[2] else ''}"
                      for s in diff)
    return None, f"data sources differ from every reference ({shown})"


def against_reference(result: runner.ExperimentResult, ref: Path,
                      tol: float = 0.0) -> tuple[Path | None, str, list[Change]]:
    """Compare a finished run with the reference folder ``ref`` (or its ``nodata`` variant): the folder used, the
    reason none could be (empty when one was), and the cells that differ."""
    folder, problem = pick_reference(ref, result.manifest)
    if folder is None:
        return None, problem, []
    keys = [*KEY_COLS, *(read_manifest(folder).get("grid_keys") or [])]
    old = read_reference(folder / "points.csv")
    new = pd.read_csv(result.out_dir / "points.csv", dtype=str, keep_default_na=False)
    return folder, "", compare(old, new, keys, tol, result.manifest.get("compare") or ())


# ------------------------------------------------------------------------------------------------- running


def _compose(name: str, quick: bool, extra: Sequence[str]) -> tuple[Any, list[str]]:
    overrides = [f"+exp={name}", *(["quick=true"] if quick else []), *extra]
    with hydra_context():
        return compose_config(overrides), overrides


def spec_of(name: str, quick: bool, extra: Sequence[str] = ()) -> ExpSpec:
    cfg, _ = _compose(name, quick, extra)
    return ExpSpec.parse(apply_quick(to_dict(cfg.exp), quick)[0])


def skip_reason(name: str, quick: bool, extra: Sequence[str] = ()) -> str:
    """Why this Python cannot run experiment ``name`` (its ``exp.requires`` modules are missing), or ``""``."""
    missing = spec_of(name, quick, extra).missing()
    return f"skipped: needs {', '.join(missing)} ({runner.REAL_INSTALL})" if missing else ""


def count_points(name: str, quick: bool, extra: Sequence[str] = ()) -> int:
    """How many points an experiment runs (for one progress bar over several)."""
    spec = spec_of(name, quick, extra)
    if spec.missing():
        return 0
    if spec.kind != "sweep":
        return 1
    return len(expand_points(spec, group_overrides(CONF_DIR)))


def run_one(name: str, quick: bool, out_dir: Path, extra: Sequence[str] = (),
            progress: Callable[[], None] | None = None, n_jobs: int | None = None) -> runner.ExperimentResult:
    cfg, overrides = _compose(name, quick, [*extra, *([f"n_jobs={n_jobs}"] if n_jobs else [])])
    return runner.run_experiment(cfg, overrides, out_dir=out_dir, log=lambda s: tqdm.write(s, file=sys.stderr),
                                 progress=progress, overwrite=True)  # a scratch or reference folder, replaced


#: How many experiments :func:`run_many` plans ahead of the one running (more while fewer than
#: ``QUEUED_PER_WORKER`` points per worker wait in the pool).
AHEAD = 2
QUEUED_PER_WORKER = 4


def run_many(names: Sequence[str], quick: bool, out_dir_of: Callable[[str], Path], extra: Sequence[str] = (),
             n_jobs: int | None = None, progress: Callable[[], None] | None = None, render: bool = True,
             ) -> Iterator[tuple[str, runner.ExperimentResult | str, float]]:
    """Run experiments ``names`` in turn, each into ``out_dir_of(name)`` (a scratch or reference folder, replaced);
    yields ``(name, result or why it was skipped, seconds)`` as each ends.

    The experiments share one process pool (:class:`~repro.experiments.launch.PointPool`, with ``n_jobs`` workers
    or one per core): before an experiment runs, the next :data:`AHEAD` are composed and their points submitted
    (more while few points wait), so the workers go on with them while this process compares the one that ended
    or draws its figures, and a point two experiments share runs once. An experiment on real models runs its points
    here with the pool idle (its step times are measured): nothing past it is planned before it has run, and it
    waits for what was submitted before it. Each experiment's results are the ones it
    would have alone (the same points, the same files; its figures and summary.md only with ``render``);
    ``seconds`` counts its own composition and run."""
    jobs = int(n_jobs or os.cpu_count() or 1)
    pool = launch.PointPool(jobs) if jobs > 1 else None
    say = lambda line: tqdm.write(line, file=sys.stderr)  # noqa: E731
    plans: dict[int, runner.RunContext | str] = {}
    spent: dict[int, float] = {}

    def plan(k: int) -> None:
        if k >= len(names) or k in plans:
            return
        t0 = time.perf_counter()
        skip = skip_reason(names[k], quick, extra)
        if skip:
            plans[k] = skip
        else:
            cfg, overrides = _compose(names[k], quick, [*extra, *([f"n_jobs={n_jobs}"] if n_jobs else [])])
            plans[k] = runner.plan_experiment(cfg, overrides, out_dir=out_dir_of(names[k]), log=say, pool=pool)
        spent[k] = time.perf_counter() - t0

    def real(k: int) -> bool:
        ctx = plans.get(k)
        return ctx is not None and not isinstance(ctx, str) and planning.runs_real(ctx)

    with pool if pool is not None else contextlib.nullcontext():
        for k, name in enumerate(names):
            plan(k)
            ahead = k + 1
            # (nothing is planned past an experiment on real models: its measured steps run with the pool idle)
            while not real(ahead - 1) and ahead < len(names) and (ahead <= k + AHEAD or (
                    pool is not None and pool.queued() < QUEUED_PER_WORKER * jobs)):
                plan(ahead)
                ahead += 1
            ctx = plans.pop(k)
            if isinstance(ctx, str):
                yield name, ctx, 0.0
                continue
            if pool is not None and planning.runs_real(ctx):
                pool.wait_idle()
            t0 = time.perf_counter()
            result = runner.run_experiment(ctx.cfg, ctx.overrides, out_dir=ctx.out_dir, log=say, progress=progress,
                                           overwrite=True, render=render, planned=ctx)
            yield name, result, spent.pop(k) + time.perf_counter() - t0


def data_present() -> bool:
    """Whether this machine has a data folder with files (updates then write the main reference)."""
    from workloads.datasets import default_data_root

    root = default_data_root()
    return root is not None and root.is_dir() and any(root.iterdir())


def store(result: runner.ExperimentResult, ref: Path, quick: bool) -> Path:
    """Make ``result`` (run elsewhere) the reference ``ref`` (or ``ref/nodata`` when it was made without the data
    folder and its sources differ from the main reference's); returns the folder written."""
    dest = ref
    if not data_present() and (ref / "points.csv").is_file() and signature(read_manifest(ref)) != signature(
            result.manifest):
        dest = ref / NODATA
    if dest.resolve() == result.out_dir.resolve():
        return dest
    names = QUICK_FILES if quick or dest.name == NODATA else tuple(
        p.name for p in result.out_dir.iterdir() if p.is_file())
    if dest.is_dir():
        for p in dest.iterdir():
            if p.is_file() and p.name not in studies.FILES:  # a robustness study is made on its own
                p.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    for n in names:
        if (result.out_dir / n).is_file():
            shutil.copy2(result.out_dir / n, dest / n)
    if dest != ref:
        return dest
    from repro.experiments import render

    if not quick:
        render.redraw(dest)  # figure files and summary.md, drawn where they now live
    return dest


def _reference_study(name: str, out_dir: Path, settings_dir: Path, n_jobs: int | None,
                     say: Callable[[str], None]) -> Path:
    """Run the reference robustness study of ``name``: the quick grid, seed 0, the default joint design."""
    return robustness.run(name, quick=True, samples=studies.QUICK_SAMPLES, seed=0, out_dir=out_dir,
                          settings_dir=settings_dir, n_jobs=n_jobs, say=say)


def study(name: str, ref: Path, n_jobs: int | None = None) -> bool:
    """The reference robustness study of ``name`` into ``ref``, its summary.md redrawn with it; False for an
    experiment without open choices or claims."""
    from repro.experiments import render

    spec = spec_of(name, False)
    if not spec.open:
        return False
    if not spec.claims:  # its open choices only: nothing to test
        robustness.declarations(name, ref)
        return True
    with tempfile.TemporaryDirectory(prefix=f"repro-robustness-{name}-") as tmp:
        _reference_study(name, ref, Path(tmp), n_jobs, lambda line: tqdm.write(line, file=sys.stderr))
    if (ref / "points.csv").is_file() and (ref / "manifest.json").is_file():
        render.redraw(ref)
    return True


def untimed(frame: pd.DataFrame, claims: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """robustness.csv's rows less those of claims on a wall-clock metric (:data:`WALL_CLOCK`: AdaServe's scheduling
    time on this CPU holds or not with the machine's load), which ``check --robustness`` does not compare, as
    ``check`` does not compare points.csv's wall-clock columns."""
    timed = tuple(" ".join(str(c.get("text", "")).split()) for c in claims if str(c.get("metric")) in WALL_CLOCK)
    if not timed or frame.empty:
        return frame
    return frame[~frame["claim"].map(lambda c: " ".join(str(c).split()).startswith(timed))]


def check_robustness(names: Sequence[str], tol: float, n_jobs: int | None = None,
                     results: Path = RESULTS_DIR) -> list[Outcome]:
    """``repro check --robustness``: re-run each committed robustness study and compare its robustness.csv."""
    out: list[Outcome] = []
    for name in names:
        ref = reference_dir(name, False, results)
        if not (ref / "robustness.csv").is_file():
            continue
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"repro-robustness-{name}-") as tmp:
            folder = _reference_study(name, Path(tmp), Path(tmp) / "settings", n_jobs, lambda line: None)
            new = pd.read_csv(folder / "robustness.csv", dtype=str, keep_default_na=False)
        old = pd.read_csv(ref / "robustness.csv", dtype=str, keep_default_na=False)
        claims = spec_of(name, True).claims
        old, new = untimed(old, claims), untimed(new, claims)
        o = Outcome(f"{name} (robustness)", ref, compare(old, new, ["setting", "claim"], tol),
                    wall_s=time.perf_counter() - t0, num_points=len(new))
        print(f"{o.exp}: {'ok' if o.ok else f'{len(o.changes)} cells differ'} ({len(new)} claim x setting rows vs "
              f"{display_path(ref / 'robustness.csv')}, {o.wall_s:.0f} s)", flush=True)
        out.append(o)
    return out


def needs_data(name: str, quick: bool, results: Path = RESULTS_DIR) -> str:
    """Why experiment ``name`` cannot be checked on this machine for want of the data folder (its reference read
    data files and it has no no-data variant), as check's one line says it, or ``""``."""
    ref = reference_dir(name, quick, results)
    if data_present() or (ref / NODATA / "points.csv").is_file() or not (ref / "points.csv").is_file():
        return ""
    files = sorted({str(d["dataset"]) for d in read_manifest(ref).get("data") or [] if d.get("kind") == "file"})
    if not files:
        return ""
    return (f"skipped: its reference reads the data folder ({', '.join(files)}) and has no no-data variant; point "
            "REPRO_DATA at the data folder (docs/data.md), or check --quick, whose references have no-data variants")


def check(names: Sequence[str], quick: bool, tol: float, update: bool, n_jobs: int | None = None,
          extra: Sequence[str] = (), results: Path = RESULTS_DIR, scratch_root: Path | None = None) -> list[Outcome]:
    """Run and compare (or update) each experiment against ``results``; prints one line per experiment. The runs go
    to ``scratch_root`` (default ``runs/check``), ``quick/NAME`` below it in quick mode."""
    from repro.experiments import render

    out: list[Outcome] = []
    scratch = (scratch_root or REPO_ROOT / "runs" / "check") / ("quick" if quick else "")
    if not update:  # what this machine cannot compare is said first, and not run
        for name in names:
            why = needs_data(name, quick, results)
            if why:
                print(f"{name}: {why}", flush=True)
                out.append(Outcome(name, None, skipped=why))
        names = [n for n in names if n not in {o.exp for o in out}]

    def fresh(name: str) -> Path:  # the scratch folder, emptied: no figure of an earlier check stays beside this run
        shutil.rmtree(scratch / name, ignore_errors=True)
        return scratch / name

    # figures and summary.md only where they tell something: an update's (its reference's files), or an experiment
    # that differs from its reference (drawn once compared); a matching one's are its reference's
    for name, result, wall in run_many(names, quick, fresh, extra, n_jobs, render=update):
        if isinstance(result, str):
            print(f"{name}: {result}", flush=True)
            out.append(Outcome(name, None, skipped=result))
            continue
        o = Outcome(name, None, wall_s=wall, num_points=len(result.points))
        ref = reference_dir(name, quick, results)
        if update:
            o.reference = store(result, ref, quick)
            print(f"{name}: reference updated ({display_path(o.reference)}, {o.num_points} points, "
                  f"{o.wall_s:.0f} s)", flush=True)
            out.append(o)
            continue
        o.reference, o.problem, o.changes = against_reference(result, ref, tol)
        if not o.ok:
            render.render(result.out_dir, result.manifest, result.points)
        status = "ok" if o.ok else (o.problem or f"{len(o.changes)} cells differ")
        where = f" vs {display_path(o.reference)}" if o.reference else ""
        print(f"{name}: {status} ({o.num_points} points{where}, {o.wall_s:.0f} s)", flush=True)
        out.append(o)
    return out


def changes_table(outcomes: Sequence[Outcome], limit: int = MAX_ROWS) -> str:
    """The compact table of what changed, at most ``limit`` rows per experiment."""
    rows = []
    for o in outcomes:
        for c in o.changes[:limit]:
            rows.append([c.exp, c.system, c.point, c.metric, c.old, c.new])
        if len(o.changes) > limit:
            rows.append([o.exp, "", f"... {len(o.changes) - limit} more", "", "", ""])
    if not rows:
        return ""
    head = ["experiment", "system", "point", "metric", "old", "new"]
    width = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, width, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(head), *(line(r) for r in rows)])


# ------------------------------------------------------------------------------------------------- catalogue


def regenerate(names: Sequence[str], quick: bool, n_jobs: int | None = None,
               results: Path = RESULTS_DIR) -> list[tuple[str, Path, Any]]:
    """``repro all``: every experiment into its reference folder, one progress bar over all points."""
    total = sum(count_points(n, quick) for n in names)
    bar = tqdm(total=total, desc="catalogue", unit="pt", disable=None)
    lines = launch.ProgressLines("catalogue", total, enabled=bool(bar.disable), every_s=30.0)

    def tick() -> None:
        bar.update()
        lines.update()

    scratch: dict[str, Path] = {}  # where a run goes before store() copies it (quick, or without the data folder)
    present = data_present()

    def target(name: str) -> Path:
        if quick or not present:
            scratch[name] = Path(tempfile.mkdtemp(prefix=f"repro-{name}-"))
            return scratch[name]
        return reference_dir(name, quick, results)

    done = []
    try:
        for name, result, _ in run_many(names, quick, target, n_jobs=n_jobs, progress=tick):
            if isinstance(result, str):
                tqdm.write(f"{name}: {result}", file=sys.stderr)
                continue
            dest = store(result, reference_dir(name, quick, results), quick)
            if name in scratch:
                shutil.rmtree(scratch.pop(name), ignore_errors=True)
            if result.manifest.get("kind", "sweep") != "sweep":
                tick()  # counted as one point
            bar.set_postfix_str(name, refresh=False)
            done.append((name, dest, result))
    finally:
        bar.close()
        for folder in scratch.values():
            shutil.rmtree(folder, ignore_errors=True)
    return done


# ------------------------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str]) -> int:
    """``python -m repro check ...`` / ``python -m repro all ...``; returns the exit status."""
    cmd, rest = argv[0], list(argv[1:])
    parser = argparse.ArgumentParser(prog=f"python -m repro {cmd}", description=__doc__.splitlines()[0])
    if cmd == "check":
        parser.add_argument("names", nargs="*", help="experiments (default: every conf/exp/*.yaml)")
        parser.add_argument("--tolerance", type=float, default=0.0, help="relative tolerance (default: exact)")
        parser.add_argument("--update", action="store_true", help="write the new runs as the references")
        parser.add_argument("--robustness", action="store_true",
                            help="re-run the committed robustness studies and compare their robustness.csv")
        parser.add_argument("--scratch", type=Path, default=None,
                            help="where the runs go (default runs/check; runs/check/quick with --quick)")
    else:
        parser.add_argument("names", nargs="*", help="experiments (default: every conf/exp/*.yaml)")
        parser.add_argument("--robustness", action=argparse.BooleanOptionalAction, default=None,
                            help="also (re)make the robustness studies of the experiments with open choices "
                                 "(default: with a full regeneration, not with --quick)")
        parser.add_argument("--only-robustness", action="store_true",
                            help="(re)make the robustness studies only, leaving the experiments' references")
    parser.add_argument("--quick", action="store_true", help="quick mode (references in results/quick/)")
    parser.add_argument("--n-jobs", type=int, default=None,
                        help="worker processes (one pool the experiments share; default: one per core)")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR,
                        help="the references' root folder (default: the repository's results/)")
    args = parser.parse_args(rest)
    try:
        known = experiments()
        names = list(getattr(args, "names", None) or known)
        bad = [n for n in names if n not in known]
        if bad:
            raise ReproError(f"unknown experiment(s) {', '.join(bad)} (python -m repro list)")
        if cmd == "all" and args.only_robustness:
            if not data_present():
                raise ReproError("the robustness studies are made with the data folder ($REPRO_DATA)")
            t0 = time.perf_counter()
            studied, failed = [], []
            for n in names:  # one study's error is reported and the others go on
                try:
                    if study(n, reference_dir(n, False, args.results), args.n_jobs):
                        studied.append(n)
                except ReproError as exc:
                    failed.append(n)
                    print(f"{n}: robustness failed: {exc}", file=sys.stderr, flush=True)
            index = reference_dir("INDEX.md", False, args.results)
            if index.is_file():
                index.write_text(index_markdown(read_index_rows(index), False, args.results))
            print(f"robustness: {len(studied)} studies in {time.perf_counter() - t0:.0f} s -> {display_path(index)}"
                  + (f"; failed: {', '.join(failed)}" if failed else ""))
            return 1 if failed else 0
        if cmd == "all":
            done = regenerate(names, args.quick, args.n_jobs, args.results)
            robust = args.robustness if args.robustness is not None else not args.quick
            if robust and not data_present():
                print("robustness: skipped (the studies are made with the data folder)", file=sys.stderr)
            elif robust:
                for name, *_ in done:
                    study(name, reference_dir(name, False, args.results), args.n_jobs)
            index = reference_dir("INDEX.md" if data_present() else "INDEX.nodata.md", args.quick,
                                         args.results)
            index.parent.mkdir(parents=True, exist_ok=True)
            # naming experiments updates their rows and keeps the others (of experiments that still exist)
            rows = {k: v for k, v in read_index_rows(index).items() if k in known} if args.names else {}
            rows.update(index_rows(done, args.quick, args.results))
            index.write_text(index_markdown(rows, args.quick, args.results))
            print(f"catalogue: {len(done)} experiments, {sum(len(r.points) for *_, r in done)} points in "
                  f"{sum(r.wall_s for *_, r in done):.0f} s -> {display_path(index)}")
            return 0
        if args.tolerance < 0:
            raise ReproError(f"--tolerance {args.tolerance}: must be >= 0")
        if args.robustness:
            outcomes = check_robustness(names, args.tolerance, args.n_jobs, args.results)
        else:
            outcomes = check(names, args.quick, args.tolerance, args.update, args.n_jobs, results=args.results,
                             scratch_root=args.scratch)
    except ReproError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = changes_table(outcomes)
    if table:
        print(table)
    bad_runs = [o for o in outcomes if not o.ok]
    if not args.update:
        ran = [o for o in outcomes if not o.skipped]
        skipped = [o.exp for o in outcomes if o.skipped]
        print(f"check: {len(ran) - len(bad_runs)} of {len(ran)} experiments that ran match their references"
              + (f"; differ: {', '.join(o.exp for o in bad_runs)}" if bad_runs else "")
              + (f"; skipped {len(skipped)}: {', '.join(skipped)}" if skipped else ""))
    return 1 if bad_runs and not args.update else 0
