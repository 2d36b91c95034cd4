"""``python -m repro.profile``: measure a model architecture's forward passes on this machine's GPU (or CPU) with
random weights, into the profile table the ``cost=profile`` cost model reads (:mod:`repro.cost.profile`).

Only the architecture is needed (``conf/model/<name>.yaml``), so any GPU can profile any model that fits, with no
download. The model is a Llama/Qwen-style decoder written directly in PyTorch: token embedding, per layer RMSNorm,
Q/K/V projections with grouped-query heads, attention (``scaled_dot_product_attention``), output projection, SwiGLU
MLP; final norm and the LM head over each sequence's last token (every token in a verification pass). Weights and
caches are random (bf16 on a GPU, fp32 on a CPU).

A pass works as a serving engine's does, not as a training loop's:

- the KV cache of a cell is allocated once, at its full length, and a pass writes only its new tokens' K and V into
  it and attends a view of it: no pass copies the cache;
- the sequences of a pass go through the linear layers as one flat batch of tokens; attention is computed per group
  of sequences of the same shape (decodes, verifications, a prefill chunk), so a mixed step is one pass;
- grouped-query heads read each K/V head once: a decode's query heads are folded onto their K/V head (as FlashInfer
  and vLLM's kernels do), a verification's ``g·(1 + k)`` queries per K/V head carry their causal mask;
- on a GPU each pass is captured as a CUDA graph and timed as its replay (``--no-cuda-graphs``: eager), so the
  numbers are the GPU's work without Python's launch gaps, as an engine that captures its passes sees them.

The grid, one row per (``num_tokens``, ``context``, ``num_seqs``) as the profile table defines them:

- ``context = 0``: a prefill pass of one sequence of ``num_tokens`` prompt tokens (causal attention);
- ``context = c > 0``: a decode pass of ``num_tokens`` sequences, each scoring one token against ``c`` cached ones;
- with ``--k``: verification passes, a row per (batch ``b`` of ``--batches``, ``k``, ``c > 0``) with ``num_seqs = b``
  sequences each scoring its last token plus ``k`` drafts (``num_tokens = b·(1 + k)``, logits at every position)
  against ``c`` cached ones. A token tree of ``k`` nodes is the same pass with another mask: profile tree sizes as
  ``k`` values;
- with ``--mixed``: steps that mix one prefill chunk of ``p`` tokens (``--chunks``) with ``d`` decodes
  (``--decodes``) at each context, into their own table (``<out>`` with ``.mixed.csv``: ``chunk_tokens,
  decode_seqs, context, latency_ms``), for checking how a cost model prices Sarathi-style steps.

A cell whose cache and activations do not fit in the device's free memory (or ``--max-memory-gib``) is skipped and
named in the sidecar; a grid's large-context corner is usually such a cell, and :mod:`repro.cost.profile` extends a
row past its last measured context along the measured attention slope. Each cell is appended to the CSV as it
finishes, so a run that dies keeps what it measured, and ``--resume`` measures only the cells the CSV lacks.

``--draft NAME`` profiles the draft model's passes too (its own CSV, ``<out>`` with ``.draft.csv``), for
``cost.draft_table``; ``--k`` and ``--mixed`` apply to the target only.

Each cell is timed as the median of ``--repeat`` passes after ``--warmup`` (CUDA events on a GPU, the wall clock on
a CPU). The CSV (``num_tokens,context,latency_ms,num_seqs,mode``) gets a JSON sidecar (``<csv>.json``) with its
provenance: model, device name, driver and library versions, dtype, tp, how passes ran, date, repeats, skipped
cells. Requires PyTorch (``pip install torch==2.13.0`` for the CPU build on this project's machines; a CUDA build on
a GPU machine).

Example::

    python -m repro.profile --model llama2-7b --draft llama-160m --k 1 3 5 --device cuda \\
        --out profiles/h100-llama2-7b.csv
    python -m repro +exp=smoke cost=profile cost.table=profiles/h100-llama2-7b.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

from repro.backends.kvslots import PoolFull  # backend=hf's pool without room for its buffer (imports no torch)
from repro.core.host import free_bytes, l2_bytes
from repro.cost.spec import ModelSpec, load_model

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCHES = (1, 4, 16, 64)  # verification passes (--k): sequences per pass
CONTEXTS = (0, 128, 512, 2048)
CHUNKS = (128, 512)  # mixed steps (--mixed): prefill chunk tokens ...
DECODES = (8, 32)  # ... beside this many decodes
COLUMNS = ("num_tokens", "context", "latency_ms", "num_seqs", "mode")
MIXED_COLUMNS = ("chunk_tokens", "decode_seqs", "context", "latency_ms", "mode")
ENGINE = "plain PyTorch decoder (python -m repro.profile): SDPA attention, static KV cache written in place"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise SystemExit("python -m repro.profile needs PyTorch: pip install torch==2.13.0 (CPU build) or a CUDA build "
                         "on a GPU machine") from None
    return torch


@dataclass(frozen=True)
class Group:
    """Sequences of one shape in a pass: ``seqs`` sequences, each scoring ``new`` tokens against ``context`` cached
    ones (``context = 0``: a prompt, causal among its tokens); ``all_logits``: the LM head over every new token."""

    seqs: int
    new: int
    context: int
    all_logits: bool = False

    @property
    def tokens(self) -> int:
        return self.seqs * self.new

    @property
    def logits(self) -> int:
        return self.tokens if self.all_logits else self.seqs


@dataclass(frozen=True)
class Cell:
    """One measurement: a pass of ``groups``; ``key`` is its row's identity in the CSV (for ``--resume``)."""

    kind: str  # prefill | decode | verify | mixed
    groups: tuple[Group, ...]

    @property
    def key(self) -> tuple[int, ...]:
        if self.kind == "mixed":
            chunk, dec = self.groups
            return chunk.new, dec.seqs, dec.context
        (g,) = self.groups
        return g.tokens, g.context, g.seqs

    def row(self, ms: float, mode: str) -> list[Any]:
        return [*self.key, f"{ms:.4f}", mode] if self.kind == "mixed" else [*self.key[:2], f"{ms:.4f}",
                                                                               self.key[2], mode]


