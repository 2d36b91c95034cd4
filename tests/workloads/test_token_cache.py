"""The disk cache of exact token counts (``workloads.tokens.cached``): a hit returns what the computation returned,
any change of an input is a miss, a broken or unwritable cache falls back to computing, and ``off`` turns it off."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from workloads import tokens


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _counter() -> tuple[list[int], Callable[[], list[np.ndarray]]]:
    calls: list[int] = []

    def compute() -> list[np.ndarray]:
        calls.append(1)
        return [np.array([3, 1, 4]), np.array([1, 5])]

    return calls, compute


def test_a_hit_returns_the_computed_counts_without_computing(cache: Path) -> None:
    calls, compute = _counter()
    first = tokens.cached([b"tok", b"texts"], compute)
    second = tokens.cached([b"tok", b"texts"], compute)
    assert len(calls) == 1
    assert [a.tolist() for a in second] == [a.tolist() for a in first] == [[3, 1, 4], [1, 5]]
    assert len(list((cache / "tokens").glob("*.npz"))) == 1


@pytest.mark.parametrize("other", [[b"tok", b"texts!"], [b"tok2", b"texts"], [b"toktexts"], [b"texts", b"tok"]])
def test_any_change_of_the_key_is_a_miss(cache: Path, other: list[bytes]) -> None:
    calls, compute = _counter()
    tokens.cached([b"tok", b"texts"], compute)
    tokens.cached(other, compute)
    assert len(calls) == 2


def test_a_broken_cache_file_is_recomputed_and_off_turns_it_off(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, compute = _counter()
    tokens.cached([b"k"], compute)
    (path,) = (cache / "tokens").glob("*.npz")
    path.write_bytes(b"not an npz")
    assert tokens.cached([b"k"], compute)[0].tolist() == [3, 1, 4]
    assert len(calls) == 2
    monkeypatch.setenv("REPRO_CACHE_DIR", "off")
    assert tokens.cache_dir() is None
    tokens.cached([b"k"], compute)
    assert len(calls) == 3


def test_an_unwritable_cache_still_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("REPRO_CACHE_DIR", str(blocker / "sub"))  # under a file: mkdir fails
    calls, compute = _counter()
    assert tokens.cached([b"k"], compute)[1].tolist() == [1, 5]
    assert len(calls) == 1


def test_cached_and_uncached_counts_agree_on_a_real_tokenizer(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workloads.datasets import default_data_root

    root = default_data_root()
    tok_dir = root / "tokenizers" if root is not None else None
    if tok_dir is None or tokens.tokenizer_problem("llama2", tok_dir) is not None:
        pytest.skip("needs $REPRO_DATA/tokenizers/llama2_tokenizer.model and sentencepiece (pinned: the data folder)")
    texts = ["Hello world", "Speculative decoding accepts the longest matching prefix.", ""]
    cold = tokens.count_tokens(texts, "llama2", tok_dir)
    warm = tokens.count_tokens(texts, "llama2", tok_dir)
    monkeypatch.setenv("REPRO_CACHE_DIR", "off")
    plain = tokens.count_tokens(texts, "llama2", tok_dir)
    assert cold.counts.tolist() == warm.counts.tolist() == plain.counts.tolist()
    assert cold.exact and warm.exact and warm.how == plain.how == "llama2 tokenizer"
