"""Write (or check against) ``tests/bench/baseline.json``: each CI benchmark case's speed as a ratio to the
reference loop measured beside it in the same process (``tests/bench/bench_cases.py``).

Usage::

    python scripts/bench_baseline.py            # measure every CI case --runs times, write the median ratios
    python scripts/bench_baseline.py --check    # measure once, print case | baseline | measured | slowdown;
                                                # exit 1 if a slowdown exceeds bench_cases.FACTOR
    python scripts/bench_baseline.py --case NAME --note WHY   # re-measure only NAME (repeatable), keep the rest

Update the baseline on a quiet machine after a deliberate speed change (or a change of case), and commit it with
the change that explains it. The test suite's ``tests/bench/test_speed_regression.py`` makes the same comparison.

Noise behind ``FACTOR`` (2-core shared VM, Python 3.11, numpy 2.4), ten ``--check`` runs: beside other sessions'
work 0.83-1.25x per case, beside one CPU-bound process 0.97-1.10x, beside two 0.84-1.35x.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "bench")]  # this checkout's code, not an installed copy

from bench_cases import (  # noqa: E402 (tests/bench is not a package)
    BASELINE_PATH,
    CI_CASES,
    FACTOR,
    REFERENCE_STEPS,
    TABLE_HEADER,
    Case,
    load_baseline,
    measure,
    measure_for_check,
    table_row,
)


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one) and the number of logical CPUs."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def _sig(x: float) -> float:
    """``x`` to 5 significant digits (the noise is a few percent)."""
    return float(f"{x:.5g}")


def write_baseline(cases: list[Case], runs: int, path: Path) -> None:
    """Measure each case ``runs`` times and write the median ratios with their provenance."""
    ratios: dict[str, float] = {}
    spread: dict[str, list[float]] = {}
    reference: list[float] = []
    for case in cases:
        ms = [measure(case) for _ in range(runs)]
        got = sorted(m.ratio for m in ms)
        ratios[case.name] = _sig(statistics.median(got))
        spread[case.name] = [_sig(got[0]), _sig(got[-1])]
        reference += [m.reference_s for m in ms]
        print(f"{case.name:<40} median ratio {ratios[case.name]:.5g} (min {got[0]:.5g}, max {got[-1]:.5g})")
    doc = {
        "provenance": {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": cpu_model(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "reference_loop_s": round(min(reference), 5),
            "how": (f"python scripts/bench_baseline.py: ratio = median over the case's timings (CPU time) of its "
                    f"seconds per call / mean of the reference_loop({REFERENCE_STEPS}) runs just before and after, "
                    f"alternated in one process (tests/bench/bench_cases.py: measure); median over {runs} such "
                    f"measurements per case"),
            "min_max": spread,
        },
        "ratios": ratios,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}")


def update_baseline(cases: list[Case], runs: int, path: Path, note: str) -> None:
    """Re-measure only ``cases`` (``runs`` times each) into the existing baseline, the others kept as they are;
    the provenance's ``updated`` records when and why (``note``)."""
    doc = load_baseline(path)
    prov = doc["provenance"]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for case in cases:
        got = sorted(measure(case).ratio for _ in range(runs))
        old = doc["ratios"].get(case.name)
        doc["ratios"][case.name] = _sig(statistics.median(got))
        prov["min_max"][case.name] = [_sig(got[0]), _sig(got[-1])]
        was = f"{old:.5g} -> " if old is not None else "new case: "
        prov.setdefault("updated", {})[case.name] = (f"{stamp}: {note} ({was}{doc['ratios'][case.name]:.5g}, median "
                                                     f"of {runs})")
        print(f"{case.name:<40} median ratio {doc['ratios'][case.name]:.5g} (min {got[0]:.5g}, max {got[-1]:.5g})")
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"updated {path}")


def check(cases: list[Case], path: Path) -> int:
    """Compare each case with the baseline; 1 if one is slower than ``FACTOR`` times its baseline (or missing)."""
    ratios = load_baseline(path)["ratios"]
    print(TABLE_HEADER)
    failed = []
    for case in cases:
        if case.name not in ratios:
            print(f"{case.name:<36} | {'missing':>14} |")
            failed.append(case.name)
            continue
        m = measure_for_check(case, ratios[case.name])
        print(table_row(case.name, ratios[case.name], m.ratio), flush=True)
        if m.ratio / ratios[case.name] > FACTOR:
            failed.append(case.name)
    print(f"{len(failed)} of {len(cases)} cases beyond {FACTOR}x: {', '.join(failed) or '-'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the baseline instead of writing it")
    parser.add_argument("--runs", type=int, default=5, help="measurements per case when writing (median kept)")
    parser.add_argument("--case", action="append", default=[],
                        help="only this case (repeatable); when writing, the others keep their baseline")
    parser.add_argument("--note", help="when writing --case: why they were re-measured (kept in the provenance)")
    parser.add_argument("--path", type=Path, default=BASELINE_PATH, help="baseline file")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.case) - {c.name for c in CI_CASES})
    if unknown:
        parser.error(f"no CI case {', '.join(unknown)} (tests/bench/bench_cases.py)")
    cases = [c for c in CI_CASES if not args.case or c.name in args.case]
    if args.check:
        return check(cases, args.path)
    if args.case:
        if not args.note:
            parser.error("--case without --check needs --note: why these cases were re-measured")
        update_baseline(cases, args.runs, args.path, args.note)
        return 0
    write_baseline(cases, args.runs, args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
