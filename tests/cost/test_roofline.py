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
