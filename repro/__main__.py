"""Command line.

``python -m repro +exp=NAME [key=value ...]``
    runs an experiment into ``runs/NAME/`` (``runs/quick/NAME/`` with ``quick=true``; or ``out_dir=``):
    points.csv, manifest.json, figures, summary.md (see :mod:`repro.experiments.runner` and
    :mod:`repro.experiments.results`). Values on the command line narrow the experiment
    (:mod:`repro.experiments.narrow`): ``rps=3`` runs that rate only, ``system=NAME`` that system only.
``python -m repro list``
    every experiment, system, workload, hardware, engine, model, oracle and backend config.
``python -m repro check [NAME ...] [--quick] [--tolerance REL] [--update]``
    re-runs experiments and compares them with the committed references in ``results/``
    (:mod:`repro.experiments.check`).
``python -m repro robustness NAME [--quick] [--samples N] [--seed S]``
    runs the experiment over its declared open choices and says which paper claims hold robustly, depend on the
    setting (and on which knob), or differ everywhere plausible (:mod:`repro.experiments.robustness`).
``python -m repro sim_vs_real [--device cuda --model NAME --draft NAME ...] [KEY=VALUE ...]``
    profiles this device's passes, runs the same workload and systems on the real backend and on the simulator
    priced from that profile, and reports them side by side (:mod:`repro.experiments.sim_vs_real`).
``python -m repro all [--quick]``
    regenerates the whole catalogue and ``results/INDEX.md`` (:mod:`repro.experiments.check`).

A configuration mistake (unknown key or config name, a value of the wrong type or out of range, a physically
impossible setting), a missing data file or an output folder holding another run prints one line ``error: ...`` on
stderr and exits with status 2. Ctrl-C or SIGTERM stops a run with its finished points saved and prints one line
saying how many and the command that resumes; the status is 130 after Ctrl-C, 143 after SIGTERM
(:mod:`repro.experiments.stopping`).
"""

from __future__ import annotations

import signal
import sys


def _quiet_stop(signum: int, frame: object) -> None:
    print("interrupted (while starting: nothing ran)", file=sys.stderr, flush=True)
    sys.exit(128 + signum)


if __name__ == "__main__":  # Ctrl-C while the modules below load (a second or two): one line, no traceback
    signal.signal(signal.SIGINT, _quiet_stop)

from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from repro.core.errors import ReproError  # noqa: E402
from repro.experiments.compose import Composer, compose_config, hydra_context  # noqa: E402
from repro.experiments.grid import group_overrides  # noqa: E402
from repro.experiments.results import CONF_DIR  # noqa: E402
from repro.experiments.runner import run_experiment  # noqa: E402
from repro.experiments.stopping import Interrupted, exit_status, raise_on_sigterm, resume_command  # noqa: E402

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on a run stops as stopping.py says

LIST_GROUPS = ("exp", "system", "workload", "hardware", "engine", "cost", "model", "oracle", "backend")
COMMANDS = ("list", "check", "all", "robustness", "sim_vs_real")


def _title(path: Path) -> str:
    """An experiment's ``exp.title`` (empty when it has none or the file does not parse)."""
    try:
        node = OmegaConf.load(path)
    except Exception:  # a broken YAML still gets listed; composing it reports the error
        return ""
    title = OmegaConf.select(node, "exp.title", default="") if isinstance(node, DictConfig) else ""
    return str(title or "")


def list_configs(conf_dir: Path = CONF_DIR) -> str:
    """Every config name per group (experiments with their titles), as printed by ``python -m repro list``."""
    lines = []
    for group in LIST_GROUPS:
        files = sorted((conf_dir / group).glob("*.yaml")) if (conf_dir / group).is_dir() else []
        if not files:
            continue
        lines.append(f"{group} ({len(files)}):")
        for f in files:
            title = _title(f) if group == "exp" else ""
            lines.append(f"  {f.stem:<28} {title}".rstrip())
    return "\n".join(lines)


def fail(exc: ReproError) -> None:
    """Report a user-fixable error on one line and exit with status 2."""
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)


def stopped(exc: KeyboardInterrupt, args: Sequence[str] | None) -> None:
    """Report a run stopped by Ctrl-C or SIGTERM on one line (with the command resuming it, from ``args``, when it
    is an experiment run) and exit with 128 + the signal's number."""
    resume = resume_command(args) if args is not None else None
    if isinstance(exc, Interrupted):
        line = exc.line(resume)
    else:  # before any point ran, or after all had finished
        line = "interrupted" + (f"; run again with: {resume}" if resume else "")
    print(line, file=sys.stderr, flush=True)
    sys.exit(exit_status(exc))


def guarded(run: Callable[[], None], args: Sequence[str] | None) -> None:
    """``run()`` with its user-fixable errors and its stop by Ctrl-C or SIGTERM reported on one line."""
    raise_on_sigterm()
    try:
        run()
    except ReproError as exc:
        fail(exc)
    except KeyboardInterrupt as exc:
        stopped(exc, args)


