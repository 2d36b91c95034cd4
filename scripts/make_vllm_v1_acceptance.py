"""vLLM V1's measured mean acceptance lengths for validate_vllm_v1, as the oracle's length curves.

Usage: ``REPRO_DATA=../shared/data python scripts/make_vllm_v1_acceptance.py``

Reads ``vllm_v1_bench/acceptance.csv`` (tomasruizt/vllm-scripts @ d94d714: the runs behind vLLM PR #24322; vLLM V1
main of 2026-01-23 on H100 94 GB, InstructCoder, each row averaged over the runs at C = 1..256) and writes
``conf/oracle/vllm_v1_bench.yaml``: for Qwen3-32B at TP 1, per draft (Qwen3-1.7B, Qwen3-4B) and for the EAGLE-3 head,
the mean acceptance length L(k) = 1 + accepted / drafting steps at k = 1..6, under the dataset label of the
workload (``sdb_instructcoder``: InstructCoder's prompts). The oracle draws each position's accepted run from these
(P(A >= j) = L(j) − L(j − 1), :mod:`repro.oracle.spans`), so a chain of k emits L(k) per step on average. Only these
numbers are committed.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.datasets import default_data_root

LABEL = "sdb_instructcoder"  # the workload's dataset label (conf/exp/validate_vllm_v1.yaml)
TARGET = ("Qwen/Qwen3-32B", "qwen3-32b")
DRAFTS = {"Qwen/Qwen3-1.7B": "qwen3-1.7b", "Qwen/Qwen3-4B": "qwen3-4b"}
EAGLE = "RedHatAI/Qwen3-32B-speculator.eagle3"


def read_curves(path: Path) -> dict[str, list[float]]:
    """HF draft id -> [L(1), ..., L(K)] for Qwen3-32B at TP 1 (k in order; a gap is an error)."""
    by: dict[str, dict[int, float]] = {}
    with path.open() as fh:
        for row in csv.DictReader(fh):
            if row["target"] != TARGET[0] or row["tp"] != "1":
                continue
            by.setdefault(row["draft_model"], {})[int(row["num_spec_toks"])] = float(row["acceptance_length"])
    out = {}
    for draft, ks in by.items():
        if sorted(ks) != list(range(1, max(ks) + 1)):
            raise SystemExit(f"error: {path}: {draft} has k = {sorted(ks)}, not 1..K")
        out[draft] = [ks[k] for k in sorted(ks)]
    return out


def main() -> None:
    root = default_data_root()
    if root is None:
        sys.exit("error: no data folder: set $REPRO_DATA")
    curves = read_curves(root / "vllm_v1_bench" / "acceptance.csv")
    lines = [
        "# vLLM V1's measured mean acceptance lengths L(k) = 1 + accepted / drafting steps, k = 1..6, for Qwen3-32B",
        "# (TP 1) on InstructCoder (vllm bench serve, vLLM V1 main of 2026-01-23, H100 94 GB; averaged over",
        "# C = 1..256:",
        "# acceptance does not depend on load). Written by scripts/make_vllm_v1_acceptance.py from the data folder's",
        "# vllm_v1_bench/acceptance.csv (tomasruizt/vllm-scripts @ d94d714, the runs behind vLLM PR #24322). A list",
        "# entry makes the stream draw each position's accepted run A with P(A >= j) = L(j) - L(j - 1)",
        "# (repro/oracle/spans.py), so a chain of k emits L(k) tokens per step on average; per-position acceptance",
        "# follows from the lengths at successive k. Keyed by the workload's dataset label (InstructCoder's prompts).",
        "defaults:", "  - default", "  - _self_", "", "accept:",
    ]
    for hf, name in DRAFTS.items():
        lines += [f"  {name}:  # {hf}", f"    {TARGET[1]}: {{{LABEL}: {curves[hf]}}}"]
    lines += ["", "eagle_accept:  # " + EAGLE, f"  {TARGET[1]}: {{{LABEL}: {curves[EAGLE]}}}"]
    repo = Path(__file__).resolve().parents[1]
    (repo / "conf" / "oracle" / "vllm_v1_bench.yaml").write_text("\n".join(lines) + "\n")
    print(f"wrote conf/oracle/vllm_v1_bench.yaml ({len(curves)} curves of Qwen3-32B)")


if __name__ == "__main__":
    main()
