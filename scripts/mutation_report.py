"""The mutation score per module from a finished ``scripts/mutation.sh`` run (mutmut's ``mutants/*.meta``).

    python scripts/mutation_report.py                 # the table docs/testing.md shows, then every untriaged survivor
    python scripts/mutation_report.py --diffs         # ... with each survivor's diff (mutmut show)
    python scripts/mutation_report.py repro.sim       # only the modules under a prefix

A mutant is *killed* when a test other than a reference comparison fails on it (the tests scripts/mutation.sh
selects), *survived* when every test that runs its function passes, *no tests* when no selected test runs its
function at all, and *timeout* when the tests ran past mutmut's limit (counted as killed: the mutant changed what
the code does, measurably). A survivor listed in ``scripts/mutation_triage.toml`` as equivalent (a reason given: the
mutated code computes the same values, or reaches an unreachable branch) leaves the score's denominator. The score
is killed / (mutants - equivalent), per module and per package.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover (Python 3.10: the backport mutmut's own dependencies bring)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("repro.sim", "repro.cost", "repro.oracle", "repro.metrics", "systems")
KILLED = {1, 3, 36, -24, 24, 152, 255}  # mutmut's stats.status_by_exit_code: killed, or a timeout
SURVIVED = {0}
NO_TESTS = {5, 33}


def load(mutants: Path) -> dict[str, dict[str, int | None]]:
    """Exit codes by mutant name, by module (``repro.sim.kv``), from every ``.meta`` file under ``mutants``."""
    out: dict[str, dict[str, int | None]] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        rel = meta.relative_to(mutants).with_suffix("").with_suffix("")
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if codes:
            out[".".join(rel.parts)] = codes
    return out


def triaged(path: Path) -> dict[str, str]:
    """The equivalent mutants and why, by name (``scripts/mutation_triage.toml``: ``[equivalent]`` name = reason)."""
    if not path.exists():
        return {}
    table = tomllib.loads(path.read_text())
    return {str(k): str(v) for k, v in table.get("equivalent", {}).items()}


def tally(codes: dict[str, int | None], equivalent: dict[str, str]) -> Counter[str]:
    c: Counter[str] = Counter()
    for name, code in codes.items():
        if code is None:
            c["not run"] += 1
        elif code in KILLED:
            c["killed"] += 1
        elif name in equivalent:
            c["equivalent"] += 1
        elif code in SURVIVED:
            c["survived"] += 1
        elif code in NO_TESTS:
            c["no tests"] += 1
        else:
            c["other"] += 1
        c["mutants"] += 1
    return c


def score(c: Counter[str]) -> str:
    run = c["mutants"] - c["not run"] - c["equivalent"]
    return f"{c['killed'] / run:.1%}" if run else "-"


COLUMNS = ("mutants", "killed", "survived", "no tests", "equivalent", "other", "not run")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", nargs="*", help="module prefixes (default: the five packages)")
    ap.add_argument("--mutants", type=Path, default=ROOT / "mutants", help="mutmut's folder (default: ./mutants)")
    ap.add_argument("--triage", type=Path, default=ROOT / "scripts" / "mutation_triage.toml")
    ap.add_argument("--diffs", action="store_true", help="print each untriaged survivor's diff (mutmut show)")
    ap.add_argument("--names", action="store_true", help="print only the untriaged survivors' names, one a line")
    args = ap.parse_args(argv)
    if not args.mutants.is_dir():
        print(f"mutation_report: no {args.mutants}: run scripts/mutation.sh first", file=sys.stderr)
        return 2
    prefixes = tuple(args.prefix) or PACKAGES
    equivalent = triaged(args.triage)
    modules = {m: codes for m, codes in load(args.mutants).items() if m.startswith(prefixes)}
    if args.names:
        print("\n".join(sorted(n for codes in modules.values() for n, code in codes.items()
                                if code in SURVIVED and n not in equivalent)))
        return 0
    budget = args.mutants / "mutation-budget.json"
    if budget.is_file():
        cut = json.loads(budget.read_text())
        own = cut.get("per_mutant")
        rest = (f"at most {cut['max_tests']} tests and {cut['budget_s']:g} s (scripts/mutation_budget.py)")
        if own:
            print(f"Each mutant against the covering tests that ran its statement, at most {own['max_tests']} tests "
                  f"and {own['budget_s']:g} s ({own['planned']} of {own['mutants']} mutants, "
                  f"scripts/mutation_lines.py); the rest against their function's fastest covering tests, {rest}\n")
        else:
            print(f"Each function's mutants against its fastest covering tests, {rest}\n")
    print("| module | score | " + " | ".join(COLUMNS) + " |")
    print("|---|---:|" + "---:|" * len(COLUMNS))
    for pkg in prefixes:
        members = {m: c for m, c in modules.items() if m == pkg or m.startswith(pkg + ".")}
        total: Counter[str] = Counter()
        for m, codes in members.items():
            c = tally(codes, equivalent)
            total += c
            if c["mutants"] - c["not run"]:
                print(f"| `{m}` | {score(c)} | " + " | ".join(str(c[k]) for k in COLUMNS) + " |")
        if total["mutants"] - total["not run"]:
            print(f"| **{pkg}** | **{score(total)}** | " + " | ".join(str(total[k]) for k in COLUMNS) + " |")
    left = sorted(n for codes in modules.values() for n, code in codes.items()
                  if code is not None and code not in KILLED and n not in equivalent)
    print(f"\n{len(left)} untriaged survivors (or no tests)")
    for name in left:
        print(name)
        if args.diffs:
            sys.stdout.flush()
            import subprocess

            subprocess.run(["mutmut", "show", name], cwd=ROOT, check=False)
    stale = sorted(set(equivalent) - {n for codes in modules.values() for n in codes})
    if stale and not args.prefix:
        print(f"\n{len(stale)} triaged names no longer generated (the function changed: triage them again):")
        print("\n".join(stale))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
