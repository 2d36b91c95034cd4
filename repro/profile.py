"""``python -m repro.profile``: measure a model architecture's forward latencies on this machine's GPU (or CPU) with
random weights, into the profile table the ``cost=profile`` cost model reads (:mod:`repro.cost.profile`).

Only the architecture is needed (``conf/model/<name>.yaml``), so any GPU can profile any model that fits, with no
download. The model is a Llama/Qwen-style decoder written directly in PyTorch: token embedding, per layer RMSNorm,
Q/K/V projections with grouped-query heads, attention over the cached context (``scaled_dot_product_attention``),
output projection, SwiGLU MLP; final norm and the LM head over each sequence's last token. Weights and caches are
random (bf16 on a GPU, fp32 on a CPU).

The grid, one row per (``num_tokens``, ``context``) as the profile table defines them:

- ``context = 0``: a prefill pass of one sequence of ``num_tokens`` prompt tokens (causal attention);
- ``context = c > 0``: a decode pass of ``num_tokens`` sequences, each scoring one token against ``c`` cached ones;
- with ``--k``: verification passes, a row per (batch ``b`` of ``--batches``, ``k``, ``c > 0``) with ``num_seqs = b``
  sequences each scoring its last token plus ``k`` drafts (``num_tokens = b·(1 + k)``, logits at every position)
  against ``c`` cached ones. A token tree of ``k`` nodes is the same pass with another mask: profile tree sizes as
  ``k`` values.

``--draft NAME`` profiles the draft model's passes too (its own CSV, ``<out>`` with ``.draft.csv``), for
``cost.draft_table``; ``--k`` applies to the target only (the draft proposes one token per sequence per pass).

Each point is timed as the median of ``--repeat`` passes after ``--warmup`` (CUDA events on a GPU, the wall clock on
a CPU). The CSV (``num_tokens,context,latency_ms``) gets a JSON sidecar (``<csv>.json``) with its provenance: model,
device name, driver and library versions, dtype, date, repeats. Requires PyTorch (``pip install torch==2.13.0`` for
the CPU build on this project's machines; a CUDA build on a GPU machine).

Example::

    python -m repro.profile --model llama2-7b --device cuda --out profiles/h100-llama2-7b.csv
    python -m repro +exp=smoke cost=profile cost.table=profiles/h100-llama2-7b.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from repro.cost.spec import ModelSpec, load_model

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCHES = (1, 4, 16, 64)  # verification passes (--k): sequences per pass
CONTEXTS = (0, 128, 512, 2048)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise SystemExit("python -m repro.profile needs PyTorch: pip install torch==2.13.0 (CPU build) or a CUDA build "
                         "on a GPU machine") from None
    return torch


class RandomDecoder:
    """A random-weight decoder of ``spec``'s architecture (module docstring), on ``device`` in ``dtype``."""

    def __init__(self, spec: ModelSpec, device: str, dtype: Any, seed: int = 0) -> None:
        torch = _torch()
        self.torch, self.spec, self.device, self.dtype = torch, spec, device, dtype
        g = torch.Generator(device="cpu").manual_seed(seed)
        h, hd = spec.hidden_size, spec.hd
        q, kv = spec.num_heads * hd, spec.num_kv_heads * hd

        def w(*shape: int) -> Any:
            return (torch.randn(*shape, generator=g) * 0.02).to(device=device, dtype=dtype)

        self.embed = w(spec.vocab_size, h)
        self.layers = [{"qkv": w(q + 2 * kv, h), "o": w(h, q), "gate_up": w(2 * spec.intermediate_size, h),
                        "down": w(h, spec.intermediate_size)} for _ in range(spec.num_layers)]
        self.head = self.embed if spec.tie_embeddings else w(spec.vocab_size, h)

    def cache(self, batch: int, context: int) -> list[tuple[Any, Any]]:
        """Random K/V caches of ``context`` tokens per sequence, one (K, V) per layer."""
        s = self.spec
        shape = (batch, s.num_kv_heads, context, s.hd)
        return [(self.torch.randn(shape, device=self.device, dtype=self.dtype),
                 self.torch.randn(shape, device=self.device, dtype=self.dtype)) for _ in range(s.num_layers)]

    def forward(self, tokens: Any, cache: list[tuple[Any, Any]] | None, all_logits: bool = False) -> Any:
        """One pass: ``tokens`` is [batch, new]; each sequence attends its cache (if any) plus its new tokens
        (causally among them); the LM head runs over each sequence's last token, or every token (``all_logits``:
        a verification pass)."""
        torch, s = self.torch, self.spec
        f = torch.nn.functional
        b, n = tokens.shape
        hd, nh, nkv = s.hd, s.num_heads, s.num_kv_heads
        x = self.embed[tokens]
        for i, lay in enumerate(self.layers):
            y = f.rms_norm(x, (s.hidden_size,))
            qkv = y @ lay["qkv"].T
            qh = qkv[..., : nh * hd].view(b, n, nh, hd).transpose(1, 2)
            kh = qkv[..., nh * hd: (nh + nkv) * hd].view(b, n, nkv, hd).transpose(1, 2)
            vh = qkv[..., (nh + nkv) * hd:].view(b, n, nkv, hd).transpose(1, 2)
            if cache is not None:
                kh = torch.cat([cache[i][0], kh], dim=2)
                vh = torch.cat([cache[i][1], vh], dim=2)
            mask = None
            if cache is not None and n > 1:  # the new tokens see the cache and, causally, each other
                c = kh.shape[2] - n
                mask = torch.ones(n, c + n, dtype=torch.bool, device=x.device).tril(diagonal=c)
            att = f.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=cache is None and n > 1,
                                                 enable_gqa=nkv != nh)
            x = x + att.transpose(1, 2).reshape(b, n, nh * hd) @ lay["o"].T
            y = f.rms_norm(x, (s.hidden_size,))
            gate, up = (y @ lay["gate_up"].T).chunk(2, dim=-1)
            x = x + (f.silu(gate) * up) @ lay["down"].T
        last = x if all_logits else x[:, -1]
        return f.rms_norm(last, (s.hidden_size,)) @ self.head.T  # LM head over the last (or every) token


