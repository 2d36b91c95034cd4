"""Acceptance spans (repro/oracle/spans.py) and static batches (workload.static_batch): hand-computed cases."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from repro.core.errors import ConfigError
from repro.experiments.simulate import build, compose, run_point
from repro.oracle import TokenOracle
from repro.oracle.spans import NgramV0, lookup_matches, measured_pmf, ngram_v0_spans, read_span_file, span_rule
from tests.conftest import data_root

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


# --- vLLM 0.6's n-gram proposal, computed from token ids (spans.ngram_v0_spans) --------------------------------------

# A hand-worked record. T = prompt + generated, indexed 0..19:
#   0:4 1:1 2:2 3:3 4:8 5:2 6:3 7:4 8:5 9:9 10:3 | 11:4 12:5 13:9 14:3 15:7 16:7 17:7 18:7 19:1
V0_PROMPT = [4, 1, 2, 3, 8, 2, 3, 4, 5, 9, 3]
V0_OUT = [4, 5, 9, 3, 7, 7, 7, 7, 1]
# min 1, max 4, k = 4; position i sees T[:11 + i]:
# i=0 (ends 4 5 9 3): no 4-, 3- or 2-gram match; [3] occurs at 3 and 6: the EARLIEST, 3, proposes T[4:8] = 8 2 3 4
#     against 4 5 ...: 0 accepted, span 1 (the most recent, 6, would propose 4 5 9 3: span 5)
# i=1 (ends 5 9 3 4): [3 4] at 6 (n = 2 is tried before n = 1, whose [4] at 0 would propose 1 2 3 8): 5 9 3 4
#     against 5 9 3 7: 3 accepted, span 4 (k = 2: span 3)
# i=2 (ends 9 3 4 5): [3 4 5] at 6: 9 3 4 5 against 9 3 7: span 3
# i=3 (ends 3 4 5 9): [3 4 5 9] at 6: 3 4 5 9 against 3 7: span 2
# i=4 (ends 4 5 9 3): [4 5 9 3] at 7: T[11:15] = 4 5 9 3 against 7: span 1
# i=5 (ends 9 3 7): 7 occurs only as the suffix: no proposal
# i=6 (ends 3 7 7): [7 7] only as the suffix; [7] at 15 proposes from 16 = the last token, clamped: 7 7 7 7 against
#     7 7 1: 2 accepted, span 3 (a proposal cut at the context's end, 7 alone, would give 2)
# i=7 (ends 7 7 7): [7 7 7] only as the suffix; [7 7] at 15 OVERLAPS the suffix (16, 17) and counts: 7 7 7 7 against
#     7 1: 1 accepted, span 2 (= the tokens left)
# i=8 (ends 7 7 7 7): [7 7 7] at 15: 7 7 7 7 against 1: span 1
V0_SPANS = [1, 4, 3, 2, 1, 1, 3, 2, 1]
V0_PROPOSES = [True, True, True, True, True, False, True, True, True]


def _vllm_063_proposal(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int] | None:
    """vLLM 0.6.3's NGramWorker.sampler_output for one sequence, statement by statement (lists for tensors)."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        windows = [tokens[j:j + n] for j in range(length - n + 1)][:-1]  # unfold(0, n, 1)[:-1]: not itself
        matches = [w == suffix for w in windows]
        if any(matches):  # first_match = matches.max(dim=-1): the first True
            start = matches.index(True) + n
            return [tokens[min(start + t, length - 1)] for t in range(k)]  # spec_indices.clamp_(max=len - 1)
    return None


def _reference_spans(prompt: list[int], out: list[int], min_n: int, max_n: int,
                     k: int | None) -> tuple[list[int], list[bool]]:
    spans, proposes = [], []
    for i in range(len(out)):
        left = len(out) - i
        drafts = _vllm_063_proposal(prompt + out[:i], min_n, max_n, left if k is None else k)
        a = 0
        while drafts is not None and a < min(len(drafts), left) and drafts[a] == out[i + a]:
            a += 1
        spans.append(min(a + 1, left))
        proposes.append(drafts is not None)
    return spans, proposes


