"""``backend=openai`` end to end: the replay client against a real OpenAI-compatible server (the minimal one in
:mod:`repro.backends.openai_server`, over a tiny random-weight model, started on a free local port), and vLLM's
serving-benchmark metrics on a hand-built replay. Skipped without the ``real`` extra (PyTorch + transformers)."""

from __future__ import annotations

import json
import math
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch", reason="backend=openai's tests serve a real model: pip install torch==2.13.0 (CPU)")
pytest.importorskip("transformers", reason="backend=openai's tests serve a real model: pip install -e '.[real]'")

from repro.backends.models import build_model
from repro.backends.openai import COLUMNS, ReplayResult, replay, vllm_metrics
from repro.backends.openai_server import Server, encode, serve

VOCAB = 512  # the tiny model's
TOL = 1e-3  # seconds: ordering slack between the client's timestamps


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = serve(build_model("llama-68m", tiny=True, seed=0), port=0, num_threads=1)  # see serve's docstring
    try:
        yield srv
    finally:
        srv.shutdown()


def _post(srv: Server, body: dict[str, Any]) -> tuple[int, Any]:
    """A plain (non-replay) request to ``/completions``: ``(status, body)``; a stream's body is its list of chunks."""
    req = urllib.request.Request(srv.url + "/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    if not body.get("stream"):
        return status, json.loads(raw)
    events = [line.removeprefix("data: ") for line in raw.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return status, [json.loads(e) for e in events[:-1]]


def test_streaming_replay(server: Server) -> None:
    n = 6
    arrival = 0.05 * np.arange(n)
    plen = np.array([8, 11, 14, 17, 20, 9])
    olen = np.array([4, 6, 8, 10, 12, 5])
    calls: list[tuple[int, int]] = []
    res = replay(arrival, plen, olen, base_url=server.url, model=server.model_name, vocab_size=VOCAB, seed=1,
                 progress=lambda done, total: calls.append((done, total)))
    df = res.requests
    assert list(df.columns) == COLUMNS and list(df["rid"]) == list(range(n))
    assert df["success"].all() and (df["error"] == "").all()
    assert list(df["output_len"]) == list(olen) and list(df["prompt_len"]) == list(plen)
    assert (df["sent_at"] >= df["arrival_s"] - TOL).all()
    assert (df["first_token_at"] >= df["sent_at"]).all() and (df["finish_at"] >= df["first_token_at"]).all()
    assert np.allclose(df["ttft_s"], df["first_token_at"] - df["sent_at"])
    assert np.allclose(df["latency_s"], df["finish_at"] - df["sent_at"])
    assert math.isclose(res.duration_s, df["finish_at"].max())
    for i in range(n):
        gaps = res.itl_s[i]
        assert len(gaps) == olen[i] - 1 and (gaps >= 0).all()
        assert gaps.sum() <= df["latency_s"][i] - df["ttft_s"][i] + TOL  # the stream ends after the last token
    assert calls[-1] == (n, n) and len(calls) == n

    m = vllm_metrics(res)
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p90", "p99"):
            assert math.isfinite(m[f"{stat}_{name}_ms"]) and m[f"{stat}_{name}_ms"] >= 0
    assert m["completed"] == n and m["total_input_tokens"] == plen.sum() and m["total_output_tokens"] == olen.sum()
    assert not any(k.startswith("p50_") for k in m)  # the median is median_*: one name per metric
    assert math.isclose(m["request_throughput"], n / res.duration_s)
    tpot = (df["latency_s"] - df["ttft_s"]) / (df["output_len"] - 1)
    assert math.isclose(m["mean_tpot_ms"], 1000 * tpot.mean()) and math.isclose(m["median_tpot_ms"],
                                                                                 1000 * tpot.median())
    assert math.isclose(m["mean_itl_ms"], 1000 * np.concatenate(res.itl_s).mean())
    assert math.isclose(m["mean_e2el_ms"], 1000 * df["latency_s"].mean())


def test_greedy_determinism_and_usage(server: Server) -> None:
    prompt = [5, 17, 300, 42, 7, 511]
    body = {"model": server.model_name, "prompt": prompt, "max_tokens": 7, "temperature": 0}
    (s1, a), (s2, b) = _post(server, body), _post(server, body)
    assert s1 == s2 == 200
    assert a["choices"][0]["text"] == b["choices"][0]["text"] and a["choices"][0]["finish_reason"] == "length"
    assert len(a["choices"][0]["text"].split()) == 7
    assert a["usage"] == {"prompt_tokens": 6, "completion_tokens": 7, "total_tokens": 13}
    # the stream carries the same tokens, one per chunk, then the usage
    status, chunks = _post(server, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and len(chunks) == 8
    assert "".join(c["choices"][0]["text"] for c in chunks[:7]) == a["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:7]] == [None] * 6 + ["length"]
    assert chunks[7]["choices"] == [] and chunks[7]["usage"] == a["usage"]
    # seeded sampling is reproducible too
    hot = {**body, "temperature": 1.0, "seed": 7}
    assert _post(server, hot)[1]["choices"][0]["text"] == _post(server, hot)[1]["choices"][0]["text"]


def test_string_prompts(server: Server) -> None:
    prompts = ["Hello, world!", "speculative decoding ✓"]
    status, out = _post(server, {"prompt": prompts[1], "max_tokens": 2, "temperature": 0})
    assert status == 200 and out["usage"]["prompt_tokens"] == len(encode(prompts[1], VOCAB)) == 24
    res = replay([0.0, 0.01], [13, 24], [3, 4], base_url=server.url, model=server.model_name, prompts=prompts)
    assert res.requests["success"].all() and list(res.requests["output_len"]) == [3, 4]


def test_server_endpoints_and_errors(server: Server) -> None:
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=10) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(server.url + "/models", timeout=10) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == server.model_name
    assert _post(server, {"model": "nope", "prompt": [1], "max_tokens": 2})[0] == 404
    assert _post(server, {"prompt": [VOCAB], "max_tokens": 2})[0] == 400
    assert _post(server, {"prompt": [1], "max_tokens": 4096})[0] == 400
    # an HTTP error is a failed request in the replay, not an exception
    res = replay([0.0], [2], [2], base_url=server.url, model="nope", prompts=[[1, 2]])
    assert not res.requests["success"][0] and "HTTP 404" in res.requests["error"][0]


def test_failure_is_recorded_not_raised() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = replay([0.0, 0.0], [3, 3], [2, 2], base_url=f"http://127.0.0.1:{port}/v1", model="tiny",
                 vocab_size=VOCAB, timeout_s=5)
    df = res.requests
    assert not df["success"].any() and df["error"].str.len().gt(0).all()
    assert (df["output_len"] == 0).all() and df["ttft_s"].isna().all() and df["latency_s"].isna().all()
    assert (df["finish_at"] >= df["sent_at"]).all()
    m = vllm_metrics(res)
    assert m["completed"] == 0 and m["total_output_tokens"] == 0 and m["mean_ttft_ms"] == 0
    with pytest.raises(ValueError, match="vocab_size"):
        replay([0.0], [3], [2], base_url="http://127.0.0.1:1/v1", model="tiny")


def test_max_concurrency_serialises(server: Server) -> None:
    n = 4
    res = replay(np.zeros(n), np.full(n, 8), np.full(n, 5), base_url=server.url, model=server.model_name,
                 vocab_size=VOCAB, max_concurrency=1)
    df = res.requests
    assert df["success"].all()
    for i in range(1, n):  # all arrive at once; each is sent only after the previous one finished
        assert df["sent_at"][i] >= df["finish_at"][i - 1] - TOL


def test_vllm_metrics_by_hand() -> None:
    nan = float("nan")
    frame = pd.DataFrame({
        "rid": [0, 1, 2], "arrival_s": [0.0, 0.1, 0.2], "sent_at": [0.0, 0.1, 0.2],
        "first_token_at": [0.1, 0.3, nan], "finish_at": [0.5, 0.3, 0.4], "prompt_len": [10, 20, 30],
        "output_len": [3, 1, 0], "ttft_s": [0.1, 0.2, nan], "latency_s": [0.5, 0.2, nan],
        "success": [True, True, False], "error": ["", "", "boom"],
    })[COLUMNS]
    res = ReplayResult(frame, [np.array([0.2, 0.2]), np.zeros(0), np.array([9.0])], duration_s=2.0)
    m = vllm_metrics(res, percentiles=(50, 90, 99.9))
    expect = {
        "duration": 2.0, "completed": 2, "total_input_tokens": 30, "total_output_tokens": 4, "request_throughput": 1.0,
        "output_throughput": 2.0, "total_token_throughput": 17.0,
        # ttft over [0.1, 0.2]; tpot only for the 3-token request: (0.5 - 0.1) / 2; itl pools [0.2, 0.2] (the
        # failed request's gaps are left out); e2el over [0.5, 0.2]
        "mean_ttft_ms": 150.0, "median_ttft_ms": 150.0, "std_ttft_ms": 50.0, "p50_ttft_ms": 150.0,
        "p90_ttft_ms": 190.0, "p99.9_ttft_ms": 199.9,
        "mean_tpot_ms": 200.0, "median_tpot_ms": 200.0, "std_tpot_ms": 0.0, "p90_tpot_ms": 200.0,
        "mean_itl_ms": 200.0, "std_itl_ms": 0.0, "p99.9_itl_ms": 200.0,
        "mean_e2el_ms": 350.0, "median_e2el_ms": 350.0, "std_e2el_ms": 150.0, "p90_e2el_ms": 470.0,
    }
    for key, value in expect.items():
        assert m[key] == pytest.approx(value), key
    assert len(m) == 7 + 4 * 6


def test_a_speculating_server_streams_the_targets_greedy_tokens_and_counts_as_vllm(server: Server) -> None:
    """The stand-in with a draft model speculates greedily: its output is the target's own greedy output, a step's
    tokens come as one chunk, and /metrics counts drafts and accepted tokens as vLLM's V1 engine names them. A draft
    equal to the target is always accepted; one with other random weights almost never."""
    from repro.backends.openai import parse_prometheus, scrape, spec_metrics

    prompt, k, out = [5, 17, 300, 42, 7, 511], 3, 13
    body = {"prompt": prompt, "max_tokens": out, "temperature": 0}
    plain = _post(server, body)[1]["choices"][0]["text"]
    target = build_model("llama-68m", tiny=True, seed=0)
    for draft_seed, expect in ((0, 1.0), (5, 0.0)):
        with serve(target, draft=build_model("llama-68m", tiny=True, seed=draft_seed), num_spec_tokens=k,
                   num_threads=1) as spec:
            before = scrape(spec.url)
            assert before is not None and before["drafts"] == 0
            status, chunks = _post(spec, {**body, "stream": True})
            assert status == 200 and "".join(c["choices"][0]["text"] for c in chunks) == plain
            after = scrape(spec.url)
            m = spec_metrics(before, after)
            assert m["acceptance_rate"] == pytest.approx(expect, abs=0.2)
            # the first token comes from the prefill; each speculative step then drafts min(k, left - 1) tokens
            assert m["spec_draft_tokens"] == after["draft_tokens"] and after["draft_tokens"] <= k * after["drafts"]
            assert m["mean_accepted_len"] == pytest.approx(1 + after["accepted_tokens"] / after["drafts"])
            # one chunk per engine step: the prefill's token, each step's accepted drafts and next token, and a last
            # plain step where one token was left
            assert len(chunks) == out - after["accepted_tokens"]
            if expect == 1.0:  # every draft accepted: steps of k + 1 tokens, position i accepted in every draft
                assert after["accepted_tokens"] == after["draft_tokens"] == out - 1 - after["drafts"]
                assert all(after.get(f"pos{i}", 0) <= after["drafts"] for i in range(k))
                assert after["pos0"] == after["drafts"]
    text = ('# TYPE vllm:spec_decode_num_drafts_total counter\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="a"} 4.0\n'
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="a"} 6.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="a"} 30.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="a"} 12.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="a",position="1"} 3.0\n'
            'vllm:num_requests_running{engine="0"} 2.0\n')
    parsed = parse_prometheus(text)
    assert parsed == {"drafts": 10.0, "draft_tokens": 30.0, "accepted_tokens": 12.0, "pos1": 3.0}
    assert spec_metrics(None, parsed) == {"spec_draft_tokens": 30.0, "spec_accepted_tokens": 12.0,
                                          "acceptance_rate": 0.4, "spec_drafts": 10.0, "mean_accepted_len": 2.2,
                                          "accept_rate_pos1": 0.3}
    assert spec_metrics(None, None) == {} and spec_metrics(parsed, parsed) == {}  # no speculation in between
