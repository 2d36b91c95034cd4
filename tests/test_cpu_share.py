"""tests/conftest.py's ``_cpu_share``: a test marked ``alone`` holds the cores' lock exclusive (no other test of any
pytest run on this machine runs beside it), every other test holds it shared."""

from __future__ import annotations

import pytest

from tests.conftest import _LOCKS

fcntl = pytest.importorskip("fcntl")


def _can_share() -> bool:
    """Whether another test could take its share now (a lock on a file description of its own)."""
    with open(f"{_LOCKS}.cpu", "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh, fcntl.LOCK_UN)
        return True


@pytest.mark.alone
def test_a_test_marked_alone_holds_the_cores() -> None:
    assert not _can_share()


def test_other_tests_share_them() -> None:
    assert _can_share()