def grid(tokens: Sequence[int] = TOKENS, contexts: Sequence[int] = CONTEXTS, ks: Sequence[int] = (),
         batches: Sequence[int] = BATCHES) -> list[Cell]:
    """The main table's cells (module docstring), in the order they are measured."""
    cells = [Cell("prefill", (Group(1, n, 0),)) if c == 0 else Cell("decode", (Group(n, 1, c),))
             for n in tokens for c in contexts]
    cells += [Cell("verify", (Group(b, 1 + k, c, all_logits=True),))
              for b in (batches if ks else ()) for k in ks for c in contexts if c > 0]
    return cells


def mixed_grid(chunks: Sequence[int] = CHUNKS, decodes: Sequence[int] = DECODES,
               contexts: Sequence[int] = CONTEXTS) -> list[Cell]:
    """Mixed steps: one prefill chunk beside ``d`` decodes at context ``c``."""
    return [Cell("mixed", (Group(1, p, 0), Group(d, 1, c))) for p in chunks for d in decodes for c in contexts if c > 0]


def cache_tokens(groups: Sequence[Group]) -> int:
    """The cached token positions a pass of ``groups`` holds in this module's decoder: each sequence's own cache at
    its full length (the profiler's model interface: ``model.cache_tokens``)."""
    return sum(g.seqs * (g.context + g.new) for g in groups)


def cell_bytes(spec: ModelSpec, cell: Cell, dtype_bytes: int = 2,
               held: Callable[[Sequence[Group]], int] = cache_tokens) -> int:
    """An upper estimate of the memory one cell needs beside the weights, in ``dtype_bytes`` per value: its KV cache
    (``held``: the cached token positions the model allocates for the cell's groups), and the activations of a pass
    (kept twice: a CUDA graph's pool beside the eager warm-up)."""
    b = dtype_bytes
    h, q, kv = spec.hidden_size, spec.num_heads * spec.hd, spec.num_kv_heads * spec.hd
    cache = 2 * spec.num_layers * spec.num_kv_heads * spec.hd * held(cell.groups)
    tokens = sum(g.tokens for g in cell.groups)
    act = tokens * (4 * h + q + 2 * kv + 3 * spec.intermediate_size)
    masks = sum(g.seqs * spec.num_heads * g.new * (g.context + g.new) for g in cell.groups if g.new > 1 and g.context)
    logits = sum(g.logits for g in cell.groups) * spec.vocab_size
    return int(b * (cache + 2 * (act + logits)) + 4 * masks)


