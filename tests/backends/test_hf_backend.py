"""``backend=hf`` on tiny random-weight models (CPU, seconds): the two known acceptance cases, exactness of chain and
tree verification against the target's own greedy decoding for every kind of step a policy can plan, the recorded
acceptance replayed in the simulator, and the configuration errors a user can make. Skipped without the ``real``
extra (PyTorch + transformers). ``REPRO_TEST_DEVICE=cuda`` runs the same cases on a GPU (in float32, so that greedy
decoding is exact to compare)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="backend=hf needs PyTorch: pip install torch==2.13.0 (CPU build)")
pytest.importorskip("transformers", reason="backend=hf needs transformers: pip install -e '.[real]'")

import torch

from repro.core.errors import ConfigError
from repro.experiments.simulate import build, compose, requests_frame, run_point

# the subject does not depend on where the workload comes from: pinned to the embedded statistics
# (conftest.no_data), so CI's no-data pass need not repeat it
pytestmark = pytest.mark.usefixtures("no_data")

PROMPT, OUTPUT, N = 20, 24, 5
DEVICE = os.environ.get("REPRO_TEST_DEVICE", "cpu")
ROOT = Path(__file__).resolve().parents[2]
BASE = ("model=llama-68m", "model@draft=llama-68m", "workload=fixed", f"workload.input_len={PROMPT}",
        f"workload.output_len={OUTPUT}", f"num_requests={N}", "rps=50", "backend=hf", "backend.tiny=true",
        *(() if DEVICE == "cpu" else (f"backend.device={DEVICE}", "backend.dtype=float32")))


def _run(*overrides: str) -> tuple[Any, Any]:
    built = build(compose([*BASE, *overrides]))
    out = built.engine.run()
    return built, requests_frame(out, built.table)


def _greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """The target's own greedy continuation, one full forward per token (no cache, no batching)."""
    toks, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(n):
            t = int(model(input_ids=torch.tensor([toks], device=model.device)).logits[0, -1].argmax())
            toks.append(t)
            out.append(t)
    return out


def _assert_greedy_exact(built: Any) -> None:
    be = built.backend
    for rid in range(N):
        prompt = np.random.default_rng([0, rid]).integers(0, be.target.vocab, PROMPT).tolist()
        assert be.output_tokens(rid) == _greedy(be.target.model, prompt, OUTPUT), rid


@pytest.mark.parametrize("system, extra", [
    ("vllm", ()),                                              # plain decoding
    ("sarathi", ("system.token_budget=8",)),                   # chunked prefill: prompts of 20 in chunks of <= 8
    ("static_sd_k3", ()),                                      # chains from the draft model
    ("static_sd_pld_k3", ()),                                  # prompt lookup on the real tokens
    ("turbospec", ("model=llama2-7b",)),                       # adaptive chain lengths (its cost model: a 7B target)
    ("adaserve", ()),                                          # beam-search token trees
    ("specinfer", ()),                                         # SpecInfer's fixed expansion trees
    ("global_greedy", ()),                                     # the tree ablations
    ("static_sd_k3", ("model=qwen3-0.6b", "model@draft=qwen3-0.6b")),  # another family (Qwen3: q/k norms, GQA)
])
def test_verification_emits_exactly_the_targets_greedy_tokens(system: str, extra: tuple[str, ...]) -> None:
    built, req = _run(f"system={system}", "backend.draft_noise=0.1", *extra)
    assert (req["output_len"] == OUTPUT).all()
    _assert_greedy_exact(built)
    if system not in ("vllm", "sarathi"):
        assert req["num_proposed"].sum() > 0 and req["num_accepted"].sum() > 0  # it did speculate, and won some


def test_trees_are_verified_as_trees() -> None:
    built, req = _run("system=specinfer", "backend.draft_noise=0.1", "engine.record_steps=true")
    # SpecInfer's <1,1,3,1,1,1,1,1> expansion: 20 nodes per request, more than any chain it could accept
    assert (req["num_proposed"] / req["num_spec_steps"]).max() > 8
    steps = built.engine.tracer.records
    assert any(r.draft_s > 0 for r in steps)  # the policy's drafter (beam search on the draft) is charged


