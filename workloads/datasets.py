"""Loaders for the real dataset and trace files (docs/data.md) and the hub-only sets.

- Every loader returns :class:`LengthRecords`: per-record prompt and reference-output token counts in the target
  model family's tokenizer (or the counts the file ships with, named in ``tokenizer``).
- ``-1`` marks a record without reference output; the sampler then draws one from the ShareGPT output-length
  marginal (``workloads.sampling``).
- Loaders are cached per (dataset, data root, tokenizer) for the process: tokens are counted once.
- A missing file raises :class:`DataMissingError` naming the file to provide.

Prompt/output construction per dataset (``name``: prompt → output):

- ``sharegpt``: the Llama-3 token-id file 300b (exact counts; re-tokenized by decoding the ids for llama2/qwen;
  ``variant="tokens_long"``: file 300a, a long-output subset; ``"tokens_all"``: both);
  ``variant="v3_first_turn"``: first human turn of the 1,000 V3 conversations (no output);
  ``variant="v3_full"`` (hub only): ``ShareGPT_V3_unfiltered_cleaned_split.json``, first turn → second turn.
  vLLM's ``sample_sharegpt_requests`` rules are applied by the builder (see ``vllm_sharegpt_keep``);
  ``sampler: vllm_benchmark`` also takes its order (``vllm_benchmark_order``) and models EOS (``workloads.lengths``).
- ``alpaca``: instruction + "\\n" + input (when non-empty) → output. ``variant="full"`` (hub):
  ``alpaca_data.json``.
- ``arxiv``: Vidur's ArXiv-summarization length table (Llama-2 counts, no text). ``variant="text"`` (hub).
- ``specbench`` and its parts ``specbench_<category>`` (mt_bench, translation, summarization, qa,
  math_reasoning, rag): first turn → ``reference`` when present; ``cnn_dailymail`` = the summarization part
  (``variant="full"``: hub CNN/DailyMail ``test.jsonl`` article → highlights); ``gsm8k``: question → answer.
- ``mtbench``: first turn → none. ``mbpp``: text + test asserts → code. ``spider``: question → SQL query.
  ``chatbot_arena``: first turn → none (``variant="full"``: hub conversations, first user → first assistant
  turn). ``awesome_prompts``: prompt → none.
- traces ``azure2023_conv``, ``azure2023_code``, ``mooncake``, ``adaserve_<file stem>``, hub ``burstgpt``,
  ``azure2024_conv``/``azure2024_code``: the lengths the trace records (its own tokenizer), plus timestamps.
- hub-only text sets: ``openorca``, ``chatbot_instruction_prompts``, ``minithinky``, ``hle``.

Elsewhere: a user's own trace file (``workload=trace_file``) in ``workloads.tracefile``; any Hugging Face dataset
(``name: hf``, through the optional ``datasets`` package) in ``workloads.hf``. Sources name files under the data
root as ``$REPRO_DATA/<path>`` (``workloads.provenance.show_path``).
"""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repro.core import errors
from repro.core.env import environment
from workloads.provenance import show_path
from workloads.tokens import (
    TokenizerUnavailable,
    cached,
    count_tokens,
    file_bytes,
    load_encoder,
    load_llama3_decoder,
    tokenizer_key,
    tokenizer_problem,
)

SPECBENCH_PARTS: tuple[str, ...] = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
_MT_BENCH_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)


class DataMissingError(errors.DataMissingError, FileNotFoundError):
    """A dataset file is not available locally; the message names the file to provide."""


@dataclass(frozen=True, slots=True)
class LengthRecords:
    """Per-record token counts of one dataset (arrays are read-only)."""

    name: str
    prompt_len: np.ndarray  # int64
    output_len: np.ndarray  # int64, -1 where the file has no reference output
    source: str  # e.g. "real file $REPRO_DATA/alpaca/alpaca_5000.json (5000 records, llama2 tokenizer)"
    timestamps_s: np.ndarray | None = None  # traces only: arrival time of each record (seconds)
    tpot_slo_ratio: np.ndarray | None = None  # AdaServe artifact only: slo_ratio per record
    fallback: bool = False  # token counts estimated (or left in another family's) for lack of a tokenizer
    # the prompts themselves, where the data has them (what a real backend sends: workloads.prompts): each record's
    # text, and/or its token ids in tokenizer family ``ids_family`` (ShareGPT's token files: Llama-3 ids)
    prompt_text: tuple[str, ...] | None = field(default=None, compare=False, repr=False)
    prompt_ids: tuple[list[int], ...] | None = field(default=None, compare=False, repr=False)
    ids_family: str | None = None


