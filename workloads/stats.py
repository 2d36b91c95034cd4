"""Embedded length statistics for machines without the data files.

Two kinds, in order of preference:

1. Quantile tables ``workloads/stats/<dataset>.<tokenizer>.csv`` written by
  ``scripts/make_workload_stats.py`` from
   the real files: 101 quantiles (0, 0.01, ..., 1; min and max included) of prompt and reference-output token
   counts, and in ``#`` header lines the tokenizer, record count, source file and the normal-score correlation
   ``rho`` of (prompt, output). ``tokenizer`` is ``native`` for files that ship their own counts (ArXiv =
   Llama-2,
   traces). No records are stored. Sampling: a Gaussian copula with correlation ``rho`` (keeps the rank
   dependence of prompt and output cheaply) mapped through each marginal's inverse CDF, linearly interpolated
   between quantiles, rounded, at least 1.
2. Published means ± std (TurboSpec Table 2, per target size), sampled from Gamma marginals matched to
  the mean
   and standard deviation, independent (the paper gives no joint statistics).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

STATS_DIR = Path(__file__).resolve().parent / "stats"
QUANTILES = np.linspace(0.0, 1.0, 101)

#: TurboSpec Table 2: (input mean, input std) and output (mean, std) per (draft, target) pair; Sonnet input is
#: the vLLM sampler's default 550-token request, CNN/DailyMail is the summarization set.
PUBLISHED: dict[str, tuple[tuple[float, float], dict[str, tuple[float, float]]]] = {
    "sharegpt": ((227, 264), {"7b": (256, 249), "13b": (274, 255), "33b": (269, 233), "70b": (227, 208)}),
    "sonnet": ((517, 10), {"7b": (141, 22), "13b": (145, 19), "33b": (139, 15), "70b": (135, 18)}),
    "cnn_dailymail": ((1067, 537), {"7b": (108, 41), "13b": (94, 47), "33b": (82, 44), "70b": (85, 48)}),
}

#: Sets with no file offline, no embedded table and no published lengths: assumed (prompt mean, std) and
#: (output mean, std) in tokens, drawn as independent Gamma marginals, and said so in the run's [data] note.
#: InstructCode (TurboSpec §7; InstructCoder, Li et al. 2023, hub likaixin/InstructCoder): an edit instruction
#: (~20 tokens) with a code snippet in, the edited snippet out, so outputs are about as long as the snippet.
#: Assumed: snippets of ~200 tokens with a wide spread. Provide the file to replace these.
#: LAPS-SD's hub-only sets (no length statistics published, in the paper or on the hub cards we know of; the paper
#: says only that MiniThinky's inputs and outputs are longer than the other two sets'):
#: Chatbot Instruction Prompts (alespalla/chatbot_instruction_prompts: prompt → response pairs of instruction-tuning
#: data): short instructions, answers of a paragraph or a few, with a long tail (coefficient of variation 1).
#: MiniThinky (ngxson/MiniThinky-dataset: prompt → response, where a response is a "<|thinking|>" reasoning trace
#: followed by "<|answer|>"): the reasoning makes outputs several times longer than a plain answer; assumed ≈ 650
#: tokens, and prompts (questions, often with context) ≈ 110. Provide ``chatbot_instruction_prompts/train.parquet``
#: or ``minithinky/train.parquet`` (columns prompt, response) under $REPRO_DATA to replace these.
ASSUMED: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "instructcode": ((230.0, 150.0), (200.0, 140.0)),
    "chatbot_instruction_prompts": ((40.0, 40.0), (160.0, 160.0)),
    "minithinky": ((110.0, 100.0), (650.0, 400.0)),
    # GoodSpeed's hub-only sets (generation there is capped at 50 / 150 tokens, so their prompts matter most):
    # OpenOrca 1M-GPT4-Augmented (system prompt + question, GPT-4 answers) and HLE (long expert questions, short
    # exact answers); chosen, not measured
    "openorca": ((160.0, 180.0), (280.0, 250.0)),
    "hle": ((220.0, 260.0), (40.0, 60.0)),
}


def sample_assumed(dataset: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw lengths from :data:`ASSUMED`'s mean ± std (independent Gamma marginals)."""
    (pm, ps), (om, os_) = ASSUMED[dataset]
    return _gamma(pm, ps, n, rng), _gamma(om, os_, n, rng)


@dataclass(frozen=True, slots=True)
class QuantileTable:
    """101 quantiles of prompt and output lengths of one dataset under one tokenizer."""

    dataset: str
    tokenizer: str
    num_records: int
    rho: float  # normal-score (van der Waerden) correlation of prompt and output lengths
    prompt_q: np.ndarray  # float64, len 101
    output_q: np.ndarray  # float64, len 101; all -1 when the file has no reference outputs
    meta: tuple[tuple[str, str], ...]
    path: str

    @property
    def output_known(self) -> bool:
        return bool(self.output_q[0] >= 0)

    def get(self, key: str, default: str = "") -> str:
        return dict(self.meta).get(key, default)


