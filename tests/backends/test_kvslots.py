"""``backend=hf``'s KV pool (:class:`repro.backends.kvslots.KvSlots`) and the ragged passes over it: a pass over
sequences of different cached lengths gives each the logits of its own uncached forward, attention reads consecutive
slots in place (no copy of the cache), and the bookkeeping (commit, crop, a tree's kept path, swaps, growth) keeps
exactly the tokens it should. ``REPRO_TEST_DEVICE=cuda`` runs them on a GPU (float32)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch", reason="backend=hf needs PyTorch: pip install torch==2.13.0 (CPU build)")
pytest.importorskip("transformers", reason="backend=hf needs transformers: pip install -e '.[real]'")

import torch

from repro.backends.kvslots import KvSlots
from repro.backends.models import build_model
from repro.backends.ragged import Item, Runner, chain_mask, tree_mask

pytestmark = pytest.mark.usefixtures("no_data")
DEVICE = torch.device(os.environ.get("REPRO_TEST_DEVICE", "cpu"))


@pytest.fixture(scope="module")
def runner() -> Runner:
    torch.manual_seed(0)
    return Runner(build_model("llama-68m", tiny=True, seed=5, device=str(DEVICE), dtype="float32"))


def _full(runner: Runner, toks: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return runner.model(input_ids=torch.tensor([toks], device=runner.device)).logits[0].float()


def _prefill(runner: Runner, rid: int, toks: list[int]) -> None:
    with torch.inference_mode():
        runner.forward([Item(rid, 0, toks, list(range(len(toks))), chain_mask(torch, len(toks), runner.device))])
    runner.kv.commit(rid, len(toks))


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1)])
def test_a_ragged_pass_over_the_pool_gives_each_sequence_its_own_logits(runner: Runner,
                                                                        order: tuple[int, ...]) -> None:
    """Three requests with 5, 9 and 13 cached tokens, then one pass of 3 new tokens each (in any item order): each
    request's logits equal its whole text's forward without a cache, and the committed cache serves the next step."""
    runner.kv.clear()
    g = torch.Generator().manual_seed(1)
    texts = {rid: torch.randint(0, runner.vocab, (n + 4,), generator=g).tolist()
             for rid, n in zip((10, 11, 12), (5, 9, 13), strict=True)}
    for rid, t in texts.items():
        _prefill(runner, rid, t[:-4])
    rids = [(10, 11, 12)[i] for i in order]
    items = [Item(r, len(texts[r]) - 4, texts[r][-4:-1], list(range(len(texts[r]) - 4, len(texts[r]) - 1)),
                  chain_mask(torch, 3, runner.device)) for r in rids]
    with torch.inference_mode():
        logits = runner.forward(items)
    for r, lg in zip(rids, logits, strict=True):
        want = _full(runner, texts[r][:-1])[-3:]
        torch.testing.assert_close(lg, want, rtol=1e-4, atol=1e-4)
        runner.kv.commit(r, len(texts[r]) - 1)
    with torch.inference_mode():  # the next decode reads what was committed
        last = runner.forward([Item(r, len(texts[r]) - 1, texts[r][-1:], [len(texts[r]) - 1],
                                    chain_mask(torch, 1, runner.device)) for r in rids])
    for r, lg in zip(rids, last, strict=True):
        torch.testing.assert_close(lg[0], _full(runner, texts[r])[-1], rtol=1e-4, atol=1e-4)


def test_a_tree_pass_keeps_the_accepted_path_as_the_cache(runner: Runner) -> None:
    """A tree of 4 nodes after a request's last token (root, two children of it, a grandchild under the second):
    keeping the path root -> second child -> grandchild leaves the cache equal to decoding that path as a chain."""
    runner.kv.clear()
    toks = torch.randint(0, runner.vocab, (8,), generator=torch.Generator().manual_seed(2)).tolist()
    _prefill(runner, 1, toks[:-1])
    a, b, c = 7, 11, 13
    parents = [-1, -1, 1]  # nodes a, b under the root; c under b
    with torch.inference_mode():
        runner.forward([Item(1, 7, [toks[-1], a, b, c], [7, 8, 8, 9], tree_mask(torch, parents, runner.device))])
    runner.kv.keep(1, 7, [0, 2, 3])
    assert runner.kv.length(1) == 10
    with torch.inference_mode():
        lg = runner.forward([Item(1, 10, [5], [10], chain_mask(torch, 1, runner.device))])[0]
    torch.testing.assert_close(lg[0], _full(runner, [*toks, b, c, 5])[-1], rtol=1e-4, atol=1e-4)


def test_consecutive_slots_are_read_in_place_and_others_gathered() -> None:
    """Attention reads a view of the pool's buffer for consecutive slots (no copy), a gather otherwise."""
    pool = KvSlots(torch, 2, 1, 4, torch.float32, DEVICE)
    pool.fill_random([0, 1, 2], 5)
    with torch.inference_mode():
        for slots, in_place in (([0, 1, 2], True), ([1, 2], True), ([0, 2], False)):
            cache = pool.pass_cache(slots, [5] * len(slots), 1)
            k = torch.ones(len(slots), 1, 1, 4, device=DEVICE)
            keys, _ = cache.update(k, k, 1)
            shares = keys.untyped_storage().data_ptr() == pool.buf.untyped_storage().data_ptr()
            assert shares == in_place, slots
            assert keys.shape == (len(slots), 1, 6, 4) and torch.equal(keys[:, :, 5], k[:, :, 0])
            assert torch.equal(keys[:, :, :5], pool.buf[1, 0, slots, :, :5])


