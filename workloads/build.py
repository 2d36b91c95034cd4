"""Build a :class:`RequestTable` (arrivals, lengths, datasets, SLO classes) from the ``workload`` config node.

Pipeline, each step with its own generator spawned from the caller's ``SeedSequence`` (arrivals, classes, dataset
choice, lengths), so changing e.g. the class proportions leaves the arrival times unchanged:

1. arrivals (``workloads.arrivals``); trace replay also yields the trace record behind each arrival;
2. SLO classes: exact counts ``round(p · n)`` (largest remainder), randomly permuted over requests;
3. dataset per request: the class's own datasets if it has any, else the phase active at the request's arrival time
   (or index), else the workload's mixture; drawn i.i.d. by weight;
4. lengths per dataset (:mod:`workloads.lengths`): real records (shuffled, cycled when more are needed, like vLLM's
   sampling without replacement) or the embedded table (``workloads.stats``); missing reference outputs are drawn
   from the ShareGPT output-length table (or fixed by ``output_len``); ``max_model_len`` filters (redraws) or
   truncates.

Every source used is recorded as a :class:`~workloads.provenance.DataSource` (``RequestTable.provenance``) and its
note joined into ``RequestTable.source``. A user's trace file (``arrival.trace: trace_file``, read from
``workload.path``) is replayed like a built-in trace, but never cycled: the first ``num_requests`` records in time
order, or all of them when it has fewer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from workloads import arrivals as arr
from workloads.datasets import DataMissingError, LengthRecords, default_data_root, find_user_path, load_records
from workloads.lengths import LengthDrawer
from workloads.provenance import DataSource
from workloads.spec import TRACE_FILE, DatasetSpec, WorkloadSpec, parse_workload
from workloads.stats import find_gap_table


@dataclass(frozen=True)
class RequestTable:
    """One workload: a row per request, sorted by arrival time."""

    arrival_s: np.ndarray  # float64, sorted ascending, seconds from 0
    prompt_len: np.ndarray  # int64 tokens (target model's tokenizer)
    output_len: np.ndarray  # int64 reference output tokens (>= 1)
    dataset: np.ndarray  # str objects, dataset name per request
    slo_class: np.ndarray  # int64 index into `classes`
    tpot_slo_s: np.ndarray  # float64 (np.inf = none)
    ttft_slo_s: np.ndarray  # float64 (np.inf = none)
    classes: tuple[str, ...]  # class names (("default",) when none configured)
    source: str  # one line: where the lengths and arrivals came from (the provenance details joined)
    provenance: tuple[DataSource, ...] = ()  # one entry per source used, in order of first use
    client: np.ndarray | None = None  # int64 client (dataset index) per request, with ``workload.clients``
    record: np.ndarray | None = None  # int64 record of its dataset's span file each request replays (-1: none)
    record_file: tuple[tuple[str, str, str], ...] = ()  # (dataset, span file path, as notes show it) per span file
    # the record of its dataset each request's lengths were drawn from (-1: none), and each such dataset's records
    # (by the request's ``dataset`` label): what a real backend reads the prompt itself from (workloads.prompts)
    prompt_record: np.ndarray | None = None
    prompt_sources: tuple[tuple[str, LengthRecords], ...] = field(default=(), compare=False, repr=False)
    group: np.ndarray | None = None  # int64 prompt index per request with ``workload.static_batch`` (copies share it)
    max_concurrency: int | None = None  # closed loop: at most this many in flight (``arrival_s``: the releases)

    def subset(self, idx: np.ndarray) -> RequestTable:
        """The requests ``idx`` as a table of their own (same classes, sources and span files)."""
        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[idx]

        return replace(self, arrival_s=self.arrival_s[idx], prompt_len=self.prompt_len[idx],
                       output_len=self.output_len[idx], dataset=self.dataset[idx], slo_class=self.slo_class[idx],
                       tpot_slo_s=self.tpot_slo_s[idx], ttft_slo_s=self.ttft_slo_s[idx], client=pick(self.client),
                       record=pick(self.record), group=pick(self.group), prompt_record=pick(self.prompt_record))

    def __len__(self) -> int:
        return len(self.arrival_s)

    def to_frame(self) -> Any:
        """The table as a pandas DataFrame (class names resolved)."""
        import pandas as pd

        return pd.DataFrame(
            {
                "arrival_s": self.arrival_s,
                "prompt_len": self.prompt_len,
                "output_len": self.output_len,
                "dataset": self.dataset,
                "slo_class": np.asarray(self.classes, dtype=object)[self.slo_class],
                "tpot_slo_s": self.tpot_slo_s,
                "ttft_slo_s": self.ttft_slo_s,
            }
        )


def build_workload(
    cfg: Mapping[str, Any],
    *,
    seed: np.random.SeedSequence,
    tokenizer: str | None = None,
    max_model_len: int | None = None,
    baseline_tpot_s: float | None = None,
) -> RequestTable:
    """Build the request table of the ``workload`` config ``cfg`` (mapping or DictConfig).

    ``tokenizer``: target model family (llama2 | llama3 | qwen) for token counts and table choice.
    ``max_model_len``: requests with prompt + output above it are redrawn (``overlength: filter``) or cut
    (``overlength: truncate``). ``baseline_tpot_s``: resolves ``tpot_slo_x_baseline`` (falls back to the config's
    ``baseline_tpot_ms``). Same cfg and seed → identical table.
    """
    spec = cfg if isinstance(cfg, WorkloadSpec) else parse_workload(cfg)
    if baseline_tpot_s is None and spec.baseline_tpot_ms is not None:
        baseline_tpot_s = spec.baseline_tpot_ms / 1e3
    rng_arrival, rng_class, rng_choice, rng_len = (np.random.default_rng(s) for s in _children(seed, 4))
    root = default_data_root(spec.data_dir)
    ctx = LengthDrawer(spec, root, tokenizer, max_model_len, rng_len)

    # 1. Arrivals.
    times, trace_idx, trace = _arrivals(spec, ctx, rng_arrival)
    n = len(times)

    # 2. SLO classes.
    names = tuple(c for c, _ in spec.slo_classes) or ("default",)
    cls = _assign_classes(spec, n, rng_class)
    tpot, ttft = _slo_targets(spec, cls, baseline_tpot_s)

    # 3. Dataset per request: groups of request indices sharing one DatasetSpec.
    groups = _assign_datasets(spec, times, cls, rng_choice)

    # 4. Lengths per group.
    prompt, output, dataset, client, keep, record, files, prompt_record = _lengths(spec, ctx, n, groups, trace,
                                                                                   trace_idx)

    if spec.trace_slo:
        assert trace is not None and trace_idx is not None
        tpot, names, cls = _trace_slos(trace, trace_idx, baseline_tpot_s)

    sel = np.flatnonzero(keep)
    group = None
    if spec.static_batch is not None:
        # B copies of each prompt, in prompt order; all at t = 0 within their batch (the simulation releases batch
        # j once batch j - 1 has finished: repro.experiments.simulate)
        sel = np.repeat(sel, spec.static_batch)
        group = np.repeat(np.arange(sel.size // spec.static_batch, dtype=np.int64), spec.static_batch)
        times = np.zeros_like(times)
        ctx.notes.append(f"static batches: {spec.static_batch} copies of each of {sel.size // spec.static_batch} "
                         "prompts, one batch after another")
    return RequestTable(
        arrival_s=times[sel].astype(np.float64),
        prompt_len=prompt[sel],
        output_len=output[sel],
        dataset=dataset[sel],
        slo_class=cls[sel].astype(np.int64),
        tpot_slo_s=tpot[sel],
        ttft_slo_s=ttft[sel],
        classes=names,
        source="; ".join(ctx.notes),
        provenance=tuple(ctx.provenance),
        client=client[sel] if spec.clients else None,
        record=record[sel] if (record >= 0).any() else None,
        record_file=files,
        group=group,
        max_concurrency=spec.max_concurrency,
        prompt_record=prompt_record[sel] if (prompt_record >= 0).any() else None,
        prompt_sources=tuple(ctx.sources.items()),
    )


# ---------------------------------------------------------------- steps


def _slo_targets(
    spec: WorkloadSpec, cls: np.ndarray, baseline_tpot_s: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """Each request's TPOT and TTFT targets in seconds from its SLO class (inf: none); a class set as a multiple of
    the baseline TPOT needs ``baseline_tpot_s`` (ValueError)."""
    tpot = np.full(len(cls), np.inf)
    ttft = np.full(len(cls), np.inf)
    for i, (cname, c) in enumerate(spec.slo_classes):
        mask = cls == i
        if c.tpot_slo_ms is not None:
            tpot[mask] = c.tpot_slo_ms / 1e3
        elif c.tpot_slo_x_baseline is not None:
            if baseline_tpot_s is None:
                raise ValueError(
                    f"SLO class {cname!r} is a multiple of the baseline latency: pass "
                    "baseline_tpot_s to build_workload or set workload.baseline_tpot_ms"
                )
            tpot[mask] = c.tpot_slo_x_baseline * baseline_tpot_s
        if c.ttft_slo_ms is not None:
            ttft[mask] = c.ttft_slo_ms / 1e3
    return tpot, ttft


def _lengths(
    spec: WorkloadSpec,
    ctx: LengthDrawer,
    n: int,
    groups: list[tuple[DatasetSpec, np.ndarray]],
    trace: LengthRecords | None,
    trace_idx: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
           tuple[tuple[str, str, str], ...], np.ndarray]:
    """Prompt and output lengths (at least 1 token), dataset label and client index (-1: none) of each of the ``n``
    requests, from its group's dataset; which requests to keep (a replayed trace's records over ``max_model_len``
    are dropped); each one's span-file record (-1: none), the span files read (dataset, path, shown) and each one's
    record of its dataset's file (-1: none; the records in ``ctx.sources``)."""
    prompt = np.zeros(n, dtype=np.int64)
    output = np.zeros(n, dtype=np.int64)
    dataset = np.empty(n, dtype=object)
    client = np.full(n, -1, dtype=np.int64)
    keep = np.ones(n, dtype=bool)
    record = np.full(n, -1, dtype=np.int64)
    prompt_record = np.full(n, -1, dtype=np.int64)
    files: dict[str, tuple[str, str]] = {}
    for ds, idx in groups:
        if spec.clients:
            client[idx] = next(j for j, d in enumerate(spec.datasets) if d is ds)
        if ds.name == "trace" and trace is None:
            # no trace file (its arrivals came from the embedded gaps): lengths from its embedded table
            assert spec.arrival.trace is not None
            p, o = ctx.sample(DatasetSpec(name=spec.arrival.trace, output_len=ds.output_len), len(idx))
            dataset[idx] = ds.label or spec.arrival.trace
        elif ds.name == "trace":
            assert trace is not None and trace_idx is not None
            p, o = trace.prompt_len[trace_idx[idx]], trace.output_len[trace_idx[idx]].copy()
            ctx.record(trace.name, "file", trace.fallback, f"trace: {trace.source}")
            p, o, ok = ctx.fit(p, o, drop=True)
            keep[idx] = ok
            dataset[idx] = ds.label or trace.name
        elif ds.name == "spans":
            p, o, record[idx], path, shown = ctx.spans(ds, len(idx))
            if path is not None and shown is not None:
                if files.get(ds.key, (path, shown)) != (path, shown):
                    raise ValueError(f"dataset label {ds.key!r} names two span files: give each its own label")
                files[ds.key] = (path, shown)
            dataset[idx] = ds.key
        else:
            p, o, prompt_record[idx] = ctx.sample_records(ds, len(idx))
            dataset[idx] = ds.key
        prompt[idx], output[idx] = np.maximum(p, 1), np.maximum(o, 1)  # empty references count as 1 token
    return (prompt, output, dataset, client, keep, record, tuple((k, *v) for k, v in files.items()),
            prompt_record)


