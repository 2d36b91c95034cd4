"""Build a :class:`RequestTable` (arrivals, lengths, datasets, SLO classes) from the ``workload`` config node.

Pipeline, each step with its own generator spawned from the caller's ``SeedSequence`` (arrivals, classes, dataset
choice, lengths), so changing e.g. the class proportions leaves the arrival times unchanged:

1. arrivals (``workloads.arrivals``); trace replay also yields the trace record behind each arrival;
2. SLO classes: exact counts ``round(p · n)`` (largest remainder), randomly permuted over requests;
3. dataset per request: the class's own datasets if it has any, else the phase active at the request's arrival time
   (or index), else the workload's mixture; drawn i.i.d. by weight;
4. lengths per dataset: real records (shuffled, cycled when more are needed, like vLLM's sampling without
   replacement) or the embedded table (``workloads.stats``); missing reference outputs are drawn from the ShareGPT
   output-length table (or fixed by ``output_len``); ``max_model_len`` filters (redraws) or truncates.

Every source used is recorded as a :class:`~workloads.provenance.DataSource` (``RequestTable.provenance``) and its
note joined into ``RequestTable.source``. A user's trace file (``arrival.trace: trace_file``, read from
``workload.path``) is replayed like a built-in trace, but never cycled: the first ``num_requests`` records in time
order, or all of them when it has fewer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workloads import arrivals as arr
from workloads.datasets import (
    DataMissingError,
    LengthRecords,
    check_dataset,
    default_data_root,
    find_user_path,
    load_records,
    vllm_sharegpt_keep,
)
from workloads.provenance import DataSource, show_path
from workloads.sonnet import SonnetLines, load_sonnet_lines, sample_sonnet
from workloads.spec import TRACE_FILE, DatasetSpec, WorkloadSpec, parse_workload
from workloads.stats import (
    ASSUMED,
    PUBLISHED,
    QUANTILES,
    find_gap_table,
    find_table,
    sample_assumed,
    sample_output_marginal,
    sample_published,
    sample_table,
)

_MAX_REDRAWS = 200


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
    (``overlength: truncate``). ``baseline_tpot_s``: resolves ``tpot_slo_x_baseline`` (falls back to the
    config's
    ``baseline_tpot_ms``). Same cfg and seed → identical table.
    """
    spec = cfg if isinstance(cfg, WorkloadSpec) else parse_workload(cfg)
    if baseline_tpot_s is None and spec.baseline_tpot_ms is not None:
        baseline_tpot_s = spec.baseline_tpot_ms / 1e3
    rng_arrival, rng_class, rng_choice, rng_len = (np.random.default_rng(s) for s in _children(seed, 4))
    root = default_data_root(spec.data_dir)
    ctx = _Context(spec, root, tokenizer, max_model_len, rng_len)

    # 1. Arrivals.
    times, trace_idx, trace = _arrivals(spec, ctx, rng_arrival)
    n = len(times)

    # 2. SLO classes.
    names = tuple(c for c, _ in spec.slo_classes) or ("default",)
    cls = _assign_classes(spec, n, rng_class)
    tpot = np.full(n, np.inf)
    ttft = np.full(n, np.inf)
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

    # 3. Dataset per request: groups of request indices sharing one DatasetSpec.
    groups = _assign_datasets(spec, times, cls, rng_choice)

    # 4. Lengths per group.
    prompt = np.zeros(n, dtype=np.int64)
    output = np.zeros(n, dtype=np.int64)
    dataset = np.empty(n, dtype=object)
    client = np.full(n, -1, dtype=np.int64)
    keep = np.ones(n, dtype=bool)
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
        else:
            p, o = ctx.sample(ds, len(idx))
            dataset[idx] = ds.key
        prompt[idx], output[idx] = np.maximum(p, 1), np.maximum(o, 1)  # empty references count as 1 token

    if spec.trace_slo:
        assert trace is not None and trace_idx is not None
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

    sel = np.flatnonzero(keep)
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
    )


# ---------------------------------------------------------------- steps


