"""Replay a workload against a live OpenAI-compatible completions endpoint (vLLM, SGLang, TGI, or
:mod:`repro.backends.openai_server`), streaming, and measure it the way vLLM's serving benchmark does.

Each request is sent at its arrival time from its own thread (``http.client``; the SSE body is read line by line),
with the body vLLM's ``benchmarks/backend_request_func.py::async_request_openai_completions`` sends (``temperature``
0, ``ignore_eos``, ``stream`` with ``include_usage``) and timed the same way: ``st`` is taken just before sending;
the first ``data:`` chunk with non-empty ``choices[0].text`` sets ``ttft = now - st``, each later one appends
``now - previous`` to the inter-token latencies; ``latency`` is taken when the stream ends (``[DONE]``);
``output_tokens`` is the ``usage.completion_tokens`` if sent, else the number of text chunks. (These are vLLM 0.5-0.6's
rules; later versions also count a chunk with empty text and stop the latency clock at the last token instead of
``[DONE]``: on a server that sends one non-empty chunk per token, as vLLM and ours do, they differ only by the usage
chunk's delivery.) Failures are recorded per request, never raised. :func:`vllm_metrics` then follows
``benchmarks/benchmark_serving.py::calculate_metrics``.

All times are seconds on one clock whose zero is the replay start (as the simulator's are). Needs numpy and pandas
only: no PyTorch.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

COLUMNS = ["rid", "arrival_s", "sent_at", "first_token_at", "finish_at", "prompt_len", "output_len", "ttft_s",
           "latency_s", "success", "error"]


@dataclass
class ReplayResult:
    """A replay: ``requests`` (one row per request, :data:`COLUMNS`; ``arrival_s`` is the scheduled time,
    ``output_len`` the tokens received), ``itl_s`` (per request, in ``rid`` order, its inter-token gaps) and
    ``duration_s`` (replay start to the last finish)."""

    requests: pd.DataFrame
    itl_s: list[np.ndarray] = field(default_factory=list)
    duration_s: float = 0.0


@dataclass
class _Record:
    sent_at: float = float("nan")
    first_token_at: float = float("nan")
    finish_at: float = float("nan")
    output_len: int = 0
    success: bool = False
    error: str = ""
    itl: list[float] = field(default_factory=list)


def _auth() -> dict[str, str]:
    """The bearer token vLLM's benchmark client sends, from ``$OPENAI_API_KEY`` (none without it)."""
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _connection(parts: Any, timeout_s: float) -> http.client.HTTPConnection:
    """An HTTP(S) connection to a split URL's host."""
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.netloc, timeout=timeout_s)


