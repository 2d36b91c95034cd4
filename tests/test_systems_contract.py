"""One contract test over every conf/system/*.yaml: compose, instantiate, run ~50 requests, check the invariants."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from user_policies import USER_POLICIES

from repro.experiments.simulate import build, compose, requests_frame
from repro.sim.plan import StepResult
from repro.sim.state import Status

# the invariants hold whatever the workload's source: pinned to the embedded statistics (conftest.no_data)
pytestmark = pytest.mark.usefixtures("no_data")

SYSTEMS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "system").glob("*.yaml"))

# Systems that only run on a deployment of their own: GoodSpeed's need a remote draft server per client
_EDGE = ["hardware=h100-80g", "model=qwen3-14b", "model@draft=qwen3-0.6b", "workload=goodspeed_4",
         "workload.output_len=40",
         "engine.draft_servers=[" + ",".join(["{hardware:l4,rtt_ms:0.2,bandwidth_mbps:1000}"] * 4) + "]"]
DEPLOYMENT = {s: _EDGE for s in ("goodspeed", "fixed_s", "fixed_s_floor", "random_s", "random_s_whole")}


def _run(system: str, seed: int = 0) -> tuple[object, object, list[StepResult]]:
    cfg = compose([f"system={system}", "num_requests=50", "rps=8", f"seed={seed}", "workload.source=embedded",
                   *DEPLOYMENT.get(system, []), "+engine.check_invariants=true"])  # repro.sim.invariants, every step
    built = build(cfg)
    seen: list[StepResult] = []
    pol = built.engine.replicas[0].policy
    inner = pol.observe

    def spy(result: StepResult) -> None:
        seen.append(result)
        inner(result)

    for rep in built.engine.replicas:
        rep.policy.observe = spy  # type: ignore[method-assign]
    out = built.engine.run()
    return built, out, seen


@pytest.mark.parametrize("system", SYSTEMS)
def test_system_contract(system: str) -> None:
    built, out, seen = _run(system)
    s = out.state  # type: ignore[attr-defined]
    table = built.table  # type: ignore[attr-defined]
    # every request finishes with exactly its reference length
    assert (s.status == Status.FINISHED).all(), f"{system}: unfinished requests"
    assert (s.num_generated == table.output_len).all()
    # budgets held: no KV left allocated, accepted never exceeds proposed
    assert all(r.used_blocks == 0 for r in built.engine.replicas)  # type: ignore[attr-defined]
    assert (s.num_accepted <= s.num_proposed).all()
    # no request emits more than its speculation + 1 tokens in a step
    for r in seen:
        assert (r.num_emitted <= r.num_proposed + 1).all()
        assert (r.num_emitted >= 1).all()
        assert r.end_at > r.start_at or r.num_batched_tokens == 0
    # timestamps are consistent
    assert (s.first_token_at >= s.arrival_s).all() and (s.finish_at >= s.first_token_at).all()


@pytest.mark.parametrize("system", SYSTEMS)
def test_system_is_deterministic(system: str) -> None:
    _, a, _ = _run(system, seed=3)
    built, b, _ = _run(system, seed=3)
    fa = requests_frame(a, built.table)  # type: ignore[arg-type]
    fb = requests_frame(b, built.table)  # type: ignore[arg-type]
    assert fa.equals(fb)
    assert np.isclose(a.sim_time_s, b.sim_time_s)  # type: ignore[attr-defined]


@pytest.mark.parametrize("system", SYSTEMS)
def test_own_construction_equals_hydra(system: str) -> None:
    """A suite policy built directly from its config equals the one Hydra's instantiate builds (every system)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from repro.experiments.instantiate import _own_policy, instantiate_system
    from repro.experiments.results import DISPLAY_KEYS

    node = compose([f"system={system}"]).system
    plain = {str(k): v for k, v in OmegaConf.to_container(node, resolve=True).items()  # type: ignore[union-attr]
             if k not in DISPLAY_KEYS}
    own, hydra = _own_policy(plain), instantiate(plain)
    if own is None:  # a nested node or a list: Hydra's to build
        assert any(isinstance(v, (dict, list)) for v in plain.values()), f"{system}: not built directly"
        return
    assert type(own) is type(hydra)

    def shown(p: object) -> dict[str, object]:  # plain values compared, objects by their type
        return {k: v if isinstance(v, (int, float, str, bool, type(None), tuple, list)) else type(v)
                for k, v in vars(p).items()}

    assert shown(own) == shown(hydra)
    assert type(instantiate_system(node)) is type(hydra)


def test_own_construction_leaves_others_to_hydra() -> None:
    from repro.experiments.instantiate import _own_policy

    assert _own_policy({"_target_": "collections.OrderedDict"}) is None  # not the suite's: Hydra's target policy
    assert _own_policy({"_target_": "systems.vllm.VLLM", "_partial_": True}) is None
    assert _own_policy({"_target_": "systems.vllm.VLLM", "x": {"y": 1}}) is None


def _frame(system: str, fast: bool, *extra: str) -> tuple[object, float]:
    cfg = compose([f"system={system}", "num_requests=50", "rps=8", "seed=1", "workload.source=embedded",
                   *DEPLOYMENT.get(system, []), *extra, f"+engine.fast_forward={'true' if fast else 'false'}",
                   "+engine.check_invariants=true"])  # on both paths and both engines (repro.sim.invariants)
    built = build(cfg)
    out = built.engine.run()
    return requests_frame(out, built.table), out.sim_time_s


@pytest.mark.parametrize("engine", [[], ["engine=vllm_v1", "engine.async_scheduling=true"]],
                         ids=["own engine", "vLLM V1, async"])
@pytest.mark.parametrize("system", SYSTEMS)
def test_fast_path_equals_step_path(system: str, engine: list[str]) -> None:
    """Every system, on its own engine and on vLLM V1 with async scheduling (arrivals seen a step later, first
    drafts, the API server): the run with the fast path (repro.sim.fastforward, the lean steps) equals the run without
    it, request by request."""
    fast, fast_end = _frame(system, True, *engine)
    slow, slow_end = _frame(system, False, *engine)
    assert fast.equals(slow), system  # type: ignore[attr-defined]
    assert fast_end == slow_end


@pytest.mark.parametrize("name", sorted(USER_POLICIES))
def test_fast_path_equals_step_path_for_a_users_subclass(name: str) -> None:
    """A user's subclass of a system (tests/user_policies.py, the recipe's example among them) runs the same with the
    fast path on and off. The recipe's MyPolicy changes k with the batch while its parent StaticSD promises a repeated
    plan: it overrides schedule and declares no promise, so it keeps none (Policy.__init_subclass__); were StaticSD's
    promises inherited, the fast path would propose about 7x the tokens and end 2 s early."""
    target, base, fast_path = USER_POLICIES[name]
    overrides = [f"system._target_={target}"]
    frames = []
    for fast in (True, False):
        cfg = compose([f"system={base}", "num_requests=50", "rps=8", "seed=1", "workload.source=embedded", *overrides,
                       f"+engine.fast_forward={'true' if fast else 'false'}", "+engine.check_invariants=true"])
        built = build(cfg)
        assert type(built.engine.replicas[0].policy).__name__ == name
        if fast:
            assert built.engine.replicas[0].fast_forward is fast_path, name
        out = built.engine.run()
        frames.append((requests_frame(out, built.table), out.sim_time_s))
    (fast_frame, fast_end), (slow_frame, slow_end) = frames
    assert fast_frame.equals(slow_frame), name  # type: ignore[attr-defined]
    assert fast_end == slow_end
