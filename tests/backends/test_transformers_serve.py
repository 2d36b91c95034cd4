"""backend=openai against an installable OpenAI-compatible server of someone else's: ``transformers serve`` (the
``transformers[serving]`` extra) on a tiny random-weight Llama with a small trained BPE tokenizer, beside the in-repo
stand-in that the other backend tests use. Its completions endpoint takes a string prompt only and refuses vLLM's
``ignore_eos``: ``backend.prompt_format=text`` and ``backend.ignore_eos=false``. Skipped without PyTorch,
transformers and its serving extra (fastapi, uvicorn, pydantic, openai)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch", reason="transformers serve needs PyTorch: pip install torch==2.13.0 (CPU build)")
pytest.importorskip("transformers", reason="pip install -e '.[real]'")
for module in ("fastapi", "uvicorn", "pydantic", "openai"):
    pytest.importorskip(module, reason="transformers serve needs transformers[serving]: pip install -e '.[real]'")

pytestmark = pytest.mark.usefixtures("no_data")  # fixed lengths: nothing here reads the data folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model_dir(path: Path) -> Path:
    """A tiny random-weight Llama (backend.tiny's shape) and a 320-token byte-level BPE trained here, saved as a
    local checkpoint folder; the model never stops at end-of-sequence (no eos id): each request runs to max_tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from repro.backends.models import build_model

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["the quick brown fox jumps over the lazy dog " * 3, "speculative decoding serves tokens faster " * 3] * 50
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(path)
    model = build_model("llama-68m", tiny=True, seed=0)
    model.config.eos_token_id = None
    model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``transformers serve DIR`` on a free local port, until the module's tests are done."""
    model = _model_dir(tmp_path_factory.mktemp("tfs") / "model")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve",
                             str(model), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read() if proc.stderr else ""
                    pytest.fail(f"transformers serve did not come up on {url}:\n{err[-2000:]}")
                time.sleep(0.5)
        yield url + "/v1", model
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _repro(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", "system=vllm", "backend=openai", "model=llama-68m",
                           "workload=fixed", "workload.input_len=16", "workload.output_len=8", "num_requests=4",
                           "rps=4", f"out_dir={tmp_path}", *args], capture_output=True, text=True, timeout=300)


def test_a_workload_replays_against_transformers_serve(server: tuple[str, Path], tmp_path: Path) -> None:
    url, model = server
    res = _repro(tmp_path, f"backend.url={url}", f"backend.model={model}", "backend.prompt_format=text",
                 "backend.ignore_eos=false", f"backend.save_detailed={tmp_path / 'detail'}")
    assert res.returncode == 0, res.stderr[-3000:]
    row = pd.read_csv(tmp_path / "points.csv").iloc[0]
    assert row["completed"] == 4 and row["failed"] == 0
    assert row["total_output_tokens"] == 4 * 8  # the server's usage counts: each request ran to max_tokens
    assert row["mean_ttft_ms"] > 0 and row["mean_tpot_ms"] > 0
    detail = json.loads(next((tmp_path / "detail").glob("*.json")).read_text())
    assert detail["output_lens"] == [8, 8, 8, 8]
    summary = (tmp_path / "summary.md").read_text()
    assert "prompts sent as text" in summary and "without ignore_eos" in summary


def test_what_transformers_serve_refuses_is_named(server: tuple[str, Path], tmp_path: Path) -> None:
    url, model = server
    # vLLM's ignore_eos, sent by default: every request is refused, and the run exits non-zero naming the field
    res = _repro(tmp_path / "eos", f"backend.url={url}", f"backend.model={model}", "backend.prompt_format=text")
    assert res.returncode != 0 and "ignore_eos" in res.stderr
    # token ids as the prompt: the same
    res = _repro(tmp_path / "ids", f"backend.url={url}", f"backend.model={model}", "backend.ignore_eos=false")
    assert res.returncode != 0 and "none of the 4 requests" in res.stderr and "prompt must be a string" in res.stderr
    # another model's name: refused before anything is sent, naming the served one
    res = _repro(tmp_path / "name", f"backend.url={url}", "backend.model=meta-llama/Llama-2-7b-hf",
                 f"backend.tokenizer={model}", "backend.prompt_format=text", "backend.ignore_eos=false")
    assert res.returncode != 0 and f"serves '{model}'" in res.stderr