def test_ngram_v0_hand_worked() -> None:
    spans, proposes = ngram_v0_spans(V0_PROMPT, V0_OUT, 1, 4, 4)
    assert spans.tolist() == V0_SPANS and proposes.tolist() == V0_PROPOSES
    assert ngram_v0_spans(V0_PROMPT, V0_OUT, 1, 4)[0].tolist() == V0_SPANS  # k_max None: no cap reached here
    assert ngram_v0_spans(V0_PROMPT, V0_OUT, 1, 4, 2)[0].tolist() == [1, 3, 3, 2, 1, 1, 3, 2, 1]  # min(s, k + 1)
    # min 2: i=0 and i=6 matched only with n = 1; i=7 still matches [7 7] where it overlaps the suffix
    spans, proposes = ngram_v0_spans(V0_PROMPT, V0_OUT, 2, 4, 4)
    assert proposes.tolist() == [False, True, True, True, True, False, False, True, True]
    assert spans.tolist() == [1, 4, 3, 2, 1, 1, 1, 2, 1]
    # max 1: i=1's proposal is now [4]'s earliest occurrence (0): 1 2 3 8 against 5: span 1
    assert ngram_v0_spans(V0_PROMPT, V0_OUT, 1, 1, 4)[0].tolist()[1] == 1
    for args in ((1, 4, 4), (2, 4, 4), (1, 4, 2), (1, 1, 4), (1, 4, None)):
        assert [x.tolist() for x in ngram_v0_spans(V0_PROMPT, V0_OUT, *args)] == list(
            _reference_spans(V0_PROMPT, V0_OUT, *args)), args
    with pytest.raises(ValueError, match="min_n <= max_n"):
        ngram_v0_spans(V0_PROMPT, V0_OUT, 3, 2)


def test_ngram_v0_equals_vllms_loop_on_random_sequences() -> None:
    rng = np.random.default_rng(7)
    for case in range(400):
        vocab = int(rng.integers(2, 5))  # few symbols: many matches, overlaps and runs past the context's end
        prompt = rng.integers(0, vocab, int(rng.integers(0, 14))).tolist()
        out = rng.integers(0, vocab, int(rng.integers(0, 16))).tolist()
        lo = int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 3))
        k = [None, 1, 3, 6][case % 4]
        got = [x.tolist() for x in ngram_v0_spans(prompt, out, lo, hi, k)]
        assert got == list(_reference_spans(prompt, out, lo, hi, k)), (prompt, out, lo, hi, k)


def _v0_file(tmp_path: Path) -> str:
    path = tmp_path / "v0.jsonl"
    rec = {"prompt_token_ids": V0_PROMPT, "generated_token_ids": V0_OUT, "model": "llama3.1-8b",
           "acc_ngram": {"acc_len": [2, 3, 1, 5, 1, 1, 2, 1, 1]}, "acc_eagle": {"acc_len": [1] * 9}}
    path.write_text(json.dumps(rec) + "\n")
    return str(path)


def _pld(path: str, node: dict[str, object]) -> TokenOracle:
    o = _oracle(1)
    o.use_spans({"pld": {"model": "llama3.1-8b", **node}}, target="llama3.1-8b", output_len=np.array([9]),
                record=np.array([0]), record_file={"d": path})
    return o


def _score_every_position(o: TokenOracle, k: int) -> tuple[list[int], list[int]]:
    got = [o.score_chain(np.array([0]), np.array([i]), np.array([k]), "pld") for i in range(9)]
    return [int(g[0][0]) for g in got], [int(g[1][0]) for g in got]


