"""The prompts the real backends send (:mod:`workloads.prompts`): each request's own dataset prompt in the target's
tokenizer where the data has it, synthetic ids elsewhere, and a note saying which. The rules on hand-built tables
(no data, no PyTorch); then ShareGPT's recorded Llama-3 ids reaching ``backend=hf``'s model and a live server through
``backend=openai``, token for token (the data folder's ShareGPT token file and tokenizers; PyTorch + transformers)."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import pinned_data
from workloads.build import RequestTable
from workloads.datasets import LengthRecords
from workloads.prompts import fit_length, prompt_ids


def _records(**kw: Any) -> LengthRecords:
    counts = np.array([3, 4, 2], dtype=np.int64)
    return LengthRecords("toy", counts, counts, "toy records", **kw)


def _table(records: LengthRecords, record: list[int], prompt_len: list[int]) -> RequestTable:
    n = len(record)
    return RequestTable(arrival_s=np.arange(n, dtype=float), prompt_len=np.array(prompt_len), output_len=np.ones(n,
                        dtype=np.int64), dataset=np.array(["toy"] * n, dtype=object), slo_class=np.zeros(n, np.int64),
                        tpot_slo_s=np.full(n, np.inf), ttft_slo_s=np.full(n, np.inf), classes=("default",),
                        source="toy", prompt_record=np.array(record), prompt_sources=(("toy", records),))


IDS = ([5, 6, 7], [8, 9, 10, 11], [12, 13])


def test_recorded_ids_of_the_targets_family_are_sent_fitted_to_each_prompt_length() -> None:
    table = _table(_records(prompt_ids=IDS, ids_family="llama2"), [1, 0, 2, -1], [4, 2, 5, 3])
    got = prompt_ids(table, "llama2", 32000, None)
    assert got.ids == [[8, 9, 10, 11], [5, 6], [12, 13, 12, 13, 12], None]  # cut, or repeated; -1: no record
    assert got.real == 3 and got.how.startswith("prompts: the dataset's own for 3 of 4 requests (llama2 token ids)")
    assert "synthetic random token ids for 1 (lengths-only sources)" in got.how


@pytest.mark.parametrize(("kw", "family", "vocab", "says"), [
    ({"prompt_ids": IDS, "ids_family": "llama2"}, "llama2", 10, "past the model's vocabulary of 10"),
    ({}, "llama2", 32000, "the source has no prompt text"),
    ({"prompt_text": ("a", "b", "c")}, "llama2", 32000, "no data folder"),
    ({"prompt_text": ("a", "b", "c")}, None, 32000, "the model names no tokenizer family"),
])
def test_what_cannot_be_sent_is_synthetic_and_says_why(kw: dict[str, Any], family: str | None, vocab: int,
                                                       says: str) -> None:
    got = prompt_ids(_table(_records(**kw), [0, 1], [3, 4]), family, vocab, None)
    assert got.ids == [None, None] and got.how.startswith("prompts: synthetic random token ids for all 2 requests")
    assert says in got.how


def test_a_lengths_only_workload_says_it_sends_synthetic_ids() -> None:
    table = _table(_records(), [0, 1], [3, 4])
    got = prompt_ids(RequestTable(**{**table.__dict__, "prompt_record": None}), "llama2", 32000, None)
    assert got.ids == [None, None] and "lengths only" in got.how


def test_fit_length() -> None:
    assert fit_length([1, 2, 3], 2) == [1, 2] and fit_length([1, 2], 5) == [1, 2, 1, 2, 1]
    assert fit_length([], 3) == [] and fit_length([4], 0) == []


# ---------------------------------------------------------------- ShareGPT on the real backends

SHAREGPT = "sharegpt/sharegpt_llama3_tokens_300b.jsonl"
N, OUTPUT = 3, 4


def _sharegpt_ids(root: Path) -> dict[int, list[int]]:
    """The token file's recorded prompts by prompt length (a request is recognized by its length and ids)."""
    rows = [json.loads(line) for line in (root / SHAREGPT).read_text().splitlines() if line.strip()]
    return {i: r["input_tok_ids"] for i, r in enumerate(rows)}


@pytest.fixture
def sharegpt(tmp_path: Path) -> Iterator[Path]:
    """The data folder with ShareGPT's token file (skipped without it), as ``$REPRO_DATA``."""
    with pinned_data("files", tmp_path / "empty"):
        root = Path(os.environ["REPRO_DATA"])
        if not (root / SHAREGPT).is_file():
            pytest.skip(f"needs $REPRO_DATA/{SHAREGPT}")
        yield root


@pytest.fixture
def big_vocab(monkeypatch: pytest.MonkeyPatch) -> None:
    """``backend.tiny`` stand-ins with their architecture's real vocabulary (Llama-3's 128,256 ids), so real ids fit."""
    pytest.importorskip("torch", reason="backend=hf needs PyTorch: pip install torch==2.13.0 (CPU build)")
    pytest.importorskip("transformers", reason="backend=hf needs transformers: pip install -e '.[real]'")
    from repro.backends import models

    monkeypatch.setattr(models, "TinyShape", functools.partial(models.TinyShape, vocab_size=128256))


def _overrides() -> list[str]:
    return ["model=llama3.2-1b", f"num_requests={N}", "rps=100",
            f"workload.datasets=[{{name: sharegpt, output_len: {OUTPUT}}}]"]


@pytest.mark.usefixtures("big_vocab")
def test_backend_hf_prefills_sharegpts_recorded_ids(sharegpt: Path) -> None:
    from repro.experiments.simulate import build, compose

    built = build(compose([*_overrides(), "model@draft=llama3.2-1b", "backend=hf", "backend.tiny=true",
                           "system=static_sd_k3", "backend.threads=1"]))
    built.engine.run()
    recorded = _sharegpt_ids(sharegpt)
    table = built.table
    assert table.prompt_record is not None and (table.prompt_record >= 0).all()
    for rid in range(N):
        sent = built.backend.tokens(rid)[:int(table.prompt_len[rid])]
        assert sent == recorded[int(table.prompt_record[rid])][:int(table.prompt_len[rid])]
        assert len(sent) == int(table.prompt_len[rid]) > 0
    assert built.backend.prompt_note == f"prompts: the dataset's own for {N} of {N} requests (llama3 token ids)"


@pytest.fixture
def server(big_vocab: None) -> Iterator[Any]:
    from repro.backends.models import build_model
    from repro.backends.openai_server import serve

    with serve(build_model("llama3.2-1b", tiny=True, seed=0), model_name="tiny", num_threads=1) as srv:
        yield srv


def test_backend_openai_sends_sharegpts_recorded_ids(sharegpt: Path, server: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.experiments.simulate import build, compose, run_point

    received: list[list[int]] = []
    submit = server.engine.submit
    monkeypatch.setattr(server.engine, "submit", lambda req: (received.append(list(req.prompt)), submit(req))[1])
    over = [*_overrides(), "backend=openai", f"backend.url={server.url}", "backend.model=tiny"]
    res = run_point(compose(over))
    assert res.metrics["completed"] == N
    table = build(compose(_overrides())).table  # the simulation's requests for the same config and seed
    recorded = _sharegpt_ids(sharegpt)
    want = sorted(recorded[int(r)][:int(n)] for r, n in zip(table.prompt_record, table.prompt_len, strict=True))
    assert sorted(received) == want
    assert f"prompts: the dataset's own for {N} of {N} requests (llama3 token ids)" in res.notes
