"""``python -m evokernel.analysis.compare``: strategies at equal budgets over several seeds.

Every (strategy, seed) is an ordinary search run (same engine loop, same run
directory format) with its own evaluator in process, one Ray task per run. With
a recorded landscape (``--landscape``, default the one ``*.jsonl`` or ``*.jsonl.xz`` in
``workloads/<name>/landscapes/``)
the evaluator replays it and the search space is the landscape's own, so a
comparison needs no GPU and reruns to identical numbers. The results folder::

    comparison.json      what was compared: plan, budget, landscape facts, target, outcomes
    runs/<strategy>-s<seed>/   one run directory per run (resumable journal and snapshots)
    evaluations.parquet  every evaluation: strategy, seed, index, fitness, best_so_far, ...
    evaluations.csv      the same, for anything that reads CSV
    report/              tables, plots and summary.md (``python -m evokernel.analysis.report``)

Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from evokernel import config as cfgmod
from evokernel.analysis.experiment import RunOutcome, RunSpec, run_all
from evokernel.cli import configure_logging
from evokernel.config import ConfigError, RunConfig

logger = logging.getLogger(__name__)

EXIT_USAGE = 2
FORMAT = 1
ALIASES = {"ga": "evolutionary", "evo": "evolutionary", "hill": "greedy", "tpe": "optuna",
           "me": "map_elites"}
REPLAY_FACTORY = "replay"
EXAMPLES = """examples:
  python -m evokernel.analysis.compare --workload dsa_topk --seeds 10 --budget 60
  python -m evokernel.analysis.compare --workload dsa_topk --strategies ga,random --seeds 0,1,2 --gpu-seconds 30
  python -m evokernel.analysis.compare --workload dsa_topk --landscape L.jsonl --runtime local --out runs/cmp
"""


class UsageError(ValueError):
    """Input a user can fix; printed as one line, exit status 2."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m evokernel.analysis.compare", description=__doc__.splitlines()[0],
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", help="workload name (folder under workloads/)")
    p.add_argument("--strategies", default="evolutionary,random,greedy,optuna",
                   help="comma-separated: ga (=evolutionary), me (=map_elites), random, greedy, optuna")
    p.add_argument("--seeds", default="10", help="N (seeds 0..N-1) or a comma-separated list")
    p.add_argument("--budget", type=int, metavar="N", help="evaluations per run, seeds included")
    p.add_argument("--gpu-seconds", type=float, metavar="S", help="device seconds per run (replay: recorded)")
    p.add_argument("--landscape", metavar="PATH", help="recorded landscape JSONL to replay")
    p.add_argument("--no-landscape", action="store_true", help="evaluate live even if a landscape exists")
    p.add_argument("--shapes", metavar="SUBSET", help="shape subset (default: the landscape's shapes)")
    p.add_argument("--target-fraction", type=float, default=0.95,
                   help="target = this share of the best fitness in the landscape (default 0.95)")
    p.add_argument("--out", metavar="DIR", help="results folder (default runs/compare-<workload>-<time>)")
    p.add_argument("--runtime", choices=["ray", "local"], default="ray", help="local: sequential, in process")
    p.add_argument("--parallel", type=int, metavar="N", help="runs at once on Ray (default: CPU count)")
    p.add_argument("--batch-size", type=int, metavar="N", help="candidates per generation (default 8 on replay)")
    p.add_argument("--config", action="append", default=[], metavar="YAML", help="run preset(s), later wins")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any run config key")
    p.add_argument("--no-report", action="store_true", help="skip tables and plots")
    p.add_argument("--quiet", action="store_true", help="no progress")
    return p


def strategies_of(text: str) -> list[str]:
    """Registered strategy names (or import paths), with the aliases ga, evo, hill, tpe and me."""
    from evokernel.strategies import STRATEGIES

    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise UsageError("--strategies is empty")
    out = []
    for name in names:
        name = ALIASES.get(name.lower(), name if ":" in name else name.lower())
        if name not in STRATEGIES and ":" not in name:
            raise UsageError(f"unknown strategy {name!r}; choose from "
                             f"{', '.join([*STRATEGIES.names(), *sorted(ALIASES)])}")
        out.append(name)
    return list(dict.fromkeys(out))


