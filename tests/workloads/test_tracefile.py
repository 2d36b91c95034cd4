"""workload=trace_file: a user's CSV / JSONL trace, its formats and units, rescaling, N of M, and the errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from repro.core.errors import ConfigError
from repro.experiments.simulate import build as build_point
from repro.experiments.simulate import compose, run_point
from workloads import DataMissingError, build_workload


def trace_cfg(path: Path | str | None, n: int = 100, **overrides: Any) -> dict[str, Any]:
    """The trace_file workload as a plain dict (what conf/workload/trace_file.yaml composes to)."""
    cfg: dict[str, Any] = {
        "num_requests": n,
        "path": None if path is None else str(path),
        "arrival": {"kind": "trace", "trace": "trace_file", "rate_per_s": None},
        "datasets": [{"name": "trace"}],
    }
    cfg.update(overrides)
    return cfg


def make(cfg: dict[str, Any]) -> Any:
    return build_workload(cfg, seed=np.random.SeedSequence(0))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# Three requests in arrival order (a trace out of order is refused: test_bad_traces_are_refused): arrivals 0, 0.5,
# 2.0 s after the first; lengths (prompt, output) in time order.
ARRIVALS_S = [0.0, 0.5, 2.0]
PROMPTS = [100, 200, 300]
OUTPUTS = [10, 20, 30]
ORDER = [0, 1, 2]  # row i of the file holds request ORDER[i]


def _rows(time_of: Any, names: tuple[str, str, str]) -> list[dict[str, Any]]:
    t, p, o = names
    return [{t: time_of(ARRIVALS_S[i]), p: PROMPTS[i], o: OUTPUTS[i]} for i in ORDER]


def _csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    cols = list(rows[0])
    path.write_text(",".join(cols) + "\n" + "".join(",".join(str(r[c]) for c in cols) + "\n" for r in rows))
    return path


FORMATS = [
    # (file name, writer, time -> value, columns)
    ("vidur.csv", _csv, lambda s: 100.0 + s, ("arrived_at", "num_prefill_tokens", "num_decode_tokens")),
    ("azure.csv", _csv, lambda s: f"2023-11-16 18:15:{46 + s:09.6f}",
     ("TIMESTAMP", "ContextTokens", "GeneratedTokens")),
    ("mooncake.jsonl", write_jsonl, lambda s: int(5000 + 1000 * s), ("timestamp", "input_length", "output_length")),
    ("vllm.jsonl", write_jsonl, lambda s: 7.0 + s, ("arrival_time", "prompt_len", "output_len")),
    ("vllm_ns.jsonl", write_jsonl, lambda s: int(1e9 * s), ("arrival_time_ns", "input_len", "output_tokens")),
    ("noext", write_jsonl, lambda s: s, ("arrived_at", "prompt_tokens", "max_tokens")),  # sniffed as JSON lines
]


@pytest.mark.parametrize(("name", "write", "time_of", "cols"), FORMATS, ids=[f[0] for f in FORMATS])
def test_formats_and_time_units(tmp_path: Path, name: str, write: Any, time_of: Any, cols: tuple[str, ...]) -> None:
    path = write(tmp_path / name, _rows(time_of, cols))  # type: ignore[arg-type]
    t = make(trace_cfg(path))
    np.testing.assert_allclose(t.arrival_s, ARRIVALS_S, atol=1e-6)
    assert list(t.prompt_len) == PROMPTS and list(t.output_len) == OUTPUTS
    assert set(t.dataset) == {"trace_file"}
    assert f"columns {', '.join(cols)}" in t.source and str(path) in t.source
    roles = [(s.role, s.kind, s.fallback) for s in t.provenance]
    assert roles == [("arrivals", "file", False), ("lengths", "file", False)]


def test_format_forcing(tmp_path: Path) -> None:
    # both Vidur and vLLM-style length columns: auto takes Vidur's, format=vllm the others
    rows = [{"arrived_at": float(i), "num_prefill_tokens": 10, "num_decode_tokens": 5, "prompt_len": 7, "output_len": 3}
            for i in range(4)]
    path = write_jsonl(tmp_path / "both.jsonl", rows)
    assert set(make(trace_cfg(path)).prompt_len) == {10}
    t = make(trace_cfg(path, format="vllm"))
    assert set(t.prompt_len) == {7} and set(t.output_len) == {3}
    with pytest.raises(ValueError, match=r"\(format azure\): no arrival-time column \(accepted: TIMESTAMP\)"):
        make(trace_cfg(path, format="azure"))
    with pytest.raises(ValueError, match=r"workload\.format must be one of"):
        make(trace_cfg(path, format="splitwise"))


def test_rescaling_to_a_mean_rate(tmp_path: Path) -> None:
    gaps = np.random.default_rng(0).exponential(2.0, 50)
    path = _csv(tmp_path / "t.csv", [{"arrived_at": t, "num_prefill_tokens": 5, "num_decode_tokens": 5}
                                     for t in np.cumsum(gaps)])
    t = make(trace_cfg(path, arrival={"kind": "trace", "trace": "trace_file", "rate_per_s": 5.0}))
    assert (len(t) - 1) / (t.arrival_s[-1] - t.arrival_s[0]) == pytest.approx(5.0, rel=1e-9)
    np.testing.assert_allclose(np.diff(t.arrival_s) / gaps[1:], 0.2 * 49 / gaps[1:].sum())  # shape kept
    assert "rescaled to 5.0 req/s" in t.source


@pytest.mark.parametrize(
    ("n", "expect", "note"),
    [
        (2, 2, "first 2 of 3 records (native rate)"),  # the first two in time order
        (20, 3, "first 3 of 3 records (native rate; num_requests=20, the file has fewer)"),  # all, not cycled
    ],
)
def test_first_n_of_m_records(tmp_path: Path, n: int, expect: int, note: str) -> None:
    path = _csv(tmp_path / "t.csv", _rows(float, ("arrived_at", "num_prefill_tokens", "num_decode_tokens")))
    t = make(trace_cfg(path, n=n))
    assert len(t) == expect and list(t.prompt_len) == PROMPTS[:expect] and note in t.source


def test_missing_length_columns_are_named(tmp_path: Path) -> None:
    path = _csv(tmp_path / "t.csv", [{"arrived_at": 0.0, "tokens_in": 3, "output_len": 2}])
    with pytest.raises(ValueError) as err:
        make(trace_cfg(path))
    msg = str(err.value)
    assert "\n" not in msg and "no prompt-length column (accepted: num_prefill_tokens, ContextTokens, prompt_len" in msg
    assert "output-length" not in msg and "'tokens_in'" in msg


def test_rows_without_values_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,,5\n2,7,7\n")
    t = make(trace_cfg(path))
    assert list(t.prompt_len) == [5, 7] and "1 rows with an empty cell dropped" in t.source


HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


@pytest.mark.parametrize(("text", "message"), [
    ("", r"t\.csv: the file is empty"),
    ("\n\n", r"t\.csv: the file is empty"),
    (HEADER + "0,5,5\n1,five,5\n", r"t\.csv: row 2, column num_prefill_tokens: 'five' is not a token count"),
    (HEADER + "0,5,5\n1,5,-3\n", r"t\.csv: row 2, column num_decode_tokens: -3 is a negative token count"),
    (HEADER + "0,5,5\n1,5.5,3\n", r"t\.csv: row 2, column num_prefill_tokens: 5\.5 is not a whole token count"),
    (HEADER + "-1,5,5\n1,5,3\n", r"t\.csv: row 1, column arrived_at: negative arrival time -1"),
    (HEADER + "0,5,5\n2,5,3\n1,5,3\n", r"t\.csv: row 3, column arrived_at: arrival time 1 is before the row above"),
    (HEADER + "0,5,5\nsoon,5,3\n", r"t\.csv: row 2, column arrived_at: 'soon' is not an arrival time"),
], ids=["empty", "blank lines", "text count", "negative count", "fractional count", "negative time", "out of order",
        "text time"])
def test_bad_traces_are_refused(tmp_path: Path, text: str, message: str) -> None:
    """The trace is checked as a whole before anything runs: one line naming the file, the row and the column."""
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        make(trace_cfg(path))
    assert "\n" not in str(err.value)


def test_missing_file_and_unset_path(tmp_path: Path) -> None:
    with pytest.raises(DataMissingError, match=r"workload.path=.*nope.csv: no such file") as err:
        make(trace_cfg(tmp_path / "nope.csv"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"^workload=trace_file needs workload.path=FILE"):
        make(trace_cfg(None))
    with pytest.raises(ConfigError, match=r"workload=trace_file needs workload\.path=FILE"):
        build_point(compose(["workload=trace_file"]))
    with pytest.raises(ValueError, match=r"workload\.path is read by arrival\.trace=trace_file only"):
        make({**trace_cfg(tmp_path / "t.csv"), "arrival": {"kind": "poisson", "rate_per_s": 1.0}})


def test_relative_path_under_the_data_folder(empty_data: Path) -> None:
    (empty_data / "mine").mkdir()
    _csv(empty_data / "mine" / "t.csv", _rows(float, ("arrived_at", "num_prefill_tokens", "num_decode_tokens")))
    t = make(trace_cfg("mine/t.csv"))
    assert len(t) == 3 and "trace file $REPRO_DATA/mine/t.csv" in t.source and str(empty_data) not in t.source


def test_composed_config_runs(tmp_path: Path) -> None:
    rows = [{"arrived_at": 0.25 * i, "num_prefill_tokens": 50 + i, "num_decode_tokens": 20 + i} for i in range(30)]
    f = _csv(tmp_path / "trace.csv", rows)
    res = run_point(compose(["workload=trace_file", f"workload.path={f}", "num_requests=20"]))
    assert len(res.requests) == 20 and "first 20 of 30 records" in res.notes[0]
    built = build_point(compose(["workload=trace_file", f"workload.path={f}", "workload.arrival.rate_per_s=5",
                           "workload.format=vidur", "num_requests=10"]))
    assert len(built.table) == 10 and "rescaled to 5" in built.table.source


@pytest.mark.data("traces/azure2023_conv.csv")
def test_azure_file_replays_like_the_builtin_trace(real_data: Path) -> None:
    arrival = {"kind": "trace", "trace": "azure2023_conv", "rate_per_s": 3.0}
    builtin = make({"num_requests": 300, "arrival": arrival, "datasets": [{"name": "trace"}]})
    mine = make(trace_cfg(real_data / "traces/azure2023_conv.csv", n=300,
                           arrival={"kind": "trace", "trace": "trace_file", "rate_per_s": 3.0}))
    np.testing.assert_allclose(mine.arrival_s, builtin.arrival_s, rtol=1e-12, atol=1e-9)
    assert np.array_equal(mine.prompt_len, builtin.prompt_len) and np.array_equal(mine.output_len, builtin.output_len)
    assert "$REPRO_DATA/traces/azure2023_conv.csv" in mine.source