def _send(url: str, body: dict[str, Any], timeout_s: float, t0: float, rec: _Record) -> None:
    """One streaming request, timed as vLLM's ``async_request_openai_completions``; fills ``rec``, never raises."""
    parts = urlsplit(url)
    headers = {"Content-Type": "application/json", **_auth()}
    payload = json.dumps(body).encode()
    st = time.perf_counter()
    rec.sent_at = st - t0
    last, chunks, usage_tokens = st, 0, None
    conn = None
    try:
        conn = _connection(parts, timeout_s)
        conn.request("POST", parts.path, body=payload, headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            detail = resp.read(2000).decode("utf-8", "replace").strip()
            rec.error = f"HTTP {resp.status} {resp.reason}: {detail}"
            return
        while line := resp.readline():
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, SSE comments and other fields
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            obj = json.loads(data)
            now = time.perf_counter()
            if "error" in obj:
                rec.error = f"stream error: {obj['error']}"
                return
            choices = obj.get("choices")
            if choices and choices[0].get("text"):
                if chunks == 0:
                    rec.first_token_at = now - t0
                else:
                    rec.itl.append(now - last)
                last, chunks = now, chunks + 1
            if (obj.get("usage") or {}).get("completion_tokens") is not None:
                usage_tokens = int(obj["usage"]["completion_tokens"])
        rec.output_len = usage_tokens if usage_tokens is not None else chunks
        if chunks:
            rec.success = True
        else:
            rec.error = "Never received a valid chunk to calculate TTFT."
    except Exception as exc:  # connection refused, timeout, a malformed chunk: a failed request, not a failed run
        rec.error = f"{type(exc).__name__}: {exc}"
    finally:
        rec.finish_at = time.perf_counter() - t0
        if not rec.success:
            rec.output_len = chunks
        if conn is not None:
            conn.close()


def random_prompts(prompt_len: Sequence[int] | np.ndarray, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Deterministic random token-id prompts, ``prompt_len[i]`` ids in ``[0, vocab_size)`` each."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=int(n)).tolist() for n in prompt_len]


def replay(arrival_s: Sequence[float] | np.ndarray, prompt_len: Sequence[int] | np.ndarray,
           output_len: Sequence[int] | np.ndarray, *, base_url: str, model: str,
           prompts: Sequence[str | list[int]] | None = None, vocab_size: int | None = None, seed: int = 0,
           timeout_s: float = 600.0, max_concurrency: int | None = None,
           progress: Callable[[int, int], None] | None = None,
           sampling: dict[str, Any] | None = None, ignore_eos: bool = True) -> ReplayResult:
    """Send request ``i`` (``prompts[i]``, or ``prompt_len[i]`` random token ids, asking for exactly
    ``output_len[i]`` tokens) to ``{base_url}/completions`` (``base_url``: the OpenAI base, ``http://host:port/v1``)
    at ``arrival_s[i]`` seconds after the start, streaming.

    ``max_concurrency`` caps the requests in flight (vLLM's ``--max-concurrency``: a request that arrives while the
    cap is reached waits, in arrival order, and its ``sent_at`` is when it is sent). ``timeout_s``: the socket
    timeout of each request. ``progress(done, total)`` is called after each request finishes. ``sampling``: the
    body's sampling fields (default ``{"temperature": 0.0}``, greedy, as vLLM's benchmark sends; e.g.
    ``{"temperature": 0.7, "top_p": 0.95, "seed": 0}``). ``ignore_eos``: send vLLM's ``ignore_eos`` (every request
    runs to ``max_tokens``); off for a server that refuses the field (``transformers serve``), where a request may
    stop at its end-of-sequence token."""
    arrival = np.asarray(arrival_s, dtype=float)
    plen = np.asarray(prompt_len, dtype=int)
    olen = np.asarray(output_len, dtype=int)
    n = len(arrival)
    if len(plen) != n or len(olen) != n:
        raise ValueError(f"arrival_s, prompt_len and output_len differ in length: {n}, {len(plen)}, {len(olen)}")
    if prompts is None:
        if vocab_size is None:
            raise ValueError("replay: pass prompts, or vocab_size to build random token-id prompts of prompt_len "
                             "tokens (the served model's vocabulary size)")
        prompts = random_prompts(plen, vocab_size, seed)
    elif len(prompts) != n:
        raise ValueError(f"prompts has {len(prompts)} entries for {n} requests")
    url = base_url.rstrip("/") + "/completions"
    fields = dict(sampling) if sampling is not None else {"temperature": 0.0}
    records = [_Record() for _ in range(n)]
    slots = threading.BoundedSemaphore(max_concurrency) if max_concurrency else None
    lock, done = threading.Lock(), [0]

    def run(i: int) -> None:
        prompt = prompts[i] if isinstance(prompts[i], str) else [int(t) for t in prompts[i]]
        body = {"model": model, "prompt": prompt, "max_tokens": int(olen[i]),
                **({"ignore_eos": True} if ignore_eos else {}),
                "stream": True, "stream_options": {"include_usage": True}, **fields}
        try:
            _send(url, body, timeout_s, t0, records[i])
        finally:
            if slots is not None:
                slots.release()
            with lock:
                done[0] += 1
                if progress is not None:
                    progress(done[0], n)

    threads = []
    t0 = time.perf_counter()
    for i in np.argsort(arrival, kind="stable"):
        delay = t0 + arrival[i] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if slots is not None:
            slots.acquire()  # FIFO: later arrivals queue behind this one
        th = threading.Thread(target=run, args=(int(i),), name=f"replay-{i}", daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    frame = pd.DataFrame({
        "rid": np.arange(n), "arrival_s": arrival,
        "sent_at": [r.sent_at for r in records], "first_token_at": [r.first_token_at for r in records],
        "finish_at": [r.finish_at for r in records], "prompt_len": plen,
        "output_len": [r.output_len for r in records],
        "success": [r.success for r in records], "error": [r.error for r in records],
    })
    frame["ttft_s"] = frame["first_token_at"] - frame["sent_at"]
    frame["latency_s"] = frame["finish_at"] - frame["sent_at"]
    frame.loc[~frame["success"], ["ttft_s", "latency_s"]] = np.nan
    duration = float(np.nanmax(frame["finish_at"])) if n else 0.0
    return ReplayResult(frame[COLUMNS], [np.asarray(r.itl, dtype=float) for r in records], duration)


def vllm_metrics(result: ReplayResult, percentiles: Sequence[float] = (90, 99)) -> dict[str, float]:
    """vLLM's serving-benchmark metrics of a replay, as ``benchmarks/benchmark_serving.py::calculate_metrics`` defines
    them, over the successful requests, named as in its JSON (``vllm bench serve``): ``completed``,
    ``total_input_tokens``, ``total_output_tokens``, ``duration`` and the throughputs (``request_throughput``,
    ``output_throughput``, ``total_token_throughput``: per second of ``duration_s``), then for ttft, tpot, itl and
    e2el ``mean_X_ms``, ``median_X_ms``, ``std_X_ms`` and ``pP_X_ms`` for each of ``percentiles`` (by default 90 and
    99: the median has its own name). A request's tpot is
    ``(latency - ttft) / (output_tokens - 1)``, only for requests with more than one output token; itl pools every
    request's gaps; e2el is the latency. An empty sample gives 0, as vLLM's ``np.mean(x or 0)`` does."""
    df = result.requests
    ok = df["success"].to_numpy(dtype=bool)
    good = df[ok]
    out_tokens = good["output_len"].to_numpy(dtype=float)
    ttft = good["ttft_s"].to_numpy(dtype=float)
    e2el = good["latency_s"].to_numpy(dtype=float)
    multi = out_tokens > 1
    tpot = (e2el[multi] - ttft[multi]) / (out_tokens[multi] - 1)
    gaps = [g for g, s in zip(result.itl_s, ok, strict=True) if s]
    itl = np.concatenate(gaps) if gaps else np.zeros(0)
    dur = result.duration_s
    completed, total_in, total_out = int(ok.sum()), int(good["prompt_len"].sum()), int(out_tokens.sum())
    metrics: dict[str, float] = {
        "duration": dur, "completed": completed, "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": completed / dur if dur > 0 else float("nan"),
        "output_throughput": total_out / dur if dur > 0 else float("nan"),
        "total_token_throughput": (total_in + total_out) / dur if dur > 0 else float("nan"),
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        x = xs if len(xs) else np.zeros(1)
        metrics[f"mean_{name}_ms"] = float(np.mean(x)) * 1000
        metrics[f"median_{name}_ms"] = float(np.median(x)) * 1000
        metrics[f"std_{name}_ms"] = float(np.std(x)) * 1000
        for p in percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            metrics[f"p{word}_{name}_ms"] = float(np.percentile(x, p)) * 1000
    return metrics


def _get(url: str, timeout_s: float) -> tuple[int, str]:
    """``GET url``: (status, body text); raises OSError (refused, unreachable, timed out) and http.client errors."""
    parts = urlsplit(url)
    conn = _connection(parts, timeout_s)
    try:
        conn.request("GET", parts.path or "/", headers=_auth())
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def check_server(base_url: str, model: str, timeout_s: float = 10.0) -> list[str]:
    """Before a replay: the server at ``base_url`` answers ``GET /models`` and serves ``model``. Returns the served
    names; raises :class:`~repro.core.errors.ReproError` naming the cause (nothing listening, not an OpenAI server,
    another model), so that a run against a dead server or with a wrong name stops at once instead of recording
    every request as failed."""
    from repro.core.errors import ReproError

    url = base_url.rstrip("/") + "/models"
    try:
        status, text = _get(url, timeout_s)
    except (OSError, http.client.HTTPException) as exc:
        raise ReproError(f"backend=openai: cannot reach {url} ({type(exc).__name__}: {exc}); is the server running "
                         "at backend.url?") from None
    if status != 200:
        raise ReproError(f"backend=openai: GET {url} answered HTTP {status}: {text.strip()[:300]} (backend.url is "
                         "the OpenAI base URL, e.g. http://127.0.0.1:8000/v1)")
    try:
        names = [str(card["id"]) for card in json.loads(text)["data"]]
    except (ValueError, KeyError, TypeError):
        raise ReproError(f"backend=openai: GET {url} did not list models as an OpenAI server does: "
                         f"{text.strip()[:300]}") from None
    if model not in names:
        raise ReproError(f"backend=openai: the server at {base_url} serves {', '.join(map(repr, names)) or 'no model'}"
                         f", not {model!r}: set backend.model to the served name (vllm serve --served-model-name)")
    return names


#: vLLM's speculative-decoding counters (Prometheus, ``GET /metrics``): V1 engine (0.8 on) names, and V0's
SPEC_COUNTERS = {
    "drafts": ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts"),
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens"),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens"),
    "emitted_tokens": ("vllm:spec_decode_num_emitted_tokens_total", "vllm:spec_decode_num_emitted_tokens"),
}
PER_POSITION = ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_num_accepted_tokens_per_pos")


def parse_prometheus(text: str) -> dict[str, float]:
    """The spec-decode counters of a Prometheus text exposition, summed over their labels (a server with several
    engines or models reports one sample each): the keys of :data:`SPEC_COUNTERS`, and ``pos{i}`` for the accepted
    tokens at draft position ``i``. Counters a server does not expose are absent."""
    import re

    out: dict[str, float] = {}
    names = {n: key for key, ns in SPEC_COUNTERS.items() for n in ns}
    sample = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
    for line in text.splitlines():
        m = sample.match(line.strip())
        if not m or line.lstrip().startswith("#"):
            continue
        name, labels, raw = m.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        if name in names:
            out[names[name]] = out.get(names[name], 0.0) + value
        elif name in PER_POSITION:
            pos = re.search(r'position="(\d+)"', labels or "")
            if pos:
                key = f"pos{int(pos.group(1))}"
                out[key] = out.get(key, 0.0) + value
    return out


def scrape(base_url: str, timeout_s: float = 10.0) -> dict[str, float] | None:
    """The server's spec-decode counters now (``GET /metrics`` beside the OpenAI base: ``http://host:port/metrics``),
    or None where it exposes no /metrics."""
    parts = urlsplit(base_url)
    try:
        status, text = _get(f"{parts.scheme}://{parts.netloc}/metrics", timeout_s)
    except (OSError, http.client.HTTPException):
        return None
    return parse_prometheus(text) if status == 200 else None


def spec_metrics(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """Speculation over a replay, from the counters before and after it, as vLLM reports it (its
    ``SpecDecodingLogging``): ``spec_drafts``, ``spec_draft_tokens``, ``spec_accepted_tokens``, the
    ``acceptance_rate`` (accepted / drafted tokens), the ``mean_accepted_len`` (1 + accepted / drafts: the tokens a
    step emits, its bonus token included) and ``accept_rate_pos{i}`` (accepted at draft position ``i`` / drafts).
    Empty where the server exposes no counters or drafted nothing (no speculation)."""
    if not before and not after:
        return {}
    before, after = before or {}, after or {}
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafted, accepted = d.get("draft_tokens", 0.0), d.get("accepted_tokens", 0.0)
    if drafted <= 0:
        return {}
    out = {"spec_draft_tokens": drafted, "spec_accepted_tokens": accepted, "acceptance_rate": accepted / drafted}
    drafts = d.get("drafts", 0.0)
    if drafts > 0:
        out["spec_drafts"] = drafts
        out["mean_accepted_len"] = 1.0 + accepted / drafts
        positions = sorted(int(k[3:]) for k in d if k.startswith("pos"))
        out.update({f"accept_rate_pos{i}": d[f"pos{i}"] / drafts for i in positions})
    return out


def detailed(result: ReplayResult) -> dict[str, list[Any]]:
    """Per request, as ``vllm bench serve --save-detailed`` adds them to its JSON: ``input_lens``, ``output_lens``,
    ``ttfts``, ``itls`` and ``errors`` (in seconds, in request order), plus this replay's ``arrival_s`` and
    ``sent_at``."""
    r = result.requests

    def floats(col: str) -> list[float | None]:
        return [None if pd.isna(v) else float(v) for v in r[col]]

    return {"input_lens": [int(v) for v in r["prompt_len"]], "output_lens": [int(v) for v in r["output_len"]],
            "ttfts": floats("ttft_s"), "itls": [[float(g) for g in gaps] for gaps in result.itl_s],
            "errors": [str(e) for e in r["error"]], "arrival_s": floats("arrival_s"), "sent_at": floats("sent_at")}
