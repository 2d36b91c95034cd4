"""Each function's tests under a mutation run, cut to a budget: its own module's tests first, one case of each test
function before a second, fastest first, up to a total time and count.

    python scripts/mutation_budget.py                    # 5 s and 40 tests a function (scripts/mutation.sh runs it)
    python scripts/mutation_budget.py --budget-s 20 --max-tests 100

mutmut tries each mutant against every selected test that ran its function when mutmut collected its stats
(``mutants/mutmut-stats.json``: ``tests_by_mangled_function_name``, with each test's duration). The engine's core
functions run under 300 tests and 140 s, so each of their surviving mutants costs 140 s, and passing 300 test names
to pytest costs about a second even where the first test kills. This keeps, for each function, up to ``--budget-s``
seconds and ``--max-tests`` of its covering tests (at least one), chosen in this order:

0. the tests that killed one of the function's mutants in an earlier run, most kills first (``tests/conftest.py``
   appends each kill to ``mutants/mutation-kills.jsonl``; a wider cut over a run's survivors finds more);
1. then the tests of the module's own test file (``tests/**/test_<name>*.py`` for a module ``<name>``, or a test
   file whose name the module's contains: ``test_oracle.py`` for ``token_oracle``), then every other;
2. within each, one case of every test function before a second case of any (a parametrized test's 20 cases of one
   mechanism would otherwise fill the budget before a test of another mechanism got in), each round fastest first.

A mutant killed only by a test left out then survives: the score is a lower bound of the one over every covering
test. mutmut keeps a loaded stats file as it is, so the run that follows reads these lists; the budget is written
beside them (``mutants/mutation-budget.json``) for the report, and every covering test is kept in
``mutants/mutation-coverage.json`` (merged with what mutmut adds for new tests on a later run), so a later cut, to
another budget, starts from all of them. The file format is mutmut 3.8.1's (pinned in the dev
extra).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def own(test: str, function: str) -> bool:
    """Whether ``test`` is in the module's own test file (``function``: mutmut's name, ``repro.cost.model.x_f``)."""
    module = function.split(".x", 1)[0].rsplit(".", 1)[-1].lstrip("_")
    stem = test.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
    return bool(module) and (stem.startswith(module) or stem in module)


def cut(tests: list[str], duration: dict[str, float], budget_s: float, max_tests: int, function: str = "",
        killers: dict[str, int] | None = None) -> list[str]:
    """``tests`` in the order above (``killers``: kills of the function's mutants by test), within ``budget_s``
    seconds in all and ``max_tests`` tests, at least one."""
    killers = killers or {}
    order = sorted((t for t in tests if killers.get(t)), key=lambda t: (-killers[t], duration.get(t, 0.0), t))
    cases: dict[tuple[bool, str], list[str]] = {}
    for test in sorted(tests, key=lambda t: (duration.get(t, 0.0), t)):
        if not killers.get(test):
            cases.setdefault((not own(test, function), test.split("[", 1)[0]), []).append(test)
    for mine in (True, False):
        groups = [g for (other, _), g in cases.items() if other != mine]  # (dicts keep the fastest-first order)
        for i in range(max((len(g) for g in groups), default=0)):
            order += sorted((g[i] for g in groups if i < len(g)), key=lambda t: (duration.get(t, 0.0), t))
    kept: list[str] = []
    spent = 0.0
    for test in order:
        d = duration.get(test, 0.0)
        if kept and (spent + d > budget_s or len(kept) >= max_tests):
            break
        kept.append(test)
        spent += d
    return kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=Path, default=ROOT / "mutants", help="mutmut's folder (default: ./mutants)")
    ap.add_argument("--budget-s", type=float, default=5.0, help="seconds of measured test time a function (5)")
    ap.add_argument("--max-tests", type=int, default=40, help="tests a function (40)")
    args = ap.parse_args(argv)
    if args.budget_s <= 0 or args.max_tests < 1:
        print("mutation_budget: --budget-s must be > 0 and --max-tests >= 1", file=sys.stderr)
        return 2
    path = args.mutants / "mutmut-stats.json"
    if not path.is_file():
        print(f"mutation_budget: no {path}: mutmut has not collected its stats (scripts/mutation.sh does)",
              file=sys.stderr)
        return 2
    stats = json.loads(path.read_text())
    duration: dict[str, float] = stats["duration_by_test"]
    full_path = args.mutants / "mutation-coverage.json"
    full: dict[str, list[str]] = json.loads(full_path.read_text()) if full_path.is_file() else {}
    for name, tests in stats["tests_by_mangled_function_name"].items():
        full[name] = sorted(set(full.get(name, [])) | set(tests))
    full = {name: [t for t in tests if t in duration] for name, tests in full.items()}  # (tests since removed)
    full_path.write_text(json.dumps(full, indent=2))
    kills: dict[str, dict[str, int]] = {}
    log = args.mutants / "mutation-kills.jsonl"
    for line in log.read_text().splitlines() if log.is_file() else ():
        kill = json.loads(line)
        by = kills.setdefault(kill["mutant"].rsplit("__mutmut_", 1)[0], {})
        by[kill["test"]] = by.get(kill["test"], 0) + 1
    before = after = 0.0
    for name in stats["tests_by_mangled_function_name"]:
        tests = full[name]
        kept = cut(tests, duration, args.budget_s, args.max_tests, name, kills.get(name))
        before += sum(duration.get(t, 0.0) for t in tests)
        after += sum(duration.get(t, 0.0) for t in kept)
        stats["tests_by_mangled_function_name"][name] = kept
    path.write_text(json.dumps(stats, indent=2))
    (args.mutants / "mutation-budget.json").write_text(
        json.dumps({"budget_s": args.budget_s, "max_tests": args.max_tests}))
    print(f"mutation_budget: {len(stats['tests_by_mangled_function_name'])} functions, at most {args.max_tests} "
          f"tests and {args.budget_s:g} s each: a survivor's tests {before:.0f} s -> {after:.0f} s over all functions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
