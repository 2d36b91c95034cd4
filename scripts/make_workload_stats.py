"""Regenerate the embedded length tables ``workloads/stats/*.csv`` from the real data files.

Usage: ``REPRO_DATA=../shared/data python scripts/make_workload_stats.py [--out workloads/stats]``

For every dataset with a local file it writes ``<dataset>.<tokenizer>.csv``: 101 quantiles of prompt and
reference
output token counts (``workloads.stats.write_table``) and the normal-score correlation, per tokenizer
family for
text sets, ``native`` for files that ship counts (ArXiv in Llama-2 tokens, traces). Sonnet tables hold
per-line
token counts (the vLLM sampler's unit). ShareGPT's other token-id variants get tables of their own,
``sharegpt_<variant>.<tokenizer>.csv`` (read by ``sampler: vllm_benchmark`` without the files). Records are never
written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.datasets import (
    ADASERVE_TRACES,
    SPECBENCH_PARTS,
    DataMissingError,
    default_data_root,
    load_records,
)
from workloads.sonnet import load_sonnet_lines
from workloads.stats import STATS_DIR, write_gap_table, write_table
from workloads.tokens import TOKENIZER_FAMILIES

TEXT_SETS = (
    "sharegpt",
    "alpaca",
    "specbench",
    *(f"specbench_{p}" for p in SPECBENCH_PARTS),
    "cnn_dailymail",
    "gsm8k",
    "mtbench",
    "mbpp",
    "spider",
    "chatbot_arena",
    "awesome_prompts",
)
#: Tables of a dataset's non-default variant: table name -> (dataset, variant).
VARIANT_SETS = {
    "sharegpt_tokens_long": ("sharegpt", "tokens_long"),
    "sharegpt_tokens_all": ("sharegpt", "tokens_all"),
}
NATIVE_SETS = (
    "arxiv",
    "azure2023_conv",
    "azure2023_code",
    "mooncake",
    *(f"adaserve_{s}" for s in ADASERVE_TRACES),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=STATS_DIR)
    parser.add_argument("--data", type=str, default=None, help="data folder (default $REPRO_DATA)")
    args = parser.parse_args()
    root = default_data_root(args.data)
    if root is None:
        sys.exit("no data folder: set REPRO_DATA")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in TEXT_SETS:
        for tok in TOKENIZER_FAMILIES:
            _write(args.out, name, tok, root)
    for table, (name, variant) in VARIANT_SETS.items():
        for tok in TOKENIZER_FAMILIES:
            _write(args.out, name, tok, root, variant, table)
    for name in NATIVE_SETS:
        _write(args.out, name, None, root)
        _write_gaps(args.out, name, root)
    sonnet = root / "sonnet" / "sonnet.txt"
    for tok in TOKENIZER_FAMILIES:
        lines = load_sonnet_lines(str(sonnet), tok)
        meta = {
            "dataset": "sonnet",
            "tokenizer": tok,
            "kind": "per-line token counts of sonnet.txt",
            "source": "sonnet/sonnet.txt",
            "how": lines.how,
            "num_lines": str(len(lines.line_tokens)),
            "base_prompt_tokens": str(lines.base_prompt_tokens),
        }
        write_table(
            args.out / f"sonnet.{tok}.csv", meta, lines.line_tokens, np.full(len(lines.line_tokens), -1)
        )
        print(f"sonnet.{tok}: {len(lines.line_tokens)} lines")


def _write(
    out: Path, name: str, tok: str | None, root: Path, variant: str = "default", table: str | None = None
) -> None:
    """Write ``<table or name>.<tok or native>.csv`` of dataset ``name`` (its ``variant``)."""
    try:
        rec = load_records(name, str(root), tok, variant)
    except DataMissingError as e:
        print(f"skip {name}: {e}")
        return
    label = tok or "native"
    counted = "llama2" if name == "arxiv" else ("trace's own" if tok is None else tok)
    stem = table or name
    meta = {"dataset": stem, **({"variant": variant} if table else {}), "tokenizer": label, "counts": counted,
            "source": rec.source.replace(str(root), "$REPRO_DATA")}
    write_table(out / f"{stem}.{label}.csv", meta, np.asarray(rec.prompt_len), np.asarray(rec.output_len))
    print(f"{stem}.{label}: {len(rec.prompt_len)} records, median prompt {np.median(rec.prompt_len):.0f}")


def _write_gaps(out: Path, name: str, root: Path) -> None:
    """Quantiles of a trace's inter-arrival gaps divided by their mean (the embedded arrival fallback)."""
    try:
        rec = load_records(name, str(root), None)
    except DataMissingError:
        return
    if rec.timestamps_s is None or len(rec.timestamps_s) < 3:
        return
    gaps = np.diff(np.sort(np.asarray(rec.timestamps_s, dtype=np.float64)))
    mean = float(gaps.mean())
    meta = {
        "dataset": name,
        "kind": "inter-arrival gaps / mean gap",
        "mean_gap_s": f"{mean:.6g}",
        "cv": f"{gaps.std() / mean:.4f}",
        "records": str(len(rec.timestamps_s)),
        "source": rec.source.replace(str(root), "$REPRO_DATA"),
    }
    write_gap_table(out / f"{name}.gaps.csv", meta, gaps / mean)
    print(f"{name}.gaps: mean gap {mean:.4g} s, cv {gaps.std() / mean:.2f}")


if __name__ == "__main__":
    main()
