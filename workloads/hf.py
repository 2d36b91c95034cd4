"""Any Hugging Face dataset as a workload dataset, read through the optional ``datasets`` package::

    datasets: [{name: hf, path: tatsu-lab/alpaca, split: train, prompt_field: [instruction, input],
                output_field: output}]

Offline first. ``path`` is, in this order: a local data file (``.json``/``.jsonl`` → ``load_dataset("json")``,
``.csv``, ``.parquet``, ``.txt`` → ``text``), a local folder (``save_to_disk`` output → ``load_from_disk``, else
its data files → ``load_dataset(folder)``), the same relative path under the data root, or a hub id read from the
Hugging Face cache. Hub ids are read with ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` on for the call (unless the
user has set either), so a run never downloads; when neither a local copy nor the cache has the data, a one-line
:class:`DataMissingError` says what to provide. Token counts: :func:`workloads.tokens.count_tokens` with the
target model's tokenizer from ``<data root>/tokenizers`` (else the chars/4 estimate, flagged as a fallback).
Records are cached per process (like ``workloads.datasets.load_records``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from workloads.datasets import DataMissingError, LengthRecords, find_user_path
from workloads.spec import DatasetSpec
from workloads.tokens import count_tokens

_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_INSTALL = "dataset hf needs the datasets package: pip install datasets (or pip install -e '.[data]')"


def load_hf_records(ds: DatasetSpec, root: Path | None, tokenizer: str | None) -> LengthRecords:
    """Prompt and output token counts of dataset ``ds`` (``name: hf``), named ``ds.key``."""
    assert ds.path is not None and ds.prompt_field is not None
    fields = (ds.prompt_field,) if isinstance(ds.prompt_field, str) else tuple(ds.prompt_field)
    local = _local(ds.path, root)
    stamp = (0, 0)
    if local is not None:
        st = local[0].stat()
        stamp = (st.st_mtime_ns, st.st_size)
    where, shown = (str(local[0]), local[1]) if local is not None else (ds.path, ds.path)
    tok_dir = str(root / "tokenizers") if root is not None else None
    return _load(ds.key, where, local is not None, shown, stamp, ds.subset, ds.split, fields, ds.output_field,
                 tokenizer, tok_dir)


def _local(path: str, root: Path | None) -> tuple[Path, str] | None:
    """The local file or folder ``path`` names (as given, or under the data root) and how to show it, or None for a
    hub id. A path that can only be local (absolute, ``./``, ``~``, a data-file suffix, more than one ``/``) and is
    missing raises DataMissingError."""
    looks_local = path.startswith(("/", ".", "~")) or Path(path).suffix.lower() in _BUILDERS or path.count("/") > 1
    if looks_local or Path(path).exists() or (root is not None and (root / path).exists()):
        return find_user_path(path, root, "dataset hf path")
    return None


@functools.lru_cache(maxsize=16)
def _load(
    name: str,
    where: str,
    local: bool,
    shown: str,
    stamp: tuple[int, int],
    subset: str | None,
    split: str,
    fields: tuple[str, ...],
    output_field: str | None,
    tokenizer: str | None,
    tok_dir: str | None,
) -> LengthRecords:
    table = _open(where, local, shown, subset, split)
    columns = list(table.column_names)
    for f in (*fields, *([output_field] if output_field else [])):
        if f not in columns:
            raise ValueError(f"dataset hf {shown}: no field {f!r}; its columns: {columns}")
    cols = [list(table[f]) for f in fields]
    prompts = ["\n".join(t for t in (_text(c[i]) for c in cols) if t) for i in range(len(table))]
    tdir = Path(tok_dir) if tok_dir is not None else None
    p = count_tokens(prompts, tokenizer, tdir)
    out = np.full(len(prompts), -1, dtype=np.int64)
    if output_field:
        raw = list(table[output_field])
        known = [i for i, v in enumerate(raw) if v is not None]
        out[known] = count_tokens([_text(raw[i]) for i in known], tokenizer, tdir).counts
    p.counts.flags.writeable = out.flags.writeable = False
    sub = f" ({subset})" if subset else ""
    no_out = "" if output_field else ", no output field"
    return LengthRecords(
        name,
        p.counts,
        out,
        f"hf {shown}{sub} split {split} ({len(prompts)} records, {p.how}{no_out})",
        fallback=tokenizer is not None and not p.exact,
        prompt_text=tuple(prompts),
    )


def _open(where: str, local: bool, shown: str, subset: str | None, split: str) -> Any:
    """The ``datasets.Dataset`` of ``split``, loaded offline (see the module docstring)."""
    try:
        import datasets
    except ImportError:
        raise DataMissingError(_INSTALL) from None
    path = Path(where)
    with _offline(datasets), _quiet(datasets):
        try:
            if local and path.is_file():
                builder = _BUILDERS.get(path.suffix.lower(), "json")
                return datasets.load_dataset(builder, data_files={split.split("[")[0]: str(path)}, split=split)
            if local and (path / "dataset_dict.json").is_file():
                return datasets.load_from_disk(str(path))[split]
            if local and (path / "state.json").is_file():
                return datasets.load_from_disk(str(path))
            return datasets.load_dataset(where, subset, split=split)
        except (OSError, ValueError, KeyError) as exc:
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if local or not isinstance(exc, OSError):
                what = f"subset {subset!r}, split {split!r}" if subset else f"split {split!r}"
                raise ValueError(f"dataset hf {shown}: cannot load {what} ({reason})") from None
            raise DataMissingError(
                f"dataset hf {shown!r}: no local file or folder of that name (as given or under $REPRO_DATA) and "
                f"not in the Hugging Face cache ({reason}); provide path=LOCAL_FILE_OR_FOLDER, or download it once "
                f"with network: python -c \"import datasets; datasets.load_dataset('{shown}')\""
            ) from None


@contextlib.contextmanager
def _offline(datasets: Any) -> Iterator[None]:
    """Hugging Face offline mode for the call, unless the user set ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE``.

    Both libraries read these variables when imported, so their module constants are switched as well, and all
    is restored afterwards."""
    if any(v in os.environ for v in _OFFLINE_VARS):
        yield
        return
    import huggingface_hub.constants as hub

    targets = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"), (hub, "HF_HUB_OFFLINE")]
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr in targets if hasattr(mod, attr)]
    try:
        os.environ.update(dict.fromkeys(_OFFLINE_VARS, "1"))
        for mod, attr, _ in saved:
            setattr(mod, attr, True)
        yield
    finally:
        for v in _OFFLINE_VARS:
            os.environ.pop(v, None)
        for mod, attr, value in saved:
            setattr(mod, attr, value)


@contextlib.contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No progress bars on stderr during the call (the run's log stays one line per note)."""
    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _text(value: Any) -> str:
    """A field's text: strings as they are, a list's first element (first turn), a dict's content/value/text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return _text(value[0]) if value else ""
    if isinstance(value, dict):
        return _text(next((value[k] for k in ("content", "value", "text") if k in value), ""))
    return str(value)
