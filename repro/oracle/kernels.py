"""The oracle's compiled kernels (:mod:`repro.core.jit`): per-request loops that give exactly what the vectorized NumPy
functions of :mod:`repro.oracle.scoring` give, which remain their references (the tests compare the two).

Each function is plain Python over arrays (it runs uncompiled too, only slowly); Numba compiles it on first use.
"""

from __future__ import annotations

import numpy as np

from repro.core import jit
from repro.oracle.store import _GOLDEN, _MIX_1, _MIX_2, _U27, _U30, _U31


@jit.helper
def _mix_one(z: np.uint64) -> np.uint64:
    """splitmix64's finaliser on one value (:func:`repro.oracle.store._mix`)."""
    z = (z ^ (z >> _U30)) * _MIX_1
    z = (z ^ (z >> _U27)) * _MIX_2
    return z ^ (z >> _U31)


def beam(table: np.ndarray, true_row: np.ndarray, alt_row: np.ndarray, mask: int, rank_true: np.ndarray,
         div: np.ndarray, salt: np.ndarray, depth: int, width: int, parent: np.ndarray, rank: np.ndarray,
         prob: np.ndarray, path_prob: np.ndarray) -> None:
    """:func:`repro.oracle.scoring.beam_layers`, one request at a time, into ``parent``, ``rank``, ``prob`` and
    ``path_prob`` (each (n, depth·width), a request's nodes layer by layer).

    A layer's ``width`` picks among its ``width²`` candidates (parent-major, then rank) are kept in a small buffer
    ordered by path probability, ties to the lower candidate index (the reference's stable order), then emitted in
    candidate order."""
    n = true_row.shape[0]
    m = width * width
    umask = np.uint64(mask)
    on = np.empty(width, dtype=np.bool_)
    h = np.empty(width, dtype=np.uint64)
    new_on = np.empty(width, dtype=np.bool_)
    new_h = np.empty(width, dtype=np.uint64)
    rows = np.empty(width, dtype=np.int64)
    cpp = np.empty(m)
    top_v = np.empty(width)
    top_i = np.empty(width, dtype=np.int64)
    for j in range(n):
        r0 = true_row[j, 0]
        d0 = div[j, 0]
        t0 = rank_true[j, 0]
        for s in range(width):
            v = table[r0, s]
            prob[j, s] = v
            path_prob[j, s] = v
            parent[j, s] = -1
            rank[j, s] = s
            h[s] = _mix_one(d0 ^ salt[s])
            on[s] = s == t0
        for i in range(1, depth):
            prev = (i - 1) * width  # the previous layer's first node
            for a in range(width):
                row = true_row[j, i] if on[a] else alt_row[j, i - 1] + np.int64(h[a] & umask)
                rows[a] = row
                ppa = path_prob[j, prev + a]
                for c in range(width):
                    cpp[a * width + c] = ppa * table[row, c]
            # the width largest, by value then lower index: insertion into a buffer sorted that way
            count = 0
            for q in range(m):
                v = cpp[q]
                if count < width:
                    p = count
                    count += 1
                elif v > top_v[width - 1]:
                    p = width - 1
                else:
                    continue
                while p > 0 and top_v[p - 1] < v:
                    top_v[p] = top_v[p - 1]
                    top_i[p] = top_i[p - 1]
                    p -= 1
                top_v[p] = v
                top_i[p] = q
            top_i.sort()  # candidate order: parent-major, then rank
            di = div[j, i]
            ti = rank_true[j, i]
            for s in range(width):
                q = top_i[s]
                at = q // width
                rk = q - at * width
                par_on = on[at]
                new_h[s] = _mix_one((di if par_on else h[at]) ^ salt[rk])
                new_on[s] = par_on and rk == ti
                node = i * width + s
                parent[j, node] = prev + at
                rank[j, node] = rk
                path_prob[j, node] = cpp[q]
                prob[j, node] = table[rows[at], rk]
            on[:] = new_on
            h[:] = new_h


