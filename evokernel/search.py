"""``python -m evokernel.search``: run, or resume, an evolutionary kernel search.

Only the command line lives here: arguments, errors, progress and the final report.
The run itself is built by ``evokernel.run.build``. Every error a user can cause (a
bad key or value, an unknown name, a directory that is not a run, a corrupt or
locked run, a changed environment) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evokernel import config as cfgmod
from evokernel.analysis.summary import HEADER, MEANING, top_rows
from evokernel.cli import configure_logging, fail
from evokernel.config import ConfigError, RunConfig
from evokernel.engine import Event
from evokernel.journal import RunDir, RunDirError
from evokernel.populations.saved import PopulationError, check_new
from evokernel.run import Run, budget_layer, build, resumed_config

PROG = "evokernel.search"
EXAMPLES = """examples:
  python -m evokernel.search --workload dsa_topk                     # local Ray, auto budget
  python -m evokernel.search --workload dsa_topk --runtime local --budget 6 --shapes smoke
  python -m evokernel.search --config configs/greedy.yaml --seed 3 --run-dir runs/greedy-3
  python -m evokernel.search --address ray://head:10001 --gpu-seconds 3600
  python -m evokernel.search --resume runs/greedy-3 --budget 400     # continue, spend more
  python -m evokernel.search --budget 60 --save-population my-elites  # keep the best for later
  python -m evokernel.search --from-population populations/my-elites  # start from them (re-evaluated)
  python -m evokernel.search --set population.kind=map_elites --set evolutionary.tune_trials=6
  EVOKERNEL_LLM_BASE_URL=http://127.0.0.1:8080/v1 EVOKERNEL_LLM_MODEL=m \\
    python -m evokernel.search --workload dsa_topk --operators llm    # LLM operators, recorded
  python -m evokernel.search --operators mixed --set operators.rates.llm_agent=0.1
  python -m evokernel.search --operators llm --llm replay --set llm.recording_dir=runs/old/llm
"""
FLAGS = {"workload": "workload", "strategy": "strategy", "seed": "seed", "shapes": "shapes",
         "from_population": "seeds_from",
         "run_dir": "run_dir", "islands": "population.islands", "runtime": "runtime.kind",
         "address": "runtime.address", "operators": "operators.kind", "llm_mode": "llm.mode",
         "finalists": "output.finalists"}
"""Flags that set one config key each (``--budget`` and ``--gpu-seconds`` go through
``run.budget_layer``)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m evokernel.search", description=__doc__.splitlines()[0],
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", help="workload name (folder under workloads/)")
    p.add_argument("--strategy", help="evolutionary, map_elites, random, greedy, optuna, or any registered name")
    p.add_argument("--budget", type=int, metavar="N", help="evaluations (seeds included)")
    p.add_argument("--gpu-seconds", type=float, metavar="S", help="device-second budget")
    p.add_argument("--seed", type=int)
    p.add_argument("--shapes", metavar="SUBSET", help="named shape subset (smoke, quick, all, ...)")
    p.add_argument("--islands", type=int, metavar="N")
    p.add_argument("--run-dir", metavar="DIR", help="where the run is written (default runs/<...>)")
    p.add_argument("--config", action="append", default=[], metavar="YAML", help="preset(s), later wins")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any config key, dotted")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its directory")
    p.add_argument("--allow-env-change", action="store_true", help="resume on a different GPU/driver/torch")
    p.add_argument("--runtime", choices=["ray", "local"])
    p.add_argument("--address", help="join this Ray cluster instead of starting one")
    p.add_argument("--operators", choices=["builtin", "llm", "mixed"],
                   help="variation operators: knob operators (default), LLM operators, or both by rates")
    p.add_argument("--llm", choices=["live", "record", "replay"], dest="llm_mode",
                   help="LLM requests: ask and keep nothing, ask once and record (default), "
                        "or answer from a recording only (llm.recording_dir)")
    p.add_argument("--from-population", metavar="DIR", help="seed the run with a saved population "
                   "(populations/<name>); its members are evaluated again")
    p.add_argument("--save-population", metavar="NAME", help="at the end, save the run's best candidates "
                   "as populations/NAME")
    p.add_argument("--finalists", type=int, metavar="N", help="after the budget, measure the N best (and the "
                   "best seed) again and name the best from those figures (default 3; 0: off)")
    p.add_argument("--quiet", action="store_true", help="no live progress")
    return p


