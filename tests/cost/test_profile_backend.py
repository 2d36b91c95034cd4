"""The measured-profile cost model end to end: selectable as ``cost=profile``, a round trip from a profile table to
the engine's step times, and ``python -m repro.profile`` on a tiny random-weight model (skipped without PyTorch)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from repro.core.errors import ConfigError
from repro.cost.model import CostModel, ForwardShape
from repro.cost.profile import ProfileCostModel
from repro.cost.serving import EngineProfile
from repro.cost.spec import ModelSpec, load_hardware, load_model
from repro.experiments.simulate import build, compose, run_point

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
    assert cost.kv_capacity_blocks() == cm_with_draft(cost.engine).kv_capacity_blocks()


def cm_with_draft(engine: EngineProfile | None = None) -> CostModel:
    return CostModel(load_hardware("a100-80g"), load_model("llama2-7b"), draft=load_model("llama-160m"), engine=engine)


def test_a_profile_of_the_analytic_model_reproduces_its_runs(table: Path) -> None:
    # the same point on the table and on the roofline: interpolation between grid points moves TPOT by < 1 %
    base = ["system=vllm", "num_requests=100", "rps=4"]
    prof = run_point(compose([*base, "cost=profile", f"cost.table={table}"])).metrics
    ana = run_point(compose(base)).metrics
    assert prof["mean_tpot_ms"] == pytest.approx(ana["mean_tpot_ms"], rel=0.01)
    assert prof["output_throughput"] == pytest.approx(ana["output_throughput"], rel=0.01)


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


def test_repro_profile_times_backend_hfs_own_passes(tmp_path: Path) -> None:
    """``--engine hf``: the passes ``backend=hf`` runs (its Runner over its KV pool), stamped as such, with
    the CPU's private caches flushed before each timed pass (twice the L2 by default)."""
    pytest.importorskip("transformers", reason="--engine hf runs transformers models (pip install -e '.[real]')")
    import json

    from repro import profile
    from repro.backends.passes import ENGINE

    out = tmp_path / "hf.csv"
    assert profile.main(["--model", "llama-68m", "--engine", "hf", "--tiny", "--tokens", "1", "4", "--contexts", "0",
                         "16", "--k", "2", "--batches", "1", "2", "--repeat", "2", "--warmup", "1", "--threads", "1",
                         "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["num_tokens"], r["context"], r["num_seqs"]) for r in rows] == [
        ("1", "0", "1"), ("1", "16", "1"), ("4", "0", "1"), ("4", "16", "4"), ("3", "16", "1"), ("6", "16", "2")]
    assert all(float(r["latency_ms"]) > 0 for r in rows)
    meta = json.loads((tmp_path / "hf.csv.json").read_text())
    assert meta["engine"] == ENGINE and meta["tiny"] is True and meta["shape"]["vocab_size"] == 512
    assert meta["flush_mib"] == round(2 * profile.l2_bytes() / 2**20, 3) > 0 and meta["complete"] is True
    assert profile.main(["--model", "llama-68m", "--tiny", "--out", str(tmp_path / "x.csv")]) == 2  # needs --engine hf


def test_backend_hfs_cells_take_their_pool_at_once_and_one_that_does_not_fit_is_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--engine hf``: a cell's memory estimate is the pool it takes (a slot per sequence, each rounded up as the
    pool rounds it: 128 decodes at 16 tokens take 128 x 256), its room is reserved before the timed passes (no
    growth inside one), and a pool the device cannot hold skips the cell as out of memory instead of ending the
    profile (an H100 run died so on Llama-2-7B)."""
    pytest.importorskip("transformers", reason="--engine hf runs transformers models (pip install -e '.[real]')")
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    from repro import profile
    from repro.backends import kvslots
    from repro.backends.passes import BackendPasses

    spec = load_model("llama2-7b")
    model = BackendPasses(spec, "cpu", torch.float32, tiny=True)
    decode, mixed = profile.Group(128, 1, 16), (profile.Group(1, 300, 0), profile.Group(8, 1, 64))
    assert model.cache_tokens([decode]) == 128 * 256 and model.cache_tokens(mixed) == 9 * 512
    assert profile.RandomDecoder.cache_tokens([decode]) == 128 * 17
    small = model.spec
    per_token = 2 * small.num_layers * small.num_kv_heads * small.hd * 2
    cell = profile.Cell("decode", (decode,))
    assert profile.cell_bytes(small, cell, 2, model.cache_tokens) - profile.cell_bytes(small, cell, 2) == (
        per_token * 128 * (256 - 17))
    grew: list[tuple[int, int]] = []
    real_grow = kvslots.KvSlots._grow

    def grow(self: kvslots.KvSlots, slots: int, tokens: int) -> None:
        grew.append((slots, tokens))
        if slots >= 8:
            raise kvslots.PoolFull("no room")
        real_grow(self, slots, tokens)

    monkeypatch.setattr(kvslots.KvSlots, "_grow", grow)
    cells = list(profile.grid((1, 8), (256,)))  # a decode one token past a 256-token slot
    got = list(profile.measure(model, cells, warmup=1, repeat=1, graphs=False))
    assert [(c.key, ms is None, how) for c, ms, how in got] == [((1, 256, 1), False, "eager"),
                                                               ((8, 256, 8), True, "out of memory")]
    assert grew == [(4, 512), (8, 512)]  # one buffer a cell, sized before the passes (not 256, then 512)


@pytest.mark.parametrize("chunk", [128, 512])
@pytest.mark.parametrize("decodes", [8, 32])
@pytest.mark.parametrize("context", [128, 512, 2048])
def test_a_profile_of_the_analytic_model_prices_its_mixed_steps(table: Path, chunk: int, decodes: int,
                                                                 context: int) -> None:
    """A step mixing a prefill chunk with decodes, as the engine builds it (``verify_pass``), priced through
    ``cost=profile`` from the analytic model's own grid (the chunk's and the decodes' tokens as one prefill, plus the
    decodes' attention over their context from the decode rows): within 1 % of the analytic model's own mixed pass,
    where pricing the whole pass as decodes at the mean context was 27-662 % high. (Measured passes: the committed
    GPU profiles' test below; this CPU, quiet, within 11 %: docs/gpu.md.)"""
    from repro.cost.step import DecodeBatch, PrefillBatch, verify_pass

    pre = PrefillBatch(np.array([0]), np.array([chunk]), chunk * (chunk + 1) / 2, np.array([True]))
    d = decodes
    batch = DecodeBatch(np.arange(1, d + 1), np.ones(d, dtype=np.int64), np.full(d, context, dtype=np.int64),
                        np.zeros(d, dtype=np.int64), np.zeros(d, dtype=bool), {}, None)
    shape, _ = verify_pass(EngineProfile(), pre, batch)
    assert (shape.prefill_tokens, shape.prefill_seqs, shape.num_tokens) == (chunk, 1, chunk + d)
    cost = build(compose(["system=vllm", "num_requests=4", "cost=profile", f"cost.table={table}"])).cost
    priced, truth = cost.forward(shape).total_s, _analytic().forward(shape).total_s
    assert priced == pytest.approx(truth, rel=0.01)
    as_decodes = cost.forward_s(shape.num_tokens, shape.num_seqs, shape.kv_read_tokens)
    assert as_decodes > 1.25 * truth  # what the split fixes
    plain = ForwardShape(64, 1, 0.0, 64 * 65 / 2)  # a prefill alone is read from its row as before
    assert cost.forward(plain).total_s == cost.forward_s(64, 1, 0.0, 64 * 65 / 2)


def test_each_case_takes_its_own_table() -> None:
    """``cost.table`` as a mapping: the point's hardware/model, hardware or model picks its table (a multi-case
    experiment's L40S case is never priced with the H100's), and a point no key names is refused in one line."""
    from repro.sim.deployment import target_profile

    tables = "{h100-80g/llama2-13b: profiles/h100-llama2-13b.csv, h100-80g: profiles/h100-llama2-7b.csv}"
    on = ["cost=profile", f"cost.table={tables}", "hardware=h100-80g"]
    seven = target_profile(compose([*on, "model=llama2-7b"]))
    thirteen = target_profile(compose([*on, "model=llama2-13b"]))
    assert seven is not None and thirteen is not None
    assert thirteen.forward_s(1, 1, 512.0) > seven.forward_s(1, 1, 512.0)  # each its own measured passes
    with pytest.raises(ConfigError, match="no table for hardware l40s and model llama2-7b"):
        target_profile(compose(["cost=profile", f"cost.table={tables}", "hardware=l40s", "model=llama2-7b"]))


MIXED_TABLES = sorted((Path(__file__).resolve().parents[2] / "profiles").glob("*.mixed.csv"))


@pytest.mark.parametrize("mixed", MIXED_TABLES, ids=[p.name for p in MIXED_TABLES])
def test_the_committed_gpu_profiles_mixed_steps_are_priced_within_20_percent(mixed: Path) -> None:
    """The mixed steps measured on the lent H100 and H200 (2026-11-27; 128- and 512-token chunks beside 8 or 32
    decodes at context 64-2048), priced from the same profile's main grid: within -17 % to +1 % (pricing them as
    decodes was up to 385 % high)."""
    table = ProfileCostModel(mixed.with_name(mixed.name.replace(".mixed.csv", ".csv")))
    rows = list(csv.DictReader(mixed.open()))
    assert len(rows) >= 16
    for r in rows:
        p, d, c = int(r["chunk_tokens"]), int(r["decode_seqs"]), int(r["context"])
        priced = table.mixed_s(p, 1, 0.0, d, d, d * (c + 1)) * 1e3
        assert abs(priced / float(r["latency_ms"]) - 1) <= 0.20, (p, d, c, priced, r["latency_ms"])


def test_the_random_decoder_runs_every_architecture_shape() -> None:
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    from repro.profile import RandomDecoder

    tiny = ModelSpec(name="tiny", num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=1, intermediate_size=64,
                     vocab_size=100, max_context=64, tokenizer="qwen", tie_embeddings=True)
    model = RandomDecoder(tiny, "cpu", torch.float32)
    with torch.inference_mode():
        assert tuple(model.forward(torch.zeros(1, 5, dtype=torch.long), None).shape) == (1, 100)  # prefill
        assert tuple(model.forward(torch.zeros(3, 1, dtype=torch.long), model.cache(3, 7, 1)).shape) == (3, 100)


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


def _reference_pass(model: Any, ids: Any, cache: list[tuple[Any, Any]], context: int, all_logits: bool) -> Any:
    """The textbook pass the profiler's must equal: K/V heads repeated, the cache concatenated, an explicit mask."""
    torch = model.torch
    f, s = torch.nn.functional, model.spec
    b, n = ids.shape
    hd, nh, nkv = s.hd, s.num_heads, s.num_kv_heads
    x = model.embed[ids]
    for i, lay in enumerate(model.layers):
        y = f.rms_norm(x, (s.hidden_size,))
        qkv = y @ lay["qkv"].T
        q = qkv[..., : nh * hd].view(b, n, nh, hd).transpose(1, 2)
        k = qkv[..., nh * hd: (nh + nkv) * hd].view(b, n, nkv, hd).transpose(1, 2)
        v = qkv[..., (nh + nkv) * hd:].view(b, n, nkv, hd).transpose(1, 2)
        if context:
            k = torch.cat([cache[i][0][:, :, :context], k], dim=2)
            v = torch.cat([cache[i][1][:, :, :context], v], dim=2)
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        mask = torch.ones(n, context + n, dtype=torch.bool).tril(diagonal=context)
        att = f.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + att.transpose(1, 2).reshape(b, n, nh * hd) @ lay["o"].T
        y = f.rms_norm(x, (s.hidden_size,))
        gate, up = (y @ lay["gate_up"].T).chunk(2, dim=-1)
        x = x + (f.silu(gate) * up) @ lay["down"].T
    last = x.reshape(b * n, -1) if all_logits else x[:, -1]
    return f.rms_norm(last, (s.hidden_size,)) @ model.head.T


@pytest.mark.parametrize("kv_heads", [4, 1])  # multi-head and grouped-query (4 query heads per K/V head)
def test_the_profilers_passes_compute_the_textbook_pass(kv_heads: int) -> None:
    """Folded GQA heads, the verification mask, the cache written in place and a mixed step's groups give the same
    logits as the textbook pass (so what is timed is the pass the table names)."""
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    from repro.profile import RandomDecoder

    spec = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=kv_heads,
                     intermediate_size=96, vocab_size=50, max_context=64, tokenizer="llama2")
    model = RandomDecoder(spec, "cpu", torch.float64)
    model.embed *= 50  # unit-scale activations: differences would show
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        prompt = torch.randint(50, (1, 9), generator=gen)
        assert torch.allclose(model.forward(prompt, None), _reference_pass(model, prompt, [], 0, False))
        for b, n, c in ((3, 1, 7), (2, 4, 5)):  # decodes; verifications of the last token + 3 drafts
            ids = torch.randint(50, (b, n), generator=gen)
            cache = model.cache(b, c, n)
            want = _reference_pass(model, ids, cache, c, n > 1)
            assert torch.allclose(model.forward(ids, cache, all_logits=n > 1), want)
            assert torch.allclose(model.forward(ids, cache, all_logits=n > 1), want)  # a replay: same pass
        # a mixed step: a prompt chunk and two decodes in one pass
        dec = torch.randint(50, (2, 1), generator=gen)
        dcache = model.cache(2, 6, 1)
        both = model.forward_groups([(prompt, None, 0, False), (dec, dcache, 6, False)])
        assert torch.allclose(both, torch.cat([_reference_pass(model, prompt, [], 0, False),
                                               _reference_pass(model, dec, dcache, 6, False)]))


