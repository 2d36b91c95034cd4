"""The measured-profile cost model end to end: selectable as ``cost=profile``, a round trip from a profile table to
the engine's step times, and ``python -m repro.profile`` on a tiny random-weight model (skipped without PyTorch)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from repro.cost.model import CostModel
from repro.cost.profile import ProfileCostModel
from repro.cost.spec import ModelSpec, load_hardware, load_model
from repro.errors import ConfigError
from repro.simulate import build, compose, run_point

TOKENS, CONTEXTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096), (0, 128, 512, 1024, 2048, 4096)


def _analytic() -> CostModel:
    return CostModel(load_hardware("a100-80g"), load_model("llama2-7b"))


def _pass_s(cm: CostModel, n: int, c: int) -> float:
    """The profile table's pass: a prefill of one n-token prompt (c = 0), or n sequences decoding on c tokens."""
    seqs = 1 if c == 0 else n
    return cm.forward_s(n, seqs, kv_read_tokens=seqs * c + n, prefill_attn_pairs=n * (n + 1) / 2 if c == 0 else 0.0,
                        lm_head_tokens=seqs, decode_only=c > 0)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The analytic model of Llama-2-7B on an A100 written out as a profile table."""
    path = tmp_path_factory.mktemp("profile") / "a100-llama2-7b.csv"
    cm = _analytic()
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["num_tokens", "context", "latency_ms"])
        w.writerows((n, c, _pass_s(cm, n, c) * 1e3) for n in TOKENS for c in CONTEXTS)
    return path


def test_cost_profile_reads_the_target_from_the_table(table: Path) -> None:
    built = build(compose(["system=vllm", "num_requests=20", "cost=profile", f"cost.table={table}"]))
    cost = built.cost
    assert isinstance(cost.target_profile, ProfileCostModel)
    cm = _analytic()
    for n, c in ((1, 128), (64, 512), (512, 0)):  # grid points: the table's value exactly
        seqs = 1 if c == 0 else n
        got = cost.forward_s(n, seqs, kv_read_tokens=seqs * c)
        assert got == pytest.approx(_pass_s(cm, n, c), rel=1e-9)
    # the draft and the memory model stay analytic
    assert cost.forward_s(8, 8, kv_read_tokens=800, which="draft") == cm_with_draft().forward_s(
        8, 8, kv_read_tokens=800, which="draft")
    assert cost.kv_capacity_blocks() == cm_with_draft().kv_capacity_blocks()


def cm_with_draft() -> CostModel:
    return CostModel(load_hardware("a100-80g"), load_model("llama2-7b"), draft=load_model("llama-160m"))


def test_a_profile_of_the_analytic_model_reproduces_its_runs(table: Path) -> None:
    # the same point on the table and on the roofline: interpolation between grid points moves TPOT by < 1 %
    base = ["system=vllm", "num_requests=100", "rps=4"]
    prof = run_point(compose([*base, "cost=profile", f"cost.table={table}"])).metrics
    ana = run_point(compose(base)).metrics
    assert prof["mean_tpot_ms"] == pytest.approx(ana["mean_tpot_ms"], rel=0.01)
    assert prof["throughput_tok_s"] == pytest.approx(ana["throughput_tok_s"], rel=0.01)


@pytest.mark.parametrize("overrides,match", [
    (["cost=profile"], "cost.table=PATH"),
    (["cost=profile", "cost.table=no/such/profile.csv"], "no file no/such/profile.csv"),
])
def test_a_bad_profile_setting_is_a_config_error(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build(compose(["system=vllm", "num_requests=5", *overrides]))


def test_repro_profile_measures_a_tiny_random_model_into_a_table(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="python -m repro.profile needs PyTorch (pip install torch==2.13.0)")
    from repro import profile

    tiny = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128,
                     vocab_size=256, max_context=512, tokenizer="llama2")
    rows = profile.profile(tiny, "cpu", tokens=(1, 8), contexts=(0, 16), warmup=1, repeat=2, ks=(1, 3),
                           batches=(1, 2))
    assert [(n, c, b) for n, c, _, b in rows[:4]] == [(1, 0, 1), (1, 16, 1), (8, 0, 1), (8, 16, 8)]
    # verification passes: b sequences of 1 + k tokens on 16 cached ones
    assert [(n, c, b) for n, c, _, b in rows[4:]] == [(2, 16, 1), (4, 16, 1), (4, 16, 2), (8, 16, 2)]
    assert all(ms > 0 for _, _, ms, _ in rows)
    out = tmp_path / "cpu-tiny.csv"
    profile.write(out, rows, profile.provenance(tiny, "cpu", 1, 2))
    table = ProfileCostModel(out)
    for n, c, ms, b in rows:
        # a verification pass reads b·(c + q) KV tokens, a decode pass n·(c + 1), a prefill n
        kv = b * c + n if b < n and c > 0 else (n * c if c else 0)
        assert table.forward_s(n, b, kv) == pytest.approx(round(ms, 4) / 1e3, rel=1e-6), (n, c, b)
    meta = (tmp_path / "cpu-tiny.csv.json").read_text()
    assert '"model": "tiny"' in meta and '"torch"' in meta


def test_the_random_decoder_runs_every_architecture_shape() -> None:
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    from repro.profile import RandomDecoder

    tiny = ModelSpec(name="tiny", num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=1, intermediate_size=64,
                     vocab_size=100, max_context=64, tokenizer="qwen", tie_embeddings=True)
    model = RandomDecoder(tiny, "cpu", torch.float32)
    with torch.inference_mode():
        assert tuple(model.forward(torch.zeros(1, 5, dtype=torch.long), None).shape) == (1, 100)  # prefill
        assert tuple(model.forward(torch.zeros(3, 1, dtype=torch.long), model.cache(3, 7)).shape) == (3, 100)


def test_a_draft_profile_prices_the_drafts(table: Path) -> None:
    """``cost.draft_table``: the draft's passes come from their own table (here the target's, so a draft pass costs
    what a target pass of the same shape costs), the target's from ``cost.table``."""
    built = build(compose(["system=static_sd_k3", "num_requests=5", "cost=profile", f"cost.table={table}",
                           f"cost.draft_table={table}"]))
    cost = built.cost
    assert cost.forward_s(8, 8, kv_read_tokens=8 * 512, which="draft") == cost.forward_s(8, 8, kv_read_tokens=8 * 512)
    with pytest.raises(ConfigError, match=r"cost\.draft_table: no file"):
        build(compose(["system=vllm", "num_requests=5", "cost=profile", f"cost.table={table}",
                       "cost.draft_table=no/such.csv"]))


