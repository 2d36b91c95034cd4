"""A robustness study's results as the rest of the suite reads them (summary.md, the closing line, INDEX.md):
its classes, its files, and where a run finds its study. The studies themselves are made by
:mod:`repro.experiments.robustness`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repro.experiments.results import RESULTS_DIR

ROBUST, DEPENDS, NOWHERE = "holds robustly", "depends on the setting", "differs everywhere plausible"
CLASSES = (ROBUST, DEPENDS, NOWHERE)
ROBUST_SHARE = 0.9
#: The joint design's settings by default, and those of the reference studies (``repro all``: the quick grid, seed 0).
QUICK_SAMPLES, FULL_SAMPLES = 8, 24
#: A study's files in its folder (a reference folder keeps them when the experiment's own reference is rewritten).
FILES = ("robustness.csv", "robustness.md", "robustness.png", "robustness.json")


def read_study(folder: Path) -> dict[str, Any] | None:
    """A folder's robustness.json, or None (none, or not readable)."""
    path = folder / "robustness.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None


def find_study(out_dir: Path, name: str) -> tuple[dict[str, Any] | None, str]:
    """The robustness study of a run's folder, else the committed one of its experiment (results/NAME/), and a
    phrase saying which; ``(None, "")`` without one."""
    for folder, where in ((out_dir, "this folder's study"),
                          (RESULTS_DIR / name, f"the reference study, results/{name}")):
        study = read_study(folder) if name else None
        if study is not None:
            return study, where
    return None, ""


def class_counts(study: Mapping[str, Any]) -> dict[str, int]:
    """How many of a study's claims fall in each class (and ``n/a``: not computable on its grid)."""
    classes = [str(c.get("class")) for c in (study.get("claims") or {}).values()]
    return {k: classes.count(k) for k in (*CLASSES, "n/a")}