def _trace_slos(
    trace: LengthRecords, trace_idx: np.ndarray, baseline_tpot_s: float | None
) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
    """``trace_slo``: each request's TPOT target from its AdaServe trace record (a ratio > 0 is a multiple of
    ``baseline_tpot_s``, else minus milliseconds); returns the targets, the class names and each request's class."""
    if trace.tpot_slo_ratio is None:
        raise ValueError(f"trace_slo needs an AdaServe artifact trace, got {trace.name}")
    ratio = trace.tpot_slo_ratio[trace_idx]
    if (ratio > 0).any() and baseline_tpot_s is None:
        raise ValueError(
            "trace_slo with slo_ratio > 0 needs baseline_tpot_s (or workload.baseline_tpot_ms)"
        )
    tpot = np.where(ratio > 0, ratio * (baseline_tpot_s or 0.0), -ratio / 1e3)
    labels = [f"x{r:g}" if r > 0 else f"{-r:g}ms" for r in ratio]
    names = tuple(sorted(set(labels), key=lambda s: (not s.startswith("x"), float(s.strip("xms")))))
    cls = np.array([names.index(lab) for lab in labels], dtype=np.int64)
    return tpot, names, cls


def _children(seed: np.random.SeedSequence, n: int) -> list[np.random.SeedSequence]:
    """The children ``seed.spawn(n)`` gives on a fresh ``seed``, without advancing its spawn counter (so the
    same SeedSequence object always builds the same table)."""
    return [
        np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, i), pool_size=seed.pool_size)
        for i in range(n)
    ]


