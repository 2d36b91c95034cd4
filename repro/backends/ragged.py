"""Ragged batched passes of one causal LM over per-sequence KV caches (``backend=hf``, :mod:`repro.backends.hf`).

Each sequence of a pass brings its own cache, its new tokens, their positions and which new tokens each one sees
(:func:`chain_mask` for prefill chunks and chains, :func:`tree_mask` for token trees). Items of like length share a
pass, padded to its longest cache and its longest run of new tokens (:meth:`Runner.forward`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from repro.backends.models import require_torch


@dataclass
class Item:
    """One sequence of a ragged pass: its cache, new tokens, their positions and which new tokens each one sees."""

    cache: Any  # [layers, 2, kv_heads, L, head_dim] or None
    tokens: list[int]
    positions: list[int]
    mask: Any  # [q, q] bool: row i attends to new token j


def chain_mask(torch: Any, q: int, device: Any) -> Any:
    """Causal mask of ``q`` new tokens: each sees itself and the ones before it."""
    return torch.tril(torch.ones(q, q, dtype=torch.bool, device=device))


def tree_mask(torch: Any, parent: Sequence[int], device: Any) -> Any:
    """Ancestor mask of a root (index 0) followed by nodes whose ``parent`` (-1 = the root) indexes the nodes."""
    q = len(parent) + 1
    m = torch.zeros(q, q, dtype=torch.bool, device=device)
    m[0, 0] = True
    for i, p in enumerate(parent, start=1):
        m[i] = m[p + 1 if p >= 0 else 0]
        m[i, i] = True
    return m


class Runner:
    """Ragged batched passes of one causal LM over per-sequence KV caches (module docstring)."""

    def __init__(self, model: Any) -> None:
        self.torch, _ = require_torch()
        self.model = model
        cfg = model.config
        self.cfg = cfg
        self.layers = int(cfg.num_hidden_layers)
        self.vocab = int(cfg.vocab_size)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def forward(self, items: Sequence[Item]) -> tuple[list[Any], list[Any]]:
        """Per item: logits of its new tokens [q, vocab] and their KV [layers, 2, kv_heads, q, head_dim].

        The items go through the model in passes of like length, their runs of new tokens within a factor of two
        (1, 2, 3-4, 5-8, ... tokens), each pass padded to its longest cache and run (:meth:`_pass`): a 256-token
        prefill chunk beside eight decodes is two passes, not nine sequences padded to 256 tokens (on this CPU, with
        Llama-68M: 0.25 s against 1.8 s)."""
        buckets: dict[int, list[int]] = {}
        for i, it in enumerate(items):
            buckets.setdefault((len(it.tokens) - 1).bit_length(), []).append(i)
        if len(buckets) <= 1:
            return self._pass(items)
        logits: list[Any] = [None] * len(items)
        kvs: list[Any] = [None] * len(items)
        for idx in buckets.values():
            lg, kv = self._pass([items[i] for i in idx])
            for i, a, b in zip(idx, lg, kv, strict=True):
                logits[i], kvs[i] = a, b
        return logits, kvs

    def _pass(self, items: Sequence[Item]) -> tuple[list[Any], list[Any]]:
        """One batched pass of ``items``, padded to the longest cache and the longest run of new tokens."""
        from transformers import DynamicCache

        torch = self.torch
        dev, dt = self.device, self.dtype
        b = len(items)
        lens = [0 if it.cache is None else int(it.cache.shape[3]) for it in items]
        qs = [len(it.tokens) for it in items]
        lm, qm = max(lens), max(qs)
        ids = torch.zeros(b, qm, dtype=torch.long)
        pos = torch.zeros(b, qm, dtype=torch.long)
        allow = torch.zeros(b, qm, lm + qm, dtype=torch.bool, device=dev)
        for i, (it, n, q) in enumerate(zip(items, lens, qs, strict=True)):
            ids[i, :q] = torch.tensor(it.tokens, dtype=torch.long)
            pos[i, :q] = torch.tensor(it.positions, dtype=torch.long)
            allow[i, :q, :n] = True
            allow[i, :q, lm:lm + q] = it.mask
            pad = torch.arange(q, qm, device=dev)
            allow[i, pad, lm + pad] = True  # padding rows see themselves only (no empty softmax)
        mask = torch.zeros(b, 1, qm, lm + qm, dtype=dt, device=dev)
        mask.masked_fill_(~allow[:, None], torch.finfo(dt).min)
        cache = DynamicCache(config=self.cfg)
        if lm:
            shape = next(it.cache for it in items if it.cache is not None).shape
            past = torch.zeros(b, self.layers, 2, shape[2], lm, shape[4], dtype=dt, device=dev)
            for i, (it, n) in enumerate(zip(items, lens, strict=True)):
                if n:
                    past[i, :, :, :, :n] = it.cache
            for layer in range(self.layers):
                cache.update(past[:, layer, 0], past[:, layer, 1], layer)
        out = self.model(input_ids=ids.to(dev), position_ids=pos.to(dev), attention_mask=mask, use_cache=True,
                         **{self._cache_kw: cache})
        layers: Any = cache.layers
        keys = torch.stack([torch.stack([layers[j].keys[:, :, lm:], layers[j].values[:, :, lm:]], dim=1)
                            for j in range(self.layers)], dim=1)  # [b, layers, 2, kv_heads, qm, head_dim]
        return [out.logits[i, :q].float() for i, q in enumerate(qs)], [keys[i, :, :, :, :q] for i, q in enumerate(qs)]


class KvCaches:
    """Per-request KV caches (``[layers, 2, kv_heads, L, head_dim]``), each in a buffer allocated once with room to
    grow (``headroom`` tokens past what it first holds, doubled when full): a step's new KV is written in place after
    the request's last token and a cut back only moves its length, so no step copies a request's whole cache to
    extend it. ``caches[rid]`` is the view of its first L tokens."""

    def __init__(self, torch: Any, headroom: int = 256) -> None:
        self.torch, self.headroom = torch, int(headroom)
        self._buf: dict[int, Any] = {}
        self._len: dict[int, int] = {}

    def __contains__(self, rid: object) -> bool:
        return rid in self._len

    def __getitem__(self, rid: int) -> Any:
        return self._buf[rid][:, :, :, : self._len[rid]]

    def get(self, rid: int, default: Any = None) -> Any:
        return self[rid] if rid in self._len else default

    def length(self, rid: int) -> int:
        """The tokens the request's cache holds (0: none)."""
        return self._len.get(rid, 0)

    def pop(self, rid: int, default: Any = None) -> Any:
        """Free the request's cache; returns its view (``default`` when it had none)."""
        if rid not in self._len:
            return default
        view = self[rid]
        del self._buf[rid], self._len[rid]
        return view

    def append(self, rid: int, kv: Any) -> None:
        """Write ``kv`` (``[layers, 2, kv_heads, q, head_dim]``) after the request's last cached token."""
        q, n = int(kv.shape[3]), self._len.get(rid, 0)
        buf = self._buf.get(rid)
        if buf is None or n + q > buf.shape[3]:
            room = max(2 * (n + q), n + q + self.headroom)
            grown = self.torch.empty(*kv.shape[:3], room, kv.shape[4], dtype=kv.dtype, device=kv.device)
            if n and buf is not None:
                grown[:, :, :, :n] = buf[:, :, :, :n]
            self._buf[rid] = buf = grown
        buf[:, :, :, n:n + q] = kv
        self._len[rid] = n + q

    def crop(self, rid: int, n: int) -> None:
        """Keep the request's first ``n`` cached tokens (none: its cache is freed)."""
        if n <= 0:
            self.pop(rid)
        elif rid in self._len:
            self._len[rid] = min(int(n), self._len[rid])

    def move(self, rid: int, device: Any) -> None:
        """Move the request's cached tokens to ``device`` (a swap), its room given up."""
        self._buf[rid] = self[rid].to(device, non_blocking=False)

