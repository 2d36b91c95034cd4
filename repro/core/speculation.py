"""What a speculation is, whoever runs it: the proposer kinds (their token streams' names) and token trees."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

#: The co-located proposer kinds, as systems' configs name them; each draws from the token stream of its name.
ProposerName = Literal["draft", "eagle", "pld"]
DRAFT, EAGLE, PLD = "draft", "eagle", "pld"


class HasStream(Protocol):
    """Anything that drafts from a named token stream (a proposer, :mod:`repro.sim.proposers`)."""

    @property
    def stream(self) -> str: ...


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class TreeSpec:
    """A draft token tree to verify: the subset ``nodes`` of a candidate tree (closed under ``parent``)."""

    cand: CandidateTree
    nodes: np.ndarray  # indices into ``cand``; every selected node's parent is selected too (or is the root)

    @property
    def num_nodes(self) -> int:
        return int(self.nodes.shape[0])
