"""Proposers: what drafts a step's speculated tokens; the engine, step costing and oracle ask them, not names.

A proposer says:
- how its drafting is costed: the cost model its passes run on and their coefficient set (``which``: the draft
  model's or the EAGLE head's); prompt lookup costs host time only; a remote draft server adds the round trip;
- ``stream``: the token-oracle stream its acceptance is drawn from;
- ``resident``: whether its weights must be resident in the replica's GPU memory;
- ``keeps_kv``: whether it keeps its own KV cache, which must catch up on the tokens it missed;
- ``proposes_first``: whether its proposal is fixed before the target's pass (prompt lookup: only matched tokens
  are verified and need KV).

Four kinds:

- :class:`DraftModel`: a small model co-located with the target (its ``cost.draft`` coefficients), with its own KV
  cache; its weights take the replica's memory while resident.
- :class:`EagleHead`: one decoder layer plus an fc layer on the target's features (``cost``'s EAGLE coefficients), on
  the target's GPUs; it reads the target's KV and keeps no cache of its own to catch up.
- :class:`PromptLookup`: n-gram matching against the prompt on the host (:meth:`CostModel.pld_s`); it proposes a
  request's continuation only where a match exists.
- :class:`RemoteDraftServer`: a draft model on its own hardware (GoodSpeed), reached over the network: its passes
  are priced by its own cost model (the server's GPU and draft model), then the uplink of its drafts and their
  distributions (half the round trip ``rtt_s`` plus the bytes over ``bandwidth_bps``); the step ends with the
  downlink of the accepted tokens (the other half, ``StepResult.send_s``); it takes nothing from the replica's
  memory. Each server names its own oracle stream, so heterogeneous servers can accept differently
  (the default is the run's draft model's stream).

A replica's proposers (:class:`Proposers`) are built by its deployment (:mod:`repro.sim.deployment`) around the
replica's cost model: the co-located ones by name (``draft``, ``eagle``, ``pld``, the names systems' configs use) and
the deployment's remote draft servers by index. A policy names a proposer in its plan (``StepPlan.proposer="draft"``) or
passes one of the objects its context holds (``PolicyContext.proposers``); ``StepPlan.draft_server`` places
requests on remote servers, which then draft (and are scored) for those requests instead of the plan's proposer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from repro.core.errors import PlanError
from repro.core.speculation import DRAFT as DRAFT  # the names policies use; each is the oracle's stream of that name
from repro.core.speculation import EAGLE as EAGLE
from repro.core.speculation import PLD as PLD
from repro.core.speculation import trees_at

if TYPE_CHECKING:
    from repro.cost.model import CostModel, Which
    from repro.cost.spec import HardwareSpec
    from repro.cost.step import DecodeBatch
    from repro.oracle import TokenOracle



@dataclass(frozen=True, eq=False)
class Proposer:
    """Base of the proposer kinds; the class attributes describe the kind (module docstring).

    ``cost`` prices its drafting, ``name`` is what plans call it, ``stream`` is the oracle stream of its acceptance.
    """

    cost: CostModel
    name: str
    stream: str

    which: ClassVar[Which | None] = None  # coefficient set of its passes on ``cost``; None: it runs on the host
    resident: ClassVar[bool] = False  # needs its weights (and KV) in the replica's GPU memory to draft there
    keeps_kv: ClassVar[bool] = False  # keeps its own KV cache per request (catch-up, ``draft_sync``)
    proposes_first: ClassVar[bool] = False  # what it proposes is known before verification
    remote: ClassVar[bool] = False  # runs on its own hardware, reached over the network

    def host_s(self, num_seqs: int) -> float:
        """Host seconds of one step's proposing for ``num_seqs`` requests: a model-based proposer's per-round
        bookkeeping (once per step that speculates; :meth:`CostModel.spec_round_s`)."""
        return self.cost.spec_round_s() if num_seqs else 0.0


@dataclass(frozen=True, eq=False)
class DraftModel(Proposer):
    """A draft model co-located with the target (``cost.draft`` on the replica's GPUs)."""

    name: str = DRAFT
    stream: str = DRAFT

    which: ClassVar[Which] = "draft"
    resident: ClassVar[bool] = True
    keeps_kv: ClassVar[bool] = True

    def host_s(self, num_seqs: int) -> float:
        """The per-round bookkeeping, and the broadcast of a TP-1 draft's proposals to the target's other ranks
        (:meth:`CostModel.draft_broadcast_s`)."""
        if not num_seqs:
            return 0.0
        cast = self.cost.draft_broadcast_s()
        return self.cost.spec_round_s() + cast if cast else self.cost.spec_round_s()


@dataclass(frozen=True, eq=False)
class EagleHead(Proposer):
    """An EAGLE head on the target's GPUs (``cost``'s EAGLE coefficients)."""

    name: str = EAGLE
    stream: str = EAGLE

    which: ClassVar[Which] = "eagle"


@dataclass(frozen=True, eq=False)
class PromptLookup(Proposer):
    """Prompt lookup decoding: CPU n-gram matching, priced per step and per request asked, matched or not."""

    name: str = PLD
    stream: str = PLD

    proposes_first: ClassVar[bool] = True

    def host_s(self, num_seqs: int) -> float:
        return self.cost.pld_s(num_seqs)


@dataclass(frozen=True, eq=False)
class RemoteDraftServer(Proposer):
    """A draft model on its own GPU(s), ``rtt_s`` away (GoodSpeed).

    ``cost`` is the server's cost model: its ``draft`` coefficients run on ``cost.draft_hardware`` with
    ``cost.draft_tp`` GPUs.
    """

    name: str = "remote"
    stream: str = DRAFT
    rtt_s: float = 0.0
    bandwidth_bps: float = float("inf")  # the server's network link, bits per second each way

    which: ClassVar[Which] = "draft"
    keeps_kv: ClassVar[bool] = True
    remote: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.rtt_s < 0.0:
            raise ValueError(f"draft server {self.name!r}: rtt_s must be >= 0, not {self.rtt_s}")
        if not self.bandwidth_bps > 0.0:
            raise ValueError(f"draft server {self.name!r}: bandwidth_bps must be > 0, not {self.bandwidth_bps}")

    def uplink_s(self, num_tokens: int) -> float:
        """Sending ``num_tokens`` drafts to the verifier: half the round trip, then each token's id (4 bytes) and
        the draft's distribution over its vocabulary (fp16) over the link (GoodSpeed Algorithm 1 line 10)."""
        vocab = self.cost.draft.vocab_size if self.cost.draft is not None else 0
        return self.rtt_s / 2.0 + num_tokens * (4 + 2 * vocab) * 8.0 / self.bandwidth_bps

    def downlink_s(self, num_tokens: int) -> float:
        """Sending ``num_tokens`` accepted tokens and the next allocation back: half the round trip plus 4 bytes
        each (GoodSpeed step 6)."""
        return self.rtt_s / 2.0 + (num_tokens + 1) * 4 * 8.0 / self.bandwidth_bps

    @property
    def hardware(self) -> HardwareSpec:
        """The server's GPU (its draft model's hardware; the target's where the cost model gives none)."""
        return self.cost.draft_hardware or self.cost.hardware


class Proposers(Mapping[str, Proposer]):
    """One replica's proposers: the co-located ones by name, and the deployment's remote draft servers by index
    (``remote[i]`` is what ``StepPlan.draft_server == i`` places a request on). A step's drafts are scored on the
    stream of whichever drafted each request (:meth:`placement`, :meth:`score`, :meth:`accept_prob`)."""

    __slots__ = ("_by_name", "remote")

    def __init__(self, local: Iterable[Proposer], remote: Sequence[RemoteDraftServer] = ()) -> None:
        self._by_name = {p.name: p for p in local}
        self.remote: tuple[RemoteDraftServer, ...] = tuple(remote)

    def __getitem__(self, name: str) -> Proposer:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def resolve(self, proposer: str | Proposer) -> Proposer:
        """The object a plan's ``proposer`` means: a name of this replica's, or an object passed as is."""
        if isinstance(proposer, Proposer):
            return proposer
        found = self._by_name.get(proposer)
        if found is None:
            raise PlanError(f"unknown proposer {proposer!r} (this replica has {sorted(self._by_name)})")
        return found

    def placement(self, draft_server: np.ndarray | None, decode_ids: np.ndarray) -> np.ndarray | None:
        """The remote draft server each decoding request drafts on (-1: the plan's proposer, locally), from a plan's
        ``draft_server`` and ``decode_ids``; ``None`` when the plan places none (or the deployment has no servers:
        everything drafts locally)."""
        if draft_server is None or not self.remote:
            return None
        servers = np.asarray(draft_server, dtype=np.int64)
        if servers.shape != decode_ids.shape or (servers.size and servers.max() >= len(self.remote)):
            raise PlanError(f"draft_server must give a server index below {len(self.remote)} (or -1) per decode id")
        return servers

    def score(self, oracle: TokenOracle, prop: Proposer, servers: np.ndarray | None,
              dec: DecodeBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draft tokens scored, accepted (the leading ones) and matched (every position whose token is the
        target's; for a tree, the accepted path) per decoding request, from the oracle (chains batched), each request
        on the stream of the proposer that drafted it: the plan's ``prop``, or the remote draft server ``servers``
        placed it on."""
        if dec.first is not None:  # decided before the step (prompt lookup: see Replica._begin_decode)
            return dec.first
        n = dec.ids.size
        if n and servers is None and not dec.trees and np.count_nonzero(dec.k) == n:  # every request one chain
            proposed, accepted, matched = oracle.score_chain(dec.ids, dec.gen, dec.k, prop)
            if np.count_nonzero(np.maximum(accepted, matched) > proposed):
                raise PlanError("oracle accepted more tokens than proposed")
            return proposed, accepted, matched
        chain = dec.k > 0
        proposed = np.zeros(n, dtype=np.int64)
        accepted = np.zeros(n, dtype=np.int64)
        matched = np.zeros(n, dtype=np.int64)
        if n == 0 or not chain.any():
            return proposed, accepted, matched
        if dec.trees:
            found = trees_at(dec.trees, dec.ids.tolist())
            at = [i for i, _ in found]
            if at:
                chain[at] = False
                proposed[at] = [t.nodes.shape[0] for _, t in found]
            if servers is None:  # scored together on the plan's proposer
                local, local_trees = at, [t for _, t in found]
            else:
                local, local_trees = [], []
                for i, t in found:
                    if servers[i] < 0:
                        local.append(i)
                        local_trees.append(t)
                    else:
                        accepted[i] = matched[i] = oracle.accept_tree(t, self.remote[servers[i]])
            if local:
                got = oracle.accept_trees(local_trees, prop)
                accepted[local] = matched[local] = got
        if chain.any():
            if servers is None:
                proposed[chain], accepted[chain], matched[chain] = oracle.score_chain(
                    dec.ids[chain], dec.gen[chain], dec.k[chain], prop)
            else:
                for srv in np.unique(servers[chain]).tolist():
                    m = chain & (servers == srv)
                    proposed[m], accepted[m], matched[m] = oracle.score_chain(
                        dec.ids[m], dec.gen[m], dec.k[m], prop if srv < 0 else self.remote[srv])
        if (accepted > proposed).any() or (matched > proposed).any():
            raise PlanError("oracle accepted more tokens than proposed")
        return proposed, accepted, matched

    def accept_prob(self, oracle: TokenOracle, prop: Proposer, servers: np.ndarray | None,
                    dec: DecodeBatch) -> np.ndarray:
        """Per decoding request, the verifier's Σ min(1, p/q) over its drafted chain (0 without one; trees and
        prompt lookup: not computed), each on the stream of the proposer that drafted it."""
        out = np.zeros(dec.ids.size)
        chain = dec.k > 0
        if dec.trees or prop.proposes_first or not chain.any():
            return out
        for srv in (np.unique(servers[chain]).tolist() if servers is not None else [-1]):
            m = chain if servers is None else chain & (servers == srv)
            by = prop if srv < 0 else self.remote[srv]
            out[m] = oracle.accept_prob_sum(dec.ids[m], dec.gen[m], dec.k[m], by)
        return out

    def downlink_s(self, servers: np.ndarray | None, dec: DecodeBatch, accepted: np.ndarray) -> float:
        """The downlink after verification: every remote draft server that drafted this step gets its requests'
        accepted tokens and its next allocation back (``RemoteDraftServer.downlink_s``); the slowest sets the time."""
        if servers is None or not dec.ids.size:
            return 0.0
        t = 0.0
        drafted = dec.drafted
        for srv in np.unique(servers[drafted & (servers >= 0)]).tolist():
            m = servers == srv
            t = max(t, self.remote[srv].downlink_s(int(accepted[m].sum()) + int(m.sum())))
        return t


def colocated(cost: CostModel, remote: Sequence[RemoteDraftServer] = ()) -> Proposers:
    """The proposers of a replica whose target runs on ``cost``: its draft model, EAGLE head and prompt lookup, plus
    the given remote draft servers."""
    return Proposers((DraftModel(cost), EagleHead(cost), PromptLookup(cost)), remote)
