"""Summary statistics of SpecDecode-Bench's acceptance-span files, for runs without the data folder: the fallback of
``validate_specdecode_bench``.

Usage: ``REPRO_DATA=../shared/data python scripts/make_specdecode_spans.py [--max-k 7]``

Writes, from ``specdecode_bench/llama31_8b_{gsm8k,cnn,sharegpt,instructcoder}.jsonl`` (SpecDecode-Bench/simulator @
2fdccbd, arXiv 2601.11580; Llama-3.1-8B-Instruct, vLLM 0.10.1, greedy):

- ``workloads/stats/sdb_<dataset>.native.csv``: 101 quantiles of prompt and output lengths (output = the shortest of
  the recorded output and the two span lists, as the span replay uses), the workload's embedded table;
- ``conf/oracle/specdecode_spans.yaml``: per dataset and proposer (EAGLE-3 ``acc_eagle``, n-gram ``acc_ngram``) the
  mean acceptance lengths L(k) = mean over output positions of min(acc_len, k + 1), k = 1..K: the span distribution
  cut at K drafts (P(s − 1 >= j) = L(j) − L(j − 1)), which the oracle draws i.i.d. per position when the files are
  absent. Positions are those below each record's output length. Nothing but these counts is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.oracle.spans import read_span_file
from workloads.datasets import default_data_root
from workloads.stats import write_table

DATASETS = ("gsm8k", "cnn", "sharegpt", "instructcoder")
FIELDS = {"acc_eagle": "eagle", "acc_ngram": "pld"}  # span field -> oracle stream


def curve(spans: list[np.ndarray], out_len: np.ndarray, max_k: int) -> list[float]:
    """L(1..max_k) over every position below each record's output length."""
    s = np.concatenate([sp[:n].astype(np.int64) for sp, n in zip(spans, out_len.tolist(), strict=True)])
    return [round(float(np.minimum(s, k + 1).mean()), 4) for k in range(1, max_k + 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-k", type=int, default=7)
    args = ap.parse_args()
    root = default_data_root()
    if root is None:
        sys.exit("error: no data folder: set $REPRO_DATA")
    repo = Path(__file__).resolve().parents[1]
    lines = [
        "# Measured acceptance spans of SpecDecode-Bench (Llama-3.1-8B-Instruct, vLLM 0.10.1, greedy;",
        "# arXiv 2601.11580),",
        "# written by scripts/make_specdecode_spans.py: per dataset label the mean acceptance length L(k) = mean of",
        f"# min(acc_len, k + 1) over every recorded output position, k = 1..{args.max_k} (EAGLE-3: acc_eagle;",
        "# n-gram prompt lookup min 3 / max 7: acc_ngram). validate_specdecode_bench replays the recorded spans",
        "# themselves when the",
        "# data folder has the files, and draws spans i.i.d. from these curves when it does not",
        "# (repro/oracle/spans.py).",
        "defaults:", "  - default", "  - _self_", "", "spans:",
    ]
    by_stream: dict[str, list[str]] = {s: [] for s in FIELDS.values()}
    for ds in DATASETS:
        path = root / "specdecode_bench" / f"llama31_8b_{ds}.jsonl"
        base = read_span_file(str(path), None)
        meta = {"dataset": f"sdb_{ds}", "tokenizer": "native", "counts": "llama3 (recorded token ids)",
                "source": f"$REPRO_DATA/specdecode_bench/{path.name} (output = min of output and span lists)"}
        write_table(repo / "workloads" / "stats" / f"sdb_{ds}.native.csv", meta, base.prompt_len, base.output_len)
        for field, stream in FIELDS.items():
            f = read_span_file(str(path), field)
            by_stream[stream].append(f"      sdb_{ds}: {curve(f.spans, base.output_len, args.max_k)}"
                                     f"  # {len(f.spans)} records, {int(base.output_len.sum()):,} positions")
        print(f"{ds}: {base.prompt_len.size} records")
    for field, stream in FIELDS.items():
        lines += [f"  {stream}:", f"    field: {field}", "    model: llama3.1-8b", "    measured:", *by_stream[stream]]
    (repo / "conf" / "oracle" / "specdecode_spans.yaml").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
