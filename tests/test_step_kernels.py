"""The step path's compiled kernels (``repro.sim.kernels``, ``repro.oracle.kernels.chain_scores``) against their
NumPy references: whole simulations run step by step with the kernels on and off leave the same state and step
trace, bit for bit, over the step-by-step systems of every family and the situations that exercise each branch
(chains of every length, no speculation, prompt lookup, trees, a draft cache kept in step, KV pressure with
preemption, finishes, a request whose prompt completes in its decode step)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from repro.experiments.simulate import build, compose
from repro.oracle import TokenOracle
from repro.sim.engine import SimOutput
from tests.test_fast_forward import STATE

pytestmark = [pytest.mark.usefixtures("no_data"), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WORKLOAD = ["workload=sharegpt", "num_requests=40", "seed=2", "+engine.fast_forward=false"]
PRESSURE = ["workload=sharegpt", "num_requests=60", "seed=1", "+engine.fast_forward=false"]
SCENARIOS = {
    "turbospec, draft model": ["system=turbospec", "rps=4", *WORKLOAD],
    "turbospec, KV pressure (preemption; the proposal's blocks do not all fit)": [
        "system=turbospec", "rps=8", "engine.gpu_memory_utilization=0.22", *PRESSURE],
    "turbospec, prompt lookup (proposes before verification)": ["system=turbospec", "system.proposer=pld",
                                                                 "workload=sonnet", "rps=2", "num_requests=30"],
    "nightjar (switches speculation off and on, draft cache catch-up)": ["system=nightjar", "rps=12", *WORKLOAD],
    "adaserve (token trees)": ["system=adaserve", "workload=adaserve_mix", "rps=3", "num_requests=30", "seed=2"],
    "static k=3 step by step, KV pressure (preemption)": ["system=static_sd_k3", "rps=8",
                                                          "engine.gpu_memory_utilization=0.22", *PRESSURE],
    "vllm step by step (no speculation)": ["system=vllm", "rps=3", *WORKLOAD],
    "sarathi step by step (chunked prefill beside decodes)": ["system=sarathi", "rps=4", *WORKLOAD],
    "laps_sd (per-request chain lengths)": ["system=laps_sd", "model=llama2-7b", "model@draft=llama-68m",
                                            "hardware=l20", "workload=mbpp", "rps=2", "num_requests=30"],
    "tetris (greedy chains, the batch's most probable prefixes verified)": ["system=tetris", "rps=6", *WORKLOAD],
    "static k=3 with EAGLE, step trace": ["system=static_sd_eagle_k3", "model=llama3-8b", "hardware=h100-80g",
                                         "engine.record_steps=true", "rps=4", *WORKLOAD],
}


def _run(overrides: list[str]) -> SimOutput:
    cfg = compose([*overrides, "engine.record_steps=true"])
    return build(cfg).engine.run()


@pytest.mark.parametrize("overrides", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_compiled_step_kernels_equal_their_numpy_references(use_jit: Any, overrides: list[str]) -> None:
    pytest.importorskip("numba")
    use_jit(False)
    ref = _run(overrides)
    use_jit(True)
    got = _run(overrides)
    _assert_same_run(ref, got)
    if "KV pressure" in " ".join(overrides) or "gpu_memory_utilization" in " ".join(overrides):
        assert int(ref.state.num_preemptions.sum()) > 0  # (the scenario does what it is there for)
    assert int(ref.state.num_proposed.sum()) > 0 or "vllm" in overrides[0] or "sarathi" in overrides[0]


def _assert_same_run(ref: SimOutput, got: SimOutput) -> None:
    """Two runs of one config left the same state and the same step trace, bit for bit."""
    for name in STATE:
        assert np.array_equal(getattr(ref.state, name), getattr(got.state, name), equal_nan=True), name
    assert got.sim_time_s == ref.sim_time_s and got.num_steps == ref.num_steps
    assert len(got.steps) == len(ref.steps) == ref.num_steps
    for a, b in zip(ref.steps, got.steps, strict=True):
        assert dataclasses.replace(a, schedule_wall_s=0.0) == dataclasses.replace(b, schedule_wall_s=0.0)
    assert got.step_telemetry == ref.step_telemetry


@pytest.mark.parametrize("name", ["turbospec, KV pressure (preemption; the proposal's blocks do not all fit)",
                                  "adaserve (token trees)", "static k=3 with EAGLE, step trace"])
def test_the_kernels_run_as_plain_python_equal_their_numpy_references(monkeypatch: pytest.MonkeyPatch,
                                                                       name: str) -> None:
    """``REPRO_JIT=python`` (a mutation run, scripts/mutation.sh: Numba cannot compile mutmut's rewritten kernels)
    runs every kernel uncompiled where it would run compiled, returning the Python scalars Numba returns (a
    ``decode_only is True`` holds either way), and leaves the run the NumPy references leave."""
    from repro.core import jit

    monkeypatch.setenv("REPRO_JIT", "0")
    jit.refresh()
    ref = _run(SCENARIOS[name])
    monkeypatch.setenv("REPRO_JIT", "python")
    jit.refresh()
    try:
        assert jit.interpreted() and jit.step_kernels()
        sums = jit.kernel("repro.cost.kernels", "chain_terms")(np.array([0, 3]), np.array([5, 9]))
        assert sums == (1, 3, 4, 14, 1 * 6 + 4 * 13) and all(type(v) is int for v in sums)
        got = _run(SCENARIOS[name])
    finally:
        jit.refresh()
    _assert_same_run(ref, got)


LEAN = {  # chain systems without a step trace, where the lean step of chains runs
    "nightjar (speculation off and on, draft catch-up: the general path between)": ["system=nightjar", "rps=12",
                                                                                     *WORKLOAD],
    "nightjar, the authors' selector": ["system=nightjar_authors", "rps=3", *WORKLOAD],
    "dsd (gamma by batch size)": ["system=dsd", "rps=6", *WORKLOAD],
    "turbospec, draft model": ["system=turbospec", "rps=4", *WORKLOAD],
    "turbospec, multi-query scorer": ["system=turbospec", "engine=turbospec_mq", "rps=4", *WORKLOAD],
    "static k=3, KV pressure (preemption)": ["system=static_sd_k3", "rps=8", "engine.gpu_memory_utilization=0.22",
                                             *PRESSURE],
    "static k=3 with EAGLE": ["system=static_sd_eagle_k3", "model=llama3-8b", "hardware=h100-80g", "rps=4",
                              *WORKLOAD],
}


@pytest.mark.parametrize("overrides", LEAN.values(), ids=LEAN.keys())
def test_the_lean_step_of_chains_equals_the_general_step(use_jit: Any, monkeypatch: pytest.MonkeyPatch,
                                                         overrides: list[str]) -> None:
    """``Replica._execute_chains`` (a decode step of equal chains, priced from one compiled pass's sums) and
    ``Replica._prompts_s`` (a prefill-only step of whole prompts) leave the state, the clock and every result the
    policy observes as the general ``_execute`` does, bit for bit."""
    pytest.importorskip("numba")
    from repro.sim.replica import Replica

    use_jit(True)
    lean, prompts = Replica._execute_chains, Replica._prompts_s
    taken = [0, 0, 0]  # lean steps of chains, declined, prompts priced lean

    def counted(self: Replica, plan: Any, now: float) -> Any:
        got = lean(self, plan, now)
        taken[got is None] += 1
        return got

    def counted_prompts(self: Replica, *args: Any) -> Any:
        got = prompts(self, *args)
        taken[2] += got is not None
        return got

    def observed(overrides: list[str]) -> tuple[SimOutput, list[tuple[Any, ...]]]:
        engine = build(compose(overrides)).engine
        seen: list[tuple[Any, ...]] = []
        observe = engine.policy.observe

        def watch(result: Any) -> None:
            seen.append((result.start_at, result.end_at, result.draft_s, result.verify_s, result.memory_s,
                         result.num_batched_tokens, *(getattr(result, f).tolist() for f in (
                             "decode_ids", "num_proposed", "num_accepted", "num_emitted", "prefill_ids",
                             "finished_ids"))))
            observe(result)

        monkeypatch.setattr(engine.policy, "observe", watch)
        return engine.run(), seen

    monkeypatch.setattr(Replica, "_execute_chains", lambda self, plan, now: None)
    monkeypatch.setattr(Replica, "_prompts_s", lambda self, *args: None)
    ref, ref_seen = observed(overrides)
    monkeypatch.setattr(Replica, "_execute_chains", counted)
    monkeypatch.setattr(Replica, "_prompts_s", counted_prompts)
    got, got_seen = observed(overrides)
    assert taken[0] > 0 and taken[2] > 0, f"the lean steps did not both run: {taken}"
    for name in STATE:
        assert np.array_equal(getattr(ref.state, name), getattr(got.state, name), equal_nan=True), name
    assert got.sim_time_s == ref.sim_time_s and got.num_steps == ref.num_steps
    assert got_seen == ref_seen


@pytest.mark.parametrize("case", ["equal chains", "duplicate", "not running", "prefilling", "mixed k", "k = 0",
                                  "k = 0, draft behind", "negative k", "draft behind", "draft behind, no draft cache",
                                  "prefixes: mixed k", "prefixes: k = 0, draft behind", "prefixes: negative k",
                                  "prefixes: draft behind, no draft cache"])
def test_chains_begin_is_the_three_kernels_it_fuses_or_declines(case: str) -> None:
    """``chains_begin`` gives what ``unique_ids``, ``decode_begin``, ``draft_reads`` and ``chain_terms`` give for a
    step of equal chains (tokens, contexts, the KV grown, Σ ctx and the verification pairs), or with ``prefixes`` of
    chain prefixes of any lengths (every request drafting), and declines, writing nothing, every other step."""
    from repro.cost import kernels as cost_kernels
    from repro.sim import kernels

    rng = np.random.default_rng(len(case))
    n_req, n, k0, bs = 50, 12, 3, 16
    status = np.full(n_req, 2)
    gen = rng.integers(1, 200, n_req)
    prompt = rng.integers(1, 500, n_req)
    computed = prompt + gen - 1
    blocks = (computed + bs - 1) // bs
    draft = computed.copy()
    dids = rng.choice(n_req, n, replace=False)
    k = np.full(n, k0)
    keeps_kv = not case.endswith("draft behind, no draft cache")
    prefixes = case.startswith("prefixes: ")
    case = case.removeprefix("prefixes: ")
    if case == "duplicate":
        dids[3] = dids[7]
    elif case == "not running":
        status[dids[5]] = 1
    elif case == "prefilling":
        computed[dids[2]] -= 4
    elif case == "mixed k":
        k[4] = 2
        k[5] = 0
    elif case.startswith("k = 0"):
        k[:] = 0
    elif case == "negative k":
        k[1:] = -1
    if "draft behind" in case:
        draft[dids[6]] -= 3
    before = (blocks.copy(), computed.copy())
    g, c, sums = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.zeros(3, dtype=np.int64)
    took = kernels.chains_begin(np.zeros(n_req, dtype=np.int64), status, gen, computed, prompt, blocks, draft, dids, k,
                                bs, keeps_kv, g, c, sums, prefixes)
    assert took == (case in ("equal chains", "draft behind, no draft cache", *(("mixed k",) if prefixes else
                                                                              ("k = 0", "k = 0, draft behind"))))
    if not took:
        assert np.array_equal(blocks, before[0]) and np.array_equal(computed, before[1])
        return
    ref_blocks = before[0].copy()
    ref_g, ref_c = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    assert kernels.unique_ids(np.zeros(n_req, dtype=np.int64), dids[:0], dids)
    added = kernels.decode_begin(status, gen, computed, prompt, ref_blocks, dids, k, bs, ref_g, ref_c)
    reads = kernels.draft_reads(draft, dids, ref_c, k, np.full(n, True) if prefixes else k > 0, keeps_kv)
    terms = cost_kernels.chain_terms(k, ref_c)
    assert g.tolist() == ref_g.tolist() and c.tolist() == ref_c.tolist() and np.array_equal(blocks, ref_blocks)
    assert sums.tolist() == [added, terms[3], terms[4]]
    if k[0]:  # the draft pass reads the same contexts, its caches in step
        assert reads[:3] == (n, terms[3], 0)


@pytest.mark.parametrize("mean", [0.1, 0.6, 0.95])
def test_compiled_chain_scores_equal_the_numpy_scores_and_generate_what_they_read(use_jit: Any,
                                                                                 mean: float) -> None:
    """Chains of mixed lengths (0 included) over chunk boundaries, on requests whose chunks are not generated yet:
    the same (proposed, accepted, matched) as the NumPy path."""
    pytest.importorskip("numba")
    from tests.test_oracle import make_oracle

    rng = np.random.default_rng(11)
    rids = rng.choice(50, 30, replace=False)
    pos = rng.integers(0, 3000, 30)
    pos[:4] = [509, 510, 511, 1023]  # chains that cross a chunk's end
    k = rng.integers(0, 9, 30)
    out = []
    for on in (False, True):
        use_jit(on)
        oracle: TokenOracle = make_oracle(50, mean, seed=5)
        first = oracle.score_chain(rids, pos, k)
        again = oracle.score_chain(rids, pos + 3, k)  # chunks held now
        out.append((first, again))
    for (a, b) in zip(out[0], out[1], strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype and x.tolist() == y.tolist()


def test_compiled_chain_scores_generate_chains_past_a_chunk_and_name_bad_input(use_jit: Any) -> None:
    """Chains longer than a chunk (three chunks read by one chain) score as on NumPy; a negative position and a chain
    past the limit raise the NumPy path's errors."""
    pytest.importorskip("numba")
    from repro.oracle.store import _AR
    from tests.test_oracle import make_oracle

    rids, pos, k = np.array([3, 7, 9]), np.array([500, 0, 1020]), np.array([1100, 5, 0])
    out = []
    for on in (False, True):
        use_jit(on)
        oracle: TokenOracle = make_oracle(12, 0.9, seed=2)
        out.append(oracle.score_chain(rids, pos, k))
        for bad, match in (((np.array([-1, 0, 0]), k), "positions must be >= 0"),
                           ((pos, np.array([0, _AR.size, 0])), "too long")):
            with pytest.raises(ValueError, match=match):
                oracle.score_chain(rids, *bad)
    for x, y in zip(*out, strict=True):
        assert x.tolist() == y.tolist()
    assert out[1][2][0] > 0  # (the long chain reads hits)


def test_a_run_that_turns_the_step_kernels_on_midway_equals_one_that_never_does(
        use_jit: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``REPRO_JIT`` unset and Numba not loaded, the step kernels engage after ``LOAD_AFTER_STEPS`` steps on
    NumPy (repro.core.jit): a run that switches there leaves what a NumPy run leaves."""
    pytest.importorskip("numba")
    from repro.core import jit

    if jit.interpreted():
        pytest.skip("a mutation run (REPRO_JIT=python) interprets the kernels: Numba cannot compile mutmut's")
    overrides = SCENARIOS["turbospec, draft model"]
    use_jit(False)
    ref = _run(overrides)
    monkeypatch.delenv("REPRO_JIT")
    monkeypatch.setattr(jit, "LOAD_AFTER_STEPS", 150)
    monkeypatch.setattr(jit, "_loaded", lambda: False)  # (another test may have loaded it in this process)
    jit.refresh()
    assert jit.enabled() and not jit.step_kernels()
    got = _run(overrides)
    assert jit.step_kernels() and jit._STEPS[0] == 150 < ref.num_steps
    for name in STATE:
        assert np.array_equal(getattr(ref.state, name), getattr(got.state, name), equal_nan=True), name
    for a, b in zip(ref.steps, got.steps, strict=True):
        assert dataclasses.replace(a, schedule_wall_s=0.0) == dataclasses.replace(b, schedule_wall_s=0.0)


PREFIXES = {  # TETRIS without a step trace, where the lean step of chain prefixes runs
    "tetris": ["system=tetris", "rps=6", *WORKLOAD],
    "tetris, KV pressure (preemption: the general path)": ["system=tetris", "rps=8",
                                                          "engine.gpu_memory_utilization=0.22", *PRESSURE],
    "tetris, multi-query scorer": ["system=tetris", "engine=turbospec_mq", "rps=6", *WORKLOAD],
    "tetris, budget past the chains (every token verified)": ["system=tetris", "system.budget_per_seq=5", "rps=6",
                                                              *WORKLOAD],
}


@pytest.mark.parametrize("overrides", PREFIXES.values(), ids=PREFIXES.keys())
def test_the_lean_step_of_chain_prefixes_equals_the_general_step(use_jit: Any, monkeypatch: pytest.MonkeyPatch,
                                                                 overrides: list[str]) -> None:
    """``Replica._execute_prefixes`` (a decode step whose trees are prefixes of greedy chains: drafting priced as
    chains, acceptance read as chains) leaves the state, the clock and every result the policy observes as the
    general ``_execute`` does with the trees, bit for bit."""
    pytest.importorskip("numba")
    from repro.sim.replica import Replica

    use_jit(True)
    lean = Replica._execute_prefixes
    taken = [0, 0]

    def counted(self: Replica, plan: Any, now: float) -> Any:
        got = lean(self, plan, now)
        taken[got is None] += 1
        return got

    def observed() -> tuple[SimOutput, list[tuple[Any, ...]]]:
        engine = build(compose(overrides)).engine
        seen: list[tuple[Any, ...]] = []
        observe = engine.policy.observe

        def watch(result: Any) -> None:
            seen.append((result.start_at, result.end_at, result.draft_s, result.verify_s, result.num_batched_tokens,
                         *(getattr(result, f).tolist() for f in ("decode_ids", "num_proposed", "num_accepted",
                                                                 "num_emitted", "finished_ids"))))
            observe(result)

        monkeypatch.setattr(engine.policy, "observe", watch)
        return engine.run(), seen

    monkeypatch.setattr(Replica, "_execute_prefixes", lambda self, plan, now: None)
    ref, ref_seen = observed()
    monkeypatch.setattr(Replica, "_execute_prefixes", counted)
    got, got_seen = observed()
    assert taken[0] > 0, f"the lean step of chain prefixes did not run: {taken}"
    for name in STATE:
        assert np.array_equal(getattr(ref.state, name), getattr(got.state, name), equal_nan=True), name
    assert got.sim_time_s == ref.sim_time_s and got.num_steps == ref.num_steps
    assert got_seen == ref_seen
    assert int(ref.state.num_accepted.sum()) > 0


@pytest.mark.parametrize("mean", [0.1, 0.6, 0.95])
@pytest.mark.parametrize("depth", [1, 3, 7])
def test_compiled_greedy_chains_equal_the_width_one_beam(use_jit: Any, monkeypatch: pytest.MonkeyPatch,
                                                         mean: float, depth: int) -> None:
    """The compiled greedy chain (``repro.oracle.kernels.greedy_chains``) gives the width-1 beam's nodes, ranks,
    probabilities and path probabilities bit for bit, off the true path too, over chunk ends; where a chunk it reads
    is not generated yet it leaves the step to the reference, which generates it, and reads it itself after."""
    pytest.importorskip("numba")
    from repro.oracle import streams
    from tests.test_oracle import make_oracle

    rng = np.random.default_rng(depth)
    rids = rng.choice(60, 40, replace=False)
    pos = rng.integers(0, 3000, 40)
    pos[:4] = [254, 255, 511, 1022]  # chains across an off-path chunk's and a chunk's end
    out = []
    for on in (False, True):
        use_jit(on)
        oracle: TokenOracle = make_oracle(60, mean, seed=3)
        first = oracle.candidates_batch(rids, pos, depth, 1)
        if on:  # every chunk held now: the kernel alone
            monkeypatch.setattr(streams, "beam_layers", lambda *a: pytest.fail("the reference ran"))
        again = oracle.candidates_batch(rids, pos, depth, 1)
        probs = oracle.chain_probs_batch(rids, pos, depth)
        out.append((first, again, probs))
    for a, b in zip(out[0][:2], out[1][:2], strict=True):
        for x, y in zip(a, b, strict=True):
            for f in ("rid", "pos", "draft_depth", "draft_width"):
                assert getattr(x, f) == getattr(y, f)
            for f in ("parent", "depth", "rank", "prob", "path_prob"):
                assert getattr(x, f).dtype == getattr(y, f).dtype and np.array_equal(getattr(x, f), getattr(y, f))
    assert np.array_equal(out[0][2], out[1][2])
    if depth > 1 and mean < 0.9:  # (off-path nodes were read)
        assert any(float(c.prob[-1]) != float(c.prob[0]) for c in out[1][1])


@pytest.mark.parametrize("case", ["tetris's trees", "a width-2 beam", "a node past the prefix", "a rank-1 node",
                                  "drafted elsewhere", "depths differ", "a request without a tree", "chains of 1",
                                  "a node twice", "a node past the chain"])
def test_chain_prefixes_takes_the_prefixes_of_greedy_chains_only(case: str) -> None:
    """:func:`repro.core.speculation.chain_prefixes` gives the counts and depth of TETRIS's trees, and ``None`` (the
    general path) for any tree that is not the first nodes of a greedy chain of the step's one depth."""
    from repro.core.speculation import TreeSpec, chain_prefixes
    from systems.tetris import select_drafts
    from tests.test_oracle import make_oracle

    oracle = make_oracle(20, 0.6, seed=1)
    rids, pos = np.arange(8), np.arange(8) * 7
    depth = 1 if case == "chains of 1" else 3
    trees = dict(select_drafts(oracle.candidates_batch(rids, pos, depth, 1), 12))
    cand = trees[2].cand
    if case == "a width-2 beam":
        trees[2] = TreeSpec(oracle.candidates(2, 14, 3, 2), np.array([0]))
    elif case == "a node past the prefix":
        trees[2] = TreeSpec(cand, np.array([0, 2]))
    elif case == "a rank-1 node":
        trees[2] = TreeSpec(dataclasses.replace(cand, rank=np.array([0, 1, 0])), np.array([0, 1]))
    elif case == "depths differ":
        trees[2] = TreeSpec(oracle.candidates(2, 14, 4, 1), np.array([0]))
    elif case == "a request without a tree":
        del trees[2]
    elif case == "a node twice":
        trees[2] = TreeSpec(cand, np.array([0, 0]))
    elif case == "a node past the chain":
        trees[2] = TreeSpec(cand, np.array([0, 1, 2, 3]))
    got = chain_prefixes(trees, rids.tolist(), (pos + (case == "drafted elsewhere")).tolist())
    if case != "tetris's trees":
        assert got is None
        return
    assert got is not None
    k, d = got
    assert d == 3 and k.tolist() == [trees[r].nodes.size for r in rids.tolist()] and 0 < k.sum() == 12
