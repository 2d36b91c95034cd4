"""The oracle's seeded values: per-request chunks of per-position arrays, and the hash of an off-path context.

**Common random numbers.** Everything at request ``r``, position ``t`` depends only on (seed, r, t): values are
generated lazily in chunks of ``CHUNK`` positions, each chunk from its own generator seeded by (seed, stream key,
part, r, chunk index), so neither the order nor the number of queries, nor the request's length, changes them. (The
generators are NumPy's ``PCG64(SeedSequence(...))`` ones, set up by :class:`repro.core.seeding.Seeder` for every request
at once.) An off-path tree node picks one of its position's ``NUM_ALT`` distributions by a hash (:func:`_mix`) of
(seed, r, divergence position, ranks after the divergence), i.e. of its absolute context, so the same context always
gets the same distribution.

**Memo.** The same seed draws the same chunks in every run: the points of a sweep (its systems, its rates) read
the same requests' chunks again. :data:`MEMO` keeps the chunks a process drew, by everything their values depend on,
up to a memory limit (``REPRO_CHUNK_MEMO_MB``, default 128; 0 turns it off), and a stream copies a remembered chunk
instead of drawing it again: the same values, without the draws.

**Storage.** A :class:`_ChunkStore` is a flat pool per field: chunk slots addressed through a (request × chunk)
table, so a batch query is a handful of fancy-indexing operations with no per-request Python. ``release(rid)`` frees
a finished request's chunks; asked again, they are regenerated identically.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

import numpy as np

CHUNK = 512  # positions generated per (request, chunk); a power of two
ALT_CHUNK = 256  # positions per chunk of off-path distributions (NUM_ALT draws per position)
NUM_ALT = 16  # off-path child distributions kept per position; a power of two
MAX_WIDTH = 127  # ranks are stored as int8

_ALT_MASK = np.uint64(NUM_ALT - 1)
#: a child's rank in the hash of its context: (rank + 1)·0xD1B54A32D192ED03 (wrapping), by rank
_RANK_SALT = (np.arange(1, MAX_WIDTH + 2, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03))
_RANK_SALT.flags.writeable = False
#: Seed keys of the built-in streams (draft model, EAGLE head, prompt lookup): every value of a stream is drawn from
#: generators seeded by (seed, its key, ...), so these keys are part of every result.
DRAFT_KEY, EAGLE_KEY, PLD_KEY = 0, 1, 2
#: the parts of a stream's seeds: (seed, key, part, r[, chunk])
_LEVEL, _CHUNK_KEY, _ALT_KEY = 0, 1, 2
_INIT_SLOTS, _MAX_INIT_SLOTS = 64, 4096  # a store's first pool: a slot per request, within these
_AR = np.arange(4096, dtype=np.int64)
_AR.flags.writeable = False


def _as_seed_seq(seed: np.random.SeedSequence | int) -> np.random.SeedSequence:
    return seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> _U30)) * _MIX_1
    z = (z ^ (z >> _U27)) * _MIX_2
    return z ^ (z >> _U31)


_U27, _U30, _U31 = np.uint64(27), np.uint64(30), np.uint64(31)
_MIX_1, _MIX_2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # a request id's multiplier in a context hash (_TokenStream._positions)


class ChunkMemo:
    """Chunks drawn earlier in this process (``{field: array}``, read-only), by a key naming everything their values
    depend on; the least recently used go first once their arrays pass ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: OrderedDict[Hashable, dict[str, np.ndarray]] = OrderedDict()
        self._bytes = 0

    def get(self, key: Hashable) -> dict[str, np.ndarray] | None:
        got = self._chunks.get(key)
        if got is not None:
            self._chunks.move_to_end(key)
        return got

    def recall(self, key: Hashable, draw: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The entry remembered under ``key``, else ``draw()``'s, remembered."""
        got = self.get(key)
        return self.put(key, draw()) if got is None else got

    def put(self, key: Hashable, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Remember ``chunk`` (its arrays made read-only) and return it."""
        for arr in chunk.values():
            arr.flags.writeable = False
        if self.limit <= 0:
            return chunk
        old = self._chunks.pop(key, None)
        if old is not None:
            self._bytes -= _size(old)
        self._chunks[key] = chunk
        self._bytes += _size(chunk)
        while self._bytes > self.limit and self._chunks:
            _, gone = self._chunks.popitem(last=False)
            self._bytes -= _size(gone)
        return chunk

    def clear(self) -> None:
        self._chunks.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._chunks)


def _size(chunk: dict[str, np.ndarray]) -> int:
    """What a remembered entry holds: its arrays, and about 256 bytes of key, dict and array headers."""
    return 256 + sum(a.nbytes for a in chunk.values())


def _memo_limit() -> int:
    raw = os.environ.get("REPRO_CHUNK_MEMO_MB", "128")
    try:
        return int(float(raw) * 2**20)
    except ValueError:
        warnings.warn(f"REPRO_CHUNK_MEMO_MB={raw!r} is not a number of megabytes: using 128", stacklevel=2)
        return 128 * 2**20


#: the chunks this process drew (:class:`ChunkMemo`)
MEMO = ChunkMemo(_memo_limit())


class _ChunkStore:
    """Per-request chunks of per-position arrays in flat pools; index = ``slot·chunk + offset``."""

    def __init__(self, num_requests: int, fields: Mapping[str, tuple[tuple[int, ...], type]],
                 fill: Callable[[int, int], Mapping[str, np.ndarray]], chunk: int = CHUNK) -> None:
        self._fields = dict(fields)
        self._fill = fill
        self.chunk, self._shift, self._mask = chunk, chunk.bit_length() - 1, chunk - 1
        self.table = np.full((num_requests, 1), -1, dtype=np.int64)
        # room for a chunk per request to begin with, doubled as needed. Not zeroed (a zeroed pool of a thousand
        # requests' chunks took 1.2 ms a stream, reused heap pages cleared each time): a slot is read only once it is in
        # the table, after its chunk was written (a stream that fills a field later, as ranks, fills it before reading)
        slots = min(max(_INIT_SLOTS, num_requests), _MAX_INIT_SLOTS)
        self.pools: dict[str, np.ndarray] = {
            n: np.empty((slots * chunk, *s), dtype=d) for n, (s, d) in self._fields.items()}
        self._free = list(range(slots - 1, -1, -1))
        self._held = 0  # chunks generated and not released

    def locate(self, rids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Flat pool indices of (rids, positions) (broadcast together), generating missing chunks."""
        chunk = positions >> self._shift  # positions must be >= 0 (the public methods check)
        return (self._slots(rids, chunk) << self._shift) | (positions & self._mask)

    def window(self, rids: np.ndarray, first: np.ndarray, length: int, last: np.ndarray) -> np.ndarray:
        """:meth:`locate` of positions ``min(first + j, last)`` for ``j < length`` (each request's next positions up to
        its ``last``; ``first <= last``): (requests, length). Where every request's window lies in one chunk (the
        common case), that chunk's slot is looked up once per request instead of once per position."""
        ar = _AR[:length] if length <= _AR.size else np.arange(length)
        head, tail = first >> self._shift, last >> self._shift
        if np.count_nonzero(head != tail):
            for d in range(int((tail - head).max()) + 1):  # each request's chunks, generated a column at a time
                self._slots(rids, np.minimum(head + d, tail))
            return self.locate(rids[:, None], np.minimum(first[:, None] + ar, last[:, None]))
        base = (self._slots(rids, head) << self._shift) | (first & self._mask)
        return base[:, None] + np.minimum(ar, (last - first)[:, None])

    def _slots(self, rids: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """The pool slots of chunks (rids, chunk) (broadcast together), generating the missing ones."""
        try:
            slots = self.table[rids, chunk]
        except IndexError:  # a chunk index beyond the table: widen it
            self._widen(int(chunk.max()) + 1)
            slots = self.table[rids, chunk]
        if slots.size and slots.min() < 0:
            missing = slots < 0
            rr = (rids if rids.shape == chunk.shape else np.broadcast_to(rids, chunk.shape))[missing].tolist()
            for r, c in sorted(set(zip(rr, chunk[missing].tolist(), strict=True))):
                self._generate(r, c)
            slots = self.table[rids, chunk]
        return slots

    def generate(self, pairs: list[list[int]]) -> None:
        """Generate the chunks ``[request, chunk]`` of ``pairs`` (none held yet), widening the table as needed."""
        self._widen(max(c for _, c in pairs) + 1)
        for r, c in pairs:
            self._generate(r, c)

    def _widen(self, columns: int) -> None:
        """Room in the table for ``columns`` chunks per request (at least doubling it when it grows)."""
        if columns > self.table.shape[1]:
            grow = max(columns, 2 * self.table.shape[1])
            self.table = np.pad(self.table, ((0, 0), (0, grow - self.table.shape[1])), constant_values=-1)

    def _generate(self, rid: int, chunk: int) -> None:
        if not self._free:
            cap = self.pools[next(iter(self.pools))].shape[0] // self.chunk
            for name, arr in self.pools.items():
                self.pools[name] = np.concatenate([arr, np.empty_like(arr)])
            self._free = list(range(2 * cap - 1, cap - 1, -1))
        slot = self._free.pop()
        self._held += 1
        for name, values in self._fill(rid, chunk).items():
            self.pools[name][slot * self.chunk:(slot + 1) * self.chunk] = values
        self.table[rid, chunk] = slot

    def release(self, rid: int) -> None:
        if not self._held:
            return
        row = self.table[rid]
        slots = [slot for slot in row.tolist() if slot >= 0]  # (a row holds a handful of chunk indices)
        self._free.extend(slots)
        self._held -= len(slots)
        row[:] = -1

    @property
    def num_chunks(self) -> int:
        return self._held
