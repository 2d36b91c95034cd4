"""tests/data_record.py: every run records which tests read the data folder; ``--data-readers-only`` runs those.

A small suite in a temporary folder, run twice as CI runs the real one (with a data folder, then with an empty one
and ``--data-readers-only``): the tests that read the folder directly, through a shared fixture, at import or in a
child process run again; the ones that never look, or pin a folder of their own, do not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
from tests import data_record


def pytest_addoption(parser):
    data_record.add_option(parser)


def pytest_configure(config):
    data_record.register(config)
"""

TESTS = """
import os
import subprocess
import sys

import pytest

from workloads.datasets import default_data_root


@pytest.fixture(scope="module")
def shared():
    return default_data_root()


def test_reads():
    assert default_data_root() is not None


def test_never_looks():
    assert 1 + 1 == 2


def test_first_user_of_the_fixture(shared):
    assert shared is not None


def test_second_user_of_the_fixture(shared):  # the fixture is cached: no look-up of its own
    assert shared is not None


def test_pins_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_DATA", str(tmp_path))
    assert default_data_root() == tmp_path


@pytest.fixture(scope="module", params=["real", "empty"])
def mode(request):
    return request.param


@pytest.fixture(scope="module")
def loaded(mode):  # set up once per mode: only the "real" instance reads
    return default_data_root() if mode == "real" else None


def test_first_user_of_loaded(loaded):
    pass


def test_second_user_of_loaded(loaded):
    pass


def test_child_process_reads():
    code = "from workloads.datasets import default_data_root; default_data_root()"
    subprocess.run([sys.executable, "-c", code], check=True)
"""

IMPORTING = """
from workloads.datasets import default_data_root

ROOT_AT_IMPORT = default_data_root()


def test_module_read_at_import():
    assert ROOT_AT_IMPORT is not None
"""


def _pytest(folder: Path, data: Path, *args: str) -> set[str]:
    env = {**os.environ, "REPRO_DATA": str(data), "PYTHONPATH": str(ROOT)}
    env.pop("REPRO_DATA_TRACE", None)
    res = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-q", "-o", "addopts=",
                          *args], cwd=folder, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return {line.split("::")[-1] for line in res.stdout.splitlines() if line.startswith("PASSED")}


def test_the_second_pass_runs_only_what_read_the_data_folder(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_some.py").write_text(TESTS)
    (suite / "test_importing.py").write_text(IMPORTING)
    data, empty = tmp_path / "data", tmp_path / "empty"
    data.mkdir()
    (data / "a_file").write_text("x")
    empty.mkdir()
    first = _pytest(suite, data)
    assert len(first) == 11
    second = _pytest(suite, empty, "--data-readers-only")
    assert second == {"test_reads", "test_first_user_of_the_fixture", "test_second_user_of_the_fixture",
                      "test_first_user_of_loaded[real]", "test_second_user_of_loaded[real]",
                      "test_child_process_reads", "test_module_read_at_import"}
