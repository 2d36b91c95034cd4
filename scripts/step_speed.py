"""The step-by-step families' speed, one point each, side by side with another commit (issue 31's measure).

    python scripts/step_speed.py                      # this tree: Engine.run seconds per point, median of 5
    python scripts/step_speed.py --baseline de78dab   # and a worktree of that commit, alternating in the same minutes

Each point is composed from its experiment as the runner composes it (full mode, on this checkout's data folder in
both trees), its engine built untimed, and ``Engine.run`` timed in wall seconds in a fresh child process per tree
and repeat, twice: "cold", the process's first point (its one-off costs included: lazy imports, compiled kernels
loaded from Numba's cache), and "warm", a third engine of the same point in the same process (what each further
point of a sweep's worker costs: where the tree has ``repro.core.jit.load``, Numba is loaded before the second, as in
a worker that has run its first few thousand steps, and the second, untimed, loads the compiled kernels; a single
point run alone gets the cold number). The trees alternate (this, baseline, this, ...), so a machine's drift hits both
alike. Prints each point's medians, the baseline's, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (experiment, system label, the point's other grid values): AdaServe Fig. 4 at 7B and 4 req/s, TurboSpec Table 4
#: at 7B (ShareGPT) and QPS 4, Nightjar Fig. 9 at 16 req/s, LAPS-SD Fig. 5 at 30 requests (Chatbot, t = 0)
POINTS = [
    ("adaserve_fig4", "adaserve", ["model=llama2-7b", "rps=4.0"]),
    ("turbospec_table4", "turbospec", ["dataset=sharegpt", "rps=4"]),
    ("nightjar_fig9", "nightjar", ["rps=16"]),
    ("laps_fig5", "laps_sd", ["workload=chatbot_instruction_prompts", "num_requests=30", "arrivals=t0"]),
]

CHILD = r"""
import importlib, json, sys, time

def mod(*names):
    for n in names:
        try:
            return importlib.import_module(n)
        except ImportError:
            pass
    raise ImportError(names)

compose = mod("repro.experiments.compose", "repro.compose")
expspec = mod("repro.experiments.expspec", "repro.expspec")
grid = mod("repro.experiments.grid", "repro.grid")
results = mod("repro.experiments.results", "repro.results")
simulate = mod("repro.experiments.simulate", "repro.simulate")
exp, system, filters = json.loads(sys.argv[1])
with compose.hydra_context():
    spec = expspec.ExpSpec.parse(expspec.apply_quick(compose.to_dict(compose.compose_config([f"+exp={exp}"]).exp),
                                                     False)[0])
    points = grid.expand_points(spec, grid.group_overrides(results.CONF_DIR))
    def has(p, f):  # a value the point's grid does not vary (an older commit's) is not asked for
        key = f.split("=")[0] + "="
        return f in p.overrides or not any(o.startswith(key) for o in p.overrides)
    chosen = [p for p in points if f"system={system}" in p.overrides and all(has(p, f) for f in filters)]
    if not chosen:
        raise SystemExit(f"{exp}: no point of {system} with {filters}")
    cfg = compose.Composer()([f"+exp={exp}", *chosen[0].overrides])
times = []
for i in range(3):  # cold: the process's first point (one-off costs: lazy imports, compiled kernels loaded); warm:
    if i == 1:  # the third, in a sweep's worker past its first points (Numba loaded: the step kernels on)
        try:
            getattr(importlib.import_module("repro.core.jit"), "load", lambda: None)()
        except ImportError:
            pass
    engine = simulate.build(cfg).engine
    t0 = time.perf_counter()
    engine.run()
    times.append(time.perf_counter() - t0)
print(json.dumps({"run_s": times[0], "warm_s": times[2]}))
"""


def data_folder() -> str:
    """This checkout's data folder (``$REPRO_DATA``, else ``../shared/data`` beside it; empty: none), handed to both
    trees: a baseline checked out elsewhere has no ``../shared`` beside it and would time another workload."""
    env = os.environ.get("REPRO_DATA")
    if env:
        return env
    shared = ROOT.parent / "shared" / "data"
    return str(shared) if shared.is_dir() else tempfile.mkdtemp(prefix="no_data_")


def run_once(tree: Path, point: tuple[str, str, list[str]]) -> tuple[float, float]:
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(point)], cwd=tree, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree), "REPRO_DATA": DATA})
    if res.returncode != 0:
        raise SystemExit(f"{tree}: {point[0]} failed:\n{res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return float(out["run_s"]), float(out.get("warm_s", out["run_s"]))


DATA = data_folder()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="a commit to measure beside this tree (checked out in a temporary worktree)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", help="experiment names to measure, comma-separated")
    args = ap.parse_args(argv)
    points = [p for p in POINTS if not args.only or p[0] in args.only.split(",")]
    trees = {"this": ROOT}
    tmp = None
    if args.baseline:
        tmp = tempfile.mkdtemp(prefix="step-speed-")
        subprocess.run(["git", "worktree", "add", "--detach", tmp, args.baseline], cwd=ROOT, check=True,
                       capture_output=True)
        trees["baseline"] = Path(tmp)
    try:
        for point in points:
            times: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
            for _ in range(args.repeats):
                for name, tree in trees.items():
                    times[name].append(run_once(tree, point))
            for i, kind in enumerate(("cold", "warm")):
                med = {k: statistics.median(t[i] for t in v) for k, v in times.items()}
                line = f"{point[0]:<18} {point[1]:<10} {kind} this {med['this']:.3f} s"
                if "baseline" in med:
                    line += f"  {args.baseline} {med['baseline']:.3f} s  speed-up {med['baseline'] / med['this']:.2f}x"
                print(line, flush=True)
    finally:
        if tmp:
            subprocess.run(["git", "worktree", "remove", "--force", tmp], cwd=ROOT, capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
