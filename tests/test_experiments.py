"""Every experiment in quick mode end to end, checked cell by cell against its committed quick reference
(``results/quick/NAME``: what ``python -m repro check --quick`` does in CI); determinism; resume after a real kill.

A failure here means a change moved an experiment's results. If the change is meant, regenerate the reference
(``python -m repro check NAME --quick --update``, with and without the data folder: see docs/regression.md,
"Regression tracking") and say in the commit which experiments moved and why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from repro.experiments import check, results
from tests.conftest import QuickRuns

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*.yaml"))
WALL = ["wall_s"]


def _repro(*args: str, out: Path, wait: bool = True) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "repro", *args, f"out_dir={out}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_experiment_quick_matches_its_reference(exp: str, quick_runs: QuickRuns, data: str) -> None:
    skip = check.skip_reason(exp, quick=True)  # an experiment on real models without PyTorch + transformers here
    if skip:
        pytest.skip(f"{exp}: {skip}")
    # both data modes in one session: the files (skipped without them) against results/quick/NAME, none at all
    # against its nodata/ reference; the run with no data pins its empty folder, so CI's second pass need not
    # repeat it (tests/data_record.py)
    res = quick_runs.get(exp, data)
    for name in ("points.csv", "summary.md", "manifest.json"):
        assert (res.out_dir / name).is_file(), name
    assert list(res.out_dir.glob("*.png")) and list(res.out_dir.glob("*.pdf"))
    assert len(res.points) > 0
    assert res.summary_line().startswith(f"{exp}: {len(res.points)} points")  # the closing line
    ref, problem, changes = check.against_reference(res, results.reference_dir(exp, quick=True))
    assert ref is not None, problem
    outcome = check.Outcome(exp, ref, changes)
    assert not changes, (f"{exp} moved from {ref} (if on purpose: python -m repro check {exp} --quick --update)\n"
                         + check.changes_table([outcome]))


def test_calibration_draws_a_figure_per_linear_table(quick_runs: QuickRuns, data: str) -> None:
    res = quick_runs.get("calibration", data)  # the run the reference check above made
    out, pts = res.out_dir, res.points
    assert {"table", "kind", "measured_ms", "modelled_ms", "rel_err", "tolerance"} <= set(pts.columns)
    assert (out / "calibration_anchors.png").exists() and (out / "manifest.json").exists()
    linear = pts[pts["kind"] == "linear"]["table"].nunique()
    assert linear and len(list(out.glob("calibration_*_linear.png"))) == linear
    assert "within tolerance" in (out / "summary.md").read_text()


def test_same_seed_same_points(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for out, jobs in ((a, "1"), (b, "2")):
        res = _repro("+exp=smoke", "quick=true", f"n_jobs={jobs}", out=out)
        assert res.returncode == 0, res.stdout + res.stderr  # type: ignore[union-attr]
    pa, pb = pd.read_csv(a / "points.csv"), pd.read_csv(b / "points.csv")
    pd.testing.assert_frame_equal(pa.drop(columns=WALL), pb.drop(columns=WALL))
    lines_a = (a / "points.csv").read_text().splitlines()
    lines_b = (b / "points.csv").read_text().splitlines()
    col = lines_a[0].split(",").index("wall_s")
    def strip(lines: list[str]) -> list[str]:
        return [",".join(c for i, c in enumerate(line.split(",")) if i != col) for line in lines]

    assert strip(lines_a) == strip(lines_b)  # byte-identical apart from the wall-clock column


@pytest.mark.slow
def test_resume_after_kill(tmp_path: Path) -> None:
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    args = ("+exp=smoke", "n_jobs=1", "num_requests=80")
    proc = _repro(*args, out=killed, wait=False)
    csv = killed / "points.csv"
    deadline = time.time() + 120
    while time.time() < deadline:  # kill once at least two points are on disk
        if csv.exists() and len(csv.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    proc.wait()  # type: ignore[union-attr]
    done_before = len(pd.read_csv(csv))
    assert 2 <= done_before < 9
    res = _repro(*args, "resume=true", out=killed)
    assert res.returncode == 0, res.stdout + res.stderr  # type: ignore[union-attr]
    res = _repro(*args, out=clean)
    assert res.returncode == 0
    pk, pc = pd.read_csv(killed / "points.csv"), pd.read_csv(clean / "points.csv")
    assert len(pk) == len(pc) == 9 and not pk.duplicated(["system", "rps", "seed"]).any()
    pd.testing.assert_frame_equal(pk.drop(columns=WALL), pc.drop(columns=WALL))
