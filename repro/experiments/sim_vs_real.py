"""``python -m repro sim_vs_real``: the simulator against a real run of the same workload and systems, side by side.

1. **Profile** this device's passes of the run's models as ``backend=hf`` executes them (``python -m repro.profile
   --engine hf``: :mod:`repro.backends.passes`), target and draft, over a grid sized to the workload.
2. **Real**: each system on ``backend=hf`` (engine profile ``hf_eager``), its draft's acceptance recorded
   (``backend.record``).
3. **Simulated**: the same config and seed (the same requests, arrivals and SLOs) on the simulator, its passes priced
   from that profile (``cost=profile``) and, for a system that speculated, its acceptance replayed from the real
   run's recording (``oracle=trace``). What is left to differ is the simulator's own part: the scheduler's steps,
   how a step is composed of passes and priced from the table, and the engine's clock.
4. **Report** (``--out``, default ``runs/sim_vs_real``): ``comparison.csv`` (system, metric, simulated, real, error
   = simulated / real − 1), ``summary.md``, ``sim_vs_real.png``, the profile and the recordings.

On a CPU (the default) it runs ``backend.tiny``'s scaled-down models single-threaded, in seconds, and is a real end to
end check of the scheduler, engine and cost plumbing (a test runs it). On a GPU it is the first experiment to run::

    python -m repro sim_vs_real --device cuda --model llama2-7b --draft llama-160m --no-tiny --threads 0 \\
        --num-requests 50 --rps 2 workload=sharegpt

Trailing ``KEY=VALUE`` arguments are config overrides for both runs (the workload by default: fixed lengths,
``--input-len`` and ``--output-len``).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repro.core.errors import ConfigError, ReproError

SYSTEMS = ("vllm", "static_sd_k3")
#: (column of points.csv, how the report names it): what a GPU owner compares first
METRICS = (("mean_ttft_ms", "mean TTFT (ms)"), ("mean_tpot_ms", "mean TPOT (ms)"),
           ("mean_latency_s", "mean latency (s)"), ("output_throughput", "output throughput (tok/s)"),
           ("mean_accepted_len", "mean accepted length"))
TOLERANCE = 0.25  # the mean TPOT error the report flags beyond


def _grid(n: int, prompt: int, context: int, ks: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Profile axes covering the run: tokens per pass (prompts of up to ``n`` requests, decodes, verifications of
    ``k + 1``), cached contexts up to ``context``, verification batches up to ``n``."""
    def powers(top: int) -> list[int]:
        out = [1]
        while out[-1] < top:
            out.append(out[-1] * 2)
        return out

    tokens = powers(max(n * (1 + max(ks, default=0)), prompt))
    contexts = [0, *[c for c in powers(context) if c >= 16]]
    return tokens, contexts, powers(n)


def speculative_ks(systems: Sequence[str]) -> list[int]:
    """The chain lengths a profile's verification rows need: each static system's k, else 1-5."""
    ks = {int(s.rsplit("_k", 1)[1]) for s in systems if s.startswith("static_sd_k") and s.rsplit("_k", 1)[1].isdigit()}
    return sorted(ks) if ks else [1, 2, 3, 4, 5]


