"""What a speculation is, whoever runs it: the proposer kinds (their token streams' names) and token trees."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from repro.core import jit
from repro.core.errors import PlanError

#: The co-located proposer kinds, as systems' configs name them; each draws from the token stream of its name.
ProposerName = Literal["draft", "eagle", "pld"]
DRAFT, EAGLE, PLD = "draft", "eagle", "pld"


class HasStream(Protocol):
    """Anything that drafts from a named token stream (a proposer, :mod:`repro.sim.proposers`)."""

    @property
    def stream(self) -> str: ...


#: Neither tree class is a frozen dataclass: a tree step builds one of each per request, and a frozen dataclass's
#: ``__init__`` (``object.__setattr__`` per field) costs 4-5× a plain one's (about 1.0 against 0.2-0.4 µs). Their
#: candidate arrays are read-only (the drafter's), and nothing assigns a field after construction.
@dataclass(slots=True)
class CandidateTree:
    """Candidate token tree the drafter produced for one request (beam search of ``depth`` × ``width``).

    Node ``i`` sits at ``depth[i]`` (1 = child of the root, the root being the request's last token), is the
    ``rank[i]``-th most probable token of the draft at its parent (0 = top-1), hangs below ``parent[i]`` (-1 for the
    root) and carries the draft's conditional probability ``prob[i]`` and path probability ``path_prob[i]`` (the
    product of ``prob`` along its path: AdaServe's Eq. 7 approximation of f(v)). Nodes are listed in
    breadth-first order, so every parent precedes its children. A real drafter (``backend=hf``) adds their token ids.
    """

    rid: int
    pos: int  # output position of the first speculated token (tokens generated so far)
    parent: np.ndarray
    depth: np.ndarray
    rank: np.ndarray
    prob: np.ndarray
    path_prob: np.ndarray
    draft_depth: int
    draft_width: int
    tokens: np.ndarray | None = None  # the nodes' token ids (a real drafter's trees, backend=hf; None: simulated)

    @property
    def size(self) -> int:
        return int(self.parent.shape[0])


@dataclass(slots=True)
class TreeSpec:
    """A draft token tree to verify: the subset ``nodes`` of a candidate tree (closed under ``parent``)."""

    cand: CandidateTree
    nodes: np.ndarray  # indices into ``cand``; every selected node's parent is selected too (or is the root)

    @property
    def num_nodes(self) -> int:
        return int(self.nodes.shape[0])

    def check(self, rid: int, pos: int) -> None:
        """Raise :class:`~repro.core.errors.PlanError` unless this tree was drafted for request ``rid`` at position
        ``pos`` and its nodes are known candidates connected to the root."""
        cand = self.cand
        if cand.rid != rid or cand.pos != pos:
            raise PlanError(f"tree for request {rid} at position {pos} was drafted for {cand.rid} at {cand.pos}")
        nodes = self.nodes
        if nodes.size == 0:
            return
        if nodes.min() < 0 or nodes.max() >= cand.size:
            raise PlanError(f"tree of request {rid} selects unknown candidate nodes")
        sel = np.zeros(cand.size + 1, dtype=bool)  # index -1 (root) maps to the last slot
        sel[-1] = True
        sel[nodes] = True
        if not sel[cand.parent[nodes]].all():
            raise PlanError(f"tree of request {rid} is not connected to its root")


def trees_at(trees: Mapping[int, TreeSpec], rids: Sequence[int]) -> list[tuple[int, TreeSpec]]:
    """(index, tree) of each request of ``rids`` that ``trees`` gives a tree, in ``rids``' order (a step's batch)."""
    return [(i, t) for i, t in enumerate(map(trees.get, rids)) if t is not None]


def check_trees(specs: Sequence[TreeSpec], rids: Sequence[int], positions: Sequence[int]) -> None:
    """:meth:`TreeSpec.check` of many trees (``specs[i]`` for request ``rids[i]`` at ``positions[i]``) in a few array
    operations over all their nodes at once; where one fails, the first failing tree's own check raises its error."""
    if not specs:
        return
    bad = int([(t.cand.rid, t.cand.pos) for t in specs] != list(zip(rids, positions, strict=True)))
    counts = np.array([t.nodes.shape[0] for t in specs], dtype=np.int64)
    sizes = np.array([t.cand.parent.shape[0] for t in specs], dtype=np.int64)  # each candidate tree's size
    nodes = np.concatenate([t.nodes for t in specs]).astype(np.int64, copy=False)
    parents = np.concatenate([t.cand.parent for t in specs]).astype(np.int64, copy=False)  # tree after tree
    if not bad and jit.step_kernels():  # the same check, compiled (repro.core.kernels.trees_connected)
        if jit.kernel("repro.core.kernels", "trees_connected")(nodes, counts, sizes, parents):
            return
        bad = 1
    base = np.cumsum(sizes + 1) - (sizes + 1)  # tree i's slots: base[i] + node, its root at base[i] + sizes[i]
    owner = np.repeat(np.arange(len(specs)), counts)
    bad = bad or int(np.count_nonzero((nodes < 0) | (nodes >= sizes[owner])))
    if not bad:
        parent = parents[(base - np.arange(len(specs)))[owner] + nodes]
        sel = np.zeros(int(base[-1] + sizes[-1]) + 1, dtype=bool)
        sel[base + sizes] = True
        sel[base[owner] + nodes] = True
        bad = int(np.count_nonzero(~sel[np.where(parent < 0, (base + sizes)[owner], base[owner] + parent)]))
    if bad:  # each tree's own check, in order: the first failing one raises
        for t, rid, pos in zip(specs, rids, positions, strict=True):
            t.check(rid, pos)
        raise AssertionError("check_trees found a fault no tree's check raises")