def test_a_row_short_of_the_largest_contexts_is_extended_along_the_attention_slope(tmp_path: Path) -> None:
    """The profiler skips the cells that do not fit in memory: the large-context corner. A row with two measured
    contexts goes on along its own slope; a row with one takes the per-sequence slope of the nearest row."""
    path = tmp_path / "p.csv"
    ms = {(1, 0): 5.0, (1, 128): 6.0, (1, 512): 7.0, (1, 2048): 11.0, (8, 0): 6.0, (8, 128): 8.0, (8, 512): 12.0,
          (64, 0): 9.0, (64, 128): 20.0}
    path.write_text("num_tokens,context,latency_ms,num_seqs\n"
                    + "".join(f"{n},{c},{v},{1 if c == 0 else n}\n" for (n, c), v in ms.items()))
    prof = ProfileCostModel(path)
    assert sorted(prof.extended) == [(8, 2048), (64, 512), (64, 2048)]
    per_seq_ctx = (12.0 - 8.0) / (512 - 128) / 8  # ms per sequence and cached token, from row 8
    assert prof.forward_s(8, 8, 8 * 2048) == pytest.approx((12.0 + per_seq_ctx * 8 * 1536) / 1e3)
    assert prof.forward_s(64, 64, 64 * 512) == pytest.approx((20.0 + per_seq_ctx * 64 * 384) / 1e3)
    bad = tmp_path / "gap.csv"  # a gap below a measured context is not a memory skip
    bad.write_text(path.read_text().replace("1,128,6.0,1\n", ""))
    with pytest.raises(ValueError, match="below a measured one"):
        ProfileCostModel(bad)


