"""Deployment (repro/sim/deployment.py): one value, built from the config and what the system asks for, from which the
engine builds its replicas, their cost models and proposers, and binds each policy with its replica's context."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.core.errors import ConfigError
from repro.experiments.simulate import build, compose, instantiate_system
from repro.sim.deployment import Deployment
from repro.sim.proposers import RemoteDraftServer
from systems.incr_dec import IncrDec
from systems.seppipe import SepPipe
from tests.conftest import make_deployment, make_engine, make_requests


def test_a_single_replica_system_is_one_replica_at_the_runs_tp() -> None:
    cfg = compose(["system=static_sd_k3", "tp=2", "draft_tp=1"])
    policy = instantiate_system(cfg.system)
    dep = Deployment.from_cfg(cfg, policy)
    assert not dep.routed and len(dep.replicas) == 1
    assert dep.replicas[0].policy is policy and dep.replicas[0].tp == 2
    assert (dep.hardware.name, dep.model.name, dep.draft and dep.draft.name) == ("a100-80g", "llama2-7b",
                                                                                  "llama-160m")
    cost = dep.cost_model()
    assert (cost.tp, cost.draft_tp, cost.engine.name, cost.gpu_memory_utilization) == (2, 1, "vllm_v0", 0.9)
    assert dep.draft_servers == ()


def test_seppipe_replicas_come_from_the_deployment_with_their_own_cost_models_and_contexts() -> None:
    cfg = compose(["system=seppipe", "workload=adaserve_mix", "num_requests=10", "system.tp_per_replica=[2,1,1]"])
    built = build(cfg)
    dep = built.deployment
    assert dep is not None and dep.routed and isinstance(dep.policy, SepPipe)
    assert [r.tp for r in dep.replicas] == [2, 1, 1]
    eng = built.engine
    assert [r.cost.tp for r in eng.replicas] == [2, 1, 1]
    for rep, spec in zip(eng.replicas, dep.replicas, strict=True):
        assert rep.policy is spec.policy and isinstance(rep.policy, IncrDec)
        ctx = rep.policy.ctx
        assert ctx.cost is rep.cost and ctx.replica == rep.index and ctx.proposers is rep.proposers
        assert all(p.cost is rep.cost for p in rep.proposers.values())  # co-located with the replica's target
    assert dep.policy.ctx.cost.tp == 1  # the router: the run's tp


def test_remote_draft_servers_are_declared_in_the_engine_block() -> None:
    cfg = compose(["system=static_sd_k3", "engine.draft_servers=[{hardware:l4,rtt_ms:2.5,tp:2},{hardware:a40}]"])
    dep = Deployment.from_cfg(cfg, instantiate_system(cfg.system))
    s0, s1 = dep.draft_servers
    assert isinstance(s0, RemoteDraftServer) and (s0.rtt_s, s1.rtt_s) == (0.0025, 0.0)
    assert (s0.cost.draft_hardware and s0.cost.draft_hardware.name, s0.cost.draft_tp) == ("l4", 2)
    assert s1.cost.draft is not None and s1.cost.draft.name == "llama-160m"  # default: the run's draft model
    assert (s0.name, s1.name, s0.stream) == ("server0", "server1", "draft")
    built = build(compose(["system=static_sd_k3", "num_requests=5", "engine.draft_servers=[{hardware:l4}]"]))
    assert built.engine.replicas[0].proposers.remote == built.deployment.draft_servers  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="unknown key"):
        Deployment.from_cfg(compose(["engine.draft_servers=[{hardware:l4,gpu:2}]"]), SepPipe())


def test_a_deployment_from_values_runs_seppipe() -> None:
    pol = SepPipe(num_replicas=2, tp_per_replica=[1, 2])
    dep = make_deployment(pol)
    assert dep.routed and [r.tp for r in dep.replicas] == [1, 2]
    eng = make_engine(pol, make_requests(4, output_len=3))
    assert [r.cost.tp for r in eng.replicas] == [1, 2]
    assert (eng.run().state.num_generated == 3).all()


@pytest.mark.parametrize(("key", "sidecar", "message"), [
    ("table", None, None),  # no sidecar: taken as given
    ("table", {"tp": 2}, None),  # names no model or GPU: taken as given
    ("table", {"model": "llama2-7b", "tp": 2, "gpu": "NVIDIA A100-SXM4-80GB"}, None),
    ("table", {"model": "llama-68m", "tp": 2}, "cost.table: p.csv was measured for llama-68m, but this run's model is "
     "llama2-7b (profile it: python -m repro.profile --model llama2-7b)"),
    ("table", {}, "cost.table: p.csv was measured at tp=1, this run has tp=2"),  # no tp: 1
    ("table", {"gpu": "NVIDIA H100 80GB HBM3", "tp": 2}, "cost.table: p.csv was measured on NVIDIA H100 80GB "
     "HBM3, this run's hardware is a100-80g (run it with hardware=h100-80g)"),
    ("table", {"gpu": "NVIDIA T4", "tp": 2}, "cost.table: p.csv was measured on NVIDIA T4, which no "
     "conf/hardware describes"),
    ("table", {"gpu": "", "tp": 2}, None),  # a CPU profile: no hardware to match
    ("draft_table", {"model": "llama-160m", "tp": 1}, None),  # the draft's own model and tp (draft_tp, default 1)
    ("draft_table", {"model": "llama2-7b"}, "cost.draft_table: p.csv was measured for llama2-7b, but this run's "
     "draft is llama-160m (profile it: python -m repro.profile --model llama-160m)"),
    ("draft_table", {"tp": 2}, "cost.draft_table: p.csv was measured at tp=2, this run has tp=1"),
    ("table", "{not json", "cost.table: {path}.json is not JSON"),
], ids=["no sidecar", "empty", "fits", "model", "tp", "gpu", "unknown gpu", "cpu", "draft fits", "draft model",
        "draft tp", "not json"])
def test_a_profile_sidecar_must_describe_the_run(tmp_path: Path, key: str, sidecar: dict[str, object] | str | None,
                                                 message: str | None) -> None:
    import json

    from omegaconf import OmegaConf

    from repro.sim.deployment import check_profile_fits

    cfg = OmegaConf.create({"model": {"name": "llama2-7b"}, "draft": {"name": "llama-160m"},
                            "hardware": {"name": "a100-80g"}, "tp": 2})
    path = tmp_path / "p.csv"
    if sidecar is not None:
        (tmp_path / "p.csv.json").write_text(sidecar if isinstance(sidecar, str) else json.dumps(sidecar))
    if message is None:
        check_profile_fits(cfg, key, path)
        return
    with pytest.raises(ConfigError) as err:
        check_profile_fits(cfg, key, path)
    assert str(err.value) == message.replace("{path}", str(path))


@pytest.mark.parametrize(("key", "run", "measured", "fits"), [
    ("table", {}, 1, True), ("table", {}, 2, False), ("draft_table", {"draft_tp": 2}, 2, True),
    ("draft_table", {"tp": 2}, 2, False),
], ids=["tp 1 by default", "not tp 1", "the draft's own tp", "not the target's"])
def test_a_profiles_tp_is_the_runs_for_its_model(tmp_path: Path, key: str, run: dict[str, int], measured: int,
                                                  fits: bool) -> None:
    import json

    from omegaconf import OmegaConf

    from repro.sim.deployment import check_profile_fits

    cfg = OmegaConf.create({"model": {"name": "llama2-7b"}, "draft": {"name": "llama-160m"},
                            "hardware": {"name": "a100-80g"}, **run})
    path = tmp_path / "p.csv"
    path.with_name("p.csv.json").write_text(json.dumps({"tp": measured}))
    if fits:
        check_profile_fits(cfg, key, path)
        return
    with pytest.raises(ConfigError, match=f"measured at tp={measured}, this run has tp=1$"):
        check_profile_fits(cfg, key, path)


@pytest.mark.parametrize(("key", "table", "want"), [
    ("table", "p.csv", "p.csv"),
    ("table", None, None),
    ("table", {"a100-80g/llama2-7b": "both.csv", "a100-80g": "gpu.csv", "llama2-7b": "model.csv"}, "both.csv"),
    ("table", {"a100-80g": "gpu.csv", "llama2-7b": "model.csv"}, "gpu.csv"),
    ("table", {"h100-80g": "gpu.csv", "llama2-7b": "model.csv"}, "model.csv"),
    ("draft_table", {"llama2-7b": "target.csv", "llama-160m": "draft.csv"}, "draft.csv"),  # the draft's own name
    ("table", {"h100-80g": "gpu.csv"}, "cost.table: no table for hardware a100-80g and model llama2-7b (given: "
     "['h100-80g']; keys are hardware/model, hardware or model names)"),
    ("table", ["p.csv"], "cost.table: a path, or a mapping of hardware or model names to paths"),
], ids=["a path", "none", "hardware/model first", "then hardware", "then model", "the draft's", "no key",
        "not a mapping"])
def test_a_profile_table_per_case(key: str, table: object, want: str | None) -> None:
    from omegaconf import OmegaConf

    from repro.sim.deployment import _case_table

    cfg = OmegaConf.create({"model": {"name": "llama2-7b"}, "draft": {"name": "llama-160m"},
                            "hardware": {"name": "a100-80g"}})
    if want is None or want.endswith(".csv"):
        assert _case_table(cfg, key, table) == want
        return
    with pytest.raises(ConfigError) as err:
        _case_table(cfg, key, table)
    assert str(err.value) == want
