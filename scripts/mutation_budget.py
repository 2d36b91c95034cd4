"""Each function's tests under a mutation run, cut to a budget: its fastest covering tests, up to a total time.

    python scripts/mutation_budget.py                    # 5 s and 40 tests a function (scripts/mutation.sh runs it)
    python scripts/mutation_budget.py --budget-s 20 --max-tests 100

mutmut tries each mutant against every selected test that ran its function when mutmut collected its stats
(``mutants/mutmut-stats.json``: ``tests_by_mangled_function_name``, with each test's duration). The engine's core
functions run under 300 tests and 140 s, so each of their surviving mutants costs 140 s, and passing 300 test names
to pytest costs about a second even where the first test kills. This keeps, for each function, its covering tests
in order of their measured duration (then name), up to ``--budget-s`` seconds and ``--max-tests`` tests, and at least
one. A mutant killed only by a slower test then survives: the score is a lower bound of the one over every covering
test (docs/testing.md says which survivors a wider budget kills). mutmut keeps a loaded stats file as it is, so the
run that follows reads these lists; the budget is written beside them (``mutants/mutation-budget.json``) for the report.
The file format is mutmut 3.8.1's (pinned in the dev extra).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cut(tests: list[str], duration: dict[str, float], budget_s: float, max_tests: int) -> list[str]:
    """The fastest of ``tests`` within ``budget_s`` seconds in all and ``max_tests`` tests, at least one."""
    kept: list[str] = []
    spent = 0.0
    for test in sorted(tests, key=lambda t: (duration.get(t, 0.0), t)):
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
    before = after = 0.0
    for name, tests in stats["tests_by_mangled_function_name"].items():
        kept = cut(tests, duration, args.budget_s, args.max_tests)
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
