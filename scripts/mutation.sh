#!/usr/bin/env bash
# The mutation score of the simulator's mechanisms (docs/testing.md): mutmut (the dev extra) over repro/sim,
# repro/cost, repro/oracle, repro/metrics and systems/, each function's mutants against the unit and engine tests that
# run it ([tool.mutmut] in pyproject.toml: no reference comparison counts as a kill), cut to the fastest of them
# within a budget (scripts/mutation_budget.py: MUTATION_BUDGET_S seconds and MUTATION_MAX_TESTS tests a function, 5 and
# 40 by default), then the score per module (scripts/mutation_report.py; survivors shown equivalent are listed in
# scripts/mutation_triage.toml). About two hours on two cores from nothing (docs/testing.md). On demand, not in CI.
# Results persist in mutants/: a second run tries only the functions that changed since.
#
#   scripts/mutation.sh                      # all five packages
#   scripts/mutation.sh repro.sim repro.cost # some packages (or modules: repro.sim.kv)
#   MUTATION_WIDE_TESTS=400 scripts/mutation.sh repro.sim.kv   # and the survivors again against a wider cut
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
# 2. each function's tests cut to the budget (mutmut keeps the stats it loads as they are)
python scripts/mutation_budget.py --budget-s "${MUTATION_BUDGET_S:-5}" --max-tests "${MUTATION_MAX_TESTS:-40}"
# 3. every mutant against its function's tests
mutmut run ${globs[@]+"${globs[@]}"}
# 4. (MUTATION_WIDE_TESTS=N) the survivors again, against a wider cut (N tests and MUTATION_WIDE_S seconds, 60 by
#    default): what kills them is recorded, and the default cut, written again, puts it first in the next run
if [ -n "${MUTATION_WIDE_TESTS:-}" ]; then
    python scripts/mutation_budget.py --budget-s "${MUTATION_WIDE_S:-60}" --max-tests "$MUTATION_WIDE_TESTS"
    mapfile -t left < <(python scripts/mutation_report.py --names "${targets[@]}")
    [ ${#left[@]} -eq 0 ] || mutmut run "${left[@]}"
    python scripts/mutation_budget.py --budget-s "${MUTATION_BUDGET_S:-5}" --max-tests "${MUTATION_MAX_TESTS:-40}"
fi
echo "mutation.sh: ${targets[*]} in $(( $(date +%s) - start )) s"
python scripts/mutation_report.py "${targets[@]}"
