"""Experiment runner: compose an experiment's points, run them (in parallel), write its results folder.

:func:`run_experiment` takes the composed main config (conf/config.yaml, the experiment file ``conf/exp/NAME.yaml``
and the command line), reads its ``exp`` block into an :class:`~repro.experiments.expspec.ExpSpec` (applying quick mode
and the command line's narrowing, :mod:`repro.experiments.narrow`) and runs the experiment's kind (:data:`KINDS`). A
sweep expands the points (:mod:`repro.experiments.grid`), composes each point's config (the command line's overrides,
then the point's own; Hydra composes each distinct choice of config groups once,
:class:`repro.experiments.compose.Composer`), refuses an impossible point before anything runs
(:func:`repro.experiments.validate.check_point`; each distinct workload is built once where the points run,
:func:`repro.experiments.validate.check_workload`, so a missing data file is named too), and runs the points through
:func:`repro.experiments.simulate.run_point`, in-process (``n_jobs=1``, and always for points on a real backend), in a
process pool, on Ray or through submitit (:mod:`repro.experiments.launch`), with a progress bar (a progress line every
10 s when the output is not a terminal). Each point is appended to points.csv as it finishes; at the end the file is
rewritten in grid order with the experiment's derived columns (:mod:`repro.metrics.derived`), manifest.json is written
(:mod:`repro.experiments.results` describes the files) and the figures and summary.md are drawn
(:mod:`repro.experiments.render`).

The output folder is not touched before the first point finishes, nor when it holds another run
(:func:`refuse_to_replace`). ``resume=true`` keeps rows whose ``(system, config_hash, code_version)`` match a point
of this run and computes the rest; a plain run starts points.csv afresh. Ctrl-C stops a run with its finished
points saved (:mod:`repro.experiments.stopping`). The calibration kind writes the cost model's calibration table as
points.csv instead (no simulation); the memory kind writes each point's GPU memory breakdown (no simulation:
:func:`repro.experiments.simulate.memory_row`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from repro.core.errors import ConfigError, ReproError
from repro.experiments import datasources, narrow
from repro.experiments.compose import (
    Composer,
    Recipe,
    as_config,
    check_data_root,
    check_grid_keys,
    exp_name,
    known_top_keys,
    lent,
    to_dict,
)
from repro.experiments.expspec import SEED_KEY, ExpSpec, apply_quick, check_frozen_interpolations
from repro.experiments.grid import by_workload, expand_points, group_overrides
from repro.experiments.launch import Outcome, PointPool, ProgressLines, execute, execute_ray, execute_submitit
from repro.experiments.planning import RunContext, compose_points, is_real, resolve_points, shares_pool, submit_ahead
from repro.experiments.results import (
    CONF_DIR,
    KEY_COLS,
    PointsFile,
    atomic_write_text,
    build_manifest,
    code_version,
    default_out_dir,
    derived_rows,
    dict_hash,
    display_path,
    earlier_run,
    engines_line,
    fmt,
    save_tables,
    setting_text,
    write_table,
)
from repro.experiments.stopping import Interrupted, signals_held, signum_of
from repro.experiments.validate import check_keys, check_point, check_values, check_workload

#: How to install what the real backends need (ConfigError messages, check's skip lines).
REAL_INSTALL = "pip install torch==2.13.0 (the CPU build; a CUDA build on a GPU) and pip install -e '.[real]'"


@dataclass
class ExperimentResult:
    """What :func:`run_experiment` returns (points.csv as a DataFrame, the output dir, the manifest)."""

    name: str
    out_dir: Path
    points: pd.DataFrame
    manifest: dict[str, Any]
    num_run: int
    wall_s: float
    verdicts: dict[str, int] = field(default_factory=dict)  # claims: holds / differs / n/a / calibrated -> count

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
            if v.get("calibrated"):
                claims += f", {v['calibrated']} calibrated (not tests)"
            robust = robustness_counts(self.out_dir, self.name)
            if robust:
                claims += f" (robustness: {robust})"
            parts.append(claims)
        if not (self.manifest.get("config") or {}).get("exp", {}).get("figures"):  # a run of your own
            from repro.experiments.render import headline

            numbers = headline(self.points)
            parts += [numbers] if numbers else []
        sources = self.manifest.get("data") or []
        if sources:
            parts.append(f"data: {datasources.short(sources)}")
        return "; ".join(parts) + f" -> {display_path(self.out_dir / 'summary.md')}"


def robustness_counts(out_dir: Path, name: str) -> str:
    """``2 robust, 3 depend on the setting, 1 differ everywhere plausible`` from the experiment's robustness study
    (this folder's, else the committed reference's), or ``""`` without one."""
    from repro.experiments import studies

    study, _ = studies.find_study(out_dir, name)
    if not study:
        return ""
    n = studies.class_counts(study)
    return (f"{n[studies.ROBUST]} robust, {n[studies.DEPENDS]} depend on the setting, "
            f"{n[studies.NOWHERE]} differ everywhere plausible")


def claim_verdicts(spec: ExpSpec, points: pd.DataFrame, one_value: Sequence[str] = ()) -> dict[str, int]:
    """How many of the experiment's paper claims hold, differ, or cannot be computed from ``points``."""
    if not spec.claims or points.empty:
        return {}
    from repro.experiments import claims

    grid = spec.grid_columns()
    table = claims.evaluate(spec.claims, points, grid[0] if grid else None, spec.claims_also_for,
                            one_value=one_value)
    return {str(k): int(n) for k, n in table["verdict"].value_counts().items()}


