"""Analytic step-latency model of one forward pass (docs/design.md, "Cost model"), calibrated in ``calibration.py``.

For a pass with N = Σq_i tokens over S sequences on ``tp`` GPUs (all quantities per GPU, i.e. divided by tp):

- **linear layers** (QKV, O, gated MLP): a smooth roofline ``t = (t_mem^p + t_comp^p)^(1/p)`` with ``t_mem = weight
  bytes / (BW · mem_efficiency)`` and ``t_comp = 2 · P_linear · N / (peak · compute_efficiency)``. It stays flat
  while the weights dominate and bends into the compute line around N ≈ the AdaServe budget; the exponent p
  (``knee_sharpness``) sets how round the knee is. Fitted to Vidur's linear-layer profiles (docs/calibration.md tables),
  one parameter set per GPU.
- **attention**: decode/verify passes read ``kv_read_tokens`` tokens of KV. The bandwidth they reach grows with how
  much they read: ``kv_efficiency`` of peak for a small read, approaching ``kv_efficiency_large`` for a large batch ×
  context, ``η(V) = η_small + (η_large − η_small) · V / (V + V_half)`` with V the bytes read per GPU and V_half =
  layers · peak BW · ``kv_ramp_us`` (a per-layer kernel reads V / layers). Queries cost ``4 · layers · heads ·
  head_dim`` FLOPs per query-key pair (QKᵀ and PV) at compute efficiency: a decode/verify pass takes the larger of
  its KV read and its ``query_pairs`` compute (a roofline: a tree of many queries per sequence can be compute-bound),
  prefill chunks add their causal pairs.
- **LM head**: the same roofline over ``vocab · hidden`` weights for the scored tokens (prefill: last token only).
- **tensor parallelism**: two ring all-reduces per layer of N · hidden · dtype bytes: ``2 (tp−1)/tp · bytes /
  interconnect + latency`` each (Megatron-LM, Shoeybi et al. 2019, §3).
- **fixed costs**: per pass, per layer (eager kernel launches, or the lower CUDA-graph replay cost when the pass is
  decode-only) and per sequence (CPU-side bookkeeping and sampling), as in Vidur (Agrawal et al., MLSys 2024) and
  the vLLM fits quoted in docs/calibration.md.

How the *engine* turns a step into passes (batch expansion, which passes replay CUDA graphs, host-side speculation
costs) is not here: :mod:`repro.cost.step` builds the shapes under the run's :class:`~repro.cost.serving.EngineProfile`
(``CostModel.engine``), and this module prices them.

The draft model is the same formula on the draft architecture (and its own GPU, if given); an EAGLE head is one
decoder layer at the target's width plus its fc layer, with the target's LM head, on the target's GPUs.
``forward_s`` is the engine's hot path: pure scalar arithmetic over coefficients precomputed in ``__init__``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal, Protocol

import numpy as np

from repro.cost import remembered
from repro.cost.roofline import Coeffs, coefficients, kv_bytes_s, kv_read_s, overhead_s, pass_parts, stream_s
from repro.cost.serving import DraftKvLayout, EngineProfile
from repro.cost.spec import HardwareSpec, ModelSpec

Which = Literal["target", "draft", "eagle"]
__all__ = ["CostModel", "DraftKvLayout", "EngineProfile", "ForwardCost", "ForwardShape", "Which"]
GiB = 2**30


@dataclass(frozen=True, slots=True)
class ForwardShape:
    """What one forward pass computes (see the module docstring for how each field is charged)."""

    num_tokens: int  # Σ q_i: tokens through the linear layers this pass
    num_seqs: int  # sequences in the pass
    kv_read_tokens: float = 0.0  # Σ of the KV each sequence reads: a decode/verify query's context (cached + new),
    # a prefill chunk's cached prefix; batch expansion reads a sequence's context once per expanded query
    prefill_attn_pairs: float = 0.0  # Σ over prefill chunks of q_i·(c_i + (q_i+1)/2): causal query-key pairs
    lm_head_tokens: int = -1  # tokens scored by the LM head; -1 = num_tokens
    decode_only: bool = False  # the pass replays CUDA graphs (lower per-layer launch cost); the engine decides
    query_pairs: float = 0.0  # Σ over decode/verify sequences of queries × keys (compute side of their attention)
    # the prefill chunks' share of the pass (a step mixing prefill with decodes: a measured profile prices the two
    # parts from its own rows, :meth:`repro.cost.profile.ProfileCostModel.mixed_s`; the analytic terms need no split)
    prefill_tokens: int = 0
    prefill_seqs: int = 0
    prefill_cached: float = 0.0  # the chunks' cached prefix, within kv_read_tokens


@dataclass(frozen=True, slots=True)
class ForwardCost:
    """Seconds per component of one forward pass."""

    linear_s: float
    attention_s: float
    lm_head_s: float
    allreduce_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.lm_head_s + self.allreduce_s + self.overhead_s


_FIXED_CACHE = 1 << 16  # shapes whose fixed parts a cost model keeps


class TargetProfile(Protocol):
    """Measured latencies of the target's passes (:class:`repro.cost.profile.ProfileCostModel`)."""

    def forward_s(self, num_tokens: int, num_seqs: int, kv_read_tokens: float = 0.0) -> float: ...

    def forward(self, shape: ForwardShape, which: str = "target") -> ForwardCost: ...


