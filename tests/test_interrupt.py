"""Runs you can stop: Ctrl-C, SIGTERM and SIGKILL of ``python -m repro`` keep the finished points, leave no worker
running and resume computes only the rest; a refused or failed run leaves an earlier run's folder byte-identical.
Linux (reads /proc)."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the subject does not depend on where the workload comes from: pinned to the embedded statistics
# (conftest.no_data), so CI's no-data pass need not repeat it
pytestmark = [pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
              pytest.mark.usefixtures("no_data")]

# 6 points of ~0.5-3 s each (every step through the policy): slow enough to stop a run half-way
SLOW = ["+exp=smoke", "num_requests=150", "+engine.fast_forward=false", "exp.systems=[vllm,sarathi]",
        "exp.grid.rps=[1,1.5,2]"]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background shell job starts with Ctrl-C ignored


def start(out: Path, *extra: str) -> subprocess.Popen[str]:
    """``python -m repro`` in a session of its own (a terminal's Ctrl-C reaches its whole process group)."""
    return subprocess.Popen([sys.executable, "-m", "repro", *SLOW, f"out_dir={out}", *extra], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)


def rows(out: Path) -> int:
    """Complete rows of points.csv (0 while it does not exist)."""
    try:
        text = (out / "points.csv").read_text()
    except FileNotFoundError:
        return 0
    return max(text.count("\n") - 1, 0)


def wait_for_rows(proc: subprocess.Popen[str], out: Path, n: int, timeout_s: float = 180.0) -> None:
    t0 = time.monotonic()
    while rows(out) < n:
        assert proc.poll() is None, f"the run ended before {n} points were saved: {proc.communicate()}"
        assert time.monotonic() - t0 < timeout_s, "no point saved in time"
        time.sleep(0.05)


def processes_of(out: Path) -> set[int]:
    """Live processes whose command line names ``out`` (the run and its forked workers, wherever re-parented)."""
    found = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if str(out).encode() in (d / "cmdline").read_bytes() and (d / "stat").read_text().split()[2] != "Z":
                found.add(int(d.name))
        except OSError:  # ended meanwhile
            continue
    return found


def workers_of(proc: subprocess.Popen[str], out: Path) -> set[int]:
    """The run's worker processes, once its pool has started them."""
    t0 = time.monotonic()
    while len(found := processes_of(out) - {proc.pid}) < 2 and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    return found


def none_left(out: Path, timeout_s: float = 10.0) -> bool:
    t0 = time.monotonic()
    while processes_of(out):
        if time.monotonic() - t0 > timeout_s:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def out(tmp_path: Path) -> Iterator[Path]:
    """The run's folder; whatever process of the run a failed test leaves behind is killed."""
    folder = tmp_path / "run"
    yield folder
    for pid in processes_of(folder):
        os.kill(pid, signal.SIGKILL)


def resume(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", *SLOW, f"out_dir={out}", *extra, "resume=true"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def one_stop_line(stderr: str) -> str:
    """The run's last stderr line, checked to be the only one about the stop and free of tracebacks."""
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert sum(ln.startswith("interrupted") for ln in lines) == 1, stderr
    return lines[-1]


@pytest.mark.parametrize(
    ("n_jobs", "how", "status"),
    [
        (2, signal.SIGINT, 130),  # Ctrl-C at a terminal: the whole process group, workers included
        (1, signal.SIGINT, 130),  # the same in-process
        (2, signal.SIGTERM, 143),  # `kill PID`, a batch system's stop: the main process only
    ],
)
def test_a_stopped_run_keeps_its_points_and_says_how_to_resume(out: Path, n_jobs: int, how: int,
                                                               status: int) -> None:
    proc = start(out, f"n_jobs={n_jobs}")
    wait_for_rows(proc, out, 1)
    workers = workers_of(proc, out) if n_jobs > 1 else set()
    assert len(workers) == (2 if n_jobs > 1 else 0)
    if how == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(how)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == status, stderr
    line = one_stop_line(stderr)
    m = re.fullmatch(r"interrupted: (\d+) of 6 points saved in (\S+); resume with: python -m repro (.*)", line)
    assert m, line
    saved = int(m[1])
    assert 1 <= saved < 6 and rows(out) == saved and Path(m[2]) == out / "points.csv"
    assert m[3].endswith(f"n_jobs={n_jobs} resume=true") and f"out_dir={out}" in m[3]
    assert none_left(out)
    if n_jobs == 2 and how == signal.SIGINT:
        again = resume(out, f"n_jobs={n_jobs}")
        assert again.returncode == 0, again.stderr
        assert "smoke: 6 points of vllm, sarathi in" in again.stdout and f"({saved} resumed)" in again.stdout


def test_a_killed_run_leaves_no_worker_and_resumes(out: Path) -> None:
    proc = start(out, "n_jobs=2")
    wait_for_rows(proc, out, 1)
    workers = workers_of(proc, out)
    assert len(workers) == 2
    proc.kill()  # SIGKILL: no chance to stop the workers
    proc.communicate(timeout=30)  # the workers held its pipes: this returns once they are gone too
    assert none_left(out), f"workers {processes_of(out)} outlived the run"
    saved = rows(out)
    assert 1 <= saved < 6
    again = resume(out, "n_jobs=2")
    assert again.returncode == 0, again.stderr
    assert f"({saved} resumed)" in again.stdout


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_refused_or_failed_run_leaves_the_earlier_run_untouched(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = subprocess.run([sys.executable, "-m", "repro", "+exp=smoke", "quick=true", "n_jobs=1", f"out_dir={out}"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    before = _hashes(out)
    for extra, named in [
        (["system=static_sd_k5", "rps=3"], "overwrite=true"),  # narrowed into the same folder
        (["workload=trace_file", "workload.path=no/such/trace.csv"], "workload.path=no/such/trace.csv"),
        (["hardware=h100-80g"], "holds another run of smoke"),  # other points, not narrowed
    ]:
        res = subprocess.run([sys.executable, "-m", "repro", "+exp=smoke", "quick=true", "n_jobs=1",
                              f"out_dir={out}", *extra], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert res.returncode == 2, res.stderr
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and named in last and "Traceback" not in res.stderr, res.stderr
        assert _hashes(out) == before, extra
