"""vLLM's Sonnet sampler (``benchmarks/benchmark_serving.py``: ``sample_sonnet_requests``).

vLLM reads ``sonnet.txt`` line by line, tokenizes every line to get ``average_poem_len``, and builds each
prompt as
``base_prompt`` ("Pick as many lines as you can from these poem lines:\\n") + the first
``num_prefix_lines`` lines
(a prefix shared by all requests) + ``num_input_lines - num_prefix_lines`` lines drawn with replacement
(``random.choices``), wrapped in the chat template; with

    num_input_lines  = round((input_len  - base_prompt_offset) / average_poem_len)
    num_prefix_lines = round((prefix_len - base_prompt_offset) / average_poem_len)

where ``base_prompt_offset`` is the token count of the templated base prompt. The output length is fixed
(``--sonnet-output-len``, default 150; defaults input 550, prefix 200).

Deviation: the prompt length is the sum of per-line token counts plus the templated base prompt, instead of
re-tokenizing each concatenated prompt (exact for SentencePiece up to merges across line boundaries, which are
newlines and so rarely merge); the chat template is counted as a fixed number of tokens per family
(``workloads.tokens.CHAT_TEMPLATE_TOKENS``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workloads.tokens import CHAT_TEMPLATE_TOKENS, count_tokens

BASE_PROMPT = "Pick as many lines as you can from these poem lines:\n"


@dataclass(frozen=True, slots=True)
class SonnetLines:
    """Token counts of each line of sonnet.txt and of the templated base prompt."""

    line_tokens: np.ndarray  # int64 per line, in file order
    base_prompt_tokens: int
    how: str
    fallback: bool = False  # counts estimated (chars/4) for lack of the tokenizer file or package


@functools.lru_cache(maxsize=8)
def load_sonnet_lines(path: str, tokenizer: str | None) -> SonnetLines:
    """Tokenize each line of ``path`` (once per process)."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    tok_dir = Path(path).parent.parent / "tokenizers"
    counts = count_tokens(lines, tokenizer, tok_dir)
    base = int(count_tokens([BASE_PROMPT], tokenizer, tok_dir).counts[0])
    base += CHAT_TEMPLATE_TOKENS.get(tokenizer or "", 0)
    counts.counts.flags.writeable = False
    return SonnetLines(counts.counts, base, counts.how, fallback=tokenizer is not None and not counts.exact)


def sample_sonnet(
    lines: SonnetLines,
    num_requests: int,
    rng: np.random.Generator,
    *,
    input_len: int = 550,
    prefix_len: int = 200,
    output_len: int = 150,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(prompt_len, output_len)`` of ``num_requests`` Sonnet prompts, as vLLM builds them.

    ``lines.line_tokens`` may be the real per-line counts (sampled with replacement) or any sample of line
    lengths (the embedded table): random lines are drawn from it uniformly.
    """
    if input_len <= prefix_len:
        raise ValueError(f"sonnet needs input_len > prefix_len, got {input_len} <= {prefix_len}")
    offset = lines.base_prompt_tokens
    if prefix_len <= offset:
        raise ValueError(
            f"sonnet prefix_len {prefix_len} must exceed the templated base prompt ({offset} tokens)"
        )
    avg = float(lines.line_tokens.mean())
    num_input_lines = round((input_len - offset) / avg)
    num_prefix_lines = round((prefix_len - offset) / avg)
    prefix_tokens = int(lines.line_tokens[:num_prefix_lines].sum())
    k = num_input_lines - num_prefix_lines
    picks = rng.integers(0, len(lines.line_tokens), size=(num_requests, k))
    prompt = offset + prefix_tokens + lines.line_tokens[picks].sum(axis=1)
    return prompt.astype(np.int64), np.full(num_requests, output_len, dtype=np.int64)