class RandomDecoder:
    """A random-weight decoder of ``spec``'s architecture (module docstring), on ``device`` in ``dtype``."""

    def __init__(self, spec: ModelSpec, device: str, dtype: Any, seed: int = 0) -> None:
        torch = _torch()
        self.torch, self.spec, self.device, self.dtype = torch, spec, device, dtype
        g = torch.Generator(device=device).manual_seed(seed)  # drawn where they live: a 32B model in seconds
        h, hd = spec.hidden_size, spec.hd
        q, kv = spec.num_heads * hd, spec.num_kv_heads * hd

        def w(*shape: int) -> Any:
            return (torch.randn(*shape, generator=g, device=device, dtype=dtype) * 0.02)

        self.embed = w(spec.vocab_size, h)
        self.layers = [{"qkv": w(q + 2 * kv, h), "o": w(h, q), "gate_up": w(2 * spec.intermediate_size, h),
                        "down": w(h, spec.intermediate_size)} for _ in range(spec.num_layers)]
        self.head = self.embed if spec.tie_embeddings else w(spec.vocab_size, h)

    def cache(self, batch: int, context: int, new: int = 0) -> list[tuple[Any, Any]]:
        """K/V caches of ``context`` random tokens per sequence with room for ``new`` more, one (K, V) per layer,
        each ``[batch, kv_heads, context + new, head_dim]`` (one allocation for all layers)."""
        s = self.spec
        store = self.torch.empty((s.num_layers, 2, batch, s.num_kv_heads, context + new, s.hd), device=self.device,
                                 dtype=self.dtype)
        store[:, :, :, :, :context].normal_()
        return [(store[i, 0], store[i, 1]) for i in range(s.num_layers)]

    def release(self) -> None:
        """After a cell: nothing to free (its caches are the cell's own tensors, dropped with it)."""

    @staticmethod
    def cache_tokens(groups: Sequence[Group]) -> int:
        """The cached token positions a cell of ``groups`` allocates (:func:`cache_tokens`)."""
        return cache_tokens(groups)

    def forward(self, tokens: Any, cache: list[tuple[Any, Any]] | None, all_logits: bool = False) -> Any:
        """One pass of one group: ``tokens`` is [batch, new]; each sequence attends the cache's first
        ``cache length − new`` tokens plus its new ones (causally among them), writing the new K/V in place; without
        a cache, a prompt. The LM head runs over each sequence's last token, or every token (``all_logits``)."""
        n = tokens.shape[1]
        context = 0 if cache is None else cache[0][0].shape[2] - n
        return self.forward_groups([(tokens, cache, context, all_logits)])

    def forward_groups(self, groups: Sequence[tuple[Any, list[tuple[Any, Any]] | None, int, bool]]) -> Any:
        """One pass over several groups ``(tokens [b, n], cache or None, context, all_logits)``: the linear layers
        over all their tokens at once, attention per group; returns the logits of every group, concatenated."""
        torch, s = self.torch, self.spec
        f = torch.nn.functional
        hd, nh, nkv = s.hd, s.num_heads, s.num_kv_heads
        sizes = [int(ids.numel()) for ids, *_ in groups]
        masks = [self._mask(ids.shape[1], ctx) for ids, _, ctx, _ in groups]
        x = self.embed[torch.cat([ids.reshape(-1) for ids, *_ in groups])] if len(groups) > 1 \
            else self.embed[groups[0][0].reshape(-1)]
        for i, lay in enumerate(self.layers):
            y = f.rms_norm(x, (s.hidden_size,))
            qkv = y @ lay["qkv"].T
            outs = []
            for (ids, cache, ctx, _), part, mask in zip(groups, qkv.split(sizes), masks, strict=True):
                b, n = ids.shape
                qh = part[:, : nh * hd].view(b, n, nh, hd)
                kh = part[:, nh * hd: (nh + nkv) * hd].view(b, n, nkv, hd).transpose(1, 2)
                vh = part[:, (nh + nkv) * hd:].view(b, n, nkv, hd).transpose(1, 2)
                if cache is not None:
                    k_all, v_all = cache[i]
                    k_all[:, :, ctx: ctx + n] = kh
                    v_all[:, :, ctx: ctx + n] = vh
                    kh, vh = k_all[:, :, : ctx + n], v_all[:, :, : ctx + n]
                outs.append(self._attend(qh, kh, vh, ctx, mask).reshape(b * n, nh * hd))
            att = outs[0] if len(outs) == 1 else torch.cat(outs)
            x = x + att @ lay["o"].T
            y = f.rms_norm(x, (s.hidden_size,))
            gate, up = (y @ lay["gate_up"].T).chunk(2, dim=-1)
            x = x + (f.silu(gate) * up) @ lay["down"].T
        lasts = []
        for (ids, _, _, every), part in zip(groups, x.split(sizes), strict=True):
            b, n = ids.shape
            lasts.append(part if every else part.view(b, n, -1)[:, -1])
        last = lasts[0] if len(lasts) == 1 else torch.cat(lasts)
        return f.rms_norm(last, (s.hidden_size,)) @ self.head.T

    def _mask(self, n: int, context: int) -> Any:
        """A verification's mask over its ``g·n`` folded query rows (row ``r`` is query ``r mod n``): key ``j`` is
        seen when ``j ≤ context + r mod n``; None where no mask is needed."""
        if n == 1 or context == 0:
            return None
        torch, g = self.torch, self.spec.num_heads // self.spec.num_kv_heads
        rows = torch.arange(g * n, device=self.device) % n
        return torch.arange(context + n, device=self.device)[None, :] <= (context + rows)[:, None]

    def _attend(self, qh: Any, kh: Any, vh: Any, context: int, mask: Any) -> Any:
        """Attention of queries ``qh`` [b, n, heads, hd] over ``kh``/``vh`` [b, kv_heads, L, hd]; returns
        [b, n, heads, hd]. Each K/V head is read once for all the query heads it serves."""
        f = self.torch.nn.functional
        b, n, nh, hd = qh.shape
        nkv = kh.shape[1]
        g = nh // nkv
        if context == 0:  # a prompt: causal among its own tokens (its K/V are only n tokens: expanding is cheap)
            if g > 1:
                kh, vh = kh.repeat_interleave(g, dim=1), vh.repeat_interleave(g, dim=1)
            out = f.scaled_dot_product_attention(qh.transpose(1, 2), kh, vh, is_causal=n > 1)
            return out.transpose(1, 2)
        # fold the g query heads of each K/V head (and a verification's n queries) into one row block
        q = qh.view(b, n, nkv, g, hd).permute(0, 2, 3, 1, 4).reshape(b, nkv, g * n, hd)
        out = f.scaled_dot_product_attention(q, kh, vh, attn_mask=mask)
        return out.reshape(b, nkv, g, n, hd).permute(0, 3, 1, 2, 4)