def _arrivals(
    spec: WorkloadSpec, ctx: LengthDrawer, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray | None, LengthRecords | None]:
    a, n = spec.arrival, spec.num_requests
    if a.kind == "poisson":
        assert a.rate_per_s is not None
        if np.isinf(a.rate_per_s):
            return np.zeros(n), None, None
        return arr.poisson_arrivals(n, a.rate_per_s, rng), None, None
    if a.kind == "gamma":
        assert a.rate_per_s is not None
        return arr.gamma_arrivals(n, a.rate_per_s, a.cv, rng), None, None
    if a.kind == "piecewise":
        return arr.piecewise_arrivals(a.segments, rng, n), None, None
    assert a.trace is not None
    if a.trace == TRACE_FILE:
        return _trace_file_arrivals(spec, ctx)
    try:
        if ctx.root is None:
            raise DataMissingError(f"trace {a.trace!r} needs its file: set $REPRO_DATA (no data folder found)")
        trace = load_records(a.trace, str(ctx.root), None)
    except DataMissingError:
        gaps = find_gap_table(a.trace) if spec.source != "real" and not spec.trace_slo else None
        if gaps is None:
            raise
        # embedded fallback: i.i.d. gaps from the trace's committed inter-arrival quantiles (burstiness kept,
        # the order of gaps not), at the target rate or the trace's own
        mean_gap = 1.0 / a.rate_per_s if a.rate_per_s else gaps.mean_gap_s
        times = np.cumsum(gaps.sample(n, rng)) * mean_gap
        rate = f"{a.rate_per_s} req/s" if a.rate_per_s else "its native rate"
        ctx.record(a.trace, "embedded", True,
                   f"arrivals: embedded inter-arrival quantiles of trace {a.trace} (cv {gaps.cv:.2f}; no trace file), "
                   f"at {rate}", role="arrivals")
        return times - times[0], None, None  # the first request arrives at 0, as in a replayed window
    if trace.timestamps_s is None:
        raise ValueError(f"arrival.trace={a.trace!r} has no timestamps")
    times, idx = arr.replay_trace(
        trace.timestamps_s, n, target_rate_per_s=a.rate_per_s, start_s=a.start_s, window_s=a.window_s
    )
    rate = f"rescaled to {a.rate_per_s} req/s" if a.rate_per_s else "native rate"
    ctx.record(trace.name, "file", False, f"arrivals: trace {trace.name} ({rate})", role="arrivals")
    return times, idx, trace


