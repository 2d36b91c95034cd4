"""A cost model read from a measured profile, for users who profile their own GPU (DESIGN.md, "Cost model").

CSV format (header required, one row per measured target forward pass, any row order)::

    num_tokens,context,latency_ms
    1,0,9.3
    1,1024,10.1
    64,0,9.9
    ...

``num_tokens`` is the number of tokens through the model in the pass (Σ q_i), ``context`` the mean KV context
each sequence attends (``kv_read_tokens / num_seqs``; 0 for prefill-only passes) and ``latency_ms`` the
measured
wall time of the whole pass. The points must form a full grid (every ``num_tokens`` with every ``context``).
Between grid points latency is interpolated bilinearly; beyond the grid it is extrapolated linearly from
the last
two points of each axis (clamped at zero). Prefill attention enters only through ``num_tokens``: profile
prefill passes at ``context = 0``. ``forward`` returns the whole latency as ``linear_s`` (a profile does
not split
its components).
"""

from __future__ import annotations

import csv
from bisect import bisect_right
from pathlib import Path

from repro.cost.model import ForwardCost, ForwardShape

COLUMNS = ("num_tokens", "context", "latency_ms")


def _bracket(axis: tuple[float, ...], x: float) -> tuple[int, float]:
    """Index i of the left grid point and weight w with x = (1−w)·axis[i] + w·axis[i+1] (w may leave [0,
    1])."""
    if len(axis) == 1:
        return 0, 0.0
    i = min(max(bisect_right(axis, x) - 1, 0), len(axis) - 2)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


class ProfileCostModel:
    """Interpolates a measured (num_tokens × context) latency grid; ``which`` must be ``"target"``."""

    def __init__(self, path: str | Path) -> None:
        with Path(path).open(newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or set(COLUMNS) - set(reader.fieldnames):
                raise ValueError(f"{path}: profile CSV needs columns {', '.join(COLUMNS)}")
            table = {
                (float(r["num_tokens"]), float(r["context"])): float(r["latency_ms"]) / 1e3 for r in reader
            }
        self.tokens = tuple(sorted({t for t, _ in table}))
        self.contexts = tuple(sorted({c for _, c in table}))
        missing = [(t, c) for t in self.tokens for c in self.contexts if (t, c) not in table]
        if missing:
            raise ValueError(
                f"{path}: profile is not a full grid; missing (num_tokens, context) {missing[:5]}"
            )
        self._grid = [[table[t, c] for c in self.contexts] for t in self.tokens]

    def forward_s(
        self,
        num_tokens: int,
        num_seqs: int,
        kv_read_tokens: float = 0.0,
        prefill_attn_pairs: float = 0.0,
        lm_head_tokens: int = -1,
        decode_only: bool = False,
        which: str = "target",
    ) -> float:
        """Interpolated latency of a target pass (prefill pairs, LM-head tokens and decode_only are in the
        profile)."""
        if which != "target":
            raise ValueError("ProfileCostModel profiles the target only")
        ctx = kv_read_tokens / num_seqs if num_seqs > 0 else 0.0
        i, u = _bracket(self.tokens, num_tokens)
        j, v = _bracket(self.contexts, ctx)
        g = self._grid
        j1 = min(j + 1, len(self.contexts) - 1)
        i1 = min(i + 1, len(self.tokens) - 1)
        lo = g[i][j] + v * (g[i][j1] - g[i][j])
        hi = g[i1][j] + v * (g[i1][j1] - g[i1][j])
        return max(0.0, lo + u * (hi - lo))

    def forward(self, shape: ForwardShape, which: str = "target") -> ForwardCost:
        t = self.forward_s(
            shape.num_tokens,
            shape.num_seqs,
            shape.kv_read_tokens,
            shape.prefill_attn_pairs,
            shape.lm_head_tokens,
            shape.decode_only,
            which,
        )
        return ForwardCost(t, 0.0, 0.0, 0.0, 0.0)