def normal_score_corr(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of the normal scores of ``x`` and ``y`` (the Gaussian-copula parameter)."""
    if len(x) < 3:
        return 0.0
    from statistics import NormalDist

    inv = np.vectorize(NormalDist().inv_cdf)

    def scores(a: np.ndarray) -> np.ndarray:
        ranks = _average_ranks(a)
        return np.asarray(inv(ranks / (len(a) + 1)), dtype=np.float64)

    sx, sy = scores(x), scores(y)
    if sx.std() == 0 or sy.std() == 0:
        return 0.0
    return float(np.corrcoef(sx, sy)[0, 1])


def _average_ranks(a: np.ndarray) -> np.ndarray:
    """1-based ranks with ties averaged."""
    order = np.argsort(a, kind="stable")
    ranks = np.empty(len(a), dtype=np.float64)
    ranks[order] = np.arange(1, len(a) + 1)
    _, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def write_table(path: Path, table_meta: dict[str, str], prompt: np.ndarray, output: np.ndarray) -> None:
    """Write the 101-quantile table of ``prompt``/``output`` (output all -1 when unknown) to ``path``."""
    known = output >= 0
    pq = np.quantile(prompt, QUANTILES)
    oq = np.quantile(output[known], QUANTILES) if known.all() else np.full(101, -1.0)
    rho = normal_score_corr(prompt, output) if known.all() else 0.0
    lines = [f"# {k}: {v}" for k, v in table_meta.items()]
    lines += [f"# records: {len(prompt)}", f"# rho: {rho:.4f}", "quantile,prompt_len,output_len"]
    lines += [f"{q:.2f},{p:.2f},{o:.2f}" for q, p, o in zip(QUANTILES, pq, oq, strict=True)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@functools.lru_cache(maxsize=128)
def read_table(path: str) -> QuantileTable:
    """Parse a table written by :func:`write_table`."""
    meta: dict[str, str] = {}
    rows: list[list[float]] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
        elif line and not line.startswith("quantile"):
            rows.append([float(x) for x in line.split(",")])
    arr = np.array(rows)
    if arr.shape != (101, 3):
        raise ValueError(f"{path}: expected 101 quantile rows, got {arr.shape[0]}")
    return QuantileTable(
        meta.get("dataset", Path(path).stem),
        meta.get("tokenizer", "native"),
        int(meta.get("records", 0)),
        float(meta.get("rho", 0.0)),
        arr[:, 1],
        arr[:, 2],
        tuple(sorted(meta.items())),
        path,
    )


def find_table(dataset: str, tokenizer: str | None) -> QuantileTable | None:
    """The table for ``dataset`` under ``tokenizer``, else its native-count table, else any tokenizer's."""
    order = (
        [tokenizer, "native", "llama2", "llama3", "qwen"]
        if tokenizer
        else ["native", "llama2", "llama3", "qwen"]
    )
    for tok in order:
        path = STATS_DIR / f"{dataset}.{tok}.csv"
        if path.is_file():
            return read_table(str(path))
    return None


def sample_table(table: QuantileTable, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` (prompt, output) lengths through the Gaussian copula and inverse-CDF interpolation.

    Unknown outputs come back as -1.
    """
    z = rng.standard_normal((n, 2))
    z[:, 1] = table.rho * z[:, 0] + math.sqrt(max(0.0, 1.0 - table.rho**2)) * z[:, 1]
    u = _norm_cdf(z)
    prompt = np.maximum(1, np.rint(np.interp(u[:, 0], QUANTILES, table.prompt_q))).astype(np.int64)
    if not table.output_known:
        return prompt, np.full(n, -1, dtype=np.int64)
    output = np.maximum(1, np.rint(np.interp(u[:, 1], QUANTILES, table.output_q))).astype(np.int64)
    return prompt, output


def sample_output_marginal(table: QuantileTable, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` output lengths from ``table``'s output marginal."""
    u = rng.random(n)
    return np.maximum(1, np.rint(np.interp(u, QUANTILES, table.output_q))).astype(np.int64)


def sample_published(
    dataset: str, target: str, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Draw lengths from TurboSpec Table 2's mean ± std (independent Gamma marginals)."""
    if dataset not in PUBLISHED:
        raise KeyError(f"no published statistics for {dataset!r}; have {sorted(PUBLISHED)}")
    (pm, ps), outs = PUBLISHED[dataset]
    if target not in outs:
        raise KeyError(f"published target must be one of {sorted(outs)}, got {target!r}")
    om, os_ = outs[target]
    return _gamma(pm, ps, n, rng), _gamma(om, os_, n, rng)


def _gamma(mean: float, std: float, n: int, rng: np.random.Generator) -> np.ndarray:
    shape = (mean / std) ** 2
    return np.maximum(1, np.rint(rng.gamma(shape, mean / shape, size=n))).astype(np.int64)


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    from math import erf, sqrt

    return 0.5 * (1.0 + np.vectorize(erf)(z / sqrt(2.0)))


@dataclass(frozen=True, slots=True)
class GapTable:
    """Quantiles of a trace's inter-arrival gaps over their mean (mean 1), and the trace's own mean gap."""

    path: str
    mean_gap_s: float
    cv: float
    q: np.ndarray  # gap / mean gap at QUANTILES

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` i.i.d. gaps (mean ≈ 1) by inverse CDF with linear interpolation between quantiles."""
        return np.interp(rng.random(n), QUANTILES, self.q)


def write_gap_table(path: Path, meta: dict[str, str], gaps: np.ndarray) -> None:
    """Write the quantiles of normalised gaps with ``# key: value`` header lines (no records)."""
    lines = [f"# {k}: {v}" for k, v in meta.items()] + ["quantile,gap"]
    lines += [f"{q:.2f},{v:.6g}" for q, v in zip(QUANTILES, np.quantile(gaps, QUANTILES), strict=True)]
    path.write_text("\n".join(lines) + "\n")


def find_gap_table(trace: str) -> GapTable | None:
    """The committed gap table of ``trace`` (``workloads/stats/<trace>.gaps.csv``), if any."""
    path = STATS_DIR / f"{trace}.gaps.csv"
    if not path.is_file():
        return None
    meta: dict[str, str] = {}
    rows: list[float] = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
        elif line and not line.startswith("quantile"):
            rows.append(float(line.split(",")[1]))
    return GapTable(str(path), float(meta["mean_gap_s"]), float(meta.get("cv", "nan")), np.asarray(rows))
