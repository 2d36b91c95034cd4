"""Regression tracking (repro.experiments.check): cell-by-cell comparison, ``repro check`` catching a changed reference,
``repro all`` writing references and INDEX.md."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from repro.experiments import check
from repro.experiments.results import reference_dir

# the subject does not depend on where the workload comes from: pinned to the embedded statistics
# (conftest.no_data), so CI's no-data pass need not repeat it
pytestmark = pytest.mark.usefixtures("no_data")

REPO = Path(__file__).resolve().parents[1]


def frame(**cols: list[str]) -> pd.DataFrame:
    base = {"exp": ["e", "e"], "system": ["a", "b"], "seed": ["0", "0"], "rps": ["1", "1"]}
    return pd.DataFrame({**base, **cols})


KEYS = ["exp", "system", "seed", "rps"]


@pytest.mark.parametrize(
    ("old", "new", "tol", "changed"),
    [
        (frame(m=["1.5", "2"]), frame(m=["1.5", "2"]), 0.0, []),  # identical
        (frame(m=["1.5", "2"], wall_s=["1", "2"]), frame(m=["1.5", "2"], wall_s=["9", "9"]), 0.0, []),  # wall clock
        (frame(m=["1.5", "2"]), frame(m=["1.5", "2.0001"]), 0.0, [("b", "m", "2", "2.0001")]),  # exact by default
        (frame(m=["1.5", "2"]), frame(m=["1.5", "2.0001"]), 1e-3, []),  # within the relative tolerance
        (frame(m=["nan", "2"]), frame(m=["nan", "2"]), 0.0, []),
        (frame(m=["1", "2"]), frame(m=["1", "2"], extra=["3", "4"]), 0.0,
         [("a", "extra", "", "3"), ("b", "extra", "", "4")]),  # a new column
    ],
)
def test_compare_table(old: pd.DataFrame, new: pd.DataFrame, tol: float, changed: list[tuple[str, ...]]) -> None:
    got = [(c.system, c.metric, c.old, c.new) for c in check.compare(old, new, KEYS, tol)]
    assert got == changed


def test_missing_and_new_rows_are_changes() -> None:
    old = frame(m=["1", "2"])
    new = old.iloc[:1].copy()
    assert [(c.system, c.metric, c.new) for c in check.compare(old, new, KEYS)] == [("b", "(row)", "missing")]


def test_a_reference_with_the_previous_names_compares_equal(tmp_path: Path) -> None:
    """A reference written before the metrics got one name each (throughput_tok_s, p50_latency_s, GoodSpeed's
    goodput_tok_per_s and utility_per_s, a swept num_requests written twice) compares equal to a run with today's
    names: here the committed quick references themselves, written back in the old names."""
    old_names = {"output_throughput": "throughput_tok_s", "median_latency_s": "p50_latency_s"}
    for name, dup in (("smoke", {}), ("goodspeed_fig3", {"goodput_tok_per_s": "output_throughput",
                                                           "utility_per_s": "sum_log_goodput"}),
                      ("laps_fig5", {"num_requests": "num_requests"})):
        path = reference_dir(name, quick=True) / "points.csv"
        new = pd.read_csv(path, dtype=str, keep_default_na=False)
        assert not set(check.RENAMED) & set(new.columns)
        cols = [old_names.get(c, c) for c in new.columns]
        old = new.set_axis(cols, axis=1)
        for col, of in dup.items():  # the duplicate columns the old files had, at the end
            old = pd.concat([old, new[[of]].set_axis([col], axis=1)], axis=1)
        old.to_csv(tmp_path / "points.csv", index=False)
        header = (tmp_path / "points.csv").read_text().splitlines()[0].split(",")
        assert "throughput_tok_s" in header and "p50_latency_s" in header and len(header) == len(new.columns) + len(dup)
        read = check.read_reference(tmp_path / "points.csv")
        assert list(read.columns) == list(new.columns) and read.equals(new)
        keys = ["exp", "system", "seed", *check.read_manifest(path.parent).get("grid_keys", [])]
        assert check.compare(read, new, keys) == []
        raw = pd.read_csv(tmp_path / "points.csv", dtype=str, keep_default_na=False)  # read as is: they would differ
        assert check.compare(raw, new, keys)


def test_reference_is_picked_by_data_sources(tmp_path: Path) -> None:
    ref = tmp_path / "smoke"
    (ref / "nodata").mkdir(parents=True)
    files = [{"dataset": "sharegpt", "kind": "file", "fallback": False, "detail": "x"}]
    embedded = [{"dataset": "sharegpt", "kind": "embedded", "fallback": True, "detail": "y"}]
    for folder, data in ((ref, files), (ref / "nodata", embedded)):
        (folder / "points.csv").write_text("exp\n")
        (folder / "manifest.json").write_text(pd.Series({"data": data}).to_json())
    assert check.pick_reference(ref, {"data": files})[0] == ref
    assert check.pick_reference(ref, {"data": embedded})[0] == ref / "nodata"
    folder, why = check.pick_reference(ref, {"data": [{**files[0], "kind": "published"}]})
    assert folder is None and "data sources differ" in why


def test_a_full_reference_made_with_data_is_skipped_without_it(tmp_path: Path) -> None:
    """``check NAME`` on a machine without the data folder: a reference that read data files and has no no-data
    variant is not run but named, in one line saying how to get the data; the closing line counts what ran."""
    results = tmp_path / "results"
    shutil.copytree(reference_dir("smoke", quick=False), results / "smoke")
    res = _cli("check", "smoke", "--results", str(results), "--scratch", str(tmp_path / "runs"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "smoke: skipped: its reference reads the data folder (sharegpt) and has no no-data variant" in res.stdout
    assert "REPRO_DATA" in res.stdout and "check: 0 of 0 experiments that ran match" in res.stdout
    assert not (tmp_path / "runs").exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_check_catches_a_changed_reference(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(reference_dir("smoke", quick=True), results / "quick" / "smoke")
    runs = tmp_path / "runs"  # the test writes into its own folder only, not the checkout's runs/check
    res = _cli("check", "smoke", "--quick", "--results", str(results), "--n-jobs", "2", "--scratch", str(runs))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "smoke: ok" in res.stdout and "check: 1 of 1 experiments that ran match" in res.stdout
    scratch = runs / "quick" / "smoke"  # a matching run draws nothing (its reference's figures)
    assert {p.name for p in scratch.iterdir()} == {"points.csv", "manifest.json"}
    for points in (results / "quick" / "smoke").rglob("points.csv"):  # the main reference and its nodata variant
        df = pd.read_csv(points, dtype=str, keep_default_na=False)
        df.loc[0, "mean_tpot_ms"] = "123.456"
        df.to_csv(points, index=False)
    res = _cli("check", "smoke", "--quick", "--results", str(results), "--n-jobs", "2", "--scratch", str(runs))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "1 cells differ" in res.stdout
    row = next(line for line in res.stdout.splitlines() if "mean_tpot_ms" in line)
    assert row.split()[:2] == ["smoke", "vllm"] and "123.456" in row
    assert {"summary.md", "tpot.png", "latency.pdf"} <= {p.name for p in scratch.iterdir()}  # drawn where it differs


def test_an_experiment_on_real_models_is_checked_on_its_token_counts_or_skipped(tmp_path: Path) -> None:
    """real_smoke's latencies are this machine's clock: ``exp.compare`` limits the check to its token counts, and
    without PyTorch + transformers ``check`` skips it, saying what to install, and still exits 0."""
    import importlib.util

    results = tmp_path / "results"
    shutil.copytree(reference_dir("real_smoke", quick=True), results / "quick" / "real_smoke")
    points = results / "quick" / "real_smoke" / "points.csv"
    df = pd.read_csv(points, dtype=str, keep_default_na=False)
    df.loc[0, "mean_tpot_ms"] = "123.456"  # a latency: not compared
    df.loc[1, "total_output_tokens"] = "1"  # a token count: compared
    df.to_csv(points, index=False)
    res = _cli("check", "real_smoke", "--quick", "--results", str(results), "--scratch", str(tmp_path / "runs"))
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        assert res.returncode == 0, res.stdout + res.stderr
        assert "real_smoke: skipped: needs" in res.stdout and "pip install" in res.stdout
        assert "check: 0 of 0 experiments that ran match their references; skipped 1: real_smoke" in res.stdout
        return
    assert res.returncode == 1 and "1 cells differ" in res.stdout, res.stdout + res.stderr
    assert "total_output_tokens" in res.stdout and "123.456" not in res.stdout  # the one token count, no latency


def test_experiments_run_together_share_one_pool_and_match_their_references(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_many``, what ``repro check`` and ``repro all`` run: TurboSpec's Figs. 9 and 10 on one shared pool, the
    second planned and submitted before the first ends. The points they share run once, and each experiment's
    points.csv still equals its reference, as a run of it alone wrote it."""
    from concurrent.futures import ProcessPoolExecutor

    from repro.experiments import launch

    ran: list[object] = []
    submit = ProcessPoolExecutor.submit

    def counted(self: ProcessPoolExecutor, fn: object, /, *args: object, **kwargs: object) -> object:
        if fn is launch.run_one:
            ran.append(args[1])
        return submit(self, fn, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ProcessPoolExecutor, "submit", counted)
    names = ["turbospec_fig9", "turbospec_fig10"]
    runs = list(check.run_many(names, True, lambda name: tmp_path / name, n_jobs=2))
    assert [name for name, *_ in runs] == names
    hashes = [set(result.points["config_hash"]) for _, result, _ in runs]  # type: ignore[union-attr]
    assert hashes[0] & hashes[1], "the figures no longer share a point: pick two that do"
    assert len(ran) == len(hashes[0] | hashes[1])  # each distinct point once
    for name, result, seconds in runs:
        ref, problem, changes = check.against_reference(result, reference_dir(name, quick=True), 0.0)  # type: ignore[arg-type]
        assert ref is not None and not problem and not changes, (name, problem, changes[:3])
        assert seconds > 0


