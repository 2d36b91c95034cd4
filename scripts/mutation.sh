#!/usr/bin/env bash
# The mutation score of the simulator's mechanisms (docs/testing.md): mutmut (the dev extra) over repro/sim,
# repro/cost, repro/oracle, repro/metrics and systems/, each mutant against the unit and engine tests that run its
# statement ([tool.mutmut] in pyproject.toml: no reference comparison counts as a kill; scripts/mutation_lines.py:
# the selection's line coverage by test), cut to a budget (MUTATION_BUDGET_S seconds and MUTATION_MAX_TESTS tests a
# mutant, 4 and 100 by default; a mutant on a line no test's coverage shows keeps its function's cut,
# scripts/mutation_budget.py, 5 s and 40 tests), then the score per module (scripts/mutation_report.py; survivors
# shown equivalent are listed in scripts/mutation_triage.toml). On demand, not in CI. Results persist in mutants/: a
# second run tries only the functions that changed since (MUTATION_LINES=keep: and reuses the line coverage).
#
#   scripts/mutation.sh                      # all five packages
#   scripts/mutation.sh repro.sim repro.cost # some packages (or modules: repro.sim.kv)
#   MUTATION_WIDE_S=30 scripts/mutation.sh repro.sim.kv    # and the survivors again, against their module's killers
#   python scripts/mutation_report.py --diffs repro.sim   # afterwards: the survivors' diffs
set -euo pipefail
cd "$(dirname "$0")/.."
command -v mutmut >/dev/null || { echo "mutation.sh: mutmut is not installed: pip install -e '.[dev]'" >&2; exit 2; }
# the kernels run as plain Python (repro.core.jit): Numba cannot compile the functions mutmut rewrites
export REPRO_JIT=python
targets=("$@")
globs=()  # none: every mutant (a name on mutmut's command line is tried again even where its result stands)
for t in "${targets[@]}"; do globs+=("$t.*"); done
[ ${#targets[@]} -gt 0 ] || targets=(repro.sim repro.cost repro.oracle repro.metrics systems)
start=$(date +%s)
# 1. the mutants, and the tests that run each function (mutmut's stats), trying none: the name matches no mutant,
#    which mutmut reports (after saving its stats) as an error
if ! out=$(mutmut run 'mutation.sh.stats-only' 2>&1); then
    grep -q "Filtered for specific mutants, but nothing matches" <<<"$out" || { echo "$out" >&2; exit 1; }
fi
# 2. each function's tests cut to the budget (mutmut keeps the stats it loads as they are): the fallback
python scripts/mutation_budget.py --budget-s 5 --max-tests 40
# 3. the selection's line coverage by test (unless kept), then each mutant's tests: those that ran its statement
lines=mutants/mutation-lines.coverage
[ "${MUTATION_LINES:-}" = keep ] && [ -f "$lines" ] || python scripts/mutation_lines.py collect
python scripts/mutation_lines.py plan --budget-s "${MUTATION_BUDGET_S:-4}" --max-tests "${MUTATION_MAX_TESTS:-100}"
# 4. every mutant against its own tests
python scripts/mutation_lines.py run ${globs[@]+"${globs[@]}"}
# 5. (MUTATION_WIDE_S=S) the survivors again, each against every test that ran its statement and killed another
#    mutant of its module, its function's first (within S seconds and MUTATION_WIDE_TESTS tests, 1000 by default);
#    what kills them is recorded (mutants/mutation-kills.jsonl), so the next run's plan puts it first
if [ -n "${MUTATION_WIDE_S:-}" ]; then
    python scripts/mutation_lines.py plan --killers-only --budget-s "$MUTATION_WIDE_S" \
        --max-tests "${MUTATION_WIDE_TESTS:-1000}"
    mapfile -t left < <(python scripts/mutation_report.py --names "${targets[@]}")
    [ ${#left[@]} -eq 0 ] || python scripts/mutation_lines.py run --planned "${left[@]}"
    python scripts/mutation_lines.py plan --budget-s "${MUTATION_BUDGET_S:-4}" --max-tests "${MUTATION_MAX_TESTS:-100}"
fi
echo "mutation.sh: ${targets[*]} in $(( $(date +%s) - start )) s"
python scripts/mutation_report.py "${targets[@]}"
