"""The engine's invariants (repro.sim.invariants, ``+engine.check_invariants=true``): every system config runs with
them checked (tests/test_systems_contract.py turns them on in its runs, on both engines and on both paths), and each
check fails when the mechanism it watches is broken, in one line naming the replica, the step, the request and the
quantity."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from repro.experiments.simulate import build, compose
from repro.sim.invariants import InvariantError
from repro.sim.kv import KvPool
from repro.sim.state import RUNNING, WAITING
from systems.vllm import VLLM
from tests.conftest import make_engine, make_requests

pytestmark = pytest.mark.usefixtures("no_data")


def _pressure(**kw: Any) -> Any:
    """Eight requests on a pool of 40 blocks under vLLM's scheduler: prefills, decodes, recompute preemptions."""
    return make_engine(VLLM(), make_requests(8, prompt_len=60, output_len=100), kv_blocks=40, check_invariants=True,
                       **kw)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled kernels", "NumPy"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "step by step"])
def test_a_run_under_kv_pressure_keeps_every_invariant(compiled: bool, fast: bool, use_jit: Any) -> None:
    """Both kernel paths and both engine paths pass the same checks."""
    use_jit(compiled)
    out = _pressure(fast_forward=fast).run()
    assert out.state.num_preemptions.sum() > 0  # the preemption checks ran


def _round_down(self: KvPool, rids: np.ndarray, tokens: np.ndarray) -> None:
    bs = self.block_size
    cur = self.s.kv_blocks[rids]
    need = np.maximum(tokens // bs, cur)  # the bug: rounds down
    self.s.kv_blocks[rids] = need
    self.used += int(need.sum() - cur.sum())


def _preempt_to_back(original: Callable[..., float]) -> Callable[..., float]:
    def preempt(self: KvPool, plan: Any, backend: Any, draft_resident: bool) -> float:
        out = original(self, plan, backend, draft_resident)
        ids = plan.preempt_ids.tolist()
        if ids and plan.preempt_mode != "swap":  # the bug: to the back of the waiting queue
            for rid in ids:
                self.s.waiting.remove(rid)
            self.s.waiting.extend(ids)
        return out
    return preempt


def _miscount(original: Callable[..., None]) -> Callable[..., None]:
    def release(self: KvPool, rids: np.ndarray) -> None:
        original(self, rids)
        self.used += 1 if rids.size else 0  # the bug: one block leaks on each release
    return release


@pytest.mark.parametrize(("patch", "message"), [
    ("allocate", r"request \d+: kv_blocks \d+ for \d+ computed tokens \(ceil over blocks of 16"),
    ("preempt", r"request \d+: preempted by recompute, not at the front of the waiting queue"),
    ("release", r"the pool counts \d+ blocks used, the requests hold \d+"),
], ids=["prefill blocks rounded down", "recompute rejoins at the back", "a block leaks on release"])
def test_breaking_a_mechanism_stops_the_run_in_one_line(patch: str, message: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each KV mechanism broken once: the run stops at the first step it shows, naming replica, step and request."""
    broken = {"allocate": _round_down, "preempt": _preempt_to_back(KvPool.preempt),
              "release": _miscount(KvPool.release)}[patch]
    monkeypatch.setattr(KvPool, patch, broken)
    with pytest.raises(InvariantError, match=r"^invariant broken: replica 0, step \d+") as err:
        _pressure().run()
    assert "\n" not in str(err.value)
    assert re.search(message, str(err.value)), str(err.value)


def _checker() -> Any:
    """A replica after a few steps of a small run, with its checker: the state the unit checks below break."""
    eng = make_engine(VLLM(), make_requests(4, prompt_len=40, output_len=30), check_invariants=True,
                      max_sim_time_s=0.2)
    eng.run()
    rep = eng.replicas[0]
    assert rep.checker is not None and (rep.s.status == RUNNING).any()
    return rep


@pytest.mark.parametrize(("breaks", "message"), [
    (lambda s, kv: s.num_generated.__setitem__(0, s.output_len[0] + 1), "generated 31 tokens of an output length 30"),
    (lambda s, kv: s.num_accepted.__setitem__(0, s.num_proposed[0] + 1), "accepted 1 of 0 proposed in all"),
    (lambda s, kv: s.first_token_at.__setitem__(0, s.arrival_s[0] - 1.0), "first token at"),
    (lambda s, kv: s.finish_at.__setitem__(0, s.first_token_at[0] - 1.0), "before its first token"),
    (lambda s, kv: setattr(kv, "used", kv.total + 1), "the pool counts"),
    (lambda s, kv: (s.status.__setitem__(0, WAITING)), "held while not running"),
], ids=["over the output length", "accepted over proposed", "first token before arrival", "finish before first",
        "pool over-committed", "blocks while waiting"])
def test_each_state_check_fails_when_broken(breaks: Callable[[Any, Any], None], message: str) -> None:
    rep = _checker()
    rep.checker.state()  # holds as the run left it
    breaks(rep.s, rep.kv)
    with pytest.raises(InvariantError, match="invariant broken: replica 0") as err:
        rep.checker.state()
    assert message in str(err.value), str(err.value)
    assert "pool" in message or "request 0:" in str(err.value), str(err.value)  # the request, where one is at fault


def test_each_step_check_fails_when_broken() -> None:
    """The per-step checks: time running backwards, and tokens emitted beyond accepted + 1."""
    from repro.sim.plan import StepPlan, StepResult

    rep = _checker()
    ids = np.flatnonzero(rep.s.status == RUNNING)[:1]
    one = np.ones(1, dtype=np.int64)
    res = StepResult(start_at=rep.checker.last_end - 1.0, end_at=rep.checker.last_end, decode_ids=ids,
                     num_proposed=one * 0, num_accepted=one * 0, num_emitted=one, prefill_ids=ids[:0],
                     finished_ids=ids[:0], draft_s=0.0, verify_s=0.0, memory_s=0.0, num_batched_tokens=1)
    with pytest.raises(InvariantError, match="before the previous step ended"):
        rep.checker.after_step(StepPlan(), res)
    later = rep.checker.last_end + 1.0
    res2 = StepResult(start_at=later, end_at=later + 0.01, decode_ids=ids, num_proposed=one * 2,
                      num_accepted=one * 1, num_emitted=one * 3, prefill_ids=ids[:0], finished_ids=ids[:0],
                      draft_s=0.0, verify_s=0.0, memory_s=0.0, num_batched_tokens=3)
    with pytest.raises(InvariantError, match=rf"request {int(ids[0])}: emitted 3 tokens with 1 drafts accepted"):
        rep.checker.after_step(StepPlan(), res2)


def test_off_by_default_and_named_in_the_config() -> None:
    """Off by default (the replica holds no checker: nothing is paid); +engine.check_invariants=true turns it on and
    does not change the point's config hash (checking a run does not change what it computes)."""
    from repro.experiments.results import config_hash

    plain = compose(["num_requests=20"])
    checked = compose(["num_requests=20", "+engine.check_invariants=true"])
    assert build(plain).engine.replicas[0].checker is None
    assert build(checked).engine.replicas[0].checker is not None
    assert config_hash(plain) == config_hash(checked)
