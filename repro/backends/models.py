"""Causal LMs for the real backends, from the architectures in ``conf/model`` (random weights, no download) or from a
local checkpoint (a path, or a Hugging Face cache entry; offline first).

``tiny`` scales an architecture down to a few layers and a small vocabulary while keeping its family (Llama, Qwen2,
Qwen3), grouped-query heads and tied embeddings: the CPU tests build such models in milliseconds. Random weights are
seeded: the same (architecture, seed) gives the same model, so "a draft that shares the target's weights" is the
target's config with the target's seed.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

from repro.cost.spec import ModelSpec, load_model


def require_torch() -> tuple[Any, Any]:
    """``(torch, transformers)``, or a clear error naming the extra to install."""
    try:
        import torch
        import transformers
    except ImportError:
        raise ImportError("the real backends need PyTorch and transformers: pip install torch==2.13.0 (the CPU build; "
                          "a CUDA build on a GPU machine) and pip install -e '.[real]'") from None
    return torch, transformers


@dataclass(frozen=True)
class TinyShape:
    """The scaled-down shape ``tiny`` gives an architecture (the family and head ratio are kept)."""

    num_layers: int = 2
    hidden_size: int = 64
    num_heads: int = 4
    intermediate_size: int = 128
    vocab_size: int = 512
    max_context: int = 2048


def family(spec: ModelSpec) -> str:
    """``llama`` | ``qwen2`` | ``qwen3`` from the model's source and name."""
    src = f"{spec.source} {spec.name}".lower()
    if "qwen3" in src:
        return "qwen3"
    if "qwen" in src:
        return "qwen2"
    return "llama"


def hf_config(spec: ModelSpec, tiny: bool | TinyShape = False) -> Any:
    """A transformers config of ``spec``'s architecture (``tiny``: scaled down, :class:`TinyShape`)."""
    _, tf = require_torch()
    shape = TinyShape() if tiny is True else tiny or None
    heads, kv = spec.num_heads, spec.num_kv_heads
    kw: dict[str, Any] = {
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "head_dim": spec.hd, "vocab_size": spec.vocab_size, "max_position_embeddings": spec.max_context,
        "tie_word_embeddings": spec.tie_embeddings,
    }
    if shape is not None:
        ratio = max(1, heads // max(kv, 1))
        nh = shape.num_heads
        kw.update(hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                  num_hidden_layers=shape.num_layers, num_attention_heads=nh,
                  num_key_value_heads=max(1, nh // ratio), head_dim=shape.hidden_size // nh,
                  vocab_size=shape.vocab_size, max_position_embeddings=shape.max_context)
    fam = family(spec)
    cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config}[fam]
    return cls(**kw)


def build_model(name: str | ModelSpec, *, tiny: bool | TinyShape = False, seed: int = 0, path: str | None = None,
                device: str = "cpu", dtype: str | None = None) -> Any:
    """A causal LM in eval mode: from ``path`` (a local checkpoint directory, or a Hugging Face repo id already in
    the local cache: nothing is downloaded) or else random weights of ``conf/model/<name>.yaml``'s architecture
    (seeded; ``tiny``: scaled down). ``dtype``: float32 | bfloat16 | float16 (default: bfloat16 on CUDA, float32
    on a CPU)."""
    torch, tf = require_torch()
    dt = getattr(torch, dtype) if dtype else (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    if path is not None:
        if not os.path.isdir(path):
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            # the same attention implementation as random weights (below): exact custom (tree) masks, and a
            # checkpoint's timings comparable with its random-weight stand-in's
            model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=dt, local_files_only=True,
                                                            attn_implementation="eager")
        except OSError as exc:
            raise FileNotFoundError(f"model path {path!r}: no local checkpoint there nor in the Hugging Face cache "
                                    "(this suite never downloads; fetch it first, e.g. huggingface-cli download)"
                                    ) from exc
    else:
        spec = name if isinstance(name, ModelSpec) else load_model(name)
        config = hf_config(spec, tiny)
        config._attn_implementation = "eager"  # exact custom (tree) masks on every device
        # on a GPU, initialised there: a 7B model's random init and copy take seconds there, minutes on the host
        # (seeded by the device's generator, so its weights differ from the same seed's on a CPU)
        dev = torch.device(device)
        cuda = dev.type == "cuda"
        with torch.random.fork_rng(devices=[dev.index or 0] if cuda else []), dev if cuda else contextlib.nullcontext():
            torch.manual_seed(seed)
            model = tf.AutoModelForCausalLM.from_config(config, dtype=dt)
    return model.to(device).eval()


def noisy_copy(model: Any, noise: float, seed: int = 1) -> Any:
    """A copy of ``model`` with Gaussian noise of ``noise`` × each weight tensor's standard deviation added to every
    weight (seeded): a draft whose agreement with the model falls as ``noise`` grows (0: the model itself)."""
    import copy

    torch, _ = require_torch()
    out = copy.deepcopy(model)
    # the noise is drawn where the weights are (a 7B model's on a GPU in seconds; a CPU's as before, bit for bit)
    dev = next(out.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            if p.numel() > 1:
                p.add_((torch.randn(p.shape, generator=g, device=dev) * noise * float(p.float().std())).to(p.dtype))
    return out.eval()
