"""Data root checks and provenance: DataSource kinds and fallback flags, paths under $REPRO_DATA, tokenizer notes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from repro.core import errors
from workloads import DataMissingError, DataSource, build_workload, check_data_root
from workloads.provenance import show_path
from workloads.tokens import count_tokens, tokenizer_problem


def cfg(datasets: list[dict[str, Any]], n: int = 50, **overrides: Any) -> dict[str, Any]:
    return {"num_requests": n, "arrival": {"kind": "poisson", "rate_per_s": 2.0}, "datasets": datasets, **overrides}


def make(c: dict[str, Any], tokenizer: str | None = "llama2") -> Any:
    return build_workload(c, seed=np.random.SeedSequence(0), tokenizer=tokenizer)


def kinds(t: Any) -> list[tuple[str, str, str, bool]]:
    return [(s.role, s.dataset, s.kind, s.fallback) for s in t.provenance]


def write_alpaca(root: Path) -> None:
    """A three-record alpaca_5000.json in the built-in loader's layout."""
    (root / "alpaca").mkdir(parents=True)
    rows = [{"instruction": "Say hi" * (i + 1), "input": "", "output": "Hello " * (i + 2)} for i in range(3)]
    (root / "alpaca" / "alpaca_5000.json").write_text(json.dumps(rows))


# ---------------------------------------------------------------- data root


@pytest.mark.parametrize(
    ("make_path", "why"),
    [
        (lambda tmp: tmp / "no" / "such", "no such folder"),  # nothing there
        (lambda tmp: (tmp / "f.txt", (tmp / "f.txt").write_text("x"))[0], "not a folder"),  # a file
    ],
)
def test_repro_data_pointing_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_path: Any, why: str) -> None:
    bad = make_path(tmp_path)
    monkeypatch.setenv("REPRO_DATA", str(bad))
    with pytest.raises(DataMissingError) as err:
        check_data_root()
    assert str(err.value) == (
        f"REPRO_DATA={bad}: {why} (point it at a data folder laid out as in docs/data.md, or unset it)"
    )
    assert isinstance(err.value, errors.DataMissingError)
    with pytest.raises(DataMissingError, match=f"REPRO_DATA={bad}: {why}"):
        make(cfg([{"name": "fixed", "input_len": 8, "output_len": 8}]))
    with pytest.raises(DataMissingError, match=r"^workload.data_dir=.*: no such folder"):
        make(cfg([{"name": "sharegpt"}], data_dir=str(tmp_path / "missing")))


def test_an_empty_data_folder_is_valid(empty_data: Path) -> None:
    assert check_data_root() == empty_data and check_data_root(str(empty_data)) == empty_data


def test_show_path() -> None:
    root = Path("/data/root")
    assert show_path(root / "a" / "b.csv", root) == "$REPRO_DATA/a/b.csv"
    assert show_path("/elsewhere/t.csv", root) == "/elsewhere/t.csv"
    assert show_path("rel/t.csv", None) == "rel/t.csv"


# ---------------------------------------------------------------- kinds and fallback flags


def test_a_real_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_alpaca(tmp_path)
    monkeypatch.setenv("REPRO_DATA", str(tmp_path))
    t = make(cfg([{"name": "alpaca"}]), tokenizer=None)
    assert kinds(t) == [("lengths", "alpaca", "file", False)]
    assert t.source == "alpaca: real file $REPRO_DATA/alpaca/alpaca_5000.json (3 records, estimate chars/4 (no " \
        "tokenizer family given))"
    assert t.provenance[0] == DataSource("alpaca", "file", False, t.source)


@pytest.mark.data("arxiv/arxiv_summarization_lengths_llama2.csv", "traces/azure2023_conv.csv")
def test_real_files_of_the_data_folder(real_data: Path) -> None:
    c = cfg([{"name": "arxiv"}], arrival={"kind": "trace", "trace": "azure2023_conv", "rate_per_s": 2.0})
    t = make(c)
    assert kinds(t) == [("arrivals", "azure2023_conv", "file", False), ("lengths", "arxiv", "file", False)]
    assert "$REPRO_DATA/arxiv/arxiv_summarization_lengths_llama2.csv" in t.source and str(real_data) not in t.source


def test_auto_with_an_empty_data_folder_falls_back(empty_data: Path) -> None:
    datasets = [{"name": "sharegpt"}, {"name": "sonnet"}, {"name": "instructcode"}]
    c = cfg(datasets, n=200, arrival={"kind": "trace", "trace": "mooncake", "rate_per_s": 2.0})
    assert set(kinds(make(c))) == {
        ("arrivals", "mooncake", "embedded", True),
        ("lengths", "sharegpt", "embedded", True),
        ("lengths", "sonnet", "embedded", True),
        ("lengths", "instructcode", "assumed", True),
    }


def test_deliberate_sources_are_not_fallbacks(empty_data: Path) -> None:
    published = make(cfg([{"name": "cnn_dailymail"}], source="published"))
    assert kinds(published) == [("lengths", "cnn_dailymail", "published", False)]
    embedded = make(cfg([{"name": "sharegpt"}, {"name": "instructcode"}], n=100, source="embedded"))
    assert set(kinds(embedded)) == {
        ("lengths", "sharegpt", "embedded", False),
        ("lengths", "instructcode", "assumed", False),
    }
    fixed = make(cfg([{"name": "fixed", "input_len": 8, "output_len": 4}]))
    assert kinds(fixed) == [("lengths", "fixed", "fixed", False)]


def test_trace_lengths_fall_back_to_the_embedded_table(empty_data: Path) -> None:
    # workload=azure_conv without its file: embedded gaps for the arrivals and the trace's length table
    c = cfg([{"name": "trace"}], n=300, arrival={"kind": "trace", "trace": "azure2023_conv", "rate_per_s": 2.0})
    t = make(c)
    assert kinds(t) == [("arrivals", "azure2023_conv", "embedded", True),
                        ("lengths", "azure2023_conv", "embedded", True)]
    assert set(t.dataset) == {"azure2023_conv"} and len(t) == 300
    with pytest.raises(DataMissingError, match="adaserve_artifact"):
        make({**c, "trace_slo": True, "arrival": {"kind": "trace", "trace": "adaserve_fig10_emission_rps4.0_prop0.5"}})


# ---------------------------------------------------------------- tokenizers


@pytest.mark.parametrize(
    ("family", "file", "package"),
    [("llama2", "llama2_tokenizer.model", "sentencepiece"), ("llama3", "llama3_tokenizer.model", "tiktoken")],
)
def test_missing_tokenizer_package_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str, file: str, package: str
) -> None:
    write_alpaca(tmp_path)
    (tmp_path / "tokenizers").mkdir()
    (tmp_path / "tokenizers" / file).write_bytes(b"not read: the package is missing")
    monkeypatch.setitem(sys.modules, package, None)
    monkeypatch.setenv("REPRO_DATA", str(tmp_path))
    t = make(cfg([{"name": "alpaca"}]), tokenizer=family)
    assert kinds(t) == [("lengths", "alpaca", "file", True)]
    assert f"{package} is not installed: pip install {package}, or pip install -e '.[data]'" in t.source
    assert "tokenizer file" not in t.source


def test_missing_tokenizer_file_is_named(tmp_path: Path) -> None:
    assert tokenizer_problem("qwen", tmp_path) == "no qwen tokenizer file $REPRO_DATA/tokenizers/qwen.tiktoken"
    c = count_tokens(["abcdefgh"], "qwen", tmp_path)
    assert not c.exact and list(c.counts) == [2] and "no qwen tokenizer file" in c.how
