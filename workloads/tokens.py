"""Token counting with the target model family's tokenizer, or an estimate when its file is absent.

Tokenizer files are read from ``<data root>/tokenizers/`` (see docs/data.md):

- ``llama2``: ``llama2_tokenizer.model`` (SentencePiece; also Vicuna v1.5),
- ``llama3``: ``llama3_tokenizer.model`` (tiktoken BPE with the Llama-3 split pattern),
- ``qwen``: ``qwen.tiktoken`` (tiktoken BPE with the Qwen split pattern).

Counts exclude special tokens (no BOS), matching the Llama-3 token-id ShareGPT files, whose ``input_tok_ids`` start
without ``<|begin_of_text|>``. ``sentencepiece`` (Llama-2) and ``tiktoken`` (Llama-3, Qwen) are imported lazily and
are optional: when the package or the file is missing, :func:`count_tokens` falls back to the estimate
``ceil(chars / 4)`` (the usual "about four characters per token" rule for English BPE vocabularies), reports
``exact=False`` and says which of the two is missing (:func:`tokenizer_problem`: the file to provide, or the package
and how to install it).

Exact counts are cached on disk (:func:`cached`): loading a tokenizer and encoding a dataset costs about half a
second per process (ShareGPT's Llama-3 ids decoded and re-tokenized), more than a 1,000-request simulation. The key
is a hash of everything the counts depend on: the tokenizer files' bytes, the family, the inputs (the texts, or the
data files' bytes) and :data:`CACHE_VERSION`, so a changed file or tokenizer is never served stale counts. The
folder is ``$REPRO_CACHE_DIR``, else ``$XDG_CACHE_HOME/specrepro`` (``~/.cache/specrepro``);
``REPRO_CACHE_DIR=off`` turns the cache off. A folder that cannot be written is skipped silently.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TOKENIZER_FAMILIES: tuple[str, ...] = ("llama2", "llama3", "qwen")

_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_FILES = {"llama2": "llama2_tokenizer.model", "llama3": "llama3_tokenizer.model", "qwen": "qwen.tiktoken"}
_PACKAGES = {"llama2": "sentencepiece", "llama3": "tiktoken", "qwen": "tiktoken"}

#: Chat-template overhead in tokens (special tokens count one each), used by the Sonnet sampler the way vLLM's
#: ``apply_chat_template(..., add_generation_prompt=True)`` adds them: Llama-2 ``<s>[INST] ... [/INST]``,
#: Llama-3 ``<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n...<|eot_id|><|start_header_id|>
#: assistant<|end_header_id|>\n\n``, Qwen ``<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n``.
CHAT_TEMPLATE_TOKENS: dict[str, int] = {"llama2": 9, "llama3": 12, "qwen": 9}

CHARS_PER_TOKEN_ESTIMATE = 4.0
CACHE_VERSION = 1  # bump when the way counts are computed changes (it is part of every cache key)


class TokenizerUnavailable(RuntimeError):
    """A tokenizer whose file and package are there failed to load."""


def cache_dir() -> Path | None:
    """Where exact token counts are cached (module docstring), or None when the cache is off."""
    env = os.environ.get("REPRO_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specrepro"


def cached(key: Iterable[bytes], compute: Callable[[], list[np.ndarray]]) -> list[np.ndarray]:
    """``compute()`` (int64 arrays), read from the disk cache under the hash of ``key`` when it is there, else
    computed and written (atomically) for the next process."""
    folder = cache_dir()
    if folder is None:
        return compute()
    h = hashlib.sha256(f"specrepro-tokens-v{CACHE_VERSION}".encode())
    for part in key:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    path = folder / "tokens" / f"{h.hexdigest()[:32]}.npz"
    try:
        with np.load(path) as data:
            return [data[f"a{i}"] for i in range(len(data.files))]
    except (OSError, ValueError, KeyError):
        pass
    out = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
        with os.fdopen(fd, "wb") as fh:
            arrays: dict[str, Any] = {f"a{i}": np.asarray(a, dtype=np.int64) for i, a in enumerate(out)}
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except OSError:
        pass
    return out


def file_bytes(*paths: Path) -> list[bytes]:
    """Cache-key parts for files: each one's name and bytes."""
    return [part for p in paths for part in (p.name.encode(), p.read_bytes())]


def tokenizer_key(family: str, tokenizer_dir: Path | str) -> list[bytes]:
    """Cache-key parts for a tokenizer: its family and its file's bytes."""
    return [family.encode(), *file_bytes(Path(tokenizer_dir) / _FILES[family])]


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """Token counts for a list of texts and how they were obtained."""

    counts: np.ndarray  # int64, one per text
    exact: bool  # True when the tokenizer file was used
    how: str  # e.g. "llama2 tokenizer" or "estimate chars/4 (tiktoken is not installed: pip install tiktoken ...)"


