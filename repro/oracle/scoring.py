"""Tree and chain scoring over a stream's values: beam-search and fixed-expansion candidate trees, runs of chains.

**Off-path nodes.** A node off the true path (its context differs from the true text) has its own child
distribution, drawn like a true one (``Beta(a_r(s), κ_pos)`` at its children's position ``s``). Each position keeps
``NUM_ALT`` such draws; an off-path node picks one by the hash of its context (:mod:`repro.oracle.store`), so the
same context always gets the same distribution.

The functions here draw nothing: they read what a stream hands them (:data:`TreeReads`, or whether each
position's true rank is 0).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from repro.core import jit
from repro.oracle.store import _ALT_MASK, _AR, _RANK_SALT, _mix

#: What a tree of ``depth`` layers over each request's next positions reads (``_TokenStream._positions``): the true p0
#: and rank per (request, layer), the off-path pool and its index, and the hash of (seed, r, divergence position).
TreeReads = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: A stream's reported probabilities of each node's ``top`` most probable children, given the nodes' top-1 ``p0``.
Reported = Callable[[np.ndarray, int], np.ndarray]


@dataclass(frozen=True, slots=True)
class _Beam:
    """A batch of candidate trees as (n, depth·width) arrays."""

    parent: np.ndarray
    rank: np.ndarray
    prob: np.ndarray
    path_prob: np.ndarray


def _top(x: np.ndarray, width: int) -> np.ndarray:
    """Per row of ``x`` (n, m), the column indices of its ``width`` largest values, ties to the lower index, in
    increasing order: ``np.sort(np.argsort(-x, axis=1, kind="stable")[:, :width], axis=1)``, which it equals
    exactly."""
    n, m = x.shape
    if width >= m:
        return np.repeat(_AR[None, :m], n, axis=0)
    return _top_flat(x, width) - _row_starts(n, m)


def _top_flat(x: np.ndarray, width: int) -> np.ndarray:
    """:func:`_top` of ``x`` (n, m), ``width`` < m, as flat indices into ``x`` (C order). Over wide rows a partition
    finds each row's ``width``-th largest value t; the picks are then the values above t and, in index order, as
    many equal to t as are still needed."""
    n, m = x.shape
    if x.size < 512:
        pick = np.argsort(-x, axis=1, kind="stable")[:, :width]
        pick.sort(axis=1)
        return pick + _row_starts(n, m)
    t = np.partition(x, m - width, axis=1)[:, m - width:m - width + 1]
    sel = x >= t  # at least width per row: more in a row where values tie at t
    if np.count_nonzero(sel) != n * width:  # ties at t beyond the width: the lower indices
        above = x > t
        tied = x == t
        more = width - above.sum(axis=1)
        sel = above | (tied & (np.cumsum(tied, axis=1) <= more[:, None]))
    return np.flatnonzero(sel).reshape(n, width)


def _row_starts(n: int, m: int) -> np.ndarray:
    """The flat index of each row's first element in an (n, m) array, as an (n, 1) column."""
    return _AR[:n, None] * m if n <= _AR.size else np.arange(n)[:, None] * m


