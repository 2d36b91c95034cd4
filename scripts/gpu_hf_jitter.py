"""Is backend=hf's eager pass time on a GPU a property of the pass's shape, or of when it ran? Times two decode shapes
of a random-weight model (``BackendPasses``, as ``python -m repro.profile --engine hf`` does) in alternating blocks
of ``--repeat`` back-to-back passes, the profiler's way of timing a cell, and prints each block's median: if blocks
of the same shape differ as much as the shapes' cells in a profile do, the profile's cell-to-cell differences are the
host's, not the shapes'. Writes every sample (CUDA-event ms) to ``--out``.

Usage: python scripts/gpu_hf_jitter.py [--model llama2-7b] [--blocks 20] [--repeat 7] [--out samples.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from repro.backends.passes import BackendPasses
from repro.cost.spec import load_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama2-7b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--out", default="samples.json")
    a = p.parse_args()
    cuda = a.device.startswith("cuda")
    t0 = time.perf_counter()
    model = BackendPasses(load_model(a.model), a.device, torch.bfloat16 if cuda else torch.float32,
                          tiny=not cuda)
    print(f"built {a.model} in {time.perf_counter() - t0:.1f} s", flush=True)
    shapes = {"4x64": (4, 64), "8x64": (8, 64)}
    groups = {k: [(torch.zeros(b, 1, dtype=torch.long), model.cache(b, c), c, False)] for k, (b, c) in shapes.items()}

    def once(g: list) -> tuple[float, float]:
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
        w = time.perf_counter()
        model.forward_groups(g)
        if cuda:
            e.record()
            e.synchronize()
            return float(s.elapsed_time(e)), (time.perf_counter() - w) * 1e3
        return (time.perf_counter() - w) * 1e3, (time.perf_counter() - w) * 1e3

    for g in groups.values():
        for _ in range(3):
            once(g)
    samples: dict[str, list[list[float]]] = {k: [] for k in shapes}
    for _ in range(a.blocks):
        for k, g in groups.items():
            samples[k].append([once(g)[0] for _ in range(a.repeat)])
    for k, blocks in samples.items():
        med = [statistics.median(b) for b in blocks]
        flat = sorted(x for b in blocks for x in b)
        print(f"{k}: block medians {' '.join(f'{m:.1f}' for m in med)}", flush=True)
        print(f"{k}: blocks min {min(med):.1f} max {max(med):.1f} ms (x{max(med) / min(med):.2f}); all samples "
              f"p10 {flat[len(flat) // 10]:.1f} median {statistics.median(flat):.1f} "
              f"p90 {flat[9 * len(flat) // 10]:.1f} ms", flush=True)
    Path(a.out).write_text(json.dumps({"model": a.model, "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
                                       "repeat": a.repeat, "samples_ms": samples}))


if __name__ == "__main__":
    main()