def test_config_selects_the_v0_rule_and_the_recorded_default_is_unchanged(tmp_path: Path) -> None:
    path = _v0_file(tmp_path)
    o = _pld(path, {"proposal": "vllm_v0_ngram", "prompt_lookup_max": 4, "field": "acc_ngram"})  # field: not read
    proposed, accepted = _score_every_position(o, 4)
    assert proposed == [4 if p else 0 for p in V0_PROPOSES]
    assert accepted == [s - 1 for s in V0_SPANS]
    assert not o.notes  # computed from a real file's token ids: no fallback to report
    # the recorded default (no proposal key, or proposal: recorded) replays acc_ngram where 3 tokens match
    flags = lookup_matches(V0_PROMPT, V0_OUT, 3).tolist()
    for node in ({"field": "acc_ngram", "prompt_lookup_min": 3},
                 {"field": "acc_ngram", "prompt_lookup_min": 3, "proposal": "recorded"}):
        proposed, accepted = _score_every_position(_pld(path, node), 4)
        assert proposed == [4 if f else 0 for f in flags]
        assert accepted == [min(s - 1, p) for s, p in zip([2, 3, 1, 5, 1, 1, 2, 1, 1], proposed, strict=True)]
    assert read_span_file(path, "acc_ngram").spans[0].tolist() == [2, 3, 1, 5, 1, 1, 2, 1, 1]
    # num_speculative_tokens: spans computed for that many drafts, longer chains refused
    o = _pld(path, {"proposal": "vllm_v0_ngram", "prompt_lookup_max": 4, "num_speculative_tokens": 2})
    assert _score_every_position(o, 2)[1] == [min(s - 1, 2) * p for s, p in zip(V0_SPANS, V0_PROPOSES, strict=True)]
    with pytest.raises(ValueError, match=r"computed for at most 2 drafts \(oracle\.spans\.pld\.num_speculative"):
        o.score_chain(np.array([0]), np.array([1]), np.array([3]), "pld")


