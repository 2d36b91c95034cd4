"""The command line: ``python -m repro list``, one-line config errors (exit 2), ``python -m repro.render`` (and its
older name ``python -m repro.plot``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import QuickRuns

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_list_names_every_group() -> None:
    res = cli("-m", "repro", "list")
    assert res.returncode == 0, res.stderr
    for group in ("exp", "system", "workload", "hardware", "engine", "model", "oracle"):
        assert f"{group} (" in res.stdout
    assert "calibration" in res.stdout and "vllm" in res.stdout and "a100-80g" in res.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["bogus=1"], "bogus"),  # unknown top-level key
        (["exp.nonexistent_key=1"], "exp.nonexistent_key"),  # unknown key inside exp
        (["+exp.sytems=[vllm]"], "exp.sytems (did you mean 'systems'?)"),  # added, then refused by the exp schema
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


def test_a_draft_target_pair_without_acceptance_is_one_line_exit_2(tmp_path: Path) -> None:
    """The oracle has no table for the pair: found when the first step speculates, printed as one line."""
    res = cli("-m", "repro", "system=static_sd_k3", "model=qwen3-32b", "model@draft=qwen3-4b", "num_requests=5",
              f"out_dir={tmp_path}")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "no acceptance table for draft 'qwen3-4b' with target 'qwen3-32b'" \
        in lines[-1], res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("args", [["cost", "--help"], ["cost"], ["+exp=smoke", "quick"]])
def test_unknown_command_is_one_line_exit_2(args: list[str]) -> None:
    # a bare word is neither a command nor an override: one line naming it, not Hydra's parser traceback
    res = cli("-m", "repro", *args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"'{args[-1] if args[-1] != '--help' else 'cost'}'" in lines[0], res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.usefixtures("no_data")  # the cost model's calibration reads no workload: no need to run it twice
def test_calibration_redraws_from_its_folder(quick_runs: QuickRuns, tmp_path: Path) -> None:
    """``python -m repro.render DIR`` redraws a calibration run (its figures and summary.md) from points.csv: the
    session's quick calibration run (shared with its reference check), copied, less a figure and its summary."""
    out = tmp_path / "cal"
    shutil.copytree(quick_runs.get("calibration", "none").out_dir, out)
    for f in ("points.csv", "manifest.json", "summary.md", "calibration_anchors.png", "calibration_anchors.pdf"):
        assert (out / f).exists(), f
    (out / "calibration_anchors.png").unlink()
    (out / "summary.md").unlink()
    res = cli("-m", "repro.experiments.render", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "calibration_anchors.png").exists() and (out / "summary.md").exists()


def test_plot_missing_folder_is_one_line(tmp_path: Path) -> None:
    res = cli("-m", "repro.plot", str(tmp_path / "nothing"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "points.csv" in res.stderr


def test_list_has_no_empty_group() -> None:
    res = cli("-m", "repro", "list")
    assert "(0):" not in res.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["+exp=smoke", "rps=abc"], "rps=abc"),  # wrong type for a swept key
        (["+exp=smoke", "rps=-1"], "rps=-1"),  # out of range
        (["model=llama2-7b", "tp=3"], "tp=3"),  # 32 heads over 3 GPUs
        (["n_jobs=0"], "n_jobs=0"),
        (["quick=maybe"], "quick=maybe"),
        (["hardware.memory_gb=1"], "memory_gb=1"),  # the model does not fit
        (["num_request=50"], "did you mean 'num_requests'"),  # Hydra's own hint would be +num_request=50 ...
        (["+num_request=50"], "num_request"),  # ... which is refused as well
        (["+exp=turbospec_fig13", "panel=nope"], "panel=nope"),  # no such case
        (["engine.block_size=0"], "engine.block_size=0"),
        (["+exp=adaserve_fig8", "system.w_max=4"], "system=adaserve system.w_max="),  # a knob of some systems
    ],
)
def test_bad_value_is_one_line_exit_2(tmp_path: Path, args: list[str], named: str) -> None:
    res = cli("-m", "repro", *args, f"out_dir={tmp_path}")
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], res.stderr
    assert not (tmp_path / "points.csv").exists()  # refused before anything ran


def test_repro_data_pointing_nowhere_is_an_error(tmp_path: Path) -> None:
    env = {**os.environ, "REPRO_DATA": str(tmp_path / "no_such_folder")}
    res = subprocess.run([sys.executable, "-m", "repro", f"out_dir={tmp_path}"], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env=env)
    assert res.returncode == 2 and "REPRO_DATA" in res.stderr and "no_such_folder" in res.stderr, res.stderr


