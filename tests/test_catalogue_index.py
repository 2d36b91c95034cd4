"""results/INDEX.md (and the quick one) agrees with every summary it links: the points and the claims held and
differing that each experiment's summary.md shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from repro.experiments.results import RESULTS_DIR

ROW = re.compile(r"\| \[(\w+)\]\((\S+)/summary\.md\) \| .* \| (\d+) \| (\d+) \| (\d+) \| ")


def _verdicts(summary: str) -> list[str]:
    """The verdict column of a summary's claims table."""
    if "## Paper claims" not in summary:
        return []
    table = [line for line in summary.split("## Paper claims", 1)[1].splitlines() if line.startswith("| ")]
    head = [c.strip() for c in table[0].strip("|").split(" | ")] if table else []
    col = head.index("verdict") if "verdict" in head else None
    return [] if col is None else [line.strip("|").split(" | ")[col].strip() for line in table[1:]]


@pytest.mark.parametrize("root", [RESULTS_DIR, RESULTS_DIR / "quick"], ids=["full", "quick"])
def test_the_index_agrees_with_every_summary(root: Path) -> None:
    rows = [ROW.match(line) for line in (root / "INDEX.md").read_text().splitlines()]
    rows = [m for m in rows if m]
    assert len(rows) > 30
    for m in rows:
        name, rel, points, held, differ = m.groups()
        summary = (root / rel / "summary.md").read_text()
        if name != "calibration":
            assert re.search(rf"^{points} points", summary, re.M), f"{name}: INDEX says {points} points"
        verdicts = _verdicts(summary)
        assert (verdicts.count("holds"), verdicts.count("differs")) == (int(held), int(differ)), name
