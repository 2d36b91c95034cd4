"""Each mutant's own tests: the selected tests that run the mutated statement, not every test that runs its function.

    python scripts/mutation_lines.py collect     # the line coverage of mutmut's test selection, by test (pytest-cov)
    python scripts/mutation_lines.py plan        # each mutant's tests (mutants/mutation-tests.json)
    python scripts/mutation_lines.py run [ARGS]  # mutmut run ARGS, each mutant against its own tests
    (scripts/mutation.sh runs all three)

mutmut 3.8.1 tries a mutant against every selected test that ran its *function* (``mutants/mutmut-stats.json``). An
engine function runs under 300 tests, so the function-level cut (``scripts/mutation_budget.py``) keeps the fastest
40, and a mutant on a line only slow whole-scenario tests reach survives the cut rather than the tests. A test that
never executes the mutated statement cannot kill it. So:

1. ``collect`` runs the selection once on the unmutated tree under coverage with one context per test
   (``pytest --cov-context=test``; ``REPRO_JIT=python`` as in the mutation run, and ``MUTANT_UNDER_TEST`` set so
   ``tests/conftest.py`` clears the caches before each test, as it does under mutation: a test that would recompute
   a cached value is credited with the lines it runs) into ``mutants/mutation-lines.coverage``.
2. ``plan`` finds each mutant's line (the first line where its variant differs from ``__mutmut_orig`` in mutmut's
   rewritten module, at the same offset from the ``def`` in the source), widens it to the statement that holds it
   (coverage records a statement where its execution starts), and keeps the function's covering tests that ran
   that statement, ordered and cut as ``mutation_budget.cut`` does (recorded killers first) to ``--budget-s``
   seconds and ``--max-tests`` tests. Where no covering test ran the statement (a default argument, evaluated at
   import; a statement run only in a worker process, which coverage does not follow), the mutant keeps its
   function's cut.
3. ``run`` starts mutmut's own command line with its runner patched: a planned mutant gets its list, in that order,
   and a CPU limit from that list's measured time by mutmut's own rule.

The score is still a lower bound: a mutant killed only by a test past its own cut survives. mutmut's internals are
pinned (the dev extra's ``mutmut==3.8.1``); ``run`` refuses another version.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover (Python 3.10: the backport mutmut's own dependencies bring)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from mutation_budget import cut  # noqa: E402

MUTMUT = "3.8.1"
SEP = "ǁ"  # mutmut's separator in a method's mangled name: xǁClassǁmethod


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function and method of a module by mutmut's mangled name (``x_f``, ``xǁClassǁmethod``)."""
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[f"x_{node.name}"] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"x{SEP}{node.name}{SEP}{item.name}"] = item
    return out


def _variants(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """mutmut's rewritten module: each variant's def (``x_f__mutmut_orig``, ``xǁCǁm__mutmut_3``) by its name."""
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name:
            out[node.name] = node
    return out


def mutated_offsets(mutated_source: str) -> dict[str, int | None]:
    """Each variant's first differing line, as an offset from its ``def`` line, by its name in the module
    (``x_f__mutmut_3``); None where the texts are the same line for line (mutmut's change is then past its end)."""
    lines = mutated_source.splitlines()
    variants = _variants(ast.parse(mutated_source))

    def text(node: ast.AST) -> list[str]:
        return lines[node.lineno - 1:node.end_lineno]  # type: ignore[attr-defined]

    out: dict[str, int | None] = {}
    for name, node in variants.items():
        base, _, n = name.partition("__mutmut_")
        orig = variants.get(f"{base}__mutmut_orig")
        if n == "orig" or orig is None:
            continue
        a, b = text(orig), text(node)
        a[0] = a[0].replace(orig.name, base, 1)
        b[0] = b[0].replace(node.name, base, 1)
        out[name] = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                         min(len(a), len(b)) if len(a) != len(b) else None)
    return out


def statement_lines(function: ast.FunctionDef | ast.AsyncFunctionDef, line: int) -> range | None:
    """The lines coverage may record for the innermost statement of ``function`` that holds ``line`` (a compound
    statement's header only); None where that is the ``def`` itself (a default argument, the signature)."""
    best: ast.stmt | None = None
    for node in ast.walk(function):
        if node is function or not isinstance(node, ast.stmt):
            continue
        end = node.end_lineno or node.lineno
        if node.lineno <= line <= end and (best is None or end - node.lineno < (best.end_lineno or 0) - best.lineno):
            best = node
    if best is None:
        return None
    body = getattr(best, "body", None)
    last = best.end_lineno or best.lineno
    if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
        last = body[0].lineno - 1
        if line > last:  # between a compound statement's parts (an ``else:``): the header still decides
            last = max(last, best.lineno)
    return range(best.lineno, last + 1)