def test_the_pool_keeps_what_its_caller_commits() -> None:
    """commit, crop, keep, swap and growth: the cache is always the tokens written and kept, in order."""
    pool = KvSlots(torch, 1, 1, 2, torch.float32, DEVICE, slots=1)
    with torch.inference_mode():
        def write(rid: int, start: int, vals: list[float]) -> None:
            slot = pool.reserve([rid], start + len(vals))[0]
            x = torch.tensor(vals, dtype=torch.float32, device=DEVICE)[None, None, :, None].expand(1, 1, len(vals), 2)
            pool.write(0, torch.tensor([[slot] * len(vals)], device=DEVICE),
                       torch.arange(start, start + len(vals), device=DEVICE)[None], x, x)

        def held(rid: int) -> list[float]:
            return pool.get(rid)[0, 0, 0, :, 0].tolist()

        write(3, 0, [1, 2, 3])
        assert held(3) == [] and 3 in pool  # written, not yet committed
        pool.commit(3, 3)
        assert held(3) == [1, 2, 3]
        write(3, 3, [4, 5, 6, 7])  # a tree: keep nodes 0, 2, 3
        pool.keep(3, 3, [0, 2, 3])
        assert held(3) == [1, 2, 3, 4, 6, 7]
        pool.crop(3, 4)
        assert held(3) == [1, 2, 3, 4]
        write(8, 0, [9])  # a second request: the pool doubles its slots, what it held kept
        pool.commit(8, 1)
        assert pool.capacity == (2, 256) and held(3) == [1, 2, 3, 4] and held(8) == [9]
        write(8, 1, [0.5] * 300)  # past its tokens: grown to the next power of two
        pool.commit(8, 301)
        assert pool.capacity == (2, 512) and held(3) == [1, 2, 3, 4]
        pool.swap(3, to_host=True)
        write(5, 0, [7])  # the freed slot is reused while 3 is on the host
        pool.commit(5, 1)
        assert pool.capacity == (2, 512) and held(3) == [1, 2, 3, 4]
        pool.pop(5)
        pool.swap(3, to_host=False)
        assert held(3) == [1, 2, 3, 4] and pool.length(3) == 4
        pool.crop(3, 0)
        assert 3 not in pool and pool.get(3) is None and pool.pop(3, "none") == "none"


def test_a_first_buffer_is_what_is_asked_and_growth_at_least_doubles() -> None:
    """The profiler's cell of 64 sequences at 2,049 tokens gets 64 slots of 2,304 tokens (not a power of two past
    it: a cell that fits the device's memory fits the pool); a pool that must grow at least doubles what it lacks."""
    pool = KvSlots(torch, 1, 1, 2, torch.float32, DEVICE)
    pool.fill_random(list(range(64)), 2049)
    assert pool.capacity == (64, 2304)
    pool.reserve([100], 10)
    assert pool.capacity == (128, 2304)
    pool.reserve([0, 1], 2400)
    assert pool.capacity == (128, 4608) and pool.length(0) == 2049
    pool.clear()
    assert pool.capacity == (0, 0) and 0 not in pool


def test_a_pass_cache_is_freed_when_dropped_not_at_the_next_garbage_collection(runner: Runner) -> None:
    """A pass's transformers ``Cache`` holds no reference cycle and keeps nothing it returned, so the pool's buffer
    (or a grown-out one, or a pass's gathered keys) is freed with it. On an H100 a cycle kept every cell's pool of
    the profiler alive until Python's collector ran: a 16 GiB pool then did not fit beside the 7B model."""
    import gc
    import weakref

    pool = KvSlots(torch, 2, 1, 4, torch.float32, DEVICE)
    pool.fill_random([0, 2], 5)
    was = gc.isenabled()
    gc.disable()
    try:
        with torch.inference_mode():
            cache = pool.pass_cache([0, 2], [5, 5], 1)  # slots apart: each layer gathers its keys
            k = torch.ones(2, 1, 1, 4, device=DEVICE)
            for layer in cache.layers:
                layer.update(k, k, 0)
        gone = weakref.ref(cache)
        del cache, layer
        assert gone() is None
        runner.kv.clear()
        _prefill(runner, 3, [1, 2, 3, 4])
        runner.kv.clear()
        assert not [o for o in gc.get_objects() if type(o).__name__ in ("SlotLayer", "PassCache")]
    finally:
        if was:
            gc.enable()
