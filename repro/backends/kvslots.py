"""One model's KV cache for every request of ``backend=hf``, allocated ahead and written in place (:class:`KvSlots`).

A serving engine does not copy its KV cache to run a step: vLLM's paged pool and transformers' ``StaticCache`` are
allocated once, each step writes its new tokens' keys and values where they belong, and attention reads the pool
where it lies. :class:`KvSlots` is that for the ragged passes of :class:`~repro.backends.ragged.Runner`:

- one buffer per model, ``[layers, 2, slots, kv_heads, tokens, head_dim]``, zeroed when allocated; a request holds
  a slot (the lowest free one) and its first ``length`` tokens are its cache;
- a pass writes each sequence's new keys and values at its positions ``start .. start + q`` of its slot, every layer
  in one indexed write (:meth:`KvSlots.write`), and attention reads the pass's slots up to the longest
  ``start + q``: a view of the buffer, no copy, when the pass's slots are consecutive (its sequences are ordered by
  slot), otherwise one gather of those rows per layer (:meth:`KvSlots.read`);
- what a pass wrote becomes the request's cache only when its caller says so (:meth:`KvSlots.commit`, or
  :meth:`KvSlots.keep` for a verified tree's accepted path, moved down in place), so a tree the draft expands, or
  verification's rejected tokens, cost nothing to drop;
- the buffer grows only when a request needs more (its slots or its tokens at least doubled, tokens a multiple of
  256): memory is the run's most concurrent requests times its longest sequence, as for a static cache;
- a swap copies a request's tokens to the host and frees its slot; :meth:`KvSlots.clear` gives the buffer back.

Positions a pass's padding rows write past a sequence's length hold finite keys that no query sees (masked: weight
exactly 0), and the buffer starts zeroed, so nothing read under the mask can turn a sum into NaN.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from functools import cache
from typing import Any

STEP = 256  # the buffer's tokens per slot are a multiple of this


class PoolFull(RuntimeError):
    """The device has no room for the pool's buffer (the profiler skips such a cell; a run stops, naming the size)."""


