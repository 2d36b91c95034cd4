"""Running an experiment's points: in-process, in a process pool, as Ray tasks or as submitit (Slurm) jobs.

Each launcher runs :func:`run_one` per point and hands every :class:`Outcome` to the caller's ``on_done`` in this
process as it finishes, so points.csv has one writer whichever launcher runs the points
(:mod:`repro.experiments.runner`). :class:`ProgressLines` reports progress where tqdm's bar is off. A
:class:`PointPool` is a process pool several experiments share (``repro check``, ``repro all``): their points are
submitted ahead and each distinct point runs once.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pandas as pd
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException, ReadonlyConfigError
from tqdm import tqdm

from repro.core.errors import ConfigError, ReproError
from repro.experiments.compose import Recipe, lent, one_line, to_dict
from repro.experiments.stopping import signals_held, stop_workers, worker_init


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
    rounds: pd.DataFrame | None = None


def run_one(index: int, cfg: DictConfig | Recipe, keep_tables: bool) -> Outcome:
    """Simulate one point (in a worker or in-process; ``cfg`` its config, or a :class:`Recipe` of it); config
    mistakes come back as :class:`ConfigError`."""
    from repro.experiments import simulate

    t0 = time.perf_counter()
    try:
        with lent(cfg) as point:
            res = simulate.run_point(point, latencies=keep_tables)
            keep = (point.get("save_columns"), point.get("save_step_columns")) if keep_tables else (None, None)
    except ReproError:
        raise
    except ReadonlyConfigError:  # (nothing in a run writes its config; were something to, a copy of its own)
        if not isinstance(cfg, Recipe):
            raise
        return run_one(index, cfg.config(), keep_tables)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(one_line(exc)) from None
    wall = time.perf_counter() - t0
    return Outcome(
        index,
        dict(res.metrics),
        list(res.notes),
        wall,
        saved_columns(res.requests, keep[0]) if keep_tables else None,
        saved_columns(res.steps, keep[1], "save_step_columns", "start_at")
        if keep_tables and res.steps is not None else None,
        list(res.provenance),
        res.rounds if keep_tables else None,
    )


def saved_columns(table: pd.DataFrame, keep: Any, knob: str = "save_columns", always: str = "rid") -> pd.DataFrame:
    """The requests table as ``save_columns`` asks (``rid`` always; None: every column), or the steps table as
    ``save_step_columns`` does (``start_at`` always); a name the table lacks is a :class:`ConfigError` naming it."""
    if keep is None:
        return table
    what = "requests" if always == "rid" else "steps"
    names = [str(c) for c in keep] if isinstance(keep, Sequence) and not isinstance(keep, str) else None
    if names is None:
        raise ConfigError(f"{knob}: expected a list of {what}-table columns or null, got {keep!r}")
    unknown = [c for c in names if c not in table.columns]
    if unknown:
        raise ConfigError(f"{knob}: no {what}-table column(s) {unknown} (columns: "
                          f"{', '.join(map(str, table.columns))})")
    return table[[c for c in table.columns if c == always or c in names]]


class ProgressLines:
    """Progress for a log file or a pipe (where tqdm's bar is off): a line every ``every_s`` seconds of wall time
    and at the end, ``NAME: 30/90 points, 35 s elapsed, about 70 s left``."""

    def __init__(self, name: str, total: int, done: int = 0, enabled: bool = True, every_s: float = 10.0) -> None:
        self.name, self.total, self.done, self.enabled, self.every_s = name, total, done, enabled, every_s
        self.t0 = self.last = time.perf_counter()
        self.start = done
        self.first: float | None = None  # when the first point finished

    def update(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        if not self.enabled or (now - self.last < self.every_s and self.done < self.total):
            return
        self.last = now
        elapsed = now - self.t0
        rest = self.total - self.done
        left = f", about {self.left_s(now):.0f} s left" if rest and self.left_s(now) is not None else ""
        print(f"{self.name}: {self.done}/{self.total} points, {elapsed:.0f} s elapsed{left}", file=sys.stderr,
              flush=True)

    def left_s(self, now: float) -> float | None:
        """The time left at the points' measured rate: the points finished since the first one over the time since
        it finished (the wait for the first, the workers' start-up included, is not a point's time), once three
        have finished after it; None before."""
        since = self.done - self.start - 1
        if self.first is None or since < 3 or now <= self.first:
            return None
        return (now - self.first) / since * (self.total - self.done)


class PointPool:
    """A process pool that outlives one experiment (``repro check`` and ``repro all`` hand one to every experiment
    they run, :func:`repro.experiments.check.run_many`).

    An experiment's points are submitted as soon as it is composed (:meth:`submit`), while the experiment before it
    still runs, so the workers do not wait while this process composes the next experiment, compares the last one
    with its reference or draws its figures, and the last points of one experiment share the workers with the next
    one's. A point whose config (its hash, seeds included) was submitted before, by this experiment or an earlier one,
    with the same tables asked for, is not run again: a point is a function of its composed config, and the
    catalogue repeats some (Nightjar's Tables 4 and 5 run the same 189 points; AdaServe's figures share their
    baselines). Its outcome is handed to each experiment that asks, under that experiment's point index. The workers
    start at the first submission and stay up until :meth:`close`, so their one-off costs (imports, the compiled step
    kernels, :mod:`repro.core.jit`) are paid once per pool instead of once per experiment."""

    def __init__(self, n_jobs: int) -> None:
        self.n_jobs = max(1, int(n_jobs))
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[tuple[str, bool], Future[Outcome]] = {}
        self.passed: set[str] = set()  # what the points of experiments run on it passed (validate.check_point)
        self.workloads: set[str] = set()  # the (workload, model) their request tables were built for (check_workload)

    def submit(self, key: str, cfg: DictConfig | Recipe, keep: bool) -> Future[Outcome]:
        """The future of the point whose config hash is ``key`` (``keep``: with its tables), submitted if new."""
        fut = self._futures.get((key, keep))
        if fut is None:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=self.n_jobs, initializer=worker_init,
                                                 initargs=(os.getpid(),))
            fut = self._futures[(key, keep)] = self._pool.submit(run_one, 0, cfg, keep)
        return fut

    def forget(self, key: str, keep: bool) -> None:
        """Drop a point's outcome once used (one with tables: they are written to the experiment's folder)."""
        self._futures.pop((key, keep), None)

    def queued(self) -> int:
        """Points submitted and not finished."""
        return sum(not f.done() for f in self._futures.values())

    def wait_idle(self) -> None:
        """Wait until every point submitted has finished (before points measured on real models run here)."""
        wait(list(self._futures.values()))

    def stop(self) -> None:
        """Stop the workers now (Ctrl-C, a failed point): nothing submitted runs any more."""
        if self._pool is not None:
            with signals_held(deliver=False):
                stop_workers(self._pool)
            self._pool = None
        self._futures.clear()

    def close(self) -> None:
        if self._pool is not None:
            for fut in self._futures.values():
                fut.cancel()
            self._pool.shutdown()
            self._pool = None
        self._futures.clear()

    def __enter__(self) -> PointPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.stop()


def execute(
    todo: list[int], cfgs: Sequence[DictConfig | Recipe], keep: Sequence[bool], n_jobs: int,
    on_done: Callable[[Outcome], Any], describe: Callable[[int], str] = str, pool: PointPool | None = None,
    keys: Sequence[str] = (),
) -> None:
    """Run points ``todo`` in-process (n_jobs=1) or in a process pool (``keep[i]``: return point i's tables);
    ``on_done`` gets each outcome as it ends. A point's :class:`ReproError` stops the run, named by ``describe``;
    so does Ctrl-C, after stopping the pool's workers (:mod:`repro.experiments.stopping`). With a shared ``pool``
    the points are taken from it, submitted unless they were; ``keys`` (each point's config hash) tell which points
    are one (by default every point is its own)."""
    ids = list(keys) or [str(i) for i in range(len(cfgs))]
    if pool is not None:
        _collect(todo, cfgs, keep, on_done, describe, pool, ids)
        return
    if n_jobs <= 1 or len(todo) <= 1:
        for i in todo:
            on_done(_named(i, describe, partial(run_one, i, cfgs[i], keep[i])))
        return
    with PointPool(min(n_jobs, len(todo))) as own:
        _collect(todo, cfgs, keep, on_done, describe, own, ids)


def _collect(todo: list[int], cfgs: Sequence[DictConfig | Recipe], keep: Sequence[bool],
             on_done: Callable[[Outcome], Any], describe: Callable[[int], str], pool: PointPool,
             keys: Sequence[str]) -> None:
    """:func:`execute` on a :class:`PointPool`: each outcome handed on as its point finishes, in point order among
    those finished together, once per point of this experiment that shares it; the pool's workers stopped on any
    error or Ctrl-C."""
    users: dict[Future[Outcome], list[int]] = {}
    for i in todo:
        users.setdefault(pool.submit(keys[i], cfgs[i], bool(keep[i])), []).append(i)
    pending = set(users)
    try:
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=lambda f: users[f][0]):
                for i in users[fut]:
                    on_done(replace(_named(i, describe, fut.result), index=i))
                    if keep[i]:
                        pool.forget(keys[i], True)
    except BaseException:
        pool.stop()
        raise


def _named(i: int, describe: Callable[[int], str], get: Callable[[], Outcome]) -> Outcome:
    """``get()``, a :class:`ReproError` it raises prefixed with point ``i``'s name."""
    try:
        return get()
    except ReproError as exc:
        try:
            named = type(exc)(f"{describe(i)}: {exc}")
        except TypeError:  # an error class with a constructor of its own
            named = ReproError(f"{describe(i)}: {exc}")
        raise named from None


def execute_ray(todo: list[int], cfgs: list[DictConfig], keep: Sequence[bool], n_jobs: int,
                 on_done: Callable[[Outcome], Any], launcher: Any, describe: Callable[[int], str]) -> None:
    """Run points ``todo`` as Ray tasks (``launcher=ray``): on a local Ray of ``n_jobs`` CPUs, or on the cluster at
    ``launcher.address``. Outcomes come back to this process, which appends them to points.csv as they finish (one
    writer: the same atomic appends and resume as a local run). A point that fails is reported at once with its
    overrides while the others go on; the run then fails naming every failed point."""
    if not todo:
        return
    try:
        import ray
    except ImportError:
        raise ConfigError("launcher=ray needs Ray: pip install -e '.[ray]'") from None
    address = launcher.get("address")
    started = not ray.is_initialized()
    if started:
        kw: dict[str, Any] = {"address": str(address)} if address else {"num_cpus": n_jobs}
        ray.init(**kw, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    task = ray.remote(num_cpus=float(launcher.get("num_cpus") or 1))(run_one)
    refs = {task.remote(i, cfgs[i], keep[i]): i for i in todo}
    failed: list[str] = []
    try:
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                i = refs.pop(ref)
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    cause = getattr(exc, "cause", None) or exc
                    failed.append(f"{describe(i)}: {one_line(cause)}")
                    tqdm.write(f"failed: {failed[-1]}", file=sys.stderr)
                    continue
                on_done(out)
    finally:
        for ref in refs:
            ray.cancel(ref)
        if started:
            ray.shutdown()
    if failed:
        raise ReproError(f"{len(failed)} point(s) failed on Ray (the others are in points.csv): " + "; ".join(failed))


def execute_submitit(todo: list[int], cfgs: list[DictConfig], keep: Sequence[bool], on_done: Callable[[Outcome], Any],
                      launcher: Any, describe: Callable[[int], str]) -> None:
    """Run points ``todo`` as submitit jobs (``launcher=submitit``): Slurm jobs, or local processes with
    ``launcher.cluster=local``. As on Ray, outcomes come back here to be appended, a failed point is reported with its
    overrides while the others go on, and the run then fails naming every failed point."""
    if not todo:
        return
    try:
        import submitit
    except ImportError:
        raise ConfigError("launcher=submitit needs submitit: pip install -e '.[slurm]'") from None
    executor = submitit.AutoExecutor(folder=str(launcher.get("folder") or "runs/submitit/%j"),
                                     cluster=str(launcher.get("cluster") or "slurm"))
    params = launcher.get("parameters")
    executor.update_parameters(**(to_dict(params) if params else {}))
    with executor.batch():
        jobs = {i: executor.submit(run_one, i, cfgs[i], keep[i]) for i in todo}
    failed: list[str] = []
    pending = dict(jobs)
    try:
        while pending:
            for i, job in list(pending.items()):
                if not job.done():
                    continue
                del pending[i]
                try:
                    out = job.result()
                except Exception as exc:  # the job's own exception, or submitit's report of a lost job
                    failed.append(f"{describe(i)}: {one_line(exc)}")
                    tqdm.write(f"failed: {failed[-1]}", file=sys.stderr)
                    continue
                on_done(out)
            if pending:
                time.sleep(0.2)
    except BaseException:  # Ctrl-C: the jobs still queued or running are cancelled, not left behind
        with signals_held(deliver=False):
            for job in pending.values():
                job.cancel(check=False)
        raise
    if failed:
        raise ReproError(f"{len(failed)} point(s) failed on {launcher.get('cluster')} (the others are in points.csv): "
                         + "; ".join(failed))