@pytest.mark.parametrize(("node", "error"), [
    ({"proposal": "vllm_v1"}, r"oracle\.spans\.pld\.proposal: 'vllm_v1' is not a proposal rule"),
    ({"proposal": "vllm_v0_ngram"}, r"oracle\.spans\.pld\.prompt_lookup_max: required"),
    ({"proposal": "vllm_v0_ngram", "prompt_lookup_max": 0}, r"prompt_lookup_max: 0 must be an integer >= 1"),
    ({"proposal": "vllm_v0_ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 5},
     r"prompt_lookup_min: 5 is larger than prompt_lookup_max 4"),
    ({"proposal": "vllm_v0_ngram", "prompt_lookup_max": 4, "num_speculative_tokens": 2.5},
     r"num_speculative_tokens: 2\.5 must be an integer >= 1"),
    ({"field": "acc_ngram", "prompt_lookup_max": 4}, r"prompt_lookup_max: read only with .*proposal: vllm_v0_ngram"),
], ids=["unknown rule", "no max", "max 0", "min above max", "fractional k", "max without the v0 rule"])
def test_v0_rule_config_errors_name_the_key(node: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        span_rule(node, "oracle.spans.pld")
    assert span_rule({"proposal": "vllm_v0_ngram", "prompt_lookup_max": 4}, "x") == NgramV0(1, 4, None)
    assert span_rule({"field": "acc_ngram", "prompt_lookup_min": 3}, "x") is None


def test_v0_rule_is_prompt_lookups_only(tmp_path: Path) -> None:
    o = _oracle(1)
    with pytest.raises(ValueError, match=r"oracle\.spans\.eagle\.proposal: vllm_v0_ngram is prompt lookup's rule"):
        o.use_spans({"eagle": {"proposal": "vllm_v0_ngram", "prompt_lookup_max": 4}}, target="llama3.1-8b",
                    output_len=np.array([9]), record=np.array([0]), record_file={"d": _v0_file(tmp_path)})


def test_vllm_blog_cnn_case_selects_the_v0_oracle(tmp_path: Path) -> None:
    path = _v0_file(tmp_path)

    def accepted(oracle: str) -> int:  # validate_vllm_blog's CNN case, its `oracle` swapped
        cfg = compose(["+exp=validate_vllm_blog", f"oracle={oracle}", "oracle.spans.eagle=null",
                       "oracle.spans.pld.stands_in_for=[llama3-70b]", "num_requests=1", "system=static_sd",
                       "system.k=4", "system.proposer=pld",
                       f"workload.datasets=[{{name: spans, path: '{path}', label: sdb_t}}]"])
        return int(run_point(cfg).requests.num_accepted.sum())

    # the prefill emits token 0; from position 1 with k = 4: span 4 (3 accepted), position 5 proposes nothing,
    # position 6: span 3 (2 accepted), then the output ends: 5
    assert accepted("specdecode_ngram_v0") == 5
    # specdecode_spans replays acc_ngram (2 3 1 5 1 1 2 1 1) where the last 3 tokens occurred before (positions 2,
    # 3, 4 and 8): position 1 proposes nothing, 2: span 1, 3: span 5 → 4 accepted, 8: span 1; 4 in all
    assert accepted("specdecode_spans") == 4


def _v0_stats() -> dict[str, object]:
    cfg = compose(["oracle=specdecode_ngram_v0"])
    return dict(cfg.oracle.spans.pld)


def test_v0_statistics_without_data_cover_every_dataset_and_are_drawn(no_data: None) -> None:
    node = _v0_stats()
    assert (node["proposal"], node["prompt_lookup_min"], node["prompt_lookup_max"]) == ("vllm_v0_ngram", 1, 4)
    labels = {f"sdb_{d}" for d in ("gsm8k", "cnn", "sharegpt", "instructcoder")}
    measured, match = dict(node["measured"]), dict(node["match"])  # type: ignore[call-overload]
    assert set(measured) == labels and set(match) == labels
    for ds in labels:
        assert len(measured[ds]) == len(match[ds]) == 7
        measured_pmf(measured[ds], ds)  # a valid curve
    n, steps, k = 400, 60, 4
    o = TokenOracle(0, np.array(["sdb_cnn"] * n, dtype=object), {})
    o.use_spans({"pld": node}, target="llama3.1-8b", output_len=np.full(n, 1000))
    assert any("drawn from measured" in note for note in o.notes)
    pos = np.zeros(n, dtype=np.int64)
    props, emits = [], []
    for _ in range(steps):
        proposed, acc, _ = o.score_chain(np.arange(n), pos, np.full(n, k), "pld")
        props.append(proposed > 0)
        emits.append(acc + 1)
        pos += acc + 1
    drafted, emitted = np.concatenate(props), np.concatenate(emits)
    p = match["sdb_cnn"][k - 1]
    assert abs(drafted.mean() - p) < 4 * np.sqrt(p * (1 - p) / drafted.size)
    e = emitted[drafted]
    assert abs(e.mean() - measured["sdb_cnn"][k - 1]) < 4 * e.std() / np.sqrt(e.size)
    assert (emitted[~drafted] == 1).all()


def _cnn_records() -> list[dict[str, object]]:
    root = data_root()
    if root is None or not (root / "specdecode_bench" / "llama31_8b_cnn.jsonl").is_file():
        pytest.skip("needs the data folder's specdecode_bench files (docs/data.md)")
    with (root / "specdecode_bench" / "llama31_8b_cnn.jsonl").open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_v0_rule_at_010s_settings_reproduces_the_recorded_spans() -> None:
    # vLLM 0.10.1's proposer, min 3 / max 7, also takes the longest n and its earliest occurrence: at its settings
    # (SpecDecode-Bench records spans of up to 21 tokens: k = 20) the v0 rule gives the recorded spans at every
    # position, except where the record's span runs past the recorded output (its end of sequence): there, the tokens
    # left. This checks the positions' convention (a span at i: the context is prompt + generated[:i]).
    for rec in _cnn_records()[:100]:
        prompt, out = rec["prompt_token_ids"], rec["generated_token_ids"]
        spans, proposes = ngram_v0_spans(prompt, out, 3, 7, 20)  # type: ignore[arg-type]
        recorded = np.asarray(rec["acc_ngram"]["acc_len"])  # type: ignore[index]
        left = len(out) - np.arange(recorded.size)  # type: ignore[arg-type]
        assert (spans[:recorded.size] == np.minimum(recorded, left)).all()
        assert (proposes == lookup_matches(prompt, out, 3)).all()  # type: ignore[arg-type]


def test_committed_v0_statistics_are_the_datas() -> None:
    root = data_root()
    if root is None or not (root / "specdecode_bench").is_dir():
        pytest.skip("needs the data folder's specdecode_bench files (docs/data.md)")
    spec = importlib.util.spec_from_file_location("make_specdecode_spans",
                                                  Path(__file__).resolve().parents[1] / "scripts" /
                                                  "make_specdecode_spans.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    node = _v0_stats()
    for ds in script.DATASETS:
        path = str(root / "specdecode_bench" / f"llama31_8b_{ds}.jsonl")
        f = read_span_file(path, None, None, None, script.NGRAM_V0)
        lengths, fractions, _ = script.curve(f.spans, f.proposes, read_span_file(path, None).output_len, 7)
        assert lengths == list(node["measured"][f"sdb_{ds}"]), ds  # type: ignore[index]
        assert fractions == list(node["match"][f"sdb_{ds}"]), ds  # type: ignore[index]