class CostModel:
    """Step latencies of the target, its draft model or EAGLE head, plus memory and transfer costs.

    ``tp`` GPUs of ``hardware`` hold the target; the draft runs on ``draft_hardware`` (default: the target's GPU,
    sharing its memory) with ``draft_tp`` GPUs. ``activation_reserve_gb`` (GiB per GPU) is kept free for activations
    and the CUDA graphs' workspace (vLLM's profiling run reserves a similar amount). ``engine`` is the serving
    engine's profile (default: an ideal multi-query engine with CUDA graphs everywhere and no host costs).
    ``target_profile`` (``cost=profile``): the target's passes are read from a measured profile table instead of the
    roofline (its whole latency is reported as ``linear_s``), and ``draft_profile`` the draft model's passes likewise;
    the EAGLE head, memory and transfers stay analytic.
    """

    def __init__(
        self,
        hardware: HardwareSpec,
        model: ModelSpec,
        tp: int = 1,
        draft: ModelSpec | None = None,
        draft_hardware: HardwareSpec | None = None,
        draft_tp: int = 1,
        gpu_memory_utilization: float = 0.9,
        activation_reserve_gb: float = 2.0,
        engine: EngineProfile | None = None,
        target_profile: TargetProfile | None = None,
        draft_profile: TargetProfile | None = None,
    ) -> None:
        if tp < 1 or draft_tp < 1:
            raise ValueError("tp and draft_tp must be ≥ 1")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must lie in (0, 1]")
        self.hardware = hardware
        self.model = model
        self.tp = tp
        self.draft = draft
        self.draft_hardware = draft_hardware
        self.draft_tp = draft_tp
        self.gpu_memory_utilization = gpu_memory_utilization
        self.activation_reserve_gb = activation_reserve_gb
        self.engine = engine if engine is not None else EngineProfile()
        self.target_profile = target_profile  # measured target passes (cost=profile) in place of the roofline
        self.draft_profile = draft_profile  # measured draft-model passes (cost=profile cost.draft_table)
        self._profiles = {k: v for k, v in (("target", target_profile), ("draft", draft_profile)) if v is not None}
        self._eagle = draft if draft is not None and draft.kind == "eagle_head" else model.eagle_head()
        self._coeffs: dict[str, Coeffs] = {
            "target": coefficients(hardware, model, tp, self.engine.graph_sizes),
            "eagle": coefficients(hardware, self._eagle, tp, self.engine.graph_sizes),
        }
        if draft is not None:  # a remote draft server is another engine: it pads on its own (not modelled)
            self._coeffs["draft"] = coefficients(draft_hardware or hardware, draft, draft_tp,
                                                 self.engine.graph_sizes if draft_hardware is None else ())
        # forward_s_many's parts that do not depend on the KV read, by (which, tokens, sequences, head, graphs)
        self._fixed_parts: dict[tuple[str, int, int, int, bool], tuple[float, float, float, float]] = {}
        self._row_consts: dict[tuple[str, ...], SimpleNamespace] = {}  # forward_s_rows: each row's constants
        self._fingerprint = remembered.fingerprint(self)  # what remember() shares values by

    def remember(self, key: Hashable, compute: Callable[[], remembered.T]) -> remembered.T:
        """``compute()`` (of this model and ``key``) once per process for equal models (:mod:`.remembered`)."""
        return remembered.remember(self._fingerprint, key, compute)

    def _c(self, which: str) -> Coeffs:
        try:
            return self._coeffs[which]
        except KeyError:
            raise ValueError(
                f"which={which!r}: expected 'target', 'eagle' or (with a draft) 'draft'"
            ) from None

    def forward(self, shape: ForwardShape, which: Which = "target") -> ForwardCost:
        """Cost of one forward pass of the target, the draft model or the EAGLE head."""
        if (
            shape.num_tokens < 0
            or shape.num_seqs < 0
            or shape.kv_read_tokens < 0
            or shape.prefill_attn_pairs < 0
            or shape.query_pairs < 0
        ):
            raise ValueError(f"negative quantity in {shape}")
        if which in self._profiles:  # a measured profile prices the pass (mixed prefill and decodes included)
            return self._profiles[which].forward(shape, which)
        linear, lm_head, allreduce, overhead = self._fixed(which, shape.num_tokens, shape.num_seqs,
                                                           shape.lm_head_tokens, shape.decode_only)
        c = self._coeffs[which]
        attention = max(kv_read_s(c, shape.kv_read_tokens), c.pair_s * shape.query_pairs) \
            + c.pair_s * shape.prefill_attn_pairs
        return ForwardCost(linear, attention, lm_head, allreduce, overhead)  # pass_parts', fixed ones once a shape

    def forward_s(
        self,
        num_tokens: int,
        num_seqs: int,
        kv_read_tokens: float = 0.0,
        prefill_attn_pairs: float = 0.0,
        lm_head_tokens: int = -1,
        decode_only: bool = False,
        query_pairs: float = 0.0,
        which: Which = "target",
    ) -> float:
        """``forward(ForwardShape(...), which).total_s`` without building objects (the engine's hot path)."""
        if self._profiles and which in self._profiles:
            return self._profiles[which].forward_s(num_tokens, num_seqs, kv_read_tokens)
        # pass_parts' terms, in its order, its fixed ones worked out once per shape
        linear, lm_head, allreduce, overhead = self._fixed(which, num_tokens, num_seqs, lm_head_tokens, decode_only)
        c = self._coeffs[which]
        attention = max(kv_read_s(c, kv_read_tokens), c.pair_s * query_pairs) + c.pair_s * prefill_attn_pairs
        return linear + attention + lm_head + allreduce + overhead

    def pass_s(self, num_tokens: int, num_seqs: int, kv_read_tokens: float, prefill_attn_pairs: float,
               lm_head_tokens: int, decode_only: bool, query_pairs: float, prefill_tokens: int = 0,
               prefill_seqs: int = 0, prefill_cached: float = 0.0) -> float:
        """``forward(ForwardShape(...)).total_s`` of the target (the arguments are the shape's fields in order): the
        same sum, built from no objects unless a measured profile prices the pass (it reads the prefill split)."""
        if self._profiles and "target" in self._profiles:
            return self.forward(ForwardShape(num_tokens, num_seqs, kv_read_tokens, prefill_attn_pairs, lm_head_tokens,
                                             decode_only, query_pairs, prefill_tokens, prefill_seqs,
                                             prefill_cached)).total_s
        return self.forward_s(num_tokens, num_seqs, kv_read_tokens, prefill_attn_pairs, lm_head_tokens, decode_only,
                              query_pairs)

    def draft_steps_s(self, total: float, num_tokens: int, n: int, csum: float, last: int,
                      which: Which = "draft") -> float:
        """``total`` plus :meth:`forward_s` ``(num_tokens, n, csum + j * n, decode_only=True)`` for j = 2..``last``,
        added one at a time: draft steps 2..D of ``n`` chains (``num_tokens`` = n) or beams (n·w) whose contexts sum
        to ``csum`` (the engine's draft pass, AdaServe's estimate of it). The same terms in the same order, bit for
        bit, the pass's fixed parts looked up once."""
        if self._profiles and which in self._profiles:
            for j in range(2, last + 1):
                total += self.forward_s(num_tokens, n, kv_read_tokens=csum + j * n, decode_only=True, which=which)
            return total
        linear, lm_head, allreduce, overhead = self._fixed(which, num_tokens, n, -1, True)
        c = self._coeffs[which]
        no_pairs = c.pair_s * 0.0  # forward_s's query and prefill pairs
        for j in range(2, last + 1):
            attention = max(kv_read_s(c, csum + j * n), no_pairs) + no_pairs
            total += linear + attention + lm_head + allreduce + overhead
        return total

    def forward_s_many(self, num_tokens: int, num_seqs: int, kv_read_tokens: np.ndarray,
                       query_pairs: np.ndarray | float = 0.0, lm_head_tokens: int = -1, decode_only: bool = False,
                       which: Which = "target") -> np.ndarray:
        """:meth:`forward_s` of passes differing only in KV read and query pairs, one per ``kv_read_tokens`` entry.

        No prefill pairs. Each value equals ``forward_s``'s bit for bit (same operations, same order, elementwise);
        for the engine's runs of repeated steps.
        """
        kv = np.asarray(kv_read_tokens, dtype=np.float64)
        if self._profiles and which in self._profiles:
            qp = np.broadcast_to(np.asarray(query_pairs, dtype=np.float64), kv.shape)
            return np.array([self.forward_s(num_tokens, num_seqs, x, 0.0, lm_head_tokens, decode_only, q, which)
                             for x, q in zip(kv.ravel().tolist(), qp.ravel().tolist(), strict=True)]).reshape(kv.shape)
        linear, lm_head, allreduce, overhead = self._fixed(which, num_tokens, num_seqs, lm_head_tokens, decode_only)
        c = self._c(which)
        return linear + self._attention(c, kv, query_pairs, c.v_half > 0.0) + lm_head + allreduce + overhead

    def forward_s_blocks(self, shapes: Sequence[tuple[int, int, int, bool]], lengths: Sequence[int],
                         kv_read_tokens: np.ndarray, query_pairs: np.ndarray | float = 0.0,
                         which: Which = "target") -> np.ndarray:
        """:meth:`forward_s_many` of consecutive blocks of passes along the last axis of ``kv_read_tokens``.

        Block i is ``lengths[i]`` passes of shape ``shapes[i]`` = (num_tokens, num_seqs, lm_head_tokens, decode_only).
        Each value equals ``forward_s_many``'s for its block, bit for bit.
        """
        if len(shapes) == 1:
            tok, seqs, head, graphs = shapes[0]
            return self.forward_s_many(tok, seqs, kv_read_tokens, query_pairs, head, graphs, which)
        kv = np.asarray(kv_read_tokens, dtype=np.float64)
        if self._profiles and which in self._profiles:  # a measured profile: block by block
            qp = np.broadcast_to(np.asarray(query_pairs, dtype=np.float64), kv.shape)
            cuts = np.cumsum(lengths)[:-1].tolist()
            return np.concatenate([self.forward_s_many(tok, seqs, x, q, head, graphs, which)
                                   for (tok, seqs, head, graphs), x, q in zip(
                                       shapes, np.split(kv, cuts, axis=-1), np.split(qp, cuts, axis=-1), strict=True)],
                                  axis=-1)
        c = self._c(which)
        return self._passes_s(self._fixed_rows([(which, shapes)], lengths)[0], c, kv, query_pairs, c.v_half > 0.0)

    @staticmethod
    def _attention(c: Any, kv: np.ndarray, query_pairs: np.ndarray | float, v_half_positive: bool) -> np.ndarray:
        """Attention seconds of passes reading ``kv`` KV tokens with ``query_pairs``, elementwise, as ``_parts``.

        No prefill pairs. ``c`` holds the model's constants (for rows on several models, a column each);
        ``v_half_positive``: every model's V_half is positive.
        """
        if v_half_positive:
            read = kv_bytes_s(c, kv * c.kv_bytes)
        else:  # with V_half > 0 a read of 0 tokens prices at exactly 0.0 as kv_read_s has it
            with np.errstate(invalid="ignore"):
                read = np.where(kv > 0.0, kv_bytes_s(c, kv * c.kv_bytes), 0.0)
        # the prefill pairs' + 0.0 leaves a non-negative sum unchanged
        return np.maximum(read, c.pair_s * np.asarray(query_pairs, dtype=np.float64))

    def forward_s_rows(self, rows: Sequence[tuple[Which, Sequence[tuple[int, int, int, bool]]]],
                       lengths: Sequence[int], kv_read_tokens: np.ndarray,
                       query_pairs: np.ndarray) -> np.ndarray | None:
        """:meth:`forward_s_blocks` of several rows of passes at once; ``None`` if a row's model is a measured profile.

        Row ``r`` of ``kv_read_tokens`` and ``query_pairs`` (rows × passes) runs on model ``rows[r][0]`` with block
        shapes ``rows[r][1]``, block i ``lengths[i]`` passes long. Each value equals ``forward_s_many``'s for its
        block, bit for bit. On ``None``, price the rows one by one.
        """
        whichs = tuple(w for w, _ in rows)
        consts = self._row_consts.get(whichs)
        if consts is None:
            if any(w in self._profiles for w in whichs):
                return None
            cs = [self._c(w) for w in whichs]
            consts = self._row_consts[whichs] = SimpleNamespace(**{
                name: np.array([getattr(c, name) for c in cs])[:, None]
                for name in ("kv_bytes", "inv_bw", "eta_lo", "eta_span", "v_half", "pair_s")},
                v_half_positive=all(c.v_half > 0.0 for c in cs))
        return self._passes_s(self._fixed_rows(rows, lengths), consts, np.asarray(kv_read_tokens, dtype=np.float64),
                              query_pairs, consts.v_half_positive)

    def _fixed_rows(self, rows: Sequence[tuple[Which, Sequence[tuple[int, int, int, bool]]]],
                    lengths: Sequence[int]) -> np.ndarray:
        """Each pass's :meth:`_fixed` parts, rows × passes × (linear, lm_head, allreduce, overhead): block ``i`` of
        a row (``lengths[i]`` passes) has its shape's (each distinct row worked out once)."""
        distinct: dict[tuple[str, int], int] = {}
        parts: list[list[tuple[float, float, float, float]]] = []
        at: list[int] = []
        for which, shapes in rows:
            i = distinct.setdefault((which, id(shapes)), len(parts))
            if i == len(parts):
                parts.append([self._fixed(which, *shape) for shape in shapes])
            at.append(i)
        f = np.array(parts)
        if len(parts) < len(rows):
            f = f[at]
        return np.repeat(f, lengths, axis=1) if len(lengths) > 1 else f

    def _passes_s(self, fixed: np.ndarray, c: Any, kv: np.ndarray, query_pairs: np.ndarray | float,
                  v_half_positive: bool) -> np.ndarray:
        """``forward_s``'s total of passes whose fixed parts are ``fixed`` (… × (linear, lm_head, allreduce,
        overhead)), summed in its order: linear + attention + lm_head + allreduce + overhead."""
        attention = self._attention(c, kv, query_pairs, v_half_positive)
        return fixed[..., 0] + attention + fixed[..., 1] + fixed[..., 2] + fixed[..., 3]

    def _fixed(self, which: Which, num_tokens: int, num_seqs: int, lm_head_tokens: int,
               decode_only: bool) -> tuple[float, float, float, float]:
        """The parts of a pass that do not depend on its KV read: (linear, lm_head, allreduce, overhead)."""
        key = (which, num_tokens, num_seqs, lm_head_tokens, decode_only)
        fixed = self._fixed_parts.get(key)
        if fixed is None:
            if len(self._fixed_parts) >= _FIXED_CACHE:  # a long run of ever new prefill shapes: start afresh
                self._fixed_parts.clear()
            linear, _, lm_head, allreduce, overhead = pass_parts(self._c(which), num_tokens, num_seqs, 0.0, 0.0,
                                                             lm_head_tokens, decode_only, 0.0)
            fixed = self._fixed_parts[key] = (linear, lm_head, allreduce, overhead)
        return fixed

    def fixed_s(self, num_seqs: int, decode_only: bool, which: Which = "target") -> float:
        """The fixed costs of a pass over ``num_seqs`` sequences (:meth:`forward`'s ``overhead_s``: per pass, per
        layer and per sequence; 0 for a pass read from a measured profile, which has no parts)."""
        return 0.0 if which in self._profiles else overhead_s(self._c(which), num_seqs, decode_only)

    # ---- memory -------------------------------------------------------------------------------------------
    @property
    def _draft_colocated(self) -> bool:
        return self.draft is not None and self.draft_hardware is None

    def kv_bytes_per_token(self, include_draft: bool = False) -> float:
        """KV bytes per token of context for the whole model (all TP shards together), plus the draft's if asked."""
        extra = self.draft.kv_bytes_per_token if (include_draft and self.draft is not None) else 0
        return float(self.model.kv_bytes_per_token + extra)

    def profile_peak_bytes(self) -> float:
        """Peak activation bytes per GPU of vLLM's profiling run (``profile_run``): a forward pass of the target over
        ``engine.profile_tokens`` tokens, the drafter's over the same, then the sampler over ``engine.profile_seqs``
        sequences (at most one per token), one after another (the largest counts).

        A pass's peak is inside a decoder layer's MLP: the layer's input and residual (2 · hidden) and the gate/up
        projection's output with its activation (3 · intermediate, split over tp) for every token, in the model's
        dtype; the attention block's intermediates are smaller for these models. The sampler's phase keeps the pass's
        hidden states and holds ``engine.sampler_bytes`` per sequence and vocabulary entry (the full-vocabulary sort
        of top-k/top-p, V1's ``_dummy_sampler_run`` and v0's ``profile_run`` alike), plus
        ``engine.rejection_sampler_bytes`` where the run speculates (V1's rejection sampler's dummy pass).
        """
        prof = self.engine
        tokens, seqs = prof.profile_tokens, min(prof.profile_seqs, prof.profile_tokens)

        def pass_bytes(m: ModelSpec, tp: int) -> float:
            return float(tokens * (2 * m.hidden_size + 3 * m.intermediate_size / tp) * m.dtype_bytes)

        peak = pass_bytes(self.model, self.tp)
        if self.draft is not None and self._draft_colocated:
            peak = max(peak, pass_bytes(self.draft, self.tp))
        per_logit = prof.sampler_bytes + (prof.rejection_sampler_bytes if prof.profile_speculative else 0.0)
        sampler = tokens * self.model.hidden_size * self.model.dtype_bytes + seqs * self.model.vocab_size * per_logit
        return max(peak, sampler)

    def non_kv_bytes(self, draft_resident: bool = True) -> dict[str, float]:
        """What the engine's start-up leaves outside the KV cache, per GPU, in bytes, by part (engine profile's
        ``kv_accounting``, :mod:`repro.cost.serving`): ``weights`` (the target's shard, and a co-located draft model's
        or EAGLE head's), ``activations`` (the flat reserve, or the profiling run's peak), ``cuda_graphs`` and
        ``non_torch``."""
        prof = self.engine
        weights = self.model.weight_bytes / self.tp
        draft = self.resident_draft(draft_resident)
        if draft is not None:
            weights += draft.weight_bytes / self.tp
        if prof.kv_accounting == "reserve":
            return {"weights": weights, "activations": self.activation_reserve_gb * GiB, "cuda_graphs": 0.0,
                    "non_torch": 0.0}
        return {"weights": weights, "activations": self.profile_peak_bytes(), "cuda_graphs": prof.cuda_graph_gib * GiB,
                "non_torch": prof.non_torch_gib * GiB}

    def resident_draft(self, draft_resident: bool) -> ModelSpec | None:
        """The co-located draft whose weights and KV take GPU memory: a draft model the system keeps resident, or
        (vLLM V1's start-up, ``kv_accounting: profile_run``) an EAGLE head configured as the draft, which the
        engine always loads and whose layer is one more layer of the KV cache."""
        if not self._draft_colocated or self.draft is None:
            return None
        if draft_resident:
            return self.draft
        if self.draft.kind == "eagle_head" and self.engine.kv_accounting == "profile_run":
            return self.draft
        return None

    def kv_capacity_blocks(self, draft_resident: bool = True, block_size: int = 16,
                           layout: DraftKvLayout | None = None) -> int:
        """KV blocks of ``block_size`` tokens that fit: tp · (memory · utilization − :meth:`non_kv_bytes`).

        A co-located, resident draft takes its weights and its own KV per token, by ``layout`` (default: the engine
        profile's ``draft_kv_layout``):

        - ``spread``: the draft's weights and KV are spread over the tp GPUs like the target's (one pool; vLLM V1:
          the draft's layers are more layers of one KV cache spec, ``num_blocks = available // (page size · layers)``);
        - ``vllm_v0``: vLLM v0's speculative decoding (0.5–0.6, TurboSpec's base; docs/calibration.md): the draft runs
          on the driver GPU (draft TP 1), and ``split_num_cache_blocks_evenly`` gives draft and target the same
          number of blocks, sized so both fit in what the target alone would have had on that GPU. The driver
          GPU, which also holds the draft's weights, bounds the pool: blocks = (free memory of the driver GPU) /
          (block · (target KV per token per GPU + draft KV per token)). At tp = 1 both layouts agree.

        A draft on other GPUs (``draft_hardware``) takes nothing here.
        """
        draft = self.resident_draft(draft_resident)
        if layout is None:
            layout = self.engine.draft_kv_layout
        if layout not in ("spread", "vllm_v0"):
            raise ValueError(f"layout must be 'spread' or 'vllm_v0', not {layout!r}")
        parts = self.non_kv_bytes(draft_resident)
        requested = self.hardware.memory_bytes * self.gpu_memory_utilization  # per GPU
        if self.engine.kv_accounting == "profile_run":  # vLLM's requested_memory: ceil(total x utilization) bytes
            requested = float(math.ceil(requested))
        if layout == "vllm_v0" and draft is not None:
            free_driver = (requested
                           - self.model.weight_bytes / self.tp - draft.weight_bytes
                           - (parts["activations"] + parts["cuda_graphs"] + parts["non_torch"]))
            per_block = block_size * (self.model.kv_bytes_per_token / self.tp + draft.kv_bytes_per_token)
            return max(0, int(free_driver // per_block))
        free = (
            self.tp * requested
            - self.model.weight_bytes
            - (draft.weight_bytes if draft is not None else 0)
            - self.tp * (parts["activations"] + parts["cuda_graphs"] + parts["non_torch"])
        )
        extra = draft.kv_bytes_per_token if draft is not None else 0
        per_block = block_size * float(self.model.kv_bytes_per_token + extra)
        return max(0, int(free // per_block))

    def swap_s(self, num_tokens: int, draft_tokens: int = 0) -> float:
        """Seconds to move the KV of ``num_tokens`` tokens between GPU and host, one direction.

        The target's shards move over the tp links in parallel. ``draft_tokens`` of a co-located draft's KV move too,
        under the vLLM v0 layout over the driver GPU's link, which then bounds the transfer.
        """
        link = self.hardware.host_link_gbs * 1e9
        target = num_tokens * self.model.kv_bytes_per_token / self.tp
        draft = draft_tokens * self.draft.kv_bytes_per_token if (draft_tokens and self._draft_colocated
                                                                 and self.draft is not None) else 0.0
        if self.engine.draft_kv_layout == "vllm_v0":
            return (target + draft) / link  # the driver GPU moves its target shard and the whole draft KV
        return (target + draft / self.tp) / link

    def draft_transfer_s(self) -> float:
        """Move the draft's weights over the host link (offload or reload), its draft_tp links in parallel."""
        if self.draft is None:
            raise ValueError("draft_transfer_s: this cost model has no draft")
        hw = self.draft_hardware or self.hardware
        return self.draft.weight_bytes / (self.draft_tp * hw.host_link_gbs * 1e9)

    def kv_migrate_s(self, blocks: int, block_size: int = 16) -> float:
        """Seconds to copy ``blocks`` target KV blocks to other GPU slots (Nightjar §5.3's contraction).

        A vectorized kernel reads and writes each block once, each GPU its shard in parallel, at the hardware's
        weight-streaming efficiency, plus one kernel launch.
        """
        if blocks <= 0:
            return 0.0
        hw = self.hardware
        nbytes = 2.0 * blocks * block_size * self.model.kv_bytes_per_token / self.tp
        return stream_s(hw, nbytes) + hw.step_overhead_s

    def pld_s(self, num_seqs: int) -> float:
        """Prompt-lookup proposer: CPU n-gram matching, per step plus per sequence (TurboSpec §7.1: ≈ 5 %)."""
        return self.hardware.pld_step_s + self.hardware.pld_request_s * num_seqs

    def spec_round_s(self) -> float:
        """Host-side cost of one speculation round of a draft model or EAGLE head (preparing the proposer's
        inputs, sampling its tokens, assembling the proposals), charged once per step that speculates; hidden behind
        the GPU's pass under async scheduling (:mod:`repro.cost.serving`)."""
        hidden = self.engine.async_scheduling or not self.engine.spec_round  # overlapped, or inside measured passes
        return 0.0 if hidden else self.hardware.spec_round_overhead_s

    def draft_broadcast_s(self) -> float:
        """Host seconds a step spends broadcasting a TP-1 draft model's proposals from the driver to the target's
        other ranks (``EngineProfile.draft_broadcast_s``; 0 at tp 1, with a draft at the target's tp, or off the
        target's GPUs)."""
        if self.tp > 1 and self.draft_tp == 1 and self._draft_colocated:
            return self.engine.draft_broadcast_s
        return 0.0

    @property
    def budget_tokens(self) -> int:
        """AdaServe's per-step token budget B for this GPU (AdaServe Table 1)."""
        return self.hardware.adaserve_budget

