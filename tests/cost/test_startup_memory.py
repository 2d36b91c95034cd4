"""vLLM's start-up KV accounting (V1 and v0), CUDA-graph padding and async scheduling (conf/engine/vllm_v*.yaml)."""

from __future__ import annotations

import dataclasses

import pytest

from repro.cost.model import CostModel, GiB
from repro.cost.serving import EngineProfile, load_engine
from repro.cost.spec import load_hardware, load_model


def test_vllm_v1_kv_capacity_by_hand() -> None:
    """Qwen3-32B with a Qwen3-1.7B draft on one H100 94 GB at vLLM's default utilization 0.9, worked by hand.

    - total 93.58 GiB = 100,480,759,889.92 B; requested = 0.9 x total = 90,432,683,900.928 B
    - Qwen3-32B weights: 64 layers x (5120·8192 + 2·5120·1024 + 8192·5120 + 3·5120·25600 = 487,587,840) +
      2 x 151,936·5120 (untied embedding and LM head) = 32,761,446,400 params x 2 B = 65,522,892,800 B
    - Qwen3-1.7B weights: 28 x (2048·2048 + 2·2048·1024 + 2048·2048 + 3·2048·6144 = 50,331,648) + 151,936·2048
      (tied) = 1,720,451,072 params x 2 B = 3,440,902,144 B
    - profiling pass, 8192 tokens: 8192 x (2·5120 + 3·25600) x 2 B = 1,426,063,360 B (the sampler's 8192·5120·2 +
      3·256·151,936·4 = 550,633,472 B is smaller)
    - CUDA graphs 0.7 GiB = 751,619,276.8 B; non-torch 0.2 GiB = 214,748,364.8 B
    - available = 19,076,457,955.3 B; a block holds 16 tokens x (64 + 28 layers) x 8 KV heads x 128 x 2 (K, V) x 2 B
      = 16 x (262,144 + 114,688) = 6,029,312 B -> 3,163 blocks = 50,608 tokens
    """
    cost = CostModel(load_hardware("h100-94g"), load_model("qwen3-32b"), draft=load_model("qwen3-1.7b"),
                     engine=load_engine("vllm_v1"))
    parts = cost.non_kv_bytes(draft_resident=True)
    assert parts["weights"] == 65_522_892_800 + 3_440_902_144
    assert parts["activations"] == 1_426_063_360
    assert parts["cuda_graphs"] == pytest.approx(751_619_276.8)
    assert parts["non_torch"] == pytest.approx(214_748_364.8)
    assert cost.kv_capacity_blocks(draft_resident=True) == 3163
    # without the draft: (90,432,683,900.9 - 65,522,892,800 - 2,392,431,001.6) / (16 x 262,144) = 5,368.0 blocks
    assert cost.kv_capacity_blocks(draft_resident=False) == 5368


def test_vllm_v0_profile_run_by_hand() -> None:
    """vLLM v0's own start-up account (conf/engine/vllm_v0.yaml: the profile run, without CUDA graphs: v0 captures them
    after allocating the KV cache): Llama-2-7B on an A100-80GB, worked by hand.

    - requested = 0.9 x 80 GiB = 77,309,411,328 B
    - weights: 32 x (4 x 4096² + 3 x 4096 x 11008 = 202,375,168) + 2 x 32,000 x 4096 = 6,738,149,376 params x 2 B
      = 13,476,298,752 B
    - profiling pass over max_num_batched_tokens = 4096 tokens: 4096 x (2 x 4096 + 3 x 11008) x 2 B = 337,641,472 B
      (the sampler's 4096 x 4096 x 2 + 3 x 256 x 32,000 x 4 = 131,858,432 B is smaller); non-torch 0.2 GiB
    - available = 63,280,722,739.2 B over 16 x 524,288 B per block = 7,543 blocks
    """
    hw, model = load_hardware("a100-80g"), load_model("llama2-7b")
    v0 = load_engine("vllm_v0")
    assert (v0.kv_accounting, v0.profile_tokens, v0.profile_seqs) == ("profile_run", 4096, 256)
    cost = CostModel(hw, model, engine=v0)
    parts = cost.non_kv_bytes(False)
    assert parts["weights"] == 13_476_298_752 and parts["activations"] == 337_641_472
    assert parts["cuda_graphs"] == 0.0 and parts["non_torch"] == pytest.approx(214_748_364.8)
    assert cost.kv_capacity_blocks(draft_resident=False) == 7543


