"""scripts/mutation_report.py: the mutation score per module and package from mutmut's ``mutants/*.meta``, with the
survivors shown equivalent (scripts/mutation_triage.toml) out of the denominator, on a hand-made folder."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.usefixtures("no_data")

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> Any:
    """``scripts/<name>.py`` as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _report() -> Any:
    return _script("mutation_report")


def _budget() -> Any:
    return _script("mutation_budget")


def _meta(root: Path, rel: str, codes: dict[str, int | None]) -> None:
    path = root / f"{rel}.meta"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes}))


def test_the_score_is_killed_over_the_mutants_less_the_equivalent_and_the_unrun(tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture[str]
                                                                                ) -> None:
    mutants = tmp_path / "mutants"
    kv = {f"repro.sim.kv.x_f__mutmut_{i}": code for i, code in enumerate([1, 1, 1, 36, 0, 0, 5, None])}
    _meta(mutants, "repro/sim/kv.py", kv)
    _meta(mutants, "repro/sim/plan.py", {"repro.sim.plan.x_g__mutmut_1": 1})
    _meta(mutants, "repro/cost/step.py", {"repro.cost.step.x_h__mutmut_1": 0})
    _meta(mutants, "repro/sim/empty.py", {})
    triage = tmp_path / "triage.toml"
    triage.write_text('[equivalent]\n"repro.sim.kv.x_f__mutmut_4" = "the same values"\n'
                      '"repro.gone.x__mutmut_1" = "a function since changed"\n')
    mod = _report()
    c = mod.tally(kv, mod.triaged(triage))
    # 4 killed (a timeout counts), 1 equivalent, 1 survivor, 1 without tests, 1 not run: 4 / (8 - 1 - 1)
    assert (c["killed"], c["equivalent"], c["survived"], c["no tests"], c["not run"]) == (4, 1, 1, 1, 1)
    assert mod.score(c) == f"{4 / 6:.1%}"
    assert mod.main(["--mutants", str(mutants), "--triage", str(triage)]) == 0
    out = capsys.readouterr().out
    assert "fastest covering tests" not in out  # no budget: every covering test
    (mutants / "mutation-budget.json").write_text(json.dumps({"budget_s": 5.0, "max_tests": 40}))
    assert mod.main(["--mutants", str(mutants), "--triage", str(triage)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Each function's mutants against its fastest covering tests, at most 40 tests and 5 s")
    assert "| `repro.sim.kv` | 66.7% | 8 | 4 | 1 | 1 | 1 | 0 | 1 |" in out
    assert "| **repro.sim** | **71.4%** | 9 | 5 |" in out  # kv and plan: 5 / (9 - 1 - 1)
    assert "| **repro.cost** | **0.0%** |" in out and "repro.sim.empty" not in out
    assert "3 untriaged survivors" in out  # kv's survivor and its mutant without tests, step's survivor
    assert "repro.gone.x__mutmut_1" in out.split("no longer generated")[1]
    assert mod.main(["--mutants", str(mutants), "--triage", str(triage), "--names"]) == 0
    assert capsys.readouterr().out == "repro.cost.step.x_h__mutmut_1\nrepro.sim.kv.x_f__mutmut_5\n"  # survivors only


def test_a_missing_mutants_folder_is_one_line_naming_the_script_to_run(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert _report().main(["--mutants", str(tmp_path / "none")]) == 2
    assert "run scripts/mutation.sh first" in capsys.readouterr().err


def test_the_committed_triage_file_parses_and_gives_a_reason_for_each_mutant() -> None:
    mod = _report()
    table = mod.triaged(ROOT / "scripts" / "mutation_triage.toml")
    for name, why in table.items():
        assert name.startswith(mod.PACKAGES) and name.count("__mutmut_") == 1 and len(why) > 10, name


@pytest.mark.parametrize(("budget_s", "max_tests", "kept"), [
    (5.0, 40, ["t::a", "t::b", "t::c"]),  # 0.5 + 1 + 3 = 4.5 s; d would make 9.5
    (5.0, 2, ["t::a", "t::b"]),
    (0.1, 40, ["t::a"]),  # at least one test
    (100.0, 40, ["t::a", "t::b", "t::c", "t::d", "t::e"]),
])
def test_a_functions_tests_are_its_fastest_within_the_budget(budget_s: float, max_tests: int,
                                                            kept: list[str]) -> None:
    duration = {"t::d": 5.0, "t::b": 1.0, "t::c": 3.0, "t::a": 0.5, "t::e": 5.0}
    assert _budget().cut(list(duration), duration, budget_s, max_tests) == kept


def test_the_modules_own_tests_come_first_and_each_test_function_before_a_second_case() -> None:
    duration = {"tests/test_other.py::test_x[1]": 0.1, "tests/test_other.py::test_x[2]": 0.1,
                "tests/test_other.py::test_x[3]": 0.1, "tests/test_other.py::test_y": 0.3,
                "tests/cost/test_model.py::test_z[a]": 0.5, "tests/cost/test_model.py::test_z[b]": 0.2,
                "tests/cost/test_model_units.py::test_w": 0.9}
    got = _budget().cut(list(duration), duration, 100.0, 40, "repro.cost.model.xǁCostModelǁ__init__")
    assert got == ["tests/cost/test_model.py::test_z[b]", "tests/cost/test_model_units.py::test_w",
                   "tests/cost/test_model.py::test_z[a]",  # the module's own, one case of each function first
                   "tests/test_other.py::test_x[1]", "tests/test_other.py::test_y", "tests/test_other.py::test_x[2]",
                   "tests/test_other.py::test_x[3]"]
    assert _budget().cut(list(duration), duration, 1.2, 40, "systems.nightjar.x_f") == [
        "tests/test_other.py::test_x[1]", "tests/cost/test_model.py::test_z[b]", "tests/test_other.py::test_y"
    ]  # no own file: one case a function, fastest first, until the next (test_w, 0.9 s) would pass 1.2 s
    own = _budget().own
    assert own("tests/test_oracle.py::t", "repro.oracle.token_oracle.x_f")  # the module's name contains the file's
    assert own("tests/test_kv_pool.py::t", "repro.sim.kv.xǁKvPoolǁgrew")
    assert not own("tests/test_engine.py::t", "repro.sim.replica.x_f") and not own("tests/test_x.py::t", "")


def test_the_budget_rewrites_mutmuts_stats_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stats = {"tests_by_mangled_function_name": {"repro.sim.kv.x_f": ["t::slow", "t::fast"], "repro.sim.kv.x_g": []},
             "duration_by_test": {"t::slow": 9.0, "t::fast": 1.0}, "stats_time": 1.0}
    (tmp_path / "mutmut-stats.json").write_text(json.dumps(stats))
    assert _budget().main(["--mutants", str(tmp_path), "--budget-s", "5", "--max-tests", "3"]) == 0
    out = json.loads((tmp_path / "mutmut-stats.json").read_text())
    assert out["tests_by_mangled_function_name"] == {"repro.sim.kv.x_f": ["t::fast"], "repro.sim.kv.x_g": []}
    assert out["duration_by_test"] == stats["duration_by_test"] and out["stats_time"] == 1.0
    assert json.loads((tmp_path / "mutation-budget.json").read_text()) == {"budget_s": 5.0, "max_tests": 3}
    assert "a survivor's tests 10 s -> 1 s" in capsys.readouterr().out
    assert json.loads((tmp_path / "mutation-coverage.json").read_text())["repro.sim.kv.x_f"] == ["t::fast", "t::slow"]
    assert _budget().main(["--mutants", str(tmp_path), "--budget-s", "20"]) == 0  # a later cut starts from them all
    out = json.loads((tmp_path / "mutmut-stats.json").read_text())
    assert sorted(out["tests_by_mangled_function_name"]["repro.sim.kv.x_f"]) == ["t::fast", "t::slow"]
    capsys.readouterr()
    assert _budget().main(["--mutants", str(tmp_path / "none")]) == 2
    assert "mutmut has not collected its stats" in capsys.readouterr().err
    assert _budget().main(["--mutants", str(tmp_path), "--budget-s", "0"]) == 2


def test_a_functions_killers_come_first_in_the_next_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/conftest.py records the test that killed a mutant (under a mutation run only); the next cut puts the
    tests that killed the function's mutants first, most kills first, before the module's own."""
    from types import SimpleNamespace

    from tests.conftest import pytest_runtest_logreport

    monkeypatch.chdir(tmp_path)
    failed = SimpleNamespace(failed=True, nodeid="tests/test_slow.py::test_b")
    monkeypatch.delenv("MUTANT_UNDER_TEST", raising=False)
    pytest_runtest_logreport(failed)  # type: ignore[arg-type]
    assert not (tmp_path / "mutation-kills.jsonl").exists()  # not a mutation run
    monkeypatch.setenv("MUTANT_UNDER_TEST", "repro.sim.kv.x_f__mutmut_3")
    pytest_runtest_logreport(SimpleNamespace(failed=False, nodeid="tests/test_kv_pool.py::t"))  # type: ignore[arg-type]
    for _ in range(2):
        pytest_runtest_logreport(failed)  # type: ignore[arg-type]
    monkeypatch.setenv("MUTANT_UNDER_TEST", "repro.sim.kv.x_f__mutmut_4")
    pytest_runtest_logreport(SimpleNamespace(failed=True, nodeid="tests/test_slow.py::test_a"))  # type: ignore[arg-type]
    lines = (tmp_path / "mutation-kills.jsonl").read_text().splitlines()
    b = {"mutant": "repro.sim.kv.x_f__mutmut_3", "test": "tests/test_slow.py::test_b"}
    assert [json.loads(x) for x in lines] == [b, b, {"mutant": "repro.sim.kv.x_f__mutmut_4",
                                                     "test": "tests/test_slow.py::test_a"}]
    tests = ["tests/test_kv_pool.py::t", "tests/test_slow.py::test_a", "tests/test_slow.py::test_b"]
    duration = {"tests/test_kv_pool.py::t": 0.1, "tests/test_slow.py::test_a": 2.0, "tests/test_slow.py::test_b": 3.0}
    stats = {"tests_by_mangled_function_name": {"repro.sim.kv.x_f": tests}, "duration_by_test": duration}
    (tmp_path / "mutmut-stats.json").write_text(json.dumps(stats))
    assert _budget().main(["--mutants", str(tmp_path), "--max-tests", "2", "--budget-s", "10"]) == 0
    out = json.loads((tmp_path / "mutmut-stats.json").read_text())
    assert out["tests_by_mangled_function_name"]["repro.sim.kv.x_f"] == ["tests/test_slow.py::test_b",
                                                                           "tests/test_slow.py::test_a"]


def _lines() -> Any:
    return _script("mutation_lines")


#: A module and mutmut's rewrite of it (only the variants matter): a changed condition, a changed default argument
#: (the signature, evaluated at import), a change inside a statement's second line, and a method's.
_SOURCE = '''def f(a, b=1):
    x = a + b
    if x > 2:
        return (x +
                1)
    return x


class C:
    def m(self):
        return 1
'''
_MUTATED = '''def x_f__mutmut_orig(a, b=1):
    x = a + b
    if x > 2:
        return (x +
                1)
    return x
def x_f__mutmut_1(a, b=1):
    x = a + b
    if x >= 2:
        return (x +
                1)
    return x
def x_f__mutmut_2(a, b=2):
    x = a + b
    if x > 2:
        return (x +
                1)
    return x
def x_f__mutmut_3(a, b=1):
    x = a + b
    if x > 2:
        return (x +
                2)
    return x
class C:
    def xǁCǁm__mutmut_orig(self):
        return 1
    def xǁCǁm__mutmut_1(self):
        return 2
'''


def _line_fixture(tmp_path: Path) -> tuple[Path, Path]:
    """A checkout with ``pkg/mod.py``, mutmut's folder for it, and a line coverage by test: ``test_a`` ran lines
    1-3 and 6 (x <= 2), ``test_b`` lines 2-5 (x > 2), ``test_c`` the method."""
    from coverage import CoverageData

    root, mutants = tmp_path / "p", tmp_path / "p" / "mutants"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text(_SOURCE)
    (mutants / "pkg").mkdir(parents=True)
    (mutants / "pkg" / "mod.py").write_text(_MUTATED)
    names = ["pkg.mod.x_f__mutmut_1", "pkg.mod.x_f__mutmut_2", "pkg.mod.x_f__mutmut_3", "pkg.mod.xǁCǁm__mutmut_1"]
    _meta(mutants, "pkg/mod.py", dict.fromkeys(names))
    tests = {"a": "tests/test_a.py::test_a", "b": "tests/test_b.py::test_b[1]", "c": "tests/test_c.py::test_c"}
    (mutants / "mutmut-stats.json").write_text(json.dumps({
        "duration_by_test": {tests["a"]: 0.1, tests["b"]: 0.2, tests["c"]: 0.3},
        "tests_by_mangled_function_name": {"pkg.mod.x_f": [tests["a"], tests["b"]], "pkg.mod.xǁCǁm": [tests["c"]]},
    }))
    cov = CoverageData(basename=str(mutants / "mutation-lines.coverage"))
    mod = str(root / "pkg" / "mod.py")
    for test, lines in (("a", [1, 2, 3, 6]), ("b", [2, 3, 4, 5]), ("c", [10, 11])):
        cov.set_context(f"{tests[test]}|run")
        cov.add_lines({mod: lines})
    cov.set_context(f"{tests['c']}|setup")  # a fixture's lines are not the test's
    cov.add_lines({mod: [4]})
    cov.write()
    return root, mutants


def test_each_mutant_gets_the_tests_that_ran_its_statement(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    root, mutants = _line_fixture(tmp_path)
    mod = _lines()
    offsets = mod.mutated_offsets((mutants / "pkg" / "mod.py").read_text())
    # the first differing line from the def: the condition, the signature, the return's second line, the method's
    assert offsets == {"x_f__mutmut_1": 2, "x_f__mutmut_2": 0, "x_f__mutmut_3": 4, "xǁCǁm__mutmut_1": 1}
    plan = mod.plan(mutants, mutants / "mutation-lines.coverage", budget_s=20.0, max_tests=200, root=root)
    assert plan == {
        "pkg.mod.x_f__mutmut_1": ["tests/test_a.py::test_a", "tests/test_b.py::test_b[1]"],  # both ran the `if`
        "pkg.mod.x_f__mutmut_3": ["tests/test_b.py::test_b[1]"],  # line 5 is the return's (line 4), run by b only
        "pkg.mod.xǁCǁm__mutmut_1": ["tests/test_c.py::test_c"],
    }  # a default argument's mutant is left to its function's cut
    (mutants / "mutation-budget.json").write_text(json.dumps({"budget_s": 5.0, "max_tests": 40}))
    assert mod.main(["plan", "--mutants", str(mutants)]) == 0
    assert json.loads((mutants / "mutation-tests.json").read_text()) == plan
    assert _report().main(["--mutants", str(mutants)]) == 0
    out = capsys.readouterr().out
    assert "3 of 4 mutants get their own statement's tests" in out
    assert ("Each mutant against the covering tests that ran its statement, at most 100 tests and 4 s (3 of 4 "
            "mutants, scripts/mutation_lines.py); the rest against their function's fastest covering tests, at most "
            "40 tests and 5 s") in out


def test_a_statement_is_widened_to_where_coverage_records_it() -> None:
    import ast

    f = ast.parse(_SOURCE).body[0]
    mod = _lines()
    assert mod.statement_lines(f, 1) is None  # the signature
    assert mod.statement_lines(f, 3) == range(3, 4)  # the header of the `if`, not its body
    assert mod.statement_lines(f, 5) == range(4, 6)  # a statement's second line: all of it
    assert mod.statement_lines(f, 6) == range(6, 7)


def test_a_mutants_own_tests_put_its_functions_killers_first_within_the_budget(tmp_path: Path) -> None:
    root, mutants = _line_fixture(tmp_path)
    (mutants / "mutation-kills.jsonl").write_text(
        json.dumps({"mutant": "pkg.mod.x_f__mutmut_9", "test": "tests/test_b.py::test_b[1]"}) + "\n")
    mod = _lines()
    plan = mod.plan(mutants, mutants / "mutation-lines.coverage", budget_s=20.0, max_tests=200, root=root)
    assert plan["pkg.mod.x_f__mutmut_1"] == ["tests/test_b.py::test_b[1]", "tests/test_a.py::test_a"]
    plan = mod.plan(mutants, mutants / "mutation-lines.coverage", budget_s=20.0, max_tests=1, root=root)
    assert plan["pkg.mod.x_f__mutmut_1"] == ["tests/test_b.py::test_b[1]"]
    # a survivors' second pass: only the function's killers that ran the statement, only where there is one
    plan = mod.plan(mutants, mutants / "mutation-lines.coverage", budget_s=20.0, max_tests=200, root=root,
                    killers_only=True)
    assert plan == {"pkg.mod.x_f__mutmut_1": ["tests/test_b.py::test_b[1]"],
                    "pkg.mod.x_f__mutmut_3": ["tests/test_b.py::test_b[1]"]}
    plan = mod.plan(mutants, mutants / "mutation-lines.coverage", budget_s=20.0, max_tests=200, root=root,
                    killers_only=True, also=("tests/test_c.py",))  # and a test written since
    assert plan["pkg.mod.xǁCǁm__mutmut_1"] == ["tests/test_c.py::test_c"] and len(plan) == 3


def test_the_run_gives_mutmut_each_planned_mutant_its_tests_in_order_and_their_time_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import types

    import mutmut
    from mutmut.runners import harness
    from mutmut.workers import isolation

    # (the modules themselves: mutmut's package exports functions of the same names)
    mutmut_main, configuration, mutmut_state = (importlib.import_module(f"mutmut.{m}")
                                                for m in ("__main__", "configuration", "state"))

    own = {"m.x_f__mutmut_1": ["tests/t.py::slow", "tests/t.py::fast"]}
    (tmp_path / "tests.json").write_text(json.dumps(own))
    submitted: list[tuple[Any, ...]] = []
    ran: list[list[str]] = []
    for runner in (isolation.ForkRunner, isolation.ForkServerRunner):
        monkeypatch.setattr(runner, "submit", lambda self, *a: submitted.append(a))
    monkeypatch.setattr(harness.PytestRunner, "run_tests",
                        lambda self, *, mutant_name, tests: ran.append(list(tests)) or 0)
    durations = {"tests/t.py::slow": 2.0, "tests/t.py::fast": 0.5}
    monkeypatch.setattr(mutmut_state, "state", lambda: types.SimpleNamespace(duration_by_test=durations))
    monkeypatch.setattr(configuration, "config",
                        lambda: types.SimpleNamespace(timeout_constant=1.0, timeout_multiplier=15.0))
    called: list[list[str]] = []
    monkeypatch.setattr(mutmut_main, "cli", lambda: called.append(list(__import__("sys").argv)))
    mod = _lines()
    assert mod.run(tmp_path / "tests.json", ["repro.sim.*"]) == 0
    assert called == [["mutmut", "run", "repro.sim.*"]]
    isolation.ForkRunner.submit(None, "m.x_f__mutmut_1", ["tests/t.py::other"], 99, 9.0)
    isolation.ForkRunner.submit(None, "m.x_f__mutmut_2", ["tests/t.py::other"], 99, 9.0)  # not planned: as it was
    # mutmut's own limit, (estimate + 1 s) x 15 x 2, from the planned tests' 2.5 s
    assert submitted == [("m.x_f__mutmut_1", own["m.x_f__mutmut_1"], 105, 2.5),
                         ("m.x_f__mutmut_2", ["tests/t.py::other"], 99, 9.0)]
    harness.PytestRunner.run_tests(None, mutant_name="m.x_f__mutmut_1", tests=sorted(own["m.x_f__mutmut_1"]))
    assert ran == [own["m.x_f__mutmut_1"]]  # the plan's order, not the fork runner's fastest-first
    monkeypatch.setattr(mutmut, "__version__", "9.9.9")
    assert mod.run(tmp_path / "tests.json", []) == 2
