"""Compose-time checks (repro.experiments.validate): wrong types, out-of-range values and impossible deployments are
refused with one message naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from repro.core.errors import ConfigError
from repro.cost.spec import load_model
from repro.experiments.expspec import ExpSpec
from repro.experiments.simulate import compose
from repro.experiments.validate import (
    KNOBS,
    Knob,
    check_keys,
    check_point,
    check_tp,
    check_value,
    check_values,
    infer_knob,
)


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        ("rps", 3, True),  # an int where a float is expected is fine
        ("rps", "abc", False),
        ("rps", -1.0, False),
        ("rps", 0.0, False),
        ("rps", float("inf"), True),  # everything at t = 0 (offline runs)
        ("num_requests", 2.5, False),
        ("num_requests", True, False),  # a bool is not a count
        ("n_jobs", None, True),
        ("n_jobs", 0, False),
        ("quick", "maybe", False),
        ("quick", True, True),
        ("seed", 0, True),
        ("seed", -1, False),
        ("engine.gpu_memory_utilization", 1.0, True),
        ("engine.gpu_memory_utilization", 1.2, False),
        ("max_sim_time_s", None, True),
    ],
)
def test_knob_table(key: str, value: Any, ok: bool) -> None:
    if ok:
        check_value(key, value, KNOBS[key])
    else:
        with pytest.raises(ConfigError, match=key):
            check_value(key, value, KNOBS[key])


@pytest.mark.parametrize(
    ("key", "values", "knob"),
    [
        ("batch_size", [1, 4, 64], Knob("int", 0)),  # positive integers stay positive integers
        ("slo_x_baseline", [0.6, 1.2], Knob("float", 0)),
        ("accept", [0.5, 0.9], Knob("float", 0, high=1.0)),  # a probability, whatever the grid says
        ("proposer", ["eagle", "pld"], None),  # names are checked where they are used
        ("offset", [-1, 1], Knob("int")),
    ],
)
def test_experiment_keys_take_the_type_of_their_values(key: str, values: list[Any], knob: Knob | None) -> None:
    assert infer_knob(key, values) == knob


def test_the_typed_key_is_named_not_the_one_interpolating_it() -> None:
    cfg = compose(["+exp=turbospec_fig5", "batch_size=abc"])  # num_requests: ${batch_size}
    with pytest.raises(ConfigError, match=r"^batch_size=abc"):
        check_values(cfg, ExpSpec.parse({"grid": {"batch_size": [1, 4]}}), first=["batch_size"])


@pytest.mark.parametrize(
    ("model", "tp", "ok"),
    [
        ("llama2-7b", 1, True),
        ("llama2-7b", 3, False),  # 32 heads do not split over 3 GPUs
        ("llama2-70b", 8, True),  # 64 heads, 8 KV heads
        ("llama2-70b", 16, True),  # 8 KV heads replicated twice (vLLM)
        ("llama2-70b", 6, False),
        ("llama3-8b", 4, True),
    ],
)
def test_tensor_parallelism_must_split_the_heads(model: str, tp: int, ok: bool) -> None:
    spec = load_model(model)
    if ok:
        check_tp(spec, tp, "tp")
    else:
        with pytest.raises(ConfigError, match=f"tp={tp}"):
            check_tp(spec, tp, "tp")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=llama2-70b", "tp=1"], "leaves no KV memory"),  # 128 GiB of weights on one 80 GB GPU
        (["hardware.memory_gb=1"], "memory_gb=1"),
        (["model=llama2-7b", "tp=3"], "tp=3"),
        (["system=static_sd", "system.k=-1"], "system.k=-1"),
        (["system=incr_dec", "system.max_num_seqs=0"], "system.max_num_seqs=0"),
        (["system=adaserve", "system.budget=0"], "system.budget=0"),
        (["hardware.bogus=1"], "hardware config"),  # HardwareSpec(**cfg) names the key
        (["workload.arrival.kind=weird"], "workload config"),
        (["engine.max_model_len=8192"], r"engine.max_model_len=8192: expected an integer in 2..4096"),  # llama2-7b
        # the deployment's replicas, each checked (SepPipe: one replica per tp_per_replica entry)
        (["system=seppipe", "model=llama2-70b", "system.tp_per_replica=[4,3,1]"], r"tp_per_replica\[1\]=3"),
        (["system=seppipe", "model=llama2-70b", "system.tp_per_replica=[4,4,1]"], "leaves no KV memory on 1 x"),
        (["system=static_sd_k3", "engine.draft_servers=[{hardware:l4,rtt:2}]"], r"draft_servers\[0\]: unknown"),
        # what a system declares it needs (repro.sim.policy.Policy): remote draft servers, an engine verifying trees
        (["system=goodspeed"], "GoodSpeed drafts on remote draft servers"),
        (["system=fixed_s"], "FixedS drafts on remote draft servers"),
        (["system=adaserve", "engine=vllm_v0"], "AdaServe verifies token trees that branch and engine vllm_v0"),
        (["system=global_greedy", "engine=vllm_v0"], "GlobalGreedy verifies token trees"),
        (["system=specinfer", "engine=vllm_v0"], "scorer batch_expansion: only a multi_query scorer"),
    ],
)
def test_impossible_points_are_refused(overrides: list[str], message: str) -> None:
    cfg = compose(overrides) if not any(o.startswith("hardware.bogus") for o in overrides) else compose(
        ["+hardware.bogus=1"])
    with pytest.raises(ConfigError, match=message):
        check_point(cfg)


def test_a_possible_point_passes() -> None:
    check_point(compose(["model=llama2-70b", "tp=4", "system=adaserve"]))
    # a draft on a remote server takes no memory on the target's GPUs (its tp is then not checked against draft_tp)
    check_point(compose(["system=static_sd_k3", "draft_tp=3", "engine.draft_servers=[{hardware:l4}]"]))
    check_point(compose(["system=goodspeed", "engine.draft_servers=[{hardware:l4}]"]))
    # chains verify on any engine: AdaServe with beams of width 1, SpecInfer expanding one child, TETRIS
    check_point(compose(["system=adaserve", "engine=vllm_v0", "system.w_max=1"]))
    check_point(compose(["system=specinfer", "engine=vllm_v0", "system.expansion=[1,1,1]"]))
    check_point(compose(["system=tetris"]))
    check_point(compose(["system=adaserve", "engine=vllm_v1"]))


def test_a_point_whose_deployment_passed_before_has_its_workload_checked() -> None:
    """``check_point`` with what earlier points passed (a sweep's, ``repro check``'s shared pool): a point whose
    system, models, hardware and engine passed is checked on its workload alone, which is still refused when
    impossible; a point differing elsewhere is checked whole."""
    from repro.experiments.compose import to_dict

    passed: set[str] = set()

    def check(overrides: list[str]) -> None:
        cfg = compose(overrides)
        check_point(cfg, resolved=to_dict(cfg), passed=passed)

    check(["system=adaserve", "rps=2"])
    assert len(passed) == 2
    check(["system=adaserve", "rps=3"])  # (another workload, parsed)
    assert len(passed) == 3
    with pytest.raises(ConfigError, match="workload config"):
        check(["system=adaserve", "workload.arrival.kind=weird"])
    with pytest.raises(ConfigError, match=r"system\.budget=0"):
        check(["system=adaserve", "system.budget=0", "rps=2"])
    with pytest.raises(ConfigError, match="leaves no KV memory"):
        check(["system=adaserve", "model=llama2-70b", "tp=1", "rps=2"])
    assert len(passed) == 3


def test_added_keys_must_exist() -> None:
    check_keys(["num_requests"], {"num_requests", "rps"})
    with pytest.raises(ConfigError, match="did you mean 'num_requests'"):
        check_keys(["num_request"], {"num_requests", "rps"})
