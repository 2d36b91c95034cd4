"""vLLM's start-up KV accounting (V1 and v0), CUDA-graph padding and async scheduling (conf/engine/vllm_v*.yaml)."""

from __future__ import annotations

import dataclasses

import pytest

from repro.cost.model import CostModel, GiB
from repro.cost.serving import EngineProfile, load_engine
from repro.cost.spec import load_hardware, load_model


def test_vllm_v1_kv_capacity_by_hand() -> None:
    """Qwen3-32B with a Qwen3-1.7B draft on one H100 94 GB, as vllm serve starts it (utilization 0.9, max_num_seqs
    1024, max_num_batched_tokens 8192, a speculative method), worked by hand (vllm/v1/worker/gpu_worker.py
    determine_available_memory):

    - total (cudaMemGetInfo) 93.115 GiB = 99,981,469,941.76 B; requested = ceil(0.9 x total) = 89,983,322,948 B
    - weights: Qwen3-32B 64 x (5120·10240 + 8192·5120 + 2·5120·25600 + 25600·5120 = 487,587,840) + 2 x 151,936·5120
      = 32,761,446,400 params x 2 B = 65,522,892,800 B; Qwen3-1.7B 28 x 50,331,648 + 151,936·2048 (tied) =
      1,720,451,072 params x 2 B = 3,440,902,144 B
    - profile_run's peak: the sampler phase, the dummy pass's kept hidden states 8192 x 5120 x 2 B = 83,886,080 B
      plus 1024 rows x 151,936 x (38 B of the full-vocabulary sort + 12 B of the rejection sampler) = 7,779,123,200 B:
      7,863,009,280 B (the forward pass's 8192 x (2·5120 + 3·25600) x 2 B = 1,426,063,360 B is smaller)
    - CUDA graphs: not charged (captured after the KV cache is sized); non-torch 0.2 GiB = 214,748,364.8 B
    - available = 12,941,770,359.2 B; a block holds 16 tokens x (64 + 28 layers) x 8 KV heads x 128 x 2 (K, V) x 2 B
      = 16 x (262,144 + 114,688) = 6,029,312 B -> 2,146 blocks = 34,336 tokens
    """
    engine = dataclasses.replace(load_engine("vllm_v1"), profile_speculative=True)
    assert (engine.profile_tokens, engine.profile_seqs, engine.cuda_graph_gib) == (8192, 1024, 0.0)
    cost = CostModel(load_hardware("h100-94g"), load_model("qwen3-32b"), draft=load_model("qwen3-1.7b"),
                     engine=engine)
    parts = cost.non_kv_bytes(draft_resident=True)
    assert parts["weights"] == 65_522_892_800 + 3_440_902_144
    assert parts["activations"] == 7_863_009_280
    assert parts["cuda_graphs"] == 0.0
    assert parts["non_torch"] == pytest.approx(214_748_364.8)
    assert cost.kv_capacity_blocks(draft_resident=True) == 2146
    # no speculation (no draft, no rejection sampler): peak 83,886,080 + 1024 x 151,936 x 38 = 5,996,019,712 B;
    # (89,983,322,948 - 65,522,892,800 - 5,996,019,712 - 214,748,364.8) / (16 x 262,144) = 4,351.06 blocks
    plain = CostModel(load_hardware("h100-94g"), load_model("qwen3-32b"), engine=load_engine("vllm_v1"))
    assert plain.non_kv_bytes(False)["activations"] == 5_996_019_712
    assert plain.kv_capacity_blocks(draft_resident=False) == 4351


def test_vllm_v0_profile_run_by_hand() -> None:
    """vLLM v0's own start-up account (conf/engine/vllm_v0.yaml: the profile run, without CUDA graphs: v0 captures them
    after allocating the KV cache): Llama-2-7B on an A100-80GB, worked by hand.

    - requested = ceil(0.9 x 80 GiB) = 77,309,411,328 B
    - weights: 32 x (4 x 4096² + 3 x 4096 x 11008 = 202,375,168) + 2 x 32,000 x 4096 = 6,738,149,376 params x 2 B
      = 13,476,298,752 B
    - profile run: the sampler's phase, 4096 x 4096 x 2 B of hidden states + 256 x 32,000 x 38 B (the full sort) =
      344,850,432 B, just above the pass over max_num_batched_tokens = 4096 tokens (4096 x (2 x 4096 + 3 x 11008)
      x 2 B = 337,641,472 B); non-torch 0.2 GiB
    - available = 63,273,513,779.2 B over 16 x 524,288 B per block = 7,542 blocks
    """
    hw, model = load_hardware("a100-80g"), load_model("llama2-7b")
    v0 = load_engine("vllm_v0")
    assert (v0.kv_accounting, v0.profile_tokens, v0.profile_seqs, v0.sampler_bytes) == ("profile_run", 4096, 256, 38)
    cost = CostModel(hw, model, engine=v0)
    parts = cost.non_kv_bytes(False)
    assert parts["weights"] == 13_476_298_752 and parts["activations"] == 344_850_432
    assert parts["cuda_graphs"] == 0.0 and parts["non_torch"] == pytest.approx(214_748_364.8)
    assert cost.kv_capacity_blocks(draft_resident=False) == 7542


