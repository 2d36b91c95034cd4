"""Where a run's workload came from, said once per source and loudly when it is not the real files.

Each point reports its workload's :class:`workloads.DataSource` entries (dataset, kind, fallback, detail). An
experiment collects them (:func:`collect`, stored in ``manifest.json`` under ``data``) and says them on the
console, at the top of ``summary.md`` and in every figure title (:func:`warning`, :func:`banner`).

kinds: ``file`` (a real file was read), ``embedded`` (committed quantile tables of the real files),
``published`` (a paper's mean ± std), ``assumed`` (no file and no published figures: assumed lengths), ``fixed``
(fixed lengths). ``fallback``: the run did not read a file it would read with the data folder (or counted tokens
with an estimate because the tokenizer or its package is missing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_RATE = re.compile(r"\b(rescaled to|at) [0-9.]+ req/s")


def _shape(detail: str, dataset: str = "") -> str:
    """A detail with the point's own request rate taken out (one source, many rates) and without a leading
    ``dataset:`` (the dataset is shown beside it)."""
    if dataset and detail.startswith(f"{dataset}: "):
        detail = detail[len(dataset) + 2:]
    return _RATE.sub(r"\1 each point's rate", detail)


def collect(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Distinct sources over every point, in first-seen order (details differing only in the rate merged)."""
    seen: dict[tuple[str, str, bool, str], dict[str, Any]] = {}
    for e in entries:
        name = str(e.get("dataset", ""))
        key = (name, str(e.get("kind", "")), bool(e.get("fallback", False)), _shape(str(e.get("detail", "")), name))
        seen.setdefault(key, dict(zip(("dataset", "kind", "fallback", "detail"), key, strict=True)))
    return list(seen.values())


def fallbacks(sources: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [s for s in sources if s.get("fallback")]


def _names(sources: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(dict.fromkeys(str(s["dataset"]) for s in sources))


def warning(sources: Sequence[Mapping[str, Any]]) -> str | None:
    """One loud line when some source fell back from the real files (None when none did)."""
    fb = fallbacks(sources)
    if not fb:
        return None
    return (f"WARNING: not the real data files for {_names(fb)}: embedded, assumed or estimated statistics served "
            "instead (the Data section of summary.md says which and why)")


def short(sources: Sequence[Mapping[str, Any]]) -> str:
    """A few words for the closing line: where the workload came from."""
    if not sources:
        return "no dataset"
    fb = fallbacks(sources)
    files = [s for s in sources if s.get("kind") == "file" and not s.get("fallback")]
    parts = []
    if files:
        parts.append(f"files ({_names(files)})")
    if fb:
        parts.append(f"EMBEDDED/ESTIMATED statistics ({_names(fb)})")
    chosen = [s for s in sources if s.get("kind") != "file" and not s.get("fallback")]
    if chosen:
        parts.append(f"{'/'.join(dict.fromkeys(str(s['kind']) for s in chosen))} lengths ({_names(chosen)})")
    return "; ".join(parts)


def banner(sources: Sequence[Mapping[str, Any]], overrides: Sequence[str]) -> str | None:
    """What a figure title adds: the overridden keys and, when it happened, the data fallback."""
    parts = []
    if overrides:
        parts.append("overrides: " + " ".join(overrides))
    fb = fallbacks(sources)
    if fb:
        parts.append(f"NOT the real data files for {_names(fb)} (embedded, assumed or estimated statistics)")
    return " | ".join(parts) or None


def markdown(sources: Sequence[Mapping[str, Any]]) -> str:
    """The ``## Data`` section of summary.md: one line per source."""
    lines = []
    for s in sources:
        flag = " **(fallback: not the real file)**" if s.get("fallback") else ""
        lines.append(f"- `{s['dataset']}` ({s['kind']}){flag}: {s['detail']}\n")
    return "".join(lines)
