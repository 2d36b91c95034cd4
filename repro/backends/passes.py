"""``backend=hf``'s own passes as a profiler model (``python -m repro.profile --engine hf``): the profile of the
engine that ``backend=hf`` runs, for the simulator to price a run with (``cost=profile``) and compare with the real
one (:mod:`repro.experiments.sim_vs_real`).

:mod:`repro.profile` times its own decoder (a static KV cache written in place, SDPA, CUDA graphs): what a serving
engine's kernels do. ``backend=hf`` runs transformers models through :class:`~repro.backends.ragged.Runner`: the
caches lie in one preallocated pool (:class:`~repro.backends.kvslots.KvSlots`) that each pass writes in place and
reads where it lies, the pass pads the batch to its longest run of new tokens, and every new token gets its
logits. Timing those passes, not the profiler's, is what makes a simulation priced from the table and the real run
model the same engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from repro.backends.models import TinyShape, build_model, require_torch
from repro.backends.ragged import Item, Runner, chain_mask
from repro.cost.spec import ModelSpec

ENGINE = ("backend=hf's passes (transformers eager, caches in one preallocated pool written and read in place, "
          "batches padded to their longest run of new tokens, logits for every new token; "
          "repro.backends.ragged.Runner)")


def tiny_spec(spec: ModelSpec, shape: TinyShape | None = None) -> ModelSpec:
    """``spec`` scaled down as ``backend.tiny`` scales it (:class:`~repro.backends.models.TinyShape`)."""
    s = shape or TinyShape()
    ratio = max(1, spec.num_heads // max(spec.num_kv_heads, 1))
    return replace(spec, num_layers=s.num_layers, hidden_size=s.hidden_size, num_heads=s.num_heads,
                   num_kv_heads=max(1, s.num_heads // ratio), head_dim=s.hidden_size // s.num_heads,
                   intermediate_size=s.intermediate_size, vocab_size=s.vocab_size, max_context=s.max_context)


class BackendPasses:
    """A random-weight transformers model of ``spec``'s architecture run as ``backend=hf`` runs it, with the
    profiler's model interface (``cache``, ``forward_groups``; :func:`repro.profile.measure`)."""

    def __init__(self, spec: ModelSpec, device: str, dtype: Any, seed: int = 0, tiny: bool = False) -> None:
        self.torch, _ = require_torch()
        name = "float32" if dtype == self.torch.float32 else "bfloat16" if dtype == self.torch.bfloat16 else "float16"
        self.runner = Runner(build_model(spec.name, tiny=tiny, seed=seed, device=device, dtype=name))
        self.spec = tiny_spec(spec) if tiny else spec
        self.device, self.dtype = device, self.runner.dtype
        self._next = 0  # the next request id cache() hands out

    def cache(self, batch: int, context: int, new: int = 0) -> list[int]:
        """``batch`` requests holding ``context`` random tokens each in the runner's pool, as ``backend=hf`` keeps
        them; returns their ids (a pass writes its ``new`` tokens after them, uncommitted, so every timed pass reads
        the same context; :meth:`release` frees them)."""
        rids = list(range(self._next, self._next + batch))
        self._next += batch
        self.runner.kv.reserve(rids, context + new)  # the cell's whole room at once: no growth in a timed pass
        self.runner.kv.fill_random(rids, context)
        return rids

    def cache_tokens(self, groups: Sequence[Any]) -> int:
        """The cached token positions a cell of ``groups`` (:class:`repro.profile.Group`) takes in the pool: a slot
        per sequence (at least the pool's first slots), each as long as the longest sequence, rounded up as the
        pool rounds it. (A mixed cell's prompt takes its slot in the first, untimed pass, which can grow the pool
        past this: there a pool that does not fit is still skipped, by :class:`~repro.backends.kvslots.PoolFull`.)"""
        slots, tokens = self.runner.kv.first_size(sum(g.seqs for g in groups),
                                                  max(g.context + g.new for g in groups))
        return slots * tokens

    def forward_groups(self, groups: Sequence[tuple[Any, list[int] | None, int, bool]]) -> Any:
        """One ragged pass over every sequence of ``groups`` (``(tokens [b, n], requests or None, context, _)``;
        prompts without requests take slots of their own, the same on every call)."""
        torch = self.torch
        items = []
        prompts = 0
        for tokens, rids, context, _ in groups:
            ids = tokens.tolist()
            n = len(ids[0])
            mask = chain_mask(torch, n, self.runner.device)
            for i, row in enumerate(ids):
                if rids is None:
                    prompts += 1
                rid = rids[i] if rids is not None else -prompts
                items.append(Item(rid, context, row, list(range(context, context + n)), mask))
        return self.runner.forward(items)

    def release(self) -> None:
        """Free every request a cell made and the pool's buffer (:func:`repro.profile.measure`, after each cell)."""
        self.runner.kv.clear()
