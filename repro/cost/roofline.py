"""The roofline formulas of :mod:`repro.cost.model` (its module docstring): each (model, GPU, tp)'s constants
(:class:`Coeffs`) and one pass's parts, linear, attention, LM head, all-reduce and fixed overheads
(:func:`pass_parts`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from repro.cost.spec import HardwareSpec, ModelSpec


@dataclass(frozen=True, slots=True)
class Coeffs:
    """Per-model, per-GPU constants of the formulas (seconds, or seconds per unit)."""

    lin_mem_s: float  # linear weights streamed once
    lin_tok_s: float  # compute seconds per token through the linear layers
    head_mem_s: float  # LM-head weights streamed once
    head_tok_s: float  # compute seconds per scored token
    p: float
    inv_p: float
    kv_bytes: float  # KV bytes per token per GPU
    inv_bw: float  # seconds per byte at peak bandwidth
    eta_lo: float  # KV-read efficiency of a small read
    eta_span: float  # kv_efficiency_large - kv_efficiency
    v_half: float  # bytes per GPU (all layers) at which the efficiency is halfway
    pair_s: float  # seconds per causal query-key pair of prefill attention
    ar_fixed_s: float  # all-reduce latency, all layers
    ar_tok_s: float  # all-reduce seconds per token, all layers
    step_s: float
    layers_eager_s: float
    layers_graph_s: float
    req_s: float
    graph_pad: tuple[int, ...] = ()  # [n]: tokens a CUDA-graph pass of n tokens runs (EngineProfile.graph_sizes)


def _graph_pad(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """``pad[n]`` = the smallest capture size ≥ n, for n up to the largest size (empty: no padding)."""
    if not sizes:
        return ()
    pad = [0] * (sizes[-1] + 1)
    i = 0
    for n in range(1, sizes[-1] + 1):
        while sizes[i] < n:
            i += 1
        pad[n] = sizes[i]
    return tuple(pad)


def stream_s(hw: HardwareSpec, nbytes: float) -> float:
    """Seconds to stream one weight matrix of ``nbytes`` (one GPU's shard) at the efficiency a matrix of its size
    reaches: ``mem_efficiency`` for a small one, approaching ``mem_efficiency_large`` past ``mem_ramp_us`` of
    streaming at peak (:class:`~repro.cost.spec.HardwareSpec`)."""
    bw = hw.bytes_per_s
    lo = hw.mem_efficiency
    hi = hw.mem_efficiency_large if hw.mem_efficiency_large is not None else lo
    half = hw.mem_ramp_us * 1e-6 * bw
    eff = lo + (hi - lo) * nbytes / (nbytes + half) if half > 0.0 else lo
    return nbytes / (bw * eff)


def linear_stream_s(hw: HardwareSpec, m: ModelSpec, tp: int) -> float:
    """Seconds to stream the decoder stack's linear weights once (one GPU's shard), matrix by matrix."""
    wb = m.linear_weight_bytes
    if hw.mem_ramp_us == 0.0 or hw.mem_efficiency_large == hw.mem_efficiency:  # one efficiency for every matrix
        return m.linear_params * wb / tp / (hw.bytes_per_s * hw.mem_efficiency)
    total = m.num_layers * sum(stream_s(hw, p * wb / tp) for p in m.layer_matrices)
    return total + (stream_s(hw, m.fc_params * wb / tp) if m.fc_params else 0.0)


def coefficients(hw: HardwareSpec, m: ModelSpec, tp: int, graph_sizes: tuple[int, ...] = ()) -> Coeffs:
    bw, peak, b = hw.bytes_per_s, hw.flops_per_s, m.dtype_bytes
    ar_bytes_tok = 2 * (tp - 1) / tp * m.hidden_size * b  # ring all-reduce traffic per token, per all-reduce
    n_ar = 2 * m.num_layers if tp > 1 else 0  # after attention and after the MLP (Megatron-LM §3)
    n_launch_layers = m.num_layers + (
        1 if m.kind == "eagle_head" else 0
    )  # fc counts as one more layer of launches
    return Coeffs(
        lin_mem_s=linear_stream_s(hw, m, tp),
        lin_tok_s=2 * m.linear_params / tp / (peak * hw.compute_efficiency),
        head_mem_s=stream_s(hw, m.lm_head_params * b / tp),
        head_tok_s=2 * m.lm_head_params / tp / (peak * hw.compute_efficiency),
        p=hw.knee_sharpness,
        inv_p=1.0 / hw.knee_sharpness,
        kv_bytes=m.kv_bytes_per_token / tp,
        inv_bw=1.0 / bw,
        eta_lo=hw.kv_efficiency,
        eta_span=hw.kv_efficiency_large - hw.kv_efficiency,
        v_half=m.num_layers * bw * hw.kv_ramp_us * 1e-6,
        pair_s=4 * m.num_layers * m.num_heads * m.hd / tp / (peak * hw.compute_efficiency),
        ar_fixed_s=n_ar * hw.allreduce_latency_s,
        ar_tok_s=n_ar * ar_bytes_tok / (hw.interconnect_gbs * 1e9),
        step_s=hw.step_overhead_s,
        layers_eager_s=n_launch_layers * hw.layer_overhead_eager_s,
        layers_graph_s=n_launch_layers * hw.layer_overhead_graph_s,
        req_s=hw.request_overhead_s,
        graph_pad=_graph_pad(graph_sizes),
    )


def kv_bytes_s(c: Coeffs, v: Any) -> Any:
    """Seconds to read ``v`` > 0 bytes of KV at η(V) of peak bandwidth (module docstring).

    A float, or elementwise an array (the same operations in the same order either way).
    """
    return v * c.inv_bw / (c.eta_lo + c.eta_span * v / (v + c.v_half))


def kv_read_s(c: Coeffs, tokens: float) -> float:
    """Seconds to read ``tokens`` tokens of KV."""
    return kv_bytes_s(c, tokens * c.kv_bytes) if tokens > 0.0 else 0.0


def overhead_s(c: Coeffs, s: int, decode_only: bool) -> float:
    """Fixed costs of a pass over ``s`` sequences: per pass, per layer (CUDA graphs or eager) and per sequence."""
    return c.step_s + (c.layers_graph_s if decode_only else c.layers_eager_s) + c.req_s * s


def pass_parts(
    c: Coeffs, n: int, s: int, kv: float, pairs: float, head: int, decode_only: bool, qpairs: float = 0.0
) -> tuple[float, float, float, float, float]:
    """(linear, attention, lm_head, allreduce, overhead) seconds: the whole model in a few lines."""
    if head < 0:
        head = n
    p, ip = c.p, c.inv_p
    if decode_only and 0 < n < len(c.graph_pad):  # a CUDA-graph pass runs at its capture size
        n = c.graph_pad[n]
    linear = (c.lin_mem_s**p + (c.lin_tok_s * n) ** p) ** ip if n > 0 else 0.0
    lm_head = (c.head_mem_s**p + (c.head_tok_s * head) ** p) ** ip if head > 0 else 0.0
    allreduce = c.ar_fixed_s + c.ar_tok_s * n if (n > 0 and c.ar_fixed_s > 0) else 0.0
    overhead = overhead_s(c, s, decode_only)
    attention = max(kv_read_s(c, kv), c.pair_s * qpairs) + c.pair_s * pairs
    return linear, attention, lm_head, allreduce, overhead