def test_verification_rows_form_their_own_grid(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    rows = ["num_tokens,context,latency_ms,num_seqs"]
    rows += [f"{n},{c},{1.0 + n / 100 + c / 1000},{1 if c == 0 else n}" for n in (1, 16) for c in (0, 128)]
    rows += [f"{b * (1 + k)},128,{5.0 + b + k},{b}" for b in (1, 4) for k in (1, 3)]
    path.write_text("\n".join(rows) + "\n")
    prof = ProfileCostModel(path)
    assert prof.forward_s(8, 4, 4 * 128 + 8) == pytest.approx(5e-3 + 4e-3 + 1e-3)  # b=4, k=1: a grid point
    assert prof.forward_s(12, 4, 4 * 128 + 12) == pytest.approx((5.0 + 4 + 2) / 1e3)  # k=2: between k=1 and 3
    assert prof.forward_s(16, 16, 16 * 128) == pytest.approx((1.0 + 0.16 + 0.128) / 1e3)  # plain decode: main grid
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(rows[:-1]) + "\n")
    with pytest.raises(ValueError, match="not a full grid"):
        ProfileCostModel(bad)


def test_calibration_reports_the_analytic_model_against_committed_gpu_profiles(tmp_path: Path) -> None:
    from repro.cost.calibration import _cm, calibration_table

    cm = _cm("a100-80g", "llama2-7b")  # the engine calibration compares under: eager passes (no CUDA graphs)

    def eager_ms(n: int, c: int) -> float:
        seqs = 1 if c == 0 else n
        return cm.forward_s(n, seqs, kv_read_tokens=seqs * c + n, prefill_attn_pairs=n * (n + 1) / 2 if c == 0 else 0,
                            lm_head_tokens=seqs) * 1e3

    with (tmp_path / "a100-llama2-7b.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["num_tokens", "context", "latency_ms", "num_seqs"])
        w.writerows((n, c, 1.1 * eager_ms(n, c), 1 if c == 0 else n) for n in (1, 64) for c in (0, 512))
    (tmp_path / "a100-llama2-7b.csv.json").write_text('{"model": "llama2-7b", "gpu": "NVIDIA A100-SXM4-80GB"}')
    (tmp_path / "cpu-tiny.csv").write_text("num_tokens,context,latency_ms\n1,0,1.0\n")  # a CPU profile: skipped
    df = calibration_table(tmp_path)
    rows = df[df["kind"] == "profile"]
    assert len(rows) == 4 and not rows["checked"].any()
    assert rows["rel_err"].to_numpy() == pytest.approx(1 / 1.1 - 1, rel=1e-6)  # modelled = measured / 1.1
    assert (calibration_table(tmp_path / "none")["kind"] != "profile").all()


@pytest.mark.parametrize("system", ["static_sd_k3", "vllm"])
def test_runs_priced_from_a_profile_equal_the_steps(table: Path, system: str) -> None:
    """Fast-forwarded runs (through arrivals, a segment of stretches priced at once) on a measured target profile
    and the analytic draft leave the state that running every step leaves."""
    out = []
    for fast in (True, False):
        built = build(compose([f"system={system}", "num_requests=40", "rps=4", "cost=profile", f"cost.table={table}"]))
        for rep in built.engine.replicas:
            rep.fast_forward = rep.fast_forward and fast
        out.append(built.engine.run())
    for name in ("num_generated", "finish_at", "first_token_at", "first_decode_at", "service_s", "num_accepted",
                 "last_token_at"):
        assert np.array_equal(getattr(out[0].state, name), getattr(out[1].state, name), equal_nan=True), name
    assert out[0].sim_time_s == out[1].sim_time_s