def beam_layers(reads: TreeReads, depth: int, width: int, reported: Reported) -> _Beam:
    """The layers of a beam of ``width`` over ``depth`` layers (``_TokenStream.beam``), by path probability.

    Only each parent's first ``width`` ranks are scored: a parent's reported probabilities do not increase
    with rank, so a rank at or past ``width`` could be picked only after the ``width`` ranks before it (no
    less probable, and first on ties), which already fill the layer. The picks are those of all ``W``."""
    _, rank_true, alt, _, div = reads
    n = rank_true.shape[0]
    table, true_row, alt_row = _reported_table(reads, depth, width, reported)
    mask = alt.shape[1] - 1  # the off-path pool's count per position, a power of two
    if jit.enabled():  # the same, one request at a time, compiled (repro.oracle.kernels.beam)
        out = _Beam(np.empty((n, depth * width), dtype=np.int64), np.empty((n, depth * width), dtype=np.int64),
                    np.empty((n, depth * width)), np.empty((n, depth * width)))
        jit.kernel("repro.oracle.kernels", "beam")(np.ascontiguousarray(table, dtype=np.float64), true_row, alt_row,
                                                   mask, rank_true, div, _RANK_SALT, depth, width, out.parent,
                                                   out.rank, out.prob, out.path_prob)  # one signature: C arrays
        return out
    # the outputs layer by layer (each layer's block contiguous), laid out as (n, depth·width) at the end
    out_parent = np.empty((depth, n, width), dtype=np.int64)
    out_rank = np.empty((depth, n, width), dtype=np.int64)
    out_prob = np.empty((depth, n, width))
    out_pp = np.empty((depth, n, width))
    # layer 0: the root's first width ranks, all picked (path probability 1·p = p)
    rk = _AR[:width]
    out_prob[0] = table[true_row[:, 0]]
    pp = out_pp[0]
    pp[:] = out_prob[0]
    out_parent[0] = -1
    out_rank[0] = rk
    h = _mix(div[:, 0:1] ^ _RANK_SALT[rk])
    on = rk == rank_true[:, 0:1]
    for i in range(1, depth):
        # children of the previous layer sit at position pos + i: an on-path node's distribution is the true one,
        # an off-path node's the pool draw its context hash picks (the hash's low bits, read as a signed view)
        row = np.where(on, true_row[:, i:i + 1], alt_row[:, i - 1:i] + (h.view(np.int64) & mask))
        rep = table[row]  # (n, width, width): each node's top width of its W
        cpp = pp[:, :, None] * rep
        pick = _top_flat(cpp.reshape(n, width * width), width)  # BFS: parent-major, then rank
        at, rk = np.divmod(pick, width, out=(out_parent[i], out_rank[i]))  # parents' flat indices in (n, width)
        par_on = on.take(at)
        h = _mix(np.where(par_on, div[:, i:i + 1], h.take(at)) ^ _RANK_SALT[rk])
        on = par_on & (rk == rank_true[:, i:i + 1])
        pp = cpp.take(pick, out=out_pp[i])
        rep.take(pick, out=out_prob[i])
    # a parent's flat index r·width + slot to its index in the request's tree, (i - 1)·width + slot
    out_parent[1:] -= _row_starts(n, width) - _AR[:depth - 1, None, None] * width
    return _Beam(*(a.transpose(1, 0, 2).reshape(n, depth * width) for a in (out_parent, out_rank, out_prob, out_pp)))


