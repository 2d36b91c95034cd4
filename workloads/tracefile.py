"""A user's request trace (``workload=trace_file workload.path=FILE``): one request a row, with an arrival time and
prompt and output token counts, replayed by ``workloads.arrivals.replay_trace``.

Formats are recognised by their column names (``workload.format: auto``, each of the three columns looked up in
the order below) or forced (``vidur`` | ``azure`` | ``vllm``: only that format's names):

=========  =========================================================  ==================  =================
format     arrival time                                               prompt tokens       output tokens
=========  =========================================================  ==================  =================
vidur      ``arrived_at``                                             num_prefill_tokens  num_decode_tokens
azure      ``TIMESTAMP`` (Azure 2023/2024, SplitWise)                 ContextTokens       GeneratedTokens
vllm       ``timestamp``, ``arrival_time``, ``arrived_at``,           prompt_len,         output_len,
           ``arrival_time_s`` / ``_ms`` / ``_ns``,                    input_len,          output_tokens,
           ``emission_time_ms`` (AdaServe artifact)                   prompt_tokens,      output_length,
                                                                      input_length,       num_output_tokens,
                                                                      num_prompt_tokens,  max_tokens,
                                                                      input_toks          output_toks
=========  =========================================================  ==================  =================

Time units: a column of strings is parsed as datetimes (Azure's ``TIMESTAMP``); a numeric column is in the unit its
name ends with (``_ns``, ``_us``, ``_ms``, ``_s``), ``timestamp`` is milliseconds (Mooncake's traces), and every
other name (``arrived_at``, ``arrival_time``, a numeric ``TIMESTAMP``) is seconds. Times are shifted so that the
first record arrives at 0. Rows with an empty cell in one of the three columns are dropped (and counted in the
note). The file is checked as a whole before anything runs, and refused in one line naming the file, the row (counted
from 1 below the header) and the column: an empty file, text where a number belongs, a negative or fractional token
count, a negative arrival time, or one earlier than the row above it.

File type by suffix: ``.csv``, ``.tsv``, ``.jsonl`` / ``.ndjson`` (one JSON object a line), ``.json`` (a list of
objects, or JSON lines), ``.parquet``; any other suffix is sniffed (``{``: JSON lines, ``[``: JSON list, else CSV).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.datasets import LengthRecords
from workloads.spec import TRACE_FILE

#: format -> (time columns, prompt-length columns, output-length columns), in lookup order.
FORMATS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "vidur": (("arrived_at",), ("num_prefill_tokens",), ("num_decode_tokens",)),
    "azure": (("TIMESTAMP",), ("ContextTokens",), ("GeneratedTokens",)),
    "vllm": (
        ("timestamp", "arrival_time", "arrived_at", "arrival_time_s", "arrival_time_ms", "arrival_time_ns",
         "emission_time_ms"),
        ("prompt_len", "input_len", "prompt_tokens", "input_length", "num_prompt_tokens", "input_toks"),
        ("output_len", "output_tokens", "output_length", "num_output_tokens", "max_tokens", "output_toks"),
    ),
}
def _number(value: object) -> str:
    """A number as a trace file writes it (2 for 2.0); anything else as is."""
    v = value.item() if hasattr(value, "item") else value
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


_ROLES = ("arrival-time", "prompt-length", "output-length")
_UNIT_SUFFIX_S = {"_ns": 1e-9, "_us": 1e-6, "_ms": 1e-3, "_s": 1.0}


def load_trace_file(path: Path, shown: str, fmt: str = "auto") -> LengthRecords:
    """Read the trace file ``path`` (``shown``: how notes write it) into :class:`LengthRecords` named
    ``trace_file``, with ``timestamps_s`` from 0. Cached per process (keyed by the file's size and mtime)."""
    st = path.stat()
    return _load(str(path), shown, fmt, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _load(path: str, shown: str, fmt: str, mtime_ns: int, size: int) -> LengthRecords:
    df = _read(Path(path), shown)
    time_col, prompt_col, output_col = _columns(list(df.columns), fmt, shown)
    num_rows = len(df)
    df = df[[time_col, prompt_col, output_col]]
    present = df.notna().all(axis=1).to_numpy()  # a row with an empty cell is dropped (and counted)
    prompt = _counts(df[prompt_col], present, shown)
    output = _counts(df[output_col], present, shown)
    times = _seconds(df[time_col])
    bad = present & ~np.isfinite(times)
    if bad.any():
        raise ValueError(f"trace file {shown}: row {_row(bad)}, column {time_col}: {_cell(df[time_col], bad)} is not "
                         "an arrival time")
    if not present.any():
        raise ValueError(f"trace file {shown}: no row with an arrival time and both token counts")
    ts = times[present]
    if (ts < 0).any():
        at = np.flatnonzero(present)[np.flatnonzero(ts < 0)[0]]
        raise ValueError(f"trace file {shown}: row {at + 1}, column {time_col}: negative arrival time "
                         f"{_number(df[time_col].iloc[at])}")
    back = np.flatnonzero(np.diff(ts) < 0)
    if back.size:
        at = np.flatnonzero(present)[back[0] + 1]
        raise ValueError(f"trace file {shown}: row {at + 1}, column {time_col}: arrival time "
                         f"{_number(df[time_col].iloc[at])} is before the row above it (a trace lists requests in "
                         "arrival order; sort it by that column)")
    p = prompt[present].astype(np.int64)
    o = output[present].astype(np.int64)
    p.flags.writeable = o.flags.writeable = False
    dropped = f", {num_rows - len(p)} rows with an empty cell dropped" if len(p) < num_rows else ""
    return LengthRecords(
        TRACE_FILE,
        p,
        o,
        f"trace file {shown} ({len(p)} records{dropped}; columns {time_col}, {prompt_col}, {output_col})",
        ts - ts.min(),
    )


def _row(mask: np.ndarray) -> int:
    """The first flagged row, counted from 1 (the header is not a row)."""
    return int(np.flatnonzero(mask)[0]) + 1


def _cell(col: pd.Series, mask: np.ndarray) -> str:
    """The first flagged cell as the file has it: text quoted, a number as written."""
    value = col.iloc[int(np.flatnonzero(mask)[0])]
    return repr(value) if isinstance(value, str) else _number(value)


def _counts(col: pd.Series, present: np.ndarray, shown: str) -> np.ndarray:
    """A token-count column as numbers; text or a negative or fractional count in a present row is refused, naming
    the row and the column."""
    num = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
    for bad, what in ((present & ~np.isfinite(num), "is not a token count"),
                      (present & np.isfinite(num) & (num < 0), "is a negative token count"),
                      (present & np.isfinite(num) & (num != np.round(num)), "is not a whole token count")):
        if bad.any():
            raise ValueError(f"trace file {shown}: row {_row(bad)}, column {col.name}: {_cell(col, bad)} {what}")
    return num


def _read(path: Path, shown: str) -> pd.DataFrame:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if path.stat().st_size == 0 or not path.read_bytes().strip():
        raise ValueError(f"trace file {shown}: the file is empty (a header row and one row per request expected)")
    if suffix in (".csv", ".tsv"):
        return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",")
    with path.open(encoding="utf-8") as f:
        text = f.read()
    head = text.lstrip()[:1]
    if suffix in (".json", ".jsonl", ".ndjson") or head in ("{", "["):
        try:
            rows = json.loads(text) if head == "[" else [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"trace file {path}: not JSON / JSON lines ({exc})") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"trace file {path}: expected JSON objects, one request each")
        return pd.DataFrame.from_records(rows)  # no date guessing on names like *_at, *_time (pd.read_json's)
    return pd.read_csv(path)