def run_sweep(ctx: RunContext) -> tuple[pd.DataFrame, int]:
    """Run the grid's points (skipping resumed ones) and write points.csv; returns it and the number run."""
    spec, name = ctx.spec, ctx.spec.name
    cfgs: Sequence[DictConfig | Recipe]
    say = ctx.say if ctx.progress is None else (lambda _: None)  # check and all draw one bar over everything
    if ctx.composed is not None:
        points, cfgs, resolved, hashes = ctx.composed
    else:
        with SaidIfSlow(say, f"{name}: composing {len(expand_points(spec, group_overrides(ctx.conf_dir)))} "
                        "points ..."):
            points, composed = compose_points(ctx)
        resolved, hashes = resolve_points(composed)
        cfgs = composed
    checked: set[str] = set()
    passed = ctx.pool.passed if ctx.pool is not None else set()  # (what the pool's experiments' points passed)
    for p, c, r, h in zip(points, cfgs, resolved, hashes, strict=True):  # refuse an impossible point before it runs
        if h not in checked:
            checked.add(h)
            check_point(c, where=f"point {p.describe()}: ", resolved=r, passed=passed)
    note_engines(ctx, points, resolved)
    version = code_version(ctx.conf_dir)
    pf = PointsFile(ctx.out_dir / "points.csv", [*KEY_COLS, *spec.grid_columns()])
    wanted = frozenset((p.system, h) for p, h in zip(points, hashes, strict=True))
    done: dict[tuple[str, str], dict[str, str]] = {}
    if ctx.cfg.get("resume"):
        for r in pf.read_existing():
            if (r["system"], r["config_hash"]) in wanted and r["code_version"] == version:
                done[(r["system"], r["config_hash"])] = r
    kept = list(done.values())
    kept_hashes = {h for _, h in done}
    if ctx.memo:
        for shared in sorted(wanted - done.keys()):
            if shared in ctx.memo:
                done[shared] = ctx.memo[shared]
                kept.append(done[shared])
    todo = by_workload(points, (i for i, p in enumerate(points) if (p.system, hashes[i]) not in done))
    built = ctx.pool.workloads if ctx.pool is not None else set()  # (what the pool's experiments' points built)
    for i in todo if data_here(ctx.cfg.get("launcher") or {}) else []:  # each distinct workload, before writing
        key = json.dumps([resolved[i]["workload"], str(resolved[i]["model"]["name"])], sort_keys=True, default=str)
        if key not in built:
            with lent(cfgs[i]) as point:
                check_workload(point, where=f"point {points[i].describe()}: ")
            built.add(key)
    refuse_to_replace(ctx, wanted)
    workers = min(ctx.n_jobs, len(todo))
    running = (f"{name}: running {len(todo)} points" + (f" ({len(points) - len(todo)} kept from before)"
                                                         if len(todo) < len(points) else "")
               + f" on {workers} worker{'s' if workers != 1 else ''} ...")
    keep = [bool(r.get("save_requests")) for r in resolved]  # per point: a case may turn it off
    tables: dict[int, Outcome] = {}
    announced: set[str] = set()
    started = False  # points.csv is written from the first finished point on: a run that fails first touches nothing

    def record(out: Outcome) -> str:
        nonlocal started
        if not started:
            pf.start(kept)
            started = True
        p = points[out.index]
        row = {**p.keys(name), **out.metrics, "wall_s": out.wall_s}
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

    # unless the first point is quick (in a terminal the progress bar is already there: only into a log or pipe)
    first = SaidIfSlow(say if todo and not sys.stderr.isatty() else (lambda _: None), running).start()

    def recorded(out: Outcome) -> str:
        first.stop()
        return record(out)

    try:
        _run_points(ctx, todo, cfgs, keep, len(points), recorded,
                    lambda i: f"point {points[i].describe()} ({' '.join(points[i].overrides)})", hashes)
    except KeyboardInterrupt as exc:
        saved = len(pf.rows) if started else len(kept)
        raise Interrupted(signum_of(exc), saved, len(points), pf.path if saved else None, started) from None
    finally:
        first.stop()
    if not started:
        pf.start(kept)
    # points whose configs coincide (the same values reached from two cases) share one result, each row under its
    # own keys (e.g. the case label)
    blank = dict.fromkeys(spec.grid_columns(), "")
    rows = [{**done[(p.system, h)], **blank, **{k: fmt(v) for k, v in p.keys(name).items()}}
            for p, h in zip(points, hashes, strict=True)]
    pf.finish(derived_rows(rows, spec.derived, [SEED_KEY, *spec.grid_columns()]))
    if ctx.memo is not None:
        ctx.memo.update(done)
    if any(keep):
        save_tables(ctx.out_dir, [({**points[i].keys(name), "config_hash": hashes[i]}, out.requests, out.steps,
                                   out.rounds) for i, out in sorted(tables.items())], kept_hashes)
    return pd.read_csv(pf.path), len(todo)


