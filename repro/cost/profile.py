"""A cost model read from a measured profile, for users who profile their own GPU (docs/design.md, "Cost model").

CSV format (header required, one row per measured target forward pass, any row order)::

    num_tokens,context,latency_ms
    1,0,9.3
    1,1024,10.1
    64,0,9.9
    ...

An optional ``num_seqs`` column adds speculative verification passes: a row with ``0 < num_seqs < num_tokens``
and ``context > 0`` is ``num_seqs`` sequences each scoring ``num_tokens / num_seqs`` tokens (the last token plus k
drafts, or a tree) against ``context`` cached ones. Those rows must form their own full grid over (``num_seqs``,
tokens per sequence, ``context``), interpolated trilinearly for passes whose sequences score more than one token;
every other pass uses the main grid. (``python -m repro.profile --k 1 3 7`` writes both.)

``num_tokens`` is the number of tokens through the model in the pass (Σ q_i), ``context`` the mean KV context each
sequence attends (``kv_read_tokens / num_seqs``; 0 for prefill-only passes) and ``latency_ms`` the measured wall time
of the whole pass. The points must form a grid (every ``num_tokens`` with every ``context``), except that a row may
stop short of the largest contexts: a GPU cannot hold the cache of 512 sequences at 2,048 tokens of a 7B model, so
the profiler skips those cells, and they are extended linearly along context (:func:`extend_contexts`, listed in
``ProfileCostModel.extended``). Between grid points latency is interpolated bilinearly; beyond the grid it is
extrapolated linearly from the last two points of each axis (clamped at zero). Prefill attention enters only through
``num_tokens``: profile prefill passes at ``context = 0``. ``forward`` returns the whole latency as ``linear_s`` (a
profile does not split its components). Other columns (the profiler's ``mode``) are ignored.

A pass that mixes prefill chunks with decodes (chunked prefill: Sarathi-Serve, vLLM V1) is priced from the same grid
in two parts (:meth:`ProfileCostModel.mixed_s`): the linear work of all its tokens as a prefill of that many tokens,
plus the decodes' attention over their cached context (their decode row at that context less the row extrapolated to
context 0). Against the committed H100/H200 mixed steps that comes within -17 % to +1 %, on this CPU (a 4-layer
model, ``python -m repro.profile --mixed``'s cells, quiet) within 11 %, where pricing the whole pass as decodes at the
mean context was up to 385 % high.
"""

from __future__ import annotations

import csv
from bisect import bisect_right
from collections.abc import Callable
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


def extend_contexts(rows: dict[tuple[float, ...], dict[float, float]], contexts: tuple[float, ...],
                    seqs: Callable[[tuple[float, ...]], float]) -> dict[tuple[float, ...], float]:
    """Extrapolate the cells a row lacks past its last measured context; returns ``{(*row, context): seconds}``.

    - A profiler skips the large-context corner that does not fit in GPU memory; decode attention reads each cached
      token once, so at a fixed batch a pass is linear in context.
    - Slope: the row's own two largest contexts, else the slope per sequence and cached token of the nearest row (by
      ``seqs``) that has two.
    - ValueError naming the row: a gap below a measured context, or no row to take a slope from.
    """
    slopes: dict[tuple[float, ...], float] = {}
    for row, cells in rows.items():
        have = sorted(cells)
        if not have or any(c not in cells for c in contexts if c < have[-1]):
            gap = next((c for c in contexts if c not in cells), None)
            raise ValueError(f"missing context {gap:g} of row {row} below a measured one" if have else
                             f"row {row} has no measured context")
        if len(have) >= 2:
            c1, c2 = have[-2], have[-1]
            slopes[row] = (cells[c2] - cells[c1]) / (c2 - c1) / seqs(row)
    out: dict[tuple[float, ...], float] = {}
    for row, cells in rows.items():
        last = max(cells)
        todo = [c for c in contexts if c > last]
        if not todo:
            continue
        if row in slopes:
            slope = slopes[row]
        elif slopes:
            slope = slopes[min(slopes, key=lambda r: abs(seqs(r) - seqs(row)))]
        else:
            raise ValueError(f"no row has two measured contexts to extend row {row} from")
        for c in todo:
            out[(*row, c)] = cells[last] + slope * seqs(row) * (c - last)
    return out


