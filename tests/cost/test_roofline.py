"""The roofline's own formulas (repro/cost/roofline.py), each pinned on its own: CUDA-graph padding, the streaming
efficiency that grows with a matrix's size, the linear stack streamed matrix by matrix (an EAGLE head's fc with it),
and tensor parallelism's all-reduce and shards. The cost model's tests check passes; these check the parts."""

from __future__ import annotations

import dataclasses

import pytest

from repro.cost import roofline
from repro.cost.spec import HardwareSpec, ModelSpec, load_hardware, load_model


def _hw(**kw: object) -> HardwareSpec:
    """An H100 80GB with some keys replaced (1 TB/s makes the arithmetic readable)."""
    base = dataclasses.replace(load_hardware("h100-80g"), mem_bw_gbs=1000.0)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("sizes", "pad"), [
    ((), ()),
    ((4,), (0, 4, 4, 4, 4)),
    ((1, 2, 4, 8), (0, 1, 2, 4, 4, 8, 8, 8, 8)),
    ((2, 3), (0, 2, 2, 3)),
])
def test_a_graph_pass_of_n_tokens_runs_the_smallest_capture_size_at_least_n(sizes: tuple[int, ...],
                                                                             pad: tuple[int, ...]) -> None:
    assert roofline._graph_pad(sizes) == pad


@pytest.mark.parametrize(("ramp_us", "large", "nbytes", "eff"), [
    (10.0, 0.9, 1e7, 0.7),  # halfway at 10 µs of streaming at 1 TB/s = 10 MB: (0.5 + 0.9) / 2
    (10.0, 0.9, 3e7, 0.8),  # three quarters of the way at 3x
    (0.0, 0.9, 1e7, 0.5),  # no ramp: every matrix at the small efficiency
    (10.0, None, 1e7, 0.5),  # no large efficiency: the small one
    (5e-7, 0.9, 1e9, 0.9 - 0.4 * 0.5 / (1e9 + 0.5)),  # a ramp of half a byte: a GB matrix at the large one
])
def test_a_matrix_streams_at_an_efficiency_between_the_small_and_large_by_its_size(
        ramp_us: float, large: float | None, nbytes: float, eff: float) -> None:
    hw = _hw(mem_efficiency=0.5, mem_efficiency_large=large, mem_ramp_us=ramp_us)
    assert roofline.stream_s(hw, nbytes) == pytest.approx(nbytes / (1e12 * eff), rel=1e-12)


def _by_matrix(hw: HardwareSpec, m: ModelSpec, tp: int) -> float:
    wb = m.linear_weight_bytes
    s = m.num_layers * sum(roofline.stream_s(hw, p * wb / tp) for p in m.layer_matrices)
    return s + (roofline.stream_s(hw, m.fc_params * wb / tp) if m.fc_params else 0.0)


