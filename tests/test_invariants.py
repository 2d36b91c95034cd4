"""The engine's invariants (repro.sim.invariants, ``+engine.check_invariants=true``): every system config runs with
them checked (tests/test_systems_contract.py turns them on in its runs, on both engines and on both paths), and each
check fails when the mechanism it watches is broken, in one line naming the replica, the step, the request and the
quantity."""

from __future__ import annotations

import dataclasses
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


def _bare(n: int = 12) -> Any:
    """A replica's state without an engine: ``n`` requests, 0..3 running with 10 tokens computed (one block of 16
    each) and 4 of 6 generated, the rest waiting in id order; a pool of 100 blocks with those 4 used."""
    from types import SimpleNamespace

    from repro.sim.invariants import InvariantChecker
    from repro.sim.state import RequestState

    s = RequestState(**make_requests(n, prompt_len=7, output_len=6))
    s.status[:4] = RUNNING
    s.running.extend(range(4))
    s.waiting.extend(range(4, n))
    s.num_computed[:4] = 10
    s.num_generated[:4] = 4
    s.kv_blocks[:4] = 1
    kv = SimpleNamespace(used=4, total=100, block_size=16)
    return InvariantChecker(SimpleNamespace(index=2, num_steps=7, s=s, kv=kv))


def _decoded(ids: list[int], proposed: list[int], accepted: list[int], emitted: list[int]) -> Any:
    from repro.sim.plan import StepResult

    a = np.asarray
    return StepResult(start_at=0.0, end_at=0.0, decode_ids=a(ids), num_proposed=a(proposed), num_accepted=a(accepted),
                      num_emitted=a(emitted), prefill_ids=a([], dtype=np.int64), finished_ids=a([], dtype=np.int64),
                      draft_s=0.0, verify_s=0.0, memory_s=0.0, num_batched_tokens=0)


def _finish(s: Any, rid: int, generated: int) -> Any:
    from repro.sim.state import FINISHED

    s.status[rid] = FINISHED
    s.num_generated[rid] = generated
    return s


@pytest.mark.parametrize(("step", "setup", "message"), [
    (([0, 1], [2, 2], [1, 2], [2, 3]), None, None),  # accepted + 1 each
    (([0, 1], [1, 1], [1, 2], [2, 3]), None, "request 1: accepted 2 of 1 proposed draft tokens"),
    (([0, 1], [1, 1], [0, -1], [1, 0]), None, "request 1: accepted -1 draft tokens"),
    (([0, 1], [0, 2], [0, 0], [1, 0]), None, "request 1: emitted 0 tokens in a verified step"),
    (([0, 1], [2, 2], [1, 1], [2, 3]), None,
     "request 1: emitted 3 tokens with 1 drafts accepted (at most accepted + 1)"),
    (([0, 1], [3, 3], [3, 2], [1, 3]), None, "request 0: emitted 1 tokens with 3 drafts accepted, and the request did "
     "not finish (accepted + 1 expected)"),
    (([0, 1], [2, 2], [2, 2], [3, 2]), None, "request 1: emitted 2 tokens with 2 drafts accepted, and the request did "
     "not finish (accepted + 1 expected)"),  # one token short
    (([0, 1], [3, 3], [3, 2], [2, 3]), lambda s: _finish(s, 0, 6), None),  # cut off where it finished
    (([0, 1], [3, 3], [3, 3], [2, 1]), lambda s: (_finish(s, 0, 6), _finish(s, 1, 5)), "request 1: emitted 1 tokens "
     "with 3 drafts accepted, and the request did not finish (accepted + 1 expected)"),  # finished short of its length
    (([0, 1], [3, 3], [3, 3], [2, 1]), lambda s: (_finish(s, 0, 6), s.num_generated.__setitem__(1, 6)),
     "request 1: emitted 1 tokens with 3 drafts accepted, and the request did not finish"),  # at its length, running
], ids=["holds", "accepted over proposed", "negative", "nothing emitted", "over accepted + 1", "cut short",
        "one short", "cut at the end", "finished early", "at its length, running"])
def test_the_token_checks_name_the_request_and_the_quantity(step: tuple[list[int], ...],
                                                             setup: Callable[[Any], None] | None,
                                                             message: str | None) -> None:
    checker = _bare()
    if setup is not None:
        setup(checker.r.s)
    if message is None:
        checker._tokens(_decoded(*step))
        return
    with pytest.raises(InvariantError) as err:
        checker._tokens(_decoded(*step))
    assert str(err.value).startswith(f"invariant broken: replica 2, step 7, {message}"), str(err.value)


def _swapped(s: Any, rids: list[int]) -> None:
    from repro.sim.state import SWAPPED

    for rid in rids:
        s.status[rid] = SWAPPED


def _requeued(s: Any, rids: list[int]) -> Any:
    """Preempted by recompute as vLLM does it: waiting at the front in the given order, nothing computed."""
    for rid in reversed(rids):
        s.status[rid] = WAITING
        s.running.remove(rid)
        s.waiting.appendleft(rid)
        s.num_computed[rid] = 0
    return s


