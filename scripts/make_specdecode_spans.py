"""Summary statistics of SpecDecode-Bench's acceptance-span files, for runs without the data folder: the fallback of
``validate_specdecode_bench``.

Usage: ``REPRO_DATA=../shared/data python scripts/make_specdecode_spans.py [--max-k 7]``

Writes, from ``specdecode_bench/llama31_8b_{gsm8k,cnn,sharegpt,instructcoder}.jsonl`` (SpecDecode-Bench/simulator @
2fdccbd, arXiv 2601.11580; Llama-3.1-8B-Instruct, vLLM 0.10.1, greedy):

- ``workloads/stats/sdb_<dataset>.native.csv``: 101 quantiles of prompt and output lengths (output = the shortest of
  the recorded output and the two span lists, as the span replay uses), the workload's embedded table;
- ``conf/oracle/specdecode_spans.yaml``: per dataset and proposer (EAGLE-3 ``acc_eagle``, n-gram ``acc_ngram``) the
  mean acceptance length L(k), k = 1..K, of a replay of every record with chains of k drafts (a step at position i
  emits min(acc_len[i], k + 1): vLLM's mean acceptance length, over the steps a run takes, not over positions, which
  a long accepted run would count many times), and for n-gram the fraction of those steps where prompt lookup finds
  a 3-token match (:func:`repro.oracle.spans.lookup_matches`; L(k) is then over the matched steps). The oracle draws
  spans i.i.d. from these when the files are absent;
- ``conf/oracle/specdecode_ngram_v0.yaml``: the same statistics for prompt lookup under vLLM 0.6's n-gram proposal
  rule (``proposal: vllm_v0_ngram``, min 1 / max 4, the vLLM blog of 2024-10-17's settings), its spans computed from
  the records' token ids (:func:`repro.oracle.spans.ngram_v0_spans`) instead of read from ``acc_ngram``, and the
  EAGLE-3 stream as in ``specdecode_spans.yaml``.

Nothing but these counts is written. ``--write`` picks the outputs (default: all three: ``stats spans ngram_v0``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.oracle.spans import NgramV0, read_span_file
from workloads.datasets import default_data_root
from workloads.stats import write_table

DATASETS = ("gsm8k", "cnn", "sharegpt", "instructcoder")
LOOKUP_MIN = 3  # SpecDecode-Bench's n-gram proposer: prompt_lookup_min 3, prompt_lookup_max 7
FIELDS = {"acc_eagle": "eagle", "acc_ngram": "pld"}  # span field -> oracle stream
NGRAM_V0 = NgramV0(1, 4)  # vLLM 0.6's n-gram proposer as the vLLM blog ran it: prompt lookup min 1, max 4 (any k)
OUTPUTS = ("stats", "spans", "ngram_v0")


def walk(spans: list[np.ndarray], flags: list[np.ndarray] | None, out_len: np.ndarray, k: int
         ) -> tuple[float, float]:
    """Replay every record with chains of k drafts as the engine does (a step at position i emits min(s, k + 1); with
    prompt-lookup ``flags``, a step at an unmatched position drafts nothing and emits 1): the mean tokens emitted per
    drafting step, and the fraction of steps that draft."""
    emitted = drafting = steps = 0
    for r, (sp, n) in enumerate(zip(spans, out_len.tolist(), strict=True)):
        fl = flags[r] if flags is not None else None
        i = 0
        while i < n:
            steps += 1
            if fl is not None and not fl[i]:
                i += 1
                continue
            e = min(int(sp[i]), k + 1)
            emitted += e
            drafting += 1
            i += e
    return emitted / drafting, drafting / steps


def curve(spans: list[np.ndarray], flags: list[np.ndarray] | None, out_len: np.ndarray, max_k: int
          ) -> tuple[list[float], list[float], list[int]]:
    """Per k = 1..max_k, the step-level mean acceptance length (vLLM's: 1 + accepted / drafting steps, over a
    replay at that k) and the fraction of steps that draft; each increment L(k) − L(k − 1) capped at the previous
    one (one span distribution serves every k: its P(A >= j) cannot grow with j), and the k whose increment was
    capped."""
    lengths, fractions, capped = [], [], []
    prev, step = 1.0, 1.0
    for k in range(1, max_k + 1):
        length, frac = walk(spans, flags, out_len, k)
        inc = length - prev
        if inc > step:
            capped.append(k)
            inc = step
        step = max(inc, 0.0)
        prev = prev + step
        lengths.append(round(prev, 4))
        fractions.append(round(frac, 4))
    return lengths, fractions, capped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-k", type=int, default=7)
    ap.add_argument("--write", nargs="+", choices=OUTPUTS, default=list(OUTPUTS),
                    help="outputs to write: stats (workloads/stats/sdb_*.native.csv), spans "
                         "(conf/oracle/specdecode_spans.yaml), ngram_v0 (conf/oracle/specdecode_ngram_v0.yaml)")
    args = ap.parse_args()
    root = default_data_root()
    if root is None:
        sys.exit("error: no data folder: set $REPRO_DATA")
    repo = Path(__file__).resolve().parents[1]
    lines = [
        "# Measured acceptance spans of SpecDecode-Bench (Llama-3.1-8B-Instruct, vLLM 0.10.1, greedy; arXiv",
        "# 2601.11580), written by scripts/make_specdecode_spans.py: per dataset label the mean acceptance length",
        f"# L(k), k = 1..{args.max_k}, of a replay of every record with chains of k drafts (EAGLE-3: acc_eagle; n-gram",
        "# prompt lookup min 3 / max 7: acc_ngram, over the steps where the context's last 3 tokens occurred earlier",
        "# in it, with `match` the fraction of steps that do). validate_specdecode_bench replays the recorded spans",
        "# themselves when the data folder has the files, and draws spans i.i.d. from these statistics when it does",
        "# not (repro/oracle/spans.py).",
        "defaults:", "  - default", "  - _self_", "", "spans:",
    ]
    v0_lines = [
        "# Prompt lookup under vLLM 0.6's n-gram proposal (vllm/spec_decode/ngram_worker.py: n = max..min, the",
        "# earliest earlier occurrence of the context's last n tokens, the k tokens after it), prompt lookup min "
        f"{NGRAM_V0.min_n} / max {NGRAM_V0.max_n}",
        "# as in the vLLM blog of 2024-10-17, on SpecDecode-Bench's records (Llama-3.1-8B-Instruct's greedy outputs;",
        "# arXiv 2601.11580): with the data folder a request's spans are computed from its record's token ids",
        "# (repro/oracle/spans.py ngram_v0_spans), not read from the file's acc_ngram (vLLM 0.10.1, min 3 / max 7).",
        "# Without it they are drawn from these statistics, written by scripts/make_specdecode_spans.py: per dataset",
        f"# label the mean acceptance length L(k), k = 1..{args.max_k}, over the steps of a replay of every record "
        "with chains",
        "# of k drafts that propose, and `match`, the fraction of steps that do. The eagle stream is",
        "# specdecode_spans.yaml's (so that a case may drop it the same way: oracle.spans.eagle: null).",
        "defaults:", "  - default", "  - _self_", "", "spans:",
    ]
    by_stream: dict[str, list[str]] = {s: [] for s in FIELDS.values()}
    matches: list[str] = []
    v0_measured: list[str] = []
    v0_matches: list[str] = []
    for ds in DATASETS:
        path = root / "specdecode_bench" / f"llama31_8b_{ds}.jsonl"
        base = read_span_file(str(path), None)
        meta = {"dataset": f"sdb_{ds}", "tokenizer": "native", "counts": "llama3 (recorded token ids)",
                "source": f"$REPRO_DATA/specdecode_bench/{path.name} (output = min of output and span lists)"}
        if "stats" in args.write:
            write_table(repo / "workloads" / "stats" / f"sdb_{ds}.native.csv", meta, base.prompt_len,
                        base.output_len)
        for field, stream in FIELDS.items():
            f = read_span_file(str(path), field, None, LOOKUP_MIN if stream == "pld" else None)
            lengths, fractions, capped = curve(f.spans, f.proposes, base.output_len, args.max_k)
            note = f"; increment capped at k = {capped}" if capped else ""
            by_stream[stream].append(f"      sdb_{ds}: {lengths}  # {len(f.spans)} records{note}")
            if stream == "pld":
                matches.append(f"      sdb_{ds}: {fractions}")
        if "ngram_v0" in args.write:
            f = read_span_file(str(path), None, None, None, NGRAM_V0)
            lengths, fractions, capped = curve(f.spans, f.proposes, base.output_len, args.max_k)
            note = f"; increment capped at k = {capped}" if capped else ""
            v0_measured.append(f"      sdb_{ds}: {lengths}  # {len(f.spans)} records{note}")
            v0_matches.append(f"      sdb_{ds}: {fractions}")
        print(f"{ds}: {base.prompt_len.size} records")
    stand_in = ("    stands_in_for: []  # targets these 8B spans may stand in for (a run sets it where it says "
                "why)")
    for field, stream in FIELDS.items():
        block = [f"  {stream}:", f"    field: {field}", "    model: llama3.1-8b", stand_in, "    measured:",
                 *by_stream[stream]]
        lines += block
        if stream == "pld":
            lines += [f"    prompt_lookup_min: {LOOKUP_MIN}", "    match:", *matches]
        else:
            v0_lines += block
    v0_lines += ["  pld:", "    proposal: vllm_v0_ngram  # spans from the records' token ids (acc_ngram not read)",
                 f"    prompt_lookup_min: {NGRAM_V0.min_n}", f"    prompt_lookup_max: {NGRAM_V0.max_n}",
                 "    num_speculative_tokens: null  # any k (the spans hold every k); a number refuses longer chains",
                 "    model: llama3.1-8b", stand_in, "    measured:", *v0_measured, "    match:", *v0_matches]
    if "spans" in args.write:
        (repo / "conf" / "oracle" / "specdecode_spans.yaml").write_text("\n".join(lines) + "\n")
    if "ngram_v0" in args.write:
        (repo / "conf" / "oracle" / "specdecode_ngram_v0.yaml").write_text("\n".join(v0_lines) + "\n")


if __name__ == "__main__":
    main()