def _children(seed: np.random.SeedSequence, n: int) -> list[np.random.SeedSequence]:
    """The children ``seed.spawn(n)`` gives on a fresh ``seed``, without advancing its spawn counter (so the
    same SeedSequence object always builds the same table)."""
    return [
        np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, i), pool_size=seed.pool_size)
        for i in range(n)
    ]


def _arrivals(
    spec: WorkloadSpec, ctx: _Context, rng: np.random.Generator
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


def _trace_file_arrivals(spec: WorkloadSpec, ctx: _Context) -> tuple[np.ndarray, np.ndarray, LengthRecords]:
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


# ---------------------------------------------------------------- lengths


class _Context:
    """Per-build state for drawing lengths: data root, tokenizer, limits, generator and source notes."""

    def __init__(
        self,
        spec: WorkloadSpec,
        root: Path | None,
        tokenizer: str | None,
        max_model_len: int | None,
        rng: np.random.Generator,
    ) -> None:
        self.spec, self.root, self.tokenizer = spec, root, tokenizer
        self.max_model_len, self.rng = max_model_len, rng
        self.notes: list[str] = []
        self.provenance: list[DataSource] = []

    def record(self, dataset: str, kind: str, fallback: bool, detail: str, role: str = "lengths") -> None:
        """Record a data source and its note (each once)."""
        src = DataSource(dataset, kind, fallback, detail, role)
        if src not in self.provenance:
            self.provenance.append(src)
        if detail not in self.notes:
            self.notes.append(detail)

    def fit(
        self, p: np.ndarray, o: np.ndarray, drop: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Apply ``max_model_len``: truncate, or return a keep-mask (``drop``) of requests that fit."""
        ok = np.ones(len(p), dtype=bool)
        if self.max_model_len is None:
            return p, o, ok
        if self.spec.overlength == "truncate":
            p = np.minimum(p, self.max_model_len - 1)
            return p, np.maximum(1, np.minimum(o, self.max_model_len - p)), ok
        return p, o, (p + o <= self.max_model_len) if drop else ok

    def sample(self, ds: DatasetSpec, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) lengths of dataset ``ds``, honouring ``max_model_len``."""
        draw = self._drawer(ds)
        if self.spec.output_to_max_len:
            draw = self._to_max_len(ds, draw)
        p, o = draw(n)
        p, o, _ = self.fit(p, o)
        if self.max_model_len is not None and self.spec.overlength == "filter":
            for _ in range(_MAX_REDRAWS):
                bad = np.flatnonzero(p + o > self.max_model_len)
                if not len(bad):
                    break
                p[bad], o[bad] = draw(len(bad))
            else:
                raise ValueError(
                    f"dataset {ds.name}: cannot draw requests within max_model_len={self.max_model_len}"
                )
        return p, o

    def _to_max_len(self, ds: DatasetSpec, draw: Any) -> Any:
        """``draw`` with every output running to ``max_model_len`` (``output_to_max_len``): a prompt that leaves
        no room for one output token is redrawn (``overlength: filter``) or cut to ``max_model_len`` − 1."""
        mml = self.max_model_len
        if mml is None:
            raise ValueError("output_to_max_len needs a max_model_len (engine.max_model_len or the model's context)")
        self.record(ds.key, "fixed", False, f"{ds.key}: outputs run to max_model_len = {mml} (prompt + output)")

        def to_max(k: int) -> tuple[np.ndarray, np.ndarray]:
            p, _ = draw(k)
            p = np.asarray(p, dtype=np.int64).copy()
            for _ in range(_MAX_REDRAWS):
                bad = np.flatnonzero(p >= mml)
                if not len(bad) or self.spec.overlength == "truncate":
                    break
                p[bad] = np.asarray(draw(len(bad))[0], dtype=np.int64)
            else:
                raise ValueError(f"dataset {ds.name}: no prompt shorter than max_model_len={mml}")
            p = np.minimum(p, mml - 1)
            return p, mml - p

        return to_max

    def _source(self, ds: DatasetSpec) -> str:
        return ds.source or self.spec.source

    def _drawer(self, ds: DatasetSpec) -> Any:
        if ds.name == "fixed":
            self.record(ds.key, "fixed", False, f"fixed: {ds.input_len}/{ds.output_len} tokens")
            return lambda k: (np.full(k, ds.input_len, np.int64), np.full(k, ds.output_len, np.int64))
        if ds.name == "hf":
            from workloads.hf import load_hf_records

            return self._real(ds, load_hf_records(ds, self.root, self.tokenizer))
        source = self._source(ds)
        if source == "published":
            return self._published(ds, fallback=False)
        if ds.name == "sonnet":
            return self._sonnet(ds, source)
        if source in ("auto", "real"):
            try:
                if self.root is None:
                    raise DataMissingError("no data folder: set $REPRO_DATA")
                return self._real(ds, load_records(ds.name, str(self.root), self.tokenizer, ds.variant))
            except DataMissingError:
                if source == "real":
                    raise
        return self._embedded(ds)

    def _real(self, ds: DatasetSpec, rec: LengthRecords) -> Any:
        p, o = rec.prompt_len, rec.output_len
        if ds.output_len is not None:
            o = np.full(len(p), ds.output_len, dtype=np.int64)
        pool = np.arange(len(p))
        prune = ds.prune if ds.prune is not None else ds.name == "sharegpt"
        if prune:
            known = o >= 0
            keep = np.where(known, vllm_sharegpt_keep(p, np.where(known, o, 4), ds.output_len), p >= 4)
            keep &= np.where(known, True, p <= 1024)
            pool = pool[keep]
        if self.max_model_len is not None and self.spec.overlength == "filter":
            pool = pool[p[pool] + np.maximum(o[pool], 1) <= self.max_model_len]
        if not len(pool):
            raise ValueError(f"dataset {ds.name}: no record survives pruning / max_model_len")
        pruned = f", {len(pool)} kept after pruning" if len(pool) < len(p) else ""
        fill = self._output_filler(ds, o)
        self.record(ds.key, "file", rec.fallback, f"{ds.key}: {rec.source}{pruned}{fill[1]}")
        state = {"perm": np.zeros(0, dtype=np.int64)}

        def draw(k: int) -> tuple[np.ndarray, np.ndarray]:
            # Shuffle and take in order (vLLM samples without replacement); reshuffle when exhausted.
            while len(state["perm"]) < k:
                state["perm"] = np.concatenate([state["perm"], self.rng.permutation(pool)])
            take, state["perm"] = state["perm"][:k], state["perm"][k:]
            return p[take].copy(), fill[0](o[take].copy())

        return draw

    def _output_filler(self, ds: DatasetSpec, o: np.ndarray) -> tuple[Any, str]:
        """Function replacing -1 outputs by draws from the ShareGPT output table, and a note."""
        if (o >= 0).all():
            return (lambda x: x), ""
        table = find_table("sharegpt", self.tokenizer)
        if table is None:
            raise ValueError(f"dataset {ds.name} has no reference outputs and no sharegpt table to fill them")

        def fill(x: np.ndarray) -> np.ndarray:
            miss = x < 0
            x[miss] = sample_output_marginal(table, int(miss.sum()), self.rng)
            return x

        return fill, f"; missing outputs from the embedded sharegpt output table ({table.tokenizer})"

    def _embedded(self, ds: DatasetSpec) -> Any:
        check_dataset(ds.name)
        fallback = self._source(ds) != "embedded"  # auto with the file missing
        table = find_table(ds.name, self.tokenizer)
        if table is None:
            if ds.name in PUBLISHED:
                return self._published(ds, fallback)
            if ds.name in ASSUMED:
                return self._assumed(ds, fallback)
            raise DataMissingError(f"dataset {ds.name}: no real file under {self.root} and no embedded table")
        fill = self._output_filler(ds, table.output_q)
        self.record(
            ds.key,
            "embedded",
            fallback,
            f"{ds.key}: embedded quantile table {Path(table.path).name} ({table.num_records} records, "
            f"{table.tokenizer} tokens, Gaussian copula rho={table.rho:.2f}){fill[1]}",
        )
        prune = ds.prune if ds.prune is not None else ds.name == "sharegpt"

        def draw(k: int) -> tuple[np.ndarray, np.ndarray]:
            p, o = sample_table(table, k, self.rng)
            if ds.output_len is not None:
                o = np.full(k, ds.output_len, dtype=np.int64)
            o = fill[0](o)
            if prune:  # vLLM's pruning, by rejection
                for _ in range(_MAX_REDRAWS):
                    bad = np.flatnonzero(~vllm_sharegpt_keep(p, o, ds.output_len))
                    if not len(bad):
                        break
                    p[bad], o2 = sample_table(table, len(bad), self.rng)
                    o[bad] = ds.output_len if ds.output_len is not None else fill[0](o2)
            return p, o

        return draw

    def _published(self, ds: DatasetSpec, fallback: bool) -> Any:
        return self._gamma(ds, lambda k: sample_published(ds.name, ds.published_target, k, self.rng),
                           f"published mean±std (TurboSpec Table 2, target {ds.published_target}), Gamma marginals",
                           "published", fallback)

    def _assumed(self, ds: DatasetSpec, fallback: bool) -> Any:
        (pm, ps), (om, os_) = ASSUMED[ds.name]
        why = "no file under $REPRO_DATA" if fallback else "no embedded table"
        return self._gamma(ds, lambda k: sample_assumed(ds.name, k, self.rng),
                           f"{why} and no published lengths; ASSUMED prompt {pm:.0f}±{ps:.0f}, output "
                           f"{om:.0f}±{os_:.0f} tokens (workloads/stats.py), Gamma marginals", "assumed", fallback)

    def _gamma(self, ds: DatasetSpec, sample: Any, how: str, kind: str, fallback: bool) -> Any:
        """Drawer of lengths from mean ± std statistics (``sample(k)``), a fixed output length overriding."""
        self.record(ds.key, kind, fallback, f"{ds.key}: {how}")

        def draw(k: int) -> tuple[np.ndarray, np.ndarray]:
            p, o = sample(k)
            if ds.output_len is not None:
                o = np.full(k, ds.output_len, dtype=np.int64)
            return p, o

        return draw

    def _sonnet(self, ds: DatasetSpec, source: str) -> Any:
        lines: SonnetLines | None = None
        if (
            source in ("auto", "real")
            and self.root is not None
            and (self.root / "sonnet/sonnet.txt").is_file()
        ):
            path = self.root / "sonnet/sonnet.txt"
            lines = load_sonnet_lines(str(path), self.tokenizer)
            self.record(ds.key, "file", lines.fallback, f"sonnet: real file {show_path(path, self.root)} "
                        f"({len(lines.line_tokens)} lines, {lines.how}), vLLM sampler")
        elif source == "real":
            raise DataMissingError(
                f"dataset file missing: provide {self.root or '$REPRO_DATA'}/sonnet/sonnet.txt"
            )
        else:
            table = find_table("sonnet", self.tokenizer)
            if table is None:
                return self._published(ds, fallback=source != "embedded")
            num = int(table.get("num_lines", "518"))
            synth = np.rint(np.interp((np.arange(num) + 0.5) / num, QUANTILES, table.prompt_q)).astype(
                np.int64
            )
            synth = synth[
                np.random.default_rng(0).permutation(num)
            ]  # fixed order, not sorted (shared prefix)
            lines = SonnetLines(synth, int(table.get("base_prompt_tokens", "20")), table.tokenizer)
            self.record(
                ds.key,
                "embedded",
                source != "embedded",
                f"sonnet: embedded line-length table {Path(table.path).name} ({table.tokenizer}), vLLM sampler",
            )
        kw = {
            "input_len": ds.input_len or 550,
            "prefix_len": ds.prefix_len or 200,
            "output_len": ds.output_len or 150,
        }
        return lambda k: sample_sonnet(lines, k, self.rng, **kw)
