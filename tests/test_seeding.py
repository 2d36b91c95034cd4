"""repro.core.seeding: the oracle's generators are NumPy's own, bit for bit (every reference depends on it)."""

from __future__ import annotations

import numpy as np
import pytest

from repro.core.seeding import Seeder, keyed_rng

BASES = [
    np.random.SeedSequence(0),
    np.random.SeedSequence(12345),
    np.random.SeedSequence(2**40 + 7),  # two entropy words
    np.random.SeedSequence(2**130 + 99, spawn_key=(3,)),  # five entropy words and a spawn key of its own
    np.random.SeedSequence([1, 2, 3, 4, 5, 6]),  # a sequence of ints, longer than the pool
    np.random.SeedSequence(7, pool_size=8),
    np.random.SeedSequence(0x8F3A_12C4_55E0_9B71_0042_D00D_BEEF_CAFE),  # an OS-entropy-sized seed
]


@pytest.mark.parametrize("base", BASES, ids=range(len(BASES)))
@pytest.mark.parametrize("prefix", [(0, 0), (1, 1), (2, 2), (5,), ()])
def test_seeder_equals_numpy(base: np.random.SeedSequence, prefix: tuple[int, ...]) -> None:
    seeder = Seeder(base, prefix, 40)
    assert seeder.exact
    for rid in (0, 1, 17, 39):
        for rest in ((), (0,), (3,), (2**32 - 1,), (1, 2)):
            got = seeder.generator(rid, *rest)
            want = keyed_rng(base, *prefix, rid, *rest)
            assert np.array_equal(got.random(3), want.random(3)), (rid, rest)
            assert np.array_equal(got.beta(2.0, 0.5, size=5), want.beta(2.0, 0.5, size=5))
            assert got.integers(0, 2**62) == want.integers(0, 2**62)


def test_seeder_falls_back_outside_its_range() -> None:
    base = np.random.SeedSequence(3)
    seeder = Seeder(base, (0, 1), 4)
    for rid, rest in ((4, (0,)), (100, ()), (2, (2**33,))):  # beyond num_requests; a tail word over 32 bits
        assert np.array_equal(seeder.generator(rid, *rest).random(4), keyed_rng(base, 0, 1, rid, *rest).random(4))


def test_shared_generator_is_reset_on_each_call() -> None:
    seeder = Seeder(np.random.SeedSequence(0), (0, 1), 8)
    first = seeder.generator(3, 0).random(6)
    seeder.generator(5, 0).standard_normal(7)  # leaves PCG64 with a buffered half-word in some draws
    seeder.generator(5, 0).integers(0, 10, dtype=np.uint32)
    assert np.array_equal(seeder.generator(3, 0).random(6), first)
