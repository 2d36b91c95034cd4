"""Loaders on the real files, vLLM samplers (ShareGPT pruning, Sonnet), hub-only errors, embedded tables.

Tests on real files name them with ``@pytest.mark.data`` (skipped when absent, see conftest.py); the rest run on
files written in ``tmp_path``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workloads.datasets import LOADERS, DataMissingError, load_records, vllm_sharegpt_keep
from workloads.sonnet import load_sonnet_lines, sample_sonnet
from workloads.stats import QUANTILES, find_table, sample_table
from workloads.tokens import count_tokens

# The file each dataset's default loader reads (docs/data.md).
FILE_OF = {
    "sharegpt": "sharegpt/sharegpt_llama3_tokens_300b.jsonl",
    "alpaca": "alpaca/alpaca_5000.json",
    "arxiv": "arxiv/arxiv_summarization_lengths_llama2.csv",
    "specbench": "specbench/question.jsonl",
    "specbench_mt_bench": "specbench/question.jsonl",
    "cnn_dailymail": "specbench/question.jsonl",
    "gsm8k": "gsm8k/test.jsonl",
    "mtbench": "mtbench/question.jsonl",
    "mbpp": "mbpp/mbpp.jsonl",
    "spider": "spider/dev.json",
    "chatbot_arena": "chatbot_arena/arena_hard_1k.jsonl",
    "awesome_prompts": "awesome_chatgpt_prompts/prompts.csv",
    "azure2023_conv": "traces/azure2023_conv.csv",
    "azure2023_code": "traces/azure2023_code.csv",
    "mooncake": "traces/mooncake_conversation.jsonl",
    "adaserve_fig10_emission_rps4.0_prop0.5": "adaserve_artifact/fig10_emission_rps4.0_prop0.5.json",
}
LLAMA2 = "tokenizers/llama2_tokenizer.model"
LLAMA3 = "tokenizers/llama3_tokenizer.model"

# (dataset, records, output known) on the files listed in docs/data.md
REAL = [
    ("sharegpt", 300, True),
    ("alpaca", 5000, True),
    ("arxiv", 28257, True),
    ("specbench", 480, False),
    ("specbench_mt_bench", 80, False),
    ("cnn_dailymail", 80, True),
    ("gsm8k", 1319, True),
    ("mtbench", 80, False),
    ("mbpp", 974, True),
    ("spider", 1034, True),
    ("chatbot_arena", 478, False),
    ("awesome_prompts", 1529, False),
    ("azure2023_conv", 19366, True),
    ("azure2023_code", 8819, True),
    ("mooncake", 12031, True),
    ("adaserve_fig10_emission_rps4.0_prop0.5", 1400, True),
]


@pytest.mark.parametrize(
    ("name", "num", "all_outputs"),
    [pytest.param(*r, marks=pytest.mark.data(FILE_OF[r[0]]), id=r[0]) for r in REAL],
)
def test_real_loaders(real_data: Path, name: str, num: int, all_outputs: bool) -> None:
    rec = load_records(name, str(real_data), "llama2")
    assert len(rec.prompt_len) == len(rec.output_len) == num
    assert rec.prompt_len.min() >= 1 and bool((rec.output_len >= 0).all()) == all_outputs
    assert f"$REPRO_DATA/{FILE_OF[name]}" in rec.source and str(real_data) not in rec.source


@pytest.mark.data("sharegpt/sharegpt_v3_first_turn_1000.json", LLAMA3)
def test_sharegpt_v3_first_turn_counts_prompts(real_data: Path) -> None:
    pytest.importorskip("tiktoken")
    rec = load_records("sharegpt", str(real_data), "llama3", "v3_first_turn")
    assert len(rec.prompt_len) == 1000 and np.all(rec.output_len == -1) and "llama3 tokenizer" in rec.source


@pytest.mark.data(FILE_OF["sharegpt"], "sharegpt/sharegpt_llama3_tokens_300a.jsonl", LLAMA3)
def test_sharegpt_llama3_counts_are_the_files(real_data: Path) -> None:
    pytest.importorskip("tiktoken")
    # re-tokenizing the decoded ids with llama3 must give the files' own counts
    rec = load_records("sharegpt", str(real_data), "llama3")
    assert rec.prompt_len[0] == 85 and rec.output_len[0] == 416
    long = load_records("sharegpt", str(real_data), "llama3", "tokens_long")
    assert long.prompt_len[0] == 2358 and long.output_len[0] == 531 and long.output_len.min() >= 512


@pytest.mark.parametrize(
    ("prompt", "output", "fixed", "keep"),
    [
        (3, 100, None, False),  # prompt < 4
        (100, 3, None, False),  # output < 4
        (100, 3, 3, True),  # a fixed output length skips the output < 4 rule
        (1025, 10, None, False),  # prompt > 1024
        (1000, 1049, None, False),  # prompt + output > 2048
        (1000, 1048, None, True),  # exactly 2048 is kept
        (4, 4, None, True),
    ],
)
def test_vllm_sharegpt_pruning(prompt: int, output: int, fixed: int | None, keep: bool) -> None:
    assert bool(vllm_sharegpt_keep(np.array([prompt]), np.array([output]), fixed)[0]) == keep


@pytest.mark.data("sonnet/sonnet.txt")
@pytest.mark.parametrize("tok", ["llama2", "llama3", "qwen"])
@pytest.mark.parametrize(("input_len", "prefix_len"), [(550, 200), (1024, 256)])
def test_sonnet_sampler_lengths(real_data: Path, tok: str, input_len: int, prefix_len: int) -> None:
    lines = load_sonnet_lines(str(real_data / "sonnet" / "sonnet.txt"), tok)
    p, o = sample_sonnet(lines, 500, np.random.default_rng(0), input_len=input_len, prefix_len=prefix_len)
    assert abs(np.mean(p) - input_len) < 0.03 * input_len and p.std() < 30 and np.all(o == 150)


@pytest.mark.parametrize(
    "name",
    ["openorca", "chatbot_instruction_prompts", "minithinky", "hle", "burstgpt", "azure2024_conv", "instructcode"],
)
def test_hub_only_loaders_name_the_file(tmp_path: Path, name: str) -> None:
    with pytest.raises(DataMissingError, match=r"provide .*/") as err:
        load_records(name, str(tmp_path), "llama2")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("name", "variant", "hf_id"),
    [
        ("sharegpt", "v3_full", "anon8231489123/ShareGPT_Vicuna_unfiltered"),
        ("alpaca", "full", "tatsu-lab/alpaca"),
        ("arxiv", "text", "ccdv/arxiv-summarization"),
        ("cnn_dailymail", "full", "abisee/cnn_dailymail"),
    ],
)
def test_hub_variants_name_file_and_dataset_id(tmp_path: Path, name: str, variant: str, hf_id: str) -> None:
    with pytest.raises(DataMissingError, match=hf_id):
        load_records(name, str(tmp_path), "llama2", variant)


def test_hub_loader_reads_published_format(tmp_path: Path) -> None:
    (tmp_path / "hle").mkdir()
    import pandas as pd

    pd.DataFrame({"question": ["What is 2+2?", "Name a prime."], "answer": ["4", "7"]}).to_parquet(
        tmp_path / "hle" / "test.parquet"
    )
    rec = LOADERS["hle"](tmp_path, None, "default")
    assert list(rec.prompt_len) == [3, 4] and list(rec.output_len) == [1, 1] and "estimate" in rec.source


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.data(FILE_OF[n], LLAMA2, LLAMA3), id=n)
        for n in ["sharegpt", "alpaca", "gsm8k", "mbpp", "spider", "arxiv", "azure2023_conv"]
    ],
)
def test_embedded_tables_reproduce_real_quantiles(real_data: Path, name: str) -> None:
    pytest.importorskip("sentencepiece")
    rec = load_records(name, str(real_data), "llama2")
    table = find_table(name, "llama2")
    assert table is not None
    p, o = sample_table(table, 20_000, np.random.default_rng(0))
    for real, fake in ((rec.prompt_len, p), (rec.output_len, o)):
        assert np.median(fake) == pytest.approx(np.median(real), rel=0.05, abs=1.0)
    # the copula keeps the sign of the rank dependence
    real_corr = np.corrcoef(np.argsort(np.argsort(rec.prompt_len)), np.argsort(np.argsort(rec.output_len)))[
        0, 1
    ]
    fake_corr = np.corrcoef(np.argsort(np.argsort(p)), np.argsort(np.argsort(o)))[0, 1]
    assert fake_corr == pytest.approx(real_corr, abs=0.1)
    assert table.prompt_q[0] == rec.prompt_len.min() and len(QUANTILES) == 101


def test_token_estimate_without_tokenizer(tmp_path: Path) -> None:
    c = count_tokens(["abcd" * 10, "hi"], "llama2", tmp_path)
    assert not c.exact and list(c.counts) == [10, 1] and "estimate" in c.how