#: how long a run may be silent before it says what it is doing (composing its points, waiting for the first): in a
#: terminal, and where the output goes to a log or a pipe (whose progress lines come every 10 s:
#: :class:`~repro.experiments.launch.ProgressLines`)
QUIET_S = 2.0
QUIET_LOG_S = 15.0


class SaidIfSlow:
    """``line`` said on ``say`` if :meth:`stop` has not come :data:`QUIET_S` seconds after :meth:`start`
    (:data:`QUIET_LOG_S` where stderr is not a terminal): a first sign of life on a long run, while a short run, or an
    error, stays one line; a context manager too."""

    def __init__(self, say: Callable[[str], None], line: str) -> None:
        self.timer = threading.Timer(QUIET_S if sys.stderr.isatty() else QUIET_LOG_S, say, (line,))
        self.timer.daemon = True

    def start(self) -> SaidIfSlow:
        self.timer.start()
        return self

    def stop(self) -> None:
        self.timer.cancel()

    def __enter__(self) -> SaidIfSlow:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def data_here(launcher: Any) -> bool:
    """Whether the points run on this machine, with its data files: not on a Ray cluster (``launcher.address``) nor
    through Slurm."""
    kind = str(launcher.get("kind", "local"))
    if kind == "ray":
        return not launcher.get("address")
    return kind != "submitit" or str(launcher.get("cluster") or "slurm") in ("local", "debug")


