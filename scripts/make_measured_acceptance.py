"""Per-token acceptance per (proposer, dataset) from SpecDecode-Bench's recorded acceptance spans: the summary
statistics behind ``conf/oracle/specdecode_bench.yaml`` (GoodSpeed Fig. 4's measured-acceptance case).

Usage: ``REPRO_DATA=../shared/data python scripts/make_measured_acceptance.py [--max-draft 4]``

Source: ``specdecode_bench/llama31_8b_{gsm8k,cnn,sharegpt,instructcoder}.jsonl`` (SpecDecode-Bench/simulator @
2fdccbd : data/llama3.1-8B/combined_*.jsonl, released with "Speculative Decoding: Performance or Illusion?", arXiv
2601.11580): Llama-3.1-8B-Instruct on an H100 under vLLM 0.10.1, greedy. Each record's ``acc_eagle.acc_len[i]`` /
``acc_ngram.acc_len[i]`` is the number of tokens a verify step starting at output position i emits (accepted drafts
+ the bonus token) for the EAGLE-3 head and for n-gram prompt lookup (the files hold runs longer than the 5 their
description gives, up to 21: a step's accepted run, not capped at 4 drafts).

Estimator: the oracle models a chain as independent tokens each accepted with probability α (conf/oracle/
default.yaml), so α is fitted as that model's maximum-likelihood estimate from every position's chain cut at
``max_draft`` drafted tokens: α = Σ accepted / Σ tested, accepted = min(acc_len − 1, K), tested = accepted + 1
while it stopped at a rejection, K when all K were accepted. K = 4: GoodSpeed's chains at C = 16-20 with 8 clients
are 2-3 tokens on average and rarely above 5. Prompt lookup's real acceptance is bursty (a first-token rate of
0.16-0.65, 0.6-0.95 after a match), which one α per client does not model. Nothing but these counts is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.datasets import default_data_root

#: the recording's files (dataset stem) and the suite's dataset each one's prompts come from
DATASETS = {"gsm8k": "gsm8k", "cnn": "cnn_dailymail", "sharegpt": "sharegpt", "instructcoder": "instructcode"}
#: the recording's proposers (record key) and the suite's name for each
METHODS = {"acc_eagle": "eagle3", "acc_ngram": "ngram"}


def chain_acceptance(acc_len: np.ndarray, max_draft: int = 4) -> float:
    """α of independent per-token acceptance fitted to emitted-token counts ``acc_len`` (≥ 1) of chains cut at
    ``max_draft`` drafted tokens (module docstring)."""
    accepted = np.minimum(np.asarray(acc_len, dtype=np.int64) - 1, max_draft)
    tested = np.where(accepted < max_draft, accepted + 1, max_draft)
    return float(accepted.sum() / tested.sum())


def measured_acceptance(root: Path, max_draft: int = 4) -> dict[str, tuple[float, int, int]]:
    """``{label: (α, positions, requests)}`` per (dataset, proposer); label = ``sdb_<dataset>_<proposer>``."""
    out: dict[str, tuple[float, int, int]] = {}
    for stem in DATASETS:
        path = root / "specdecode_bench" / f"llama31_8b_{stem}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for key, method in METHODS.items():
            spans = np.concatenate([np.asarray(r[key]["acc_len"], dtype=np.int64) for r in records])
            out[f"sdb_{stem}_{method}"] = (round(chain_acceptance(spans, max_draft), 3), int(spans.size),
                                           len(records))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-draft", type=int, default=4)
    args = ap.parse_args()
    root = default_data_root()
    if root is None or not (root / "specdecode_bench").is_dir():
        sys.exit("error: no specdecode_bench/ under the data folder (set REPRO_DATA)")
    for label, (alpha, positions, requests) in measured_acceptance(root, args.max_draft).items():
        print(f"{label}: {alpha}  # {positions} positions, {requests} requests")


if __name__ == "__main__":
    main()
