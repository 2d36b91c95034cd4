"""vLLM 0.6's speculation costs that grow with the batch (conf/engine/vllm_v0.yaml), worked at two batch sizes."""

from __future__ import annotations

import dataclasses

import pytest

from repro.cost.model import CostModel
from repro.cost.serving import load_engine
from repro.cost.spec import load_hardware, load_model
from repro.cost.step import decode_pass_s
from repro.sim.proposers import colocated


def _cost(tp: int = 4, **engine: object) -> CostModel:
    return CostModel(load_hardware("h100-80g"), load_model("llama3-70b"), tp=tp, draft=load_model("qwama-0.5b"),
                     engine=dataclasses.replace(load_engine("vllm_v0"), **engine))  # type: ignore[arg-type]


@pytest.mark.parametrize(("batch", "graphs"), [(32, True), (64, False)])
def test_batch_expansion_host_work_and_eager_scoring(batch: int, graphs: bool) -> None:
    """A k = 4 verify step of vLLM 0.6 over ``batch`` sequences at context 500 (Llama-3-70B, TP 4, H100):

    - the serial host work of speculation (no async output processing with speculation): spec_seq_s per sequence
      + spec_token_s per proposed token = 25 µs x batch + 1.5 µs x 4 x batch: 0.992 ms at 32, 1.984 ms at 64;
    - batch expansion's pass: batch x 5 single-query sequences, under CUDA graphs up to 256 of them (160 at batch 32)
      and eager past it (320 at batch 64): the eager pass pays the per-layer launch cost, 80 x 60 µs, instead of the
      graphs' 80 x 32 µs.
    """
    cost = _cost()
    quiet = _cost(spec_seq_s=0.0, spec_token_s=0.0)
    host = decode_pass_s(cost, batch, 500.0, 4) - decode_pass_s(quiet, batch, 500.0, 4)
    assert host == pytest.approx(batch * (25e-6 + 4 * 1.5e-6), rel=1e-9)
    graphed = _cost(graph_max_tokens=1024, spec_seq_s=0.0, spec_token_s=0.0)
    launches = decode_pass_s(quiet, batch, 500.0, 4) - decode_pass_s(graphed, batch, 500.0, 4)
    assert launches == (0.0 if graphs else pytest.approx(80 * (60e-6 - 32e-6), rel=1e-9))


@pytest.mark.parametrize(("tp", "broadcast_s"), [(4, 1.5e-4), (1, 0.0)])
def test_a_tp1_draft_broadcasts_its_proposals(tp: int, broadcast_s: float) -> None:
    """A TP-1 draft beside a target at TP 4 runs on the driver rank and broadcasts its proposals each step: 150 µs of
    host time per speculating step on vLLM 0.6 (none at TP 1, none for a step that does not speculate)."""
    cost = _cost(tp=tp)
    draft = colocated(cost).resolve("draft")
    assert cost.draft_broadcast_s() == broadcast_s
    assert draft.host_s(8) == cost.spec_round_s() + broadcast_s
    assert draft.host_s(0) == 0.0
