"""vLLM V1's measured mean acceptance lengths for validate_vllm_v1, as the oracle's length curves.

Usage: ``REPRO_DATA=../shared/data python scripts/make_vllm_v1_acceptance.py``

Reads ``vllm_v1_bench/acceptance.csv`` (tomasruizt/vllm-scripts @ d94d714: the runs behind vLLM PR #24322; vLLM V1
main of 2026-01-23 on H100 94 GB, InstructCoder, each row averaged over the runs at C = 1..256) and writes
``conf/oracle/vllm_v1_bench.yaml``: per target (Qwen3-32B at TP 1, Llama-3.3-70B-Instruct at TP 2), per draft model
and for the EAGLE-3 head, the mean acceptance length L(k) = 1 + accepted / drafting steps at k = 1..K, under the
dataset label of the workload (``sdb_instructcoder``: InstructCoder's prompts). The oracle draws each position's
accepted run from these (P(A >= j) = L(j) − L(j − 1), :mod:`repro.oracle.spans`), so a chain of k emits L(k) per step
on average. Only these numbers are committed.

The 70B runs start at k = 3: L(1) and L(2) are not measured. Chosen: the first three positions accept at one
conditional rate a (P(A >= j) = a^j, j <= 3) with a + a² + a³ = L(3) − 1, the measured mean at k = 3; the curve from
k = 3 on is the measurement's (:func:`leading`).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.datasets import default_data_root

LABEL = "sdb_instructcoder"  # the workload's dataset label (conf/exp/validate_vllm_v1.yaml)
#: HF target id, TP -> (conf/model name, {HF draft id: conf/model name}, the EAGLE-3 head's HF id)
TARGETS = {
    ("Qwen/Qwen3-32B", "1"): ("qwen3-32b", {"Qwen/Qwen3-1.7B": "qwen3-1.7b", "Qwen/Qwen3-4B": "qwen3-4b"},
                              "RedHatAI/Qwen3-32B-speculator.eagle3"),
    ("meta-llama/Llama-3.3-70B-Instruct", "2"): ("llama3.3-70b", {"meta-llama/Llama-3.2-1B": "llama3.2-1b"},
                                                 "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"),
}


def leading(k0: int, length: float) -> list[float]:
    """L(1..k0) where only L(k0) is measured: one conditional acceptance a over the first k0 positions,
    a + a² + ... + a^k0 = L(k0) − 1 (bisection; module docstring)."""
    target = length - 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        a = (lo + hi) / 2
        if sum(a**j for j in range(1, k0 + 1)) < target:
            lo = a
        else:
            hi = a
    a = (lo + hi) / 2
    return [round(1.0 + sum(a**j for j in range(1, k + 1)), 4) for k in range(1, k0)] + [length]


def read_curves(path: Path) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(HF target id, TP) -> HF draft id -> [L(1), ..., L(K)] (k in order; a gap past the first measured k is an
    error; missing leading k are :func:`leading`'s)."""
    by: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    with path.open() as fh:
        for row in csv.DictReader(fh):
            key = (row["target"], row["tp"])
            if key not in TARGETS:
                continue
            by.setdefault(key, {}).setdefault(row["draft_model"], {})[int(row["num_spec_toks"])] = \
                float(row["acceptance_length"])
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for key, drafts in by.items():
        for draft, ks in drafts.items():
            k0, top = min(ks), max(ks)
            if sorted(ks) != list(range(k0, top + 1)):
                raise SystemExit(f"error: {path}: {draft} has k = {sorted(ks)}, not a run of k")
            head = leading(k0, ks[k0]) if k0 > 1 else [ks[1]]
            out.setdefault(key, {})[draft] = head + [ks[k] for k in range(k0 + 1, top + 1)]
    return out


def main() -> None:
    root = default_data_root()
    if root is None:
        sys.exit("error: no data folder: set $REPRO_DATA")
    curves = read_curves(root / "vllm_v1_bench" / "acceptance.csv")
    lines = [
        "# vLLM V1's measured mean acceptance lengths L(k) = 1 + accepted / drafting steps on InstructCoder, for",
        "# Qwen3-32B (TP 1, k = 1..6) and Llama-3.3-70B-Instruct (TP 2, k = 3..8; L(1), L(2) chosen: one conditional",
        "# acceptance over the first three positions, scripts/make_vllm_v1_acceptance.py) (vllm bench serve, vLLM V1",
        "# main of 2026-01-23, H100 94 GB; averaged over C: acceptance does not depend on load). Written by",
        "# scripts/make_vllm_v1_acceptance.py from the data folder's vllm_v1_bench/acceptance.csv (tomasruizt/",
        "# vllm-scripts @ d94d714, the runs behind vLLM PR #24322). A list entry makes the stream draw each position's",
        "# accepted run A with P(A >= j) = L(j) - L(j - 1) (repro/oracle/spans.py), so a chain of k emits L(k) tokens",
        "# per step on average. Keyed by the workload's dataset label (InstructCoder's prompts).",
        "defaults:", "  - default", "  - _self_", "", "accept:",
    ]
    for key, (target, drafts, _) in TARGETS.items():
        for hf, name in drafts.items():
            lines += [f"  {name}:  # {hf}", f"    {target}: {{{LABEL}: {curves[key][hf]}}}"]
    lines += ["", "eagle_accept:"]
    for key, (target, _, eagle) in TARGETS.items():
        lines += [f"  {target}: {{{LABEL}: {curves[key][eagle]}}}  # {eagle}"]
    repo = Path(__file__).resolve().parents[1]
    (repo / "conf" / "oracle" / "vllm_v1_bench.yaml").write_text("\n".join(lines) + "\n")
    print(f"wrote conf/oracle/vllm_v1_bench.yaml ({sum(len(c) for c in curves.values())} curves)")


if __name__ == "__main__":
    main()