class ProfileCostModel:
    """Interpolates a measured (num_tokens × context) latency grid of one model (and its verification grid, if the
    table has one)."""

    def __init__(self, path: str | Path) -> None:
        with Path(path).open(newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or set(COLUMNS) - set(reader.fieldnames):
                raise ValueError(f"{path}: profile CSV needs columns {', '.join(COLUMNS)}")
            table, spec = {}, {}
            for r in reader:
                n, c, t = float(r["num_tokens"]), float(r["context"]), float(r["latency_ms"]) / 1e3
                seqs = float(r.get("num_seqs") or 0)
                if c > 0 and 0 < seqs < n:
                    spec[seqs, n / seqs, c] = t
                else:
                    table[n, c] = t
        self.tokens = tuple(sorted({t for t, _ in table}))
        self.contexts = tuple(sorted({c for _, c in table}))
        #: cells the table did not measure, extended along the attention slope (:func:`extend_contexts`)
        self.extended: list[tuple[float, ...]] = []
        decode: dict[tuple[float, ...], dict[float, float]] = {
            (t,): {c: v for (t2, c), v in table.items() if t2 == t and c > 0} for t in self.tokens}
        try:
            positive = tuple(c for c in self.contexts if c > 0)
            extra = extend_contexts(decode, positive, lambda row: row[0]) if positive else {}
        except ValueError as exc:
            raise ValueError(f"{path}: profile is not a full grid; {exc}") from None
        table.update({(row[0], c): v for (*row, c), v in extra.items()})
        self.extended += [(t, c) for (t, c) in extra]
        missing = [(t, c) for t in self.tokens for c in self.contexts if (t, c) not in table]
        if missing:
            raise ValueError(
                f"{path}: profile is not a full grid; missing (num_tokens, context) {missing[:5]}"
            )
        self._grid = [[table[t, c] for c in self.contexts] for t in self.tokens]
        self._spec: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]] | None = None
        if spec:
            axes = tuple(tuple(sorted({key[i] for key in spec})) for i in range(3))
            rows: dict[tuple[float, ...], dict[float, float]] = {
                (b, q): {c: v for (b2, q2, c), v in spec.items() if (b2, q2) == (b, q)}
                for b in axes[0] for q in axes[1]}
            try:
                extra = extend_contexts(rows, axes[2], lambda row: row[0])
            except ValueError as exc:
                raise ValueError(f"{path}: the verification rows (num_seqs < num_tokens) are not a full grid; "
                                 f"{exc}") from None
            spec.update({(b, q, c): v for (b, q, c), v in extra.items()})
            self.extended += list(extra)
            gaps = [(b, q, c) for b in axes[0] for q in axes[1] for c in axes[2] if (b, q, c) not in spec]
            if gaps:
                raise ValueError(f"{path}: the verification rows (num_seqs < num_tokens) are not a full grid; missing "
                                 f"(num_seqs, tokens per sequence, context) {gaps[:5]}")
            self._spec = (axes[0], axes[1], axes[2])
            self._spec_table = spec

    def _verify_s(self, num_seqs: float, per_seq: float, ctx: float) -> float:
        """Trilinear interpolation (linear extrapolation outside) over the verification grid."""
        assert self._spec is not None
        (i, u), (j, v), (k, w) = (_bracket(ax, x) for ax, x in zip(self._spec, (num_seqs, per_seq, ctx), strict=True))
        total = 0.0
        for di, wi in ((0, 1.0 - u), (1, u)):
            for dj, wj in ((0, 1.0 - v), (1, v)):
                for dk, wk in ((0, 1.0 - w), (1, w)):
                    key = tuple(ax[min(idx + d, len(ax) - 1)] for ax, idx, d in
                                zip(self._spec, (i, j, k), (di, dj, dk), strict=True))
                    total += wi * wj * wk * self._spec_table[key]  # type: ignore[index]
        return max(0.0, total)

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
        """Interpolated latency of a pass of the profiled model (prefill pairs, LM-head tokens and decode_only are
        in the profile)."""
        ctx = kv_read_tokens / num_seqs if num_seqs > 0 else 0.0
        if self._spec is not None and 0 < num_seqs < num_tokens:
            per_seq = num_tokens / num_seqs
            if ctx > per_seq and per_seq <= self._spec[1][-1]:  # verification, not prefill chunks: cached context
                return self._verify_s(num_seqs, per_seq, ctx - per_seq)
        return max(0.0, self._bilinear(num_tokens, self.contexts, 0, ctx))

    def _decode_s(self, num_seqs: float, ctx: float) -> float:
        """A decode pass of ``num_seqs`` sequences at context ``ctx`` from the decode columns only (context > 0,
        extrapolated linearly below the first: context 0 holds the prefill rows)."""
        cols = tuple(c for c in self.contexts if c > 0)
        return self._bilinear(num_seqs, cols, len(self.contexts) - len(cols), ctx)

    def _bilinear(self, num_tokens: float, cols: tuple[float, ...], first: int, ctx: float) -> float:
        """The grid interpolated (linearly extrapolated outside) at (``num_tokens``, ``ctx``) over the context
        columns ``cols``, which start at column ``first`` of the grid."""
        i, u = _bracket(self.tokens, num_tokens)
        j, v = _bracket(cols, ctx)
        g = self._grid
        i1, j1 = min(i + 1, len(self.tokens) - 1), min(j + 1, len(cols) - 1)
        lo = g[i][first + j] + v * (g[i][first + j1] - g[i][first + j])
        hi = g[i1][first + j] + v * (g[i1][first + j1] - g[i1][first + j])
        return lo + u * (hi - lo)

    def mixed_s(self, prefill_tokens: int, prefill_seqs: int, prefill_cached: float, decode_tokens: int,
                decode_seqs: int, decode_kv: float) -> float:
        """A pass mixing prefill chunks with decodes (Sarathi-style chunked prefill), from the main grid: every
        token's linear work as a prefill of all ``prefill_tokens + decode_tokens`` tokens (context 0), plus the
        decodes' attention over their cached context (their decode row at that context less the same row at
        context 0, extrapolated) and likewise the chunks' over their cached prefix. Pricing the whole pass as
        decodes (:meth:`forward_s` at the mean context) charged every chunk token a decode sequence's own cost."""
        base = self.forward_s(prefill_tokens + decode_tokens, 1, 0.0)
        attn = 0.0
        if decode_seqs > 0 and len(self.contexts) > 2:
            attn += self._decode_s(decode_seqs, decode_kv / decode_seqs) - self._decode_s(decode_seqs, 0.0)
            if prefill_cached > 0 and prefill_seqs > 0:
                attn += (self._decode_s(prefill_seqs, prefill_cached / prefill_seqs)
                         - self._decode_s(prefill_seqs, 0.0))
        return max(0.0, base + attn)

    def forward(self, shape: ForwardShape, which: str = "target") -> ForwardCost:
        if 0 < shape.prefill_tokens < shape.num_tokens:
            t = self.mixed_s(shape.prefill_tokens, shape.prefill_seqs, shape.prefill_cached,
                             shape.num_tokens - shape.prefill_tokens, shape.num_seqs - shape.prefill_seqs,
                             shape.kv_read_tokens - shape.prefill_cached)
        else:
            t = self.forward_s(shape.num_tokens, shape.num_seqs, shape.kv_read_tokens, shape.prefill_attn_pairs,
                               shape.lm_head_tokens, shape.decode_only, which)
        return ForwardCost(t, 0.0, 0.0, 0.0, 0.0)
