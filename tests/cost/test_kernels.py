"""The cost model's integer sums (repro/cost/kernels.py) on batches worked by hand, and the host costs a TP-1 draft
adds to a tensor-parallel target (repro/cost/model.py ``draft_broadcast_s``, repro/sim/proposers.py)."""

from __future__ import annotations

import numpy as np
import pytest

from repro.cost import kernels
from repro.cost.model import CostModel
from repro.cost.spec import load_hardware, load_model
from repro.sim.proposers import colocated


@pytest.mark.parametrize(("k", "ctx", "want"), [
    ([], [], (0, 0, 0, 0, 0)),
    ([0], [5], (0, 0, 1, 5, 6)),  # no speculation: one query token on 5 + 1
    ([1], [5], (1, 1, 2, 5, 2 * 7)),  # one speculated token: a query of 2
    # (1 + k)(ctx + 1 + k): 1·6 + 2·8 + 4·11 + 1·9 + 3·12 = 111
    ([0, 1, 3, 0, 2], [5, 6, 7, 8, 9], (3, 6, 4, 35, 111)),
])
def test_a_batch_of_chains_sums_as_worked_by_hand(k: list[int], ctx: list[int],
                                                  want: tuple[int, ...]) -> None:
    got = kernels.chain_terms(np.array(k, dtype=np.int64), np.array(ctx, dtype=np.int64))
    assert tuple(int(v) for v in got) == want


def _cost(tp: int, draft_tp: int, engine_cast_s: float = 2e-4) -> CostModel:
    from dataclasses import replace

    from repro.cost.serving import load_engine

    engine = replace(load_engine("vllm_v0"), draft_broadcast_s=engine_cast_s)
    return CostModel(load_hardware("h100-80g"), load_model("llama3-70b"), tp=tp, draft=load_model("llama3.2-1b"),
                     draft_tp=draft_tp, engine=engine)


@pytest.mark.parametrize(("tp", "draft_tp", "cast"), [(1, 1, 0.0), (2, 1, 2e-4), (4, 1, 2e-4), (2, 2, 0.0),
                                                      (4, 4, 0.0)])
def test_a_tp1_draft_beside_a_tensor_parallel_target_broadcasts_its_proposals(tp: int, draft_tp: int,
                                                                               cast: float) -> None:
    cost = _cost(tp, draft_tp)
    assert cost.draft_broadcast_s() == cast
    host = colocated(cost).resolve("draft").host_s
    assert cost.spec_round_s() > 0.0  # (vLLM v0: the round's bookkeeping is on the step's path)
    assert host(8) == pytest.approx(cost.spec_round_s() + cast, rel=1e-12, abs=0.0) and host(0) == 0.0
