"""Acceptance spans (repro/oracle/spans.py) and static batches (workload.static_batch): hand-computed cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from repro.core.errors import ConfigError
from repro.experiments.simulate import build, compose, run_point
from repro.oracle import TokenOracle
from repro.oracle.spans import measured_pmf

# Qwen3-32B with the Qwen3-1.7B draft on InstructCoder, vLLM V1 (../shared/data/vllm_v1_bench/acceptance.csv)
QWEN_L = [1.724, 2.232, 2.584, 2.847, 3.032, 3.154]
SPANS = [3, 1, 2, 5, 1, 1, 4, 2, 1, 1, 1, 1]  # hand-made record: a step at output position i emits min(s_i, k + 1)


def _write(path: Path, spans: list[list[int]], *, model: str | None = None, out: int | None = None) -> str:
    with path.open("w") as fh:
        for s in spans:
            rec = {"prompt_token_ids": [1] * 10, "generated_token_ids": [7] * (out or len(s)),
                   "acc_eagle": {"acc_len": s}, "acc_ngram": {"acc_len": [1] * len(s)}}
            if model:
                rec["model"] = model
            fh.write(json.dumps(rec) + "\n")
    return str(path)


def _oracle(n: int, group: np.ndarray | None = None) -> TokenOracle:
    return TokenOracle(0, np.array(["d"] * n, dtype=object), {}, span_key=group)


def _replay(tmp_path: Path, spans: list[list[int]], output_len: list[int], **node: object) -> TokenOracle:
    path = _write(tmp_path / "t.jsonl", spans, model=None)
    o = _oracle(len(output_len))
    o.use_spans({"eagle": {"field": "acc_eagle", "model": "llama3.1-8b", **node}}, target="llama3.1-8b",
                output_len=np.array(output_len), record=np.arange(len(output_len)) % len(spans),
                record_file={"d": path})
    return o


def test_replayed_trace_gives_the_recorded_tokens_per_step(tmp_path: Path) -> None:
    o = _replay(tmp_path, [SPANS], [12])
    pos, emitted = 0, []
    while pos < len(SPANS):
        _, acc, matched = o.score_chain(np.array([0]), np.array([pos]), np.array([3]), "eagle")
        assert acc[0] == matched[0]
        emitted.append(int(acc[0]) + 1)
        pos += emitted[-1]
    # position 0: span 3 → 3; position 3: span 5, cut at k + 1 = 4; position 7: span 2; 9, 10, 11: span 1 each
    assert emitted == [3, 4, 2, 1, 1, 1]
    # the fast path's chain_run scores the same steps at once
    acc_run, _ = o.chain_run(np.array([0]), np.array([0]), 3, 6, "eagle")
    assert (acc_run[:, 0] + 1).tolist() == emitted
    # k = 1: every step emits min(s, 2)
    assert o.score_chain(np.array([0]), np.array([0]), np.array([1]), "eagle")[1].tolist() == [1]


def test_copies_of_a_prompt_accept_the_same(tmp_path: Path) -> None:
    o = _replay(tmp_path, [SPANS, [1] * 12], [12, 12, 12])  # requests 0 and 2 replay record 0
    pos = np.array([0, 0, 0])
    got = o.score_chain(np.arange(3), pos, np.full(3, 3), "eagle")[1]
    assert got.tolist() == [2, 0, 2]
    # measured spans: copies share the span key (their prompt), so their draws coincide
    m = TokenOracle(0, np.array(["d"] * 4, dtype=object), {}, eagle_accept_mean={"d": QWEN_L},
                    span_key=np.array([0, 0, 1, 1]))
    acc, _ = m.chain_run(np.arange(4), np.zeros(4, dtype=np.int64), 3, 50, "eagle")
    assert (acc[:, 0] == acc[:, 1]).all() and (acc[:, 2] == acc[:, 3]).all() and (acc[:, 0] != acc[:, 2]).any()


def test_measured_curve_gives_its_mean_acceptance_length_at_every_k() -> None:
    n, steps = 400, 200
    o = TokenOracle(0, np.array(["instructcode"] * n, dtype=object), {"instructcode": QWEN_L})
    for k in range(1, len(QWEN_L) + 1):
        acc, _ = o.chain_run(np.arange(n), np.zeros(n, dtype=np.int64), k, steps)
        emitted = acc + 1.0
        se = emitted.std() / np.sqrt(emitted.size)
        assert abs(emitted.mean() - QWEN_L[k - 1]) < 4 * se, (k, emitted.mean(), QWEN_L[k - 1])
        assert se < 0.01  # a tight tolerance: 80,000 steps
    with pytest.raises(ValueError, match="go to k = 6 only"):
        o.score_chain(np.array([0]), np.array([0]), np.array([7]))


def test_measured_pmf_hand_computed() -> None:
    # L = [1.5, 1.75]: P(A >= 1) = 0.5, P(A >= 2) = 0.25 → P(A = 0, 1, 2) = 0.5, 0.25, 0.25
    assert measured_pmf([1.5, 1.75], "x").tolist() == [0.5, 0.25, 0.25]
    with pytest.raises(ValueError, match="not a mean-acceptance-length curve"):
        measured_pmf([1.2, 1.9], "x")  # increments must not grow


def test_float_tables_keep_todays_model() -> None:
    o = TokenOracle(0, np.array(["d"] * 3, dtype=object), {"d": 0.6})
    ref = TokenOracle(0, np.array(["d"] * 3, dtype=object), {"d": 0.6})
    a = o.score_chain(np.arange(3), np.zeros(3, dtype=np.int64), np.full(3, 4))
    b = ref.score_chain(np.arange(3), np.zeros(3, dtype=np.int64), np.full(3, 4))
    assert all((x == y).all() for x, y in zip(a, b, strict=True))


def test_span_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"request 0 \(record 0\) generates 13 tokens but the trace's 'acc_eagle' "
                                         r"spans cover 12"):
        _replay(tmp_path, [SPANS], [13])
    path = _write(tmp_path / "m.jsonl", [SPANS], model="llama3-70b")
    o = _oracle(1)
    node = {"eagle": {"field": "acc_eagle"}}
    with pytest.raises(ValueError, match=r"recorded with 'llama3-70b', not the run's target 'llama3\.1-8b'"):
        o.use_spans(node, target="llama3.1-8b", output_len=np.array([5]), record=np.array([0]),
                    record_file={"d": path})
    # declared as standing in for the target: accepted
    o.use_spans({"eagle": {"field": "acc_eagle", "stands_in_for": ["llama3.1-8b"]}}, target="llama3.1-8b",
                output_len=np.array([5]), record=np.array([0]), record_file={"d": path})
    with pytest.raises(FileNotFoundError, match=r"acceptance-span file .*nope\.jsonl not found: provide a JSONL"):
        _oracle(1).use_spans(node, target="t", output_len=np.array([5]), record=np.array([0]),
                             record_file={"d": str(tmp_path / "nope.jsonl")})
    with pytest.raises(ValueError, match="trees, beams and draft probabilities are not supported"):
        _replay(tmp_path, [SPANS], [12]).candidates(0, 0, 2, 2, "eagle")


def test_fallback_draws_from_the_measured_curve_and_says_so() -> None:
    o = _oracle(2)
    o.use_spans({"pld": {"field": "acc_ngram", "measured": {"d": [1.5, 1.75]}}}, target="t",
                output_len=np.array([5, 5]))
    assert o.notes and "measured mean acceptance lengths" in o.notes[0]
    acc, _ = o.chain_run(np.arange(2), np.zeros(2, dtype=np.int64), 2, 5, "pld")
    assert set(np.unique(acc).tolist()) <= {0, 1, 2}
    with pytest.raises(ValueError, match=r"request 0 \(e\) has no recorded spans"):
        TokenOracle(0, np.array(["e"], dtype=object), {}).use_spans(
            {"pld": {"field": "acc_ngram", "measured": {"d": [1.5]}}}, target="t", output_len=np.array([5]))


def _cfg(tmp_path: Path, batch: int, prompts: int, *extra: str) -> object:
    path = _write(tmp_path / "sdb.jsonl", [SPANS, [2] * 12, [4] * 12], model="llama3.1-8b")
    return compose(["+exp=validate_specdecode_bench", f"batch={batch}", f"num_requests={prompts}",
                    "system=static_sd", "system.k=3", "system.proposer=eagle", "max_sim_time_s=null",
                    f"workload.datasets=[{{name: spans, path: '{path}', label: sdb_t}}]", *extra])


def test_static_batches_release_one_prompt_after_another(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, 3, 2)
    table = build(cfg).table
    assert table.group.tolist() == [0, 0, 0, 1, 1, 1] and (table.arrival_s == 0).all()
    assert (table.record[:3] == table.record[0]).all() and (table.output_len == 12).all()
    res = run_point(cfg)
    r = res.requests.sort_values("rid")
    first, second = r[r.rid < 3], r[r.rid >= 3]
    assert (first.arrival_s == 0).all()
    assert np.allclose(second.arrival_s, first.finish_at.max())  # released once batch 0 has finished
    # copies are twins: the same steps. The prefill emits output token 0; decode steps start at position 1 with k = 3:
    # SPANS: s[1]=1, s[2]=2, s[4]=1, s[5]=1, s[6]=4, s[10]=1, s[11]=1 → 7 steps; [2]*12: 2 a step over 11 tokens → 6;
    # [4]*12: 4, 4, 3 → 3
    steps = {0: 7, 1: 6, 2: 3}
    for grp in (first, second):
        assert grp.num_spec_steps.nunique() == 1
    recs = table.record[[0, 3]].tolist()
    assert [int(first.num_spec_steps.iloc[0]), int(second.num_spec_steps.iloc[0])] == [steps[x] for x in recs]
    # the paper's metric: per prompt Σ output / its batch's time, averaged
    t0, t1 = first.finish_at.max(), second.finish_at.max() - first.finish_at.max()
    assert res.metrics["output_throughput"] == pytest.approx((36 / t0 + 36 / t1) / 2)


def test_fast_path_equals_step_path_on_spans(tmp_path: Path) -> None:
    on = run_point(_cfg(tmp_path, 4, 3, "+engine.fast_forward=true")).requests
    off = run_point(_cfg(tmp_path, 4, 3, "+engine.fast_forward=false")).requests
    for col in ("finish_at", "num_accepted", "num_spec_steps"):
        assert (on[col].to_numpy() == off[col].to_numpy()).all(), col


def test_missing_span_file_without_fallback_is_one_line(tmp_path: Path) -> None:
    cfg = compose(["+exp=validate_specdecode_bench", "workload.source=real", "num_requests=1",
                   f"workload.datasets=[{{name: spans, path: '{tmp_path}/none.jsonl', label: sdb_x}}]"])
    with pytest.raises((ConfigError, FileNotFoundError), match=r"none\.jsonl"):
        build(cfg)
