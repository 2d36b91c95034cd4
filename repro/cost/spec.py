"""Hardware and model specifications: frozen value objects built from ``conf/hardware/*.yaml`` and
``conf/model/*.yaml``.

A YAML file is flat ``key: value`` data whose keys are exactly the dataclass fields, so ``HardwareSpec(**cfg)`` fails
at once on an unknown or missing key. Every number in the YAML cites its source in a comment (vendor data sheets,
HuggingFace ``config.json`` files, and the fits documented in ``docs/calibration.md``).

Units: ``*_tflops`` in 1e12 FLOP/s, ``*_gbs`` in 1e9 bytes/s, ``memory_gb`` in GiB (what ``nvidia-smi`` reports for
an "80 GB" part is 80 GiB), ``*_s`` in seconds, ``*_us`` in microseconds.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

import yaml

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

ModelKind = Literal["decoder", "eagle_head"]
Tokenizer = Literal["llama2", "llama3", "qwen"]


class UnknownSpecError(KeyError):
    """An unknown hardware or model id; the message lists the valid ids."""

    def __str__(self) -> str:  # KeyError quotes its argument; show the plain message instead
        return str(self.args[0]) if self.args else ""


def _to_dict(cfg: Mapping[str, Any] | Any) -> dict[str, Any]:
    """A plain dict from a dict or an OmegaConf ``DictConfig`` (Hydra hands the engine ``cfg.hardware``)."""
    if isinstance(cfg, Mapping):
        return dict(cfg)
    from omegaconf import OmegaConf  # only needed for DictConfig inputs

    out = OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(out, dict):
        raise TypeError(f"expected a mapping config, got {type(cfg).__name__}")
    return {str(k): v for k, v in out.items()}


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One GPU (and its host) as the cost model sees it; every parameter is shared by all models on it.

    Physical meaning of the efficiency parameters (see ``repro.cost.model``):
        mem_efficiency       fraction of ``mem_bw_gbs`` that weight-streaming GEMMs reach (Vidur: ≈ 0.64–0.73)
        compute_efficiency   fraction of ``peak_tflops`` that large GEMMs reach (prefill: ≈ 0.65–0.73)
        knee_sharpness       p of the smooth roofline t = (t_mem^p + t_comp^p)^(1/p); large p → sharp max()
        kv_efficiency        fraction of bandwidth that decode attention reaches reading a small KV cache (≈ 0.5)
        kv_efficiency_large  ... and over a large batch × context (FlashInfer: ≈ 0.85-0.9)
        kv_ramp_us           per layer, the KV read (as µs at peak bandwidth) at which the efficiency is halfway
        allreduce_latency_s  fixed latency of one NCCL all-reduce
        step_overhead_s      per forward pass: scheduling, input preparation, sampling launch
        layer_overhead_eager_s / layer_overhead_graph_s   per decoder layer: kernel launches without / with
                             CUDA graphs (graphs are only used for decode-only passes)
        request_overhead_s   per sequence in the pass: CPU-side metadata, sampling, detokenization
        pld_step_s, pld_request_s   prompt-lookup proposer CPU cost per step and per sequence
        spec_round_overhead_s       host CPU cost of one speculation round of a model-based proposer
    """

    name: str
    peak_tflops: float
    mem_bw_gbs: float
    memory_gb: float
    interconnect_gbs: float
    host_link_gbs: float
    adaserve_budget: int
    mem_efficiency: float
    compute_efficiency: float
    knee_sharpness: float
    kv_efficiency: float
    kv_efficiency_large: float
    kv_ramp_us: float
    allreduce_latency_s: float
    step_overhead_s: float
    layer_overhead_eager_s: float
    layer_overhead_graph_s: float
    request_overhead_s: float
    pld_step_s: float
    pld_request_s: float
    spec_round_overhead_s: float
    mem_efficiency_large: float | None = None
    mem_ramp_us: float = 0.0

    def __post_init__(self) -> None:
        if self.mem_efficiency_large is None:
            object.__setattr__(self, "mem_efficiency_large", self.mem_efficiency)
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "name" and not (isinstance(v, int | float) and v >= 0):
                raise ValueError(f"hardware {self.name!r}: {f.name} must be a non-negative number, got {v!r}")
        for key in ("mem_efficiency", "mem_efficiency_large", "compute_efficiency", "kv_efficiency",
                    "kv_efficiency_large"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise ValueError(f"hardware {self.name!r}: {key} must lie in (0, 1]")
        if self.knee_sharpness < 1.0:
            raise ValueError(f"hardware {self.name!r}: knee_sharpness must be ≥ 1")

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any] | Any) -> HardwareSpec:
        """Build from a dict or a Hydra/OmegaConf node (unknown keys raise ``TypeError``)."""
        return cls(**_to_dict(cfg))

    @property
    def bytes_per_s(self) -> float:
        return self.mem_bw_gbs * 1e9

    @property
    def flops_per_s(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 2**30


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer (Llama/Qwen family: gated SiLU MLP, GQA) or an EAGLE draft head.

    An ``eagle_head`` is EAGLE's one decoder layer at the target's width plus the ``fc`` layer fusing the target's
    feature with the token embedding (2·hidden → hidden); it shares the target's embedding and LM head
    (Li et al., "EAGLE", ICML 2024, §4), so none of those count towards its own weights. EAGLE-3 (Li et al.,
    arXiv 2503.01840) fuses three of the target's hidden states (``fc_inputs: 3``: 3·hidden → hidden), its layer's
    QKV reads the token embedding and the fused feature side by side (``qkv_inputs: 2``; vLLM's ``llama_eagle3.py``),
    and it drafts over its own smaller vocabulary (``draft_vocab_size``): its LM head is that wide and is its own
    weight. A head that ships its own embedding (``own_embedding``; vLLM's ``eagle.py`` keeps it when it differs from
    the target's) holds it in memory too; a lookup reads one row a token, so no pass streams it.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_context: int
    tokenizer: Tokenizer
    head_dim: int | None = None
    dtype_bytes: int = 2
    weight_bits: int | None = None
    tie_embeddings: bool = False
    kind: ModelKind = "decoder"
    source: str = ""
    fc_inputs: int = 2  # EAGLE's fc: hidden-size inputs it fuses (EAGLE-1/2: feature + embedding = 2; EAGLE-3: 3)
    draft_vocab_size: int | None = None  # an EAGLE-3 head's own draft vocabulary (its LM head); None: vocab_size
    qkv_inputs: int = 1  # hidden-size inputs of the first layer's QKV (EAGLE-3: the embedding and the fused feature, 2)
    own_embedding: bool = False  # an EAGLE head that keeps its own token embedding (vLLM loads it when it differs)

    def __post_init__(self) -> None:
        if self.kind not in ("decoder", "eagle_head"):
            raise ValueError(
                f"model {self.name!r}: kind must be 'decoder' or 'eagle_head', got {self.kind!r}"
            )
        if self.tokenizer not in ("llama2", "llama3", "qwen"):
            raise ValueError(f"model {self.name!r}: unknown tokenizer family {self.tokenizer!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model {self.name!r}: num_heads must be a multiple of num_kv_heads")
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.kind == "decoder" and (self.qkv_inputs != 1 or self.own_embedding):
            raise ValueError(f"model {self.name!r}: qkv_inputs and own_embedding describe an EAGLE head")

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any] | Any) -> ModelSpec:
        """Build from a dict or a Hydra/OmegaConf node (unknown keys raise ``TypeError``)."""
        return cls(**_to_dict(cfg))

    @property
    def hd(self) -> int:
        """Head dimension (``head_dim`` resolved)."""
        assert self.head_dim is not None
        return self.head_dim

    @property
    def layer_linear_params(self) -> int:
        """QKV + O + gate/up/down parameters of one decoder layer (biases and norms are negligible; an EAGLE-3
        head's one layer with its wider QKV)."""
        return sum(self.layer_matrices)

    @property
    def fc_params(self) -> int:
        """EAGLE's feature-fusion layer (``fc_inputs``·hidden → hidden); 0 for a plain decoder."""
        return self.fc_inputs * self.hidden_size * self.hidden_size if self.kind == "eagle_head" else 0

    @property
    def linear_params(self) -> int:
        """Parameters every token passes through in the decoder stack (what Vidur's linear profile measures)."""
        return self.num_layers * self.layer_linear_params + self.fc_params

    @property
    def layer_matrices(self) -> tuple[int, ...]:
        """Parameters of each weight matrix of one decoder layer, fused as vLLM fuses them: QKV, O, gate/up, down."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.hd, self.num_kv_heads * self.hd, self.intermediate_size
        return (self.qkv_inputs * h * (q + 2 * kv), q * h, 2 * h * i, i * h)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The LM head a forward pass computes: over ``draft_vocab_size`` for an EAGLE-3 head, else the vocabulary."""
        return (self.draft_vocab_size or self.vocab_size) * self.hidden_size

    @property
    def weight_params(self) -> int:
        """Parameters resident on the GPU(s); an EAGLE head borrows the target's embedding and LM head."""
        if self.kind == "eagle_head":  # EAGLE-3's own (draft-vocabulary) LM head is resident too, and its own embedding
            return (self.linear_params + (self.lm_head_params if self.draft_vocab_size is not None else 0)
                    + (self.embedding_params if self.own_embedding else 0))
        head = 0 if self.tie_embeddings else self.lm_head_params
        return self.linear_params + self.embedding_params + head

    @property
    def linear_weight_bytes(self) -> float:
        """Bytes per parameter of the decoder layers' linear weights: ``weight_bits`` / 8 for a weight-quantized
        model (AWQ INT4: 0.5, streamed as such and dequantized in the kernel), else ``dtype_bytes``."""
        return self.weight_bits / 8 if self.weight_bits is not None else float(self.dtype_bytes)

    @property
    def weight_bytes(self) -> int:
        """The weights' bytes: the decoder layers' linear weights at :attr:`linear_weight_bytes`, the embedding and
        LM head (kept in 16 bits by weight-only quantization) at ``dtype_bytes``."""
        rest = self.weight_params - self.linear_params
        return round(self.linear_params * self.linear_weight_bytes + rest * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 · layers · kv_heads · head_dim · dtype_bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.hd * self.dtype_bytes

    def eagle_head(self) -> ModelSpec:
        """The EAGLE head of this target: one layer at its width plus fc, sharing its LM head."""
        return replace(self, name=f"eagle-{self.name}", num_layers=1, kind="eagle_head", source=self.source)


def _available(kind: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / kind).glob("*.yaml"))


_LOADED: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}  # path -> ((mtime, size), its mapping)