def test_vllm_v0_draft_split_by_hand() -> None:
    """The vLLM blog's set-up on vllm_v0: Llama-3-70B at TP 4 with Qwama-0.5B (TP 1, on the driver GPU) on H100 80GB.

    - requested per GPU = ceil(0.9 x 79.18 GiB) = ceil(0.9 x 85,018,877,624.32) = 76,516,989,862 B
    - the driver GPU's weights: 141,104,775,168 / 4 + 945,487,872 = 36,221,681,664 B
    - profile peak: 4096 x 8192 x 2 B + 256 x 128,256 x 38 B = 1,314,783,232 B (Llama-3's 128K vocabulary: the
      sampler, not the pass); non-torch 0.2 GiB
    - free on the driver = 38,765,776,601.2 B; draft and target get equal block counts: a block holds 16 x (327,680 / 4
      + 12,288) = 1,507,328 B -> 25,718 blocks
    """
    cost = CostModel(load_hardware("h100-80g"), load_model("llama3-70b"), tp=4, draft=load_model("qwama-0.5b"),
                     engine=load_engine("vllm_v0"))
    assert cost.non_kv_bytes(True)["activations"] == 1_314_783_232
    assert cost.kv_capacity_blocks(draft_resident=True) == 25718


@pytest.mark.parametrize(("engine", "hardware", "target", "draft", "blocks"), [
    # Nightjar's 7B deployment (vLLM 0.8.2 V0, --enforce-eager) on an RTX 4090: requested ceil(0.9 x 24 GiB) =
    # 23,192,823,399 B; weights 15,230,566,400 + 987,922,432 B; peak 4096 x 3584 x 2 + 256 x 152,064 x 38 =
    # 1,508,638,720 B (the pass: 524,288,000 B); non-torch 214,748,364.8 B; 5,250,947,482.2 B over
    # 16 x (57,344 + 12,288) B = 4,713.1 blocks
    ("vllm_v0_eager", "rtx4090", "qwen2.5-7b", "qwen2.5-0.5b", 4713),
    # TurboSpec's multi-query fork with Llama-160M on an H100 80GB: requested 76,516,989,862 B; weights
    # 13,476,298,752 + 324,796,416 B; peak 344,850,432 B (as vllm_v0's Llama-2-7B); non-torch 214,748,364.8 B:
    # 62,156,295,897.2 B over 16 x (524,288 + 36,864) B = 6,922.9 blocks
    ("turbospec_mq", "h100-80g", "llama2-7b", "llama-160m", 6922),
])
def test_v0_forks_by_hand(engine: str, hardware: str, target: str, draft: str, blocks: int) -> None:
    """vLLM v0's account on the two v0-based profiles, one configuration each (the arithmetic in the table)."""
    cost = CostModel(load_hardware(hardware), load_model(target), draft=load_model(draft), engine=load_engine(engine))
    assert cost.kv_capacity_blocks(draft_resident=True) == blocks


@pytest.mark.parametrize(("gpu", "memory_gib", "budgets"), [
    ("h100-94g", 93.115, (1024, 8192)),  # >= 70 GiB, not an A100
    ("h100-80g", 79.18, (1024, 8192)),
    ("a100-80g", 80.0, (256, 2048)),  # the A100 is excluded by name (vLLM PR #17885)
    ("l40s", 48.0, (256, 2048)),  # under 70 GiB
])
def test_vllm_serve_defaults(gpu: str, memory_gib: float, budgets: tuple[int, int]) -> None:
    """vllm serve's max_num_seqs and max_num_batched_tokens by GPU (vllm/engine/arg_utils.py get_batch_defaults),
    and the V1 system takes them from the run's hardware."""
    from repro.cost.serving import vllm_serve_budgets
    from repro.experiments.simulate import compose, instantiate_system

    assert vllm_serve_budgets(gpu, memory_gib) == budgets
    policy = instantiate_system(compose(["system=vllm_v1", f"hardware={gpu}"]).system)
    assert (policy.max_num_seqs, policy.max_num_batched_tokens) == budgets


