"""Dataset ``hf``: any Hugging Face dataset through ``datasets`` (local file, local folder, hub cache offline)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from workloads import DataMissingError, build_workload
from workloads.datasets import load_records
from workloads.hf import load_hf_records
from workloads.spec import DatasetSpec

ROWS = [
    {"instruction": "Say hi", "input": "", "output": "Hi there!", "turns": ["abcd" * 3, "later"]},
    {"instruction": "Add", "input": "1 and 2", "output": "3", "turns": ["ab"]},
    {"instruction": "Write a haiku", "input": "about the sea", "output": "waves " * 8, "turns": ["x" * 9]},
]


def hf_cfg(n: int = 30, **ds: Any) -> dict[str, Any]:
    return {"num_requests": n, "arrival": {"kind": "poisson", "rate_per_s": 2.0}, "datasets": [{"name": "hf", **ds}]}


def make(cfg: dict[str, Any], tokenizer: str | None = None) -> Any:
    return build_workload(cfg, seed=np.random.SeedSequence(0), tokenizer=tokenizer)


@pytest.fixture(autouse=True)
def _private_hf_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep the `datasets` cache copies of the test files out of the user's ~/.cache/huggingface."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    pytest.importorskip("datasets")
    path = tmp_path / "my_set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_local_jsonl_with_joined_prompt_fields(jsonl: Path) -> None:
    ds = DatasetSpec("hf", path=str(jsonl), prompt_field=("instruction", "input"), output_field="output")
    rec = load_hf_records(ds, None, None)
    # chars/4 (no tokenizer family): "Say hi" | "Add\n1 and 2" | "Write a haiku\nabout the sea"
    assert list(rec.prompt_len) == [2, 3, 7] and list(rec.output_len) == [3, 1, 12]
    assert load_hf_records(ds, None, None) is rec  # cached per process
    t = make(hf_cfg(path=str(jsonl), prompt_field=["instruction", "input"], output_field="output"))
    assert set(t.dataset) == {"hf:my_set"} and set(t.prompt_len) <= {2, 3, 7}
    assert [(s.dataset, s.kind, s.fallback) for s in t.provenance] == [("hf:my_set", "file", False)]
    assert f"hf {jsonl} split train (3 records" in t.source


def test_list_fields_count_the_first_turn_and_label_names_the_dataset(jsonl: Path) -> None:
    t = make(hf_cfg(path=str(jsonl), prompt_field="turns", label="mtbench"))
    assert set(t.prompt_len) <= {3, 1} and set(t.dataset) == {"mtbench"}  # first turns: 12, 2, 9 chars
    assert "no output field" in t.source and "missing outputs from the embedded sharegpt output table" in t.source


def test_local_folder_and_saved_dataset(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    import pandas as pd

    (tmp_path / "parquet_dir").mkdir()
    pd.DataFrame(ROWS).drop(columns="turns").to_parquet(tmp_path / "parquet_dir" / "train.parquet")
    datasets.Dataset.from_list([{k: r[k] for k in ("instruction", "output")} for r in ROWS]).save_to_disk(
        str(tmp_path / "saved")
    )
    for folder in ("parquet_dir", "saved"):
        ds = DatasetSpec("hf", path=str(tmp_path / folder), prompt_field="instruction", output_field="output")
        rec = load_hf_records(ds, None, None)
        assert list(rec.prompt_len) == [2, 1, 4] and list(rec.output_len) == [3, 1, 12], folder


def test_split_slice_and_tokenizer_fallback(jsonl: Path, empty_data: Path) -> None:
    t = make(hf_cfg(path=str(jsonl), prompt_field="instruction", split="train[:2]"), tokenizer="llama2")
    assert set(t.prompt_len) <= {2, 1} and "(2 records, estimate chars/4 (no llama2 tokenizer file" in t.source
    assert [(s.kind, s.fallback) for s in t.provenance] == [("file", True)]


def test_missing_field_names_the_columns(jsonl: Path) -> None:
    with pytest.raises(ValueError, match=r"no field 'prompt'; its columns: \['instruction', 'input', 'output'"):
        make(hf_cfg(path=str(jsonl), prompt_field="prompt"))
    with pytest.raises(ValueError, match="no field 'answer'"):
        make(hf_cfg(path=str(jsonl), prompt_field="instruction", output_field="answer"))


def test_hub_id_not_in_cache_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("datasets")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(DataMissingError) as err:
        make(hf_cfg(path="specrepro-test/no-such-dataset", prompt_field="text"))
    msg = str(err.value)
    assert "\n" not in msg and "not in the Hugging Face cache" in msg and "provide path=LOCAL_FILE_OR_FOLDER" in msg
    assert "datasets.load_dataset('specrepro-test/no-such-dataset')" in msg
    assert "HF_HUB_OFFLINE" not in os.environ and "HF_DATASETS_OFFLINE" not in os.environ  # restored


def test_missing_local_path(tmp_path: Path) -> None:
    with pytest.raises(DataMissingError, match=r"dataset hf path=.*absent.jsonl: no such file or folder"):
        make(hf_cfg(path=str(tmp_path / "absent.jsonl"), prompt_field="text"))


def test_without_the_datasets_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataMissingError) as err:
        make(hf_cfg(path=str(tmp_path / "d.jsonl"), prompt_field="instruction"))
    assert str(err.value) == (
        "dataset hf needs the datasets package: pip install datasets (or pip install -e '.[data]')"
    )


@pytest.mark.parametrize(
    ("ds", "match"),
    [
        ({"name": "hf", "prompt_field": "text"}, "dataset hf needs path"),  # no path
        ({"name": "hf", "path": "x/y"}, "dataset hf needs path"),  # no prompt_field
        ({"name": "alpaca", "prompt_field": "text"}, r"\['prompt_field'\] are read by dataset hf only"),
    ],
)
def test_hf_keys_are_checked(ds: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make({"num_requests": 5, "arrival": {"kind": "poisson", "rate_per_s": 1.0}, "datasets": [ds]})


@pytest.mark.data("alpaca/alpaca_5000.json")
def test_hf_reads_alpaca_like_the_builtin_loader(real_data: Path) -> None:
    pytest.importorskip("datasets")
    # a relative path is looked up under the data folder; the prompt is built the same way (instruction \n input)
    ds = DatasetSpec("hf", path="alpaca/alpaca_5000.json", prompt_field=("instruction", "input"), output_field="output")
    rec = load_hf_records(ds, real_data, None)
    builtin = load_records("alpaca", str(real_data), None)
    assert np.array_equal(rec.prompt_len, builtin.prompt_len) and np.array_equal(rec.output_len, builtin.output_len)
    assert "hf $REPRO_DATA/alpaca/alpaca_5000.json" in rec.source and rec.name == "hf:alpaca_5000"