def _columns(columns: list[str], fmt: str, shown: str) -> tuple[str, str, str]:
    """The (time, prompt, output) columns of ``fmt`` (auto: any format's names), else a one-line ValueError."""
    formats = list(FORMATS.values()) if fmt == "auto" else [FORMATS[fmt]]
    have = set(columns)
    picked: list[str] = []
    missing: list[str] = []
    for role in range(3):
        names = [n for f in formats for n in f[role]]
        found = next((n for n in names if n in have), None)
        if found is None:
            missing.append(f"{_ROLES[role]} column (accepted: {', '.join(dict.fromkeys(names))})")
        else:
            picked.append(found)
    if missing:
        forced = "" if fmt == "auto" else f" (format {fmt})"
        raise ValueError(f"trace file {shown}{forced}: no {'; no '.join(missing)}; its columns: {columns}")
    return picked[0], picked[1], picked[2]


def _seconds(col: pd.Series) -> np.ndarray:
    """Arrival times in seconds (NaN where unparseable), by the unit rule in the module docstring."""
    num = pd.to_numeric(col, errors="coerce")
    if not num.notna().any() and col.notna().any():  # strings only: datetimes (text among numbers: not a time)
        stamps = pd.to_datetime(col, errors="coerce")
        ns = stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64).astype(np.float64)
        return np.where(stamps.notna().to_numpy(), ns / 1e9, np.nan)
    name = str(col.name)
    scale = next((v for k, v in _UNIT_SUFFIX_S.items() if name.endswith(k)), 1e-3 if name == "timestamp" else 1.0)
    return num.to_numpy(dtype=np.float64) * scale
