"""Compose-time checks: a value of the wrong type, out of range, or physically impossible is refused before anything
runs, with one line naming the key (the command line prints it as ``error: ...`` and exits with status 2).

Three layers, all raising :class:`repro.core.errors.ConfigError`:

- :func:`check_keys`: keys added with ``+`` that no config defines (``+num_request=50`` is a typo, not a new knob);
- :func:`check_values`: the top-level knobs of ``conf/config.yaml`` and an experiment's own top-level keys have the
  right type and range (``rps=abc``, ``rps=-1``, ``quick=maybe``, ``n_jobs=0``);
- :func:`check_point`: one fully composed point is physically possible — tensor parallelism splits the attention
  heads, the target's weights (plus a resident draft's) leave KV memory on the GPUs, the workload and system
  configs build (their constructors check budgets, counts and block sizes), and the deployment gives the system
  what it declares it needs (:func:`check_needs`); :func:`check_workload`: its requests build from the data files
  they need (a missing file raises :class:`repro.core.errors.DataMissingError`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from repro.core.errors import ConfigError, suggest

if TYPE_CHECKING:
    from repro.experiments.compose import Recipe
    from repro.experiments.expspec import ExpSpec

GiB = 2**30


@dataclass(frozen=True, slots=True)
class Knob:
    """Type and range of a top-level knob: ``kind`` int | float | bool | str.

    ``low`` exclusive (``low_incl`` inclusive) and ``high`` inclusive bounds; ``nullable``: null allowed.
    """

    kind: str
    low: float | None = None
    low_incl: bool = False
    high: float | None = None
    nullable: bool = False

    def describe(self) -> str:
        what = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}[self.kind]
        rng = ""
        if self.low is not None and self.high is not None:
            rng = f" in {'[' if self.low_incl else '('}{self.low:g}, {self.high:g}]"
        elif self.low is not None:
            rng = f" {'>=' if self.low_incl else '>'} {self.low:g}"
        return what + rng + (" or null" if self.nullable else "")


#: The knobs of conf/config.yaml (dotted keys).
KNOBS: dict[str, Knob] = {
    "seed": Knob("int", 0, low_incl=True),
    "tp": Knob("int", 0),
    "draft_tp": Knob("int", 0),
    "rps": Knob("float", 0),
    "load_scale": Knob("float", 0),
    "num_requests": Knob("int", 0),
    "max_sim_time_s": Knob("float", 0, nullable=True),
    "max_concurrency": Knob("int", 0, nullable=True),  # null: open loop (a case may close it, another not)
    "engine.block_size": Knob("int", 0),
    "engine.gpu_memory_utilization": Knob("float", 0, high=1.0),
    "engine.record_steps": Knob("bool"),
    "engine.record_rounds": Knob("bool"),
    "engine.fast_forward": Knob("bool"),  # not in conf/config.yaml (on by default): +engine.fast_forward=false
    "engine.check_invariants": Knob("bool"),  # not in conf/config.yaml (off): +engine.check_invariants=true
    "quick": Knob("bool"),
    "n_jobs": Knob("int", 0, nullable=True),
    "resume": Knob("bool"),
    "overwrite": Knob("bool"),
    "out_dir": Knob("str", nullable=True),
    "save_requests": Knob("bool"),
    "case": Knob("str", nullable=True),
}

#: Experiment-level keys that are fractions or probabilities, whatever values the experiment sweeps.
FRACTIONS = {"accept": Knob("float", 0, high=1.0), "urgent_fraction": Knob("float", 0, low_incl=True, high=1.0)}


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def check_value(key: str, value: Any, knob: Knob) -> None:
    """``value`` of ``key`` has ``knob``'s type and range (ConfigError naming the key otherwise)."""
    bad = ConfigError(f"{key}={_show(value)}: expected {knob.describe()}")
    if value is None:
        if not knob.nullable:
            raise bad
        return
    if knob.kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return
    if knob.kind == "str":
        if not isinstance(value, str):
            raise bad
        return
    if not _is_number(value) or (knob.kind == "int" and not float(value).is_integer()):
        raise bad
    v = float(value)
    if math.isnan(v):
        raise bad
    if knob.low is not None and (v < knob.low or (v == knob.low and not knob.low_incl)):
        raise bad
    if knob.high is not None and v > knob.high:
        raise bad


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def infer_knob(key: str, values: Sequence[Any]) -> Knob | None:
    """A knob for an experiment's own key, inferred from its default and grid values; None unless scalars of one kind.

    Integers stay integers, positive numbers positive, booleans booleans.
    """
    if key in FRACTIONS:
        return FRACTIONS[key]
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    nullable = len(vals) < len(values)
    if all(isinstance(v, bool) for v in vals):
        return Knob("bool", nullable=nullable)
    if all(_is_number(v) for v in vals):
        kind = "int" if all(isinstance(v, int) for v in vals) else "float"
        positive = all(float(v) > 0 for v in vals)
        nonneg = all(float(v) >= 0 for v in vals)
        low, incl = (0.0, False) if positive else ((0.0, True) if nonneg else (None, False))
        return Knob(kind, low, low_incl=incl, nullable=nullable)
    return None  # strings: names are checked where they are used (config groups, dataset names, ...)


