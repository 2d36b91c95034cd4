"""A minimal OpenAI-compatible completions server over a transformers causal LM, for tests and demos.

Why it exists: ``backend=openai`` (:mod:`repro.backends.openai`) replays a workload against any OpenAI-compatible
``/v1/completions`` endpoint, and its tests need a real server on a CPU-only machine. vLLM's CPU build is not
installable from PyPI here: the ``vllm-0.33.0`` wheel on PyPI is a 336 MB CUDA build that pulls CUDA torch and the
``nvidia-*`` libraries, and a CPU build has to be compiled from source. So this module serves a model from
:func:`repro.backends.models.build_model` (typically tiny, random weights) with the same wire protocol.

Endpoints: ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``, ``GET /metrics``. Request fields honoured:
``model`` (must be the served name when given), ``prompt`` (a string or a list of token ids), ``max_tokens`` (default
16), ``stream``, ``stream_options.include_usage``, ``temperature`` (0: greedy; > 0: sampled with a ``torch.Generator``
seeded by ``seed``; default 1, as in OpenAI's API), ``ignore_eos`` (accepted; generation never stops at an EOS, it
always runs to ``max_tokens``: random models have no meaningful EOS); other fields are ignored. Random models have no
tokenizer, so a string prompt is mapped byte-wise, ``id = byte % vocab_size`` over its UTF-8 bytes, and token ``id``
is detokenized as ``f" t{id}"``. A stream sends one ``data:`` chunk per token (the last one carries ``finish_reason:
"length"``, as vLLM does), then with ``include_usage`` a chunk with empty ``choices`` and the ``usage``, then ``data:
[DONE]``.

With a draft model (``serve(..., draft=..., num_spec_tokens=k)``, ``--draft NAME --num-spec-tokens k``) it
speculates as vLLM does with a draft model, greedily: each decode step of a greedy request drafts up to ``k`` tokens
with the draft (its own KV cache), verifies them with one target pass over ``k + 1`` positions, keeps the longest
prefix that matches the target's own greedy tokens plus the target's next token, and streams that step's tokens as one
chunk (vLLM sends a step's tokens together). Its output is the target's greedy output, token for token. A request
with ``temperature`` > 0 decodes without speculation. ``GET /metrics`` exposes vLLM's V1 spec-decode counters
(``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``,
``..._num_accepted_tokens_per_pos_total{position=...}``) in Prometheus' text format, plus
``vllm:num_requests_running``.

The engine batches at iteration level like a real server (one thread owns the model; each iteration admits waiting
requests, prefilling each, then decodes one token for every running request), but runs each request's forward on
its own KV cache: it is for tests and demos, not a performance reference.
"""

from __future__ import annotations

import argparse
import inspect
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from repro.backends.models import build_model, require_torch

_Token = list[int] | BaseException | None  # a step's token ids, an engine error, or None: the request is finished


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    max_tokens: int
    temperature: float
    generator: Any  # a torch.Generator (temperature > 0) or None
    out: queue.Queue[_Token] = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    cache: Any = None
    last: int = 0
    done: int = 0
    seq: list[int] = field(default_factory=list)  # prompt and output so far (speculation: what the draft catches up)
    dcache: Any = None  # the draft's KV cache
    dlen: int = 0  # tokens of seq in the draft's cache