@pytest.mark.parametrize("system", ["static_sd_k3", "adaserve"])
def test_a_run_leaves_no_pass_cache_for_the_garbage_collector(system: str) -> None:
    """With Python's cyclic collector off, a run (chains, or the draft's beam trees and the target's tree passes)
    leaves no pass cache alive: each is freed with its pass. Before the fix this static-k run left 348 caches and
    layers, views of the pool among them; on a GPU they held the pools' memory until the collector ran."""
    import gc

    was = gc.isenabled()
    gc.collect()  # what earlier tests left
    gc.disable()
    try:
        built = build(compose([*BASE, f"system={system}", "backend.draft_noise=0.1"]))
        built.engine.run()
        alive = [type(o).__name__ for o in gc.get_objects() if type(o).__name__ in ("PassCache", "SlotLayer")]
        assert not alive, f"{len(alive)} pass caches and layers outlived their passes"
    finally:
        if was:
            gc.enable()


def test_a_draft_sharing_the_targets_weights_is_always_accepted() -> None:
    _, req = _run("system=static_sd_k3", "backend.share_weights=true")
    assert req["num_proposed"].sum() > 0
    assert (req["num_accepted"] == req["num_proposed"]).all()


def test_shared_weights_at_temperature_accept_everything_too() -> None:
    """Speculative sampling with q = p accepts every token (min(1, p/q) = 1)."""
    _, req = _run("system=static_sd_k3", "backend.share_weights=true", "backend.temperature=0.8")
    assert req["num_proposed"].sum() > 0
    assert (req["num_accepted"] == req["num_proposed"]).all()
    assert (req["output_len"] == OUTPUT).all()


def test_an_unrelated_random_draft_is_almost_never_accepted() -> None:
    _, req = _run("system=static_sd_k3", "backend.draft_seed=7")
    proposed, accepted = int(req["num_proposed"].sum()), int(req["num_accepted"].sum())
    assert proposed > 50
    assert accepted / proposed < 0.05  # vocabulary 512: a random agreement is ~0.2 %


def test_acceptance_falls_as_the_draft_drifts_from_the_target() -> None:
    rates = [_run("system=static_sd_k3", f"backend.draft_noise={x}")[1] for x in (0.05, 0.4)]
    acc = [float(r["num_accepted"].sum() / r["num_proposed"].sum()) for r in rates]
    assert acc[0] > acc[1] + 0.2


def test_threads_are_set_for_the_point_and_restored() -> None:
    import torch

    before = torch.get_num_threads()
    res = run_point(compose([*BASE, "system=vllm", "backend.threads=1"]))
    assert "backend=hf: 1 PyTorch thread(s) (backend.threads)" in res.notes
    assert torch.get_num_threads() == before and res.metrics["completed"] == N


def test_step_time_is_measured() -> None:
    """The engine's clock advances by the models' measured passes: a request's TPOT is a few CPU milliseconds at
    most, nothing like the cost model's A100, and every step's verify time is positive."""
    built, req = _run("system=vllm", "engine.record_steps=true")
    recs = built.engine.tracer.records
    assert all(r.verify_s > 0 for r in recs)
    assert all(r.draft_s == 0 for r in recs)  # no speculation, no drafting charged
    assert req["finish_at"].max() > req["arrival_s"].max()