def _reported_table(reads: TreeReads, depth: int, width: int,
                    reported: Reported) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every reported distribution a beam over ``reads`` can read, as rows of a (rows, ``width``) table: the row of
    each (request, layer)'s true distribution, (n, depth), and of its first off-path one from layer 1 on,
    (n, depth − 1); a position's off-path distributions follow one another.

    A node's top-1 probability at layer i is its request's true p0 there or one of the position's off-path draws,
    so the distributions are computed once per beam rather than once per node and layer (the same values: a node's
    reported probabilities depend on its p0 alone)."""
    p0_true, _, alt, alt_idx, _ = reads
    n, k = p0_true.shape[0], alt.shape[1]
    num_true = n * depth
    cand = np.empty(num_true + n * (depth - 1) * k)
    cand[:num_true] = p0_true[:, :depth].ravel()
    cand[num_true:] = alt[alt_idx[:, 1:depth]].ravel()  # layer 0 has only the root's children, on the path
    table = reported(cand, width)
    true_row = np.arange(num_true).reshape(n, depth)
    alt_row = np.arange(num_true, cand.size, k).reshape(n, depth - 1)
    return table, true_row, alt_row


def expand_layers(reads: TreeReads, expansion: tuple[int, ...], reported: Reported,
                  decay: float | None = None) -> tuple[_Beam, np.ndarray]:
    """The nodes of a fixed expansion (``_TokenStream.expand``) and each node's depth. ``decay``: given where the
    reported distributions are the true ones (γ = 1), whose first three ranks the compiled kernel computes exactly
    (:func:`repro.oracle.kernels.expand`, for expansions of at most 3 children a node)."""
    p0_true, rank_true, alt, alt_idx, div = reads
    n = p0_true.shape[0]
    layers, parent, rank, node_depth = _expansion_layout(expansion)
    if decay is not None and max(expansion) <= 3 and jit.step_kernels():
        prob, path_prob = np.empty((n, parent.size)), np.empty((n, parent.size))
        jit.kernel("repro.oracle.kernels", "expand")(
            p0_true, rank_true, alt, alt_idx, div, np.asarray(expansion, dtype=np.int64), _RANK_SALT, float(decay),
            max(width * k for width, k, *_ in layers), prob, path_prob)
    else:
        prob, path_prob = _expand_numpy(reads, layers, reported)
    return _Beam(np.repeat(parent[None, :], n, axis=0), np.repeat(rank[None, :], n, axis=0), prob,
                 path_prob), node_depth.copy()


def _expand_numpy(reads: TreeReads, layers: tuple[tuple[int, int, np.ndarray, np.ndarray, np.ndarray], ...],
                  reported: Reported) -> tuple[np.ndarray, np.ndarray]:
    """:func:`expand_layers`' probabilities and path probabilities, layer by layer over the batch (the kernel's
    reference)."""
    p0_true, rank_true, alt, alt_idx, div = reads
    n = p0_true.shape[0]
    probs, pps = [], []
    on = np.ones((n, 1), dtype=bool)
    pp = np.ones((n, 1))
    h = np.zeros((n, 1), dtype=np.uint64)
    for i, (width, k, slot, rk, salt) in enumerate(layers):
        node_p0 = p0_true[:, i:i + 1] if i == 0 else np.where(
            on, p0_true[:, i:i + 1], alt[alt_idx[:, i:i + 1], (h & _ALT_MASK).astype(np.int64)])
        rep = reported(node_p0, k)  # (n, width, k): each node's own top k, rank order
        cpp = (pp[:, :, None] * rep).reshape(n, width * k)
        par_on = on[:, slot]
        base = np.where(par_on, div[:, i:i + 1], h[:, slot])
        h = _mix(base ^ salt)
        on = par_on & (rk == rank_true[:, i:i + 1])
        pp = cpp
        probs.append(rep.reshape(n, width * k))
        pps.append(cpp)
    return np.concatenate(probs, axis=1), np.concatenate(pps, axis=1)


@functools.lru_cache(maxsize=64)
def _expansion_layout(expansion: tuple[int, ...]) -> tuple[tuple[tuple[int, int, np.ndarray, np.ndarray, np.ndarray],
                                                                 ...], np.ndarray, np.ndarray, np.ndarray]:
    """What a fixed expansion's trees share whatever the requests: per layer (its parents' count, k, each child's
    parent slot and rank, the rank's hash salt), and every node's parent index, rank and depth in BFS order."""
    layers, parents, ranks, depths = [], [], [], []
    width, start = 1, -1  # the previous layer's node count and first node (-1: the root)
    for i, k in enumerate(expansion):
        slot = np.repeat(np.arange(width), k)
        rk = np.tile(np.arange(k), width)
        layers.append((width, k, slot, rk, _RANK_SALT[rk]))
        parents.append(slot + start if i else np.full(width * k, -1))
        ranks.append(rk)
        depths.append(np.full(width * k, i + 1, dtype=np.int64))
        start = start + width if i else 0
        width *= k
    out = (np.concatenate(parents).astype(np.int64), np.concatenate(ranks).astype(np.int64), np.concatenate(depths))
    for arr in (*out, *(a for layer in layers for a in layer[2:])):
        arr.flags.writeable = False
    return tuple(layers), *out


def chain_steps(hit: np.ndarray, k: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, matched), each (steps, requests), of ``steps`` successive chains of ``k`` > 0, each starting where
    the previous one's accepted + 1 tokens end, from ``hit`` (requests, steps·(k + 1) + k): whether each position of
    the run has true rank 0."""
    n = hit.shape[0]
    reach = steps * (k + 1)  # a step advances at most k + 1 positions
    lead = hit[:, :reach].astype(np.int64)  # leading positions whose true rank is 0, at most k
    count = lead.copy()  # positions among the k drafted whose true rank is 0
    alive = hit[:, :reach].copy()
    for i in range(1, k):
        window = hit[:, i:i + reach]
        alive &= window
        lead += alive
        count += window
    # where each step starts, as flat indices into the (requests × reach) arrays: a step at offset p accepts
    # lead[p] tokens and emits one more, so the next starts at p + lead[p] + 1 (never followed past the run)
    base = np.arange(0, n * reach, reach, dtype=np.int64)
    jump = (lead + (base[:, None] + 1) + np.arange(reach)).ravel()
    at = np.empty((steps, n), dtype=np.int64)
    at[0] = cur = base
    for j in range(1, steps):
        at[j] = cur = jump[cur]
    return lead.ravel()[at], count.ravel()[at]