@pytest.mark.parametrize(("sidecar", "overrides", "match"), [
    ({"model": "llama-68m"}, [], r"measured for llama-68m, but this run's model is llama2-7b"),
    ({"model": "llama2-7b", "gpu": "NVIDIA H100 80GB HBM3"}, [], r"measured on NVIDIA H100.*hardware=h100-80g"),
    ({"model": "llama2-7b", "tp": 1}, ["model=llama2-70b", "tp=4"], r"measured for llama2-7b"),
    ({"model": "llama2-7b", "tp": 2}, [], r"measured at tp=2, this run has tp=1"),
    ({"model": "llama-160m"}, ["draft"], r"cost\.draft_table: .*measured for llama-160m, but this run's draft"),
], ids=["another model", "another gpu", "another model and tp", "another tp", "another draft"])
def test_a_profile_for_another_setup_is_refused(table: Path, tmp_path: Path, sidecar: dict[str, Any],
                                                overrides: list[str], match: str) -> None:
    """The profiler's sidecar names the model, tp and GPU it measured; a table that does not describe the run is
    refused in one line (a CPU profile of llama-68m once priced Llama-2-70B at tp 4 without a word)."""
    import json

    path = tmp_path / "p.csv"
    path.write_text(table.read_text())
    (tmp_path / "p.csv.json").write_text(json.dumps(sidecar))
    base = ["system=static_sd_k3", "num_requests=5", "cost=profile"]
    if overrides == ["draft"]:
        base += [f"cost.table={table}", f"cost.draft_table={path}", "model@draft=llama-68m"]
        overrides = []
    else:
        base.append(f"cost.table={path}")
    with pytest.raises(ConfigError, match=match):
        build(compose([*base, *overrides]))
    (tmp_path / "p.csv.json").write_text(json.dumps({"model": "llama2-7b", "gpu": "NVIDIA A100-SXM4-80GB", "tp": 1}))
    build(compose(["system=vllm", "num_requests=5", "cost=profile", f"cost.table={path}"]))  # the right one runs