def test_record_then_replay_accepts_the_same_tokens(tmp_path: Path) -> None:
    rec = tmp_path / "acceptance.parquet"
    common = ("system=static_sd_k3", "workload.output_len=40")
    real = run_point(compose([*BASE, *common, "backend.draft_noise=0.1", f"backend.record={rec}"]))
    sim_base = [o for o in BASE if not o.startswith("backend")]
    replay = run_point(compose([*sim_base, *common, "oracle=trace", f"oracle.path={rec}"]))
    a, b = real.requests, replay.requests
    assert a["num_proposed"].sum() > 0 and 0 < a["num_accepted"].sum() < a["num_proposed"].sum()
    assert a["num_proposed"].tolist() == b["num_proposed"].tolist()
    assert a["num_accepted"].tolist() == b["num_accepted"].tolist()
    # the recording says what it was made of, and a run it does not fit is refused in one line
    import pandas as pd

    meta = pd.read_parquet(rec).attrs["specrepro_recording"]
    assert meta["output_len"] == [40] * N and meta["target"] == "llama-68m" and meta["draft"]
    trace = [*sim_base, "system=static_sd_k3", "oracle=trace", f"oracle.path={rec}"]
    with pytest.raises(ConfigError, match=r"recorded with target 'llama-68m' .*not this run's 'llama2-7b'"):
        build(compose([*trace, "workload.output_len=40", "model=llama2-7b"]))
    with pytest.raises(ConfigError, match=r"5 of the run's 5 requests run past the recording .*request 0: 60 output "
                                          r"tokens, recorded request 0 covers 4[0-9].*oracle\.past_recording=miss"):
        build(compose([*trace, "workload.output_len=60"]))
    past = build(compose([*trace, "workload.output_len=60", "oracle.past_recording=miss"]))
    assert any("positions past it count as misses" in n for n in past.oracle.notes)


def test_the_recording_covers_every_output_position(tmp_path: Path) -> None:
    rec = tmp_path / "acceptance.parquet"
    run_point(compose([*BASE, "system=static_sd_k3", "backend.draft_noise=0.1", f"backend.record={rec}",
                       "backend.record_width=8"]))
    import pandas as pd

    df = pd.read_parquet(rec)
    assert set(df["rid"]) == set(range(N))
    per = df[df["pos"] < OUTPUT].groupby("rid")["pos"].nunique()
    assert (per == OUTPUT).all()
    assert df["rank"].between(0, 8).all() and df["p0"].between(0, 1).all()
    assert all(len(t) == 8 for t in df["top_tokens"])
    hit = df[df["rank"] < 8]
    assert all(int(row.top_tokens[row.rank]) == int(row.target_token) for row in hit.itertuples())


#: the systems docs/gpu.md's support table says backend=hf cannot run (EAGLE heads, remote draft servers)
REFUSED = {"static_sd_eagle_k1", "static_sd_eagle_k3", "static_sd_eagle_k5", "static_sd_eagle_k7", "turbospec_eagle",
           "goodspeed", "random_s", "random_s_whole", "fixed_s", "fixed_s_floor"}


def test_the_support_table_is_what_compose_time_checks_refuse() -> None:
    from repro.experiments.validate import check_point

    refused = set()
    for path in sorted((ROOT / "conf" / "system").glob("*.yaml")):
        try:
            check_point(compose([*BASE, f"system={path.stem}"]))
        except ConfigError:
            refused.add(path.stem)
    assert refused == REFUSED


@pytest.mark.parametrize("overrides, says", [
    # each refused when the point is checked (before anything runs), not at its first speculative step
    (("system=static_sd_eagle_k3",), "backend=hf has no EAGLE head (StaticSD drafts with system.proposer=eagle)"),
    (("system=specinfer", "backend.temperature=0.7"), "verifies token trees greedily only, and SpecInfer drafts trees"),
    (("system=random_s",), "RandomS drafts on remote draft servers"),
    (("system=static_sd_k3", "backend.tiny=false", "model=qwen2.5-7b", "model@draft=qwen2.5-0.5b"),
     "qwen2.5-0.5b has 151936 rows where qwen2.5-7b has 152064"),
])
def test_systems_backend_hf_cannot_run_are_refused_up_front(overrides: tuple[str, ...], says: str) -> None:
    from repro.experiments.validate import check_point

    with pytest.raises(ConfigError, match=re.escape(says)):
        check_point(compose([*BASE, *overrides]))


