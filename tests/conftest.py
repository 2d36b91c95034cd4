"""Shared factories: requests, a deterministic oracle double, deployments and engines around any policy."""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from repro.cost.model import CostModel
from repro.cost.serving import load_engine
from repro.cost.spec import load_hardware, load_model
from repro.experiments import runner
from repro.experiments.compose import compose_config, hydra_context
from repro.sim.deployment import Deployment, DraftServerSpec
from repro.sim.engine import Engine, SimOutput
from repro.sim.plan import CandidateTree, StepPlan, StepResult, TreeSpec
from repro.sim.policy import Policy
from repro.sim.state import View
from tests import data_record
from workloads.datasets import data_folder, trace_data_root


def pytest_addoption(parser: pytest.Parser) -> None:
    data_record.add_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    data_record.register(config)


def _plain(text: str) -> bool:
    """Printable ASCII without a backslash: a test id pytest keeps as written (it escapes any other, and an escaped
    id cannot be passed back to it by name: ``pytest 'tests/x.py::test[id]'``, as ``scripts/mutation.sh`` selects)."""
    return text.isascii() and text.isprintable() and "\\" not in text


def pytest_make_parametrize_id(val: object) -> str | None:
    """A string parameter's id made plain: backslashes (a regular expression's escapes) dropped, whitespace a space,
    any other character outside printable ASCII a ``?``."""
    if isinstance(val, str) and not _plain(val):
        return "".join(c if c.isascii() and c.isprintable() else " " if c.isspace() else "?"
                       for c in val.replace("\\", "")).strip()
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test id is plain (an explicit ``id=`` too, which the hook above does not see)."""
    for item in items:
        if not _plain(item.nodeid):
            raise pytest.UsageError(f"{item.nodeid}: a test id must be printable ASCII without a backslash: "
                                    "give it an id=")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under a mutation run, the test that killed the mutant, appended to ``mutation-kills.jsonl`` in mutmut's folder
    (where it runs the tests): ``scripts/mutation_budget.py`` puts a function's killers first in the next cut."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if report.failed and "__mutmut_" in mutant:
        import json

        with open("mutation-kills.jsonl", "a") as out:
            out.write(json.dumps({"mutant": mutant, "test": report.nodeid}) + "\n")


@pytest.fixture(autouse=True)
def _fresh_under_mutation() -> None:
    """Under a mutation run (scripts/mutation.sh), each test starts from nothing computed: mutmut collects and runs
    the tests once in its own process before it forks one child per mutant, so a value remembered there (a
    ``functools`` cache of this project's modules, :mod:`repro.cost.remembered`, the parsed spec files) would be the
    unmutated code's."""
    if "__mutmut_" not in os.environ.get("MUTANT_UNDER_TEST", ""):
        return
    import functools

    from repro.cost import remembered, spec

    remembered._KEPT.clear()
    spec._LOADED.clear()
    for name, module in list(sys.modules.items()):
        if module is not None and name.split(".")[0] in ("repro", "systems"):
            for value in list(vars(module).values()):
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()


#: Locks by which a test marked ``alone`` runs with no other test of this machine's pytest runs beside it (the
#: xdist workers of this run, or another run's): it holds ``.cpu`` exclusive, every other test holds it shared. A
#: test waiting to run alone holds ``.turn`` exclusive, so the tests that start meanwhile queue behind it.
_LOCKS = Path(tempfile.gettempdir()) / f"specrepro-tests-{os.getuid() if hasattr(os, 'getuid') else 0}"
_HELD = "SPECREPRO_TEST_SHARE_HELD"  # set while a test holds its share (a pytest it runs inherits it)


@pytest.fixture(autouse=True)
def _cpu_share(request: pytest.FixtureRequest) -> Iterator[None]:
    """Shared use of the cores, or all of them for a test marked ``alone`` (one that compares wall-clock times
    measured at different moments: a test beside it on the other core slowed one side and not the other)."""
    try:
        import fcntl
    except ImportError:  # (no flock: no coordination)
        yield
        return
    if os.environ.get(_HELD):  # a pytest run inside a test (tests/test_data_record.py): its parent holds the share
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    with open(f"{_LOCKS}.turn", "a") as turn, open(f"{_LOCKS}.cpu", "a") as cpu:
        fcntl.flock(turn, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(cpu, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turn, fcntl.LOCK_UN)
        os.environ[_HELD] = "1"
        try:
            yield
        finally:
            os.environ.pop(_HELD, None)
            fcntl.flock(cpu, fcntl.LOCK_UN)




class FixedOracle:
    """Test double of the token oracle: every chain accepts ``min(k, accept)`` tokens; a tree accepts the
    depth of its deepest rank-0 path, capped at ``accept``."""

    def __init__(self, accept: int = 0) -> None:
        self.accept = accept
        self.released: list[int] = []
        self.calls: list[tuple[int, int, int]] = []

    def accept_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                     proposer: str = "draft") -> tuple[np.ndarray, np.ndarray]:
        proposed, accepted, _ = self.score_chain(rids, pos, k, proposer)
        return proposed, accepted

    def score_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                    proposer: str = "draft") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(proposed, accepted, matched): every proposed token past the accepted prefix mismatches."""
        self.calls.extend(zip(rids.tolist(), pos.tolist(), k.tolist(), strict=True))
        k = np.asarray(k, dtype=np.int64)
        accepted = np.minimum(k, self.accept)
        return k.copy(), accepted, accepted.copy()

    def chain_run(self, rids: np.ndarray, pos: np.ndarray, k: int, steps: int, proposer: str = "draft", *,
                  end: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``score_chain`` (a subclass's too) for ``steps`` successive steps of chains of ``k``."""
        return chain_run_by_steps(self, rids, pos, k, steps, proposer)

    def accept_prob_sum(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                        proposer: str = "draft") -> np.ndarray:
        """Σ min(1, p/q) over each chain: the first ``accept`` positions are kept for sure, the rest never."""
        return np.minimum(np.asarray(k), self.accept).astype(np.float64)

    def accept_tree(self, tree: TreeSpec, proposer: str = "draft") -> int:
        cand, depth = tree.cand, 0
        on = {-1}
        for i in sorted(tree.nodes.tolist()):
            if cand.rank[i] == 0 and cand.parent[i] in on:
                on.add(i)
                depth = max(depth, int(cand.depth[i]))
        return min(depth, self.accept)

    def accept_trees(self, trees: list[TreeSpec], proposer: str = "draft") -> list[int]:
        """``accept_tree`` (a subclass's too) of each tree."""
        return [self.accept_tree(t, proposer) for t in trees]

    def release(self, rid: int) -> None:
        self.released.append(rid)