def default_data_root(data_dir: str | None = None) -> Path | None:
    """Resolve the data folder: ``data_dir`` if given, else ``$REPRO_DATA``, else ``<repo>/../shared/data``.

    Read at call time (never at import). Returns None when no folder is found. A ``data_dir`` or ``$REPRO_DATA``
    that names no folder raises :class:`DataMissingError` (one line naming the setting); an existing empty folder
    is valid: every loader then falls back to the embedded statistics.
    """
    if data_dir:
        return trace_data_root(_existing_dir(Path(data_dir), f"workload.data_dir={data_dir}"))
    env = os.environ.get("REPRO_DATA")
    if env:
        return trace_data_root(_existing_dir(Path(env), f"REPRO_DATA={env}"))
    guess = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return trace_data_root(guess if guess.is_dir() else None)


@contextmanager
def data_folder(path: str | Path) -> Iterator[None]:
    """``$REPRO_DATA`` set to ``path`` inside the block (an empty folder: every loader serves its embedded
    statistics), restored after it."""
    with environment("REPRO_DATA", str(path)):
        yield


def trace_data_root(root: Path | None) -> Path | None:
    """``root``, appended as one line to the file ``$REPRO_DATA_TRACE`` names, if set (child processes inherit it):
    the test suite's record of which tests read which data folder (tests/data_record.py)."""
    trace = os.environ.get("REPRO_DATA_TRACE")
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{root.resolve() if root is not None else ''}\n")
    return root


def check_data_root(data_dir: str | None = None) -> Path | None:
    """Validate the data folder up front (CLI): the folder :func:`default_data_root` resolves, or None when there
    is none; :class:`DataMissingError` when ``data_dir`` or ``$REPRO_DATA`` names no folder."""
    return default_data_root(data_dir)


def _existing_dir(path: Path, setting: str) -> Path:
    if path.is_dir():
        return path
    why = "not a folder" if path.exists() else "no such folder"
    raise DataMissingError(f"{setting}: {why} (point it at a data folder laid out as in docs/data.md, or unset it)")


def find_user_path(path: str, root: Path | None, what: str) -> tuple[Path, str]:
    """A user's file or folder ``path``: as given (relative to the working directory), else under the data root.

    Returns the path and how notes show it (``$REPRO_DATA/...`` under the data root, else as given); a missing
    path raises :class:`DataMissingError` naming it (``what``: e.g. "workload.path").
    """
    p = Path(path).expanduser()
    if not p.exists() and not p.is_absolute() and root is not None and (root / p).exists():
        p = root / p
    if not p.exists():
        also = f" (nor {root / path})" if root is not None and not Path(path).expanduser().is_absolute() else ""
        raise DataMissingError(f"{what}={path}: no such file or folder{also}")
    shown = show_path(p, root)
    return p, shown if shown.startswith("$REPRO_DATA/") else path


def _require(root: Path | None, rel: str, hf_id: str | None = None) -> Path:
    path = (root / rel) if root is not None else None
    if path is None or not path.is_file():
        where = f"$REPRO_DATA/{rel}" if root is None else str(root / rel)
        hub = f" (Hugging Face: datasets.load_dataset({hf_id!r}))" if hf_id else ""
        raise DataMissingError(f"dataset file missing: provide {where}{hub}")
    return path