def expand(p0_true: np.ndarray, rank_true: np.ndarray, alt: np.ndarray, alt_idx: np.ndarray, div: np.ndarray,
           expansion: np.ndarray, salt: np.ndarray, decay: float, widest: int, prob: np.ndarray,
           path_prob: np.ndarray) -> None:
    """:func:`repro.oracle.scoring.expand_layers` of a calibrated drafter (γ = 1) whose expansion keeps at most 3
    children per node, one request at a time, into ``prob`` and ``path_prob`` (each (n, nodes), BFS order).

    A node's top three reported probabilities are :func:`repro.oracle.distributions.true_dist`'s ``p0, p1·q⁰,
    p1·q¹``, and NumPy's ``q**0`` and ``q**1`` are exactly 1 and q (held to NumPy's by a test over two million p0s), so
    they are ``p0, p1, p1·q`` here; a wider expansion reads powers whose last bit NumPy's vectorized ``pow``
    decides, and stays on the reference. ``widest``: the expansion's largest layer."""
    n = p0_true.shape[0]
    umask = np.uint64(alt.shape[1] - 1)
    on = np.empty(widest, dtype=np.bool_)
    h = np.empty(widest, dtype=np.uint64)
    pp = np.empty(widest)
    new_on = np.empty(widest, dtype=np.bool_)
    new_h = np.empty(widest, dtype=np.uint64)
    rep = np.empty(3)
    for j in range(n):
        on[0] = True
        h[0] = np.uint64(0)
        pp[0] = 1.0
        width = 1
        first = 0  # the layer's first node
        for i in range(expansion.shape[0]):
            k = expansion[i]
            di = div[j, i]
            ti = rank_true[j, i]
            for a in range(width):
                p0 = p0_true[j, i] if on[a] else np.float64(alt[alt_idx[j, i], np.int64(h[a] & umask)])
                rest = 1.0 - p0
                q = max(decay, 1.0 - p0 / rest)
                p1 = min(rest * (1.0 - q), p0)
                rep[0] = p0
                rep[1] = p1
                rep[2] = p1 * q
                for c in range(k):
                    s = a * k + c
                    prob[j, first + s] = rep[c]
                    path_prob[j, first + s] = pp[a] * rep[c]
                    new_on[s] = on[a] and c == ti
                    new_h[s] = _mix_one((di if on[a] else h[a]) ^ salt[c])
            width *= k
            for s in range(width):
                on[s] = new_on[s]
                h[s] = new_h[s]
                pp[s] = path_prob[j, first + s]
            first += width


@jit.helper
def _pool_index(table: np.ndarray, shift: int, r: int, q: int) -> int:
    """The pool index of request ``r``'s position ``q`` through the chunk ``table`` (``table[r, c]``: the pool slot of
    request r's chunk c, -1 where not generated; ``2**shift`` positions a chunk), -1 where its chunk is not
    generated yet."""
    c = q >> shift
    if c >= table.shape[1]:
        return -1
    slot = table[r, c]
    if slot < 0:
        return -1
    return (slot << shift) | (q & ((1 << shift) - 1))


def chain_scores(table: np.ndarray, hit: np.ndarray, shift: int, rids: np.ndarray, pos: np.ndarray,
                 k: np.ndarray, max_k: int, accepted: np.ndarray, matched: np.ndarray) -> int:
    """:meth:`repro.oracle.streams._TokenStream.score_chain`'s accepted (leading hits) and matched (all hits) of
    each request's chain of ``k[i]`` positions from ``pos[i]``, read through the chunk table (:func:`_pool_index`)
    from the ``hit`` pool. Returns 1; 0 (the outputs partly written) where a chunk a chain reads is not generated
    yet: the caller generates it and asks again; before reading anything, -1 for a negative position and -2 for a
    chain of ``max_k`` or more (the caller's errors)."""
    for i in range(rids.shape[0]):
        if pos[i] < 0:
            return -1
        if k[i] >= max_k:
            return -2
    for i in range(rids.shape[0]):
        r = rids[i]
        p = pos[i]
        lead = True
        a = 0
        m = 0
        for j in range(k[i]):
            at = _pool_index(table, shift, r, p + j)
            if at < 0:
                return 0
            if hit[at]:
                m += 1
                if lead:
                    a += 1
            else:
                lead = False
        accepted[i] = a
        matched[i] = m
    return 1


def missing_chunks(table: np.ndarray, shift: int, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                   out: np.ndarray) -> int:
    """The chunks that the chains of :func:`chain_scores` read (request ``rids[i]``'s positions ``pos[i]`` ..
    ``pos[i] + k[i] - 1``) and that are not generated yet, as (request, chunk) rows of ``out`` (room for two per
    request: a chain shorter than a chunk spans at most two); returns their count, -1 where ``out`` has no room."""
    m = 0
    for i in range(rids.shape[0]):
        if k[i] <= 0:
            continue
        r = rids[i]
        for c in range(pos[i] >> shift, ((pos[i] + k[i] - 1) >> shift) + 1):
            if c >= table.shape[1] or table[r, c] < 0:
                if m >= out.shape[0]:
                    return -1
                out[m, 0] = r
                out[m, 1] = c
                m += 1
    return m