def _trace_file_arrivals(spec: WorkloadSpec, ctx: LengthDrawer) -> tuple[np.ndarray, np.ndarray, LengthRecords]:
    """Replay the user's trace file ``workload.path``: its first ``num_requests`` records in time order (all of
    them when it has fewer; never cycled), time-rescaled to ``arrival.rate_per_s`` when set."""
    from workloads.tracefile import load_trace_file

    a = spec.arrival
    assert spec.path is not None
    path, shown = find_user_path(spec.path, ctx.root, "workload.path")
    trace = load_trace_file(path, shown, spec.format)
    assert trace.timestamps_s is not None
    hi = np.inf if a.window_s is None else a.start_s + a.window_s
    avail = int(np.count_nonzero((trace.timestamps_s >= a.start_s) & (trace.timestamps_s < hi)))
    n = min(spec.num_requests, max(avail, 1))  # an empty window: replay_trace names it
    times, idx = arr.replay_trace(
        trace.timestamps_s, n, target_rate_per_s=a.rate_per_s, start_s=a.start_s, window_s=a.window_s
    )
    window = f" in [{a.start_s:g}, {hi:g}) s" if a.window_s is not None or a.start_s else ""
    fewer = f"; num_requests={spec.num_requests}, the file has fewer" if n < spec.num_requests else ""
    rate = f"rescaled to {a.rate_per_s} req/s" if a.rate_per_s else "native rate"
    ctx.record(TRACE_FILE, "file", False, f"arrivals: trace file {shown}, first {n} of {avail} records{window} "
               f"({rate}{fewer})", role="arrivals")
    return times, idx, trace