@pytest.mark.parametrize(("mode", "ids", "setup", "message"), [
    ("swap", [1, 2], lambda s: _swapped(s, [1, 2]), None),
    ("swap", [1, 2], lambda s: _swapped(s, [1]), "request 2: preempted by swap, not in the swapped queue"),
    ("recompute", [2, 1], lambda s: _requeued(s, [2, 1]), None),
    ("recompute", [2, 1], lambda s: _requeued(s, [2]), "request 1: preempted by recompute, not waiting after the step"),
    ("recompute", [2, 1], lambda s: _requeued(s, [1, 2]), "request 2: preempted by recompute, not at the front of the "
     "waiting queue in the plan's order (front: [1, 2])"),
    ("recompute", [1, 2], lambda s: (_requeued(s, [1, 2]), s.waiting.rotate(-2)), "request 1: preempted by recompute, "
     "not at the front of the waiting queue in the plan's order (front: [4, 5])"),
    ("recompute", [2, 1], lambda s: (_requeued(s, [2, 1]), s.num_computed.__setitem__(1, 3)), "request 1: preempted by "
     "recompute with 3 tokens still computed"),
    ("recompute", [*range(4, 12), 13], lambda s: s.status.__setitem__(slice(4, None), WAITING), "request 13: "
     "preempted by recompute, not at the front of the waiting queue in the plan's order (front: [4, 5, 6, 7, 8, 9, "
     "10, 11])"),  # nine named, 4..11 and 13, before 12 in the queue: the first eight of the front shown
], ids=["swap holds", "not swapped", "recompute holds", "still running", "out of order", "behind others",
        "still computed", "front shown to eight"])
def test_the_preemption_checks_follow_the_schedulers_rule(mode: str, ids: list[int],
                                                          setup: Callable[[Any], None],
                                                          message: str | None) -> None:
    from repro.sim.plan import StepPlan

    checker = _bare(14)
    setup(checker.r.s)
    plan = StepPlan(preempt_ids=np.asarray(ids), preempt_mode=mode)  # type: ignore[arg-type]
    if message is None:
        checker._preempted(plan)
        return
    with pytest.raises(InvariantError) as err:
        checker._preempted(plan)
    assert str(err.value) == f"invariant broken: replica 2, step 7, {message}"


def test_the_state_and_time_checks_hold_at_their_bounds_and_name_what_broke() -> None:
    from repro.sim.plan import StepPlan, StepResult

    checker = _bare()
    s, kv = checker.r.s, checker.r.kv
    s.first_token_at[:4] = s.arrival_s[:4]  # a first token at its arrival, a finish at its first token: both hold
    s.finish_at[0] = s.first_token_at[0]
    checker.state()

    def fails(message: str) -> None:
        with pytest.raises(InvariantError) as err:
            checker.state()
        assert str(err.value) == f"invariant broken: replica 2, step 7{message}"

    kv.total = 3
    fails(": KV blocks used 4 outside [0, 3]")  # the pool's fault: no request named
    kv.total, kv.used, s.kv_blocks[2] = 100, 5, 2
    fails(", request 2: kv_blocks 2 for 10 computed tokens (ceil over blocks of 16: 1)")
    s.kv_blocks[2], kv.used = 1, 4
    step = StepResult(start_at=1.0, end_at=1.0, decode_ids=np.zeros(0, dtype=np.int64),
                      num_proposed=np.zeros(0, dtype=np.int64), num_accepted=np.zeros(0, dtype=np.int64),
                      num_emitted=np.zeros(0, dtype=np.int64), prefill_ids=np.zeros(0, dtype=np.int64),
                      finished_ids=np.zeros(0, dtype=np.int64), draft_s=0.0, verify_s=0.0, memory_s=0.0,
                      num_batched_tokens=0)
    checker.after_step(StepPlan(), step)  # a step of no time, right after the last: holds
    checker.after_run(1.0, 1.0)  # likewise a run
    eps = 1e-9  # the slack for sums of float seconds: a time that far behind still holds
    checker.after_step(StepPlan(), dataclasses.replace(step, start_at=1.0 - eps, end_at=(1.0 - eps) - eps))
    checker.last_end = 1.0
    checker.after_run(1.0 - eps, (1.0 - eps) - eps)
    s.first_token_at[1] = s.arrival_s[1] - eps
    s.finish_at[1] = s.first_token_at[1] - eps
    checker.state()
    for call, message in ((lambda: checker.after_step(StepPlan(), dataclasses.replace(step, start_at=0.5, end_at=2.0)),
                           "step starts at 0.5 s, before the previous step ended at 1 s"),
                          (lambda: checker.after_step(StepPlan(), dataclasses.replace(step, start_at=3.0, end_at=2.5)),
                           "step ends at 2.5 s, before it starts at 3 s"),
                          (lambda: checker.after_run(0.25, 5.0), "run starts at 0.25 s, before the previous step "
                           "ended at 1 s"),
                          (lambda: checker.after_run(4.0, 3.5), "run ends at 3.5 s, before it starts at 4 s")):
        checker.last_end = 1.0
        with pytest.raises(InvariantError) as err:
            call()
        assert str(err.value) == f"invariant broken: replica 2, step 7: {message}"