def _load(kind: str, name: str) -> dict[str, Any]:
    """``conf/<kind>/<name>.yaml`` as a fresh dict (each file parsed once per process while it is unchanged: the
    remote draft servers' specs are read for every point)."""
    path = CONF_DIR / kind / f"{name}.yaml"
    if not path.is_file():
        raise UnknownSpecError(f"unknown {kind} {name!r}; available: {', '.join(_available(kind))}")
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    held = _LOADED.get(path)
    if held is None or held[0] != stamp:
        with path.open() as fh:
            data = yaml.safe_load(fh)
        if not isinstance(data, dict):
            raise ValueError(f"{path} is not a mapping")
        held = _LOADED[path] = (stamp, data)
    return copy.deepcopy(held[1])


def available_hardware() -> list[str]:
    """Ids of every ``conf/hardware/*.yaml``."""
    return _available("hardware")


def available_models() -> list[str]:
    """Ids of every ``conf/model/*.yaml``."""
    return _available("model")


def load_hardware(name: str) -> HardwareSpec:
    """``conf/hardware/<name>.yaml`` as a :class:`HardwareSpec` (unknown id → :class:`UnknownSpecError`)."""
    return HardwareSpec(**_load("hardware", name))


def load_model(name: str) -> ModelSpec:
    """``conf/model/<name>.yaml`` as a :class:`ModelSpec` (unknown id → :class:`UnknownSpecError`)."""
    return ModelSpec(**_load("model", name))


def hardware_for(gpu: str) -> str | None:
    """The ``conf/hardware`` id of a GPU as PyTorch names it (``NVIDIA H100 80GB HBM3`` → ``h100-80g``), or None:
    the longest id whose model (``h100``) appears in the name and whose memory (``80g``), if it has one, too."""
    name = gpu.lower().replace("-", "").replace(" ", "")
    found = [p.stem for p in (CONF_DIR / "hardware").glob("*.yaml")
             if p.stem.partition("-")[0] in name
             and (not p.stem.partition("-")[2] or p.stem.partition("-")[2].rstrip("g") + "gb" in name)]
    return max(found, key=len) if gpu and found else None