def test_one_knob_narrows_and_says_so(tmp_path: Path) -> None:
    res = cli("-m", "repro", "+exp=smoke", "system=static_sd_k5", "rps=3", "quick=true", f"out_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    pts = pd.read_csv(tmp_path / "points.csv")
    assert pts["system"].tolist() == ["static_sd_k5"] and pts["rps"].tolist() == [3]
    narrowed = [ln for ln in res.stderr.splitlines() if ln.startswith("narrowed: ")]
    assert len(narrowed) == 2 and "system=static_sd_k5" in narrowed[0] and "rps=3" in narrowed[1]
    summary = (tmp_path / "summary.md").read_text()
    assert "Command line: `system=static_sd_k5 rps=3`" in summary and summary.count("Narrowed: ") == 2
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["systems"] == ["static_sd_k5"] and manifest["command_line"] == ["system=static_sd_k5", "rps=3"]


def test_closing_line_says_what_the_user_came_for(tmp_path: Path) -> None:
    res = cli("-m", "repro", "+exp=turbospec_fig5", "quick=true", f"out_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    last = res.stdout.strip().splitlines()[-1]
    assert re.match(r"turbospec_fig5: \d+ points of static_sd in [0-9.]+ s; paper claims: \d+ hold, \d+ differ",
                    last), last
    assert "data: fixed lengths" in last and last.endswith(f"-> {tmp_path / 'summary.md'}")
    assert re.search(r"turbospec_fig5: \d+/\d+ points", res.stderr)  # progress lines where stderr is no terminal


def test_without_an_experiment_the_chosen_system_runs(tmp_path: Path) -> None:
    means = {}
    for system in ("vllm", "static_sd_k3"):
        out = tmp_path / system
        res = cli("-m", "repro", f"system={system}", "num_requests=40", f"out_dir={out}")
        assert res.returncode == 0, res.stderr
        pts = pd.read_csv(out / "points.csv")
        manifest = json.loads((out / "manifest.json").read_text())
        assert pts["system"].tolist() == [system] and manifest["systems"] == [system]
        assert manifest["config"]["system"]["_target_"].split(".")[-1] in ("VLLM", "StaticSD")
        means[system] = float(pts["mean_tpot_ms"].iloc[0])
    assert means["static_sd_k3"] < means["vllm"]  # not the same run under two names


def test_a_user_run_leaves_the_references_untouched(tmp_path: Path) -> None:
    """A run without out_dir writes runs/quick/NAME beside the project's results/, never into them: in a copy of the
    project (so the test writes only into its temporary folder, not the checkout's runs/)."""
    for part in ("repro", "systems", "workloads", "conf"):
        shutil.copytree(REPO / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "results" / "quick" / "smoke", tmp_path / "results" / "quick" / "smoke")
    ref = tmp_path / "results" / "quick" / "smoke" / "points.csv"
    before = ref.read_bytes()
    res = subprocess.run([sys.executable, "-m", "repro", "+exp=smoke", "quick=true", "n_jobs=2"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert ref.read_bytes() == before
    assert (tmp_path / "runs" / "quick" / "smoke" / "summary.md").is_file()
    assert "runs/quick/smoke/summary.md" in res.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # an empty axis, systems list or seeds list runs nothing (it used to write an empty run)
        (["+exp=smoke", "exp.grid.rps=[]"], "exp.grid.rps: an empty list sweeps no value"),
        (["+exp=adaserve_fig4", "exp.cases=[{label: a, grid: {rps: []}}]"], r"exp.cases\[a\].grid.rps: an empty"),
        (["+exp=smoke", "exp.systems=[]"], "exp.systems: an empty list runs no system"),
        (["+exp=smoke", "exp.seeds=[]"], "exp.seeds: an empty list runs no seed"),
        # a system the deployment cannot serve: GoodSpeed's family without draft servers, trees on batch expansion
        (["+exp=smoke", "exp.systems=[vllm,goodspeed]", "quick=true"],
         "point goodspeed seed=0 rps=2.0: GoodSpeed drafts on remote draft servers"),
        (["system=random_s"], "RandomS drafts on remote draft servers"),
        (["+exp=smoke", "exp.systems=[vllm,adaserve]", "engine=vllm_v0"],
         "AdaServe verifies token trees that branch and engine vllm_v0 cannot .*engine=flexflow"),
        (["system=specinfer", "engine=vllm_v0"], "SpecInfer verifies token trees"),
        # a grid key the experiment does not sweep: added (ignored by quick, a duplicate column without), or plain
        (["+exp=smoke", "+exp.grid.num_requests=[50,100]", "quick=true"],
         r"exp.grid.num_requests: experiment smoke does not sweep num_requests \(it sweeps rps; .*\): "
         "num_requests=50 sets one value for every point"),
        (["+exp=smoke", "+exp.grid.num_requests=[50,100]"], "experiment smoke does not sweep num_requests"),
        (["+exp=smoke", "exp.grid.num_requests=[50,100]"], "experiment smoke does not sweep num_requests"),
    ],
)
def test_refused_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch, args: list[str], named: str) -> None:
    from repro.__main__ import main

    monkeypatch.setattr(sys, "argv", ["repro"])  # main() sets it for Hydra
    with pytest.raises(SystemExit) as exit_:
        main([*args, f"out_dir={tmp_path}", "n_jobs=1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert re.search(named, err), err
    assert not (tmp_path / "points.csv").exists()


TRACE_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
BAD_TRACES = {
    "negative.csv": (TRACE_HEADER + "-2,50,20\n0,60,20\n", "row 1, column arrived_at: negative arrival time -2"),
    "text.csv": (TRACE_HEADER + "0,50,20\n1,lots,20\n",
                 "row 2, column num_prefill_tokens: 'lots' is not a token count"),
    "empty.csv": ("", "trace file empty.csv: the file is empty"),
    "unsorted.csv": (TRACE_HEADER + "0,50,20\n3,60,20\n1,70,20\n",
                     "row 3, column arrived_at: arrival time 1 is before"),
}


@pytest.mark.parametrize(
    ("args", "named"),
    [
        *[(["workload=trace_file", f"workload.path={name}"], said) for name, (_, said) in BAD_TRACES.items()],
        (["+exp=smoke", "out_dir=/proc/forbidden"], "out_dir=/proc/forbidden: cannot be created in /proc"),
        (["exp=smoke"], "exp=smoke: an experiment is named with a plus: +exp=smoke"),
        (["backend.base_url=http://x"], "backend.base_url: not a config key (did you mean 'backend.url'?)"),
        (["+exp=adaserve_fig44"], "+exp=adaserve_fig44: no such experiment (did you mean 'adaserve_fig4'"),
        (["system=static_sd_k33"], "system=static_sd_k33: no such system (did you mean 'static_sd_k3'"),
        (["model=llama2-7"], "model=llama2-7: no such model (did you mean 'llama2-7b'"),
        (["hardware=h100-80"], "hardware=h100-80: no such hardware config (did you mean 'h100-80g'"),
    ],
    ids=[*BAD_TRACES, "out_dir", "exp without +", "nested key", "experiment", "system", "model", "hardware"],
)
def test_front_door_refusals_are_one_line_exit_2_and_write_nothing(tmp_path: Path, args: list[str],
                                                                    named: str) -> None:
    """Issue 58's bad inputs: each refused before anything runs, in one line naming the key, file, row or column,
    with status 2, and no folder written (out_dir is given where the input is not itself the folder)."""
    for name, (text, _) in BAD_TRACES.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "out"
    extra = [] if any(a.startswith("out_dir=") for a in args) else [f"out_dir={out}"]
    res = subprocess.run([sys.executable, "-m", "repro", *args, *extra, "num_requests=20"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], res.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted(BAD_TRACES)


def test_help_starts_with_the_commands() -> None:
    res = cli("-m", "repro", "--help")
    assert res.returncode == 0, res.stderr
    head = "\n".join(res.stdout.splitlines()[:16])
    for word in ("+exp=NAME", "list", "check", "robustness", "sim_vs_real", " all ", "repro.render", "rps=[1,2]"):
        assert word in head, word
    assert "== Configuration groups ==" in res.stdout  # Hydra's help follows


def test_a_list_on_the_command_line_sweeps(tmp_path: Path) -> None:
    res = cli("-m", "repro", "+exp=smoke", "quick=true", "rps=[1,3]", "system=vllm", "num_requests=20", "n_jobs=1",
              f"out_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    assert "narrowed: rps=[1, 3]: sweeps rps over these values" in res.stderr
    assert sorted(pd.read_csv(tmp_path / "points.csv")["rps"]) == [1, 3]


def test_a_run_of_your_own_shows_its_numbers(tmp_path: Path) -> None:
    """A trace of your own with two systems: summary.md shows the headline metrics per system, under vLLM's bench
    names, and the figures; the closing line names the headline metric with each system's number."""
    trace = tmp_path / "my_trace.csv"
    trace.write_text(TRACE_HEADER + "".join(f"{0.1 * i:.1f},{50 + 7 * i},{20 + 3 * i}\n" for i in range(30)))
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "repro", "workload=trace_file", f"workload.path={trace}",
                          "exp.systems=[vllm,static_sd_k3]", "n_jobs=1", f"out_dir={out}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    last = res.stdout.strip().splitlines()[-1]
    assert re.search(r"output throughput vllm [\d,]+ tok/s, static_sd_k3 [\d,]+ tok/s", last), last
    text = (out / "summary.md").read_text()
    assert text.startswith("# Your run: vllm, static_sd_k3 serving llama2-7b on a100-80g, 2 points")
    table = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    for header in ("output tok/s", "mean TTFT ms", "p99 TPOT ms", "p99 E2E s", "acceptance length"):
        assert header in table, header
    rows = [ln for ln in table.splitlines() if ln.startswith("| vllm") or ln.startswith("| static_sd_k3")]
    assert len(rows) == 2
    assert (out / "results_output_throughput.png").is_file() and (out / "results_p99_latency_s.png").is_file()