def profile_tables(args: Any, out: Path, ks: Sequence[int], prompt: int, context: int) -> tuple[Path, Path]:
    """Step 1: the target's and the draft's passes on this device (``python -m repro.profile --engine hf``, in a
    process of its own as a user runs it), over prompts up to ``prompt`` tokens and contexts up to ``context``."""
    tokens, contexts, batches = _grid(args.num_requests, prompt, context, ks)
    table = out / "profile.csv"
    argv = ["--model", args.model, "--draft", args.draft, "--engine", "hf", "--device", args.device,
            "--out", str(table), "--tokens", *map(str, tokens), "--contexts", *map(str, contexts),
            "--k", *map(str, ks), "--batches", *map(str, batches), "--repeat", str(args.repeat)]
    if args.tiny:
        argv.append("--tiny")
    if getattr(args, "rounds", 1) > 1:
        argv += ["--rounds", str(args.rounds)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    res = subprocess.run([sys.executable, "-m", "repro.profile", *argv], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"sim_vs_real: python -m repro.profile {' '.join(argv)} failed: {why}")
    return table, table.with_suffix(".draft.csv")


def _hardware_of(table: Path, overrides: Sequence[str]) -> list[str]:
    """``hardware=<id>`` for the GPU the profile was measured on (its sidecar's ``gpu``), so that both runs describe
    the device they ran on and ``cost=profile`` accepts the table; nothing for a CPU profile or where the overrides
    name the hardware."""
    from repro.sim.deployment import measured_on, profile_sidecar

    if any(o.split("=")[0].lstrip("+") == "hardware" for o in overrides):
        return []
    hw = measured_on(profile_sidecar(table, "sim_vs_real") or {})[1]
    return [f"hardware={hw}"] if hw else []


def compare(args: Any, overrides: Sequence[str]) -> list[dict[str, Any]]:
    """Steps 1-3 for every system: a row per (system, metric)."""
    from repro.experiments.simulate import build, compose, run_point

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = [] if any(o.split("=")[0].lstrip("+").startswith("workload") for o in overrides) else [
        "workload=fixed", f"workload.input_len={args.input_len}", f"workload.output_len={args.output_len}"]
    common = [f"model={args.model}", f"model@draft={args.draft}", "engine=hf_eager", f"seed={args.seed}",
              f"num_requests={args.num_requests}", f"rps={args.rps}", *workload, *overrides]
    # the requests both runs serve (the workload does not depend on the cost model): the profile spans their lengths
    requests = build(compose([*common, f"system={args.systems[0]}"])).table
    t0 = time.perf_counter()
    table, draft_table = profile_tables(args, out, speculative_ks(args.systems), int(requests.prompt_len.max()),
                                        int((requests.prompt_len + requests.output_len).max()))
    print(f"sim_vs_real: profiled {args.model} + {args.draft} on {args.device} ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    common += _hardware_of(table, overrides)
    rows: list[dict[str, Any]] = []
    for system in args.systems:
        rec = out / f"recording-{system}.parquet"
        real_over = [*common, f"system={system}", "backend=hf", f"backend.tiny={str(args.tiny).lower()}",
                     f"backend.device={args.device}", f"backend.record={rec}"]
        if args.threads:
            real_over.append(f"backend.threads={args.threads}")
        if args.draft_noise:
            real_over.append(f"backend.draft_noise={args.draft_noise}")
        real = run_point(compose(real_over))
        speculated = float(real.requests["num_proposed"].sum()) > 0
        sim_over = [*common, f"system={system}", "cost=profile", f"cost.table={table}",
                    f"cost.draft_table={draft_table}", *(["oracle=trace", f"oracle.path={rec}"] if speculated else [])]
        sim = run_point(compose(sim_over))
        for key, label in METRICS:
            r, s = float(real.metrics.get(key, math.nan)), float(sim.metrics.get(key, math.nan))
            rows.append({"system": system, "metric": key, "label": label, "simulated": s, "real": r,
                         "error": s / r - 1.0 if r and math.isfinite(r) and math.isfinite(s) else math.nan})
        tpot = next(x for x in rows[-len(METRICS):] if x["metric"] == "mean_tpot_ms")
        print(f"sim_vs_real: {system}: mean TPOT simulated {tpot['simulated']:.3f} ms, real {tpot['real']:.3f} ms "
              f"({tpot['error']:+.1%})", flush=True)
    return rows


def report(rows: list[dict[str, Any]], args: Any, overrides: Sequence[str]) -> Path:
    """Step 4: comparison.csv, sim_vs_real.png and summary.md in ``args.out``."""
    import pandas as pd

    from repro.experiments.render import markdown_table

    out = Path(args.out)
    frame = pd.DataFrame(rows)
    frame.drop(columns="label").to_csv(out / "comparison.csv", index=False)
    _figure(frame, out / "sim_vs_real.png")
    shown = frame.assign(error=[f"{e:+.1%}" if math.isfinite(e) else "-" for e in frame["error"]],
                         simulated=[f"{v:.4g}" for v in frame["simulated"]], real=[f"{v:.4g}" for v in frame["real"]])
    shown = shown[["system", "label", "simulated", "real", "error"]].rename(columns={"label": "metric"})
    tpot = frame[frame["metric"] == "mean_tpot_ms"]
    worst = float(tpot["error"].abs().max())
    verdict = (f"Mean TPOT agrees within {worst:.1%} for every system (tolerance {TOLERANCE:.0%})."
               if worst <= TOLERANCE else
               f"Mean TPOT differs by up to {worst:.1%}, beyond the {TOLERANCE:.0%} tolerance: see the table.")
    noise = f", the target's weights with noise {args.draft_noise}" if args.draft_noise else ""
    lines = [
        "# sim_vs_real: the simulator against backend=hf on the same workload\n",
        f"Models: {args.model} (target) + {args.draft} (draft{noise}){', backend.tiny' if args.tiny else ''}, "
        f"on {args.device}, {args.threads or 'default'} thread(s); "
        f"{args.num_requests} requests at {args.rps} req/s, seed {args.seed}"
        + (f"; overrides: `{' '.join(overrides)}`" if overrides else "") + ".\n",
        "The simulator prices each step from a profile of backend=hf's own passes on this device (`profile.csv`, "
        "`profile.draft.csv`) and, for a system that speculated, replays the real run's recorded acceptance "
        "(`oracle=trace`). Error = simulated / real - 1.\n",
        verdict + "\n",
        markdown_table(shown, index=False) + "\n",
        "![sim vs real](sim_vs_real.png)\n",
    ]
    path = out / "summary.md"
    path.write_text("\n".join(lines))
    return path


def _figure(frame: Any, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m, _ in METRICS if frame.loc[frame["metric"] == m, ["simulated", "real"]].notna().all(axis=None)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.0), squeeze=False)
    systems = list(dict.fromkeys(frame["system"]))
    for ax, m in zip(axes[0], metrics, strict=True):
        part = frame[frame["metric"] == m].set_index("system").loc[systems]
        x = range(len(systems))
        ax.bar([i - 0.2 for i in x], part["real"], 0.4, label="real (backend=hf)", color="#4c72b0")
        ax.bar([i + 0.2 for i in x], part["simulated"], 0.4, label="simulated", color="#dd8452")
        ax.set_xticks(list(x), systems, rotation=20, fontsize=8)
        ax.set_title(part["label"].iloc[0], fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m repro sim_vs_real", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-68m", help="the target (a conf/model name)")
    p.add_argument("--draft", default="llama-68m", help="the draft (a conf/model name)")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), help="conf/system names")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=True,
                   help="backend.tiny's scaled-down models (default; --no-tiny: the architectures' full size)")
    p.add_argument("--threads", type=int, default=1, help="PyTorch CPU threads for the profile and the real runs "
                   "(default 1: steady timings on a shared CPU; 0: PyTorch's default)")
    p.add_argument("--draft-noise", type=float, default=0.3,
                   help="the draft is the target with this much noise on its weights (acceptance between 0 and 1; "
                        "0: the --draft model's own random weights)")
    p.add_argument("--num-requests", type=int, default=12)
    p.add_argument("--rps", type=float, default=4.0)
    p.add_argument("--input-len", type=int, default=32, help="prompt tokens (the default fixed-length workload)")
    p.add_argument("--output-len", type=int, default=48, help="output tokens (the default fixed-length workload)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=20, help="timed repeats per profile cell (their median)")
    p.add_argument("--rounds", type=int, default=1, help="profile sweeps, --repeat passes a cell each, one median over "
                   "them all (python -m repro.profile --rounds: a host's slow phases spread over every cell)")
    p.add_argument("--out", default="runs/sim_vs_real", help="output folder")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides for both runs")
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise ConfigError(f"sim_vs_real: {bad[0]!r} is neither a flag nor KEY=VALUE")
    if args.draft_noise and args.draft != args.model:
        raise ConfigError(f"sim_vs_real: --draft-noise {args.draft_noise} makes the draft a noisy copy of the target "
                          f"({args.model}), not {args.draft}: give --draft {args.model}, or --draft-noise 0 for "
                          f"{args.draft}'s own weights")
    try:
        rows = compare(args, args.overrides)
    except ReproError:
        raise
    except (ImportError, ModuleNotFoundError) as exc:
        raise ConfigError(f"sim_vs_real needs the real backend: {exc} (pip install -e '.[real]')") from None
    path = report(rows, args, args.overrides)
    print(f"sim_vs_real: {len(args.systems)} systems -> {path}")
    return 0