def _assign_classes(spec: WorkloadSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    if not spec.slo_classes:
        return np.zeros(n, dtype=np.int64)
    given = [c.proportion for _, c in spec.slo_classes]
    fixed = sum(p for p in given if p is not None)
    free = sum(p is None for p in given)
    if fixed > 1 + 1e-9 or (free == 0 and abs(fixed - 1) > 1e-6):
        raise ValueError(f"SLO class proportions must sum to 1 (got {fixed} with {free} unset)")
    rest = (1 - fixed) / free if free else 0.0
    props = np.array([rest if p is None else p for p in given])
    # Exact counts by largest remainder, then a random permutation over requests.
    raw = props * n
    counts = np.floor(raw).astype(np.int64)
    counts[np.argsort(-(raw - counts), kind="stable")[: n - counts.sum()]] += 1
    return rng.permutation(np.repeat(np.arange(len(props)), counts))


def _assign_datasets(
    spec: WorkloadSpec, times: np.ndarray, cls: np.ndarray, rng: np.random.Generator
) -> list[tuple[DatasetSpec, np.ndarray]]:
    n = len(times)
    mixture_of = np.zeros(n, dtype=np.int64)  # index into `mixtures`
    mixtures: list[tuple[DatasetSpec, ...]] = []
    if spec.phases:
        for ph in spec.phases:
            start = ph.start_s if ph.start_s is not None else None
            active = (
                times >= start if start is not None else np.arange(n) >= round((ph.start_fraction or 0) * n)
            )
            mixture_of[active] = len(mixtures)
            mixtures.append(ph.datasets)
    else:
        mixtures.append(spec.datasets)
    for i, (_, c) in enumerate(spec.slo_classes):
        if c.datasets:
            mixture_of[cls == i] = len(mixtures)
            mixtures.append(c.datasets)
    groups: list[tuple[DatasetSpec, np.ndarray]] = []
    for m, mix in enumerate(mixtures):
        idx = np.flatnonzero(mixture_of == m)
        if not len(idx):
            continue
        if not mix:
            raise ValueError(
                "some requests have no dataset: give workload.datasets or datasets on every class"
            )
        w = np.array([d.weight for d in mix], dtype=np.float64)
        if w.sum() <= 0:
            raise ValueError("dataset weights must not all be 0")
        if spec.clients:  # one client per dataset: dealt round-robin, so every client gets its share
            pick = np.arange(len(idx)) % len(mix)
        else:
            pick = rng.choice(len(mix), size=len(idx), p=w / w.sum()) if len(mix) > 1 else np.zeros(len(idx), int)
        groups += [(d, idx[pick == j]) for j, d in enumerate(mix) if (pick == j).any()]
    return groups