class _Engine:
    """Owns the model in one thread; handler threads :meth:`submit` requests and read tokens from ``request.out``."""

    def __init__(self, model: Any, max_num_seqs: int = 64, num_threads: int | None = None, draft: Any = None,
                 num_spec_tokens: int = 0) -> None:
        self.torch, self.tf = require_torch()
        self.model, self.max_num_seqs = model, max_num_seqs
        self.draft, self.k = draft, (num_spec_tokens if draft is not None else 0)
        if draft is not None and num_spec_tokens < 1:
            raise ValueError("a draft model needs num_spec_tokens >= 1")
        # vLLM's V1 spec-decode counters (read by GET /metrics)
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
        self.per_pos = [0] * self.k
        self.running = 0
        self.prev_threads = self.torch.get_num_threads()
        if num_threads:
            self.torch.set_num_threads(num_threads)
        self.device = next(model.parameters()).device
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.waiting: queue.Queue[_Request] = queue.Queue()
        self.stopped, self.lock = threading.Event(), threading.Lock()  # the lock: no request slips past a stop
        self.thread = threading.Thread(target=self._loop, name="openai-engine", daemon=True)

    def submit(self, req: _Request) -> None:
        with self.lock:
            if self.stopped.is_set():
                raise RuntimeError("the server is shutting down")
            self.waiting.put(req)

    def _loop(self) -> None:
        running: list[_Request] = []
        with self.torch.inference_mode():
            while not self.stopped.is_set():
                new: list[_Request] = []
                while len(running) + len(new) < self.max_num_seqs:
                    try:  # block (briefly, to notice a stop) only when there is nothing to run
                        idle = not (running or new)
                        new.append(self.waiting.get(timeout=0.05) if idle else self.waiting.get_nowait())
                    except queue.Empty:
                        break
                for req in new:  # prefill: the whole prompt into a fresh cache, sampling the first token
                    req.cache = self.tf.DynamicCache(config=self.model.config)
                    req.seq = list(req.prompt)
                    self._forward(req, req.prompt)
                for req in running:  # decode: one token (or a verified draft) for each request that was running
                    if self.k and req.temperature <= 0 and req.max_tokens - req.done > 1:
                        self._speculate(req)
                    else:
                        self._forward(req, [req.last])
                running = [r for r in running + new if r.done < r.max_tokens and not r.cancelled.is_set()]
                self.running = len(running)
        with self.lock:
            while not self.waiting.empty():
                running.append(self.waiting.get_nowait())
        for req in running:
            req.out.put(RuntimeError("the server is shutting down"))

    def _forward(self, req: _Request, ids: list[int]) -> None:
        if req.cancelled.is_set():
            return
        torch = self.torch
        try:
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            logits = self.model(input_ids=x, use_cache=True, logits_to_keep=1, **{self.cache_kw: req.cache}).logits
            logits = logits[0, -1].float()
            if req.temperature <= 0:
                tok = int(logits.argmax())
            else:
                probs = torch.softmax(logits / req.temperature, dim=-1)
                tok = int(torch.multinomial(probs, 1, generator=req.generator))
        except Exception as exc:  # reported to this request's client; the engine goes on
            req.done = req.max_tokens
            req.out.put(exc)
            return
        self._emit(req, [tok])

    def _emit(self, req: _Request, toks: list[int]) -> None:
        req.seq += toks
        req.last, req.done = toks[-1], req.done + len(toks)
        req.out.put(toks)
        if req.done >= req.max_tokens:
            req.cache = req.dcache = None
            req.out.put(None)

    def _speculate(self, req: _Request) -> None:
        """One greedy speculative step: draft up to k tokens, verify them in one target pass, emit the accepted ones
        and the target's next token (the target's greedy tokens, whatever the draft proposed)."""
        if req.cancelled.is_set():
            return
        torch = self.torch
        k = min(self.k, req.max_tokens - req.done - 1)
        try:
            if req.dcache is None:
                req.dcache, req.dlen = self.tf.DynamicCache(config=self.draft.config), 0
            drafts: list[int] = []
            feed = req.seq[req.dlen:]  # what the draft has not read yet (its last token at least)
            for _ in range(k):
                x = torch.tensor([feed], dtype=torch.long, device=self.device)
                out = self.draft(input_ids=x, use_cache=True, logits_to_keep=1, **{self.cache_kw: req.dcache})
                req.dlen += len(feed)
                drafts.append(int(out.logits[0, -1].argmax()))
                feed = drafts[-1:]
            x = torch.tensor([[req.last, *drafts]], dtype=torch.long, device=self.device)
            logits = self.model(input_ids=x, use_cache=True, logits_to_keep=k + 1, **{self.cache_kw: req.cache}).logits
            greedy = [int(t) for t in logits[0].float().argmax(dim=-1)]
            j = 0
            while j < k and drafts[j] == greedy[j]:
                j += 1
            # the target's cache keeps last and the accepted drafts; the draft's, what it read of them
            _crop(req.cache, len(req.seq) + j)
            req.dlen = min(req.dlen, len(req.seq) + j)
            _crop(req.dcache, req.dlen)
        except Exception as exc:  # reported to this request's client; the engine goes on
            req.done = req.max_tokens
            req.out.put(exc)
            return
        self.counters["drafts"] += 1
        self.counters["draft_tokens"] += k
        self.counters["accepted_tokens"] += j
        for i in range(j):
            self.per_pos[i] += 1
        self._emit(req, [*drafts[:j], greedy[j]])

    def metrics_text(self, model_name: str) -> str:
        """vLLM's V1 spec-decode counters and its running-requests gauge, in Prometheus' text format."""
        lab = f'engine="0",model_name="{model_name}"'
        lines = ["# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} {self.running}.0"]
        if self.k:
            for key, name in (("drafts", "num_drafts"), ("draft_tokens", "num_draft_tokens"),
                              ("accepted_tokens", "num_accepted_tokens")):
                lines += [f"# TYPE vllm:spec_decode_{name}_total counter",
                          f"vllm:spec_decode_{name}_total{{{lab}}} {float(self.counters[key])}"]
            lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {float(n)}'
                      for i, n in enumerate(self.per_pos)]
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.torch.set_num_threads(self.prev_threads)