def validate(overrides: Sequence[str], conf_dir: Path = CONF_DIR, composer: Composer | None = None) -> DictConfig:
    """Compose the command line, so a typo is one ``error:`` line with status 2; the composed config is the run's.
    With ``composer``, the Hydra composition it makes is kept for the run's points (a one-point run then composes
    once)."""
    with hydra_context(conf_dir):
        return composer(overrides, keep_exp=True) if composer is not None else compose_config(overrides)


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def _run(cfg: DictConfig) -> None:
    """Hydra task: run the experiment ``cfg.exp`` and print its one-line summary."""
    overrides = list(HydraConfig.get().overrides.task)
    guarded(lambda: print(run_experiment(cfg, overrides).summary_line()), sys.argv[1:])


def case_key_args(args: Sequence[str], conf_dir: Path = CONF_DIR) -> list[str]:
    """``<case_key>=LABEL`` (e.g. ``panel=PLD-Sonnet`` for an experiment whose cases are labelled by ``panel``)
    becomes ``case=LABEL`` when the case key is not a config key of its own."""
    exp = next((a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("exp=")), None)
    path = conf_dir / "exp" / f"{exp}.yaml"
    if exp is None or not path.is_file():
        return list(args)
    try:
        node = OmegaConf.load(path)
    except Exception:  # composing reports a broken file properly
        return list(args)
    key = OmegaConf.select(node, "exp.case_key", default=None) if isinstance(node, DictConfig) else None
    main = OmegaConf.load(conf_dir / "config.yaml")
    if not key or key in main or key in node or key in group_overrides(conf_dir):
        return list(args)
    return [f"case={a.split('=', 1)[1]}" if a.startswith(f"{key}=") else a for a in args]


USAGE = """\
usage: python -m repro +exp=NAME [KEY=VALUE ...]     run an experiment into runs/NAME[@what you changed]/
       python -m repro [KEY=VALUE ...]               one point of the default system and workload (runs/default)
       python -m repro list                          every experiment, system, workload, hardware, model, ...
       python -m repro check [NAME ...] [--quick]    re-run experiments and compare with results/ (exit 1 on a change)
       python -m repro robustness NAME [--quick]     the experiment over its paper's open choices
       python -m repro sim_vs_real [...]             the simulator against real models on this device (.[real])
       python -m repro all [--quick]                 regenerate every reference in results/ and results/INDEX.md
       python -m repro.render DIR                    redraw DIR's figures and summary.md from its points.csv

  +exp=NAME picks the experiment (with the +); quick=true runs its small grid. KEY=VALUE changes one knob: a value
  for a key the experiment sweeps runs that value only (rps=2), a list sweeps it (rps=[1,2]), system=NAME runs that
  system only. Run-control keys: n_jobs=N, out_dir=DIR, resume=true, overwrite=true, save_requests=true.
  Examples: python -m repro +exp=smoke quick=true
            python -m repro +exp=adaserve_fig4 model=llama2-70b rps=2
  The manual: docs/using.md. Every key and its default (Hydra's help) follows.
"""


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ``list``, ``check`` and ``all`` are handled here; an experiment run goes through Hydra."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--help"], ["-h"], ["help"]):
        print(USAGE, flush=True)
        sys.argv = [sys.argv[0], "--help"]
        _run()
        return
    if args[:1] == ["list"]:
        print(list_configs())
        return
    if args[:1] == ["robustness"]:
        from repro.experiments import robustness

        guarded(lambda: sys.exit(robustness.main(args[1:])), None)
        return
    if args[:1] == ["sim_vs_real"]:
        from repro.experiments import sim_vs_real

        guarded(lambda: sys.exit(sim_vs_real.main(args[1:])), None)
        return
    if args[:1] in (["check"], ["all"]):
        from repro.experiments import check

        guarded(lambda: sys.exit(check.main(args)), None)
        return
    typed = list(args)  # what the resume command repeats
    # a flag's value (``--cfg job``, ``--info all``) aside
    bare = [a for i, a in enumerate(args) if not a.startswith(("-", "~")) and "=" not in a
            and not (i and args[i - 1].startswith("-"))]
    if bare:  # ``python -m repro cost --help``: a word Hydra would reject with a traceback
        fail(ReproError(f"unknown command or override '{bare[0]}': commands are {', '.join(COMMANDS)}; anything "
                        "else is KEY=VALUE (e.g. +exp=smoke quick=true); the cost model's own command line is "
                        "python -m repro.cost"))
    args = case_key_args(args)
    sys.argv = [sys.argv[0], *args]
    if any(a.startswith("-") for a in args):  # --help, --cfg, -m ...: Hydra's own flags, handled by @hydra.main
        _run()
        return
    # a plain run: the config composed once here is the run's (what @hydra.main would pass, composed twice more),
    # and its Hydra composition serves the points that share its config groups
    def run() -> None:
        composer = Composer()
        print(run_experiment(validate(args, composer=composer), args, composer=composer).summary_line())

    guarded(run, typed)


if __name__ == "__main__":
    main()