def test_rounds_take_each_cells_median_over_every_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """--rounds R sweeps the grid R times and a cell's value is the median of all its passes, yielded once after
    the last sweep (a slow phase of the host then falls on every cell; docs/gpu.md's H100 run)."""
    from repro import profile

    calls: list[int] = []

    def fake(self: object, fn: object, warmup: int, repeat: int) -> list[float]:
        calls.append(len(calls))
        sweep = (len(calls) - 1) // 3  # three cells a sweep: sweep 0 slow (a phase), sweeps 1-2 fast
        return [50.0] * repeat if sweep == 0 else [30.0 + sweep] * repeat

    torch = pytest.importorskip("torch", reason="needs PyTorch")
    monkeypatch.setattr(profile.Timer, "samples_ms", fake)
    tiny = ModelSpec(name="tiny", num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=1, intermediate_size=64,
                     vocab_size=100, max_context=64, tokenizer="llama2")
    model = profile.RandomDecoder(tiny, "cpu", torch.float32)
    cells = list(profile.grid((1, 2), (0, 16), (), (1,)))[:3]
    assert len(cells) == 3
    got = list(profile.measure(model, cells, warmup=0, repeat=2, rounds=3))
    assert [c.key for c, _, _ in got] == [c.key for c in cells] and len(calls) == 9
    assert [ms for _, ms, _ in got] == [32.0, 32.0, 32.0]  # median of 31, 31, 32, 32, 50, 50 (a sweep at 50 alone: 50)
    calls.clear()
    once = list(profile.measure(model, cells, warmup=0, repeat=2))  # the default: one sweep, as before
    assert [ms for _, ms, _ in once] == [50.0, 50.0, 50.0]


