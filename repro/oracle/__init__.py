"""Token oracle: ground truth for what speculation would achieve, with common random numbers.

The oracle models, for request ``r`` at output position ``t`` (0-based), the draft model's distribution over
its top-``W`` tokens and the target's choice among them (docs/design.md, "Token oracle"):

- **levels and distributions** (:mod:`.distributions`): each request has an acceptance level ``a_r``, optionally
  drifting early in the request; at each position the draft's top-1 probability is drawn around it, lower ranks
  share the rest geometrically, and the target's token is the draft's rank-``j`` token with probability ``p_j``.
  The drafter reports those probabilities, distorted by its ``confidence``.
- **acceptance.** A chain of ``k`` accepts the longest prefix of positions whose true rank is 0; a tree
  accepts the longest root path that follows the true ranks (node at depth ``i`` is on the true path iff its
  rank equals the true rank at ``pos + i - 1`` and its parent is on the path). Off-path nodes draw their own
  child distributions (:mod:`.scoring`).
- **common random numbers** (:mod:`.store`): everything at (r, t) depends only on (seed, r, t), never on who
  asks, in what order or how often.
- **streams** (:mod:`.streams`): each proposer draws from a named stream: ``"draft"`` (the draft model; the pair's
  table), ``"eagle"`` (same mechanics, the EAGLE table) and ``"pld"`` (prompt lookup: at each position a match
  exists with probability ``match``; it proposes ``min(k, match length)`` tokens accepted as a chain with per-token
  acceptance ``a_r ~ Beta(accept, spread)``; no match → nothing proposed), or one added with
  :meth:`TokenOracle.add_stream`.

:class:`TokenOracle` and :class:`Drafter` (:mod:`.token_oracle`) are the package's interface. Its modules import
one another in the order store → distributions → scoring → streams → token_oracle; from outside it imports numpy,
:mod:`repro.core` (seeding, the tree types and the proposer kinds' stream names) only (and pandas to read a
recording).

Deviations (from a real draft model): ranks below the top-1 follow a deterministic geometric profile given
``p0`` (no per-position noise); positions are independent given the request level; off-path distributions
are shared among contexts that hash to the same of the ``NUM_ALT`` draws of a position.
"""

from repro.oracle.distributions import A0_MIN, P_FLOOR, reported_dist, sample_rank, true_dist
from repro.oracle.scoring import _top
from repro.oracle.store import (
    _ALT_MASK,
    _RANK_SALT,
    ALT_CHUNK,
    CHUNK,
    DRAFT_KEY,
    EAGLE_KEY,
    MAX_WIDTH,
    NUM_ALT,
    PLD_KEY,
    _mix,
)
from repro.oracle.token_oracle import Drafter, TokenOracle

__all__ = [
    "A0_MIN", "ALT_CHUNK", "CHUNK", "DRAFT_KEY", "EAGLE_KEY", "MAX_WIDTH", "NUM_ALT", "PLD_KEY", "P_FLOOR",
    "_ALT_MASK", "_RANK_SALT", "Drafter", "TokenOracle", "_mix", "_top", "reported_dist", "sample_rank", "true_dist",
]