@pytest.mark.parametrize("overrides, says", [
    (("oracle=trace",), "oracle.path"),
    (("oracle=trace", "oracle.path=/nonexistent/rec.parquet"), "/nonexistent/rec.parquet"),
    (("backend=hf", "backend.target_path=/nonexistent/ckpt"), "/nonexistent/ckpt"),
    (("backend=hf", "backend.target_path=source", "model=vicuna-68m"), "double7/vicuna-68m"),  # not in the cache
    (("backend=hf", "backend.tiny=true", "engine.draft_servers=[{hardware: l4}]"), "draft_servers"),
])
def test_config_mistakes_are_named(overrides: tuple[str, ...], says: str) -> None:
    sim_base = [o for o in BASE if not o.startswith("backend")]
    with pytest.raises(ConfigError, match=says.replace(".", r"\.")):
        build(compose([*sim_base, *overrides]))


def _backend(n: int, prompt: int, **kw: Any) -> Any:
    from repro.backends.hf import HfBackend
    from repro.backends.models import build_model, noisy_copy

    target = build_model("llama-68m", tiny=True, seed=0)
    return HfBackend(target, noisy_copy(target, 0.1, seed=1), np.full(n, prompt), **kw)


def _exact(be: Any, n: int, prompt: int, output: int) -> None:
    for rid in range(n):
        ref = _greedy(be.target.model, np.random.default_rng([0, rid]).integers(0, be.target.vocab, prompt).tolist(),
                      output)
        assert be.output_tokens(rid) == ref, rid


@pytest.mark.parametrize("system", ["vllm", "static_sd_k3"])
def test_recompute_preemption_recomputes_for_real(system: str) -> None:
    """A KV pool of 12 blocks for 6 requests of 40 + 40 tokens: vLLM preempts by recompute; the real caches are
    dropped and rebuilt, and every request still emits exactly the target's greedy tokens."""
    from systems.static_sd import StaticSD
    from systems.vllm import VLLM
    from tests.conftest import make_engine, make_requests

    n, prompt, output = 6, 40, 40
    be = _backend(n, prompt)
    pol = VLLM() if system == "vllm" else StaticSD(k=3)
    eng = make_engine(pol, make_requests(n, prompt_len=prompt, output_len=output), kv_blocks=12, backend=be,
                      drafter=be.drafter)
    out = eng.run()
    assert out.state.num_preemptions.sum() > 0
    assert (out.state.num_generated == output).all()
    _exact(be, n, prompt, output)


def test_a_swap_moves_the_caches_and_decoding_resumes_exactly() -> None:
    from repro.sim.plan import StepPlan, ids
    from repro.sim.policy import Policy
    from tests.conftest import make_engine, make_requests

    class Swapper(Policy):
        """Prefill, decode twice, swap request 0 out, bring it back, then decode to the end."""

        def __init__(self) -> None:
            self.i = 0

        def schedule(self, view: Any) -> StepPlan:
            self.i += 1
            if self.i == 1:
                return StepPlan(prefill_ids=ids([0]), prefill_tokens=ids([12]))
            if self.i == 4:
                return StepPlan(preempt_ids=ids([0]), preempt_mode="swap")
            if self.i == 5:
                return StepPlan(swap_in_ids=ids([0]))
            return StepPlan(decode_ids=view.running, k=ids([2] * len(view.running)))

        def observe(self, result: object) -> None:
            pass

    be = _backend(1, 12)
    eng = make_engine(Swapper(), make_requests(1, prompt_len=12, output_len=10), backend=be, drafter=be.drafter,
                      record_steps=True)
    out = eng.run()
    assert out.state.num_preemptions[0] == 1 and out.state.num_generated[0] == 10
    _exact(be, 1, 12, 10)


def test_a_checkpoint_runs_the_same_attention_as_random_weights(tmp_path: Path) -> None:
    """A local checkpoint loads with the eager attention random weights use (exact tree masks; timings of a real
    model comparable with its random-weight stand-in's), and computes what the saved model computed."""
    from repro.backends.models import build_model

    random = build_model("llama-68m", tiny=True, seed=3)
    random.save_pretrained(tmp_path / "ckpt")
    loaded = build_model("llama-68m", path=str(tmp_path / "ckpt"))
    assert random.config._attn_implementation == loaded.config._attn_implementation == "eager"
    ids = torch.arange(7)[None]
    with torch.inference_mode():
        assert torch.equal(random(ids).logits, loaded(ids).logits)
