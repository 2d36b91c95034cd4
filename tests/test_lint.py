"""The code base stays ruff- and mypy-clean (run as part of the test suite, so CI checks it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("tool", [["ruff", "check", "."], [sys.executable, "-m", "mypy"]], ids=["ruff", "mypy"])
def test_clean(tool: list[str]) -> None:
    if tool[0] == "ruff" and shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    res = subprocess.run(tool, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