def chain_run_by_steps(oracle: Any, rids: np.ndarray, pos: np.ndarray, k: int, steps: int,
                       proposer: str = "draft") -> tuple[np.ndarray, np.ndarray]:
    """An oracle double's ``chain_run`` from its ``score_chain``: ``steps`` successive chains of ``k``, each starting
    after the previous one's accepted + 1 tokens (what the engine's fast-forward asks for)."""
    at = np.asarray(pos, dtype=np.int64).copy()
    accepted = np.empty((steps, at.size), dtype=np.int64)
    matched = np.empty((steps, at.size), dtype=np.int64)
    for j in range(steps):
        _, accepted[j], matched[j] = oracle.score_chain(rids, at, np.full(at.size, k), proposer)
        at += accepted[j] + 1
    return accepted, matched


def make_requests(n: int = 4, prompt_len: int | list[int] = 32, output_len: int | list[int] = 16,
                  gap_s: float = 0.0, tpot_slo_s: float = np.inf) -> dict[str, np.ndarray]:
    """``n`` requests arriving ``gap_s`` apart with the given lengths (scalars or per-request lists)."""
    return {
        "arrival_s": np.arange(n, dtype=np.float64) * gap_s,
        "prompt_len": np.broadcast_to(np.asarray(prompt_len, dtype=np.int64), (n,)).copy(),
        "output_len": np.broadcast_to(np.asarray(output_len, dtype=np.int64), (n,)).copy(),
        "tpot_slo_s": np.full(n, tpot_slo_s),
        "ttft_slo_s": np.full(n, np.inf),
        "slo_class": np.zeros(n, dtype=np.int64),
    }


def make_cost(hardware: str = "a100-80g", model: str = "llama2-7b", draft: str | None = "llama-160m",
              tp: int = 1, engine: str | None = None) -> CostModel:
    """A cost model; ``engine`` names a conf/engine profile (default: the ideal multi-query engine)."""
    return CostModel(load_hardware(hardware), load_model(model), tp=tp,
                     draft=load_model(draft) if draft else None,
                     engine=load_engine(engine) if engine else None)


def make_deployment(policy: Policy, *, hardware: str = "a100-80g", model: str = "llama2-7b",
                    draft: str | None = "llama-160m", tp: int = 1, engine: str | None = None,
                    draft_servers: Sequence[DraftServerSpec] = ()) -> Deployment:
    """The deployment of ``policy`` on ``tp`` GPUs of ``hardware`` (replicas as the policy declares them)."""
    return Deployment.of(policy, hardware=load_hardware(hardware), model=load_model(model),
                         draft=load_model(draft) if draft else None, tp=tp,
                         engine=load_engine(engine) if engine else None, draft_servers=draft_servers)


