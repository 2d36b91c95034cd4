"""Typed schema of the Hydra ``workload`` config node (every key is a constructor argument; unknown keys fail).

Example (conf/workload/sharegpt.yaml)::

    num_requests: ${num_requests}
    arrival: {kind: poisson, rate_per_s: ${rps}}
    datasets: [{name: sharegpt}]

See :class:`WorkloadSpec` for every key. :func:`parse_workload` turns a mapping (or DictConfig) into the spec.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

SOURCES = ("auto", "real", "embedded", "published")
#: ``DatasetSpec.sampler`` values: how a dataset's requests are chosen when not the default shuffle-and-cycle.
SAMPLERS = ("vllm_benchmark",)
ARRIVAL_KINDS = ("poisson", "gamma", "piecewise", "trace")
#: ``arrival.trace`` value that replays the user's file ``workload.path`` (``workload=trace_file``).
TRACE_FILE = "trace_file"
#: ``workload.format`` of a trace file: column names recognised (see ``workloads.tracefile``).
TRACE_FORMATS = ("auto", "vidur", "azure", "vllm")
_HF_KEYS = ("path", "subset", "prompt_field", "output_field")


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """Where prompt/output lengths come from.

    ``name``: a loader in ``workloads.datasets.LOADERS``, ``sonnet`` (vLLM's sampler), ``fixed``
    (``input_len`` /
    ``output_len`` for every request) or ``trace`` (the lengths of the replayed trace record; trace
    arrivals only).
    ``weight``: relative share in a mixture. ``variant``: which file of the dataset (e.g. sharegpt
    ``tokens`` |
    ``v3_first_turn`` | ``v3_full``; ``full`` for hub-only full sets). ``source``: overrides the workload's.
    ``input_len``/``prefix_len``: Sonnet request length and shared prefix (vLLM defaults 550 / 200), or
    the fixed
    prompt length. ``output_len``: fixed output length for every request (vLLM ``--sharegpt-output-len`` /
    ``--sonnet-output-len``, default 150 for Sonnet); otherwise the reference output. ``prune``: vLLM's
    ShareGPT
    filter (prompt or output < 4, prompt > 1024, total > 2048); default on for ``sharegpt`` only.
    ``published_target``: which TurboSpec Table 2 output column (7b | 13b | 33b | 70b) for ``source:
    published``.

    ``sampler: vllm_benchmark`` (``sharegpt`` only; refused on any other dataset, on ``variant: v3_first_turn``,
    which has no replies, with ``prune: false`` and with ``source: published``): the requests vLLM's 0.6-era
    ``benchmarks/benchmark_serving.py`` sends (``sample_sharegpt_requests``, ``ignore_eos`` false, temperature 0),
    drawn from the variant's file. The records in file order are shuffled as ``random.seed(0);
    random.shuffle(dataset)`` does (``args.seed`` 0, whatever the workload's seed), pruned as above and the
    ``num_requests`` first kept are the requests, in that order (several entries with the same settings, e.g. in two
    SLO classes, continue one sequence); asked for more than the file keeps, the sequence starts over (cycles:
    records repeat, said in the run's notes). ``max_tokens`` is the reference reply's token count (or
    ``output_len``; with ``max_model_len`` and ``overlength: filter``, records whose prompt + max_tokens exceed it
    are left out, as vLLM's server would refuse them). EOS model: the target's own greedy reply is an independent
    draw L from the pruned reference reply lengths of the same file, one per record (the same prompt gets the same
    reply when cycled), from the workload's length generator (same seed, same lengths); the request's output is
    min(max_tokens, L), so it never exceeds its reference. Without the file (``source: auto`` | ``embedded``):
    i.i.d. (prompt, reference) pairs from the variant's embedded table
    (``workloads/stats/sharegpt[_<variant>].<tokenizer>.csv``, the default file's for ``v3_full``), pruned by
    rejection, and L the reference length of a second, independent pruned pair; the notes say which ran.

    ``name: hf`` reads any Hugging Face dataset through the ``datasets`` package (``workloads.hf``): ``path`` is a
    local data file (.json/.jsonl/.csv/.parquet), a local folder (data files, or a ``save_to_disk`` copy), or a hub
    id read from the Hugging Face cache offline; a relative path not found as given is looked up under the data
    root. ``subset``: the hub config name (e.g. ``3.0.0`` for abisee/cnn_dailymail). ``split``: ``train``,
    ``test``, ... (slices such as ``train[:5000]`` work). ``prompt_field``: the prompt column, or a list of columns
    joined with newlines (empty values skipped); ``output_field``: the reference-output column (optional: without
    it, outputs are drawn from the ShareGPT output-length table). A list value counts its first element (first
    turn; a dict's ``content`` or ``value``). Token counts use the target model's tokenizer (chars/4 when absent).
    ``prompt_mean`` (dataset ``spans``): rescale every prompt length by prompt_mean / the source's mean prompt
    length (rounded, at least 1): the same prompts counted in another tokenizer, e.g. InstructCoder's prompts recorded
    in Llama-3 tokens at vLLM's measured 144.5 Qwen3 tokens (validate_vllm_v1).
    ``label``: the name in ``RequestTable.dataset``, by which the oracle looks up acceptance rates (any dataset;
    default: the loader name, and ``hf:<base name of path>`` for ``hf``, e.g. ``hf:alpaca`` for
    ``tatsu-lab/alpaca``, which the oracle's ``default`` entry covers).
    """

    name: str
    weight: float = 1.0
    variant: str = "default"
    source: str | None = None
    input_len: int | None = None
    prefix_len: int | None = None
    output_len: int | None = None
    prune: bool | None = None
    published_target: str = "7b"
    path: str | None = None
    subset: str | None = None
    split: str = "train"
    prompt_field: str | tuple[str, ...] | None = None
    output_field: str | None = None
    label: str | None = None
    prompt_mean: float | None = None
    sampler: str | None = None

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError(f"dataset {self.name}: weight must be >= 0")
        if self.sampler is not None:
            self._check_sampler()
        if self.prompt_mean is not None:
            if self.name != "spans":
                raise ValueError(f"dataset {self.name}: prompt_mean is read by dataset spans only")
            if isinstance(self.prompt_mean, bool) or not float(self.prompt_mean) >= 1.0:
                raise ValueError(f"dataset spans: prompt_mean must be a number >= 1, got {self.prompt_mean!r}")
        if self.source is not None and self.source not in SOURCES:
            raise ValueError(f"dataset {self.name}: source must be one of {SOURCES}, got {self.source!r}")
        if isinstance(self.prompt_field, (list, tuple)):  # a YAML list: keep the spec hashable
            object.__setattr__(self, "prompt_field", tuple(str(f) for f in self.prompt_field))
        if self.name == "spans":
            if not self.path:
                raise ValueError("dataset spans needs path: an acceptance-span JSONL file (docs/data.md)")
            extra = [k for k in _HF_KEYS if k != "path" and getattr(self, k) is not None]
            if extra:
                raise ValueError(f"dataset spans: {extra} are read by dataset hf only")
        elif self.name == "hf":
            if not self.path or not self.prompt_field:
                raise ValueError(
                    "dataset hf needs path (a hub id, local folder or data file) and prompt_field (a column name)"
                )
        elif any(getattr(self, k) is not None for k in _HF_KEYS):
            given = [k for k in _HF_KEYS if getattr(self, k) is not None]
            raise ValueError(f"dataset {self.name}: {given} are read by dataset hf only")

    def _check_sampler(self) -> None:
        """``sampler``: a known one, on a dataset and with settings it applies to (one-line ValueError)."""
        if self.sampler not in SAMPLERS:
            raise ValueError(f"dataset {self.name}: sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.name != "sharegpt":
            raise ValueError(f"dataset {self.name}: sampler {self.sampler} applies to dataset sharegpt only "
                             "(vLLM benchmark_serving.py's sample_sharegpt_requests)")
        if self.variant == "v3_first_turn":
            raise ValueError(f"dataset sharegpt: sampler {self.sampler} needs reference replies (their length is "
                             "max_tokens); variant v3_first_turn has none")
        if self.prune is False:
            raise ValueError(f"dataset sharegpt: sampler {self.sampler} always applies vLLM's pruning: drop prune: "
                             "false")
        if self.source == "published":
            raise ValueError(f"dataset sharegpt: sampler {self.sampler} reads the file or its embedded table, not "
                             "published means (source: auto | real | embedded)")

    @property
    def key(self) -> str:
        """Name used in ``RequestTable.dataset`` (the oracle's dataset key): ``label``, else the loader name, and
        ``hf:<base name of path>`` for ``hf``."""
        if self.label:
            return self.label
        if self.name in ("hf", "spans") and self.path:
            base = PurePosixPath(self.path.replace("\\", "/").rstrip("/")).name
            for suffix in (".jsonl", ".json", ".csv", ".parquet", ".txt"):
                base = base.removesuffix(suffix)
            return f"{self.name}:{base}"
        return self.name


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    """Arrival process. ``kind``: poisson | gamma | piecewise | trace.

    ``rate_per_s``: Poisson/Gamma rate (``.inf``: all at t = 0), or for ``trace`` the target mean rate
    the trace is
    rescaled to (null: the trace's own timing). ``cv``: Gamma coefficient of variation. ``segments``:
    piecewise
    ``[[duration_s, rate_per_s], ...]``. ``trace``: a dataset with timestamps (azure2023_conv, azure2023_code,
    mooncake, adaserve_<file stem>, burstgpt, azure2024_conv/code). ``start_s`` / ``window_s``: the trace
    window.
    """

    kind: str = "poisson"
    rate_per_s: float | None = None
    cv: float = 1.0
    segments: tuple[tuple[float, float], ...] = ()
    trace: str | None = None
    start_s: float = 0.0
    window_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValueError(f"arrival.kind must be one of {ARRIVAL_KINDS}, got {self.kind!r}")
        if self.kind in ("poisson", "gamma") and (self.rate_per_s is None or not self.rate_per_s > 0):
            raise ValueError(f"arrival.kind={self.kind} needs rate_per_s > 0, got {self.rate_per_s}")
        if self.kind == "piecewise" and not self.segments:
            raise ValueError("arrival.kind=piecewise needs segments [[duration_s, rate_per_s], ...]")
        if self.kind == "trace" and not self.trace:
            raise ValueError("arrival.kind=trace needs trace: <dataset with timestamps>")
        if self.kind == "gamma" and math.isinf(self.rate_per_s or 0):
            raise ValueError("arrival.kind=gamma needs a finite rate_per_s")


@dataclass(frozen=True, slots=True)
class SloClassSpec:
    """One SLO class. ``proportion``: share of requests (null: an equal share of what the others leave).

    TPOT SLO: ``tpot_slo_ms`` (absolute) or ``tpot_slo_x_baseline`` (multiple of the profiled baseline
    latency,
    AdaServe Table 2); neither = no SLO. ``ttft_slo_ms``: optional TTFT SLO. ``datasets``: the class's
    own prompt
    source (AdaServe: categories 1 and 3 from Alpaca, 2 from ArXiv); empty = the workload's datasets.
    """

    proportion: float | None = None
    tpot_slo_ms: float | None = None
    tpot_slo_x_baseline: float | None = None
    ttft_slo_ms: float | None = None
    datasets: tuple[DatasetSpec, ...] = ()

    def __post_init__(self) -> None:
        if self.tpot_slo_ms is not None and self.tpot_slo_x_baseline is not None:
            raise ValueError("an SLO class gives tpot_slo_ms or tpot_slo_x_baseline, not both")
        if self.proportion is not None and not 0 <= self.proportion <= 1:
            raise ValueError(f"SLO class proportion must be in [0, 1], got {self.proportion}")


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    """A dataset mixture that takes over from ``start_s`` (arrival time) or ``start_fraction`` (of
    requests)."""

    datasets: tuple[DatasetSpec, ...]
    start_s: float | None = None
    start_fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.start_s is None) == (self.start_fraction is None):
            raise ValueError("a phase gives exactly one of start_s and start_fraction")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The ``workload`` config node.

    ``num_requests``: requests to generate (piecewise schedules may yield fewer). ``arrival``:
    :class:`ArrivalSpec`.
    ``datasets``: the mixture (list of :class:`DatasetSpec`). ``phases``: dataset switches mid-run (replace
    ``datasets``; TurboSpec Figure 14). ``slo_classes``: mapping name → :class:`SloClassSpec` (order =
    class index).
    ``source``: auto (real file if present, else embedded table) | real | embedded | published.
    ``data_dir``: data
    folder (default ``$REPRO_DATA``, then ``../shared/data``). ``overlength``: what ``max_model_len``
    does to a
    request whose prompt + output exceeds it: ``filter`` (redraw it from the dataset, like vLLM's sampler
    pruning;
    trace-aligned lengths are dropped instead) or ``truncate`` (cut the output, then the prompt).
    ``baseline_tpot_ms``: baseline latency used when the caller passes none. ``trace_slo``: take
    per-request TPOT
    SLOs from the AdaServe artifact's ``slo_ratio`` (> 0: × baseline; < 0: absolute ms). ``input_len`` /
    ``output_len``: defaults for every dataset that does not set its own (``fixed`` lengths, Sonnet length, a
    fixed output length). ``name``: label for logs. ``path`` / ``format``: the user's trace file that
    ``arrival.trace: trace_file`` replays (``workload=trace_file workload.path=FILE``) and its column names
    (auto | vidur | azure | vllm; see ``workloads.tracefile``). ``clients``: every dataset entry is a client of
    its own (GoodSpeed's draft servers, each serving its own prompts): requests are dealt to the datasets
    round-robin in arrival order and ``RequestTable.client`` holds each one's dataset index.
    ``output_to_max_len``: every request generates until prompt + output reach the server's ``max_model_len``
    (vLLM with ``ignore_eos`` and no ``max_tokens``: its OpenAI server then asks for max_model_len − prompt tokens);
    ``static_batch``: B: each of the ``num_requests`` prompts becomes B identical copies (same prompt, output length
    and acceptance source), released together once the previous prompt's batch has finished (an offline
    ``LLM.generate`` per prompt; SpecDecode-Bench); ``RequestTable.group`` says which prompt each copy is;
    the prompts are the datasets', the outputs ignore the datasets' lengths.
    ``max_concurrency``: C closes the loop as vLLM's benchmark does with ``--max-concurrency C``: the arrival process
    releases the requests, at most C are in flight, and a released request waits (first come, first sent) until one
    finishes; its latencies count from its send (:mod:`repro.sim.client`; ``backend=openai`` sends the same way).
    null: the open loop, every request sent at its arrival.
    """

    num_requests: int
    arrival: ArrivalSpec
    datasets: tuple[DatasetSpec, ...] = ()
    phases: tuple[PhaseSpec, ...] = ()
    slo_classes: tuple[tuple[str, SloClassSpec], ...] = ()
    source: str = "auto"
    data_dir: str | None = None
    overlength: str = "filter"
    baseline_tpot_ms: float | None = None
    trace_slo: bool = False
    input_len: int | None = None
    output_len: int | None = None
    name: str = ""
    path: str | None = None
    format: str = "auto"
    clients: bool = False
    output_to_max_len: bool = False
    static_batch: int | None = None
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        c = self.max_concurrency
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ValueError(f"max_concurrency must be a positive integer (the requests in flight at most, vLLM's "
                             f"--max-concurrency) or null (the open loop), got {c!r}")
        replays_file = self.arrival.kind == "trace" and self.arrival.trace == TRACE_FILE
        if replays_file and not self.path:
            raise ValueError("workload=trace_file needs workload.path=FILE (a CSV or JSONL of requests)")
        if self.path and not replays_file:
            raise ValueError("workload.path is read by arrival.trace=trace_file only (workload=trace_file)")
        if self.static_batch is not None and (isinstance(self.static_batch, bool) or self.static_batch < 1):
            raise ValueError(f"workload.static_batch must be an integer >= 1 (copies per prompt), got "
                             f"{self.static_batch!r}")
        if self.static_batch is not None and c is not None:
            raise ValueError("workload.static_batch runs each prompt's copies as one offline batch: it takes no "
                             "max_concurrency (set max_concurrency=null)")
        if self.format not in TRACE_FORMATS:
            raise ValueError(f"workload.format must be one of {TRACE_FORMATS}, got {self.format!r}")
        if self.source not in SOURCES:
            raise ValueError(f"workload.source must be one of {SOURCES}, got {self.source!r}")
        if self.overlength not in ("filter", "truncate"):
            raise ValueError(f"workload.overlength must be filter|truncate, got {self.overlength!r}")
        if self.datasets and self.phases:
            raise ValueError("give workload.datasets or workload.phases, not both")
        all_classes_have_data = bool(self.slo_classes) and all(c.datasets for _, c in self.slo_classes)
        if not (self.datasets or self.phases or all_classes_have_data):
            raise ValueError("workload needs datasets, phases, or datasets on every SLO class")
        if self.phases:
            first = self.phases[0]
            if (first.start_s or 0.0) != 0.0 or (first.start_fraction or 0.0) != 0.0:
                raise ValueError("the first phase must start at 0")
        for d in self._all_datasets():
            if d.name == "fixed" and (d.input_len is None or d.output_len is None):
                raise ValueError("dataset 'fixed' needs input_len and output_len (on it or on the workload)")
        uses_trace = any(d.name == "trace" for d in self._all_datasets())
        if (uses_trace or self.trace_slo) and self.arrival.kind != "trace":
            raise ValueError("dataset 'trace' and trace_slo need arrival.kind=trace")

    def _all_datasets(self) -> list[DatasetSpec]:
        out = list(self.datasets) + [d for p in self.phases for d in p.datasets]
        return out + [d for _, c in self.slo_classes for d in c.datasets]


def _make(cls: type, data: Mapping[str, Any], where: str) -> Any:
    """``cls(**data)`` with a clear error naming an unknown key."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{where}: expected a mapping, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(names)}")
    return cls(**data)


def _datasets(items: Any, where: str) -> tuple[DatasetSpec, ...]:
    if items is None:
        return ()
    if isinstance(items, (Mapping, str)):
        raise TypeError(f"{where}: expected a list of datasets")
    return tuple(_make(DatasetSpec, d, f"{where}[{i}]") for i, d in enumerate(items))


def parse_workload(cfg: Mapping[str, Any]) -> WorkloadSpec:
    """Build a :class:`WorkloadSpec` from a plain mapping or an OmegaConf ``DictConfig`` (resolved)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    data = dict(cfg)
    names = {f.name for f in dataclasses.fields(WorkloadSpec)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"workload: unknown key(s) {unknown}; allowed: {sorted(names)}")
    arrival = dict(data.get("arrival") or {})
    if arrival.get("segments") is None:
        arrival.pop("segments", None)  # null: none (a workload that another arrival kind may fill in)
    else:
        arrival["segments"] = tuple((float(s[0]), float(s[1])) for s in arrival["segments"])
    data["arrival"] = _make(ArrivalSpec, arrival, "workload.arrival")
    data["datasets"] = _datasets(data.get("datasets"), "workload.datasets")
    phases = []
    for i, p in enumerate(data.get("phases") or []):
        p = dict(p)
        p["datasets"] = _datasets(p.get("datasets"), f"workload.phases[{i}].datasets")
        phases.append(_make(PhaseSpec, p, f"workload.phases[{i}]"))
    data["phases"] = tuple(phases)
    classes = data.get("slo_classes") or {}
    if not isinstance(classes, Mapping):
        raise TypeError("workload.slo_classes: expected a mapping name -> {proportion, tpot_slo_ms, ...}")
    parsed = []
    for cname, c in classes.items():
        c = dict(c or {})
        c["datasets"] = _datasets(c.get("datasets"), f"workload.slo_classes.{cname}.datasets")
        parsed.append((str(cname), _make(SloClassSpec, c, f"workload.slo_classes.{cname}")))
    data["slo_classes"] = tuple(parsed)
    if data.get("input_len") is not None or data.get("output_len") is not None:
        data = _apply_length_defaults(data)
    return WorkloadSpec(**data)


def _apply_length_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Give every dataset without its own ``input_len``/``output_len`` the workload-level value."""

    def fill(ds: tuple[DatasetSpec, ...]) -> tuple[DatasetSpec, ...]:
        return tuple(
            dataclasses.replace(
                d,
                input_len=d.input_len if d.input_len is not None else data.get("input_len"),
                output_len=d.output_len if d.output_len is not None else data.get("output_len"),
            )
            for d in ds
        )

    data["datasets"] = fill(data["datasets"])
    data["phases"] = tuple(dataclasses.replace(p, datasets=fill(p.datasets)) for p in data["phases"])
    data["slo_classes"] = tuple(
        (n, dataclasses.replace(c, datasets=fill(c.datasets))) for n, c in data["slo_classes"]
    )
    return data