def grid_values(exp: ExpSpec) -> dict[str, list[Any]]:
    """Every value an experiment gives each key: its grid axes and its cases' grids and overrides."""
    out: dict[str, list[Any]] = {}

    def add(key: str, value: Any) -> None:
        vals = value if isinstance(value, list | tuple) else [value]
        out.setdefault(key, []).extend(vals)

    for key, value in exp.grid.items():
        add(key, value)
    for case in exp.cases:
        for key, value in case.grid.items():
            add(key, value)
        for key, value in case.overrides.items():
            add(key, value)
        for key, value in case.columns.items():  # a constant column may share a config key's name (k = 0)
            add(key, value)
    return out


def check_values(cfg: DictConfig, exp: ExpSpec | None = None, first: Sequence[str] = ()) -> None:
    """Check type and range of the top-level knobs (:data:`KNOBS`) and the experiment's own scalar keys.

    Keys in ``first`` (what the user typed) are checked first, so an error names the typed key, not one that
    interpolates it.
    """
    swept = grid_values(exp) if exp is not None else {}
    keys = [*KNOBS, *(str(k) for k in cfg)]
    for key in dict.fromkeys([*(k for k in first if k in keys), *keys]):
        value = OmegaConf.select(cfg, key, default="__missing__")
        if value == "__missing__" or key in ("exp", "hydra") or OmegaConf.is_config(value):
            continue
        knob = KNOBS.get(key) or infer_knob(key, swept.get(key) or [value])
        if knob is not None:
            check_value(key, value, knob)


def check_keys(added: Iterable[str], known: Iterable[str]) -> None:
    """Top-level keys added with ``+KEY=...`` must be keys some config defines (``known``)."""
    known = set(known)
    for key in added:
        top = key.split(".")[0]
        if top not in known:
            raise ConfigError(f"+{key}: '{top}' is not a config key{suggest(top, known)}")


def check_workload(cfg: DictConfig, where: str = "") -> None:
    """Check that the point's request table builds (data files exist, workload checks pass); errors name ``where``.

    The data loaders cache what they read: workers forked from this process do not read it again.
    """
    import numpy as np

    from repro.core.errors import DataMissingError
    from repro.experiments.simulate import baseline_tpot_s, instantiate_system, request_table
    from repro.sim.deployment import Deployment

    cost = Deployment.from_cfg(cfg, instantiate_system(cfg.system, where)).cost_model()
    try:
        request_table(cfg, cost, baseline_tpot_s(cost), np.random.SeedSequence(int(cfg.seed)).spawn(3)[0])
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None
    except DataMissingError as exc:
        raise DataMissingError(f"{where}{exc}") from None


# --------------------------------------------------------------------------------------------- physics


#: The keys of a composed point :func:`check_point` reads besides its workload (resolved: their values are their own).
POINT_KEYS = ("hardware", "model", "draft", "engine", "tp", "draft_tp", "system", "backend")