def cli_layer(args: argparse.Namespace) -> dict[str, Any]:
    """The config layer the command line gives (flags, then ``--set`` items)."""
    layer: dict[str, Any] = {}
    for attr, key in FLAGS.items():
        if getattr(args, attr) is not None:
            cfgmod.set_path(layer, key, getattr(args, attr))
    layer = cfgmod.merge(layer, budget_layer(args.budget, args.gpu_seconds))
    if args.quiet:
        cfgmod.set_path(layer, "output.progress", False)
    return cfgmod.merge(layer, cfgmod.sets_layer(args.set))


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(PROG)
    try:
        if args.save_population:
            check_new(args.save_population)  # before the run, not after it
        with open_run(args) as run:
            with LiveProgress(run.config.output.progress) as progress:
                run.engine.observer = progress
                reason = run.run()
            run.measure_finalists()
            run.finish(reason)
            report(run, reason)
            if args.save_population:
                print(f"population: {run.save_population(args.save_population)}")
        return 0
    except (ConfigError, RunDirError, PopulationError) as exc:
        return fail(PROG, str(exc))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; continue with --resume <run dir>", file=sys.stderr)
        return 130


def open_run(args: argparse.Namespace) -> Run:
    """A new run from the presets and flags, or the run ``--resume`` names."""
    if args.resume:
        directory = RunDir.open(args.resume)  # read-only checks first
        if args.config:
            raise ConfigError("--resume keeps the run's config; cannot apply --config")
        config = resumed_config(directory, cli_layer(args))
        return build(config, resume=directory, allow_env_change=args.allow_env_change)
    layers: list[tuple[str, dict[str, Any]]] = [(path, cfgmod.read_yaml(path)) for path in args.config]
    fresh: RunConfig = cfgmod.build([*layers, ("command line", cli_layer(args))])
    return build(fresh, allow_env_change=args.allow_env_change)


def report(run: Run, reason: str) -> None:
    """The top candidates and where the run's files are, on stdout."""
    spent = run.engine.state.spent.evaluations
    table = Table(title=f"top candidates ({reason}; {spent} evaluations)", caption=MEANING)
    for name in HEADER[:-2]:
        table.add_column(name, no_wrap=True)
    table.add_column(HEADER[-2], overflow="fold")
    table.add_column(HEADER[-1], overflow="fold", ratio=2)
    for row in top_rows(run.engine, run.directory, run.config.output.top):
        table.add_row(*row.cells())
    console = Console()
    if not console.is_terminal:  # a log or a pipe: no terminal to fit, keep every column whole
        console = Console(width=160)
    console.print(table)
    for line in run.finals.lines() if run.finals is not None else ():
        console.print(line, markup=False, highlight=False)
    for line in run.llm_report():
        console.print(line)
    console.print(f"run directory: {run.directory.root}")
    for what, path in run.outputs.items():
        console.print(f"  {what}: {path}")


class LiveProgress:
    """Live progress on stderr: evaluations / budget, best fitness, last status."""

    def __init__(self, enabled: bool) -> None:
        self._progress: Progress | None = None
        self._enabled = enabled
        self._last = "-"

    def __enter__(self) -> LiveProgress:
        if self._enabled:
            self._progress = Progress(
                TextColumn("[bold]search[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.description}"), console=Console(stderr=True), transient=False)
            self._progress.start()
            self._task = self._progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __call__(self, event: Event) -> None:
        if self._progress is None:
            return
        b = event.budget
        if b.evaluations is not None:
            total, done = float(b.evaluations), float(event.spent.evaluations)
        else:
            total, done = float(b.device_s or 0.0), round(event.spent.device_s, 1)
        if event.evaluation is not None:
            self._last = event.evaluation.status.value
        best = "-" if event.best is None or event.best.fitness is None else f"{event.best.fitness:.3f}"
        text = f"gen {event.generation}  best fitness {best}  last {self._last}"
        self._progress.update(self._task, total=total, completed=done, description=text)


if __name__ == "__main__":
    sys.exit(main())
