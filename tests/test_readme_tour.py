"""The README's short tour, in order, as a new user runs it from a fresh clone.

Two tests:

- ``test_the_tour_plans_in_order`` (every run): each ``python -m repro`` run of the tour composed and planned, in
  order, without running its points: it is accepted, its default folder differs from every earlier command's (two
  commands that compute different things never meet in one folder), and every folder ``python -m repro.render``
  redraws is one an earlier command wrote.
- ``test_the_tour_runs_in_order`` (``-m tour``: about ten minutes per data mode, so not in CI's run): every command
  of the tour, as written, in a fresh copy of the tracked files, with the data folder and without it; each must exit
  0, and each run's closing line must name the folder the README says.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FILES = {  # what the tour's "bring your own data" commands read: written by the test, as a user would bring them
    "my_trace.csv": "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{0.1 * i:.1f},{50 + 7 * i},{20 + 3 * i}\n" for i in range(40)),
    "my_prompts.jsonl": "".join(f'{{"prompt": "Explain item {i} {"more " * (i % 5)}", "response": '
                                f'"{"Because " * (3 + i % 7)}"}}\n' for i in range(30)),
}


def tour() -> list[list[str]]:
    """The README's tour section: every ``python -m repro ...`` line of its bash blocks, in order, comments removed,
    as argument lists."""
    text = (REPO / "README.md").read_text()
    section = text.split("## A short tour", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [shlex.split(ln, comments=True) for b in blocks for ln in b.splitlines()
            if ln.strip().startswith("python -m repro")]


def test_the_tour_has_what_the_issue_tried() -> None:
    cmds = [" ".join(c) for c in tour()]
    assert len(cmds) >= 16
    for needle in ("+exp=smoke quick=true", "repro.render runs/quick/smoke", "system.k=5", "edge.rtt_ms=20",
                   "check --quick", "robustness nightjar_fig9", "workload=trace_file", "name: hf"):
        assert any(needle in c for c in cmds), needle


def test_the_tour_plans_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.__main__ import case_key_args
    from repro.experiments import runner
    from repro.experiments.compose import compose_config, hydra_context
    from repro.experiments.results import CONF_DIR, default_out_dir

    monkeypatch.setattr(runner, "default_out_dir",
                        lambda name, quick, changes=(): default_out_dir(name, quick, changes, root=tmp_path))
    monkeypatch.chdir(tmp_path)
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    written: dict[Path, str] = {}
    for cmd in tour():
        args = cmd[3:]  # after "python -m repro"
        line = " ".join(cmd)
        if cmd[2] == "repro.render":
            folder = (tmp_path / args[0]).resolve()
            assert folder in written, f"{line}: no earlier command of the tour writes {args[0]}"
            continue
        if args[:1] and args[0] in ("list", "check", "robustness", "sim_vs_real", "all"):
            continue  # folders of their own (runs/check, runs/robustness, runs/sim_vs_real)
        overrides = case_key_args(args)
        with hydra_context(CONF_DIR):
            cfg = compose_config(overrides)
        ctx = runner.prepare_run(cfg, overrides, CONF_DIR, None, lambda _: None)
        folder = ctx.out_dir.resolve()
        changes = [a for a in overrides if not a.startswith(("+exp=", "quick=", "n_jobs="))]
        assert ("@" in folder.name) == bool(changes), f"{line} writes {folder.name}"  # the plain folder: as written
        assert folder not in written or written[folder] == line, (
            f"{line} writes {folder.relative_to(tmp_path)}, as the earlier {written.get(folder)}")
        written[folder] = line
    assert len(written) >= 10


def _fresh_copy(dest: Path) -> Path:
    """The tracked files of the checkout (as a clone has them), without runs/ or a virtual environment."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=False).stdout.split()
    if not files:
        pytest.skip("needs git to list the tracked files")
    for f in files:
        src = REPO / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


@pytest.mark.tour
@pytest.mark.slow
@pytest.mark.parametrize("data", ["files", "none"])
def test_the_tour_runs_in_order(tmp_path: Path, data: str) -> None:
    from tests.conftest import data_root

    root = data_root() if data == "files" else None
    if data == "files" and root is None:
        pytest.skip("needs the data folder ($REPRO_DATA or ../shared/data)")
    empty = tmp_path / "empty"
    empty.mkdir()
    copy = _fresh_copy(tmp_path / "specrepro")
    for name, text in FILES.items():
        (copy / name).write_text(text)
    env = {**os.environ, "REPRO_DATA": str(root or empty), "PYTHONPATH": str(copy)}
    times = []
    for cmd in tour():
        if cmd[3:4] == ["sim_vs_real"] and importlib.util.find_spec("torch") is None:
            continue  # the README says it needs .[real]
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, *cmd[1:]], cwd=copy, env=env, capture_output=True, text=True,
                             timeout=1200)
        line = " ".join(cmd)
        times.append(f"{time.perf_counter() - t0:7.1f} s  {line}")
        assert res.returncode == 0, f"{line} (data: {data}) exited {res.returncode}:\n{res.stdout[-2000:]}\n" \
                                    f"{res.stderr[-3000:]}"
        last = (res.stdout.strip().splitlines() or [""])[-1]
        if cmd[2] == "repro" and "=" in " ".join(cmd[3:]) and "check" not in cmd:
            assert re.search(r" -> runs/\S+/summary\.md$", last), f"{line}: {last}"
    print(f"\nthe tour (data: {data}), load {os.getloadavg()[0]:.1f} at the end:\n" + "\n".join(times))
