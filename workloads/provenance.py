"""Where a workload's lengths and arrivals came from: :class:`DataSource` records and path display.

``RequestTable.provenance`` holds one :class:`DataSource` per source the build used (a dataset's lengths, a
trace's arrivals); ``RequestTable.source`` joins their ``detail`` texts into one line. Paths under the data root
are written ``$REPRO_DATA/<relative path>`` (so notes and committed summaries do not depend on the machine);
other paths (a user's own trace file) are written as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: ``file``: a real file was read; ``embedded``: committed quantile tables or inter-arrival quantiles;
#: ``published``: a paper's mean ± std; ``assumed``: assumed lengths (``workloads.stats.ASSUMED``);
#: ``fixed``: fixed lengths from the config.
KINDS: tuple[str, ...] = ("file", "embedded", "published", "assumed", "fixed")
ROLES: tuple[str, ...] = ("lengths", "arrivals")


@dataclass(frozen=True, slots=True)
class DataSource:
    """One source of a workload's data.

    ``dataset``: dataset or trace key (as in ``RequestTable.dataset``, or the trace name for arrivals).
    ``kind``: one of :data:`KINDS`. ``fallback``: the run did not read the real file although it would with the
    data present (``source: auto`` and the file missing), or it read the file but estimated token counts
    (chars/4) because the tokenizer file or its Python package is missing; a deliberate ``source: published |
    embedded`` or ``fixed`` lengths are not a fallback. ``detail``: the human-readable note (the text joined into
    ``RequestTable.source``). ``role``: ``lengths`` (prompt/output lengths) or ``arrivals`` (a trace's timing).
    """

    dataset: str
    kind: str
    fallback: bool
    detail: str
    role: str = "lengths"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"DataSource.kind must be one of {KINDS}, got {self.kind!r}")
        if self.role not in ROLES:
            raise ValueError(f"DataSource.role must be one of {ROLES}, got {self.role!r}")


def show_path(path: Path | str, root: Path | None) -> str:
    """``$REPRO_DATA/<rel>`` for a path under the data root ``root``, else the path as given."""
    if root is not None:
        try:
            rel = Path(path).resolve().relative_to(root.resolve())
        except ValueError:
            return str(path)
        return f"$REPRO_DATA/{rel.as_posix()}"
    return str(path)