def _bilinear_table(path: Path, contexts: tuple[int, ...] = (0, 128, 512, 2048)) -> ProfileCostModel:
    """A profile whose prefill rows are 0.2 + 0.003 n ms (n tokens, context 0) and whose decode rows are
    0.1 + 0.001 n + 2e-6 n c ms (n sequences at context c): bilinear, so interpolation and extrapolation are exact."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["num_tokens", "context", "latency_ms"])
        for n in (1, 4, 16, 64, 256):
            for c in contexts:
                w.writerow((n, c, 0.2 + 0.003 * n if c == 0 else 0.1 + 0.001 * n + 2e-6 * n * c))
    return ProfileCostModel(path)


@pytest.mark.parametrize(("pre", "seqs", "cached", "dec", "kv"), [
    (48, 2, 0.0, 6, 6 * 300.0),  # fresh chunks beside 6 decodes at context 300
    (48, 2, 2 * 700.0, 6, 6 * 300.0),  # chunks after 700 cached tokens each: their prefix read too
    (30, 3, 3 * 64.0, 3, 3 * 5000.0),  # past the last context: extrapolated
    (16, 1, 1.0, 1, 700.0),  # one chunk after one cached token, beside one decode
])
def test_a_mixed_pass_is_the_prefill_of_all_its_tokens_plus_each_parts_attention(
        tmp_path: Path, pre: int, seqs: int, cached: float, dec: int, kv: float) -> None:
    # every token's linear work as one prefill of pre + dec tokens, plus the decode rows' attention slope
    # (2e-6 ms per sequence-token: 2e-6 of the KV read) over the decodes' context and the chunks' cached prefix
    p = _bilinear_table(tmp_path / "grid.csv")
    want = (0.2 + 0.003 * (pre + dec) + 2e-6 * (kv + cached)) / 1e3
    assert p.mixed_s(pre, seqs, cached, dec, dec, kv) == pytest.approx(want, rel=1e-12)
    shape = ForwardShape(pre + dec, seqs + dec, kv + cached, prefill_tokens=pre, prefill_seqs=seqs,
                         prefill_cached=cached)  # a pass with a prefill share is priced as the mixed pass
    assert p.forward(shape).total_s == pytest.approx(want, rel=1e-12)
    # a grid with one decode column has no attention slope: the prefill of all the tokens alone; two have one
    two = _bilinear_table(tmp_path / "two.csv", contexts=(0, 512))
    assert two.mixed_s(pre, seqs, cached, dec, dec, kv) == pytest.approx((0.2 + 0.003 * (pre + dec)) / 1e3, rel=1e-12)
    three = _bilinear_table(tmp_path / "three.csv", contexts=(0, 128, 512))
    assert three.mixed_s(pre, seqs, cached, dec, dec, kv) == pytest.approx(want, rel=1e-12)
    # a pass of prefill chunks only is the grid's own pass at the chunks' mean context
    only = ForwardShape(pre, seqs, cached, prefill_tokens=pre, prefill_seqs=seqs, prefill_cached=cached)
    assert p.forward(only).total_s == p.forward_s(pre, seqs, cached)


def test_a_mixed_pass_is_never_negative(tmp_path: Path) -> None:
    path = tmp_path / "falling.csv"  # decode rows that fall with context (a noisy profile): the slope is negative
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["num_tokens", "context", "latency_ms"])
        for n in (1, 64):
            w.writerows(((n, 0, 0.01), (n, 128, 1.0), (n, 512, 0.5), (n, 1024, 0.1)))
    assert ProfileCostModel(path).mixed_s(8, 1, 0.0, 8, 8, 8 * 4096.0) == 0.0


def test_verification_is_trilinear_over_its_grid(tmp_path: Path) -> None:
    # verification rows at 1, 4, 16 sequences x 2, 4 tokens each x contexts 128, 512, 2048: 5 + b + 2q + c/100 ms,
    # linear in each axis, so interpolation and extrapolation are exact in all three
    path = tmp_path / "p.csv"
    rows = ["num_tokens,context,latency_ms,num_seqs"]
    rows += [f"{n},{c},{1.0 + n / 100 + c / 1000},{1 if c == 0 else n}" for n in (1, 64) for c in (0, 128, 2048)]
    rows += [f"{b * q},{c},{5.0 + b + 2 * q + c / 100},{b}"
             for b in (1, 4, 16) for q in (2, 3, 4) for c in (128, 512, 2048)]
    path.write_text("\n".join(rows) + "\n")
    prof = ProfileCostModel(path)

    def verify(b: int, q: float, c: float) -> float:  # b sequences of q tokens on c cached: kv read b (c + q)
        return prof.forward_s(int(b * q), b, b * (c + q))

    for b, q, c in ((4, 2, 512), (2, 3, 300), (8, 3, 1000), (10, 2.5, 1500), (16, 4, 2048), (20, 4, 3000),
                    (6, 2.5, 200)):
        assert verify(b, q, c) == pytest.approx((5.0 + b + 2 * q + c / 100) / 1e3, rel=1e-9), (b, q, c)
    assert prof.forward_s(8, 0, 0.0) == prof.forward_s(8, 1, 0.0)  # no sequences: not a verification pass
    main = tmp_path / "main.csv"  # past the longest chain measured, the main grid prices the pass
    main.write_text("\n".join(rows[:7]) + "\n")
    assert verify(16, 5, 512) == ProfileCostModel(main).forward_s(80, 16, 16 * 517)
    neg = tmp_path / "neg.csv"  # rows falling steeply with context extrapolate below zero: clamped
    neg.write_text("\n".join(rows[:7] + [f"{b * q},{c},{5.0 + b + 2 * q - c / 100},{b}" for b in (1, 4, 16)
                                         for q in (2, 3, 4) for c in (128, 512, 2048)]) + "\n")
    assert ProfileCostModel(neg).forward_s(8, 4, 4 * (4000 + 2)) == 0.0


@pytest.mark.parametrize(("text", "message"), [
    ("num_tokens,latency_ms\n1,1\n", "{path}: profile CSV needs columns num_tokens, context, latency_ms"),
    ("", "{path}: profile CSV needs columns num_tokens, context, latency_ms"),
    ("num_tokens,context,latency_ms\n1,0,1\n1,128,2\n4,0,1\n", "{path}: profile is not a full grid; row (4.0,) has "
     "no measured context"),
    ("num_tokens,context,latency_ms\n1,0,1\n1,128,2\n4,128,2\n8,128,3\n", "{path}: profile is not a full grid; "
     "missing (num_tokens, context) [(4.0, 0.0), (8.0, 0.0)]"),
    ("num_tokens,context,latency_ms\n1,0,1\n1,512,2\n4,0,1\n4,128,2\n", "{path}: profile is not a full grid; missing "
     "context 128 of row (1.0,) below a measured one"),
    ("num_tokens,context,latency_ms\n1,0,1\n1,128,2\n1,512,3\n4,0,1\n4,128,2\n4,512,3\n8,0,1\n8,512,2\n",
     "{path}: profile is not a full grid; missing context 128 of row (8.0,) below a measured one"),
    ("num_tokens,context,latency_ms,num_seqs\n1,0,1,1\n1,128,2,1\n8,128,5,4\n8,512,6,4\n16,512,7,4\n", "{path}: the "
     "verification rows (num_seqs < num_tokens) are not a full grid; missing context 128 of row (4.0, 4.0) below a "
     "measured one"),
], ids=["a column missing", "empty", "a row unmeasured", "prefill rows missing", "a gap in the first row",
        "a gap in a later row", "verification gap"])
def test_a_profile_that_is_not_a_grid_is_refused_naming_the_cell(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        ProfileCostModel(path)
    assert str(err.value) == message.format(path=path)


def test_a_row_past_its_measured_contexts_extends_along_its_own_slope_or_the_nearest_rows(tmp_path: Path) -> None:
    # rows 1 and 16 measured at 128 and 512; row 4 and 64 only at 128: the nearest row by batch lends its slope
    # per sequence and token (row 4: row 1's, 1/384 ms; row 64: row 16's, 2/384/16 ms)
    path = tmp_path / "p.csv"
    path.write_text("num_tokens,context,latency_ms\n" + "".join(
        f"{n},0,1\n" for n in (1, 4, 16, 64)) + "1,128,2\n1,512,3\n4,128,4\n16,128,6\n16,512,8\n64,128,10\n")
    prof = ProfileCostModel(path)
    assert sorted(prof.extended) == [(4, 512), (64, 512)]
    assert prof.forward_s(4, 4, 4 * 512) == pytest.approx((4 + 1 / 384 * 4 * 384) / 1e3)
    assert prof.forward_s(64, 64, 64 * 512) == pytest.approx((10 + 2 / 384 / 16 * 64 * 384) / 1e3)


def test_contexts_no_row_can_extend_to_are_refused() -> None:
    from repro.cost.profile import extend_contexts

    with pytest.raises(ValueError, match=r"^no row has two measured contexts to extend row \(1\.0,\) from$"):
        extend_contexts({(1.0,): {128.0: 1.0}, (4.0,): {128.0: 2.0}}, (128.0, 512.0), lambda row: row[0])
    with pytest.raises(ValueError, match=r"^row \(1\.0,\) has no measured context$"):
        extend_contexts({(1.0,): {}}, (128.0,), lambda row: row[0])


def test_a_profile_of_one_row_and_a_pass_of_no_sequences(tmp_path: Path) -> None:
    # one token count measured (a grid of one row: nothing to interpolate across batch sizes); a pass of no
    # sequences reads at context 0; an omitted KV read is none
    one = tmp_path / "one.csv"
    one.write_text("num_tokens,context,latency_ms\n4,0,1.0\n4,128,2.0\n4,512,3.0\n")
    prof = ProfileCostModel(one)
    assert prof.forward_s(4, 4, 4 * 320) == pytest.approx(2.5e-3) and prof.forward_s(9, 9, 9 * 128) == 2e-3
    assert prof.forward_s(4, 0, 0.0) == prof.forward_s(4, 1) == prof.forward_s(4, 1, 0.0) == 1e-3
    short = tmp_path / "short.csv"  # decode columns from context 1
    short.write_text("num_tokens,context,latency_ms\n4,0,1.0\n4,1,2.0\n4,2,2.5\n")
    assert ProfileCostModel(short).forward_s(4, 4, 4 * 1) == 2e-3
    assert ProfileCostModel(short).mixed_s(4, 1, 0.0, 4, 4, 4 * 2.0) == pytest.approx((1.0 + 1.0) / 1e3)  # 2.5 - 1.5


def test_a_prefill_only_profile_and_a_pass_with_nothing_cached(tmp_path: Path) -> None:
    only = tmp_path / "prefill.csv"  # one context (0): prefill passes only
    only.write_text("num_tokens,context,latency_ms\n1,0,1.0\n64,0,2.0\n")
    assert ProfileCostModel(only).forward_s(32, 1) == pytest.approx((1.0 + 31 / 63) / 1e3)
    grid = tmp_path / "grid.csv"  # with verification rows: a pass whose sequences read only their own tokens (no
    # cached context) is not a verification and is priced from the main grid
    rows = ["num_tokens,context,latency_ms,num_seqs"]
    rows += [f"{n},{c},{1.0 + n / 100 + c / 1000},{1 if c == 0 else n}" for n in (1, 64) for c in (0, 128)]
    rows += [f"{b * q},{c},{50.0 + b + q + c / 100},{b}" for b in (1, 4) for q in (2, 4) for c in (128, 512)]
    grid.write_text("\n".join(rows) + "\n")
    main = tmp_path / "main.csv"
    main.write_text("\n".join(rows[:5]) + "\n")
    assert ProfileCostModel(grid).forward_s(8, 4, 8) == ProfileCostModel(main).forward_s(8, 4, 8)