def accept_paths(nodes: np.ndarray, counts: np.ndarray, sizes: np.ndarray, parent: np.ndarray, depth: np.ndarray,
                 rank: np.ndarray, rids: np.ndarray, pos: np.ndarray, table: np.ndarray, ranks: np.ndarray,
                 shift: int, best: np.ndarray) -> bool:
    """:meth:`repro.oracle.TokenOracle.accept_trees`, one tree at a time: tree j selects ``counts[j]`` nodes (the
    next of ``nodes``, indices into its candidate tree, whose ``sizes[j]`` nodes' ``parent``, ``depth`` and ``rank``
    come next in those arrays); a node is on the accepted path when its rank is the target's (the true rank at
    ``pos[j]`` + its depth − 1, read through the chunk ``table`` from the ``ranks`` pool: :func:`_pool_index`) and
    its parent is on it (the root always is); ``best[j]`` gets the deepest such node's depth (0: none). Returns
    False (``best`` partly written) where a chunk a tree reads is not generated yet: the caller takes the NumPy path,
    which generates it."""
    big = 1
    for j in range(sizes.shape[0]):
        if sizes[j] > big:
            big = sizes[j]
    on = np.zeros(big, dtype=np.bool_)
    truth = np.empty(big, dtype=np.int64)  # (a tree is no deeper than it has nodes)
    nb = 0
    cb = 0
    for j in range(counts.shape[0]):
        cnt = counts[j]
        reach = 0
        for i in range(nb, nb + cnt):
            d = depth[cb + nodes[i]]
            if d > reach:
                reach = d
        for d in range(reach):
            at = _pool_index(table, shift, rids[j], pos[j] + d)
            if at < 0:
                return False
            truth[d] = ranks[at]
        for i in range(sizes[j]):
            on[i] = False
        b = 0
        for d in range(1, reach + 1):  # a depth at a time: every parent is one layer up
            for i in range(nb, nb + cnt):
                v = cb + nodes[i]
                if depth[v] == d:
                    p = parent[v]
                    ok = rank[v] == truth[d - 1] and (p < 0 or on[p])
                    on[nodes[i]] = ok
                    if ok and d > b:
                        b = d
        best[j] = b
        nb += cnt
        cb += sizes[j]
    return True



def greedy_chains(table: np.ndarray, alt_table: np.ndarray, shift: int, alt_shift: int, p0: np.ndarray,
                  ranks: np.ndarray, alt: np.ndarray, salt: np.uint64, salt0: np.uint64, rids: np.ndarray,
                  pos: np.ndarray, depth: int, prob: np.ndarray, path_prob: np.ndarray) -> bool:
    """:func:`repro.oracle.scoring.beam_layers` of width 1 for a calibrated drafter (γ = 1, a node's reported top-1
    probability is its p0): each request's greedy chain of ``depth`` from ``pos[i]``, its nodes' probabilities and
    path probabilities into ``prob`` and ``path_prob`` ((n, depth); every node is its parent's rank-0 child), read
    through the chunk tables of the stream's store (``p0``, ``ranks``) and, from ``depth`` 2 on, its off-path store
    (``alt``). A node off the true path takes the off-path draw its context hash picks (``_TokenStream._positions``'
    hash of (seed, r, position), ``salt0`` the salt of rank 0). Returns False (outputs partly written) where a chunk
    the reference's reads would generate is not generated yet: the caller takes the reference."""
    n = rids.shape[0]
    umask = np.uint64(alt.shape[1] - 1)
    for j in range(n):
        r = rids[j]
        for i in range(depth):
            if _pool_index(table, shift, r, pos[j] + i) < 0:
                return False
            if depth > 1 and _pool_index(alt_table, alt_shift, r, pos[j] + i) < 0:
                return False
    for j in range(n):
        r = rids[j]
        on = True
        h = np.uint64(0)
        pp = 1.0
        for i in range(depth):
            q = pos[j] + i
            at = _pool_index(table, shift, r, q)
            d = _mix_one(salt ^ _mix_one((np.uint64(r) * _GOLDEN) ^ np.uint64(q)))
            if i == 0 or on:
                v = np.float64(p0[at])
                h = _mix_one(d ^ salt0)
            else:
                v = np.float64(alt[_pool_index(alt_table, alt_shift, r, q), np.int64(h & umask)])
                h = _mix_one(h ^ salt0)
            pp = v if i == 0 else pp * v
            on = on and ranks[at] == 0
            prob[j, i] = v
            path_prob[j, i] = pp
    return True