def refuse_to_replace(ctx: RunContext, wanted: frozenset[tuple[str, str]]) -> None:
    """Refuse (:class:`ConfigError`) to write over a run that ``ctx.out_dir`` holds unless this run computes exactly
    its points (``wanted``, as :func:`~repro.experiments.results.earlier_run` keys them), or some of them with
    ``resume=true``, or ``overwrite=true``."""
    if ctx.overwrite or ctx.cfg.get("overwrite"):
        return
    earlier = earlier_run(ctx.out_dir)
    if earlier is None or earlier.keys == wanted:
        return
    where = display_path(ctx.out_dir)
    other = earlier.keys - wanted
    if not other:  # an unfinished run of this sweep (or of a part of it)
        if ctx.cfg.get("resume"):
            return
        raise ConfigError(f"{where} holds {len(earlier.keys)} of this run's {len(wanted)} points (an unfinished "
                          f"run?): add resume=true to compute only the other {len(wanted) - len(earlier.keys)}, "
                          "overwrite=true to recompute them all, or out_dir=DIR to write elsewhere")
    how_many = "none" if other == earlier.keys else f"{len(earlier.keys) - len(other)}"
    what = f" ({len(earlier.keys)} points, {how_many} of them in this run)" if earlier.sweep else ""
    resume = " (resume=true continues a run from its own command line only)" if earlier.sweep else ""
    raise ConfigError(f"{where} holds another run of {earlier.exp}{what}: give out_dir=DIR to write this run "
                      f"elsewhere, or overwrite=true to replace that run{resume}")


def run_key(ctx: RunContext) -> frozenset[tuple[str, str]]:
    """A run without config hashes per point (calibration, memory) as :func:`~repro.experiments.results.earlier_run`
    keys it: its kind and the hash of the config its manifest records."""
    config = json.loads(json.dumps({**to_dict(ctx.cfg), "exp": ctx.spec.source}, default=str))
    return frozenset({(ctx.spec.kind, dict_hash(config))})


def note_engines(ctx: RunContext, points: Sequence[Any], resolved: Sequence[Mapping[str, Any]]) -> None:
    """Record each system's engine profile; where they differ and the command line chose the systems (not
    ``engine=``), say so on the console before anything runs (:func:`~repro.experiments.results.engines_line`)."""
    names: dict[str, dict[str, None]] = {}
    for p, r in zip(points, resolved, strict=True):
        engine = r.get("engine")
        names.setdefault(p.system, {})[str(engine.get("name", "?") if isinstance(engine, Mapping) else "?")] = None
    ctx.engines = {label: ", ".join(engines) for label, engines in names.items()}
    user = [o.lstrip("+").split("=", 1)[0] for o in ctx.overrides]
    chose = any(k.startswith(("exp.systems", "exp.cases")) for k in user)
    ctx.engine_warning = chose and "engine" not in user and engines_line(ctx.engines) is not None
    if ctx.engine_warning:
        ctx.say(f"warning: {engines_line(ctx.engines, warning=True)}")


def _run_points(ctx: RunContext, todo: list[int], cfgs: Sequence[DictConfig | Recipe], keep: Sequence[bool],
                total: int,
                record: Callable[[Outcome], str], describe: Callable[[int], str] = str,
                hashes: Sequence[str] = ()) -> None:
    """Run points ``todo`` with a progress bar (or progress lines, or the caller's ``ctx.progress``) on the run's
    launcher (``launcher=local|ray``, or the shared pool, ``ctx.pool``); ``record`` stores each outcome and returns
    the bar's postfix; ``describe`` names a point in a failure report; ``hashes`` are the points' config hashes."""
    outer = ctx.progress
    resumed = total - len(todo)
    bar = tqdm(total=total, initial=resumed, desc=ctx.spec.name, unit="pt", disable=True if outer else None)
    lines = ProgressLines(ctx.spec.name, total, resumed, enabled=bool(bar.disable) and not outer)
    if outer:
        for _ in range(resumed):
            outer()

    def progress(out: Outcome) -> None:
        with signals_held():  # a point is saved whole, then Ctrl-C stops the run
            bar.set_postfix_str(record(out), refresh=False)
        bar.update()
        lines.update()
        if outer:
            outer()

    # real backends run their points one at a time in this process: measured step times must not share the machine
    # with other points, and a forked worker cannot use a PyTorch the parent has already run
    real = any(is_real(cfgs[i]) for i in todo)
    launcher = ctx.cfg.get("launcher") or {}
    try:
        kind = str(launcher.get("kind", "local"))
        if kind == "ray" and not real:
            execute_ray(todo, [as_config(c) for c in cfgs], keep, ctx.n_jobs, progress, launcher, describe)
        elif kind == "submitit" and not real:
            execute_submitit(todo, [as_config(c) for c in cfgs], keep, progress, launcher, describe)
        elif shares_pool(ctx) and not real:
            execute(todo, cfgs, keep, ctx.n_jobs, progress, describe, ctx.pool, hashes)
        else:
            execute(todo, cfgs, keep, 1 if real else ctx.n_jobs, progress, describe)
    finally:
        bar.close()