def _timer(torch: Any, device: str) -> Any:
    if device.startswith("cuda"):
        def run(fn: Any) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return float(start.elapsed_time(end))  # ms
        return run

    def run_cpu(fn: Any) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return run_cpu


def profile(spec: ModelSpec, device: str = "cpu", tokens: Sequence[int] = TOKENS,
            contexts: Sequence[int] = CONTEXTS, warmup: int = 2, repeat: int = 5, ks: Sequence[int] = (),
            batches: Sequence[int] = BATCHES) -> list[tuple[int, int, float, int]]:
    """``(num_tokens, context, latency_ms, num_seqs)`` for every grid point (module docstring)."""
    torch = _torch()
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = RandomDecoder(spec, device, dtype)
    timer = _timer(torch, device)
    rows = []
    with torch.inference_mode():
        for n in tokens:
            for c in contexts:
                if c == 0:
                    ids, cache = torch.randint(spec.vocab_size, (1, n), device=device), None
                else:
                    ids, cache = torch.randint(spec.vocab_size, (n, 1), device=device), model.cache(n, c)
                for _ in range(warmup):
                    model.forward(ids, cache)
                times = [timer(lambda ids=ids, cache=cache: model.forward(ids, cache)) for _ in range(repeat)]
                rows.append((n, c, statistics.median(times), 1 if c == 0 else n))
        for b in batches if ks else ():
            for k in ks:
                for c in (c for c in contexts if c > 0):
                    ids, cache = torch.randint(spec.vocab_size, (b, 1 + k), device=device), model.cache(b, c)
                    for _ in range(warmup):
                        model.forward(ids, cache, all_logits=True)
                    times = [timer(lambda ids=ids, cache=cache: model.forward(ids, cache, all_logits=True))
                             for _ in range(repeat)]
                    rows.append((b * (1 + k), c, statistics.median(times), b))
    return rows


def provenance(spec: ModelSpec, device: str, warmup: int, repeat: int) -> dict[str, Any]:
    torch = _torch()
    info: dict[str, Any] = {
        "model": spec.name, "device": device, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.platform(),
        "dtype": "bfloat16" if device.startswith("cuda") else "float32", "warmup": warmup, "repeat": repeat,
        "weights": "random (architecture from conf/model)", "how": "python -m repro.profile",
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["driver"] = getattr(torch.cuda, "get_driver_version", lambda: None)()
    else:
        info["cpu"] = platform.processor() or platform.machine()
    return info


def write(path: Path, rows: Sequence[tuple[int, int, float, int]], info: dict[str, Any]) -> None:
    """The profile CSV and its provenance sidecar (``<path>.json``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["num_tokens", "context", "latency_ms", "num_seqs"])
        out.writerows((n, c, f"{ms:.4f}", b) for n, c, ms, b in rows)
    path.with_suffix(path.suffix + ".json").write_text(json.dumps(info, indent=1) + "\n")


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
    parser.add_argument("--draft", default=None, help="also profile this conf/model draft (its own CSV: .draft.csv)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        spec = load_model(args.model)
        draft = load_model(args.draft) if args.draft else None
    except Exception as exc:  # an unknown name: say which ones exist
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = profile(spec, args.device, args.tokens, args.contexts, args.warmup, args.repeat, args.ks, args.batches)
    out = args.out or Path("profiles") / f"{args.device.replace(':', '')}-{spec.name}.csv"
    write(out, rows, provenance(spec, args.device, args.warmup, args.repeat))
    use = f"cost=profile cost.table={out}"
    if draft is not None:
        drows = profile(draft, args.device, args.tokens, args.contexts, args.warmup, args.repeat)
        dout = out.with_suffix(".draft.csv")
        write(dout, drows, {**provenance(draft, args.device, args.warmup, args.repeat), "role": "draft",
                            "target": spec.name})
        print(f"{dout}: {len(drows)} points ({draft.name}, the draft)")
        use += f" cost.draft_table={dout}"
    print(f"{out}: {len(rows)} points ({spec.name} on {args.device}); use it with {use}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