def _crop(cache: Any, keep: int) -> None:
    """Cut a transformers cache back to its first ``keep`` tokens."""
    extra = int(cache.get_seq_length()) - keep
    if extra > 0:
        cache.crop(-extra)


def token_text(tok: int) -> str:
    """The detokenized text of token ``tok`` (random models have no tokenizer)."""
    return f" t{tok}"


def encode(text: str, vocab_size: int) -> list[int]:
    """A string prompt's token ids: its UTF-8 bytes modulo the vocabulary size."""
    return [b % vocab_size for b in text.encode("utf-8")]


class _BadRequest(Exception):
    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.code = code


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the listen backlog (socketserver's 5 resets connections when a burst arrives)
    engine: _Engine
    model_name: str


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests and replays issue many requests
        pass

    @property
    def app(self) -> _HTTPServer:
        return cast(_HTTPServer, self.server)

    def _json(self, code: int, obj: dict[str, Any]) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str) -> None:  # vLLM's error body
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(code, "InternalServerError")
        self._json(code, {"object": "error", "message": message, "type": kind, "param": None, "code": code})

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/metrics":
            body = self.app.engine.metrics_text(self.app.model_name).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/v1/models":
            card = {"id": self.app.model_name, "object": "model", "created": 0, "owned_by": "specrepro"}
            self._json(200, {"object": "list", "data": [card]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        if self.path != "/v1/completions":
            self._error(404, f"no route {self.path}")
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            req, stream, usage = self._parse(body)
            self.app.engine.submit(req)
        except _BadRequest as exc:
            self._error(exc.code, str(exc))
            return
        except (ValueError, TypeError) as exc:
            self._error(400, f"bad request: {exc}")
            return
        except RuntimeError as exc:
            self._error(503, str(exc))
            return
        try:
            self._respond(req, stream, usage)
        except (BrokenPipeError, ConnectionResetError):
            req.cancelled.set()  # the client went away: the engine drops the request

    def _parse(self, body: Any) -> tuple[_Request, bool, bool]:
        if not isinstance(body, dict):
            raise _BadRequest("the body must be a JSON object")
        if body.get("model") not in (None, self.app.model_name):
            raise _BadRequest(f"The model `{body['model']}` does not exist.", 404)
        config = self.app.engine.model.config
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = encode(prompt, config.vocab_size)
        elif isinstance(prompt, list) and all(isinstance(t, int) and 0 <= t < config.vocab_size for t in prompt):
            ids = list(prompt)
        else:
            raise _BadRequest(f"prompt: one string or one list of token ids in [0, {config.vocab_size})")
        max_tokens = 16 if body.get("max_tokens") is None else body["max_tokens"]
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _BadRequest("max_tokens must be a positive integer")
        if not ids or len(ids) + max_tokens > config.max_position_embeddings:
            raise _BadRequest(f"This model's maximum context length is {config.max_position_embeddings} tokens; "
                              f"the prompt has {len(ids)} tokens and max_tokens is {max_tokens}")
        temperature = float(body["temperature"]) if body.get("temperature") is not None else 1.0
        generator = None
        if temperature > 0:
            generator = self.app.engine.torch.Generator(device=self.app.engine.device)
            if body.get("seed") is not None:
                generator.manual_seed(int(body["seed"]))
            else:
                generator.seed()
        stream = bool(body.get("stream"))
        usage = stream and bool((body.get("stream_options") or {}).get("include_usage"))
        return _Request(ids, max_tokens, temperature, generator), stream, usage

    def _respond(self, req: _Request, stream: bool, include_usage: bool) -> None:
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.app.model_name}
        usage = {"prompt_tokens": len(req.prompt), "completion_tokens": req.max_tokens,
                 "total_tokens": len(req.prompt) + req.max_tokens}
        if stream:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
        texts: list[str] = []
        while (tok := req.out.get()) is not None:
            if isinstance(tok, BaseException):
                if not stream:
                    self._error(500, f"engine error: {tok!r}")
                    return
                self._sse({"error": {"object": "error", "message": f"engine error: {tok!r}", "code": 500}})
                return
            texts += [token_text(t) for t in tok]
            if stream:  # one chunk per engine step (a verified draft's tokens together, as vLLM streams them)
                reason = "length" if len(texts) >= req.max_tokens else None
                choice = {"index": 0, "text": "".join(token_text(t) for t in tok), "logprobs": None,
                          "finish_reason": reason}
                self._sse({**head, "choices": [choice]})
        if not stream:
            choice = {"index": 0, "text": "".join(texts), "logprobs": None, "finish_reason": "length"}
            self._json(200, {**head, "choices": [choice], "usage": usage})
            return
        if include_usage:
            self._sse({**head, "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _sse(self, obj: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()


class Server:
    """A running server (HTTP and engine in daemon threads); ``url`` is the OpenAI base URL (``.../v1``)."""

    def __init__(self, httpd: _HTTPServer, engine: _Engine) -> None:
        self.httpd, self.engine = httpd, engine
        host, port = httpd.server_address[:2]
        self.model_name = httpd.model_name
        self.url = f"http://{host!s}:{port}/v1"
        self.thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="openai-http",
                                       daemon=True)

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.engine.stop()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def serve(model: Any, *, host: str = "127.0.0.1", port: int = 0, model_name: str = "tiny", max_num_seqs: int = 64,
          num_threads: int | None = None, draft: Any = None, num_spec_tokens: int = 0) -> Server:
    """Serve ``model`` (a transformers causal LM) on ``host:port`` (0: a free port); returns the running server.
    With ``draft`` (a causal LM over the same vocabulary), greedy requests speculate ``num_spec_tokens`` tokens a step.

    ``num_threads``: PyTorch's intra-op threads while it runs (process-wide, restored at shutdown). A tiny model
    wants 1: several threads gain nothing on it, and on a busy machine their spin-waits slow each step a hundredfold.
    """
    engine = _Engine(model, max_num_seqs, num_threads, draft, num_spec_tokens)
    httpd = _HTTPServer((host, port), _Handler)
    httpd.engine, httpd.model_name = engine, model_name
    server = Server(httpd, engine)
    engine.thread.start()
    server.thread.start()
    return server


def hf_id(name: str) -> str:
    """The Hugging Face id of architecture ``name`` (conf/model/NAME.yaml's ``source``), else ``name``."""
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[2] / "conf" / "model" / f"{name}.yaml"
    try:
        return str(yaml.safe_load(path.read_text()).get("source") or name)
    except (OSError, AttributeError, yaml.YAMLError):
        return name


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m repro.backends.openai_server", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-68m", help="an architecture under conf/model (random weights)")
    ap.add_argument("--tiny", action="store_true", help="scale the architecture down (CPU tests)")
    ap.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    ap.add_argument("--path", default=None, help="a local checkpoint instead of random weights")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--max-num-seqs", type=int, default=64, help="the most requests running at once")
    ap.add_argument("--threads", type=int, default=None, help="PyTorch's intra-op threads (tiny models: 1)")
    ap.add_argument("--served-model-name", default=None,
                    help="the `model` clients send (default: --path, else the architecture's Hugging Face id, as "
                         "`vllm serve ID` serves it and backend=openai sends it)")
    ap.add_argument("--draft", default=None, help="a draft architecture under conf/model (random weights; --tiny "
                    "scales it too): speculate greedily with it, and count as vLLM does at /metrics")
    ap.add_argument("--draft-seed", type=int, default=1, help="the draft's random weights' seed")
    ap.add_argument("--num-spec-tokens", type=int, default=3, help="tokens drafted per step (with --draft)")
    args = ap.parse_args(argv)
    model = build_model(args.model, tiny=args.tiny, seed=args.seed, path=args.path, device=args.device,
                        dtype=args.dtype)
    draft = None if not args.draft else build_model(args.draft, tiny=args.tiny, seed=args.draft_seed,
                                                     device=args.device, dtype=args.dtype)
    server = serve(model, host=args.host, port=args.port,
                   model_name=args.served_model_name or args.path or hf_id(args.model),
                   max_num_seqs=args.max_num_seqs, num_threads=args.threads, draft=draft,
                   num_spec_tokens=args.num_spec_tokens if draft is not None else 0)
    print(server.url, flush=True)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