@pytest.mark.parametrize("model", ["llama3-8b", "eagle-llama3-8b"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_linear_stack_streams_matrix_by_matrix_each_shard_at_its_own_efficiency(model: str, tp: int) -> None:
    m = load_model(model)
    ramp = _hw(mem_efficiency=0.5, mem_efficiency_large=0.9, mem_ramp_us=1.0)  # (a ramp of exactly 1 µs)
    assert roofline.linear_stream_s(ramp, m, tp) == pytest.approx(_by_matrix(ramp, m, tp), rel=1e-12)
    if m.fc_params:  # an EAGLE head's fc streams beside its layer
        assert roofline.linear_stream_s(ramp, m, tp) > m.num_layers * sum(
            roofline.stream_s(ramp, p * m.linear_weight_bytes / tp) for p in m.layer_matrices)
    if tp > 1:  # a smaller shard streams less efficiently: more than 1/tp of one GPU's time
        assert roofline.linear_stream_s(ramp, m, tp) > roofline.linear_stream_s(ramp, m, 1) / tp
    flat = _hw(mem_efficiency=0.5, mem_efficiency_large=0.5, mem_ramp_us=30.0)  # one efficiency: the closed form
    assert roofline.linear_stream_s(flat, m, tp) == pytest.approx(
        m.linear_params * m.linear_weight_bytes / tp / (1e12 * 0.5), rel=1e-12)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tensor_parallelism_adds_two_ring_all_reduces_a_layer_and_shards_the_rest(tp: int) -> None:
    hw, m = load_hardware("h100-80g"), load_model("llama3-70b")
    c = roofline.coefficients(hw, m, tp)
    n_ar = 2 * m.num_layers if tp > 1 else 0  # after attention and after the MLP
    ring = 2 * (tp - 1) / tp * m.hidden_size * m.dtype_bytes  # bytes a token moves through one ring all-reduce
    assert c.ar_fixed_s == pytest.approx(n_ar * hw.allreduce_latency_s, rel=1e-12, abs=0.0)
    assert c.ar_tok_s == pytest.approx(n_ar * ring / (hw.interconnect_gbs * 1e9), rel=1e-12, abs=0.0)
    one = roofline.coefficients(hw, m, 1)
    for key in ("lin_tok_s", "head_tok_s", "kv_bytes", "pair_s"):  # compute and KV split tp ways
        assert getattr(c, key) == pytest.approx(getattr(one, key) / tp, rel=1e-12), key
    assert c.head_mem_s == roofline.stream_s(hw, m.lm_head_params * m.dtype_bytes / tp)
    assert c.layers_graph_s == m.num_layers * hw.layer_overhead_graph_s
    eagle = roofline.coefficients(hw, load_model("eagle-llama3-70b"), tp)
    assert eagle.layers_eager_s == 2 * hw.layer_overhead_eager_s  # the head's layer and its fc


def _coeffs(**kw: object) -> roofline.Coeffs:
    """Round constants, each part's own (p = 2: the knee is a Euclidean norm of the two bounds)."""
    base: dict[str, object] = dict(
        lin_mem_s=3.0, lin_tok_s=0.1, head_mem_s=0.5, head_tok_s=0.01, p=2.0, inv_p=0.5, kv_bytes=100.0,
        inv_bw=1e-3, eta_lo=0.5, eta_span=0.0, v_half=1.0, pair_s=1e-4, ar_fixed_s=0.2, ar_tok_s=0.001,
        step_s=1.0, layers_eager_s=0.3, layers_graph_s=0.1, req_s=0.01, graph_pad=(0, 1, 2, 4, 4))
    return roofline.Coeffs(**{**base, **kw})  # type: ignore[arg-type]


def test_a_passs_parts_are_its_rooflines_one_by_one() -> None:
    c = _coeffs()
    # 40 tokens of 8 sequences, 1,000 tokens of KV, 500 causal pairs, every token scored, with prefill
    lin, att, head, ar, over = roofline.pass_parts(c, 40, 8, 1000.0, 500.0, -1, False)
    assert lin == pytest.approx((3.0**2 + (0.1 * 40) ** 2) ** 0.5)  # 5.0: the knee of streaming and compute
    assert head == pytest.approx((0.5**2 + (0.01 * 40) ** 2) ** 0.5)  # head < 0: every token scored
    assert ar == pytest.approx(0.2 + 0.001 * 40)
    assert over == pytest.approx(1.0 + 0.3 + 0.01 * 8)  # eager launches: a pass with prefill
    assert att == pytest.approx(1000.0 * 100.0 * 1e-3 / 0.5 + 1e-4 * 500.0)  # KV read at eta_lo, then the pairs
    # decode only, 3 tokens: a CUDA-graph pass at capture size 4 (its linear, its all-reduce), the head on 2 rows
    lin, att, head, ar, over = roofline.pass_parts(c, 3, 3, 0.0, 0.0, 2, True)
    assert lin == pytest.approx((9.0 + 0.16) ** 0.5) and ar == pytest.approx(0.2 + 0.004)
    assert head == pytest.approx((0.25 + 0.0004) ** 0.5) and att == 0.0
    assert over == pytest.approx(1.0 + 0.1 + 0.03)  # graph launches
    # the query-key pairs of a tree's queries bound the KV read from below
    assert roofline.pass_parts(c, 3, 3, 10.0, 0.0, 2, True, qpairs=1e6)[1] == pytest.approx(1e-4 * 1e6)
    assert roofline.pass_parts(c, 3, 3, 10.0, 0.0, 2, True)[1] == pytest.approx(10.0 * 100.0 * 1e-3 / 0.5)
    # past the largest capture size, and with prefill, no padding; a pass of one token pads to 1
    assert roofline.pass_parts(c, 5, 5, 0.0, 0.0, 0, True)[0] == pytest.approx((9.0 + 0.25) ** 0.5)
    assert roofline.pass_parts(c, 3, 3, 0.0, 0.0, 0, False)[0] == pytest.approx((9.0 + 0.09) ** 0.5)
    assert roofline.pass_parts(c, 1, 1, 0.0, 0.0, 0, True)[0] == pytest.approx((9.0 + 0.01) ** 0.5)
    wide = _coeffs(graph_pad=(0, 2, 2, 4, 4))  # a single token runs the smallest capture size, 2
    assert roofline.pass_parts(wide, 1, 1, 0.0, 0.0, 0, True)[0] == pytest.approx((9.0 + 0.04) ** 0.5)
    # the head scores the rows it is given (none, one), not the pass's tokens; one token is one all-reduce's worth
    assert roofline.pass_parts(c, 5, 5, 0.0, 0.0, 0, True)[2] == 0.0
    assert roofline.pass_parts(c, 5, 5, 0.0, 0.0, 1, True)[2] == pytest.approx((0.25 + 0.0001) ** 0.5)
    assert roofline.pass_parts(c, 1, 1, 0.0, 0.0, 0, True)[3] == pytest.approx(0.2 + 0.001)


def test_an_empty_pass_has_no_linear_head_all_reduce_or_kv_part_only_its_fixed_costs() -> None:
    c = _coeffs()
    assert roofline.pass_parts(c, 0, 0, 0.0, 0.0, 0, True) == (0.0, 0.0, 0.0, 0.0, pytest.approx(1.1))
    assert roofline.pass_parts(c, 0, 0, 0.0, 0.0, -1, True)[2] == 0.0  # head < 0 scores every (no) token
    assert roofline.kv_read_s(c, 0.0) == 0.0 and roofline.kv_read_s(c, -1.0) == 0.0
    assert roofline.kv_read_s(_coeffs(v_half=0.0), 0.0) == 0.0  # (no ramp: 0 / 0 is never asked)
    one_gpu = _coeffs(ar_fixed_s=0.0, ar_tok_s=0.0)
    assert roofline.pass_parts(one_gpu, 40, 8, 0.0, 0.0, 0, False)[3] == 0.0


def test_the_kv_read_efficiency_climbs_from_small_to_large_reads() -> None:
    c = _coeffs(eta_lo=0.5, eta_span=0.4, v_half=1e4)
    assert roofline.kv_read_s(c, 100.0) == pytest.approx(1e4 * 1e-3 / (0.5 + 0.4 * 0.5))  # 1e4 bytes: halfway
    assert roofline.kv_bytes_s(c, 3e4) == pytest.approx(3e4 * 1e-3 / (0.5 + 0.4 * 0.75))