def make_engine(policy: Policy, requests: dict[str, np.ndarray] | None = None, *, oracle: Any = None,
                hardware: str = "a100-80g", model: str = "llama2-7b", draft: str | None = "llama-160m",
                tp: int = 1, kv_blocks: int | None = None, engine: str | None = None,
                draft_servers: Sequence[DraftServerSpec] = (), **kw: Any) -> Engine:
    """An engine around ``policy`` (bound to its replica's context) with real cost models and a FixedOracle by
    default."""
    reqs = requests if requests is not None else make_requests()
    dep = make_deployment(policy, hardware=hardware, model=model, draft=draft, tp=tp, engine=engine,
                          draft_servers=draft_servers)
    eng = Engine(deployment=dep, oracle=oracle or FixedOracle(), rng=np.random.default_rng(0), **reqs, **kw)
    if kv_blocks is not None:
        for r in eng.replicas:
            r.total_blocks = kv_blocks
            r.sync_view()
    return eng


def run(policy: Policy, requests: dict[str, np.ndarray] | None = None, **kw: Any) -> SimOutput:
    return make_engine(policy, requests, **kw).run()


def spy(policy: Policy) -> tuple[list[StepPlan], list[StepResult]]:
    """Record every plan ``policy`` returns and every result it observes."""
    plans: list[StepPlan] = []
    results: list[StepResult] = []
    schedule, observe = policy.schedule, policy.observe

    def rec_schedule(view: View) -> StepPlan:
        plans.append(schedule(view))
        return plans[-1]

    def rec_observe(result: StepResult) -> None:
        results.append(result)
        observe(result)

    policy.schedule = rec_schedule  # type: ignore[method-assign]
    policy.observe = rec_observe  # type: ignore[method-assign]
    return plans, results


@pytest.fixture
def fixed_oracle() -> FixedOracle:
    return FixedOracle()


def run_quick(exp: str, tmp: Path, *extra: str) -> runner.ExperimentResult:
    """Run experiment ``exp`` in quick mode into ``tmp/exp`` with two workers."""
    overrides = [f"+exp={exp}", "quick=true", "n_jobs=2", *extra]
    with hydra_context():
        cfg = compose_config(overrides)
    return runner.run_experiment(cfg, overrides, out_dir=tmp / exp, log=lambda _: None)


# ------------------------------------------------------------------------------------ where data comes from

#: The two data modes a test can pin: the real files (skipped where they are absent) or none at all (an empty
#: data folder: every loader serves its embedded statistics).
DATA_MODES = ("files", "none")
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def data_root() -> Path | None:
    """The real data folder this machine has: ``$REPRO_DATA`` when set, else ``../shared/data``; None when it is
    missing or empty (``REPRO_DATA=$(mktemp -d) python -m pytest`` runs the suite with no data)."""
    env = os.environ.get("REPRO_DATA")
    root = Path(env) if env else SHARED_DATA
    trace_data_root(root if root.is_dir() else None)  # tests/data_record.py: this test reads the data folder
    return root if root.is_dir() and any(root.iterdir()) else None


@contextmanager
def pinned_data(mode: str, empty: Path) -> Iterator[None]:
    """Set ``$REPRO_DATA`` for ``mode`` (``files``: the real folder, or skip naming it; ``none``: ``empty``)."""
    if mode not in DATA_MODES:
        raise ValueError(f"data mode {mode!r}: expected one of {DATA_MODES}")
    root = data_root() if mode == "files" else None  # "none" never looks (tests/data_record.py)
    if mode == "files" and root is None:
        pytest.skip(f"needs the data folder ($REPRO_DATA or {SHARED_DATA}, laid out as in docs/data.md)")
    empty.mkdir(parents=True, exist_ok=True)
    with data_folder(root if mode == "files" and root is not None else empty):
        yield