class KvSlots:
    """One model's KV pool (module docstring). ``layers``, ``kv_heads``, ``head_dim``: the model's attention shape."""

    def __init__(self, torch: Any, layers: int, kv_heads: int, head_dim: int, dtype: Any, device: Any,
                 slots: int = 4) -> None:
        self.torch = torch
        self.shape = (int(layers), int(kv_heads), int(head_dim))
        self.dtype, self.device = dtype, device
        self.first_slots = max(1, int(slots))
        self.buf: Any = None  # [layers, 2, slots, kv_heads, tokens, head_dim]
        self._slot: dict[int, int] = {}
        self._len: dict[int, int] = {}
        self._host: dict[int, Any] = {}  # swapped out: [layers, 2, kv_heads, length, head_dim] on the host
        self._free: list[int] = []  # a heap of free slots

    # ----------------------------------------------------------------------------------------- bookkeeping
    def __contains__(self, rid: object) -> bool:
        return rid in self._len

    def length(self, rid: int) -> int:
        """The tokens the request's cache holds (0: none)."""
        return self._len.get(rid, 0)

    @property
    def capacity(self) -> tuple[int, int]:
        """(slots, tokens per slot) of the buffer ((0, 0) before the first pass)."""
        return (0, 0) if self.buf is None else (int(self.buf.shape[2]), int(self.buf.shape[4]))

    def get(self, rid: int, default: Any = None) -> Any:
        """The request's cached tokens, ``[layers, 2, kv_heads, length, head_dim]`` (a view; ``default``: none)."""
        if rid not in self._len:
            return default
        if rid in self._host:
            return self._host[rid]
        return self.buf[:, :, self._slot[rid], :, : self._len[rid]]

    def pop(self, rid: int, default: Any = None) -> Any:
        """Free the request's cache (its slot back to the pool); returns True, or ``default`` when it had none."""
        if rid not in self._len:
            return default
        del self._len[rid]
        self._host.pop(rid, None)
        slot = self._slot.pop(rid, None)
        if slot is not None:
            heapq.heappush(self._free, slot)
        return True

    def crop(self, rid: int, n: int) -> None:
        """Keep the request's first ``n`` cached tokens (none: its cache is freed)."""
        if n <= 0:
            self.pop(rid)
        elif rid in self._len:
            self._len[rid] = min(int(n), self._len[rid])

    def commit(self, rid: int, n: int) -> None:
        """The request's cache is now its first ``n`` tokens: what a pass wrote up to there is kept."""
        if rid not in self._slot:
            raise KeyError(f"request {rid} holds no slot")
        self._len[rid] = int(n)

    def keep(self, rid: int, start: int, idx: Sequence[int]) -> None:
        """A verified tree: the tokens a pass wrote at ``start + idx[j]`` become the cache's ``start + j`` (moved down
        in place where ``idx`` is not already ``0, 1, ...``), and the cache ends after them."""
        m = len(idx)
        if list(idx) != list(range(m)):
            with self.torch.inference_mode():
                row = self.buf[:, :, self._slot[rid]]  # [layers, 2, kv_heads, tokens, head_dim]
                at = self.torch.tensor([start + j for j in idx], dtype=self.torch.long, device=self.device)
                row[:, :, :, start:start + m] = row.index_select(3, at)
        self.commit(rid, start + m)

    def clear(self) -> None:
        """Free every request's cache and give the buffer back."""
        self.buf = None
        self._slot.clear()
        self._len.clear()
        self._host.clear()
        self._free = []

    # ----------------------------------------------------------------------------------------------- room
    def first_size(self, new: int, tokens: int) -> tuple[int, int]:
        """The (slots, tokens per slot) of a first buffer for ``new`` requests of ``tokens`` tokens: the slots asked
        (at least the pool's first ones), the tokens rounded up to ``STEP``."""
        return max(self.first_slots, int(new)), _round_up(max(int(tokens), 1))

    def reserve(self, rids: Sequence[int], tokens: int) -> list[int]:
        """A slot for each request (a new one at length 0 for a request without), and room for ``tokens`` tokens per
        slot; returns the slots. A first buffer is sized to what is asked (tokens rounded up to ``STEP``); a
        buffer that must grow at least doubles what it lacks, so a run grows it a handful of times."""
        new = [r for r in dict.fromkeys(rids) if r not in self._slot]
        for rid in new:
            if rid in self._host:
                raise RuntimeError(f"request {rid}'s cache is on the host (swapped out): swap it in first")
        if self.buf is None:
            self._grow(*self.first_size(len(new), tokens))
        else:
            slots, room = int(self.buf.shape[2]), int(self.buf.shape[4])
            more = len(new) > len(self._free)
            if more or tokens > room:
                used = slots - len(self._free)
                self._grow(max(2 * slots, used + len(new)) if more else slots,
                           _round_up(max(tokens, 2 * room)) if tokens > room else room)
        out = []
        for rid in rids:
            slot = self._slot.get(rid)
            if slot is None:
                slot = self._slot[rid] = heapq.heappop(self._free)
                self._len.setdefault(rid, 0)
            out.append(slot)
        return out

    def _grow(self, slots: int, tokens: int) -> None:
        torch = self.torch
        layers, heads, hd = self.shape
        with torch.inference_mode():
            try:
                new = torch.zeros(layers, 2, slots, heads, tokens, hd, dtype=self.dtype, device=self.device)
            except RuntimeError as err:
                if not _out_of_memory(torch, err):
                    raise
                raise PoolFull(f"backend=hf: the KV pool of {slots} slots x {tokens} tokens does not fit "
                               f"({_gib(layers * 2 * slots * heads * tokens * hd, self.dtype, torch):.1f} GiB; "
                               f"{str(err).splitlines()[0][:160]}): fewer concurrent requests or shorter "
                               "sequences") from err
            old = self.buf
            have = 0 if old is None else int(old.shape[2])
            if old is not None:
                new[:, :, :have, :, : old.shape[4]] = old
        for s in range(have, slots):
            heapq.heappush(self._free, s)
        self.buf = new

    def fill_random(self, rids: Sequence[int], n: int) -> None:
        """Give each request a cache of ``n`` random tokens (the profiler's timed passes read them)."""
        with self.torch.inference_mode():
            for slot, rid in zip(self.reserve(rids, n), rids, strict=True):
                self.buf[:, :, slot, :, :n].normal_()
                self._len[rid] = int(n)

    def swap(self, rid: int, to_host: bool) -> None:
        """A swap: the request's cached tokens copied to the host and its slot freed, or (not ``to_host``) back into a
        slot."""
        if to_host and rid in self._slot:
            self._host[rid] = self.get(rid).to("cpu", copy=True)
            heapq.heappush(self._free, self._slot.pop(rid))
        elif not to_host and rid in self._host:
            n = self._len[rid]
            host = self._host.pop(rid)
            slot = self.reserve([rid], n)[0]
            with self.torch.inference_mode():
                self.buf[:, :, slot, :, :n] = host.to(self.device)

    # ----------------------------------------------------------------------------------------------- a pass
    def pass_cache(self, slots: Sequence[int], starts: Sequence[int], q: int) -> Any:
        """The transformers ``Cache`` of one pass over ``slots`` (in this order), each sequence's ``q`` new tokens
        written at ``starts[i] ..``; attention reads ``max(starts) + q`` tokens of each."""
        return _pass_cache_class()(self, slots, starts, q)

    def write(self, layer: int, rows: Any, cols: Any, key: Any, value: Any) -> None:
        """Write a pass's new keys and values (``[b, kv_heads, q, head_dim]``) at ``(rows, cols)`` (``[b, q]``)."""
        buf = self.buf[layer]
        buf[0][rows, :, cols] = key.transpose(1, 2)
        buf[1][rows, :, cols] = value.transpose(1, 2)

    def read(self, layer: int, first: int | None, slots: Any, tokens: int) -> tuple[Any, Any]:
        """The keys and values attention reads, ``[b, kv_heads, tokens, head_dim]``: a view of consecutive slots from
        ``first``, else the rows ``slots`` gathered."""
        buf = self.buf[layer, :, :, :, :tokens]
        kv = buf[:, first:first + int(slots.shape[0])] if first is not None else buf.index_select(1, slots)
        return kv[0], kv[1]


