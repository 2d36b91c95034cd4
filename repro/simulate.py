"""Run one point: build the cost model, workload, oracle and system from a composed config, simulate, summarize.

``run_point(cfg)`` is what the experiment runner calls in each worker process; it is also the shortest way to use
the simulator from Python::

    from repro.simulate import compose, run_point
    res = run_point(compose(["system=static_sd_k3", "rps=2", "num_requests=200"]))
    print(res.metrics["mean_tpot_ms"])
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from repro.cost.model import CostModel
from repro.cost.serving import EngineProfile
from repro.cost.spec import HardwareSpec, ModelSpec
from repro.cost.step import DraftServer, decode_pass_s
from repro.engine import Engine, SimOutput, StepRecord
from repro.errors import ConfigError
from repro.policy import Policy, PolicyContext

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


@dataclass
class PointResult:
    """Outcome of one simulated point."""

    metrics: dict[str, float]
    requests: pd.DataFrame  # one row per request (requests_frame) plus latency_s, ttft_ms, tpot_ms
    steps: pd.DataFrame | None
    notes: list[str] = field(default_factory=list)
    provenance: list[dict[str, Any]] = field(default_factory=list)  # workloads.DataSource entries as dicts


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides, outside ``@hydra.main`` (tests, notebooks, workers)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides))


def baseline_tpot_s(cost: CostModel, batch: int = 8, input_len: int = 32, output_len: int = 128) -> float:
    """AdaServe §6.1 "baseline latency": the mean per-iteration latency of incremental decoding (no speculation)
    with ``batch`` requests of ``input_len`` prompt tokens generating ``output_len`` tokens each, from the cost
    model of the same hardware and model (12.5 ms for Llama-2-7B on an A100 in the paper)."""
    steps = [decode_pass_s(cost, batch, input_len + i) for i in range(1, output_len)]
    return float(np.mean(steps))


def instantiate_system(node: Any, where: str = "") -> Policy:
    """The policy a ``system`` config node describes (a constructor's complaint becomes a one-line ConfigError)."""
    from hydra.utils import instantiate

    try:
        policy = instantiate(node)
    except Exception as exc:  # Hydra wraps the constructor's TypeError; surface the key that is wrong
        cause = exc.__cause__ or exc
        raise ConfigError(f"{where}system config ({node.get('_target_', '?')}): {cause}") from None
    if not isinstance(policy, Policy):
        raise ConfigError(f"{where}system config: {node.get('_target_')} is not a repro.policy.Policy")
    return policy


def engine_profile(cfg: DictConfig) -> EngineProfile:
    """The run's engine profile from its ``engine`` block (a bad key or value becomes a one-line ConfigError)."""
    try:
        return EngineProfile.from_cfg(cfg.engine)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"engine config: {exc}") from None


def build_cost(cfg: DictConfig, tp: int | None = None) -> CostModel:
    hw = HardwareSpec.from_cfg(cfg.hardware)
    return CostModel(hw, ModelSpec.from_cfg(cfg.model), tp=int(cfg.tp if tp is None else tp),
                     draft=ModelSpec.from_cfg(cfg.draft), draft_tp=int(cfg.draft_tp),
                     gpu_memory_utilization=float(cfg.engine.gpu_memory_utilization), engine=engine_profile(cfg))


def _draft_servers(cfg: DictConfig) -> tuple[DraftServer, ...]:
    from repro.cost.spec import load_hardware, load_model

    out = []
    target = ModelSpec.from_cfg(cfg.model)
    for i, srv in enumerate(cfg.engine.get("draft_servers") or []):
        unknown = set(srv) - {"hardware", "model", "rtt_ms", "tp"}
        if unknown:
            raise ConfigError(f"engine.draft_servers[{i}]: unknown key(s) {sorted(unknown)}")
        hw = load_hardware(str(srv["hardware"]))
        draft = load_model(str(srv.get("model", cfg.draft.name)))
        cost = CostModel(hw, target, tp=1, draft=draft, draft_hardware=hw, draft_tp=int(srv.get("tp", 1)),
                         engine=engine_profile(cfg))
        out.append(DraftServer(cost=cost, rtt_s=float(srv.get("rtt_ms", 0.0)) / 1e3))
    return tuple(out)