@pytest.mark.parametrize("engine", ["vllm_v0", "vllm_v0_eager", "turbospec_mq", "vllm_v1"])
def test_every_vllm_profile_sizes_its_kv_by_a_profile_run(engine: str) -> None:
    """Every vLLM-based profile follows vLLM's start-up account; only V1 charges CUDA graphs out of it."""
    e = load_engine(engine)
    assert e.kv_accounting == "profile_run" and e.non_torch_gib > 0
    assert (e.cuda_graph_gib > 0) == (engine == "vllm_v1")


@pytest.mark.parametrize("engine", ["flexflow", "pytorch_mq"])
def test_reserve_accounting_keeps_the_flat_reserve(engine: str) -> None:
    """FlexFlow Serve and the papers' own PyTorch engines keep total x utilization - weights - 2 GiB per GPU."""
    hw, model = load_hardware("a100-80g"), load_model("llama2-7b")
    cost = CostModel(hw, model, engine=load_engine(engine))
    free = 80 * GiB * 0.9 - model.weight_bytes - 2 * GiB
    assert cost.kv_capacity_blocks(draft_resident=False) == int(free // (16 * model.kv_bytes_per_token))
    assert cost.non_kv_bytes(False)["cuda_graphs"] == 0.0


def test_a_run_profiles_with_its_schedulers_budgets() -> None:
    """vLLM profiles with the scheduler's max_num_batched_tokens and max_num_seqs: a run takes its system's."""
    from repro.experiments.simulate import compose, instantiate_system
    from repro.sim.deployment import Deployment

    cfg = compose(["system=vllm_v1", "system.max_num_batched_tokens=2048", "system.max_num_seqs=64"])
    cost = Deployment.from_cfg(cfg, instantiate_system(cfg.system)).cost_model()
    assert (cost.engine.profile_tokens, cost.engine.profile_seqs) == (2048, 64)
    flex = compose(["system=adaserve"])
    assert Deployment.from_cfg(flex, instantiate_system(flex.system)).cost_model().engine.kv_accounting == "reserve"


def test_eagle_head_takes_memory_under_vllm_v1() -> None:
    """vLLM loads an EAGLE head configured as the draft and gives its layer KV in the same pool."""
    hw, target = load_hardware("h100-80g"), load_model("llama3-8b")
    head = load_model("eagle-llama3-8b")
    v1 = CostModel(hw, target, draft=head, engine=load_engine("vllm_v1"))
    plain = CostModel(hw, target, engine=load_engine("vllm_v1"))
    assert v1.kv_capacity_blocks(draft_resident=False) < plain.kv_capacity_blocks(draft_resident=False)
    flat = CostModel(hw, target, draft=head, engine=load_engine("pytorch_mq"))
    assert flat.resident_draft(False) is None  # the flat reserve model counts a draft only when a system keeps one


def test_graph_padding() -> None:
    """A CUDA-graph pass runs at the next capture size: 5 tokens cost what 8 do; an eager pass is not padded."""
    hw, model = load_hardware("h100-80g"), load_model("llama3-8b")
    sizes = EngineProfile(graph_sizes=(1, 2, 4, 8, 16))
    cost = CostModel(hw, model, engine=sizes)
    plain = CostModel(hw, model, engine=EngineProfile())
    graphed = cost.forward_s(5, 5, 500.0, lm_head_tokens=5, decode_only=True)
    as_eight = plain.forward_s(8, 5, 500.0, lm_head_tokens=5, decode_only=True)
    assert graphed == as_eight
    assert cost.forward_s(5, 5, 500.0, lm_head_tokens=5) == plain.forward_s(5, 5, 500.0, lm_head_tokens=5)
    assert cost.forward_s(17, 5, 500.0, decode_only=True) == plain.forward_s(17, 5, 500.0, decode_only=True)
    with pytest.raises(ValueError, match="graph_sizes"):
        EngineProfile(graph_sizes=(4, 2))


def test_async_scheduling_hides_host_work() -> None:
    """Under async scheduling the speculation host terms vanish from a verify step; the passes stay."""
    from repro.cost.step import decode_pass_s

    hw, model = load_hardware("h100-80g"), load_model("llama3-8b")
    sync = load_engine("vllm_v1")
    on = dataclasses.replace(sync, async_scheduling=True)
    c_sync, c_async = CostModel(hw, model, engine=sync), CostModel(hw, model, engine=on)
    host = sync.spec_seq_s * 8 + sync.spec_token_s * 8 * 3
    assert decode_pass_s(c_sync, 8, 500.0, 3) - decode_pass_s(c_async, 8, 500.0, 3) == pytest.approx(host)
    assert c_async.spec_round_s() == 0.0 and c_sync.spec_round_s() == hw.spec_round_overhead_s