def run_calibration(ctx: RunContext) -> tuple[pd.DataFrame, int]:
    """The cost model's calibration table (no simulation) as points.csv."""
    try:
        from repro.cost.calibration import calibration_table
    except ImportError as exc:
        raise ReproError(
            f"exp.kind=calibration needs repro.cost.calibration.calibration_table ({exc})"
        ) from None
    refuse_to_replace(ctx, run_key(ctx))
    table = calibration_table().reset_index(drop=True)
    if "within_tol" not in table.columns:
        table["within_tol"] = table["rel_err"].abs() <= table["tolerance"]
    path = ctx.out_dir / "points.csv"
    write_table(path, table)
    return pd.read_csv(path), len(table)


def run_memory(ctx: RunContext) -> tuple[pd.DataFrame, int]:
    """Each point's GPU memory breakdown (:func:`~repro.experiments.simulate.memory_row`) as points.csv (no
    simulation)."""
    from repro.experiments.simulate import memory_row

    spec = ctx.spec
    points, cfgs = compose_points(ctx)
    rows = [{**p.keys(spec.name), **memory_row(c)} for p, c in zip(points, cfgs, strict=True)]
    refuse_to_replace(ctx, run_key(ctx))
    path = ctx.out_dir / "points.csv"
    write_table(path, pd.DataFrame(rows))
    return pd.read_csv(path), len(points)


#: Experiment kinds: ``exp.kind`` → function running it and returning (points, number of points computed).
KINDS: dict[str, Callable[[RunContext], tuple[pd.DataFrame, int]]] = {
    "sweep": run_sweep,
    "calibration": run_calibration,
    "memory": run_memory,
}