@dataclass
class Built:
    """A point ready to simulate: the engine and what it was built from."""

    engine: Engine
    table: Any
    cost: CostModel
    baseline_tpot_s: float


def build(cfg: DictConfig) -> Built:
    """Build the cost model, workload, oracle, system and engine of one composed point."""
    from repro.oracle import Drafter, TokenOracle
    from workloads import build_workload

    ss_workload, ss_oracle, ss_policy = np.random.SeedSequence(int(cfg.seed)).spawn(3)
    cost = build_cost(cfg)
    model = cost.model
    baseline = baseline_tpot_s(cost)
    try:
        table = build_workload(cfg.workload, seed=ss_workload, tokenizer=model.tokenizer,
                               max_model_len=model.max_context, baseline_tpot_s=baseline)
    except ValueError as exc:  # the workload's own checks name the bad key or value
        raise ConfigError(f"workload config: {exc}") from None
    oracle = TokenOracle.from_cfg(cfg.oracle, seed=ss_oracle, dataset=table.dataset,
                                  draft=str(cfg.draft.name), target=model.name)
    policy = instantiate_system(cfg.system)
    block_size = int(cfg.engine.block_size)
    engine = Engine(arrival_s=table.arrival_s, prompt_len=table.prompt_len, output_len=table.output_len,
                    tpot_slo_s=table.tpot_slo_s, ttft_slo_s=table.ttft_slo_s, slo_class=table.slo_class,
                    policy=policy, make_cost=lambda tp: build_cost(cfg, tp), oracle=oracle, tp=int(cfg.tp),
                    drafter=Drafter(oracle), block_size=block_size, max_model_len=model.max_context,
                    draft_servers=_draft_servers(cfg), record_steps=bool(cfg.engine.record_steps),
                    max_sim_time_s=cfg.get("max_sim_time_s"))
    rng = np.random.default_rng(ss_policy)
    bound = [(policy, cost)] if policy.replicas() is None else [(policy, cost)] + [
        (r.policy, r.cost) for r in engine.replicas]
    for pol, pcost in bound:
        pol.bind(PolicyContext(cost=pcost, rng=rng))
    return Built(engine=engine, table=table, cost=cost, baseline_tpot_s=baseline)


def run_point(cfg: DictConfig) -> PointResult:
    """Simulate one fully composed point and summarize it (see :mod:`repro.metrics`)."""
    from repro.metrics import summarize, with_latencies

    t0 = time.perf_counter()
    built = build(cfg)
    out = built.engine.run()
    requests = requests_frame(out, built.table)
    steps = steps_frame(out) if cfg.engine.record_steps else None
    metrics = summarize(requests, out.sim_time_s, steps)
    metrics["wall_s"] = time.perf_counter() - t0
    requests = with_latencies(requests)  # latency_s, ttft_ms, tpot_ms per request (derived, not saved)
    provenance = [asdict(d) for d in getattr(built.table, "provenance", ())]
    return PointResult(metrics=metrics, requests=requests, steps=steps, notes=[built.table.source],
                       provenance=provenance)


def requests_frame(out: SimOutput, table: Any) -> pd.DataFrame:
    """One row per request: what happened to it (the input of :func:`repro.metrics.summarize`)."""
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
        "replica": out.replica_of,
    })


def steps_frame(out: SimOutput) -> pd.DataFrame:
    """One row per step (:class:`repro.engine.StepRecord`)."""
    names = [f.name for f in fields(StepRecord)]
    return pd.DataFrame.from_records(list(map(attrgetter(*names), out.steps)), columns=names)
