"""``backend=openai`` end to end: a point's workload replayed against a live OpenAI-compatible server started here
(:mod:`repro.backends.openai_server` on a tiny random-weight model, CPU), through ``run_point`` and through the
command line, with the simulator's and vLLM's metrics in points.csv. Skipped without PyTorch + transformers (the
server's model; the client itself needs neither)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch", reason="the test server runs a model: pip install torch==2.13.0 (CPU build)")
pytest.importorskip("transformers", reason="the test server runs a model: pip install -e '.[real]'")

from repro.backends.models import build_model
from repro.backends.openai_server import Server, serve
from repro.core.errors import ConfigError, ReproError
from repro.experiments.simulate import compose, run_point
from repro.metrics.summary import RENAMED

ROOT = Path(__file__).resolve().parents[2]
N, PROMPT, OUTPUT = 5, 12, 8


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve(build_model("llama-68m", tiny=True, seed=0), model_name="tiny", num_threads=1) as srv:
        yield srv


def _overrides(url: str) -> list[str]:
    return ["backend=openai", f"backend.url={url}", "backend.model=tiny", "backend.vocab_size=512", "model=llama-68m",
            "workload=fixed", f"workload.input_len={PROMPT}", f"workload.output_len={OUTPUT}", f"num_requests={N}",
            "rps=40"]


def test_a_point_replayed_against_a_live_server(server: Server) -> None:
    res = run_point(compose(_overrides(server.url)))
    m, req = res.metrics, res.requests
    assert m["completed"] == N and m["failed"] == 0
    assert m["total_output_tokens"] == N * OUTPUT
    assert (req["output_len"] == OUTPUT).all()
    assert (req["first_token_at"] >= req["arrival_s"]).all() and (req["finish_at"] >= req["first_token_at"]).all()
    for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms",
                "request_throughput", "output_throughput"):
        assert math.isfinite(m[key]) and m[key] > 0, key
    # vLLM's TPOT is (E2E - TTFT) / (tokens - 1) per request: with one token per chunk it is the mean ITL's scale
    assert m["mean_tpot_ms"] == pytest.approx(m["mean_itl_ms"], rel=0.5)
    # one name per metric, vLLM's: no total_input / duration / p50_* / throughput_tok_s beside their vLLM names
    assert not set(RENAMED) & set(m) and m["sim_time_s"] > 0


def test_the_replay_has_the_simulations_requests_and_slos(server: Server) -> None:
    """The same config and seed give the simulation's workload: its prompt lengths and its SLOs (derived from the
    deployment's baseline latency, as the simulation derives them), so attainment compares like with like."""
    over = [*_overrides(server.url), "++workload.slo_classes={u: {proportion: 1.0, tpot_slo_x_baseline: 2.0}}"]
    real = run_point(compose(over)).requests
    sim = run_point(compose([o for o in over if not o.startswith("backend")])).requests
    for col in ("prompt_len", "tpot_slo_s", "ttft_slo_s"):
        assert real[col].tolist() == sim[col].tolist(), col
    assert real["tpot_slo_s"].notna().all() and (real["tpot_slo_s"] > 0).all()


def test_the_command_line_writes_points_csv(server: Server, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "repro", *_overrides(server.url), f"out_dir={out}"], cwd=ROOT,
                          env={**os.environ}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pts = pd.read_csv(out / "points.csv")
    assert len(pts) == 1 and pts["completed"].iloc[0] == N and pts["mean_itl_ms"].iloc[0] > 0
    header = (out / "points.csv").read_text().splitlines()[0].split(",")
    assert len(header) == len(set(header)) and not set(RENAMED) & set(header)


def test_a_dead_server_or_a_wrong_model_stops_the_run_naming_the_cause(server: Server, tmp_path: Path) -> None:
    with pytest.raises(ReproError, match=r"cannot reach http://127\.0\.0\.1:9/v1/models .*refused"):
        run_point(compose(_overrides("http://127.0.0.1:9/v1")))
    with pytest.raises(ReproError, match=r"serves 'tiny', not 'nope': set backend\.model"):
        run_point(compose([*_overrides(server.url), "backend.model=nope"]))
    # the default name is the model config's Hugging Face id, as `vllm serve ID` serves it
    over = [o for o in _overrides(server.url) if not o.startswith("backend.model")]
    with pytest.raises(ReproError, match=r"not 'JackFram/llama-68m'"):
        run_point(compose(over))
    # and on the command line: exit 2, one line
    proc = subprocess.run([sys.executable, "-m", "repro", *_overrides("http://127.0.0.1:9/v1"),
                           f"out_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and last.startswith("error: point vllm") and "backend=openai: cannot reach" in last


def test_a_speculating_server_reports_vllms_acceptance(tmp_path: Path) -> None:
    """Against a server that exposes vLLM's spec-decode counters (the stand-in with a draft equal to its target:
    every draft accepted), the point reports vLLM's acceptance; the per-request detail is written as vllm bench serve
    --save-detailed writes it."""
    target = build_model("llama-68m", tiny=True, seed=0)
    with serve(target, model_name="tiny", num_threads=1, draft=target, num_spec_tokens=3) as spec:
        res = run_point(compose([*_overrides(spec.url), f"backend.save_detailed={tmp_path}"]))
    m = res.metrics
    assert m["completed"] == N and m["acceptance_rate"] == 1.0
    # 8 tokens a request: the prefill's, a step of 3 drafts + 1, then one of 2 drafts + 1 (a draft never runs past
    # max_tokens)
    assert m["spec_drafts"] == 2 * N and m["spec_draft_tokens"] == 5 * N and m["mean_accepted_len"] == 3.5
    assert m["accept_rate_pos0"] == m["accept_rate_pos1"] == 1.0 and m["accept_rate_pos2"] == 0.5
    (detail,) = tmp_path.glob("*.json")
    d = json.loads(detail.read_text())
    assert d["output_lens"] == [OUTPUT] * N and len(d["ttfts"]) == len(d["itls"]) == N and d["errors"] == [""] * N
    assert d["model_id"] == "tiny" and d["acceptance_rate"] == 1.0 and d["completed"] == N
    # without counters at /metrics (no draft), acceptance stays blank and the note says so
    with serve(target, model_name="tiny", num_threads=1) as plain:
        res = run_point(compose(_overrides(plain.url)))
    assert "acceptance_rate" not in res.metrics or math.isnan(res.metrics["acceptance_rate"])
    assert "reported no speculative-decoding counters" in res.notes[0]


def test_a_missing_url_is_named() -> None:
    with pytest.raises(ConfigError, match=r"backend\.url"):
        run_point(compose(["backend=openai", "model=llama-68m", "workload=fixed", "num_requests=2"]))


def test_the_workloads_closed_loop_limits_the_requests_in_flight(server: Server) -> None:
    """``max_concurrency=1`` (the simulator's key) sends one request at a time to the live server too: no two
    [send, finish] intervals overlap, and each request's release is kept beside its send."""
    req = run_point(compose([*_overrides(server.url), "max_concurrency=1"])).requests.sort_values("arrival_s")
    sent, fin = req["arrival_s"].to_numpy(), req["finish_at"].to_numpy()
    assert (fin[:-1] <= sent[1:]).all()
    assert (req["released_at"] <= req["arrival_s"]).all()