def check_point(point: DictConfig | Recipe, where: str = "", resolved: Mapping[str, Any] | None = None,
                passed: set[str] | None = None) -> None:
    """One composed point can run: specs build, tp splits the heads, the weights fit, the workload parses, the
    system's constructor accepts its keys and the deployment meets the system's needs.

    ``point``: its config, or a :class:`~repro.experiments.compose.Recipe` of it (built only if needed).
    ``resolved``: the config as a plain resolved dict, when the caller has it (its workload is read from there).
    ``passed`` (with ``resolved``): what earlier points passed, kept up to date. The workload's check reads the
    workload only, and the others read :data:`POINT_KEYS` only: a point whose :data:`POINT_KEYS` passed before has
    its workload parsed and nothing else (a sweep's points mostly differ in their workloads)."""
    import json

    from workloads.spec import parse_workload

    def spec(group: str, build: Any, source: Any) -> Any:
        try:
            return build(source[group])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}{group} config: {exc}") from None

    keys: tuple[str, str] | None = None
    if resolved is not None and passed is not None:
        keys = (json.dumps(["rest", {k: resolved.get(k) for k in POINT_KEYS}], sort_keys=True, default=str),
                json.dumps(["workload", resolved["workload"]], sort_keys=True, default=str))
        if keys[0] in passed:
            if keys[1] not in passed:
                spec("workload", parse_workload, resolved)
                passed.add(keys[1])
            return

    from repro.experiments.compose import lent

    with lent(point) as cfg:
        _check_config(cfg, where, resolved, spec)
    if keys is not None and passed is not None:
        passed.update(keys)


def _check_config(cfg: DictConfig, where: str, resolved: Mapping[str, Any] | None, spec: Any) -> None:
    """:func:`check_point`'s checks of a point's config (``spec`` builds a group's spec, wording its errors)."""
    from repro.cost.serving import EngineProfile
    from repro.cost.spec import HardwareSpec, ModelSpec
    from repro.sim.deployment import Deployment, draft_server_specs
    from workloads.spec import parse_workload

    hw = spec("hardware", HardwareSpec.from_cfg, cfg)
    model = spec("model", ModelSpec.from_cfg, cfg)
    draft = spec("draft", ModelSpec.from_cfg, cfg)
    engine = spec("engine", EngineProfile.from_cfg, cfg)
    tp, draft_tp = int(cfg.tp), int(cfg.draft_tp)
    check_tp(model, tp, "tp", where)
    from repro.experiments.simulate import instantiate_system, max_model_len

    try:
        max_model_len(cfg, model)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None

    check_system_counts(cfg.system, where)
    policy = instantiate_system(cfg.system, where)
    uses_draft = bool(policy.uses_draft_model) and draft.kind == "decoder"
    spec("workload", parse_workload, cfg if resolved is None else resolved)
    # the deployment the engine will build (replicas, their tp, remote draft servers), checked replica by replica
    try:
        deployment = Deployment.of(policy, hardware=hw, model=model, draft=draft, tp=tp, draft_tp=draft_tp,
                                   gpu_memory_utilization=float(cfg.engine.gpu_memory_utilization), engine=engine,
                                   draft_servers=draft_server_specs(cfg))
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None
    check_needs(deployment, where)
    check_backend(cfg, policy, deployment, model, draft, where)
    resident = uses_draft and not deployment.draft_servers
    if resident:
        check_tp(draft, draft_tp, "draft_tp", where)
    for i, rep in enumerate(deployment.replicas):
        if deployment.routed:
            check_tp(model, int(rep.tp), f"tp_per_replica[{i}]", where)
        cost = deployment.cost_model(int(rep.tp))
        if cost.kv_capacity_blocks(draft_resident=resident, block_size=int(cfg.engine.block_size)) <= 0:
            raise ConfigError(f"{where}{_fit_message(cost, resident)}")


def check_backend(cfg: DictConfig, policy: Any, deployment: Any, model: Any, draft: Any, where: str = "") -> None:
    """``backend=hf`` runs the system at all (docs/gpu.md, "Which systems run on backend=hf"): refused here, before
    anything runs, rather than at its first speculative step."""
    from repro.experiments.simulate import backend_kind

    if backend_kind(cfg) != "hf":
        return
    name = type(policy).__name__
    if deployment.draft_servers:
        raise ConfigError(f"{where}backend=hf runs co-located proposers only, and {name} drafts on remote draft "
                          "servers (engine.draft_servers): run it on the simulator")
    proposer = str(OmegaConf.select(cfg, "system.proposer", default=None) or "draft")
    if proposer == "eagle":
        raise ConfigError(f"{where}backend=hf has no EAGLE head ({name} drafts with system.proposer=eagle): run it on "
                          "the simulator, or with the draft model (system.proposer=draft)")
    if float(cfg.backend.get("temperature") or 0.0) > 0 and policy.branching_trees:
        raise ConfigError(f"{where}backend=hf verifies token trees greedily only, and {name} drafts trees: "
                          "backend.temperature=0")
    if policy.uses_draft_model and not cfg.backend.get("tiny") and draft.kind == "decoder" \
            and int(draft.vocab_size) != int(model.vocab_size):
        raise ConfigError(f"{where}backend=hf verifies the draft's tokens against the target's vocabulary row by "
                          f"row, and {draft.name} has {draft.vocab_size} rows where {model.name} has "
                          f"{model.vocab_size} (a padded embedding, even with the same tokenizer): pick a draft "
                          "with the target's vocabulary size")


