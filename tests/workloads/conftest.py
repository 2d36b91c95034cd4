"""Shared helpers for the workload tests: the real data folder (skip when absent) and a config factory."""

from __future__ import annotations

from pathlib import Path

import pytest

REAL_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture
def real_data(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point $REPRO_DATA at the real data folder, or skip when it is missing."""
    if not (REAL_DATA / "MANIFEST.md").is_file():
        pytest.skip(f"real data folder {REAL_DATA} missing")
    monkeypatch.setenv("REPRO_DATA", str(REAL_DATA))
    return REAL_DATA


@pytest.fixture
def empty_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Point $REPRO_DATA at an empty folder (forces the embedded fallback)."""
    monkeypatch.setenv("REPRO_DATA", str(tmp_path))
    return tmp_path