def _frozen(a: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(a, dtype=np.int64)
    arr.flags.writeable = False
    return arr


def _counted(
    name: str, path: Path, root: Path, tokenizer: str | None, prompts: list[str], outputs: list[str | None]
) -> LengthRecords:
    """Count prompt and output tokens and package them; ``None`` outputs become -1."""
    tok_dir = root / "tokenizers"
    p = count_tokens([str(x) for x in prompts], tokenizer, tok_dir)
    present = [str(o) for o in outputs if o is not None]
    o = count_tokens(present, tokenizer, tok_dir)
    out = np.full(len(outputs), -1, dtype=np.int64)
    out[[i for i, x in enumerate(outputs) if x is not None]] = o.counts
    no_out = "" if present else ", no reference outputs"
    src = f"real file {show_path(path, root)} ({len(prompts)} records, {p.how}{no_out})"
    return LengthRecords(name, _frozen(p.counts), _frozen(out), src, fallback=tokenizer is not None and not p.exact,
                         prompt_text=tuple(str(x) for x in prompts))


def _jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _json(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------- ShareGPT


def vllm_sharegpt_keep(
    prompt_len: np.ndarray, output_len: np.ndarray, fixed_output_len: int | None
) -> np.ndarray:
    """vLLM ``sample_sharegpt_requests`` pruning: drop prompt < 4, output < 4 (unless fixed), prompt > 1024,
    prompt + output > 2048."""
    short = (prompt_len < 4) | ((output_len < 4) if fixed_output_len is None else False)
    long = (prompt_len > 1024) | (prompt_len + output_len > 2048)
    return ~(short | long)


#: ``args.seed``'s default in vLLM's ``benchmarks/benchmark_serving.py`` (``random.seed(args.seed)`` in ``main``).
VLLM_BENCHMARK_SEED = 0


def vllm_benchmark_order(num_records: int, seed: int = VLLM_BENCHMARK_SEED) -> np.ndarray:
    """The order in which vLLM's 0.6-era ``benchmark_serving.py`` visits ``num_records`` records (file order, after
    dropping conversations with fewer than two turns): ``random.seed(seed); random.shuffle(dataset)``. A shuffle's
    permutation depends on the list's length only, so shuffling the indices gives the records' order; a private
    ``random.Random(seed)`` leaves the module-level generator alone."""
    order = list(range(num_records))
    random.Random(seed).shuffle(order)
    return np.asarray(order, dtype=np.int64)


def vllm_benchmark_pool(
    prompt_len: np.ndarray, output_len: np.ndarray, fixed_output_len: int | None, seed: int = VLLM_BENCHMARK_SEED
) -> np.ndarray:
    """The records ``sample_sharegpt_requests`` keeps, in the order it collects them: :func:`vllm_benchmark_order`,
    then :func:`vllm_sharegpt_keep` on each (``output_len``: the reference replies' token counts, or
    ``fixed_output_len``, vLLM's ``--sharegpt-output-len``, for every record). Its first ``num_requests`` are the
    benchmark's requests."""
    p = np.asarray(prompt_len, dtype=np.int64)
    o = np.asarray(output_len, dtype=np.int64) if fixed_output_len is None else np.full(p.size, fixed_output_len)
    order = vllm_benchmark_order(p.size, seed)
    return order[vllm_sharegpt_keep(p, o, fixed_output_len)[order]]


def _sharegpt(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    if variant == "v3_first_turn":
        path = _require(root, "sharegpt/sharegpt_v3_first_turn_1000.json")
        prompts = [r["conversations"][0]["value"] for r in _json(path)]
        return _counted("sharegpt", path, root, tokenizer, prompts, [None] * len(prompts))
    if variant == "v3_full":
        path = _require(
            root,
            "sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json",
            "anon8231489123/ShareGPT_Vicuna_unfiltered",
        )
        convs = [r["conversations"] for r in _json(path) if len(r.get("conversations", [])) >= 2]
        return _counted(
            "sharegpt", path, root, tokenizer, [c[0]["value"] for c in convs], [c[1]["value"] for c in convs]
        )
    # File 300a is a long-output subset (every output between 512 and 1,021 tokens, mean 653), file 300b a plain
    # sample (output mean 278 Llama-3 tokens, against TurboSpec Table 2's 256 ± 249): the default uses 300b alone.
    files = {"tokens": "b", "tokens_long": "a", "tokens_all": "ab"}
    if variant not in files:
        raise ValueError(f"sharegpt variant must be one of {sorted(files)} | v3_first_turn | v3_full, got {variant!r}")
    paths = [_require(root, f"sharegpt/sharegpt_llama3_tokens_300{s}.jsonl") for s in files[variant]]
    rows = [r for p in paths for r in _jsonl(p)]
    how = "llama3 token ids"
    prompt: Any = [r["input_toks"] for r in rows]
    output: Any = [r["output_toks"] for r in rows]
    fallback = False
    if tokenizer not in (None, "llama3"):
        tok_dir = root / "tokenizers"
        problem = tokenizer_problem("llama3", tok_dir) or tokenizer_problem(tokenizer, tok_dir)

        def recount() -> list[np.ndarray]:  # decode + re-encode every record (tokenizers loaded only if not cached)
            decode = load_llama3_decoder(str(tok_dir))
            encode = load_encoder(str(tokenizer), str(tok_dir))
            if decode is None or encode is None:
                raise TokenizerUnavailable("tokenizer failed to load")
            return [np.asarray(encode([decode(r["input_tok_ids"]) for r in rows]), dtype=np.int64),
                    np.asarray(encode([decode(r["output_tok_ids"]) for r in rows]), dtype=np.int64)]

        if problem is None:
            key = [*tokenizer_key("llama3", tok_dir), *tokenizer_key(tokenizer, tok_dir), *file_bytes(*paths)]
            try:
                prompt, output = cached(key, recount)
                how = f"llama3 ids decoded, re-tokenized with {tokenizer}"
            except TokenizerUnavailable as exc:
                problem = str(exc)
        if problem is not None:
            how = f"llama3 counts, not re-tokenized with {tokenizer}: {problem}"
            fallback = True
    src = f"real file(s) {' + '.join(show_path(p, root) for p in paths)} ({len(rows)} records, {how})"
    return LengthRecords("sharegpt", _frozen(prompt), _frozen(output), src, fallback=fallback,
                         prompt_ids=tuple(r["input_tok_ids"] for r in rows), ids_family="llama3")


# ---------------------------------------------------------------- instruction / QA sets


def _alpaca(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    rel, hf = (
        ("alpaca/alpaca_data.json", "tatsu-lab/alpaca")
        if variant == "full"
        else ("alpaca/alpaca_5000.json", None)
    )
    path = _require(root, rel, hf)
    rows = _json(path)
    prompts = [r["instruction"] + ("\n" + r["input"] if r.get("input") else "") for r in rows]
    return _counted("alpaca", path, root, tokenizer, prompts, [r["output"] for r in rows])


def _arxiv(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    if variant == "text":
        path = _require(root, "arxiv/arxiv_summarization.jsonl", "ccdv/arxiv-summarization")
        rows = _jsonl(path)
        return _counted(
            "arxiv", path, root, tokenizer, [r["article"] for r in rows], [r["abstract"] for r in rows]
        )
    path = _require(root, "arxiv/arxiv_summarization_lengths_llama2.csv")
    df = pd.read_csv(path)
    note = "" if tokenizer in (None, "llama2") else f"; counts are llama2, not {tokenizer}"
    return LengthRecords(
        "arxiv",
        _frozen(df["num_prefill_tokens"].to_numpy()),
        _frozen(df["num_decode_tokens"].to_numpy()),
        f"real file {show_path(path, root)} ({len(df)} records, llama2 token counts{note})",
    )


def _specbench_rows(root: Path, part: str | None) -> tuple[Path, list[dict]]:
    path = _require(root, "specbench/question.jsonl")
    rows = _jsonl(path)
    if part is None:
        return path, rows
    if part == "mt_bench":
        return path, [r for r in rows if r["category"] in _MT_BENCH_CATEGORIES]
    return path, [r for r in rows if r["category"] == part]


def _specbench(part: str | None) -> Callable[[Path, str | None, str], LengthRecords]:
    def load(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
        path, rows = _specbench_rows(root, part)
        name = "specbench" if part is None else f"specbench_{part}"
        outputs = [r["reference"][0] if r.get("reference") else None for r in rows]
        return _counted(name, path, root, tokenizer, [r["turns"][0] for r in rows], outputs)

    return load


def _cnn_dailymail(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    if variant == "full":
        path = _require(root, "cnn_dailymail/test.jsonl", "abisee/cnn_dailymail")
        rows = _jsonl(path)
        return _counted(
            "cnn_dailymail",
            path,
            root,
            tokenizer,
            [r["article"] for r in rows],
            [r["highlights"] for r in rows],
        )
    path, rows = _specbench_rows(root, "summarization")
    return _counted(
        "cnn_dailymail",
        path,
        root,
        tokenizer,
        [r["turns"][0] for r in rows],
        [r["reference"][0] for r in rows],
    )


def _gsm8k(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    path = _require(root, "gsm8k/test.jsonl")
    rows = _jsonl(path)
    return _counted(
        "gsm8k", path, root, tokenizer, [r["question"] for r in rows], [r["answer"] for r in rows]
    )


def _mtbench(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    path = _require(root, "mtbench/question.jsonl")
    rows = _jsonl(path)
    return _counted("mtbench", path, root, tokenizer, [r["turns"][0] for r in rows], [None] * len(rows))


def _mbpp(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    path = _require(root, "mbpp/mbpp.jsonl")
    rows = _jsonl(path)
    # The MBPP paper's prompt: task text plus the test asserts the code must pass.
    prompts = [f"{r['text']}\nYour code should pass these tests:\n" + "\n".join(r["test_list"]) for r in rows]
    return _counted("mbpp", path, root, tokenizer, prompts, [r["code"] for r in rows])


def _spider(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    path = _require(root, "spider/dev.json")
    rows = _json(path)
    return _counted(
        "spider", path, root, tokenizer, [r["question"] for r in rows], [r["query"] for r in rows]
    )


def _chatbot_arena(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    if variant == "full":
        path = _require(
            root, "chatbot_arena/chatbot_arena_conversations.jsonl", "lmsys/chatbot_arena_conversations"
        )
        convs = [r["conversation_a"] for r in _jsonl(path) if len(r.get("conversation_a", [])) >= 2]
        return _counted(
            "chatbot_arena",
            path,
            root,
            tokenizer,
            [c[0]["content"] for c in convs],
            [c[1]["content"] for c in convs],
        )
    path = _require(root, "chatbot_arena/arena_hard_1k.jsonl")
    rows = _jsonl(path)
    return _counted("chatbot_arena", path, root, tokenizer, [r["turns"][0] for r in rows], [None] * len(rows))


def _awesome_prompts(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    path = _require(root, "awesome_chatgpt_prompts/prompts.csv")
    prompts = [str(x) for x in pd.read_csv(path)["prompt"].fillna("")]
    return _counted("awesome_prompts", path, root, tokenizer, prompts, [None] * len(prompts))


def _hub_text(
    name: str, rel: str, hf_id: str, prompt_cols: tuple[str, ...], output_col: str | None
) -> Callable[[Path, str | None, str], LengthRecords]:
    """Loader for a hub-only text set stored locally as .jsonl/.json/.parquet/.csv in its published
    columns."""

    def load(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
        path = _require(root, rel, hf_id)
        df = _read_table(path)
        prompts = [
            "\n".join(str(r[c]) for c in prompt_cols if isinstance(r[c], str) and r[c])
            for _, r in df.iterrows()
        ]
        outputs: list[str | None] = [str(x) for x in df[output_col]] if output_col else [None] * len(df)
        return _counted(name, path, root, tokenizer, prompts, outputs)

    return load


def _read_table(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    return pd.read_json(path, lines=path.suffix == ".jsonl")


# ---------------------------------------------------------------- traces


def _azure(year: int, kind: str) -> Callable[[Path, str | None, str], LengthRecords]:
    def load(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
        if year == 2023:
            path = _require(root, f"traces/azure2023_{kind}.csv")
        else:
            path = _require(
                root, f"traces/AzureLLMInferenceTrace_{kind}_1week.csv", None
            )  # github.com/Azure/AzurePublicDataset (AzureLLMInferenceDataset2024)
        df = pd.read_csv(path)
        ts = pd.to_datetime(df["TIMESTAMP"]).astype("int64").to_numpy() / 1e9
        return LengthRecords(
            f"azure{year}_{kind}",
            _frozen(df["ContextTokens"].to_numpy()),
            _frozen(df["GeneratedTokens"].to_numpy()),
            f"real trace {show_path(path, root)} ({len(df)} records, trace token counts)",
            ts - ts.min(),
        )

    return load


def _mooncake(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    path = _require(root, "traces/mooncake_conversation.jsonl")
    rows = _jsonl(path)
    ts = np.array([r["timestamp"] for r in rows], dtype=np.float64) / 1e3
    return LengthRecords(
        "mooncake",
        _frozen([r["input_length"] for r in rows]),
        _frozen([r["output_length"] for r in rows]),
        f"real trace {show_path(path, root)} ({len(rows)} records, trace token counts)",
        ts,
    )


def _burstgpt(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
    path = _require(root, "traces/BurstGPT_1.csv", "lzzmm/BurstGPT")
    df = pd.read_csv(path)
    df = df[df["Response tokens"] > 0]
    return LengthRecords(
        "burstgpt",
        _frozen(df["Request tokens"].to_numpy()),
        _frozen(df["Response tokens"].to_numpy()),
        f"real trace {show_path(path, root)} ({len(df)} records, trace token counts)",
        df["Timestamp"].to_numpy(dtype=np.float64),
    )


def _adaserve(stem: str) -> Callable[[Path, str | None, str], LengthRecords]:
    def load(root: Path, tokenizer: str | None, variant: str) -> LengthRecords:
        path = _require(root, f"adaserve_artifact/{stem}.json")
        rows = _json(path)
        return LengthRecords(
            f"adaserve_{stem}",
            _frozen([r["input_length"] for r in rows]),
            _frozen([r["output_length"] for r in rows]),
            f"real trace {show_path(path, root)} ({len(rows)} records, trace token counts)",
            np.array([r["emission_time_ms"] for r in rows], dtype=np.float64) / 1e3,
            np.array([r["slo_ratio"] for r in rows], dtype=np.float64),
        )

    return load


ADASERVE_TRACES: tuple[str, ...] = (
    "fig8_9_emission_rps2.4_ol256",
    "fig8_9_emission_rps3.6_ol256",
    "fig8_9_emission_rps4.8_ol256",
    "fig10_emission_rps4.0_prop0.5",
    "fig11_emission_slo0.8_ol256",
    "fig14_emission_fluc_6m_peak4.0",
)

LOADERS: dict[str, Callable[[Path, str | None, str], LengthRecords]] = {
    "sharegpt": _sharegpt,
    "alpaca": _alpaca,
    "arxiv": _arxiv,
    "specbench": _specbench(None),
    **{f"specbench_{p}": _specbench(p) for p in SPECBENCH_PARTS},
    "cnn_dailymail": _cnn_dailymail,
    "gsm8k": _gsm8k,
    "mtbench": _mtbench,
    "mbpp": _mbpp,
    "spider": _spider,
    "chatbot_arena": _chatbot_arena,
    "awesome_prompts": _awesome_prompts,
    "openorca": _hub_text(
        "openorca",
        "openorca/1M-GPT4-Augmented.parquet",
        "Open-Orca/OpenOrca",
        ("system_prompt", "question"),
        "response",
    ),
    "chatbot_instruction_prompts": _hub_text(
        "chatbot_instruction_prompts",
        "chatbot_instruction_prompts/train.parquet",
        "alespalla/chatbot_instruction_prompts",
        ("prompt",),
        "response",
    ),
    "minithinky": _hub_text(
        "minithinky", "minithinky/train.parquet", "ngxson/MiniThinky-dataset", ("prompt",), "response"
    ),
    "instructcode": _hub_text(
        "instructcode", "instructcode/train.parquet", "likaixin/InstructCoder", ("instruction", "input"), "output"
    ),
    "hle": _hub_text("hle", "hle/test.parquet", "cais/hle", ("question",), "answer"),
    "azure2023_conv": _azure(2023, "conv"),
    "azure2023_code": _azure(2023, "code"),
    "azure2024_conv": _azure(2024, "conv"),
    "azure2024_code": _azure(2024, "code"),
    "mooncake": _mooncake,
    "burstgpt": _burstgpt,
    **{f"adaserve_{s}": _adaserve(s) for s in ADASERVE_TRACES},
}

#: Sets whose token counts come from the file itself (the tokenizer argument does not change them).
FIXED_COUNT_DATASETS = frozenset(
    {"arxiv", "azure2023_conv", "azure2023_code", "azure2024_conv", "azure2024_code", "mooncake", "burstgpt"}
    | {f"adaserve_{s}" for s in ADASERVE_TRACES}
)


def check_dataset(name: str) -> None:
    """A dataset name is known to the loaders (``ValueError`` naming the known ones otherwise)."""
    if name not in LOADERS:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(LOADERS)} (and 'sonnet', 'fixed')")


@functools.lru_cache(maxsize=64)
def load_records(name: str, root: str, tokenizer: str | None, variant: str = "default") -> LengthRecords:
    """Load (once per process) the records of dataset ``name`` from data root ``root``."""
    check_dataset(name)
    if variant == "default":
        variant = "tokens" if name == "sharegpt" else "default"
    if name in FIXED_COUNT_DATASETS and name != "arxiv":
        tokenizer = None
    return LOADERS[name](Path(root), tokenizer, variant)
