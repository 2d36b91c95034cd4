"""Generators seeded exactly as ``Generator(PCG64(SeedSequence(entropy, spawn_key=(*prefix, *tail))))``, for many
tails at once.

The token oracle draws every chunk of every request from its own generator, seeded by (seed, stream, request,
chunk). Building one through ``SeedSequence`` costs about 14 µs (hashing the entropy and key, then seeding PCG64),
as much as the draws of a chunk. :class:`Seeder` gives the very same generators for a fraction of that: NumPy's
``SeedSequence`` hashes its entropy words one after another into a pool, so the pool after a fixed prefix of words
is computed once, and the last words (request, chunk) are hashed in for every request at once with numpy's
wrapping ``uint32`` arithmetic. PCG64's seeding from the resulting state words is a few 128-bit operations, and the
state is set on one reusable generator. ``tests/test_seeding.py`` checks the draws against NumPy's own seeding.

The algorithm is NumPy's ``SeedSequence`` (``numpy/random/bit_generator.pyx``, after Melissa O'Neill's
``seed_seq_fe``) and PCG64's ``pcg_setseq_128_srandom_r``; both are part of NumPy's reproducibility promise
(NEP 19: a seed gives the same stream across versions).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_M32 = 0xFFFFFFFF
_M128 = (1 << 128) - 1
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341  # PCG_DEFAULT_MULTIPLIER_128


def _words(x: object) -> list[int] | None:
    """``SeedSequence``'s uint32 words of an int or a sequence of ints (``None``: a kind it is not built for)."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        n = int(x)
        if n < 0:
            return None
        out = [n & _M32] if n == 0 else []
        while n > 0:
            out.append(n & _M32)
            n >>= 32
        return out
    if isinstance(x, Sequence) and not isinstance(x, str):
        out = []
        for v in x:
            w = _words(v)
            if w is None:
                return None
            out.extend(w)
        return out
    return None


def keyed_rng(base: np.random.SeedSequence, *key: int) -> np.random.Generator:
    """A generator seeded by ``base`` and ``key`` only (independent of any other draw), through NumPy's own
    ``SeedSequence``: what :meth:`Seeder.generator` reproduces."""
    ss = np.random.SeedSequence(base.entropy, spawn_key=(*base.spawn_key, *key), pool_size=base.pool_size)
    return np.random.Generator(np.random.PCG64(ss))


class Seeder:
    """Fast per-request generators: ``generator(tail)`` is in the state of the spawned child ``(*prefix, *tail)``.

    That is ``Generator(PCG64(SeedSequence(base.entropy, spawn_key=(*base.spawn_key, *prefix, *tail),
    pool_size=base.pool_size)))``, for tails of non-negative ints below 2³².

    - The states of all ``num_requests`` requests for one tail shape ``(rid, *rest)`` are computed together on
      first use.
    - The generator returned is shared: valid until the next call.
    """

    def __init__(self, base: np.random.SeedSequence, prefix: tuple[int, ...], num_requests: int) -> None:
        entropy, spawn = _words(base.entropy), _words((*base.spawn_key, *prefix))
        self.exact = entropy is not None and spawn is not None  # else every generator comes from keyed_rng
        self._base, self._prefix, self._n = base, prefix, num_requests
        self._bitgen = np.random.PCG64(0)
        self.rng = np.random.Generator(self._bitgen)
        self._state = self._bitgen.state
        self._cache: dict[tuple[int, ...], np.ndarray] = {}
        if entropy is None or spawn is None:
            return
        p = base.pool_size
        run = entropy + [0] * (p - len(entropy)) if len(entropy) < p else entropy  # spawn key: padded to the pool
        words = run + spawn
        pool = [0] * p
        h = _INIT_A

        def hashmix(v: int) -> int:
            nonlocal h
            v ^= h
            h = (h * _MULT_A) & _M32
            v = (v * h) & _M32
            return v ^ (v >> 16)

        def mix(x: int, y: int) -> int:
            r = (_MIX_L * x - _MIX_R * y) & _M32
            return r ^ (r >> 16)

        for i in range(p):
            pool[i] = hashmix(words[i] if i < len(words) else 0)
        for src in range(p):
            for dst in range(p):
                if src != dst:
                    pool[dst] = mix(pool[dst], hashmix(pool[src]))
        for src in range(p, len(words)):
            for dst in range(p):
                pool[dst] = mix(pool[dst], hashmix(words[src]))
        self._pool, self._hash = pool, h  # the pool after the prefix, and the hash constant the tail starts from

    def _states(self, rest: tuple[int, ...]) -> np.ndarray:
        """PCG64's four uint64 seed words (initstate hi, lo, initseq hi, lo) of every request for tail
        ``(rid, *rest)``: (num_requests, 4)."""
        u32 = np.uint32
        pool = [np.full(self._n, v, dtype=u32) for v in self._pool]
        h = self._hash
        tail = [np.arange(self._n, dtype=u32), *(np.full(self._n, r, dtype=u32) for r in rest)]
        for w in tail:
            for dst in range(len(pool)):
                v = w ^ u32(h)
                h = (h * _MULT_A) & _M32
                v = v * u32(h)
                v = v ^ (v >> u32(16))
                r = u32(_MIX_L) * pool[dst] - u32(_MIX_R) * v
                pool[dst] = r ^ (r >> u32(16))
        out = np.empty((self._n, 8), dtype=u32)
        h = _INIT_B
        for i in range(8):  # generate_state(4, uint64): 8 uint32 words cycling over the pool
            v = pool[i % len(pool)] ^ u32(h)
            h = (h * _MULT_B) & _M32
            v = v * u32(h)
            out[:, i] = v ^ (v >> u32(16))
        return out.astype("<u4").view("<u8").astype(np.uint64)

    def generator(self, rid: int, *rest: int) -> np.random.Generator:
        """The generator of tail ``(rid, *rest)`` (the shared one, its state set)."""
        if not self.exact or not 0 <= rid < self._n or (rest and (min(rest) < 0 or max(rest) > _M32)):
            return keyed_rng(self._base, *self._prefix, rid, *rest)
        states = self._cache.get(rest)
        if states is None:
            states = self._cache[rest] = self._states(rest)
        a, b, c, d = states[rid].tolist()
        inc = ((((c << 64) | d) << 1) | 1) & _M128
        state = (((inc + ((a << 64) | b)) & _M128) * _PCG_MULT + inc) & _M128
        st = self._state
        st["state"] = {"state": state, "inc": inc}
        self._bitgen.state = st
        return self.rng