def run_experiment(
    cfg: DictConfig,
    overrides: Sequence[str] = (),
    conf_dir: Path = CONF_DIR,
    out_dir: Path | None = None,
    log: Callable[[str], None] | None = None,
    progress: Callable[[], None] | None = None,
    composer: Composer | None = None,
    overwrite: bool = False,
    render: bool = True,
    memo: dict[tuple[str, str], dict[str, str]] | None = None,
    planned: RunContext | None = None,
) -> ExperimentResult:
    """Run the experiment ``cfg.exp`` describes and write its results (points.csv, manifest.json, figures,
    summary.md) to ``out_dir``, else ``cfg.out_dir``, else :func:`~repro.experiments.results.default_out_dir` (a folder
    of its own for a run the command line narrowed).

    Nothing is written before every point is checked and the folder is found free: one that holds another run is
    refused (:func:`refuse_to_replace`). Ctrl-C (or SIGTERM, where the command line raises it) stops the run with
    :class:`~repro.experiments.stopping.Interrupted` once the finished points are saved and manifest.json records the
    stop.

    Args:
        cfg: the composed main config (conf/config.yaml + conf/exp/NAME.yaml + command-line overrides).
        overrides: the command-line overrides ``cfg`` was composed from (each point is composed from them
            plus its own); under @hydra.main, ``HydraConfig.get().overrides.task``. They narrow the experiment
            (:mod:`repro.experiments.narrow`): a swept key's value runs that value only, ``system=NAME`` that system
            only.
        conf_dir: the Hydra config directory.
        out_dir: the output folder (the regeneration commands pass the reference folder).
        log: where the narrowing lines go (default: stderr).
        progress: called once per finished point instead of drawing this run's own progress bar.
        composer: the :class:`~repro.experiments.compose.Composer` that composed ``cfg`` (on ``conf_dir``), whose Hydra
            compositions the points then reuse.
        overwrite: replace the run ``out_dir`` holds, whatever it is (the regeneration commands; ``overwrite=true``).
        render: draw the figures and write summary.md (a robustness study's settings need points.csv only).
        memo: rows of points already run in this process, by (system, config hash), reused instead of run again
            and updated with this run's (a robustness study hands one to all its settings).
        planned: the run's context from :func:`plan_experiment` (``cfg``, ``overrides``, ``conf_dir``, ``out_dir`` and
            ``log`` were given there), its points perhaps already submitted to a shared pool.
    """
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    ctx = planned or prepare_run(cfg, overrides, conf_dir, out_dir, say)
    ctx.progress = progress
    ctx.composer = composer
    ctx.overwrite = overwrite
    ctx.memo = memo

    def manifest_of(**extra: Any) -> dict[str, Any]:
        return {**build_manifest(
            ctx.spec, to_dict(cfg), quick=ctx.quick, n_jobs=ctx.n_jobs, overrides=ctx.overrides, conf_dir=conf_dir,
            notes=ctx.notes, sources=ctx.sources, command_line=ctx.shown_overrides, narrowed=ctx.narrowed,
            narrowed_axes=ctx.narrowed_axes,
            started=started, wall_s=time.perf_counter() - t0, engines=ctx.engines,
            engine_warning=ctx.engine_warning), **extra}

    try:
        points, num_run = KINDS[ctx.spec.kind](ctx)
    except Interrupted as stop:
        if stop.wrote:  # say what the folder now holds (its summary and figures are not redrawn)
            with signals_held(deliver=False):
                stopped = {"signal": signal.Signals(stop.signum).name, "points_saved": stop.saved,
                           "points_total": stop.total}
                atomic_write_text(ctx.out_dir / "manifest.json",
                                  json.dumps(manifest_of(interrupted=stopped), indent=2, default=str) + "\n")
        raise
    manifest = manifest_of()
    atomic_write_text(ctx.out_dir / "manifest.json", json.dumps(manifest, indent=2, default=str) + "\n")
    warning = datasources.warning(manifest["data"])
    if warning:
        say(warning)
    if render:
        from repro.experiments import render as draw

        draw.render(ctx.out_dir, manifest, points)
    verdicts = claim_verdicts(ctx.spec, points, ctx.narrowed_axes) if ctx.spec.kind != "calibration" else {}
    return ExperimentResult(ctx.spec.name, ctx.out_dir, points, manifest, num_run, time.perf_counter() - t0, verdicts)


def plan_experiment(cfg: DictConfig, overrides: Sequence[str] = (), conf_dir: Path = CONF_DIR,
                    out_dir: Path | None = None, log: Callable[[str], None] | None = None,
                    pool: PointPool | None = None) -> RunContext:
    """An experiment checked and, with a shared ``pool``, its points composed and submitted to it: the ``planned``
    context :func:`run_experiment` then runs (``repro check`` and ``repro all`` plan the next experiments while one
    runs, :func:`repro.experiments.check.run_many`)."""
    ctx = prepare_run(cfg, overrides, conf_dir, out_dir, log or (lambda line: print(line, file=sys.stderr,
                                                                                       flush=True)))
    ctx.pool = pool
    submit_ahead(ctx)
    return ctx