def test_an_experiment_on_real_models_runs_with_the_shared_pool_idle(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Points on a real backend measure this machine's step times: ``run_many`` plans nothing past such an
    experiment before it has run, and starts it once every point submitted before it has finished. (TurboSpec's
    Fig. 2 stands in for real_smoke, which needs PyTorch.)"""
    from repro.experiments import launch, planning, runner

    real_one, after = "turbospec_fig2", "turbospec_fig9"
    monkeypatch.setattr(planning, "runs_real", lambda ctx: ctx.spec.name == real_one)
    planned: list[str] = []
    seen: dict[str, object] = {}
    plan, run, idle = runner.plan_experiment, runner.run_experiment, launch.PointPool.wait_idle

    def waiting(self: launch.PointPool) -> None:
        seen["waited"] = list(planned)
        idle(self)

    monkeypatch.setattr(launch.PointPool, "wait_idle", waiting)

    def planning(cfg: object, *args: object, **kwargs: object) -> runner.RunContext:
        ctx = plan(cfg, *args, **kwargs)  # type: ignore[arg-type]
        planned.append(ctx.spec.name)
        return ctx

    def running(*args: object, **kwargs: object) -> runner.ExperimentResult:
        ctx = kwargs.get("planned")
        if ctx is not None and ctx.spec.name == real_one:  # type: ignore[attr-defined]
            seen["queued"] = ctx.pool.queued()  # type: ignore[attr-defined]
            seen["planned"] = list(planned)
        return run(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "plan_experiment", planning)
    monkeypatch.setattr(runner, "run_experiment", running)
    names = ["smoke", real_one, after]
    runs = list(check.run_many(names, True, lambda name: tmp_path / name, n_jobs=2))
    assert [name for name, *_ in runs] == names
    assert seen == {"waited": ["smoke", real_one], "queued": 0, "planned": ["smoke", real_one]}, seen
    assert planned == names


def test_check_names_an_unknown_experiment() -> None:
    res = _cli("check", "no_such_exp")
    assert res.returncode == 2 and res.stderr.startswith("error: unknown experiment") and "no_such_exp" in res.stderr


@pytest.mark.slow
def test_all_writes_references_and_index(tmp_path: Path) -> None:
    res = _cli("all", "--quick", "smoke", "nightjar_fig3", "--results", str(tmp_path), "--n-jobs", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    for name in ("smoke", "nightjar_fig3"):
        assert (tmp_path / "quick" / name / "points.csv").is_file()
        assert not list((tmp_path / "quick" / name).glob("*.png"))  # quick references keep the tables only
    (index_file,) = (tmp_path / "quick").glob("INDEX*.md")  # INDEX.nodata.md where there is no data folder
    index = index_file.read_text()
    assert "[smoke](smoke/summary.md)" in index and "[nightjar_fig3](nightjar_fig3/summary.md)" in index
    assert "catalogue: 2 experiments" in res.stdout


def test_index_keeps_the_rows_of_experiments_not_rerun(tmp_path: Path) -> None:
    # `repro all NAME` rewrites NAME's row of the catalogue and keeps every other experiment's
    from repro.experiments.check import index_markdown, read_index_rows

    old = {"smoke": "| [smoke](smoke/summary.md) | S | 9 | 0 | 0 | - | 7 | (none) |",
           "calibration": "| [calibration](calibration/summary.md) | C | 62 | 0 | 0 | - | 2 | (none) |",
           "gone": "| [gone](gone/summary.md) | G | 1 | 0 | 0 | - | 5 | (none) |"}
    index = tmp_path / "INDEX.md"
    index.write_text(index_markdown(old, quick=False, results=tmp_path))
    rows = read_index_rows(index)
    assert rows == old
    rows["smoke"] = "| [smoke](smoke/summary.md) | S | 12 | 1 | 0 | - | 8 | (none) |"
    text = index_markdown(rows, quick=False, results=tmp_path)
    assert text.index("[calibration]") < text.index("[gone]") < text.index("[smoke]")
    assert "| 12 | 1 | 0 | - | 8 |" in text and "Total wall time: 15 s." in text


def test_a_robustness_check_leaves_out_the_claims_on_wall_clock_metrics() -> None:
    """AdaServe's scheduling time is this CPU's: whether its claim holds moves with the machine's load, so
    ``check --robustness`` compares every other claim's rows and not its own (as ``check`` skips wall-clock columns)."""
    from repro.experiments.check import untimed

    claims = [{"text": "scheduling overhead is small\n beside model execution", "metric": "mean_iter_schedule_ms"},
              {"text": "goodput is higher", "metric": "goodput"}]
    frame = pd.DataFrame({"setting": ["s000"] * 3, "claim": ["scheduling overhead is small beside model execution",
                                                            "goodput is higher", "goodput is higher [variant]"]})
    assert untimed(frame, claims)["claim"].tolist() == ["goodput is higher", "goodput is higher [variant]"]
    assert untimed(frame, claims[1:]).equals(frame)
