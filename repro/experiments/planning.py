"""Planning a sweep's points: each point's overrides, composed config (or :class:`Recipe`), resolved dict and config
hash, and their submission to the shared pool of ``repro check`` and ``repro all`` ahead of the run
(:func:`submit_ahead`); :func:`repro.experiments.runner.run_sweep` runs them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from repro.experiments.compose import Composer, Recipe, as_config, hydra_context, to_dict
from repro.experiments.grid import Point, by_workload, expand_points, group_overrides, override
from repro.experiments.results import dict_hash

if TYPE_CHECKING:
    from repro.experiments.runner import RunContext


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
