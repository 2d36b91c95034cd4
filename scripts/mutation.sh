#!/usr/bin/env bash
# The mutation score of the simulator's mechanisms (docs/testing.md): mutmut (the dev extra) over repro/sim,
# repro/cost, repro/oracle, repro/metrics and systems/, each function's mutants against the unit and engine tests that
# run it ([tool.mutmut] in pyproject.toml: no reference comparison counts as a kill), then the score per module
# (scripts/mutation_report.py; survivors shown equivalent are listed in scripts/mutation_triage.toml).
# On demand, not in CI. Results persist in mutants/: a second run tries only the functions that changed since.
#
#   scripts/mutation.sh                      # all five packages
#   scripts/mutation.sh repro.sim repro.cost # some packages (or modules: repro.sim.kv)
#   python scripts/mutation_report.py --diffs repro.sim   # afterwards: the survivors' diffs
set -euo pipefail
cd "$(dirname "$0")/.."
command -v mutmut >/dev/null || { echo "mutation.sh: mutmut is not installed: pip install -e '.[dev]'" >&2; exit 2; }
# the kernels run as plain Python (repro.core.jit): Numba cannot compile the functions mutmut rewrites
export REPRO_JIT=python
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(repro.sim repro.cost repro.oracle repro.metrics systems)
globs=()
for t in "${targets[@]}"; do globs+=("$t.*"); done
start=$(date +%s)
mutmut run "${globs[@]}"
echo "mutation.sh: ${targets[*]} in $(( $(date +%s) - start )) s"
python scripts/mutation_report.py "${targets[@]}"
