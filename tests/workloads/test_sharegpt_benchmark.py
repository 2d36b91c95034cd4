"""ShareGPT with ``sampler: vllm_benchmark``: vLLM 0.6-era ``benchmark_serving.py``'s order and pruning, and the EOS
model (output = min(max_tokens, L), L an independent draw from the pruned reference reply lengths).

Most tests read a tiny token file written in ``tmp_path`` (hand-checkable lengths); the no-data tests pin an empty
data folder (``no_data``); one test reads the real 300b file (skipped without it).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from workloads.build import build_workload
from workloads.datasets import (
    DataMissingError,
    data_folder,
    vllm_benchmark_order,
    vllm_benchmark_pool,
    vllm_sharegpt_keep,
)
from workloads.lengths import LengthDrawer
from workloads.spec import DatasetSpec, parse_workload
from workloads.stats import find_table, sample_table

# (prompt, reference reply) tokens of the tiny file, in file order; vLLM's shuffle visits them as ORDER
RECORDS = [
    (10, 100),  # 0 kept
    (3, 50),  # 1 dropped: prompt < 4
    (20, 3),  # 2 dropped: reply < 4
    (1025, 10),  # 3 dropped: prompt > 1024
    (1000, 1049),  # 4 dropped: prompt + reply = 2049 > 2048
    (30, 200),  # 5 kept
    (40, 400),  # 6 kept
    (1024, 1024),  # 7 kept: prompt = 1024 and prompt + reply = 2048 are allowed
]
ORDER = [4, 1, 5, 2, 0, 3, 7, 6]  # random.seed(0); random.shuffle(list of 8): worked out in the first test
POOL = [5, 0, 7, 6]  # ORDER with the dropped records left out: the benchmark's requests, in order
REPLIES = [100, 200, 400, 1024]  # the pruned reference replies (records 0, 5, 6, 7): L's distribution


def cfg(n: int, source: str = "auto", **ds: Any) -> dict[str, Any]:
    return {"num_requests": n, "arrival": {"kind": "poisson", "rate_per_s": 4.0}, "source": source,
            "datasets": [{"name": "sharegpt", "sampler": "vllm_benchmark", **ds}]}


def build(n: int, seed: int = 0, tokenizer: str = "llama3", **kw: Any) -> Any:
    return build_workload(cfg(n, **kw), seed=np.random.SeedSequence(seed), tokenizer=tokenizer)


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Path]:
    """A data folder whose ShareGPT 300b file holds :data:`RECORDS` (Llama-3 token ids, read as counted)."""
    root = tmp_path / "tiny_data"
    (root / "sharegpt").mkdir(parents=True)
    with (root / "sharegpt" / "sharegpt_llama3_tokens_300b.jsonl").open("w", encoding="utf-8") as f:
        for i, (p, o) in enumerate(RECORDS):
            f.write(json.dumps({"input_toks": p, "output_toks": o, "arrival_time_ns": i,
                                "input_tok_ids": [100 + i] * p, "output_tok_ids": [7] * o}) + "\n")
    with data_folder(root):
        yield root


# ---------------------------------------------------------------- order and pruning


def test_order_is_pythons_seed_0_shuffle() -> None:
    # random.shuffle swaps x[i] with x[randbelow(i + 1)] for i = 7 .. 1 (randrange(i + 1) draws the same); after
    # random.seed(0) the draws are 6, 6, 3, 0, 2, 2, 1: [0,1,2,3,4,5,6,7] -> (7<->6) [0,1,2,3,4,5,7,6] -> (6<->6)
    # same -> (5<->3) [0,1,2,5,4,3,7,6] -> (4<->0) [4,1,2,5,0,3,7,6] -> (3<->2) [4,1,5,2,0,3,7,6] -> (2<->2, 1<->1)
    rng = random.Random(0)
    draws = [rng.randrange(i + 1) for i in reversed(range(1, 8))]
    assert draws == [6, 6, 3, 0, 2, 2, 1]
    by_hand = list(range(8))
    for i, j in zip(reversed(range(1, 8)), draws, strict=True):
        by_hand[i], by_hand[j] = by_hand[j], by_hand[i]
    assert by_hand == ORDER
    assert vllm_benchmark_order(8).tolist() == ORDER
    # vLLM shuffles (prompt, reply) pairs: the permutation is the same
    pairs = [(f"prompt {i}", f"reply {i}") for i in range(8)]
    random.seed(0)
    random.shuffle(pairs)
    assert [int(a.split()[1]) for a, _ in pairs] == ORDER
    assert vllm_benchmark_order(5).tolist() == [2, 1, 0, 4, 3]


def test_order_leaves_module_random_alone() -> None:
    random.seed(123)
    expected = random.random()
    random.seed(123)
    vllm_benchmark_order(50)
    assert random.random() == expected


def test_pool_prunes_as_vllm_and_keeps_the_order() -> None:
    p, o = (np.array(x) for x in zip(*RECORDS, strict=True))
    assert vllm_benchmark_pool(p, o, None).tolist() == POOL
    # --sharegpt-output-len 5: replies under 4 tokens no longer matter, and the totals use 5
    assert vllm_benchmark_pool(p, o, 5).tolist() == [4, 5, 2, 0, 7, 6]
    assert vllm_sharegpt_keep(p, o, None).tolist() == [i in POOL for i in range(8)]


def test_requests_are_the_first_kept_in_vllm_order(tiny: Path) -> None:
    t = build(3)
    assert t.prompt_record.tolist() == POOL[:3]
    assert t.prompt_len.tolist() == [RECORDS[i][0] for i in POOL[:3]]
    assert "random.seed(0) shuffle, 4 kept after pruning" in t.source
    assert [s.kind for s in t.provenance] == ["file"] and not t.provenance[0].fallback
    # the real backend's prompt ids come with them
    rec = dict(t.prompt_sources)["sharegpt"]
    assert rec.prompt_ids is not None and rec.prompt_ids[POOL[0]][0] == 100 + POOL[0]


def test_more_requests_than_kept_cycle_in_order_and_say_so(tiny: Path) -> None:
    t = build(10)
    assert t.prompt_record.tolist() == (POOL * 3)[:10]
    assert "cycled in the same order (records repeat)" in t.source
    for r in POOL:  # the same prompt gets the same (greedy) reply every time
        assert len(set(t.output_len[t.prompt_record == r].tolist())) == 1
    assert "cycled" not in build(4).source


def test_entries_with_the_same_settings_continue_one_sequence(tiny: Path) -> None:
    ds = [{"name": "sharegpt", "sampler": "vllm_benchmark"}]
    c = {**cfg(4), "slo_classes": {"a": {"proportion": 0.5, "datasets": ds}, "b": {"datasets": ds}}}
    t = build_workload(c, seed=np.random.SeedSequence(0), tokenizer="llama3")
    assert t.prompt_record is not None and sorted(t.prompt_record.tolist()) == sorted(POOL)


# ---------------------------------------------------------------- the EOS model


def test_output_is_min_of_reference_and_an_eos_draw(tiny: Path) -> None:
    spec = parse_workload(cfg(4))
    p, o, rec = LengthDrawer(spec, tiny, "llama3", None, np.random.default_rng(5)).sample_records(spec.datasets[0], 4)
    assert p.tolist() == [RECORDS[i][0] for i in POOL]
    eos = np.array(REPLIES)[np.random.default_rng(5).integers(0, len(REPLIES), size=len(POOL))]
    assert rec.tolist() == POOL
    assert o.tolist() == np.minimum([RECORDS[i][1] for i in POOL], eos).tolist()


def test_eos_draw_is_the_pruned_reply_distribution(tiny: Path) -> None:
    # record 6 (reference 400) is the 4th request: min(400, L), L uniform on REPLIES -> 100, 200 w.p. 1/4, 400 w.p. 1/2
    seen = np.array([build(4, seed=s).output_len[3] for s in range(400)])
    assert set(seen.tolist()) <= {100, 200, 400}
    freq = [float(np.mean(seen == v)) for v in (100, 200, 400)]
    assert freq == pytest.approx([0.25, 0.25, 0.5], abs=0.08)


def test_output_never_exceeds_the_reference(tiny: Path) -> None:
    ref = np.array([o for _, o in RECORDS])
    shorter = 0
    for s in range(30):
        t = build(12, seed=s)
        assert (t.output_len <= ref[t.prompt_record]).all()
        shorter += int((t.output_len < ref[t.prompt_record]).sum())
    assert shorter > 0  # EOS does end some requests early


def test_fixed_output_len_is_max_tokens(tiny: Path) -> None:
    t = build(6, output_len=5)
    assert t.prompt_record.tolist() == [4, 5, 2, 0, 7, 6]
    assert (t.output_len == 5).all()  # min(5, L) with every L >= 100


def test_same_seed_same_lengths(tiny: Path) -> None:
    a, b = build(8, seed=3), build(8, seed=3)
    assert np.array_equal(a.output_len, b.output_len) and np.array_equal(a.prompt_len, b.prompt_len)
    others = [build(8, seed=s) for s in range(4, 10)]
    assert all(np.array_equal(a.prompt_record, t.prompt_record) for t in others)  # vLLM's seed 0, not ours
    assert any(not np.array_equal(a.output_len, t.output_len) for t in others)


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"name": "alpaca"}, "applies to dataset sharegpt only"),
        ({"name": "sonnet"}, "applies to dataset sharegpt only"),
        ({"name": "sharegpt", "variant": "v3_first_turn"}, "variant v3_first_turn has none"),
        ({"name": "sharegpt", "prune": False}, "always applies vLLM's pruning"),
        ({"name": "sharegpt", "source": "published"}, "not published means"),
        ({"name": "sharegpt", "sampler": "vllm"}, "sampler must be one of"),
    ],
)
def test_refused_in_one_line(entry: dict[str, Any], match: str) -> None:
    c = {"num_requests": 4, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
         "datasets": [{"sampler": "vllm_benchmark", **entry}]}
    with pytest.raises(ValueError, match=match) as exc:
        parse_workload(c)
    assert "\n" not in str(exc.value)
    assert DatasetSpec(name=entry["name"]).sampler is None  # the same entry without the sampler is fine


def test_workload_source_published_refused(no_data: None) -> None:
    with pytest.raises(ValueError, match="not published means") as exc:
        build(4, source="published")
    assert "\n" not in str(exc.value)


# ---------------------------------------------------------------- without the data folder


def test_no_data_uses_the_embedded_table_and_says_so(no_data: None) -> None:
    t = build(500)
    (src,) = t.provenance
    assert src.kind == "embedded" and src.fallback
    assert "sharegpt.llama3.csv" in src.detail and "vLLM benchmark_serving.py sampler without its file" in src.detail
    assert t.prompt_record is None
    assert ((t.prompt_len >= 4) & (t.prompt_len <= 1024)).all() and (t.prompt_len + t.output_len <= 2048).all()
    assert np.array_equal(t.output_len, build(500).output_len)  # same seed, same lengths
    assert not np.array_equal(t.output_len, build(500, seed=1).output_len)
    embedded_only = build(4, source="embedded").provenance[0]
    assert embedded_only.kind == "embedded" and not embedded_only.fallback


def test_no_data_eos_model_is_min_of_two_pruned_draws(no_data: None) -> None:
    n = 6000
    got = build(n).output_len.mean()
    table = find_table("sharegpt", "llama3")
    assert table is not None
    p, o = sample_table(table, 4 * n, np.random.default_rng(99))
    ref = o[vllm_sharegpt_keep(p, o, None)]
    half = ref.size // 2
    expected = np.minimum(ref[:half], ref[half: 2 * half]).mean()
    assert got == pytest.approx(expected, rel=0.06)
    assert got < 0.8 * ref.mean()  # the reference mean (what the plain sampler gives) is far above


def test_no_data_variant_reads_its_own_table(no_data: None) -> None:
    t = build(300, variant="tokens_all")
    assert "sharegpt_tokens_all.llama3.csv" in t.source
    assert t.prompt_len.mean() > 1.5 * build(300).prompt_len.mean()  # 300a's long prompts are in it


def test_no_data_source_real_refused(no_data: None) -> None:
    with pytest.raises(DataMissingError):
        build(4, source="real")


# ---------------------------------------------------------------- the real file


@pytest.mark.data("sharegpt/sharegpt_llama3_tokens_300b.jsonl")
def test_real_300b_lengths(real_data: Path) -> None:
    t = build(273)
    assert "273 kept after pruning" in t.source and len(set(t.prompt_record.tolist())) == 273
    rec = dict(t.prompt_sources)["sharegpt"]
    assert t.prompt_len.mean() == pytest.approx(148.85, abs=0.01)  # every kept record once
    assert rec.output_len[t.prompt_record].mean() == pytest.approx(284.23, abs=0.01)  # CALIBRATION: about 284
    assert (t.output_len <= rec.output_len[t.prompt_record]).all()
    assert 150 < t.output_len.mean() < 230
