"""Structure and invariants of the analytic cost model, the specs, the profile model and the CLI."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.cost.model import CostModel, ForwardShape
from repro.cost.profile import ProfileCostModel
from repro.cost.spec import (
    CONF_DIR,
    HardwareSpec,
    ModelSpec,
    UnknownSpecError,
    available_hardware,
    available_models,
    load_hardware,
    load_model,
)

GPUS = ("a100-80g", "a100-40g", "h100-80g", "l40s", "l4", "l20", "rtx4090", "a40")
REPO = Path(__file__).resolve().parents[2]
MiB = 2**20


def cm(hw: str = "a100-80g", model: str = "llama2-7b", **kw: object) -> CostModel:
    draft = kw.pop("draft", None)
    return CostModel(
        load_hardware(hw), load_model(model), draft=load_model(str(draft)) if draft else None, **kw
    )  # type: ignore[arg-type]


def test_every_listed_gpu_and_model_loads() -> None:
    assert set(GPUS) <= set(available_hardware())
    for name in available_hardware():
        assert load_hardware(name).name == name
    for name in available_models():
        assert load_model(name).name == name


def test_efficiency_parameters_live_in_hardware_only() -> None:
    """Same parameters for every model on a GPU: model YAMLs hold architecture only."""
    hw_fields = {f.name for f in dataclasses.fields(HardwareSpec)}
    model_fields = {f.name for f in dataclasses.fields(ModelSpec)}
    assert not ({"mem_efficiency", "compute_efficiency", "knee_sharpness", "kv_efficiency"} & model_fields)
    assert not (hw_fields - {"name"}) & model_fields


def test_unknown_key_and_unknown_name_fail() -> None:
    cfg = dataclasses.asdict(load_hardware("a100-80g"))
    assert HardwareSpec.from_cfg(cfg) == load_hardware("a100-80g")
    with pytest.raises(TypeError):
        HardwareSpec.from_cfg({**cfg, "bogus": 1})
    with pytest.raises(UnknownSpecError, match=r"available: .*a100-80g"):
        load_hardware("a100-81g")
    with pytest.raises(KeyError):
        load_model("nope")


def test_from_dictconfig() -> None:
    from omegaconf import OmegaConf

    node = OmegaConf.create(dataclasses.asdict(load_model("llama3-8b")))
    assert ModelSpec.from_cfg(node) == load_model("llama3-8b")


@pytest.mark.parametrize(
    ("model", "mib_per_token"),
    [
        ("llama2-7b", 0.5),  # 2·32·32·128·2 bytes
        ("vicuna-13b", 800 / 1024),  # Nightjar Table 1: 800 MiB per 1K tokens
        ("qwen2.5-7b", 56 / 1024),  # Nightjar Table 1: 56 MiB per 1K tokens
        ("llama3-8b", 0.125),  # GQA: 8 KV heads
        ("llama2-70b", 0.3125),  # 2·80·8·128·2
    ],
)
def test_kv_bytes(model: str, mib_per_token: float) -> None:
    assert load_model(model).kv_bytes_per_token / MiB == pytest.approx(mib_per_token)


def test_parameter_counts() -> None:
    assert load_model("llama2-7b").weight_params == pytest.approx(6.74e9, rel=0.01)
    assert load_model("llama3-8b").weight_params == pytest.approx(8.03e9, rel=0.01)
    assert load_model("qwen2.5-0.5b").weight_params == pytest.approx(0.494e9, rel=0.02)
    # Qwama-0.5B: Qwen2-0.5B with Llama-3's 128,256-token vocabulary (tied) instead of 151,936: 23,680 x 896 fewer
    assert load_model("qwama-0.5b").weight_params == pytest.approx(0.494e9 - 23_680 * 896, rel=0.02)
    eagle = load_model("eagle-llama3-8b")
    assert (
        eagle.weight_params == eagle.layer_linear_params + 2 * 4096 * 4096
    )  # LM head shared with the target


@pytest.mark.parametrize("hw", ["a100-80g", "h100-80g"])
def test_knee_flat_then_linear(hw: str) -> None:
    m = cm(hw)
    lin = [m.forward(ForwardShape(n, 1)).linear_s for n in (1, 16, 32, 64, 1024, 2048, 4096)]
    assert lin[3] / lin[0] < 1.15  # flat (memory-bound) up to 64 tokens
    slope1, slope2 = lin[5] - lin[4], lin[6] - lin[5]
    assert slope2 / 2 == pytest.approx(slope1, rel=0.05)  # linear (compute-bound) far past the knee


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 4096),
    dn=st.integers(0, 512),
    s=st.integers(1, 64),
    kv=st.floats(0, 1e6),
    dkv=st.floats(0, 1e5),
    which=st.sampled_from(["target", "draft", "eagle"]),
)
def test_monotone(n: int, dn: int, s: int, kv: float, dkv: float, which: str) -> None:
    m = cm("h100-80g", "llama3-8b", draft="llama3.2-1b")
    base = m.forward_s(n, s, kv, which=which)  # type: ignore[arg-type]
    assert m.forward_s(n + dn, s, kv, which=which) >= base  # type: ignore[arg-type]
    assert m.forward_s(n, s, kv + dkv, which=which) >= base  # type: ignore[arg-type]


@pytest.mark.parametrize("which", ["target", "draft", "eagle"])
@pytest.mark.parametrize(
    "shape",
    [
        ForwardShape(1, 1),
        ForwardShape(40, 8, 4000.0, decode_only=True),
        ForwardShape(512, 2, 0.0, 66000.0, 2),
    ],
)
def test_forward_s_equals_forward_total(which: str, shape: ForwardShape) -> None:
    m = cm("a100-80g", "llama2-70b", tp=4, draft="llama-160m")
    fields = dataclasses.astuple(shape)[:7]  # forward_s's parameters (the prefill share is for measured profiles)
    assert m.forward_s(*fields, which=which) == m.forward(shape, which).total_s  # type: ignore[arg-type]


def test_tp_reduces_70b_step() -> None:
    t = {
        tp: cm("a100-80g", "llama2-70b", tp=tp).forward_s(32, 32, 32 * 512, decode_only=True)
        for tp in (2, 4, 8)
    }
    assert t[8] < t[4] < t[2]
    assert cm("a100-80g", "llama2-70b", tp=4).forward(ForwardShape(32, 32)).allreduce_s > 0
    assert cm("a100-80g", "llama2-7b").forward(ForwardShape(32, 32)).allreduce_s == 0


def test_capacity_shrinks_with_resident_draft() -> None:
    m = cm("a100-80g", "llama2-7b", draft="llama-160m")
    with_draft, without = (
        m.kv_capacity_blocks(draft_resident=True),
        m.kv_capacity_blocks(draft_resident=False),
    )
    assert 0 < with_draft < without
    # 80 GiB · 0.9 − 13.5 GB weights − 2 GiB reserve ≈ 57 GiB ≈ 116K tokens at 0.5 MiB per token
    assert without * 16 == pytest.approx((80 * 0.9 - 2) * 2**30 / MiB * 2 - 6.738e9 * 2 / MiB * 2, rel=0.01)
    assert cm("l4", "llama2-70b").kv_capacity_blocks() == 0


def test_transfers_and_budget() -> None:
    m = cm("a100-80g", "llama2-7b", draft="llama-160m")
    assert m.swap_s(1000) == pytest.approx(1000 * 2**19 / 25e9)  # 0.5 MiB per token over 25 GB/s
    assert cm("a100-80g", "llama2-70b", tp=4).swap_s(1000) < cm("a100-80g", "llama2-70b", tp=2).swap_s(1000)
    assert m.draft_transfer_s() == pytest.approx(load_model("llama-160m").weight_bytes / 25e9)
    assert m.budget_tokens == 156 and cm("h100-80g").budget_tokens == 582
    assert 0 < m.pld_s(32) < 0.1 * m.forward_s(32, 32, 32 * 512, decode_only=True)
    with pytest.raises(ValueError):
        cm().draft_transfer_s()
    with pytest.raises(ValueError):
        cm().forward_s(1, 1, which="draft")


def test_profile_model_interpolates(tmp_path: Path) -> None:
    path = tmp_path / "profile.csv"
    rows = ["num_tokens,context,latency_ms"] + [
        f"{n},{c},{10 + 0.01 * n + 0.002 * c}" for n in (1, 64, 256) for c in (0, 1024, 4096)
    ]
    path.write_text("\n".join(rows) + "\n")
    p = ProfileCostModel(path)
    # bilinear interpolation is exact on a bilinear surface, and extrapolation continues it
    for n, s, ctx in ((1, 1, 0), (32, 4, 512), (200, 8, 3000), (512, 2, 8000)):
        assert p.forward_s(n, s, s * ctx) == pytest.approx((10 + 0.01 * n + 0.002 * ctx) / 1e3)
    assert p.forward(ForwardShape(32, 4, 2048.0)).total_s == p.forward_s(32, 4, 2048.0)
    path.write_text("num_tokens,context,latency_ms\n1,0,1\n2,5,1\n")
    with pytest.raises(ValueError, match="full grid"):
        ProfileCostModel(path)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``python -m repro.cost ARGS`` in this process: (exit code, stdout, stderr)."""
    from repro.cost.__main__ import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


