"""Which tests read this machine's data folder: recorded by every run, used by ``--data-readers-only``.

The suite runs twice in CI: with the data folder and with none (``REPRO_DATA`` at an empty folder). A test that never
resolves the data folder a run was started with (its *ambient* folder) behaves the same in both, so the second pass
need not repeat it. Every run records, per test, whether it did:

- ``workloads.datasets.default_data_root`` (every loader's way to the data folder) and the suite's own look-ups
  (``tests/conftest.py``'s ``data_root``) append the folder they resolve to the file ``$REPRO_DATA_TRACE`` names;
  this plugin sets it to a file of its own per process, and child processes (``python -m repro``, launcher workers)
  inherit it;
- a test reads the ambient folder when a line written during its set-up, call or tear-down, during the set-up of a
  fixture it uses (a module- or session-scoped one set up for an earlier test counts for every test that uses it),
  or during the import of its module names that folder. A test that pins a folder of its own (an empty one, or the
  real files through ``pinned_data``) resolves that one, and pinning is what makes it the same in both passes.

The record (nodeid -> reads the folder) goes to pytest's cache (``.pytest_cache``, key ``repro/data_readers``),
merged over runs. ``python -m pytest --data-readers-only`` then deselects every test the record knows and saw not
read the folder; a test it does not know runs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from workloads.datasets import trace_data_root

CACHE_KEY = "repro/data_readers"
PROPERTY = "reads_data_folder"


def ambient_root() -> str:
    """The data folder this run resolves when nothing pins one, as trace lines write it ('' for none)."""
    old = os.environ.pop("REPRO_DATA_TRACE", None)
    try:
        from workloads.datasets import default_data_root

        root = default_data_root()
    finally:
        if old is not None:
            os.environ["REPRO_DATA_TRACE"] = old
    return str(root.resolve()) if root is not None else ""


def fixture_key(item: Any, fixturedef: Any) -> tuple[str, str, tuple[tuple[str, int], ...]]:
    """A fixture's instance as ``item`` sees it: where it is defined, its name, and the parameters (of ``item``'s)
    that it or a fixture it depends on takes. A module fixture set up under ``data=files`` is another instance than
    under ``data=none``; one that takes no parameter is one instance for every test of its scope."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    indices = getattr(getattr(item, "callspec", None), "indices", {})
    closure, todo = set(), [fixturedef.argname]
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        closure.add(name)
        for d in defs.get(name, ()):
            todo.extend(d.argnames)
    return fixturedef.baseid, fixturedef.argname, tuple(sorted((n, indices[n]) for n in closure if n in indices))


class DataRecord:
    """The recording half (every process that runs tests) and the selecting half (the controlling process)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.ambient = ambient_root()
        fd, name = tempfile.mkstemp(prefix="repro-data-trace-", suffix=".txt")
        os.close(fd)
        self.trace = Path(name)
        os.environ["REPRO_DATA_TRACE"] = str(self.trace)
        self.offset = 0
        self.reading_fixtures: set[tuple[str, str]] = set()  # (baseid, argname) of fixtures whose set-up read it
        self.reading_modules: set[str] = set()  # nodeids of modules whose import read it
        self.item_read = False
        self.seen: dict[str, bool] = {}  # controller: nodeid -> read, from this run's tear-down reports

    # -------------------------------------------------------------------- recording
    def _read_since(self) -> bool:
        """Whether a line naming the ambient folder was written since the last call."""
        with open(self.trace, encoding="utf-8") as f:
            f.seek(self.offset)
            lines = f.read()
            self.offset = f.tell()
        return any(line == self.ambient for line in lines.splitlines())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Generator[None, Any, None]:
        self._read_since()
        yield
        if self._read_since():
            self.reading_modules.add(collector.nodeid)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Generator[None, Any, None]:
        before = self._read_since()
        yield
        item = getattr(request, "_pyfuncitem", None)
        if self._read_since() and item is not None:
            self.reading_fixtures.add(fixture_key(item, fixturedef))
        self.item_read = self.item_read or before

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, None]:
        self._read_since()
        self.item_read = False
        yield
        self.item_read = self._read_since() or self.item_read

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, None]:
        yield
        self.item_read = self._read_since() or self.item_read

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, Any, None]:
        yield
        read = self._read_since() or self.item_read
        info = getattr(item, "_fixtureinfo", None)
        if not read and info is not None:
            read = any(fixture_key(item, d) in self.reading_fixtures
                       for defs in info.name2fixturedefs.values() for d in defs)
        if not read:
            read = any(item.nodeid.startswith(m + "::") or item.nodeid == m for m in self.reading_modules if m)
        item.user_properties.append((PROPERTY, read))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        props = dict(report.user_properties)
        if PROPERTY in props:
            self.seen[report.nodeid] = bool(props[PROPERTY])

    # -------------------------------------------------------------------- selecting
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not config.getoption("data_readers_only"):
            return
        cache = getattr(config, "cache", None)  # none under -p no:cacheprovider
        record = cache.get(CACHE_KEY, {}) if cache is not None else {}
        keep, drop = [], []
        for item in items:
            (drop if record.get(item.nodeid) is False else keep).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
        self.deselected = len(drop)
        if hasattr(config, "workerinput"):
            config.workeroutput["data_readers_deselected"] = len(drop)  # type: ignore[attr-defined]

    def pytest_testnodedown(self, node: Any, error: Any) -> None:  # xdist's controller: a worker's count
        n = getattr(node, "workeroutput", {}).get("data_readers_deselected")
        if n is not None:
            self.deselected = n  # every worker collects (and deselects) the same items

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        n = getattr(self, "deselected", None)
        if n is not None:
            terminalreporter.write_line(f"--data-readers-only: {n} tests deselected (the recorded run saw them not "
                                        "read the data folder)")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):  # an xdist worker: its reports reach the controller
            self.trace.unlink(missing_ok=True)
            return
        self.trace.unlink(missing_ok=True)
        cache = getattr(session.config, "cache", None)
        if self.seen and cache is not None:
            record = dict(cache.get(CACHE_KEY, {}))
            record.update(self.seen)
            cache.set(CACHE_KEY, record)


def register(config: pytest.Config) -> None:
    config.pluginmanager.register(DataRecord(config), "repro-data-record")


def add_option(parser: pytest.Parser) -> None:
    parser.addoption("--data-readers-only", action="store_true", default=False,
                     help="run only the tests the last recorded run saw read the data folder, and tests it does not "
                          "know (CI's second pass, with no data: tests/data_record.py)")


__all__ = ["DataRecord", "add_option", "ambient_root", "register", "trace_data_root"]