def contexts_by_line(coverage_file: Path, root: Path = ROOT) -> dict[str, dict[int, set[str]]]:
    """The tests that ran each line, by source path relative to ``root`` (``repro/sim/kv.py``)."""
    from coverage import CoverageData

    data = CoverageData(basename=str(coverage_file))
    data.read()
    out: dict[str, dict[int, set[str]]] = {}
    for path in data.measured_files():
        try:
            rel = Path(path).resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            rel = path
        by_line = out.setdefault(rel, {})
        for line, contexts in data.contexts_by_lineno(path).items():
            tests = {c.rsplit("|", 1)[0] for c in contexts if c.endswith("|run")}
            if tests:
                by_line.setdefault(line, set()).update(tests)
    return out


def plan(mutants: Path, coverage_file: Path, budget_s: float, max_tests: int, root: Path = ROOT,
         killers_only: bool = False, also: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Each mutant's tests (mutmut's name, ``repro.sim.kv.xǁKvPoolǁallocate__mutmut_3``), for every mutant whose
    statement some covering test ran; the rest are left to the function's cut. ``killers_only``: only the tests
    that ran the statement and killed another mutant of the module in an earlier run, the function's first (a
    survivor's second chance, cheap where they fail at once), and only the mutants that have one; with ``also``,
    the tests under those paths too (tests written since, which have killed nothing yet)."""
    stats = json.loads((mutants / "mutmut-stats.json").read_text())
    duration: dict[str, float] = stats["duration_by_test"]
    full_path = mutants / "mutation-coverage.json"
    full: dict[str, list[str]] = (json.loads(full_path.read_text()) if full_path.is_file()
                                  else stats["tests_by_mangled_function_name"])
    kills: dict[str, dict[str, int]] = {}  # by function, and by module: test -> mutants it killed
    log = mutants / "mutation-kills.jsonl"
    for raw in log.read_text().splitlines() if log.is_file() else ():
        kill = json.loads(raw)
        function = kill["mutant"].rsplit("__mutmut_", 1)[0]
        for key in (function, function.rsplit(".", 1)[0]):
            by = kills.setdefault(key, {})
            by[kill["test"]] = by.get(kill["test"], 0) + 1
    ran = contexts_by_line(coverage_file, root)
    out: dict[str, list[str]] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        rel = meta.relative_to(mutants).with_suffix("")  # repro/sim/kv.py
        source = root / rel
        if not source.is_file():
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        functions = _functions(ast.parse(source.read_text()))
        by_line = ran.get(rel.as_posix(), {})
        for variant, offset in mutated_offsets((mutants / rel).read_text()).items():
            base = variant.partition("__mutmut_")[0]
            function = functions.get(base)
            if function is None or offset is None:
                continue
            lines = statement_lines(function, function.lineno + offset)
            if lines is None:
                continue
            name = f"{module}.{base}"
            covering = set(full.get(name, ()))
            on_line = {t for line in lines for t in by_line.get(line, ())} & covering
            killers = kills.get(name, {})
            if killers_only:  # the function's killers first, then the module's
                mine = kills.get(module, {})
                on_line = {t for t in on_line if t in mine or t.startswith(also)} if also else on_line & set(mine)
                killers = {t: n + (1 << 20) * killers.get(t, 0) for t, n in mine.items()}
            if on_line:
                out[f"{name}__mutmut_{variant.partition('__mutmut_')[2]}"] = cut(
                    sorted(on_line), duration, budget_s, max_tests, name, killers)
    return out


def collect(out: Path) -> int:
    """The selection's line coverage by test, on the unmutated tree (step 1 above)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    env = dict(os.environ, REPRO_JIT="python", MUTANT_UNDER_TEST="lines__mutmut_coverage", COVERAGE_FILE=str(out))
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", *cfg["pytest_add_cli_args_test_selection"], *cfg["pytest_add_cli_args"],
           "-q", "-p", "no:randomly", "--cov=repro", "--cov=systems", "--cov-context=test", "--cov-report="]
    return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode


def run(tests_file: Path, argv: list[str]) -> int:
    """mutmut's command line (``mutmut run ...``), each planned mutant against its own tests (step 3 above)."""
    import mutmut
    from mutmut.__main__ import cli
    from mutmut.configuration import config
    from mutmut.runners import harness
    from mutmut.state import state
    from mutmut.workers import isolation

    if mutmut.__version__ != MUTMUT:
        print(f"mutation_lines: mutmut {mutmut.__version__} is installed; this patches {MUTMUT}'s runner "
              f"(pip install mutmut=={MUTMUT})", file=sys.stderr)
        return 2
    own: dict[str, list[str]] = json.loads(tests_file.read_text())

    def patched(submit: Any) -> Any:
        def submit_own(self: Any, mutant_name: str, tests: list[str], cpu_time_limit: int,
                       estimated_time: float) -> None:
            mine = own.get(mutant_name)
            if mine:
                tests = list(mine)
                estimated_time = sum(state().duration_by_test.get(t, 0.0) for t in tests)
                cfg = config()
                cpu_time_limit = math.ceil((estimated_time + cfg.timeout_constant) * cfg.timeout_multiplier * 2)
            submit(self, mutant_name, tests, cpu_time_limit, estimated_time)
        return submit_own

    for runner in (isolation.ForkRunner, isolation.ForkServerRunner):
        runner.submit = patched(runner.submit)  # type: ignore[method-assign]
    run_tests = harness.PytestRunner.run_tests

    def run_own(self: Any, *, mutant_name: str | None, tests: Any) -> int:
        # (the fork runner sorts a mutant's tests fastest first: the plan's order, killers first, is restored)
        mine = own.get(mutant_name or "")
        return run_tests(self, mutant_name=mutant_name, tests=list(mine) if mine else tests)

    harness.PytestRunner.run_tests = run_own  # type: ignore[method-assign]
    sys.argv = ["mutmut", "run", *argv]
    try:
        cli()
    except SystemExit as stop:
        return int(stop.code or 0) if not isinstance(stop.code, str) else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("collect", "plan", "run"))
    ap.add_argument("rest", nargs="*", help="run: mutmut run's arguments (mutant names or globs)")
    ap.add_argument("--mutants", type=Path, default=ROOT / "mutants", help="mutmut's folder (default: ./mutants)")
    ap.add_argument("--budget-s", type=float, default=4.0, help="plan: seconds of measured test time a mutant (4)")
    ap.add_argument("--max-tests", type=int, default=100, help="plan: tests a mutant (100)")
    ap.add_argument("--killers-only", action="store_true",
                    help="plan: only tests that killed another mutant of the module (a survivors' second pass)")
    ap.add_argument("--also", action="append", default=[], metavar="PATH",
                    help="plan --killers-only: and the tests under PATH (tests written since the last run)")
    ap.add_argument("--planned", action="store_true", help="run: of the named mutants, only those the plan covers")
    args = ap.parse_intermixed_args(argv)
    lines = args.mutants / "mutation-lines.coverage"
    tests_file = args.mutants / "mutation-tests.json"
    if args.step == "collect":
        args.mutants.mkdir(exist_ok=True)
        return collect(lines)
    if args.step == "run":
        if not tests_file.is_file():
            print(f"mutation_lines: no {tests_file}: run the plan step first", file=sys.stderr)
            return 2
        rest = args.rest
        if args.planned:
            planned = json.loads(tests_file.read_text())
            rest = [name for name in rest if name in planned]
            if not rest:
                print("mutation_lines: none of the named mutants is planned: nothing to run")
                return 0
        return run(tests_file, rest)
    if args.budget_s <= 0 or args.max_tests < 1:
        print("mutation_lines: --budget-s must be > 0 and --max-tests >= 1", file=sys.stderr)
        return 2
    for need in (lines, args.mutants / "mutmut-stats.json"):
        if not need.is_file():
            print(f"mutation_lines: no {need}: run scripts/mutation.sh (it collects both)", file=sys.stderr)
            return 2
    own = plan(args.mutants, lines, args.budget_s, args.max_tests, root=args.mutants.resolve().parent,
               killers_only=args.killers_only, also=tuple(args.also))
    tests_file.write_text(json.dumps(own, indent=1))
    total = sum(len(json.loads(m.read_text())["exit_code_by_key"]) for m in args.mutants.rglob("*.py.meta"))
    budget_path = args.mutants / "mutation-budget.json"  # (the function-level cut's, written before: the fallback)
    budget = json.loads(budget_path.read_text()) if budget_path.is_file() else {}
    budget["per_mutant"] = {"budget_s": args.budget_s, "max_tests": args.max_tests, "planned": len(own),
                            "mutants": total}
    budget_path.write_text(json.dumps(budget))
    print(f"mutation_lines: {len(own)} of {total} mutants get their own statement's tests"
          f"{' that killed another of their module' if args.killers_only else ''} "
          f"(at most {args.max_tests} and {args.budget_s:g} s each); the rest keep their function's cut")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