def test_rejection_sampler_only_where_the_run_speculates() -> None:
    """V1's profile adds the rejection sampler's 3 U only for a system that speculates (Policy.speculates)."""
    from repro.experiments.simulate import compose, instantiate_system
    from repro.sim.deployment import Deployment

    def engine(*over: str) -> EngineProfile:
        cfg = compose(["system=vllm_v1", "hardware=h100-94g", "model=qwen3-32b", *over])
        return Deployment.from_cfg(cfg, instantiate_system(cfg.system)).cost_model().engine

    assert not engine().profile_speculative
    assert engine("system.k=3", "model@draft=qwen3-1.7b").profile_speculative
    v1 = load_engine("vllm_v1")
    off, on = (CostModel(load_hardware("h100-94g"), load_model("qwen3-32b"),
                         engine=dataclasses.replace(v1, profile_speculative=s)) for s in (False, True))
    assert on.profile_peak_bytes() - off.profile_peak_bytes() == 1024 * 151_936 * 12


def test_eagle3_head_loads_as_vllm_reports() -> None:
    """RedHatAI's Qwen3-32B EAGLE-3 head as vLLM loads it: its own embedding, a QKV over 2 x hidden, a 32,000-token LM
    head: 1.560 B parameters (2.91 GiB)."""
    head = load_model("eagle3-qwen3-32b")
    assert head.weight_params == 1_560_412_160
    assert head.layer_matrices[0] == 2 * 5120 * (8192 + 2 * 1024)
    with pytest.raises(ValueError, match="EAGLE head"):
        dataclasses.replace(load_model("qwen3-32b"), own_embedding=True)


@pytest.mark.parametrize("engine", ["vllm_v0", "vllm_v0_eager", "turbospec_mq", "vllm_v1"])
def test_every_vllm_profile_sizes_its_kv_by_a_profile_run(engine: str) -> None:
    """Every vLLM-based profile follows vLLM's start-up account, sorting the vocabulary in its sampler's dummy run;
    none charges CUDA graphs to it (they are captured after the KV cache is sized); only V1 profiles the rejection
    sampler."""
    e = load_engine(engine)
    assert e.kv_accounting == "profile_run" and e.non_torch_gib > 0 and e.sampler_bytes == 38.0
    assert e.cuda_graph_gib == 0.0
    assert (e.rejection_sampler_bytes > 0) == (engine == "vllm_v1")


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


@pytest.mark.parametrize(("hardware", "budgets"), [("rtx4090", (256, 2048)), ("h100-80g", (1024, 8192))])
def test_a_system_without_budgets_profiles_at_vllm_serves_defaults(hardware: str, budgets: tuple[int, int]) -> None:
    """On vLLM V1 (profile_serve_defaults) a system with no scheduler budgets of its own (LAPS-SD's, in the league)
    is profiled at vllm serve's defaults on the run's GPU, so a 7B with a 152K vocabulary still fits a 24 GB card."""
    from repro.experiments.simulate import compose, instantiate_system
    from repro.sim.deployment import Deployment

    cfg = compose(["system=laps_sd", "engine=vllm_v1", f"hardware={hardware}", "model=qwen2.5-7b",
                   "model@draft=qwen2.5-0.5b"])
    policy = instantiate_system(cfg.system)
    assert getattr(policy, "max_num_seqs", None) is None
    cost = Deployment.from_cfg(cfg, policy).cost_model()
    assert (cost.engine.profile_seqs, cost.engine.profile_tokens) == budgets
    assert cost.kv_capacity_blocks(draft_resident=True) > 0


def test_vllm_serve_defaults_at_the_boundary() -> None:
    from repro.cost.serving import vllm_serve_budgets

    assert vllm_serve_budgets("h200", 70.0) == (1024, 8192)  # at least 70 GiB
    assert vllm_serve_budgets("h200", 69.99) == (256, 2048)
    assert vllm_serve_budgets("NVIDIA A100-SXM4-80GB", 79.2) == (256, 2048)  # an A100 by its PyTorch name too
