"""Deployment: what runs where, declared in one value that the engine builds its replicas from.

A :class:`Deployment` holds the system (the policy that schedules the one replica, or routes requests among several),
its replicas (each with its own policy and tensor parallelism), the hardware and models every replica's cost model is
built from (target ``tp``, a co-located draft model with ``draft_tp``, the serving engine's profile, the GPU memory
utilization) and the remote draft servers (GoodSpeed: a draft model on its own hardware, ``rtt_s`` away). The engine
(:class:`repro.sim.engine.Engine`) builds from it, per replica, the cost model (:meth:`Deployment.cost_model`) and the
proposers (:func:`repro.sim.proposers.colocated` around that cost model, sharing the deployment's remote draft servers,
which are proposers too: :class:`~repro.sim.proposers.RemoteDraftServer`), and binds each replica's policy with its
replica's context.

It is built once per point from the composed config (:meth:`Deployment.from_cfg`), with the users' keys as they are:
``hardware``, ``model``, ``draft``, ``tp``, ``draft_tp``, ``engine`` (the profile plus ``gpu_memory_utilization``
and ``draft_servers: [{hardware, model, rtt_ms, tp}]``), and what the system asks for: a policy whose
:meth:`~repro.sim.policy.Policy.replicas` returns replica specs (SepPipe's ``num_replicas`` and ``tp_per_replica``) gets
one replica per spec and routes each arriving request; any other policy is the deployment's one replica at ``tp``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core.errors import ConfigError
from repro.cost.model import CostModel, TargetProfile
from repro.cost.serving import EngineProfile, vllm_serve_budgets
from repro.cost.spec import HardwareSpec, ModelSpec, hardware_for
from repro.sim.policy import Policy, ReplicaSpec
from repro.sim.proposers import DRAFT, RemoteDraftServer

#: Keys of one entry of ``engine.draft_servers``.
DRAFT_SERVER_KEYS = ("hardware", "model", "rtt_ms", "tp", "bandwidth_mbps")


@dataclass(frozen=True, slots=True)
class DraftServerSpec:
    """A remote draft server: ``model`` (a draft model) on ``tp`` GPUs of ``hardware``, ``rtt_s`` away.

    Its acceptance is drawn from the token-oracle stream ``stream`` (default: the run's draft model's).
    """

    hardware: HardwareSpec
    model: ModelSpec
    rtt_s: float = 0.0
    tp: int = 1
    stream: str = DRAFT
    bandwidth_bps: float = float("inf")


@dataclass(frozen=True, eq=False)
class Deployment:
    """The system, its replicas and the hardware and models they run on (module docstring).

    Build it with :meth:`of` (or :meth:`from_cfg`), which asks the policy for its replicas.
    """

    policy: Policy
    replicas: tuple[ReplicaSpec, ...]
    routed: bool  # requests are routed among the replicas by ``policy.route`` (the policy declared replicas)
    hardware: HardwareSpec
    model: ModelSpec
    draft: ModelSpec | None = None
    tp: int = 1
    draft_tp: int = 1
    gpu_memory_utilization: float = 0.9
    engine: EngineProfile = field(default_factory=EngineProfile)
    draft_servers: tuple[RemoteDraftServer, ...] = ()  # shared by every replica (``StepPlan.draft_server`` indexes)
    target_profile: TargetProfile | None = None  # cost=profile: measured target passes
    draft_profile: TargetProfile | None = None  # cost=profile cost.draft_table: measured draft passes

    @classmethod
    def of(cls, policy: Policy, *, hardware: HardwareSpec, model: ModelSpec, draft: ModelSpec | None = None,
           tp: int = 1, draft_tp: int = 1, gpu_memory_utilization: float = 0.9, engine: EngineProfile | None = None,
           draft_servers: Sequence[DraftServerSpec] = (), target_profile: TargetProfile | None = None,
           draft_profile: TargetProfile | None = None) -> Deployment:
        """The deployment of ``policy``: one replica per spec its :meth:`~repro.sim.policy.Policy.replicas` declares
        (each with its own policy and tensor parallelism), else one replica at ``tp`` run by ``policy`` itself."""
        specs = policy.replicas()
        replicas = (ReplicaSpec(policy=policy, tp=tp),) if specs is None else tuple(specs)
        profile = engine if engine is not None else EngineProfile()
        servers = tuple(  # each server's cost model runs its draft model on its own hardware (``draft_hardware``)
            RemoteDraftServer(CostModel(s.hardware, model, tp=1, draft=s.model, draft_hardware=s.hardware,
                                        draft_tp=s.tp, engine=profile), name=f"server{i}", stream=s.stream,
                              rtt_s=s.rtt_s, bandwidth_bps=s.bandwidth_bps)
            for i, s in enumerate(draft_servers))
        return cls(policy, replicas, specs is not None, hardware, model, draft, tp, draft_tp, gpu_memory_utilization,
                   profile, servers, target_profile, draft_profile)

    @classmethod
    def from_cfg(cls, cfg: Any, policy: Policy) -> Deployment:
        """The deployment of ``policy`` under a composed config (module docstring for the keys read)."""
        hardware = HardwareSpec.from_cfg(cfg.hardware)
        return cls.of(policy, hardware=hardware, model=ModelSpec.from_cfg(cfg.model),
                      draft=ModelSpec.from_cfg(cfg.draft), tp=int(cfg.tp), draft_tp=int(cfg.draft_tp),
                      gpu_memory_utilization=float(cfg.engine.gpu_memory_utilization),
                      engine=scheduled_with(profiled_with(engine_profile(cfg), policy, hardware), policy),
                      draft_servers=draft_server_specs(cfg), target_profile=target_profile(cfg),
                      draft_profile=target_profile(cfg, "draft_table"))

    def cost_model(self, tp: int | None = None) -> CostModel:
        """The cost model of a replica of ``tp`` GPUs (default: the deployment's ``tp``), with the co-located draft."""
        return CostModel(self.hardware, self.model, tp=self.tp if tp is None else tp, draft=self.draft,
                         draft_tp=self.draft_tp, gpu_memory_utilization=self.gpu_memory_utilization,
                         engine=self.engine, target_profile=self.target_profile,
                         draft_profile=self.draft_profile)


def target_profile(cfg: Any, key: str = "table") -> TargetProfile | None:
    """The measured profile table under ``cost=profile`` (``cost.<key>``); None under ``cost=analytic`` (default).

    ``key="table"``: the target's; ``key="draft_table"``: the draft's (optional, None when unset). A CSV in
    :mod:`repro.cost.profile`'s format; the path is absolute or relative to the working directory or the repository.
    A missing file or malformed table is a one-line ConfigError naming it.
    """
    from repro.cost.profile import ProfileCostModel

    node = cfg.get("cost") or {}
    kind = str(node.get("kind", "analytic"))
    if kind == "analytic":
        return None
    if kind != "profile":
        raise ConfigError(f"cost.kind must be 'analytic' or 'profile', not {kind!r}")
    table = _case_table(cfg, key, node.get(key))
    if not table and key != "table":
        return None
    if not table:
        raise ConfigError("cost=profile needs cost.table=PATH (a CSV of num_tokens,context,latency_ms: python -m "
                          "repro.profile writes one)")
    path = Path(str(table))
    if not path.is_absolute() and not path.is_file():
        path = Path(__file__).resolve().parents[2] / path
    if not path.is_file():
        raise ConfigError(f"cost.{key}: no file {table}")
    check_profile_fits(cfg, key, path)
    try:
        return ProfileCostModel(path)
    except ValueError as exc:
        raise ConfigError(f"cost.{key}: {exc}") from None


def _case_table(cfg: Any, key: str, table: Any) -> Any:
    """``cost.<key>`` for this point: a path, or a mapping from ``hardware/model``, hardware or model names to paths,
    so an experiment whose cases run on several GPUs or models takes each case's own table (``cost.table='{h100-80g:
    profiles/h100-llama2-7b.csv, l40s: profiles/l40s-llama2-7b.csv}'``); a point no key names is a ConfigError."""
    if table is None or isinstance(table, str | Path):
        return table
    try:
        choices = {str(k): v for k, v in dict(table).items()}
    except (TypeError, ValueError):
        raise ConfigError(f"cost.{key}: a path, or a mapping of hardware or model names to paths") from None
    hw = str(cfg.hardware.name)
    model = str(cfg.draft.name if key == "draft_table" else cfg.model.name)
    for name in (f"{hw}/{model}", hw, model):
        if name in choices:
            return choices[name]
    raise ConfigError(f"cost.{key}: no table for hardware {hw} and model {model} (given: {sorted(choices)}; keys are "
                      "hardware/model, hardware or model names)")


def profile_sidecar(path: Path, what: str = "profile") -> dict[str, Any] | None:
    """A profile table's provenance sidecar (``<csv>.json``, written by ``python -m repro.profile``); None without
    one, a ConfigError naming ``what`` when it is not JSON."""
    side = path.with_suffix(path.suffix + ".json")
    if not side.is_file():
        return None
    try:
        return dict(json.loads(side.read_text()))
    except ValueError:
        raise ConfigError(f"{what}: {side} is not JSON") from None


def measured_on(info: Mapping[str, Any]) -> tuple[str, str | None]:
    """The GPU a sidecar names and its ``conf/hardware`` id (``""``, None: a CPU profile; a name, None: a GPU no
    conf/hardware describes)."""
    gpu = str(info.get("gpu") or "")  # none: a CPU profile (the sim-vs-real check on this machine prices with one)
    return gpu, hardware_for(gpu) if gpu else None


def check_profile_fits(cfg: Any, key: str, path: Path) -> None:
    """Check that a profile table's provenance sidecar (``<csv>.json``) describes the run.

    The sidecar (written by ``python -m repro.profile``) must name the same model (target for ``cost.table``, draft
    for ``cost.draft_table``), tp and, for a GPU profile, ``hardware``; a mismatch is a one-line ConfigError. A table
    without a sidecar is taken as given.
    """
    info = profile_sidecar(path, f"cost.{key}")
    if info is None:
        return
    want = cfg.draft.name if key == "draft_table" else cfg.model.name
    role = "draft" if key == "draft_table" else "model"
    if info.get("model") not in (None, str(want)):
        raise ConfigError(f"cost.{key}: {path.name} was measured for {info['model']}, but this run's {role} is {want} "
                          f"(profile it: python -m repro.profile --model {want})")
    tp = int(cfg.get("draft_tp", 1) if key == "draft_table" else cfg.get("tp", 1))
    if int(info.get("tp", 1)) != tp:
        raise ConfigError(f"cost.{key}: {path.name} was measured at tp={info.get('tp', 1)}, this run has tp={tp}")
    gpu, hw = measured_on(info)
    if gpu and hw is None:
        raise ConfigError(f"cost.{key}: {path.name} was measured on {gpu}, which no conf/hardware describes")
    if hw is not None and hw != str(cfg.hardware.name):
        raise ConfigError(f"cost.{key}: {path.name} was measured on {gpu}, this run's hardware is "
                          f"{cfg.hardware.name} (run it with hardware={hw})")


def profiled_with(engine: EngineProfile, policy: Policy, hardware: HardwareSpec | None = None) -> EngineProfile:
    """``engine`` whose start-up profiling run (``kv_accounting: profile_run``) uses the policy's scheduler budgets,
    as vLLM's does: a pass over ``max_num_batched_tokens`` tokens and the sampler over ``max_num_seqs`` sequences
    (for a policy without them, the profile's own values, or with ``profile_serve_defaults`` ``vllm serve``'s on
    ``hardware``), with the rejection sampler's pass where the policy speculates
    (:attr:`~repro.sim.policy.Policy.speculates`)."""
    if engine.kv_accounting != "profile_run":
        return engine
    def budget(name: str, default: int) -> int:
        v = getattr(policy, name, None)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default

    seqs0, tokens0 = engine.profile_seqs, engine.profile_tokens
    if engine.profile_serve_defaults and hardware is not None:
        seqs0, tokens0 = vllm_serve_budgets(hardware.name, hardware.memory_gb)
    tokens = budget("max_num_batched_tokens", tokens0)
    seqs = budget("max_num_seqs", seqs0)
    spec = bool(policy.speculates)
    if (tokens, seqs, spec) == (engine.profile_tokens, engine.profile_seqs, engine.profile_speculative):
        return engine
    return dataclasses.replace(engine, profile_tokens=tokens, profile_seqs=seqs, profile_speculative=spec)


def scheduled_with(engine: EngineProfile, policy: Policy) -> EngineProfile:
    """``engine`` as the policy's speculative configuration sets it up: its ``draft_tokens`` (a system with a fixed
    chain length ``k``: vLLM's ``num_speculative_tokens``), async scheduling off for a proposer outside
    ``async_proposers``, and the CUDA-graph capture sizes rounded to multiples of 1 + k (:mod:`repro.cost.serving`)."""
    k = getattr(policy, "k", None)
    k = int(k) if isinstance(k, int) and not isinstance(k, bool) and k > 0 and policy.speculates else 0
    changes: dict[str, Any] = {}
    if k and engine.first_token_drafts:
        changes["draft_tokens"] = k
    proposer = getattr(policy, "proposer", None)
    if engine.async_scheduling and policy.speculates and k and str(proposer) not in engine.async_proposers:
        changes["async_scheduling"] = False
    if k and engine.graph_sizes_spec_multiple and engine.graph_sizes:
        step = k + 1
        top = engine.graph_sizes[-1]
        rounded = sorted({-(-n // step) * step for n in engine.graph_sizes if -(-n // step) * step <= top})
        changes["graph_sizes"] = tuple(rounded) if rounded else ((step,) if step <= top else ())
        if changes["graph_sizes"]:
            changes["graph_max_tokens"] = min(engine.graph_max_tokens, changes["graph_sizes"][-1])
    return dataclasses.replace(engine, **changes) if changes else engine


def engine_profile(cfg: Any) -> EngineProfile:
    """The run's engine profile from its ``engine`` block (a bad key or value becomes a one-line ConfigError)."""
    try:
        return EngineProfile.from_cfg(cfg.engine)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"engine config: {exc}") from None


def draft_server_specs(cfg: Any) -> tuple[DraftServerSpec, ...]:
    """The remote draft servers of a composed config's ``engine.draft_servers``.

    Per entry: ``hardware`` (conf/hardware name), ``model`` (conf/model name; default the run's draft), ``rtt_ms``
    (default 0), ``tp`` (default 1), ``bandwidth_mbps`` (each way; default unlimited). A server whose model is not the
    run's draft draws acceptance from its own model's oracle stream (``stream`` = the model's name).
    """
    from repro.cost.spec import load_hardware, load_model

    out = []
    for i, srv in enumerate(cfg.engine.get("draft_servers") or []):
        unknown = set(srv) - set(DRAFT_SERVER_KEYS)
        if unknown:
            raise ConfigError(f"engine.draft_servers[{i}]: unknown key(s) {sorted(unknown)}")
        model = str(srv.get("model", cfg.draft.name))
        bw = srv.get("bandwidth_mbps")
        out.append(DraftServerSpec(hardware=load_hardware(str(srv["hardware"])), model=load_model(model),
                                   rtt_s=float(srv.get("rtt_ms", 0.0)) / 1e3, tp=int(srv.get("tp", 1)),
                                   stream=DRAFT if model == str(cfg.draft.name) else model,
                                   bandwidth_bps=float("inf") if bw is None else float(bw) * 1e6))
    return tuple(out)