def estimate_tokens(texts: Sequence[str]) -> np.ndarray:
    """Estimate token counts as ``ceil(len(text) / 4)`` (at least 1 for non-empty text)."""
    return np.array([math.ceil(len(t) / CHARS_PER_TOKEN_ESTIMATE) for t in texts], dtype=np.int64)


def tokenizer_problem(family: str, tokenizer_dir: Path | str | None) -> str | None:
    """Why ``family``'s tokenizer cannot be used (the missing file, or the missing package and how to install it),
    or None when it can. Checked at call time (not cached), so installing the package takes effect at once."""
    if family not in _FILES:
        raise ValueError(f"unknown tokenizer family {family!r}; expected one of {TOKENIZER_FAMILIES}")
    if tokenizer_dir is None:
        return f"no data folder: set $REPRO_DATA to a folder with tokenizers/{_FILES[family]}"
    if not (Path(tokenizer_dir) / _FILES[family]).is_file():
        return f"no {family} tokenizer file $REPRO_DATA/tokenizers/{_FILES[family]}"
    package = _PACKAGES[family]
    try:
        importlib.import_module(package)
    except ImportError:
        return f"{package} is not installed: pip install {package}, or pip install -e '.[data]'"
    return None


@functools.lru_cache(maxsize=8)
def load_encoder(family: str, tokenizer_dir: str) -> Callable[[list[str]], list[int]] | None:
    """Return a batch counter ``texts -> counts`` for ``family``, or None when the file/package is missing."""
    encode = load_id_encoder(family, tokenizer_dir)
    return None if encode is None else (lambda texts: [len(ids) for ids in encode(texts)])


@functools.lru_cache(maxsize=8)
def load_id_encoder(family: str, tokenizer_dir: str) -> Callable[[list[str]], list[list[int]]] | None:
    """Return a batch encoder ``texts -> token ids`` for ``family`` (no special tokens: what :func:`count_tokens`
    counts), or None when the file/package is missing."""
    if family not in _FILES:
        raise ValueError(f"unknown tokenizer family {family!r}; expected one of {TOKENIZER_FAMILIES}")
    path = Path(tokenizer_dir) / _FILES[family]
    if not path.is_file():
        return None
    if family == "llama2":
        try:
            import sentencepiece as spm
        except ImportError:
            return None
        sp = spm.SentencePieceProcessor(model_file=str(path))
        return lambda texts: [list(ids) for ids in sp.encode(list(texts))]
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError:
        return None
    ranks = load_tiktoken_bpe(str(path))
    if family == "llama3":
        specials = {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001}
        pattern = _LLAMA3_PATTERN
    else:
        specials = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
        pattern = _QWEN_PATTERN
    enc = tiktoken.Encoding(name=family, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    return lambda texts: [list(ids) for ids in enc.encode_ordinary_batch(list(texts))]


@functools.lru_cache(maxsize=2)
def load_llama3_decoder(tokenizer_dir: str) -> Callable[[list[int]], str] | None:
    """Decoder for Llama-3 token ids (to re-tokenize the ShareGPT token files for another family)."""
    path = Path(tokenizer_dir) / _FILES["llama3"]
    if not path.is_file():
        return None
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError:
        return None
    enc = tiktoken.Encoding(
        name="llama3-dec",
        pat_str=_LLAMA3_PATTERN,
        mergeable_ranks=load_tiktoken_bpe(str(path)),
        special_tokens={},
    )
    return lambda ids: enc.decode(ids)


def count_tokens(texts: Sequence[str], family: str | None, tokenizer_dir: Path | None) -> TokenCounts:
    """Count tokens of ``texts`` with ``family``'s tokenizer from ``tokenizer_dir``, else estimate them."""
    if family is None:
        return TokenCounts(estimate_tokens(texts), False, "estimate chars/4 (no tokenizer family given)")
    problem = tokenizer_problem(family, tokenizer_dir)
    if problem is None:
        assert tokenizer_dir is not None

        def count() -> list[np.ndarray]:  # the tokenizer is loaded only when the counts are not cached
            encoder = load_encoder(family, str(tokenizer_dir))
            if encoder is None:
                raise TokenizerUnavailable(f"{family} tokenizer failed to load")
            return [np.asarray(encoder(list(texts)), dtype=np.int64)]

        key = [*tokenizer_key(family, tokenizer_dir), b"texts", *(t.encode("utf-8", "surrogatepass") for t in texts)]
        try:
            (counts,) = cached(key, count)
            return TokenCounts(counts, True, f"{family} tokenizer")
        except TokenizerUnavailable as exc:
            problem = str(exc)
    return TokenCounts(estimate_tokens(texts), False, f"estimate chars/4 ({problem})")