def check_needs(deployment: Any, where: str = "") -> None:
    """The deployment gives each of its policies what the policy declares it needs (remote draft servers, an engine
    that verifies branching trees: :class:`repro.sim.policy.Policy`)."""
    engine = deployment.engine
    for policy in dict.fromkeys([deployment.policy, *(r.policy for r in deployment.replicas)]):
        name = type(policy).__name__
        if policy.needs_draft_servers and not deployment.draft_servers:
            raise ConfigError(
                f"{where}{name} drafts on remote draft servers, one per client, and this run has none "
                "(engine.draft_servers is empty): run it in an experiment that sets them (+exp=goodspeed_fig3), or "
                "set engine.draft_servers=[{hardware: l4}, ...] and a workload with one client per server")
        if policy.branching_trees and not engine.verifies_trees:
            from repro.cost.serving import available_engines, load_engine

            able = [e for e in available_engines() if load_engine(e).verifies_trees]
            raise ConfigError(
                f"{where}{name} verifies token trees that branch and engine {engine.name} cannot (scorer "
                f"{engine.scorer}: only a multi_query scorer verifies a tree, in one pass with a tree mask); use "
                f"engine={' | '.join(able)}")


#: System hyperparameters that count or budget something: positive whenever they are numbers (null = a default).
_POSITIVE_PREFIXES = ("max_num_", "num_", "token_budget", "budget", "d_max", "w_max", "max_len", "window")
_NONNEGATIVE = ("k", "n_max", "watermark", "probe_steps")


def check_system_counts(node: Any, where: str = "") -> None:
    """Counts, budgets and lengths among a system's keys are positive (``k``, ``n_max``, ... non-negative)."""
    for name in node:
        key = str(name)
        value = node.get(key)
        if not _is_number(value):
            continue
        if key in _NONNEGATIVE:
            check_value(f"{where}system.{key}", value, Knob("float", 0, low_incl=True))
        elif key.startswith(_POSITIVE_PREFIXES) or key.endswith(("_len", "_tokens", "_steps")):
            check_value(f"{where}system.{key}", value, Knob("float", 0))


def check_tp(model: Any, tp: int, key: str, where: str = "") -> None:
    """vLLM's rule: tp divides the attention heads.

    tp divides the KV heads, or is a multiple of them (vLLM then replicates each KV head on tp / kv_heads GPUs).
    """
    heads, kv = int(model.num_heads), int(model.num_kv_heads)
    if heads % tp:
        raise ConfigError(f"{where}{key}={tp}: does not divide {model.name}'s {heads} attention heads")
    if kv % tp and tp % kv:
        raise ConfigError(
            f"{where}{key}={tp}: {model.name}'s {kv} KV heads neither split over {tp} GPUs nor replicate evenly")


def _fit_message(cost: Any, with_draft: bool) -> str:
    hw, model, draft = cost.hardware, cost.model, cost.draft
    parts = cost.non_kv_bytes(with_draft)
    reserve = (parts["activations"] + parts["cuda_graphs"] + parts["non_torch"]) / GiB
    usable = cost.tp * (hw.memory_gb * cost.gpu_memory_utilization - reserve)
    weights = model.weight_bytes / GiB
    what = f"{model.name} ({weights:.1f} GiB of weights"
    if with_draft and draft is not None:
        what += f" + draft {draft.name} {draft.weight_bytes / GiB:.1f} GiB"
    return (f"{what}) leaves no KV memory on {cost.tp} x {hw.name} (memory_gb={hw.memory_gb:g}: {usable:.1f} GiB "
            f"usable at gpu_memory_utilization={cost.gpu_memory_utilization:g} after a "
            f"{reserve:.2f} GiB per GPU for activations, CUDA graphs and other allocations); raise tp or pick a "
            "larger GPU")
