"""The prompts a real backend sends (``backend=hf``, ``backend=openai``): each request's own prompt, as token ids of
the target model's tokenizer, where its dataset has the prompt; synthetic random ids of its length elsewhere.

A request drawn from a dataset record (:attr:`~workloads.build.RequestTable.prompt_record`) gets that record's prompt:

- token ids recorded in the target's tokenizer family (ShareGPT's token files for a Llama-3 target): as recorded;
- token ids of another family (ShareGPT's Llama-3 ids for a Llama-2 or Qwen target): decoded and encoded again with
  the target's tokenizer, as the workload counted them;
- text: encoded with the target's tokenizer (no special tokens: what the workload counted).

The ids are then fitted to the request's prompt length, the one the simulator uses: cut where the workload shortened
the prompt (``max_model_len``, ``prompt_mean``), repeated where it is longer than the text (an estimated count).
Lengths-only sources (traces, quantile tables, fixed or assumed lengths, span files), a tokenizer that cannot be
loaded, and a model whose vocabulary is smaller than the tokenizer's (the ``tiny`` stand-ins) send synthetic ids,
and :attr:`Prompts.how` says so and why. Encoded prompts are cached on disk like token counts
(:func:`workloads.tokens.cached`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workloads.datasets import LengthRecords
from workloads.tokens import cached, load_id_encoder, load_llama3_decoder, tokenizer_key, tokenizer_problem


@dataclass(frozen=True)
class Prompts:
    """Each request's prompt ids (``None``: synthetic, the backend's own random ids) and one line saying how."""

    ids: list[list[int] | None]
    how: str

    @property
    def real(self) -> int:
        """How many requests send their dataset's prompt."""
        return sum(x is not None for x in self.ids)


def fit_length(ids: list[int], n: int) -> list[int]:
    """``ids`` cut to ``n`` tokens, or repeated until they reach ``n`` (an empty prompt stays empty)."""
    if not ids or len(ids) >= n:
        return list(ids[:n])
    reps = -(-n // len(ids))
    return (list(ids) * reps)[:n]


def prompt_ids(table: Any, family: str | None, vocab_size: int, root: Path | None) -> Prompts:
    """The prompts of ``table``'s requests for a target of tokenizer ``family`` and ``vocab_size`` ids, the
    tokenizers read from ``root/tokenizers`` (module docstring)."""
    n = len(table)
    out: list[list[int] | None] = [None] * n
    rec = table.prompt_record
    if rec is None or not (np.asarray(rec) >= 0).any():
        return Prompts(out, f"prompts: synthetic random token ids for all {n} requests (the workload's sources carry "
                            "lengths only)")
    sources = dict(table.prompt_sources)
    why: list[str] = []
    for label, records in sources.items():
        rows = np.flatnonzero((np.asarray(table.dataset) == label) & (np.asarray(rec) >= 0))
        if not rows.size:
            continue
        encoded, problem = _encode(records, [int(r) for r in np.asarray(rec)[rows]], family, root)
        if encoded is None:
            why.append(f"{label}: {problem}")
            continue
        top = max((max(ids) for ids in encoded if ids), default=-1)
        if top >= vocab_size:
            why.append(f"{label}: {family} ids reach {top}, past the model's vocabulary of {vocab_size}")
            continue
        for i, ids in zip(rows.tolist(), encoded, strict=True):
            fitted = fit_length(ids, int(table.prompt_len[i]))
            out[i] = fitted if len(fitted) == int(table.prompt_len[i]) else None  # an empty text: synthetic
    real = sum(x is not None for x in out)
    because = f" ({'; '.join(why)})" if why else " (lengths-only sources)"
    if not real:
        return Prompts(out, f"prompts: synthetic random token ids for all {n} requests{because}")
    head = f"prompts: the dataset's own for {real} of {n} requests ({family} token ids)"
    return Prompts(out, head if real == n else f"{head}, synthetic random token ids for {n - real}{because}")


def _encode(records: LengthRecords, idx: list[int], family: str | None,
            root: Path | None) -> tuple[list[list[int]] | None, str]:
    """The prompts of records ``idx`` as ``family`` ids, or (None, why not)."""
    if family is None:
        return None, "the model names no tokenizer family"
    if records.prompt_ids is not None and records.ids_family == family:
        return [list(records.prompt_ids[i]) for i in idx], ""
    if records.prompt_ids is None and records.prompt_text is None:
        return None, "the source has no prompt text"
    tok_dir = root / "tokenizers" if root is not None else None
    needs = [family] + (["llama3"] if records.prompt_text is None and records.ids_family == "llama3" else [])
    for fam in needs:
        problem = tokenizer_problem(fam, tok_dir)
        if problem is not None:
            return None, problem
    assert tok_dir is not None
    encode = load_id_encoder(family, str(tok_dir))
    if records.prompt_text is not None:
        texts = [records.prompt_text[i] for i in idx]
        key = [*tokenizer_key(family, tok_dir), b"prompt-ids", *(t.encode("utf-8", "surrogatepass") for t in texts)]
    else:
        assert records.prompt_ids is not None and records.ids_family is not None
        decode = load_llama3_decoder(str(tok_dir))
        if decode is None:
            return None, "the llama3 tokenizer failed to load"
        recorded = [list(records.prompt_ids[i]) for i in idx]
        texts = [decode(ids) for ids in recorded]
        key = [*tokenizer_key(family, tok_dir), *tokenizer_key("llama3", tok_dir), b"prompt-ids-from-llama3",
               *(np.asarray(ids, dtype=np.int64).tobytes() for ids in recorded)]
    if encode is None:
        return None, f"the {family} tokenizer failed to load"
    coder: Callable[[list[str]], list[list[int]]] = encode
    arrays = cached(key, lambda: [np.asarray(ids, dtype=np.int64) for ids in coder(texts)])
    return [a.tolist() for a in arrays], ""
