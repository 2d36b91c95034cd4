"""``launcher=ray``: a sweep's points as Ray tasks on a local Ray equal the local run row for row, resume skips
finished points, and a failed point is reported with its overrides while the others finish. Skipped without Ray
(``pip install -e '.[ray]'``); ``launcher=submitit`` the same through submitit's local cluster, skipped without it
(``pip install -e '.[slurm]'``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from repro.core.errors import ReproError
from repro.experiments.compose import compose_config, hydra_context
from repro.experiments.launch import Outcome, execute_ray

ROOT = Path(__file__).resolve().parents[1]
# the subject does not depend on where the workload comes from: pinned to the embedded statistics
# (conftest.no_data), so CI's no-data pass need not repeat it
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_data")]
RAY = "launcher=ray needs Ray: pip install -e '.[ray]'"


def _repro(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=ROOT, env={**os.environ}, capture_output=True,
                          text=True, timeout=600)


def test_a_sweep_on_local_ray_equals_the_local_run_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason=RAY)
    common = ["+exp=smoke", "quick=true", "n_jobs=2"]
    local = _repro(*common, f"out_dir={tmp_path / 'local'}")
    assert local.returncode == 0, local.stderr[-2000:]
    on_ray = _repro(*common, "launcher=ray", f"out_dir={tmp_path / 'ray'}")
    assert on_ray.returncode == 0, on_ray.stderr[-2000:]
    a, b = (pd.read_csv(tmp_path / d / "points.csv").drop(columns=["wall_s"]) for d in ("local", "ray"))
    assert len(a) == 6
    pd.testing.assert_frame_equal(a, b)  # same rows, same order, same values (the run's config hashes too)
    again = _repro(*common, "launcher=ray", "resume=true", f"out_dir={tmp_path / 'ray'}")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "(6 resumed)" in again.stdout + again.stderr
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "ray" / "points.csv").drop(columns=["wall_s"]), b)


def test_a_failed_point_is_reported_and_the_others_finish() -> None:
    pytest.importorskip("ray", reason=RAY)
    with hydra_context():
        good = compose_config(["system=vllm", "num_requests=5"])
        bad = compose_config(["system=adaserve", "num_requests=5", "oracle.width=2"])  # w_max 16 > the drafter's 2
    done: list[Outcome] = []
    with pytest.raises(ReproError, match=r"1 point\(s\) failed on Ray.*the bad one: .*w_max=16"):
        execute_ray([0, 1], [good, bad], [False, False], 2, done.append, {"kind": "ray"},
                     lambda i: "the bad one" if i else "the good one")
    assert [o.index for o in done] == [0] and done[0].metrics["completed"] == 5


def test_a_sweep_through_submitit_equals_the_local_run(tmp_path: Path) -> None:
    """``launcher=submitit`` with its local cluster (Slurm's code path, with processes on this machine)."""
    pytest.importorskip("submitit", reason="launcher=submitit needs submitit: pip install -e '.[slurm]'")
    common = ["+exp=smoke", "quick=true", "n_jobs=2"]
    local = _repro(*common, f"out_dir={tmp_path / 'local'}")
    sub = _repro(*common, "launcher=submitit", "launcher.cluster=local", f"launcher.folder={tmp_path / 'jobs' / '%j'}",
                 f"out_dir={tmp_path / 'sub'}")
    assert local.returncode == 0 and sub.returncode == 0, sub.stderr[-2000:]
    a, b = (pd.read_csv(tmp_path / d / "points.csv").drop(columns=["wall_s"]) for d in ("local", "sub"))
    pd.testing.assert_frame_equal(a, b)


def test_without_ray_the_launcher_says_what_to_install(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is installed here")
    res = _repro("+exp=smoke", "quick=true", "launcher=ray", f"out_dir={tmp_path}")
    assert res.returncode == 2 and "launcher=ray needs Ray: pip install -e '.[ray]'" in res.stderr
