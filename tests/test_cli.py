"""The command line: ``python -m repro list``, one-line config errors (exit 2), ``python -m repro.plot``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_list_names_every_group() -> None:
    res = cli("-m", "repro", "list")
    assert res.returncode == 0, res.stderr
    for group in ("exp", "system", "workload", "hardware", "model", "oracle"):
        assert f"{group} (" in res.stdout
    assert "calibration" in res.stdout and "vllm" in res.stdout and "a100-80g" in res.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["bogus=1"], "bogus"),  # unknown top-level key
        (["exp.nonexistent_key=1"], "exp.nonexistent_key"),  # unknown key inside exp
        (["+exp=no_such_exp"], "no_such_exp"),  # unknown experiment
        (["system=no_such_system"], "no_such_system"),  # unknown system config
        (["draft=vicuna-160m"], "model@draft=vicuna-160m"),  # a group key set like a plain value
    ],
)
def test_config_typo_is_one_line_exit_2(tmp_path: Path, args: list[str], named: str) -> None:
    res = cli("-m", "repro", "+exp=calibration", f"out_dir={tmp_path}", *args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_calibration_and_redraw(tmp_path: Path) -> None:
    pytest.importorskip("repro.cost.calibration", reason="repro.cost.calibration not written yet")
    out = tmp_path / "cal"
    res = cli("-m", "repro", "+exp=calibration", f"out_dir={out}")
    assert res.returncode == 0, res.stderr
    assert "calibration:" in res.stdout
    for f in (
        "points.csv",
        "manifest.json",
        "summary.md",
        "calibration_anchors.png",
        "calibration_anchors.pdf",
    ):
        assert (out / f).exists(), f
    (out / "calibration_anchors.png").unlink()
    (out / "summary.md").unlink()
    res = cli("-m", "repro.plot", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "calibration_anchors.png").exists() and (out / "summary.md").exists()


def test_plot_missing_folder_is_one_line(tmp_path: Path) -> None:
    res = cli("-m", "repro.plot", str(tmp_path / "nothing"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "points.csv" in res.stderr