class Timer:
    """Times a pass: CUDA events around a captured graph's replay (or an eager pass) on a GPU, the wall clock on a
    CPU. ``mode`` is how the last cell ran: ``graph`` or ``eager``."""

    def __init__(self, torch: Any, device: str, graphs: bool, flush_bytes: int = 0) -> None:
        self.torch, self.cuda = torch, device.startswith("cuda")
        self.graphs = graphs and self.cuda
        self.mode = "eager"
        self._graph: Any = None
        # a CPU: a buffer written before each timed pass, evicting the pass's working set from the core's private
        # caches as an engine's host work between two passes does (flush_bytes; 0: back-to-back, warm caches)
        self._flush = torch.empty(flush_bytes // 4, dtype=torch.float32) if flush_bytes and not self.cuda else None

    def samples_ms(self, fn: Callable[[], Any], warmup: int, repeat: int) -> list[float]:
        """``repeat`` timed passes of ``fn`` after ``warmup`` untimed ones (a CUDA graph of it where it can)."""
        torch = self.torch
        run, self.mode = fn, "eager"
        for _ in range(warmup):
            fn()
        if self.graphs:
            try:
                run = self._capture(fn)
                self.mode = "graph"
            except RuntimeError as exc:  # not capturable here: time it eagerly, and say so in the row
                print(f"  (no CUDA graph: {str(exc).splitlines()[0][:120]}; timed eagerly)", file=sys.stderr)
                torch.cuda.synchronize()
            run()
        if not self.cuda:
            times = []
            for _ in range(repeat):
                if self._flush is not None:
                    self._flush.fill_(1.0)
                t0 = time.perf_counter()
                run()
                times.append((time.perf_counter() - t0) * 1e3)
            return times
        torch.cuda.synchronize()
        times = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        return times

    def _capture(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        torch = self.torch
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        self._graph = graph  # kept alive with its memory pool until the next capture
        return graph.replay


def measure(model: RandomDecoder, cells: Sequence[Cell], warmup: int, repeat: int, graphs: bool = True,
            cap_gib: float | None = None, done: set[tuple[int, ...]] | frozenset[tuple[int, ...]] = frozenset(),
            flush_bytes: int = 0, rounds: int = 1) -> Iterator[tuple[Cell, float | None, str]]:
    """Each cell's median latency in ms (None: skipped, with the reason as the third item; else the mode), measured
    in order; cells whose key is in ``done`` are not measured (nor yielded). ``flush_bytes``: :class:`Timer`'s.
    ``rounds`` > 1 sweeps the cells that many times, ``repeat`` passes each time, and yields each cell's median over
    all its passes after the last round: a slow phase of the host lasting seconds (``backend=hf`` on an H100,
    docs/gpu.md) then falls on every cell alike instead of on a few neighbours."""
    torch, spec, device = model.torch, model.spec, model.device
    timer = Timer(torch, device, graphs, flush_bytes)
    width = torch.finfo(model.dtype).bits // 8
    oom = (getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError, PoolFull)
    samples: dict[tuple[int, ...], list[float]] = {}
    with torch.inference_mode():
        for r in range(max(1, rounds)):
            for cell in cells:
                if cell.key in done or (r and cell.key not in samples):  # later rounds: the cells that ran
                    continue
                need = cell_bytes(spec, cell, width, model.cache_tokens)
                room = free_bytes(torch, device, cap_gib)
                if need > room:
                    samples.pop(cell.key, None)
                    yield cell, None, f"needs ~{need / 2**20:,.0f} MiB, {max(room, 0) / 2**20:,.0f} MiB free"
                    continue
                times: list[float] | None = None
                try:
                    groups = [(torch.randint(spec.vocab_size, (g.seqs, g.new), device=device),
                               model.cache(g.seqs, g.context, g.new) if g.context else None, g.context,
                               g.all_logits) for g in cell.groups]
                    times = timer.samples_ms(partial(model.forward_groups, groups), warmup, repeat)
                except oom:
                    pass
                finally:
                    groups = []
                    timer._graph = None
                    model.release()
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
                if times is None:
                    samples.pop(cell.key, None)
                    yield cell, None, "out of memory"
                    continue
                samples.setdefault(cell.key, []).extend(times)
                if r == max(1, rounds) - 1:
                    yield cell, statistics.median(samples.pop(cell.key)), timer.mode


def profile(spec: ModelSpec, device: str = "cpu", tokens: Sequence[int] = TOKENS,
            contexts: Sequence[int] = CONTEXTS, warmup: int = 2, repeat: int = 5, ks: Sequence[int] = (),
            batches: Sequence[int] = BATCHES, graphs: bool = True) -> list[tuple[int, int, float, int]]:
    """``(num_tokens, context, latency_ms, num_seqs)`` for every grid cell that fits (module docstring)."""
    torch = _torch()
    model = RandomDecoder(spec, device, _dtype(torch, device))
    return [(cell.key[0], cell.key[1], ms, cell.key[2]) for cell, ms, _ in
            measure(model, grid(tokens, contexts, ks, batches), warmup, repeat, graphs) if ms is not None]


def make_model(spec: ModelSpec, device: str, dtype: Any, engine: str = "decoder", tiny: bool = False) -> Any:
    """The model whose passes a profile times: this module's decoder, or ``backend=hf``'s (``engine="hf"``)."""
    if engine == "hf":
        from repro.backends.passes import BackendPasses

        return BackendPasses(spec, device, dtype, tiny=tiny)
    return RandomDecoder(spec, device, dtype)


def hf_stamp(model: Any, tiny: bool) -> dict[str, Any]:
    """The sidecar fields of a profile of ``backend=hf``'s passes."""
    from repro.backends.passes import ENGINE as HF_ENGINE

    return {"engine": HF_ENGINE, "cuda_graphs": False, "tiny": bool(tiny),
            "weights": "random (backend.tiny's scaled-down shape)" if tiny else "random (architecture from conf/model)",
            "shape": {"num_layers": model.spec.num_layers, "hidden_size": model.spec.hidden_size,
                      "vocab_size": model.spec.vocab_size}}


def _dtype(torch: Any, device: str) -> Any:
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def provenance(spec: ModelSpec, device: str, warmup: int, repeat: int, graphs: bool = True) -> dict[str, Any]:
    torch = _torch()
    cuda = device.startswith("cuda")
    info: dict[str, Any] = {
        "model": spec.name, "source": spec.source, "device": device,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
        "python": platform.python_version(), "machine": platform.platform(),
        "dtype": "bfloat16" if cuda else "float32", "tp": 1, "engine": ENGINE,
        "cuda_graphs": bool(graphs and cuda), "warmup": warmup, "repeat": repeat,
        "weights": "random (architecture from conf/model)", "how": "python -m repro.profile",
    }
    if cuda:
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["driver"] = getattr(torch.cuda, "get_driver_version", lambda: None)()
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
    return info


def write(path: Path, rows: Sequence[tuple[int, int, float, int]], info: dict[str, Any]) -> None:
    """A whole profile CSV and its provenance sidecar (``<path>.json``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(COLUMNS[:4])
        out.writerows((n, c, f"{ms:.4f}", b) for n, c, ms, b in rows)
    write_sidecar(path, info)


def write_sidecar(path: Path, info: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".json.tmp")
    tmp.write_text(json.dumps(info, indent=1) + "\n")
    os.replace(tmp, path.with_suffix(path.suffix + ".json"))


def measured_keys(path: Path, mixed: bool = False) -> set[tuple[int, ...]]:
    """The cells a profile CSV already holds (``--resume``); a line cut by a kill is dropped."""
    if not path.is_file():
        return set()
    names = ("chunk_tokens", "decode_seqs", "context") if mixed else ("num_tokens", "context", "num_seqs")
    keys = set()
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            try:
                float(r["latency_ms"])
                keys.add(tuple(int(float(r[k])) for k in names))
            except (KeyError, TypeError, ValueError):
                continue
    return keys


def run_table(model: RandomDecoder, cells: Sequence[Cell], out: Path, info: dict[str, Any], args: Any,
              mixed: bool = False) -> tuple[int, list[str]]:
    """Measure ``cells`` into ``out``, a line per cell as it finishes (resuming from what ``out`` holds with
    ``args.resume``); returns the number measured and the skipped cells' descriptions."""
    header = MIXED_COLUMNS if mixed else COLUMNS
    done = measured_keys(out, mixed) if args.resume else set()
    if args.resume and out.is_file() and done:
        old = out.with_suffix(out.suffix + ".json")
        if old.is_file():
            prev = json.loads(old.read_text())
            if prev.get("model") != info["model"] or prev.get("gpu") != info.get("gpu"):
                raise SystemExit(f"error: {out} was measured for {prev.get('model')} on {prev.get('gpu') or 'CPU'}; "
                                 f"this run is {info['model']} on {info.get('gpu') or 'CPU'}: choose another --out")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(",".join(header) + "\n")
    info = {**info, "complete": False, "skipped": []}
    write_sidecar(out, info)
    skipped: list[str] = []
    count = 0
    t0 = time.perf_counter()
    for cell, ms, how in measure(model, cells, args.warmup, args.repeat, not args.no_cuda_graphs,
                                 args.max_memory_gib, done, int(getattr(args, "flush_mib", 0) * 2**20),
                                 int(getattr(args, "rounds", 1))):
        if ms is None:
            skipped.append(f"{cell.kind} {cell.key}: {how}")
            continue
        with out.open("a", newline="") as fh:
            csv.writer(fh).writerow(cell.row(ms, how))
        count += 1
        if args.verbose:
            print(f"  {cell.kind} {cell.key}: {ms:.3f} ms ({how}, {time.perf_counter() - t0:.0f} s)", file=sys.stderr,
                  flush=True)
    write_sidecar(out, {**info, "complete": True, "skipped": skipped, "cells": len(measured_keys(out, mixed)),
                        "seconds": round(time.perf_counter() - t0, 1)})
    return count, skipped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a conf/model name, e.g. llama2-7b")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--out", type=Path, default=None, help="CSV path (default profiles/<device>-<model>.csv)")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="num_tokens grid")
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS), help="context grid (0 = prefill)")
    parser.add_argument("--k", type=int, nargs="*", default=[], dest="ks",
                        help="verification passes: drafted tokens (or tree nodes) per sequence, e.g. --k 1 3 7")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help="sequences per verification pass")
    parser.add_argument("--mixed", action="store_true", help="also mixed prefill-chunk + decode steps (.mixed.csv)")
    parser.add_argument("--chunks", type=int, nargs="+", default=list(CHUNKS), help="mixed steps' chunk tokens")
    parser.add_argument("--decodes", type=int, nargs="+", default=list(DECODES), help="mixed steps' decodes")
    parser.add_argument("--draft", default=None, help="also profile this conf/model draft (its own CSV: .draft.csv)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1, help="sweep the grid this many times, --repeat passes a cell "
                        "each time, a cell's median over them all (a host's slow phases spread over every cell)")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="time eager passes on a GPU")
    parser.add_argument("--max-memory-gib", type=float, default=None,
                        help="skip cells needing more than this (default: the device's free memory)")
    parser.add_argument("--threads", type=int, default=None, help="PyTorch CPU threads (default: PyTorch's)")
    parser.add_argument("--resume", action="store_true", help="measure only the cells --out does not hold yet")
    parser.add_argument("--engine", choices=("decoder", "hf"), default="decoder",
                        help="whose passes: this module's decoder (a serving engine's), or backend=hf's own "
                             "(repro.backends.passes: what sim_vs_real compares with backend=hf)")
    parser.add_argument("--tiny", action="store_true", help="with --engine hf: backend.tiny's scaled-down models")
    parser.add_argument("--flush-mib", type=float, default=None,
                        help="on a CPU, write this many MiB before each timed pass, evicting the core's private "
                             "caches as an engine's host work between passes does (default: with --engine hf, twice "
                             "the L2 cache; else 0, back-to-back passes)")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per cell")
    args = parser.parse_args(argv)
    if args.tiny and args.engine != "hf":
        print("error: --tiny profiles backend=hf's scaled-down models: add --engine hf", file=sys.stderr)
        return 2
    if args.flush_mib is None:
        args.flush_mib = 2 * l2_bytes() / 2**20 if args.engine == "hf" and not args.device.startswith("cuda") else 0.0
    try:
        spec = load_model(args.model)
        draft = load_model(args.draft) if args.draft else None
    except Exception as exc:  # an unknown name: say which ones exist
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch = _torch()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: --device {args.device}: this PyTorch ({torch.__version__}) sees no CUDA device", file=sys.stderr)
        return 2
    out = args.out or Path("profiles") / f"{args.device.replace(':', '')}-{spec.name}.csv"
    graphs = not args.no_cuda_graphs
    jobs: list[tuple[ModelSpec, list[Cell], Path, dict[str, Any], bool]] = []
    info = provenance(spec, args.device, args.warmup, args.repeat, graphs)
    jobs.append((spec, grid(args.tokens, args.contexts, args.ks, args.batches), out, info, False))
    if args.mixed:
        jobs.append((spec, mixed_grid(args.chunks, args.decodes, args.contexts), out.with_suffix(".mixed.csv"),
                     {**info, "role": "mixed"}, True))
    if draft is not None:
        jobs.append((draft, grid(args.tokens, args.contexts), out.with_suffix(".draft.csv"),
                     {**provenance(draft, args.device, args.warmup, args.repeat, graphs), "role": "draft",
                      "target": spec.name}, False))
    model: Any = None
    built_for = None
    for who, cells, path, meta, mixed in jobs:
        if model is None or built_for is not who:
            model = None
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            model = make_model(who, args.device, _dtype(torch, args.device), args.engine, args.tiny)
            built_for = who
        if args.engine == "hf":
            meta = {**meta, **hf_stamp(model, args.tiny)}
        if args.flush_mib:
            meta = {**meta, "flush_mib": round(float(args.flush_mib), 3)}
        if args.rounds > 1:
            meta = {**meta, "rounds": int(args.rounds)}
        count, skipped = run_table(model, cells, path, meta, args, mixed)
        more = f"; {len(skipped)} skipped (too large for the device's memory; see {path.name}.json)" if skipped else ""
        print(f"{path}: {count} cells measured ({who.name} on {meta.get('gpu') or args.device}){more}", flush=True)
    use = f"cost=profile cost.table={out}" + (f" cost.draft_table={out.with_suffix('.draft.csv')}" if draft else "")
    print(f"use it with {use}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