@pytest.fixture
def use_jit(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``use_jit(True | False)``: the compiled kernels on or off (``REPRO_JIT``, :func:`repro.core.jit.refresh`) for
    the rest of the test; read again afterwards, so no other test inherits the choice. Under ``REPRO_JIT=python``
    (a mutation run, ``scripts/mutation.sh``) "on" is the kernels run as plain Python."""
    from repro.core import jit

    on_value = "python" if jit.interpreted() else "1"

    def use(on: bool) -> None:
        monkeypatch.setenv("REPRO_JIT", on_value if on else "0")
        jit.refresh()
        assert jit.enabled() == on and jit.step_kernels() == on

    yield use
    jit.refresh()  # (before monkeypatch restores REPRO_JIT: enabled() reads it again when next asked)


@pytest.fixture
def no_data(tmp_path: Path) -> Iterator[None]:
    """``$REPRO_DATA`` pinned to an empty folder (embedded statistics) for a test whose subject does not depend on the
    data: it then runs alike on every machine, and CI's no-data pass need not repeat it (tests/data_record.py)."""
    with pinned_data("none", tmp_path / "no_data"):
        yield


class QuickRuns:
    """Quick-mode experiment runs, each made once per test session and data mode and shared by the tests that read
    it (the reference check and the claims tests). Under pytest-xdist the workers share them too: the first to need
    one runs it under a file lock and leaves it pickled in the session's shared folder; the others wait for the lock
    and read it (the points are read back from points.csv either way, so every worker sees the same frame)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.done: dict[tuple[str, str], runner.ExperimentResult] = {}

    def get(self, exp: str, data: str) -> runner.ExperimentResult:
        key = (exp, data)
        if key not in self.done and data == "none":
            same = self._same_without_data(exp)
            if same is not None:
                self.done[key] = same
        if key not in self.done:
            with pinned_data(data, self.tmp / "empty_data"), _locked(self.tmp / f"{exp}.{data}.lock"):
                saved = self.tmp / f"{exp}.{data}.pickle"
                if saved.is_file():
                    self.done[key] = pickle.loads(saved.read_bytes())
                else:
                    self.done[key] = run_quick(exp, self.tmp / data)
                    saved.write_bytes(pickle.dumps(self.done[key]))
        return self.done[key]


    def _same_without_data(self, exp: str) -> runner.ExperimentResult | None:
        """This session's run of ``exp`` with the data folder, where a run without it cannot differ: the run read no
        file (no data source of kind ``file``) and the experiment's committed quick reference is one for both modes
        (no ``nodata/`` variant). Else None (and None before any run with the data folder: this never looks for the
        data folder itself, so a test that gets it stays a test that does not read it, tests/data_record.py). The
        full no-data run (``REPRO_DATA=$(mktemp -d) python -m pytest``) runs these experiments without data."""
        from repro.experiments.check import NODATA
        from repro.experiments.results import reference_dir

        if (reference_dir(exp, quick=True) / NODATA).exists():
            return None
        with _locked(self.tmp / f"{exp}.files.lock"):  # a run with the data folder under way: wait for it
            saved = self.tmp / f"{exp}.files.pickle"
            if (exp, "files") in self.done:
                res = self.done[(exp, "files")]
            elif saved.is_file():
                res = pickle.loads(saved.read_bytes())
            else:
                return None
        return None if any(src.get("kind") == "file" for src in res.manifest.get("data") or []) else res


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (none without ``fcntl``: each worker then runs its own)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def quick_runs(tmp_path_factory: pytest.TempPathFactory) -> QuickRuns:
    """The session's quick runs; under xdist in the folder every worker of this session shares (the parent of the
    workers' own base folders, which is this session's alone)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return QuickRuns(tmp_path_factory.mktemp("quick_runs"))
    shared = tmp_path_factory.getbasetemp().parent / "quick_runs"
    shared.mkdir(exist_ok=True)
    return QuickRuns(shared)


@pytest.fixture(scope="module", params=DATA_MODES)
def data(request: pytest.FixtureRequest) -> str:
    """The data mode a claims test runs in, each in turn: the real files (skipped without them) and none at all
    (embedded statistics); a claim must hold on both. Which files an experiment reads is said in its test module."""
    return str(request.param)


def point_value(points: pd.DataFrame, system: str, metric: str, **where: object) -> float:
    """Mean of ``metric`` over the points of ``system`` whose columns equal ``where`` (there must be some)."""
    rows = points[points["system"] == system]
    for key, value in where.items():
        rows = rows[rows[key] == value]
    assert len(rows), (system, where)
    return float(rows[metric].mean())


def is_closed(cand: CandidateTree, nodes: np.ndarray) -> bool:
    """Every selected node's parent is selected too (or is the root): what the engine checks of a tree."""
    sel = np.zeros(cand.size + 1, dtype=bool)
    sel[-1] = True
    sel[nodes] = True
    return bool(sel[cand.parent[nodes]].all())


def exp_points(exp: str) -> tuple[Any, list[Any]]:
    """An experiment's parsed ``exp`` block (full mode) and its points, inside a :func:`hydra_context`."""
    from repro.experiments.compose import compose_config, to_dict
    from repro.experiments.expspec import ExpSpec, apply_quick
    from repro.experiments.grid import expand_points, group_overrides
    from repro.experiments.results import CONF_DIR

    spec = ExpSpec.parse(apply_quick(to_dict(compose_config([f"+exp={exp}"]).exp), False)[0])
    return spec, expand_points(spec, group_overrides(CONF_DIR)) if spec.kind == "sweep" else []