@cache
def _pass_cache_class() -> type:
    """The transformers ``Cache`` of a pass over a :class:`KvSlots` (defined when transformers is first needed)."""
    from transformers.cache_utils import Cache, CacheLayerMixin

    class SlotLayer(CacheLayerMixin):
        """One layer of a pass: writes the new tokens into the pool, returns what attention reads. It holds the
        pass's indices, not the pass (no reference cycle), and not what it returned: a pass's cache is freed with
        it, not at Python's next garbage collection (views of a grown-out pool or a pass's gathered keys, left to a
        cycle, held GPU memory across passes)."""

        def __init__(self, pass_: PassCache, layer: int) -> None:
            super().__init__()
            self.pool, self.layer = pass_.pool, layer
            self.rows, self.cols, self.first, self.slots = pass_.rows, pass_.cols, pass_.first, pass_.slots
            self.tokens, self.q = pass_.tokens, pass_.q

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            pass

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            self.pool.write(self.layer, self.rows, self.cols, key_states, value_states)
            self.is_initialized = True
            return self.pool.read(self.layer, self.first, self.slots, self.tokens)

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.tokens, 0

        def get_seq_length(self) -> int:
            return self.tokens - self.q

        def get_max_length(self) -> int:
            return -1

    class PassCache(Cache):
        def __init__(self, pool: KvSlots, slots: Sequence[int], starts: Sequence[int], q: int) -> None:
            torch = pool.torch
            self.pool, self.q = pool, int(q)
            self.tokens = max(starts) + self.q
            dev = pool.device
            self.slots = torch.tensor(list(slots), dtype=torch.long, device=dev)
            s0 = int(slots[0])
            self.first = s0 if list(slots) == list(range(s0, s0 + len(slots))) else None
            self.rows = self.slots[:, None].expand(len(slots), self.q)
            self.cols = torch.tensor(list(starts), dtype=torch.long, device=dev)[:, None] + torch.arange(
                self.q, device=dev)
            super().__init__(layers=[SlotLayer(self, j) for j in range(pool.shape[0])])

    return PassCache


PassCache = Any  # the class _pass_cache_class() returns (for annotations)


def _round_up(n: int) -> int:
    return -(-int(n) // STEP) * STEP


def _out_of_memory(torch: Any, err: BaseException) -> bool:
    """Whether ``err`` is an allocation's failure (the device's, or a CPU allocator's), not another error."""
    oom = getattr(torch, "OutOfMemoryError", None)
    text = str(err).lower()
    return (oom is not None and isinstance(err, oom)) or "out of memory" in text or "can't allocate" in text


def _gib(elements: int, dtype: Any, torch: Any) -> float:
    return elements * torch.empty((), dtype=dtype).element_size() / 2**30
