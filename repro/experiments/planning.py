"""Planning a sweep's points: the run's context (:class:`RunContext`), each point's overrides, composed config (or
:class:`Recipe`), resolved dict and config hash, and their submission to the shared pool of ``repro check`` and
``repro all`` ahead of the run (:func:`submit_ahead`); :func:`repro.experiments.runner.run_sweep` runs them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from repro.experiments.compose import Composer, Recipe, as_config, hydra_context, to_dict
from repro.experiments.expspec import ExpSpec
from repro.experiments.grid import Point, by_workload, expand_points, group_overrides, override
from repro.experiments.launch import PointPool
from repro.experiments.results import dict_hash


@dataclass
class RunContext:
    """Everything an experiment kind needs."""

    cfg: DictConfig
    spec: ExpSpec  # after quick mode and the command line's narrowing
    overrides: list[str]
    conf_dir: Path
    out_dir: Path
    n_jobs: int
    quick: bool
    quick_overrides: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)  # every point's workload DataSource entries
    narrowed: list[str] = field(default_factory=list)  # one line per narrowing the command line made
    narrowed_axes: list[str] = field(default_factory=list)  # swept axes the command line narrowed to one value
    shown_overrides: list[str] = field(default_factory=list)  # the command line, minus run-control keys
    progress: Callable[[], None] | None = None  # an outer progress bar (repro all) instead of this run's own
    composer: Composer | None = None  # the command line's (its Hydra compositions reused for the points)
    overwrite: bool = False  # replace whatever run out_dir holds (the regeneration commands; overwrite=true)
    say: Callable[[str], None] = print  # where the run's console lines go (run_experiment: stderr)
    engines: dict[str, str] = field(default_factory=dict)  # system label -> its points' engine profile(s)
    engine_warning: bool = False  # the command line chose systems that run on different engine profiles
    # points already run in this process, by (system, config hash): a robustness study's settings share the points
    # their knobs leave unchanged (a point is a function of its composed config, seeds included)
    memo: dict[tuple[str, str], dict[str, str]] | None = None
    # a process pool shared with other experiments (repro check, repro all: launch.PointPool), and the sweep's
    # points, configs, their resolved dicts and config hashes when they were composed ahead of the run to be
    # submitted to it
    pool: PointPool | None = None
    composed: tuple[list[Point], list[DictConfig | Recipe], list[dict[str, Any]], list[str]] | None = None



def _point_overrides(ctx: RunContext) -> tuple[list[Point], list[list[str]]]:
    """The experiment's grid points and each one's overrides (exp.quick's first, so the user's command line still
    wins over them)."""
    groups = group_overrides(ctx.conf_dir)
    points = expand_points(ctx.spec, groups)
    base = [*(override(k, v, groups) for k, v in ctx.quick_overrides.items()), *ctx.overrides]
    return points, [[*base, *p.overrides] for p in points]


def compose_points(ctx: RunContext) -> tuple[list[Point], list[DictConfig]]:
    """The experiment's grid points and each one's composed config."""
    points, lines = _point_overrides(ctx)
    with hydra_context(ctx.conf_dir):
        compose = ctx.composer or Composer(ctx.conf_dir)
        cfgs = [compose(line, where=f"point {p.describe()}: ") for p, line in zip(points, lines, strict=True)]
    return points, cfgs


def shares_pool(ctx: RunContext) -> bool:
    """Whether this run's points go to a shared :class:`~repro.experiments.launch.PointPool`: a local sweep's,
    not resumed."""
    launcher = ctx.cfg.get("launcher") or {}
    return (ctx.pool is not None and ctx.spec.kind == "sweep" and not ctx.cfg.get("resume")
            and str(launcher.get("kind", "local")) == "local")


def is_real(cfg: DictConfig | Recipe) -> bool:
    """Whether a point runs on a real backend (a :class:`Recipe` never does: :func:`plan_points` builds those)."""
    if isinstance(cfg, Recipe):
        return False
    return str(OmegaConf.select(cfg, "backend.kind", default="sim")) != "sim"


def runs_real(ctx: RunContext) -> bool:
    """Whether a planned run has points on a real backend (run here, one at a time, on an otherwise idle machine)."""
    return ctx.composed is not None and any(is_real(c) for c in ctx.composed[1])


def submit_ahead(ctx: RunContext) -> None:
    """Compose a sweep's points and submit the simulated ones to the shared pool before the run (the experiments
    before it may still be running); :func:`run_sweep` then reads them from ``ctx.composed``."""
    if not shares_pool(ctx) or ctx.composed is not None:
        return
    assert ctx.pool is not None
    points, cfgs, resolved = plan_points(ctx)
    hashes = [dict_hash(d) for d in resolved]
    ctx.composed = (points, cfgs, resolved, hashes)
    for i in by_workload(points, range(len(points))):
        if not is_real(cfgs[i]):
            ctx.pool.submit(hashes[i], cfgs[i], bool(resolved[i].get("save_requests")))


def plan_points(ctx: RunContext) -> tuple[list[Point], list[DictConfig | Recipe], list[dict[str, Any]]]:
    """:func:`compose_points` and :func:`resolve_points` at once, each point's config a :class:`Recipe` where
    it can be (:meth:`Composer.planned`: no copy of the composition per point in this process; the worker builds
    it)."""
    points, lines = _point_overrides(ctx)
    with hydra_context(ctx.conf_dir):
        compose = ctx.composer or Composer(ctx.conf_dir)
        planned = [compose.planned(line, where=f"point {p.describe()}: ")
                   for p, line in zip(points, lines, strict=True)]
    # a point on a real backend runs in this process: its config itself (is_real reads it)
    real = [str((r.get("backend") or {}).get("kind", "sim")) != "sim" for _, r in planned]
    return points, [as_config(c) if on else c for (c, _), on in zip(planned, real, strict=True)], \
        [r for _, r in planned]


def resolve_points(cfgs: Sequence[DictConfig]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each point's config as a plain resolved dict (OmegaConf resolves a config once here, not once per reader)
    and its :func:`~repro.experiments.results.config_hash`."""
    resolved = [to_dict(c) for c in cfgs]
    return resolved, [dict_hash(d) for d in resolved]
