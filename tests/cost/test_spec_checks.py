"""Each check of a hardware, model and engine spec (repro/cost/spec.py, repro/cost/serving.py) at its boundary,
with its whole message: a bad YAML key must fail before anything runs, naming the file's spec and the key."""

from __future__ import annotations

import dataclasses
import re
import types
from pathlib import Path

import pytest

from repro.cost import remembered, spec
from repro.cost.serving import EngineProfile
from repro.cost.spec import HardwareSpec, ModelSpec, load_hardware, load_model


def _hw(**kw: object) -> HardwareSpec:
    return dataclasses.replace(load_hardware("h100-80g"), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("key", "value", "message"), [
    ("mem_bw_gbs", -1.0, "hardware 'h100-80g': mem_bw_gbs must be a non-negative number, got -1.0"),
    ("mem_bw_gbs", "fast", "hardware 'h100-80g': mem_bw_gbs must be a non-negative number, got 'fast'"),
    ("mem_efficiency", 0.0, "hardware 'h100-80g': mem_efficiency must lie in (0, 1]"),
    ("kv_efficiency_large", 1.5, "hardware 'h100-80g': kv_efficiency_large must lie in (0, 1]"),
    ("compute_efficiency", 1.0000001, "hardware 'h100-80g': compute_efficiency must lie in (0, 1]"),
    ("knee_sharpness", 0.99, "hardware 'h100-80g': knee_sharpness must be ≥ 1"),
])
def test_a_hardware_spec_refuses_a_bad_key_naming_it(key: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        _hw(**{key: value})


@pytest.mark.parametrize(("key", "value"), [
    ("mem_efficiency", 1.0), ("kv_efficiency", 1.0), ("knee_sharpness", 1.0), ("mem_bw_gbs", 0.0),
])
def test_a_hardware_spec_takes_each_bound_itself(key: str, value: float) -> None:
    assert getattr(_hw(**{key: value}), key) == value


def test_a_hardware_spec_without_a_large_efficiency_streams_every_matrix_at_the_small_one() -> None:
    assert _hw(mem_efficiency=0.6, mem_efficiency_large=None).mem_efficiency_large == 0.6


@pytest.mark.parametrize(("key", "value", "message"), [
    ("kind", "moe", "model 'llama3-8b': kind must be 'decoder' or 'eagle_head', got 'moe'"),
    ("tokenizer", "gpt2", "model 'llama3-8b': unknown tokenizer family 'gpt2'"),
    ("num_heads", 30, "model 'llama3-8b': num_heads must be a multiple of num_kv_heads"),
    ("qkv_inputs", 2, "model 'llama3-8b': qkv_inputs and own_embedding describe an EAGLE head"),
])
def test_a_model_spec_refuses_a_bad_key_naming_it(key: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        dataclasses.replace(load_model("llama3-8b"), **{key: value})  # type: ignore[arg-type]


def test_a_models_head_dim_defaults_to_an_integer_share_of_the_hidden_size() -> None:
    m = dataclasses.replace(load_model("llama3-8b"), head_dim=None)
    assert m.head_dim == m.hidden_size // m.num_heads and type(m.head_dim) is int


def test_an_eagle_head_is_one_layer_of_its_target_named_after_it() -> None:
    target = load_model("llama3-8b")
    head = target.eagle_head()
    assert (head.name, head.num_layers, head.kind) == ("eagle-llama3-8b", 1, "eagle_head")
    assert head.source == target.source != ""
    assert dataclasses.replace(head, name=target.name, num_layers=target.num_layers, kind="decoder") == target


@pytest.mark.parametrize(("kw", "message"), [
    ({"scorer": "tree"}, "engine 'x': scorer must be 'multi_query' or 'batch_expansion', not 'tree'"),
    ({"draft_kv_layout": "paged"}, "engine 'x': draft_kv_layout must be 'spread' or 'vllm_v0', not 'paged'"),
    ({"kv_accounting": "free"}, "engine 'x': kv_accounting must be 'reserve' or 'profile_run', not 'free'"),
    ({"graph_sizes": (1, 2, 2)}, "engine 'x': graph_sizes must be increasing positive integers, got [1, 2, 2]"),
    ({"graph_sizes": (0, 2)}, "engine 'x': graph_sizes must be increasing positive integers, got [0, 2]"),
    ({"graph_sizes": (True, 2)}, "engine 'x': graph_sizes must be increasing positive integers, got [True, 2]"),
    ({"graph_sizes": (1.5, 2)}, "engine 'x': graph_sizes must be increasing positive integers, got [1.5, 2]"),
    ({"spec_round": 1}, "engine 'x': spec_round must be true or false"),
    ({"frontend_in_s": -1e-3}, "engine 'x': frontend_in_s must be a non-negative number, got -0.001"),
    ({"frontend_in_s": True}, "engine 'x': frontend_in_s must be a non-negative number, got True"),
    ({"frontend_in_s": "1ms"}, "engine 'x': frontend_in_s must be a non-negative number, got '1ms'"),
])
def test_an_engine_profile_refuses_a_bad_key_naming_it(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        EngineProfile(name="x", **kw)  # type: ignore[arg-type]


def test_an_engine_profiles_graph_sizes_and_proposers_become_tuples() -> None:
    e = EngineProfile(name="x", graph_sizes=[1, 2, 4], async_proposers=["ngram"])  # type: ignore[arg-type]
    assert e.graph_sizes == (1, 2, 4) and e.async_proposers == ("ngram",)
    assert EngineProfile(name="x", frontend_in_s=0).frontend_in_s == 0


def test_a_spec_file_is_parsed_once_while_unchanged_and_again_once_it_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hardware").mkdir()
    path = tmp_path / "hardware" / "x.yaml"
    path.write_text("a: 1\n")
    monkeypatch.setattr(spec, "CONF_DIR", tmp_path)
    monkeypatch.setattr(spec, "_LOADED", {})
    parsed: list[object] = []
    real = spec.yaml.safe_load
    monkeypatch.setattr(spec.yaml, "safe_load", lambda fh: parsed.append(1) or real(fh))
    first = spec._load("hardware", "x")
    first["a"] = 99  # a fresh dict each time: the caller's edits stay its own
    assert spec._load("hardware", "x") == {"a": 1} and len(parsed) == 1
    path.write_text("a: 22\n")  # (a different size: a new stamp even within the clock's resolution)
    assert spec._load("hardware", "x") == {"a": 22} and len(parsed) == 2


def test_a_cost_model_with_an_unhashable_part_shares_nothing() -> None:
    parts = dict(target_profile=None, draft_profile=None, hardware="h", model="m", tp=1, draft=None,
                 draft_hardware=None, draft_tp=1, gpu_memory_utilization=0.9, activation_reserve_gb=0.0, engine="e")
    assert remembered.fingerprint(types.SimpleNamespace(**parts)) == tuple(
        parts[k] for k in ("hardware", "model", "tp", "draft", "draft_hardware", "draft_tp",
                           "gpu_memory_utilization", "activation_reserve_gb", "engine"))
    assert remembered.fingerprint(types.SimpleNamespace(**{**parts, "engine": {"unhashable": 1}})) is None


def test_a_spec_from_hydras_config_node_resolves_its_interpolations_and_refuses_a_list() -> None:
    from omegaconf import OmegaConf

    plain = dataclasses.asdict(load_hardware("h100-80g"))
    node = OmegaConf.create({**plain, "mem_bw_gbs": "${peak_tflops}"})
    hw = HardwareSpec.from_cfg(node)
    assert hw.mem_bw_gbs == plain["peak_tflops"] and type(hw.mem_bw_gbs) is not str
    assert hw == dataclasses.replace(load_hardware("h100-80g"), mem_bw_gbs=plain["peak_tflops"])
    assert ModelSpec.from_cfg(OmegaConf.create(dataclasses.asdict(load_model("llama3-8b")))) == load_model("llama3-8b")
    with pytest.raises(TypeError, match=r"^expected a mapping config, got ListConfig$"):
        HardwareSpec.from_cfg(OmegaConf.create([1, 2]))