def chain_prefixes(trees: Mapping[int, TreeSpec], rids: Sequence[int],
                   positions: Sequence[int]) -> tuple[np.ndarray, int] | None:
    """Where ``trees`` gives every request of ``rids`` (at ``positions``, drafted for it there) the first ``c`` nodes
    of a simulated greedy chain of one depth D ≥ 2 (a width-1 candidate tree whose node i is the top-1 child of node
    i − 1: TETRIS's plans), the counts ``c`` (int64) and D; else ``None``. Such a tree is verified as a chain of
    ``c`` and accepts its leading positions whose true rank is 0, after drafting the whole chain."""
    found = list(map(trees.get, rids))
    if not found or found[0] is None:
        return None
    depth = found[0].cand.draft_depth
    if not 2 <= depth < _CHAIN.size:
        return None
    parents, depths, ranks, nodes = [], [], [], []
    for t, r, p in zip(found, rids, positions, strict=True):
        if t is None:
            return None
        c = t.cand
        if c.draft_width != 1 or c.draft_depth != depth or c.rid != r or c.pos != p or c.tokens is not None:
            return None
        parents.append(c.parent)
        depths.append(c.depth)
        ranks.append(c.rank)
        nodes.append(t.nodes)
    n = len(found)
    k = np.array([x.shape[0] for x in nodes], dtype=np.int64)
    if int(k.max()) > depth:
        return None
    parent, node_depth, rank = np.concatenate(parents), np.concatenate(depths), np.concatenate(ranks)
    if parent.shape != (n * depth,) or node_depth.shape != parent.shape or rank.shape != parent.shape \
            or np.count_nonzero(rank) \
            or np.count_nonzero(parent.reshape(n, depth) != _CHAIN[:depth] - 1) \
            or np.count_nonzero(node_depth.reshape(n, depth) != _CHAIN[1:depth + 1]):
        return None
    total = int(k.sum())
    if total:  # each tree's nodes are 0..c − 1
        flat = np.concatenate(nodes)
        if flat.shape != (total,) or np.count_nonzero(flat != np.arange(total) - np.repeat(np.cumsum(k) - k, k)):
            return None
    return k, depth


_CHAIN = np.arange(65)
_CHAIN.flags.writeable = False