COMPONENTS = ("linear_ms", "attention_ms", "lm_head_ms", "allreduce_ms", "overhead_ms", "draft_ms", "host_ms")


def test_cli_prints_exact_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "--model", "llama2-7b", "--hardware", "a100-80g", "--batch", "8", "--draft",
                        "llama-160m", "--k", "4")
    assert code == 0
    data = json.loads(out)
    assert list(data) == ["total_ms", *COMPONENTS, "kv_capacity_tokens", "budget_tokens"]
    assert data["total_ms"] == pytest.approx(sum(data[k] for k in COMPONENTS))
    assert data["draft_ms"] > 0 and data["budget_tokens"] == 156


def test_cli_runs_as_a_module() -> None:
    out = subprocess.run([sys.executable, "-m", "repro.cost", "--model", "llama2-7b", "--hardware", "a100-80g"],
                         cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["draft_ms"] == 0.0


def test_cli_defaults_are_the_documented_ones(capsys: pytest.CaptureFixture[str]) -> None:
    # one decode pass of 8 sequences at context 512 on 1 GPU under vLLM v0, no draft
    base = ("--model", "llama2-7b", "--hardware", "a100-80g")
    explicit = _cli(capsys, *base, "--tp", "1", "--batch", "8", "--new-tokens", "1", "--context", "512",
                    "--engine", "vllm_v0")
    assert _cli(capsys, *base) == explicit
    for changed in (("--tp", "2"), ("--batch", "4"), ("--new-tokens", "2"), ("--context", "256"),
                    ("--engine", "vllm_v1")):
        assert _cli(capsys, *base, *changed)[1] != explicit[1], changed


@pytest.mark.parametrize(("args", "names"), [
    (("--model", "llama9", "--hardware", "a100-80g"), ("llama9", "llama2-7b")),
    (("--model", "llama2-7b", "--hardware", "a100-80g", "--draft", "llama9"), ("llama9",)),
    (("--model", "llama2-7b", "--hardware", "a100-80g", "--engine", "vllm9"), ("vllm9",)),
    (("--model", "llama2-7b", "--hardware", "a100-80g", "--k", "2"), ("--k needs --draft",)),
], ids=["model", "draft", "engine", "k without a draft"])
def test_cli_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], args: tuple[str, ...],
                                             names: tuple[str, ...]) -> None:
    code, out, err = _cli(capsys, *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and all(n in lines[0] for n in names)


HELP = """\
usage: python -m repro.cost [-h] --model MODEL --hardware HARDWARE [--tp TP] [--batch BATCH] [--new-tokens NEW_TOKENS]
                            [--context CONTEXT] [--draft DRAFT] [--k K] [--engine ENGINE]

One step's cost breakdown as a JSON object.

options:
  -h, --help            show this help message and exit
  --model MODEL         target model id (conf/model)
  --hardware HARDWARE   GPU id (conf/hardware)
  --tp TP               tensor-parallel GPUs
  --batch BATCH         sequences in the pass
  --new-tokens NEW_TOKENS
                        tokens per sequence (1 = decode)
  --context CONTEXT     cached tokens per sequence
  --draft DRAFT         draft model id (chain speculation)
  --k K                 draft tokens per sequence (needs --draft)
  --engine ENGINE       engine profile (conf/engine): vllm_v0, vllm_v1, flexflow
"""


def test_cli_help_and_required_names(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.cost.__main__ import main

    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and capsys.readouterr().out == HELP
    for args, missing in ((["--hardware", "a100-80g"], "--model"), (["--model", "llama2-7b"], "--hardware")):
        with pytest.raises(SystemExit) as done:
            main(args)
        assert done.value.code == 2 and f"the following arguments are required: {missing}" in capsys.readouterr().err


def test_cli_decode_is_the_engines_decode_and_charges_tp(capsys: pytest.CaptureFixture[str]) -> None:
    # the default pass is a decode pass of 8 sequences at context 512 as the engine charges it; at tp = 2 the
    # all-reduce is in the total, in ms
    from repro.cost.__main__ import breakdown
    from repro.cost.serving import load_engine
    from repro.cost.step import decode_pass_s

    for tp in (1, 2):
        m = CostModel(load_hardware("a100-80g"), load_model("llama2-7b"), tp=tp, engine=load_engine("vllm_v0"))
        out = json.loads(_cli(capsys, "--model", "llama2-7b", "--hardware", "a100-80g", "--tp", str(tp))[1])
        assert out == pytest.approx(breakdown(m, 8)) and breakdown(m, 8) == breakdown(m, 8, 1, 512, 0)
        assert out["total_ms"] == pytest.approx(1e3 * decode_pass_s(m, 8, 512, 0), rel=1e-12)
        assert (out["allreduce_ms"] > 0) == (tp == 2) and out["draft_ms"] == out["host_ms"] == 0.0
        assert out["total_ms"] == pytest.approx(sum(out[k] for k in COMPONENTS), rel=1e-12)


def test_cli_prefill_and_verify_are_the_engines_passes(capsys: pytest.CaptureFixture[str]) -> None:
    # --new-tokens q > 1 without --k: a prefill chunk of q per sequence on --context cached ones; with --k: after
    # k draft passes of the batch, each at its own context
    import numpy as np

    from repro.cost.__main__ import breakdown
    from repro.cost.serving import load_engine
    from repro.cost.step import DecodeBatch, PrefillBatch, verify_pass

    m = CostModel(load_hardware("a100-80g"), load_model("llama2-7b"), draft=load_model("llama-160m"),
                  engine=load_engine("vllm_v1"))
    base = ("--model", "llama2-7b", "--hardware", "a100-80g", "--engine", "vllm_v1", "--batch", "4")
    pre = json.loads(_cli(capsys, *base, "--new-tokens", "64", "--context", "128")[1])
    plain = CostModel(load_hardware("a100-80g"), load_model("llama2-7b"), engine=load_engine("vllm_v1"))
    assert pre == pytest.approx(breakdown(plain, 4, 64, 128))
    ids, none = np.arange(4), np.zeros(0, dtype=np.int64)
    chunks = PrefillBatch(ids, np.full(4, 64), 4 * 64 * (128 + 65 / 2), np.ones(4, dtype=bool), 4 * 128.0)
    shape, host_s = verify_pass(plain.engine, chunks, DecodeBatch(none, none, none, none, none.astype(bool), {}, None))
    assert shape.prefill_cached == 512.0 and shape.num_tokens == 256
    assert pre["total_ms"] == pytest.approx(1e3 * (plain.forward(shape).total_s + host_s))
    spec = json.loads(_cli(capsys, *base, "--draft", "llama-160m", "--k", "3", "--context", "100")[1])
    drafts = m.spec_round_s() + sum(m.forward_s(4, 4, 4 * (100 + i + 1), decode_only=True, which="draft")
                                    for i in range(3))
    assert spec["draft_ms"] == pytest.approx(1e3 * drafts)
    assert spec["kv_capacity_tokens"] == 16 * m.kv_capacity_blocks() and spec["budget_tokens"] == m.budget_tokens


def test_conf_dir_located() -> None:
    assert (CONF_DIR / "hardware" / "a100-80g.yaml").is_file()


def test_vllm_v0_kv_split_at_tp4() -> None:
    # vLLM v0 with a draft (docs/calibration.md): the draft (Llama-3.2-1B, TP 1) lives on the driver GPU, and draft and
    # target get equal block counts that together fit that GPU. Llama-3.1-70B at TP 4 on H100s: per token the target
    # keeps 2·80 layers·8 KV heads·128·2 B / 4 GPUs = 81,920 B per GPU, the draft 2·16·8·64·2 = 32,768 B.
    from repro.cost.model import GiB

    target, draft = load_model("llama3-70b"), load_model("llama3.2-1b")
    assert target.kv_bytes_per_token // 4 == 81_920 and draft.kv_bytes_per_token == 32_768
    hw = load_hardware("h100-80g")
    cost = CostModel(hw, target, tp=4, draft=draft)
    free_driver = hw.memory_bytes * 0.9 - target.weight_bytes / 4 - draft.weight_bytes - 2 * GiB
    assert cost.kv_capacity_blocks(layout="vllm_v0") == int(free_driver // (16 * (81_920 + 32_768)))
    alone = cost.kv_capacity_blocks(draft_resident=False)
    assert cost.kv_capacity_blocks(layout="vllm_v0") / alone == pytest.approx(0.670, abs=0.002)  # the figure
    assert cost.kv_capacity_blocks(layout="spread") / alone == pytest.approx(0.895, abs=0.002)
    one = CostModel(load_hardware("h100-80g"), load_model("llama2-7b"), tp=1, draft=load_model("llama-160m"))
    assert one.kv_capacity_blocks(layout="vllm_v0") == one.kv_capacity_blocks(layout="spread")  # same at TP 1


# Hand-computed passes, Llama-2-7B on one A100-80G (conf/hardware/a100-80g.yaml: 312 TFLOP/s dense fp16, 2039 GB/s,
# compute efficiency 0.65, KV-read efficiency 0.5; overheads 126 us per pass, 60 / 32 us per layer eager / CUDA
# graphs, 4.4 us per sequence). Each fails when its term is dropped or scaled (x0, x3), or charged per the wrong unit.
A100_FLOPS, A100_BW = 312e12 * 0.65, 2039e9 * 0.5
L, H, HD = 32, 32, 128  # Llama-2-7B: layers, heads, head dim (MHA: KV heads = heads)


def test_prefill_attention_by_hand() -> None:
    # one 512-token prompt, nothing cached: 512 · 513 / 2 causal pairs, 4 · L · H · hd FLOPs each (QKᵀ and PV)
    pairs = 512 * 513 / 2
    got = cm().forward(ForwardShape(512, 1, prefill_attn_pairs=pairs, lm_head_tokens=1)).attention_s
    assert got == pytest.approx(4 * L * H * HD * pairs / A100_FLOPS, rel=1e-9)  # ≈ 0.56 ms


def _kv_s(tokens: float) -> float:
    """KV read by hand: V = tokens · 0.5 MiB at η(V) = 0.5 + 0.35 · V / (V + V_half), V_half = L · 2039 GB/s · 30 µs."""
    v = tokens * 2 * L * H * HD * 2
    v_half = L * 2039e9 * 30e-6
    return v / (2039e9 * (0.5 + 0.35 * v / (v + v_half)))


def test_decode_attention_reads_every_cached_token_once_by_hand() -> None:
    # 8 sequences of 300 tokens of context: 2400 tokens · 2 (K, V) · L · H · hd · 2 bytes = 2400 · 0.5 MiB = 1.26 GB
    # at η = 0.5 + 0.35 · 1.26 / (1.26 + 1.96) = 0.637 of 2039 GB/s ≈ 0.97 ms
    got = cm().forward(ForwardShape(8, 8, kv_read_tokens=8 * 300, decode_only=True)).attention_s
    assert got == pytest.approx(_kv_s(8 * 300), rel=1e-9)
    assert got == pytest.approx(0.969e-3, rel=1e-3)


@pytest.mark.parametrize(("tokens", "eta"), [(16, 0.5015), (2_400, 0.6369), (65_536, 0.8313), (1_000_000, 0.8487)])
def test_large_decode_batches_read_kv_faster(tokens: int, eta: float) -> None:
    # the bandwidth a decode pass reaches grows with what it reads: ≈ 50 % of peak for a few sequences, towards
    # 85 % for a large batch × context (FlashInfer)
    got = cm().forward(ForwardShape(1, 1, kv_read_tokens=tokens, decode_only=True)).attention_s
    assert tokens * 2 * L * H * HD * 2 / (2039e9 * got) == pytest.approx(eta, abs=5e-4)


def test_query_compute_bounds_a_large_tree_on_gqa() -> None:
    # Llama-2-70B (GQA, 8 KV heads of 64) at TP 4: 64 queries per sequence on 1,000 cached tokens. The KV read is
    # 1,064 tokens · 327,680 B / 4 per sequence; the queries' compute 64 · 1,064 pairs · 4 · 80 · 64 · 128 FLOPs / 4:
    # with 8 queries the read dominates, with 64 the compute (a roofline, not a sum)
    m = cm("a100-80g", "llama2-70b", tp=4)
    pair_s = 4 * 80 * 64 * 128 / 4 / A100_FLOPS
    few = m.forward(ForwardShape(8, 1, kv_read_tokens=1_008, decode_only=True, query_pairs=8 * 1_008)).attention_s
    many = m.forward(ForwardShape(64, 1, kv_read_tokens=1_064, decode_only=True, query_pairs=64 * 1_064)).attention_s
    assert many == pytest.approx(64 * 1_064 * pair_s, rel=1e-9)
    assert few > 8 * 1_008 * pair_s


@pytest.mark.parametrize(("seqs", "decode_only", "per_layer_s"), [(1, True, 32e-6), (8, True, 32e-6),
                                                                  (8, False, 60e-6), (64, False, 60e-6)])
def test_fixed_overheads_by_hand(seqs: int, decode_only: bool, per_layer_s: float) -> None:
    # per pass + per layer (eager launches, or CUDA-graph replay for decode-only passes) + per sequence
    got = cm().forward(ForwardShape(seqs, seqs, decode_only=decode_only)).overhead_s
    assert got == pytest.approx(126e-6 + L * per_layer_s + seqs * 4.4e-6, rel=1e-9)


def test_kv_capacity_with_a_resident_draft_by_hand() -> None:
    # 80 GiB · 0.9 − target weights − draft weights − 2 GiB reserve, in blocks of 16 tokens of target + draft KV:
    # Llama-2-7B 2 · 32 · 32 · 128 · 2 = 524,288 bytes per token, Llama-160M 2 · 12 · 12 · 64 · 2 = 36,864
    m = cm(draft="llama-160m")
    free = 80 * 2**30 * 0.9 - 13_476_298_752 - 324_796_416 - 2 * 2**30
    assert m.kv_capacity_blocks() == int(free // (16 * (524_288 + 36_864)))
    # without the draft's KV per token the pool would hold 7 % more blocks: the draft's KV is charged
    assert m.kv_capacity_blocks() < int(free // (16 * 524_288))


# --- consistency the cost model must keep (docs/calibration.md): more work never costs less; CLI == engine ----------
@pytest.mark.parametrize("engine", ["vllm_v0", "vllm_v1", "flexflow"])
@pytest.mark.parametrize(("model", "hw"), [("llama2-7b", "a100-80g"), ("llama3-8b", "h100-80g")])
def test_a_pass_never_costs_less_when_it_computes_more(engine: str, model: str, hw: str) -> None:
    # more sequences, more new tokens per sequence (decode -> prefill chunk of 2, 4, 16) or more cached context
    # each cost at least as much: a chunk of 2 on c cached tokens reads those c tokens like a decode does
    from repro.cost.__main__ import breakdown
    from repro.cost.serving import load_engine

    m = CostModel(load_hardware(hw), load_model(model), engine=load_engine(engine))

    def t(b: int, q: int, c: int) -> float:
        return breakdown(m, b, q, c)["total_ms"]

    for b in (1, 8, 64, 128):
        for c in (0, 128, 512, 2048):
            qs = [t(b, q, c) for q in (1, 2, 4, 16)]
            assert qs == sorted(qs), (b, c, qs)
            assert t(b, 1, c) <= t(b, 1, 2 * c + 1) and t(b, 2, c) <= t(2 * b, 2, c)
    assert t(128, 2, 512) > t(128, 1, 512)  # the recorded case: 48.5 vs 22.4 ms before the prefix read


def test_cli_and_engine_charge_the_same_pass() -> None:
    # the command line's decode / verify / prefill numbers are the engine's: one speculative step of 8 requests
    # (k = 4, context 300) on vLLM v0, charged by verify_pass + StepCoster, equals `python -m repro.cost ... --k 4`
    import numpy as np

    from repro.cost.__main__ import breakdown
    from repro.cost.serving import load_engine
    from repro.cost.step import DecodeBatch, PrefillBatch, verify_pass
    from repro.sim.plan import StepPlan
    from repro.sim.proposers import DraftModel
    from repro.sim.state import RequestState
    from repro.sim.stepcost import StepCoster
    from tests.conftest import make_requests

    m = CostModel(load_hardware("a100-80g"), load_model("llama2-7b"), draft=load_model("llama-160m"),
                  engine=load_engine("vllm_v0"))
    s = RequestState(**make_requests(8, prompt_len=[300] * 8))
    s.num_computed[:] = 300
    s.num_draft_computed[:] = 300
    rid = np.arange(8)
    k = np.full(8, 4)
    none = np.zeros(0, dtype=np.int64)
    draft = StepCoster(s, m).draft_s(DraftModel(m), StepPlan(decode_ids=rid, k=k), rid, np.full(8, 300), k, k > 0,
                                     {}, none, none, draft_resident=True)
    shape, host = verify_pass(m.engine, PrefillBatch(none, none, 0.0, np.zeros(0, dtype=bool)),
                              DecodeBatch(rid, np.ones(8, dtype=np.int64), np.full(8, 300), k, k > 0, {}, None))
    engine_ms = 1e3 * (draft + m.forward(shape).total_s + host)
    assert breakdown(m, 8, 1, 300, k=4)["total_ms"] == pytest.approx(engine_ms, rel=1e-12)


def test_remember_shares_between_equal_models_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """CostModel.remember: computed once for equal models (a sweep's points), again for any other model or key; a
    remembered dataclass's arrays are read-only; a measured profile shares nothing. (On an empty store: a second
    run of the tests in one process, as mutmut's, would find the first's values.)"""
    from collections.abc import Callable

    import numpy as np

    from repro.cost import remembered
    from repro.cost.serving import EngineProfile

    monkeypatch.setattr(remembered, "_KEPT", {})

    calls: list[str] = []

    @dataclasses.dataclass(frozen=True)
    class Fit:
        coef: np.ndarray

    def compute(tag: str) -> Callable[[], Fit]:
        def run() -> Fit:
            calls.append(tag)
            return Fit(np.arange(3.0))
        return run

    a, b = cm(), cm()
    first = a.remember(("test", 1), compute("a"))
    assert b.remember(("test", 1), compute("b")) is first and calls == ["a"]
    with pytest.raises(ValueError):
        first.coef[0] = 1.0
    cm().remember(("test", 2), compute("key"))
    cm(tp=2).remember(("test", 1), compute("tp"))
    cm(engine=EngineProfile(name="other", expand_seq_s=1e-4)).remember(("test", 1), compute("engine"))
    cm(model="llama2-13b").remember(("test", 1), compute("model"))
    assert calls == ["a", "key", "tp", "engine", "model"]
    profiled = cm(target_profile=object())
    assert remembered.fingerprint(profiled) is None
    profiled.remember(("test", 1), compute("profiled"))
    profiled.remember(("test", 1), compute("profiled"))
    assert calls[-2:] == ["profiled", "profiled"]


def test_remembered_baseline_equals_its_definition() -> None:
    import numpy as np

    from repro.cost.step import decode_pass_s
    from repro.experiments.simulate import baseline_tpot_s

    for model in ("llama2-7b", "llama2-70b"):
        want = float(np.mean([decode_pass_s(cm(model=model), 8, 32 + i) for i in range(1, 128)]))
        assert baseline_tpot_s(cm(model=model)) == want
        assert baseline_tpot_s(cm(model=model)) == want  # (remembered)


def test_weight_streaming_grows_with_the_matrix() -> None:
    """H100 80GB (mem_efficiency 0.5, mem_efficiency_large 0.91, mem_ramp_us 30): a GEMM of 30 µs at peak
    (100.5 MB) streams at the midpoint 0.705 of peak, a tiny one near 0.5, a huge one near 0.91; the stack sums its
    matrices one by one. The A100 keeps one share for every matrix (no ramp)."""
    from repro.cost.roofline import linear_stream_s, stream_s

    hw = load_hardware("h100-80g")
    half = 30e-6 * hw.bytes_per_s
    assert half / (hw.bytes_per_s * stream_s(hw, half)) == pytest.approx(0.705)
    assert 1e3 / (hw.bytes_per_s * stream_s(hw, 1e3)) == pytest.approx(0.5, abs=1e-4)
    assert 1e12 / (hw.bytes_per_s * stream_s(hw, 1e12)) == pytest.approx(0.91, abs=1e-3)
    m = load_model("qwen3-32b")
    by_hand = m.num_layers * sum(stream_s(hw, p * 2) for p in m.layer_matrices)
    assert linear_stream_s(hw, m, 1) == pytest.approx(by_hand, rel=1e-12)
    a100 = load_hardware("a100-80g")
    assert linear_stream_s(a100, m, 1) == m.linear_params * 2 / (a100.bytes_per_s * a100.mem_efficiency)


def test_memory_transfers_hand_computed() -> None:
    """The KV and weight moves (Llama-2-7B: 512 KiB of KV per token; Llama-160M: 36 KiB), by hand from the link and
    bandwidth figures: a swap's target shards over the tp links in parallel and a co-located draft's KV over the
    driver GPU's link (vLLM v0) or spread like the target's; the draft's weights over draft_tp links; a KV
    migration reading and writing each shard once at the streaming efficiency, plus one launch."""
    from repro.cost.roofline import stream_s
    from repro.cost.serving import load_engine

    a100, l4 = load_hardware("a100-80g"), load_hardware("l4")
    target, draft = load_model("llama2-7b"), load_model("llama-160m")
    t_tok, d_tok = target.kv_bytes_per_token, draft.kv_bytes_per_token
    assert (t_tok, d_tok) == (524288, 36864)
    link = a100.host_link_gbs * 1e9
    for tp in (1, 2):
        v0 = CostModel(a100, target, tp=tp, draft=draft, engine=load_engine("vllm_v0"))
        v1 = CostModel(a100, target, tp=tp, draft=draft, engine=load_engine("vllm_v1"))
        assert v0.kv_bytes_per_token() == t_tok and v0.kv_bytes_per_token(include_draft=True) == t_tok + d_tok
        assert v0.swap_s(100) == v1.swap_s(100) == pytest.approx(100 * t_tok / tp / link, rel=1e-12)
        assert v0.swap_s(100, 40) == pytest.approx((100 * t_tok / tp + 40 * d_tok) / link, rel=1e-12)
        assert v1.swap_s(100, 40) == pytest.approx((100 * t_tok / tp + 40 * d_tok / tp) / link, rel=1e-12)
        assert v0.kv_migrate_s(0) == 0.0
        nbytes = 2.0 * 3 * 16 * t_tok / tp
        assert v0.kv_migrate_s(3) == pytest.approx(stream_s(a100, nbytes) + a100.step_overhead_s, rel=1e-12)
        assert v0.kv_migrate_s(1, block_size=32) == pytest.approx(
            stream_s(a100, 2.0 * 32 * t_tok / tp) + a100.step_overhead_s, rel=1e-12)
    plain = CostModel(a100, target)
    assert plain.kv_bytes_per_token(include_draft=True) == t_tok and plain.swap_s(100, 40) == plain.swap_s(100)
    with pytest.raises(ValueError, match=r"^draft_transfer_s: this cost model has no draft$"):
        plain.draft_transfer_s()
    assert CostModel(a100, target, draft=draft).draft_transfer_s() == pytest.approx(draft.weight_bytes / link)
    remote = CostModel(a100, target, draft=draft, draft_hardware=l4, draft_tp=2)
    assert remote.draft_transfer_s() == pytest.approx(draft.weight_bytes / (2 * l4.host_link_gbs * 1e9), rel=1e-12)
    assert remote.swap_s(100, 40) == remote.swap_s(100)  # a draft on its own GPUs keeps its KV there


@pytest.mark.parametrize(("gpu", "conf"), [
    ("NVIDIA H100 80GB HBM3", "h100-80g"),
    ("NVIDIA H100 NVL", None),  # an H100 whose memory no conf/hardware file names (94 GB reports as NVL)
    ("NVIDIA H100-NVL 94GB", "h100-94g"),
    ("NVIDIA A100-SXM4-80GB", "a100-80g"),
    ("NVIDIA A100-SXM4-40GB", "a100-40g"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA RTX-4090", "rtx4090"),  # hyphens and spaces are dropped before matching
    ("NVIDIA L40S", "l40s"),  # the longest id that matches (l4 matches too)
    ("NVIDIA L4", "l4"),
    ("NVIDIA L20", "l20"),
    ("NVIDIA A40", "a40"),
    ("Tesla T4", None),
    ("", None),
], ids=lambda v: v or "none")
def test_a_gpu_name_maps_to_its_hardware_file(gpu: str, conf: str | None) -> None:
    from repro.cost.spec import hardware_for

    assert hardware_for(gpu) == conf


def test_the_engine_profiles_are_listed() -> None:
    from repro.cost.serving import available_engines, load_engine
    from repro.cost.spec import UnknownSpecError

    names = available_engines()
    assert names == sorted(names) and {"vllm_v0", "vllm_v1", "flexflow", "pytorch_mq"} <= set(names)
    assert all(load_engine(n).name == n for n in names)
    with pytest.raises(UnknownSpecError, match="^unknown engine 'vllm9'; available: " + ", ".join(names) + "$"):
        load_engine("vllm9")


def test_spec_files_are_parsed_once_and_handed_out_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.cost import spec

    (tmp_path / "model").mkdir()
    path = tmp_path / "model" / "m.yaml"
    path.write_text("name: m\nnested: {a: 1}\n")
    monkeypatch.setattr(spec, "CONF_DIR", tmp_path)
    monkeypatch.setattr(spec, "_LOADED", {})
    first = spec._load("model", "m")
    first["nested"]["a"] = 2  # a caller's change stays its own
    assert spec._load("model", "m") == {"name": "m", "nested": {"a": 1}}
    path.write_text("name: m\nnested: {a: 10}\n")  # a changed file is read again
    assert spec._load("model", "m")["nested"] == {"a": 10}
    (tmp_path / "model" / "list.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match=r"list\.yaml is not a mapping$"):
        spec._load("model", "list")
    with pytest.raises(spec.UnknownSpecError) as err:
        spec._load("model", "x")
    assert str(err.value) == "unknown model 'x'; available: list, m"
    assert str(spec.UnknownSpecError()) == ""
    assert spec.available_models() == ["list", "m"]


def test_a_capture_size_that_holds_the_pass_exactly_is_used() -> None:
    from repro.cost.serving import EngineProfile

    prof = EngineProfile(name="p", graph_sizes=(1, 2, 4, 8))
    assert [prof.padded_tokens(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 9]


def test_remembered_values_of_any_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from repro.cost import remembered

    monkeypatch.setattr(remembered, "_KEPT", {})
    fp = ("model",)
    assert remembered.remember(fp, "f", lambda: 1.5) == 1.5 and remembered.remember(fp, "t", lambda: (1, 2)) == (1, 2)
    arr = remembered.remember(fp, "a", lambda: np.arange(3.0))
    assert not arr.flags.writeable and remembered.remember(fp, "a", lambda: np.zeros(1)) is arr


@pytest.mark.parametrize("field", ["num_tokens", "num_seqs", "kv_read_tokens", "prefill_attn_pairs", "query_pairs"])
def test_a_pass_with_any_negative_quantity_is_refused(field: str) -> None:
    m = cm()
    assert m.forward(ForwardShape(0, 0)).total_s >= 0.0  # an empty pass is not negative
    bad = dataclasses.replace(ForwardShape(4, 2, 100.0, 10.0, query_pairs=8.0), **{field: -1})
    with pytest.raises(ValueError, match=r"^negative quantity in ForwardShape"):
        m.forward(bad)
