"""Shared helpers for the workload tests.

The data folder is ``$REPRO_DATA`` when set (so ``REPRO_DATA=<empty dir> python -m pytest`` runs without data),
else ``../shared/data`` beside the checkout. A test that reads real files names them with the ``data`` marker and
takes the ``real_data`` fixture, which skips it with ``needs $REPRO_DATA/<file>`` when one is absent; every other
test runs with or without data.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workloads.datasets import trace_data_root

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def data_root() -> Path:
    """The data folder the tests read: ``$REPRO_DATA`` if set, else ``../shared/data`` (which may not exist)."""
    env = os.environ.get("REPRO_DATA")
    root = Path(env) if env else DEFAULT_DATA
    trace_data_root(root if root.is_dir() else None)  # tests/data_record.py: this test reads the data folder
    return root


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "data(*files): files under $REPRO_DATA the test reads (real_data skips the test when one is absent)"
    )


@pytest.fixture
def real_data(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point $REPRO_DATA at the data folder holding the files of the test's ``data`` marker, or skip naming the
    first missing one."""
    root = data_root()
    files = [f for m in request.node.iter_markers("data") for f in m.args]
    for rel in files:
        if not (root / rel).is_file():
            pytest.skip(f"needs $REPRO_DATA/{rel}")
    if not root.is_dir():
        pytest.skip("needs the data folder $REPRO_DATA")
    monkeypatch.setenv("REPRO_DATA", str(root))
    return root


@pytest.fixture
def empty_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Point $REPRO_DATA at an empty folder (forces the embedded fallback)."""
    monkeypatch.setenv("REPRO_DATA", str(tmp_path))
    return tmp_path
