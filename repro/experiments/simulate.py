"""Run one point: build the system, its deployment (:mod:`repro.sim.deployment`: replicas, cost models, proposers,
remote draft servers), the workload and the token oracle from a composed config, simulate, summarize.

``run_point(cfg)`` is what the experiment runner calls in each worker process; it is also the shortest way to use
the simulator from Python::

    from repro.experiments.simulate import compose, run_point
    res = run_point(compose(["system=static_sd_k3", "rps=2", "num_requests=200"]))
    print(res.metrics["mean_tpot_ms"])

``memory_row(cfg)`` is a point's deployment without simulating it: its GPU memory at start (``exp.kind=memory``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from repro.core.errors import ConfigError, ReproError
from repro.cost.model import CostModel
from repro.cost.step import decode_pass_s
from repro.experiments.instantiate import instantiate_system
from repro.experiments.results import config_hash
from repro.sim import trace
from repro.sim.deployment import Deployment
from repro.sim.engine import Engine, SimOutput
from repro.sim.policy import Policy

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


@dataclass
class PointResult:
    """Outcome of one simulated point."""

    metrics: dict[str, float]
    requests: pd.DataFrame  # one row per request (requests_frame) plus latency_s, ttft_ms, tpot_ms
    steps: pd.DataFrame | None
    notes: list[str] = field(default_factory=list)
    provenance: list[dict[str, Any]] = field(default_factory=list)  # workloads.DataSource entries as dicts
    rounds: pd.DataFrame | None = None  # the round trace (engine.record_rounds): one row per request per step


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides, outside ``@hydra.main`` (tests, notebooks, workers)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides))


def baseline_tpot_s(cost: CostModel, batch: int = 8, input_len: int = 32, output_len: int = 128) -> float:
    """AdaServe §6.1's "baseline latency": mean per-iteration seconds of incremental decoding, from the cost model.

    ``batch`` requests of ``input_len`` prompt tokens generating ``output_len`` tokens each, no speculation. The paper
    reports 12.5 ms for Llama-2-7B on an A100.
    """
    def mean() -> float:
        return float(np.mean([decode_pass_s(cost, batch, input_len + i) for i in range(1, output_len)]))

    return cost.remember(("baseline_tpot_s", batch, input_len, output_len), mean)


@dataclass
class Built:
    """A point ready to simulate: the engine and what it was built from."""

    engine: Engine
    table: Any
    cost: CostModel
    baseline_tpot_s: float
    deployment: Deployment | None = None
    oracle: Any = None
    backend: Any = None  # backend=hf: the real models (repro.backends.hf.HfBackend)


def build(cfg: DictConfig, policy: Policy | None = None, table: Any = None) -> Built:
    """Build the system, its deployment, the workload, the oracle and the engine of one composed point (``policy``:
    an existing policy instead of a new one from ``cfg.system``, as a warm-up hands its learned state on; ``table``:
    these requests instead of the workload's, as one static batch of it)."""
    from repro.oracle import Drafter, TokenOracle

    ss_workload, ss_oracle, ss_policy = np.random.SeedSequence(int(cfg.seed)).spawn(3)
    policy = policy if policy is not None else instantiate_system(cfg.system)
    deployment = Deployment.from_cfg(cfg, policy)
    cost = deployment.cost_model()
    model = cost.model
    max_len = max_model_len(cfg, model)
    baseline = baseline_tpot_s(cost)
    table = table if table is not None else request_table(cfg, cost, baseline, ss_workload, max_len)
    clients, servers = getattr(table, "client", None), deployment.draft_servers
    if clients is not None and servers and int(clients.max(initial=0)) >= len(servers):
        raise ConfigError(f"workload.clients: {int(clients.max()) + 1} clients (datasets) but {len(servers)} "
                          "engine.draft_servers: give one draft server per client")
    try:
        oracle = TokenOracle.from_cfg(cfg.oracle, seed=ss_oracle, dataset=table.dataset,
                                      draft=str(cfg.draft.name), target=model.name,
                                      span_key=getattr(table, "group", None), output_len=table.output_len)
        if cfg.oracle.get("spans"):
            oracle.use_spans(cfg.oracle.spans, target=model.name, output_len=table.output_len,
                             record=getattr(table, "record", None),
                             record_file={ds: path for ds, path, _ in getattr(table, "record_file", ())},
                             shown={ds: shown for ds, _, shown in getattr(table, "record_file", ())})
    except (FileNotFoundError, ValueError) as exc:  # oracle=trace: a missing or empty recording; span files
        raise ConfigError(f"oracle config: {exc}") from None
    add_server_streams(oracle, cfg, deployment, model.name)
    backend = real_backend(cfg, table, deployment)
    engine = Engine(arrival_s=table.arrival_s, prompt_len=table.prompt_len, output_len=table.output_len,
                    tpot_slo_s=table.tpot_slo_s, ttft_slo_s=table.ttft_slo_s, slo_class=table.slo_class,
                    deployment=deployment, oracle=oracle, rng=np.random.default_rng(ss_policy),
                    drafter=backend.drafter if backend is not None else Drafter(oracle),
                    block_size=int(cfg.engine.block_size), max_model_len=max_len,
                    record_steps=bool(cfg.engine.record_steps),
                    record_rounds=bool(cfg.engine.get("record_rounds", False)),
                    counterfactual_arms=cfg.engine.get("counterfactual_arms"),
                    max_sim_time_s=cfg.get("max_sim_time_s"), max_steps=cfg.get("max_steps"),
                    client=getattr(table, "client", None), backend=backend,
                    fast_forward=bool(cfg.engine.get("fast_forward", True)),
                    check_invariants=bool(cfg.engine.get("check_invariants", False)),
                    max_concurrency=getattr(table, "max_concurrency", None))
    return Built(engine=engine, table=table, cost=cost, baseline_tpot_s=baseline, deployment=deployment,
                 oracle=oracle, backend=backend)


def max_model_len(cfg: DictConfig, model: Any) -> int:
    """The server's ``--max-model-len``: ``engine.max_model_len``, else the target's context length.

    Above that context it is refused (vLLM refuses it too).
    """
    value = cfg.engine.get("max_model_len")
    if value is None:
        return int(model.max_context)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 < value <= int(model.max_context):
        raise ConfigError(f"engine.max_model_len={value!r}: expected an integer in 2..{model.max_context} "
                          f"({model.name}'s context length)")
    return value


def request_table(cfg: DictConfig, cost: CostModel, baseline_s: float, seed: np.random.SeedSequence,
                  max_len: int | None = None) -> Any:
    """The point's requests (:func:`workloads.build_workload` for its target model).

    The workload's own complaints become a :class:`ConfigError`, a missing data file stays a DataMissingError.
    """
    from workloads import build_workload

    try:
        return build_workload(cfg.workload, seed=seed, tokenizer=cost.model.tokenizer,
                              max_model_len=max_len or max_model_len(cfg, cost.model), baseline_tpot_s=baseline_s)
    except ValueError as exc:  # the workload's own checks name the bad key or value
        raise ConfigError(f"workload config: {exc}") from None


def backend_kind(cfg: DictConfig) -> str:
    """The run's backend (``backend.kind``: sim | hf | openai); ``sim`` when the config has no backend node."""
    node = cfg.get("backend")
    return str(node.get("kind", "sim")) if node is not None else "sim"


def real_backend(cfg: DictConfig, table: Any, deployment: Deployment) -> Any:
    """``backend=hf``: the real models that execute the run's steps (:mod:`repro.backends.hf`).

    ``None`` for the simulator.
    """
    kind = backend_kind(cfg)
    if kind == "sim":
        return None
    if kind != "hf":
        raise ConfigError(f"backend.kind: {kind!r} runs no engine (known: sim, hf, openai)")
    b = cfg.backend
    if deployment.draft_servers:
        raise ConfigError("backend=hf runs co-located proposers only (engine.draft_servers is set)")
    try:
        from repro.backends.hf import HfBackend
        from repro.backends.models import build_model, noisy_copy
    except ImportError as exc:
        raise ConfigError(str(exc)) from None

    def where(path: Any, node: Any) -> str | None:  # "source": the conf/model's Hugging Face id, from the local cache
        return str(node.source) if path == "source" else (str(path) if path else None)

    try:
        target = build_model(str(cfg.model.name), tiny=bool(b.tiny), seed=int(b.target_seed),
                             path=where(b.target_path, cfg.model), device=str(b.device), dtype=b.dtype)
        if b.share_weights or b.get("draft_noise"):
            draft = noisy_copy(target, float(b.draft_noise), seed=int(b.draft_seed)) if b.get("draft_noise") \
                else target
        else:
            draft = build_model(str(cfg.draft.name), tiny=bool(b.tiny), seed=int(b.draft_seed),
                                path=where(b.draft_path, cfg.draft), device=str(b.device), dtype=b.dtype)
        prompts = real_prompts(cfg, table, int(target.config.vocab_size))
        backend = HfBackend(target, draft, table.prompt_len, seed=int(cfg.seed), temperature=float(b.temperature),
                            record=b.record is not None, record_width=int(b.record_width), max_width=int(b.max_width),
                            prompts=prompts.ids)
        backend.prompt_note = prompts.how
        return backend
    except (ImportError, FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"backend=hf: {exc}") from None


def text_tokenizer(b: Any, served: str) -> Any:
    """backend.prompt_format=text: the tokenizer that decodes the prompts' ids (``backend.tokenizer``, else the
    served model when it names a local folder), or a one-line error naming what to provide."""
    import os

    path = str(b.get("tokenizer") or served)
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (ImportError, OSError, ValueError) as exc:
        raise ConfigError(f"backend.prompt_format=text: no tokenizer at {path!r} ({str(exc).splitlines()[0][:120]}); "
                          "set backend.tokenizer to a local tokenizer folder"
                          + ("" if os.path.isdir(path) else " (the served name is not a local folder)")) from None


def real_prompts(cfg: DictConfig, table: Any, vocab_size: int) -> Any:
    """What a real backend sends as each request's prompt (:func:`workloads.prompts.prompt_ids`): its dataset's own,
    in the target's tokenizer, where the data has it."""
    from workloads.datasets import default_data_root
    from workloads.prompts import prompt_ids

    family = OmegaConf.select(cfg, "model.tokenizer", default=None)
    return prompt_ids(table, None if family is None else str(family), vocab_size,
                      default_data_root(OmegaConf.select(cfg, "workload.data_dir", default=None)))


def add_server_streams(oracle: Any, cfg: DictConfig, deployment: Deployment, target: str) -> None:
    """An oracle stream per remote draft server model that is not the run's draft (``DraftServerSpec.stream``):
    the model's own acceptance table with the target (``oracle.accept[model][target]``), on its own seed."""
    table = cfg.oracle["accept"]
    for i, name in enumerate(sorted({s.stream for s in deployment.draft_servers} - {"draft"})):
        if name not in table or target not in table[name]:
            raise ConfigError(f"engine.draft_servers: no acceptance table for draft {name!r} with target {target!r} "
                              "in oracle.accept")
        oracle.add_stream(name, dict(table[name][target]), key=100 + i)


def run_point(cfg: DictConfig, latencies: bool = True) -> PointResult:
    """Simulate one fully composed point and summarize it (see :mod:`repro.metrics.summary`); ``latencies=False``
    leaves the simulated requests' table without its derived latency columns (a sweep's worker that keeps no
    tables: nothing reads them)."""
    t0 = time.perf_counter()
    if backend_kind(cfg) == "openai":
        return run_openai(cfg, t0)
    threads = OmegaConf.select(cfg, "backend.threads", default=None) if backend_kind(cfg) == "hf" else None
    if threads:  # backend=hf: PyTorch's intra-op threads for this point (its measured step times), then restored
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(int(threads))
        try:
            res = _run_sim(cfg, t0, latencies)
        finally:
            torch.set_num_threads(before)
        res.notes.append(f"backend=hf: {int(threads)} PyTorch thread(s) (backend.threads)")
        return res
    return _run_sim(cfg, t0, latencies)


def _run_sim(cfg: DictConfig, t0: float, latencies: bool = True) -> PointResult:
    """:func:`run_point` on the engine (the simulator, or ``backend=hf``'s real models)."""
    from repro.metrics.steps import peak_token_rate
    from repro.metrics.summary import summarize, with_latencies

    built = build(cfg)
    if getattr(built.table, "group", None) is not None:
        return run_static_batches(cfg, built, t0)
    for _ in range(int(built.engine.policy.warmup_passes)):  # whole passes over the same workload, not measured
        built.engine.run()
        built = build(cfg, built.engine.policy)
    out = built.engine.run()
    record = cfg.backend.get("record") if built.backend is not None else None
    if record:
        path = Path(str(record))
        path.parent.mkdir(parents=True, exist_ok=True)
        from repro.oracle.token_oracle import RECORDING_META

        frame = built.backend.records_frame()
        frame.attrs[RECORDING_META] = {  # checked by oracle=trace against the run that replays it
            "target": str(cfg.model.name), "draft": str(cfg.draft.name),
            "datasets": sorted({str(d) for d in built.table.dataset}), "source": built.table.source,
            "output_len": [int(x) for x in built.table.output_len], "width": int(cfg.backend.record_width),
            "prompts": str(getattr(built.backend, "prompt_note", "")),
            "temperature": float(cfg.backend.get("temperature") or 0.0), "seed": int(cfg.seed)}
        frame.to_parquet(path, index=False)
    requests = requests_frame(out, built.table)
    steps = steps_frame(out) if cfg.engine.record_steps else None
    metrics = summarize(requests, out.sim_time_s, steps, (out.num_steps, out.num_scheduled))
    if getattr(built.table, "client", None) is not None and built.deployment is not None \
            and built.deployment.draft_servers and built.engine.policy.round_budget is not None:
        metrics.update(edge_optimum(built, out, steps))
    metrics.update(kv_report(built))
    metrics.update(batch_memory(cfg, built, requests))
    metrics["num_replicas"] = float(len(getattr(built.engine, "replicas", [])) or 1)  # nodes, for per-node rates
    window = cfg.get("peak_window_s")
    if window and steps is not None:  # Nightjar Fig. 11: the peak of the throughput trace
        metrics["peak_total_token_throughput"] = peak_token_rate(steps, float(window))
    metrics["wall_s"] = time.perf_counter() - t0
    if latencies:
        requests = with_latencies(requests)  # latency_s, ttft_ms, tpot_ms per request (derived, not saved)
    provenance = provenance_of(built.table, built.oracle)
    return PointResult(metrics=metrics, requests=requests, steps=steps,
                       notes=[built.table.source, *getattr(built.oracle, "notes", []),
                              *([built.backend.prompt_note] if built.backend is not None else [])],
                       provenance=provenance, rounds=out.rounds)


def kv_report(built: Built) -> dict[str, float]:
    """``kv_cache_tokens``: the KV capacity the engine reports at start-up, summed over the replicas, for runs whose
    engine profile says it does (``reports_kv_tokens``: vLLM V1's "GPU KV cache size: N tokens"); nothing for the
    others."""
    reps = getattr(built.engine, "replicas", [])
    if not reps or not all(r.cost.engine.reports_kv_tokens for r in reps):
        return {}
    return {"kv_cache_tokens": float(sum(r.kv.total * r.kv.block_size for r in reps))}


def batch_memory(cfg: DictConfig, built: Built, requests: pd.DataFrame) -> dict[str, float]:
    """For a point whose requests arrive together as one batch (``rps: .inf``, at most ``max_num_seqs`` of them, on
    one replica): the memory the batch occupies per GPU at its end, every request resident at its full length
    (prompt + output tokens), in GiB (``batch_memory_gib``: weights and KV), and the draft model's part of it
    (``draft_memory_share``: its weights and its own KV, where the system keeps a draft resident; TurboSpec Fig.
    16a). Nothing for other points, whose requests are not all resident at once."""
    reps = getattr(built.engine, "replicas", [])
    seqs = cfg.system.get("max_num_seqs") if "system" in cfg else None
    if len(reps) != 1 or not math.isinf(float(cfg.get("rps") or 0)) or seqs is None or len(requests) > int(seqs):
        return {}
    from repro.cost.model import GiB

    rep = reps[0]
    cost, tp = rep.cost, rep.cost.tp
    tokens = float((requests["prompt_len"] + requests["output_len"]).sum())
    draft = cost.resident_draft(bool(rep.policy.uses_draft_model))
    target = cost.model.weight_bytes / tp + tokens * cost.model.kv_bytes_per_token / tp
    extra = (draft.weight_bytes + tokens * draft.kv_bytes_per_token) / tp if draft is not None else 0.0
    return {"batch_memory_gib": (target + extra) / GiB, "draft_memory_share": extra / (target + extra)}


def provenance_of(table: Any, oracle: Any) -> list[dict[str, Any]]:
    """The point's data sources: the workload's, then each oracle fallback (spans drawn from measured curves for lack
    of a span file), flagged as not the real file so summaries warn."""
    out = [asdict(d) for d in getattr(table, "provenance", ())]
    for note in getattr(oracle, "notes", ()):
        out.append({"dataset": "oracle", "kind": "embedded", "fallback": True, "detail": note, "role": "acceptance"})
    return out


def run_static_batches(cfg: DictConfig, built: Built, t0: float) -> PointResult:
    """``workload.static_batch``: each prompt's batch of copies runs alone, all at its start, and the next batch is
    released when it has finished (SpecDecode-Bench's offline ``LLM.generate`` per prompt).

    A batch meets an empty engine (its predecessor's requests have all left and freed their KV), so each is simulated
    as its own engine run from t = 0 and shifted to start where the previous one finished; the policy object is
    handed on, so a learning policy keeps what it learned. ``output_throughput`` is the paper's: per prompt, Σ output
    tokens / (its batch's finish − start), averaged over prompts (``pooled_output_throughput``: the suite's usual Σ
    output tokens / total time)."""
    from repro.metrics.summary import summarize, with_latencies

    table, group = built.table, built.table.group
    if built.engine.policy.warmup_passes:
        raise ConfigError("workload.static_batch does not run warm-up passes (system.warmup_passes)")
    if cfg.engine.record_steps or cfg.engine.get("record_rounds", False):
        raise ConfigError("workload.static_batch: engine.record_steps / record_rounds are not supported")
    frames, rates, notes = [], [], list(built.oracle.notes) if built.oracle is not None else []
    start, policy = 0.0, built.engine.policy
    num_steps = num_scheduled = 0
    for j in range(int(group.max()) + 1):
        idx = np.flatnonzero(group == j)
        part = build(cfg, policy, table.subset(idx))
        out = part.engine.run()
        frame = requests_frame(out, part.table)
        frame["rid"] = idx
        for col in ("arrival_s", "first_token_at", "first_decode_at", "finish_at"):
            frame[col] = frame[col] + start
        span = out.sim_time_s
        rates.append(float(frame["output_len"].sum()) / span if span > 0 else float("nan"))
        frames.append(frame)
        start += span
        num_steps, num_scheduled = num_steps + out.num_steps, num_scheduled + out.num_scheduled
        policy = part.engine.policy
    requests = pd.concat(frames, ignore_index=True)
    metrics = summarize(requests, start, None, (num_steps, num_scheduled))
    metrics["pooled_output_throughput"] = metrics.get("output_throughput", float("nan"))
    metrics["output_throughput"] = float(np.mean(rates))
    metrics["num_prompts"] = float(len(rates))
    spec_steps = float(requests["num_spec_steps"].sum())  # drafts per speculative step (a static chain: its k)
    metrics["k"] = float(requests["num_proposed"].sum()) / spec_steps if spec_steps else 0.0
    metrics.update(kv_report(built))
    metrics["wall_s"] = time.perf_counter() - t0
    return PointResult(metrics=metrics, requests=with_latencies(requests), steps=None,
                       notes=[table.source, *notes], provenance=provenance_of(table, built.oracle))


def run_openai(cfg: DictConfig, t0: float) -> PointResult:
    """``backend=openai``: replay the point's workload against a live server (:mod:`repro.backends.openai`) and
    summarize it like a simulated point, plus vLLM's serving metrics (``mean_itl_ms``, ``p99_ttft_ms``, ...)."""
    from repro.backends.openai import (
        check_server,
        detailed,
        random_prompts,
        replay,
        scrape,
        spec_metrics,
        vllm_metrics,
    )
    from repro.metrics.summary import summarize, with_latencies

    b = cfg.backend
    if not b.get("url"):
        raise ConfigError("backend=openai needs backend.url (the server's base URL, e.g. http://127.0.0.1:8000/v1)")
    cost = Deployment.from_cfg(cfg, instantiate_system(cfg.system)).cost_model()  # as build() makes it
    model = cost.model
    # the served name: backend.model, else the model config's Hugging Face id (what `vllm serve ID` serves)
    served = str(b.get("model") or OmegaConf.select(cfg, "model.source", default=None) or model.name)
    check_server(str(b.url), served)  # a dead server or another model: one line, before anything is sent
    # the simulation's workload for the same config and seed: the same requests, arrivals and SLOs
    table = request_table(cfg, cost, baseline_tpot_s(cost), np.random.SeedSequence(int(cfg.seed)).spawn(3)[0])
    n = len(table)
    sampling = {"temperature": 0.0, **{k: (float(b[k]) if k != "top_k" else int(b[k]))
                                       for k in ("temperature", "top_p", "top_k") if b.get(k) is not None}}
    text = str(b.get("prompt_format") or "ids") == "text"
    ignore_eos = bool(b.get("ignore_eos", True))
    detok = text_tokenizer(b, served) if text else None
    vocab = int(b.vocab_size or (min(model.vocab_size, len(detok)) if detok is not None else model.vocab_size))
    prompts = real_prompts(cfg, table, vocab)
    synthetic = random_prompts(table.prompt_len, vocab, int(cfg.seed))  # what a request without its own sends
    sent: list[Any] = [p if p is not None else q for p, q in zip(prompts.ids, synthetic, strict=True)]
    if detok is not None:  # a server whose completions take text only: the ids decoded (it tokenizes them again)
        sent = [detok.decode(ids) for ids in sent]
    before = scrape(str(b.url))
    res = replay(table.arrival_s, table.prompt_len, table.output_len, base_url=str(b.url), model=served,
                 prompts=sent, timeout_s=float(b.timeout_s), max_concurrency=table.max_concurrency, sampling=sampling,
                 ignore_eos=ignore_eos)
    spec = spec_metrics(before, scrape(str(b.url)))
    r = res.requests
    ok = r["success"].to_numpy(dtype=bool)
    if n and not ok.any():
        first = next((e for e in r["error"] if e), "no error text")
        raise ReproError(f"backend=openai: none of the {n} requests to {b.url} completed (model {served!r}); the "
                         f"first error: {first}")
    nan = np.full(n, np.nan)
    zero = np.zeros(n, dtype=np.int64)
    requests = pd.DataFrame({
        "rid": np.arange(n), "dataset": table.dataset,
        "slo_class": np.asarray(table.classes or ("default",), dtype=object)[np.asarray(table.slo_class)],
        # vLLM's TTFT and E2E count from the moment a request is sent (a client-side queue, max_concurrency, included)
        "arrival_s": r["sent_at"].to_numpy(), "first_token_at": np.where(ok, r["first_token_at"], np.nan),
        "first_decode_at": nan, "finish_at": np.where(ok, r["finish_at"], np.nan),
        "prompt_len": table.prompt_len, "output_len": r["output_len"].to_numpy(),
        "num_proposed": zero, "num_accepted": zero, "num_matched": zero, "num_decode_steps": zero,
        "num_spec_steps": zero, "tpot_slo_s": table.tpot_slo_s, "ttft_slo_s": table.ttft_slo_s,
        "num_preemptions": zero, "service_s": nan, "swap_s": np.zeros(n), "replica": zero,
        **({"released_at": r["arrival_s"].to_numpy()} if table.max_concurrency is not None else {}),
    })
    metrics = summarize(requests, float(res.duration_s), None)
    # vLLM's serving metrics replace summarize's of the same name (vLLM counts only the successful requests); its
    # duration is this row's sim_time_s
    metrics.update({k: v for k, v in vllm_metrics(res).items() if k != "duration"})
    metrics["failed"] = float((~ok).sum())
    # the server's own speculation counters (vLLM's /metrics), where it exposes them; else acceptance stays blank
    metrics.update(spec)
    notes = [f"{table.source}; replayed against {b.url} as {served!r}"
             + ("" if spec else " (the server reported no speculative-decoding counters at /metrics)"), prompts.how]
    if detok is not None:
        notes.append("backend=openai: prompts sent as text (the ids decoded; the server's own tokenization sets "
                     "their length)" + ("" if ignore_eos else
                                        ", without ignore_eos (a request may stop at its end-of-sequence token)"))
    elif not ignore_eos:
        notes.append("backend=openai: sent without ignore_eos (a request may stop at its end-of-sequence token)")
    if (~ok).any():
        notes.append(f"backend=openai: {int((~ok).sum())} of {n} requests failed; the first error: "
                     f"{next(e for e in r['error'] if e)}")
    if b.get("save_detailed"):  # vllm bench serve --save-result --save-detailed, one file per point
        folder = Path(str(b.save_detailed))
        folder.mkdir(parents=True, exist_ok=True)
        system = str(OmegaConf.select(cfg, "system._target_", default="system")).rsplit(".", 1)[-1].lower()
        path = folder / f"{system}-seed{int(cfg.seed)}-{config_hash(cfg)[:8]}.json"
        payload = {"backend": "openai-completions", "model_id": served, "base_url": str(b.url), "num_prompts": n,
                   "max_concurrency": table.max_concurrency, "sampling": sampling,
                   **{k: v for k, v in metrics.items() if k != "wall_s"}, "duration": float(res.duration_s),
                   **detailed(res)}
        path.write_text(json.dumps(payload, indent=1, default=float) + "\n")
        notes.append(f"per-request detail: {path}")
    metrics["wall_s"] = time.perf_counter() - t0
    return PointResult(metrics=metrics, requests=with_latencies(requests), steps=None, notes=notes,
                       provenance=[asdict(d) for d in getattr(table, "provenance", ())])


def requests_frame(out: SimOutput, table: Any) -> pd.DataFrame:
    """One row per request: what happened to it (the input of :func:`repro.metrics.summary.summarize`)."""
    s = out.state
    classes = np.asarray(table.classes or ("default",), dtype=object)
    return pd.DataFrame({
        "rid": np.arange(s.n),
        "dataset": table.dataset,
        "slo_class": classes[np.asarray(table.slo_class)],
        "arrival_s": s.arrival_s,
        "first_token_at": s.first_token_at,
        "first_decode_at": s.first_decode_at,
        "finish_at": s.finish_at,
        "prompt_len": s.prompt_len,
        "output_len": s.num_generated,
        "num_proposed": s.num_proposed,
        "num_accepted": s.num_accepted,
        "num_matched": s.num_matched,
        "num_decode_steps": s.num_decode_steps,
        "num_spec_steps": s.num_spec_steps,
        "tpot_slo_s": s.tpot_slo_s,
        "ttft_slo_s": s.ttft_slo_s,
        "num_preemptions": s.num_preemptions,
        "service_s": s.service_s,
        "swap_s": s.swap_s,
        "replica": out.replica_of,
        **({"client": np.asarray(table.client)} if getattr(table, "client", None) is not None else {}),
        **out.request_columns,
        **({"released_at": out.released_at} if out.released_at is not None else {}),
    })


def steps_frame(out: SimOutput) -> pd.DataFrame:
    """One row per step (:class:`repro.sim.trace.StepRecord`), plus a column per plan telemetry name where plans carried
    any (:func:`repro.sim.trace.steps_frame`)."""
    return trace.steps_frame(out.steps, out.step_telemetry)


def edge_optimum(built: Built, out: SimOutput, steps: pd.DataFrame | None) -> dict[str, float]:
    """GoodSpeed's yardstick, which only a simulator can compute: the optimum x* and the run's utility against it.

    - Per client: true per-token acceptance (mean level a_r, on its server's oracle stream, of the requests it got
      tokens for) and x* of problem (1) for the policy's ``round_budget`` C
      (:func:`repro.metrics.fairness.optimal_goodput`).
    - The run's utility U(x̄), x̄_i = client i's tokens per round (step). With a steps table, ``utility_opt`` (the
      line the utility converges to) is added to it as a column.
    - ``utility_even``: U of the even split at the same acceptances (:func:`repro.metrics.fairness.even_goodput`);
      ``even_gap`` = U(x*) − that, the most adapting the allocation can gain.
    - The row's ``output_throughput`` is GoodSpeed's goodput per second, Σ_i x̄_i(T) · T / wall: tokens given to
      clients (Eq. 4's x_i(t) summed: accepted + bonus, first tokens included) per second of simulated wall time
      (receiving + verifying + sending); its ``sum_log_goodput`` = Σ_i log g_i, g_i = client i's tokens per second
      (= U(x̄) + N · log(T / wall); Fig. 4's utility of per-second goodputs). Both from
      :func:`repro.metrics.summary.summarize`.
    """
    from repro.metrics.fairness import even_goodput, optimal_goodput, utility

    assert built.deployment is not None
    servers = built.deployment.draft_servers
    client = np.asarray(built.table.client)
    n = len(servers)
    gen = out.state.num_generated
    alpha = np.full(n, np.nan)
    for i, srv in enumerate(servers):
        served = np.flatnonzero((client == i) & (gen > 0))
        if served.size:
            alpha[i] = float(np.mean([built.oracle.level(int(r), srv) for r in served]))
    rounds = max(out.num_steps, 1)
    xbar = np.bincount(client, weights=gen.astype(np.float64), minlength=n)[:n] / rounds
    known = np.nan_to_num(alpha, nan=0.0)
    budget = int(built.engine.policy.round_budget or 0)
    u_opt, u, u_even = utility(optimal_goodput(known, budget)), utility(xbar), utility(even_goodput(known, budget))
    if steps is not None:
        steps["utility_opt"] = u_opt
    return {"utility": u, "utility_opt": u_opt, "utility_gap": u_opt - u, "utility_even": u_even,
            "even_gap": u_opt - u_even, "mean_true_acceptance": float(np.nanmean(alpha)),
            "rounds": float(out.num_steps)}


def memory_row(cfg: DictConfig) -> dict[str, float]:
    """The GPU memory of one point's deployment at start, per GPU of the target's tp, in GiB: the target's weights,
    the draft's weights (when the system keeps a draft model resident), the KV cache pool (the draft's own KV
    included, as the engine profile lays it out), the activation reserve and what is left unused; and the KV pool's
    capacity in tokens (Nightjar Fig. 3)."""
    from repro.cost.model import GiB

    policy = instantiate_system(cfg.system)
    cost = Deployment.from_cfg(cfg, policy).cost_model()
    resident = bool(policy.uses_draft_model and cost.draft is not None)
    bs = int(cfg.engine.block_size)
    blocks = cost.kv_capacity_blocks(draft_resident=resident, block_size=bs)
    tp = cost.tp
    non_kv = cost.non_kv_bytes(draft_resident=resident)
    draft = cost.resident_draft(resident)
    parts = {
        "target_weights_gib": cost.model.weight_bytes / tp,
        "draft_weights_gib": (draft.weight_bytes / tp) if draft is not None else 0.0,
        "kv_cache_gib": blocks * bs * cost.kv_bytes_per_token(include_draft=resident) / tp,
        "activations_gib": non_kv["activations"] + non_kv["cuda_graphs"] + non_kv["non_torch"],
    }
    parts["unused_gib"] = max(cost.hardware.memory_bytes - sum(parts.values()), 0.0)
    return {**{k: v / GiB for k, v in parts.items()}, "kv_tokens": float(blocks * bs)}
