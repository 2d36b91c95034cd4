"""Every recipe in the manual's Recipes page (``docs/recipes.md``) runs as written (with ``quick=true``, on small
files written here).

The commands are read from the page itself, so a recipe that stops working, or an edit of the page that breaks one,
fails here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
# the subject does not depend on where the workload comes from: pinned to the embedded statistics
# (conftest.no_data), so CI's no-data pass need not repeat it; one worker process (parallel runs are the quick
# references' own path), which each of these small runs would spend more starting than running
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_data")]


def recipes_section() -> str:
    """The Recipes page, whole: every ``python -m repro`` line of its bash blocks is a recipe."""
    return (REPO / "docs" / "recipes.md").read_text()


def commands() -> list[str]:
    section = recipes_section()
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip().startswith("python -m repro")]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", recipes_section(), flags=re.S)


def test_the_section_has_every_recipe_the_issue_names() -> None:
    text = " ".join(commands())
    for needle in ("exp.systems=", "exp.systems=[+", "system.k=5", "workload.arrival.segments=", "workload=trace_file",
                   "name: hf"):
        assert needle in text, needle
    assert python_blocks() and "tpot_ms" in python_blocks()[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the files the recipes name: a Vidur-format trace and a JSONL of prompts and responses."""
    d = tmp_path_factory.mktemp("recipes")
    pd.DataFrame({"arrived_at": [0.1 * i for i in range(40)], "num_prefill_tokens": [50 + 7 * i for i in range(40)],
                  "num_decode_tokens": [20 + 3 * i for i in range(40)]}).to_csv(d / "my_trace.csv", index=False)
    rows = [{"prompt": f"Explain item {i} " * (1 + i % 5), "response": "Because " * (3 + i % 7)} for i in range(30)]
    (d / "my_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.mark.parametrize("index", range(len(commands())))
def test_recipe_runs(index: int, workdir: Path, tmp_path: Path) -> None:
    cmd = commands()[index]
    args = shlex.split(cmd)[3:]  # after "python -m repro"
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf_cache")}
    res = subprocess.run([sys.executable, "-m", "repro", *args, "quick=true", "n_jobs=1", f"out_dir={tmp_path}",
                          "num_requests=40"], cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{cmd}\n{res.stdout}\n{res.stderr}"
    pts = pd.read_csv(tmp_path / "points.csv")
    assert len(pts) > 0 and (pts["completed"] > 0).all(), pts


def test_python_recipe_runs(workdir: Path) -> None:
    code = python_blocks()[0]
    res = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "latency_s" in res.stdout and "tpot_ms" in res.stdout