def seeds_of(text: str) -> list[int]:
    try:
        if "," in text:
            seeds = [int(s) for s in text.split(",") if s.strip()]
        else:
            n = int(text)
            if n < 1:
                raise UsageError(f"--seeds {text}: need at least one seed")
            seeds = list(range(n))
    except ValueError as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"--seeds {text!r}: expected N or a comma-separated list of integers") from None
    if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise UsageError(f"--seeds {text!r}: seeds must be distinct non-negative integers")
    return seeds


def _layers(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    from evokernel.run import budget_layer

    layers = [(path, cfgmod.read_yaml(path)) for path in args.config]
    cli = cfgmod.sets_layer(args.set)
    if args.workload:
        cli["workload"] = args.workload
    cli = cfgmod.merge(cli, budget_layer(args.budget, args.gpu_seconds))
    cfgmod.set_path(cli, "runtime.kind", "local")  # each run's evaluator lives in its own task
    cfgmod.set_path(cli, "output.progress", False)
    if args.batch_size is not None:
        cli["batch_size"] = args.batch_size
    layers.append(("command line", cli))
    return layers


def plan(args: argparse.Namespace) -> tuple[dict[str, Any], list[RunSpec]]:
    """The comparison's manifest and one spec per (strategy, seed); raises on bad input."""
    from evokernel.analysis.landscape import Landscape, LandscapeError, default_landscape
    from evokernel.operators.setup import with_llm_decided
    from evokernel.run import cuda_available, load_workload, resolve_shapes
    from evokernel.workload import workloads_root

    strategies, seeds = strategies_of(args.strategies), seeds_of(args.seeds)
    if args.budget is None and args.gpu_seconds is None:
        raise UsageError("give a budget: --budget N (evaluations) and/or --gpu-seconds S")
    if args.budget is not None and args.budget < 1:
        raise UsageError(f"--budget {args.budget}: must be at least 1")
    if args.gpu_seconds is not None and args.gpu_seconds <= 0:
        raise UsageError(f"--gpu-seconds {args.gpu_seconds}: must be positive")
    if not 0 < args.target_fraction <= 1:
        raise UsageError(f"--target-fraction {args.target_fraction}: must be in (0, 1]")
    if args.parallel is not None and args.parallel < 1:
        raise UsageError(f"--parallel {args.parallel}: must be at least 1")
    if args.landscape and args.no_landscape:
        raise UsageError("--landscape and --no-landscape exclude each other")
    base, notice = with_llm_decided(cfgmod.build(_layers(args)))
    if notice:
        logger.warning("%s", notice)
    workload = load_workload(base)

    landscape = None
    try:
        if args.landscape:
            if not Path(args.landscape).is_file():
                raise UsageError(f"--landscape {args.landscape}: no such file")
            landscape = Landscape.load(args.landscape)
        elif not args.no_landscape:
            found = default_landscape(Path(getattr(workload, "directory", workloads_root() / base.workload)))
            landscape = Landscape.load(found) if found else None
    except LandscapeError as exc:
        raise UsageError(str(exc)) from None

    updates: dict[str, Any] = {}
    facts: dict[str, Any] | None = None
    if landscape is not None:
        run_seeds = landscape.seeds(workload.seeds())
        shapes = list(landscape.shapes)
        if args.shapes:
            wanted = resolve_shapes(workload, args.shapes)
            missing = [s for s in wanted if s not in shapes]
            if missing:
                raise UsageError(f"--shapes {args.shapes}: the landscape has no measurement on {missing[0]}")
            shapes = wanted
        facts = landscape.describe(run_seeds)
        known = {w.code_id for w in workload.seeds()}
        for fact, cand in zip(facts["seeds"], run_seeds, strict=True):
            fact["from_workload"] = cand.code_id in known
            if not fact["from_workload"]:
                logger.warning("no seed of %s has the code of the landscape's %s; searching from its "
                               "recorded candidate", base.workload, cand.name)
        updates["evaluator"] = {"factory": REPLAY_FACTORY,
                                "options": {"landscape": str(Path(landscape.path).resolve())}}
        updates["shapes"] = ",".join(shapes)
        cuda = True  # replaying device measurements: batch as the device run would
    else:
        cuda = cuda_available()
        run_seeds = workload.seeds()
        resolved = base.resolved(cuda)
        shapes = resolve_shapes(workload, args.shapes or resolved.shapes)
        updates["shapes"] = args.shapes or resolved.shapes
    if not run_seeds:
        raise UsageError(f"workload {base.workload} has no seed candidates")
    merged = cfgmod.merge(cfgmod.dump(base), updates)
    if "evaluator" in updates:  # replace, not merge: the live evaluator's options mean nothing here
        merged["evaluator"] = updates["evaluator"]
    base = cfgmod.build([("comparison", merged)]).resolved(cuda)

    out = Path(args.out) if args.out else Path("runs") / (
        f"compare-{base.workload}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} already exists and is not empty; pick another --out")
    if base.operators.kind != "builtin" and base.llm.mode == "record" and base.llm.recording_dir is None:
        # one recording for every run of the comparison: a rerun replays it (--llm replay)
        llm = base.llm.model_copy(update={"recording_dir": str((out / "llm").absolute())})
        base = base.model_copy(update={"llm": llm})
    specs = []
    for strategy in strategies:
        for seed in seeds:
            run_dir = out / "runs" / f"{strategy.rpartition(':')[2]}-s{seed}"
            config = base.model_copy(update={"strategy": strategy, "seed": seed, "run_dir": str(run_dir)})
            specs.append(RunSpec(config=cfgmod.dump(RunConfig.model_validate(cfgmod.dump(config))),
                                 seeds=list(run_seeds), shapes=shapes))
    unit = "evaluations" if args.budget is not None else "device_s"
    manifest = {
        "format": FORMAT, "kind": "comparison", "workload": base.workload,
        "command": "python -m evokernel.analysis.compare " + " ".join(sys.argv[1:]),
        "created": datetime.now().isoformat(timespec="seconds"),
        "strategies": strategies, "seeds": seeds, "shapes": shapes,
        "budget": {"unit": unit, "value": args.budget if unit == "evaluations" else args.gpu_seconds,
                   "evaluations": args.budget, "gpu_seconds": args.gpu_seconds},
        "batch_size": base.batch_size, "target_fraction": args.target_fraction,
        "landscape": facts, "seed_candidates": [s.id for s in run_seeds],
        "runs": [{"strategy": s.run_config.strategy, "seed": s.run_config.seed,
                  "dir": str(Path(s.run_config.run_dir or "").relative_to(out))} for s in specs],
    }
    return {"out": str(out), **manifest}, specs


def write_tables(out: Path, manifest: dict[str, Any]) -> Any:
    """``evaluations.parquet`` and ``.csv`` from the runs' journals; returns the frame."""
    from evokernel.analysis import tables
    from evokernel.journal import RunDir

    frames = [tables.evaluations(RunDir.open(out / r["dir"]), r["strategy"], r["seed"]) for r in manifest["runs"]]
    frame = tables.stack(frames)
    frame.to_parquet(out / "evaluations.parquet", index=False)
    frame.to_csv(out / "evaluations.csv", index=False)
    return frame


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging("evokernel.compare")
    try:
        manifest, specs = plan(args)
    except (UsageError, ConfigError) as exc:
        print(f"evokernel.compare: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = Path(manifest.pop("out"))
    out.mkdir(parents=True, exist_ok=True)
    _write_manifest(out, manifest)
    started = time.perf_counter()
    outcomes = _execute(specs, args, manifest)
    manifest["wall_s"] = time.perf_counter() - started
    manifest["outcomes"] = [o.model_dump(mode="json") for o in outcomes]
    manifest["unseen"] = sum(o.unseen for o in outcomes)
    _write_manifest(out, manifest)
    write_tables(out, manifest)
    print(f"{len(outcomes)} runs in {manifest['wall_s'] / 60:.1f} min; "
          f"unseen candidates proposed: {manifest['unseen']}; results: {out}", file=sys.stderr)
    if not args.no_report:
        from evokernel.analysis.report import build_report

        folder = build_report(out)
        print((folder / "summary.md").read_text())
    return 0


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    from evokernel.files import atomic_write

    atomic_write(out / "comparison.json", json.dumps(manifest, indent=1) + "\n")


def _execute(specs: list[RunSpec], args: argparse.Namespace, manifest: dict[str, Any]) -> list[RunOutcome]:
    if args.quiet:
        return run_all(specs, args.runtime, args.parallel)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]compare[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=Console(stderr=True)) as progress:
        task = progress.add_task("starting", total=len(specs))

        def done(o: RunOutcome) -> None:
            progress.update(task, advance=1, description=f"{o.strategy} s{o.seed}: {o.evaluations} evals, {o.stop_reason}")

        return run_all(specs, args.runtime, args.parallel, on_done=done)


if __name__ == "__main__":
    sys.exit(main())