def add_systems(cfg: DictConfig, overrides: Sequence[str], conf_dir: Path) -> None:
    """``exp.systems=[+NAME, ...]``: the experiment's own systems (its quick list with ``quick=true``) and then
    these, written into ``cfg.exp.systems`` (bring your own policy to every scenario of an experiment, e.g. the
    league). A list without ``+`` replaces the experiment's, as before."""
    from omegaconf import open_dict

    listed = OmegaConf.select(cfg, "exp.systems")
    items = list(OmegaConf.to_container(listed)) if listed is not None else []  # type: ignore[arg-type]
    added = [s for s in items if isinstance(s, str) and s.startswith("+")]
    if not added:
        return
    if len(added) != len(items):
        raise ConfigError(f"exp.systems={items}: either every entry adds to the experiment's systems (+NAME) or "
                          "none does (a list without + replaces them)")
    name = exp_name(overrides)
    path = conf_dir / "exp" / f"{name}.yaml"
    if name is None or not path.is_file():
        raise ConfigError(f"exp.systems={items}: +NAME adds to an experiment's systems; name the experiment "
                          "(+exp=NAME)")
    own = OmegaConf.to_container(OmegaConf.load(path)).get("exp", {})  # type: ignore[union-attr]
    quick_list = (own.get("quick") or {}).get("systems") if cfg.get("quick") else None
    with open_dict(cfg):
        cfg.exp.systems = [*(quick_list or own.get("systems") or []), *(s[1:] for s in added)]


def check_out_dir(out: Path) -> None:
    """The output folder can be written, or created, before any point runs (ConfigError naming it otherwise)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out_dir={display_path(out)}: exists and is not a folder")
    base = out
    while not base.exists():
        base = base.parent
    try:  # a folder made and removed at once: the only test of writing that holds for every user and file system
        if not base.is_dir():
            raise NotADirectoryError(base)
        os.rmdir(tempfile.mkdtemp(prefix=".repro-probe-", dir=base))
    except OSError as exc:
        what = "cannot be written" if base == out else f"cannot be created in {display_path(base)}"
        raise ConfigError(f"out_dir={display_path(out)}: {what} ({exc.strerror or type(exc).__name__})") from None


def prepare_run(cfg: DictConfig, overrides: Sequence[str], conf_dir: Path, out_dir: Path | None,
                say: Callable[[str], None]) -> RunContext:
    """Check the experiment and the command line (:class:`ConfigError` naming the key), apply quick mode and the
    command line's narrowing (each narrowing said on ``say``); the run's context, nothing written yet."""
    add_systems(cfg, overrides, conf_dir)
    check_frozen_interpolations(OmegaConf.to_container(cfg.exp, resolve=False))
    exp_raw = to_dict(cfg.exp)
    ExpSpec.parse(exp_raw)  # the block as written: a typo is named before anything else
    groups = group_overrides(conf_dir)
    user = narrow.parse(overrides, cfg, groups)
    chosen = next((str(u.value) for u in user if u.key == "exp"), None)
    check_keys([u.key for u in user if u.added and not u.group], known_top_keys(conf_dir, chosen))
    check_grid_keys(exp_raw, conf_dir, chosen)
    quick = bool(cfg.get("quick"))
    # what the command line set under exp (exp.grid.rps=[...], exp.systems=[...]) wins over the quick block
    exp, quick_overrides = apply_quick(exp_raw, quick, [u.key[4:] for u in user if u.key.startswith("exp.")])
    check_values(cfg, ExpSpec.parse(exp), first=[u.key for u in user])
    check_data_root(cfg)
    narrowed = narrow.narrow(exp, user)
    spec = ExpSpec.parse(narrowed.exp)
    for line in narrowed.lines:
        say(f"narrowed: {line}")
    if spec.kind not in KINDS:
        raise ConfigError(f"exp.kind: unknown kind '{spec.kind}' (known: {', '.join(KINDS)})")
    if spec.missing():
        raise ConfigError(f"experiment {spec.name} runs on real models and needs {', '.join(spec.missing())}: "
                          f"{REAL_INSTALL}")
    changes = [f"{u.key}={setting_text(u.value)}" for u in user if u.key not in narrow.RUN_KEYS]
    out = Path(out_dir or cfg.get("out_dir") or default_out_dir(spec.name, quick, changes))
    check_out_dir(out)
    n_jobs = int(cfg.get("n_jobs") or os.cpu_count() or 1)
    ctx = RunContext(cfg, spec, list(overrides), conf_dir, out, n_jobs, quick, quick_overrides)
    ctx.narrowed = narrowed.lines
    ctx.narrowed_axes = narrowed.one_value
    ctx.say = say
    ctx.shown_overrides = [u.text for u in user if u.key not in narrow.RUN_KEYS]
    return ctx
