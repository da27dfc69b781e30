"""``python -m evokernel.search``: run, or resume, an evolutionary kernel search.

Only the command line lives here: it builds a config, a runtime, a strategy and
the engine, shows progress on stderr, and exports the results. Every error a user
can cause (a bad key or value, an unknown workload, a directory that is not a
run, a changed environment) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from evokernel import config as cfgmod
from evokernel.config import ConfigError, RunConfig
from evokernel.journal import RunDir, RunDirError
from evokernel.strategies import StrategyEnv

EXAMPLES = """examples:
  python -m evokernel.search --workload dsa_topk                     # local Ray, auto budget
  python -m evokernel.search --workload dsa_topk --runtime local --budget 6 --shapes smoke
  python -m evokernel.search --config configs/greedy.yaml --seed 3 --run-dir runs/greedy-3
  python -m evokernel.search --address ray://head:10001 --gpu-seconds 3600
  python -m evokernel.search --resume runs/greedy-3 --budget 400     # continue, spend more
  python -m evokernel.search --set population.kind=map_elites --set evolutionary.tune_trials=6
  EVOKERNEL_LLM_BASE_URL=http://127.0.0.1:8080/v1 EVOKERNEL_LLM_MODEL=m \
    python -m evokernel.search --workload dsa_topk --operators llm    # LLM operators, recorded
  python -m evokernel.search --operators mixed --set operators.rates.llm_agent=0.1
  python -m evokernel.search --operators llm --llm replay --set llm.recording_dir=runs/old/llm
"""
EXIT_USAGE = 2
RESUMABLE = {"budget", "gpu_seconds", "runtime", "address", "quiet"}
"""Flags that may change on ``--resume``: how much more to spend and where to run."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m evokernel.search",
        description=__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workload", help="workload name (folder under workloads/)")
    p.add_argument("--strategy", choices=["evolutionary", "random", "greedy", "optuna"])
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
    p.add_argument("--quiet", action="store_true", help="no live progress")
    return p


def _cli_layer(args: argparse.Namespace) -> dict[str, Any]:
    layer: dict[str, Any] = {}
    simple = {"workload": "workload", "strategy": "strategy", "seed": "seed", "shapes": "shapes",
              "run_dir": "run_dir", "budget": "budget.evaluations", "gpu_seconds": "budget.gpu_seconds",
              "islands": "population.islands", "runtime": "runtime.kind", "address": "runtime.address",
              "operators": "operators.kind", "llm_mode": "llm.mode"}
    for attr, key in simple.items():
        value = getattr(args, attr)
        if value is not None:
            cfgmod.set_path(layer, key, value)
    if args.gpu_seconds is not None and args.budget is None:
        cfgmod.set_path(layer, "budget.evaluations", None)  # --gpu-seconds alone: device time only
    if args.quiet:
        cfgmod.set_path(layer, "output.progress", False)
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        import yaml

        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        cfgmod.set_path(layer, key, value)
    return layer


def _given(args: argparse.Namespace) -> set[str]:
    names = {"workload", "strategy", "budget", "gpu_seconds", "seed", "shapes", "islands", "run_dir",
             "runtime", "address", "operators", "llm_mode"}
    out = {n for n in names if getattr(args, n) is not None}
    if args.config:
        out.add("config")
    if args.set:
        out.add("set")
    return out


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def _load_workload(config: RunConfig) -> Any:
    from evokernel.runtime import load_object

    loader = load_object(config.workload_loader)
    return loader(config.workload)


def _default_run_dir(config: RunConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.workload}-{config.strategy}-s{config.seed}-{stamp}"


def _warn(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    print(f"evokernel.search: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    warnings.showwarning = _warn
    try:
        return _main(args)
    except (ConfigError, RunDirError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        print("evokernel.search: interrupted; continue with --resume <run dir>", file=sys.stderr)
        return 130


def _fail(message: str) -> int:
    print(f"evokernel.search: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _main(args: argparse.Namespace) -> int:
    from evokernel.engine import Budget, Engine, EnvironmentChanged
    from evokernel.runtime import evaluator_factory, make_runtime
    from evokernel.strategies import make_strategy, strategy_from_state

    run: RunDir | None = None
    auto_batch = False
    if args.resume:
        run = RunDir.open(args.resume)  # read-only checks first
        fixed = _given(args) - RESUMABLE
        if fixed:
            raise ConfigError(f"--resume keeps the run's config; cannot change {', '.join(sorted(fixed))}")
        try:
            stored = RunConfig.model_validate(run.config())
        except ValueError as exc:
            raise RunDirError(f"{run.config_path} is not a valid run config: {str(exc).splitlines()[0]}") from None
        config = cfgmod.build([("run config", cfgmod.dump(stored)), ("command line", _cli_layer(args))])
    else:
        layers: list[tuple[str, dict[str, Any]]] = [(path, cfgmod.read_yaml(path)) for path in args.config]
        layers.append(("command line", _cli_layer(args)))
        config = cfgmod.build(layers)
        auto_batch = config.batch_size == "auto"
        config = config.resolved(_cuda_available())
    _check_operators(config)
    fallback = _llm_problem(config, run)
    if fallback is not None:
        print(f"evokernel.search: {fallback}", file=sys.stderr)
        if not config.llm.fallback_to_builtin:
            return EXIT_USAGE
    requested = config.operators.kind
    if run is None and requested != "builtin":
        if fallback is None:  # fix the env's endpoint and models in the run config (never the key)
            config.llm = config.llm.resolved()
        else:  # the run is a built-in run, and resumes as one
            config.operators.kind = "builtin"

    try:
        workload = _load_workload(config)
        shapes = list(workload.resolve_shapes(config.shapes))
        seeds = workload.seeds() if run is None else [run.load_candidate(c) for c in run.manifest["seeds"]]
    except (ValueError, KeyError) as exc:  # WorkloadError is a ValueError
        raise ConfigError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None
    if not seeds:
        raise ConfigError(f"workload {config.workload} has no seed candidates")
    if not shapes:
        raise ConfigError(f"shape subset {config.shapes!r} is empty")

    try:
        factory = evaluator_factory(config.evaluator.factory, config.workload, dict(config.evaluator.options))
    except ValueError as exc:
        raise ConfigError(f"evaluator.factory: {exc}") from None
    rt_opts: dict[str, Any] = {}
    if config.runtime.kind == "ray":
        rt_opts = {"address": config.runtime.address, "num_cpus": config.runtime.num_cpus,
                   "object_store_mb": config.runtime.object_store_mb,
                   "evaluators": None if config.runtime.evaluators == "auto" else config.runtime.evaluators}
    runtime = make_runtime(config.runtime.kind, factory, **rt_opts)
    if run is None and auto_batch:
        # Every evaluator busy through two rounds a generation, however many GPUs.
        config.batch_size = max(int(config.batch_size), 2 * runtime.n_evaluators)  # type: ignore[arg-type]
    if config.pipeline == "auto":  # opt-in for now: resume is not exact at generation ends yet
        config.pipeline = False
    try:
        if run is None:
            root = Path(config.run_dir) if config.run_dir else _default_run_dir(config)
            config = config.model_copy(update={"run_dir": str(root)})
            manifest: dict[str, Any] = {
                "workload": config.workload, "strategy": config.strategy, "seed": config.seed,
                "seeds": [s.id for s in seeds],
            }
            if requested != config.operators.kind:
                manifest["operators"] = {"requested": requested, "used": config.operators.kind,
                                         "why": (fallback or "").splitlines()[0]}
            run = RunDir.create(root, cfgmod.dump(config), manifest)
            for s in seeds:
                run.write_source(s)
        snapshot = run.latest_snapshot()
        extra: dict[str, Any] = {}
        llm_ops: list[Any] = []
        if config.operators.kind != "builtin":
            if args.resume:  # the cut-short generation asks again (answered from the recording)
                # (a pipelined snapshot's next generation was asked before it: keep that one)
                asked = snapshot["generation"] + (1 if snapshot.get("ahead") else 0) if snapshot else -1
                run.trim_llm_outcomes(asked)
            if fallback is None:
                llm_ops = _llm_operators(config, run, workload, shapes, runtime, extra)
        env = StrategyEnv(seeds=seeds, seed=config.seed, workload=config.workload,
                          host=runtime.host, run_dir=run.root, extra=extra)
        budget = Budget(
            evaluations=None if config.budget.evaluations in (None, "auto") else int(config.budget.evaluations),
            device_s=config.budget.gpu_seconds,
        )
        progress = _Progress(config, enabled=config.output.progress)
        engine = Engine(
            strategy_from_state(snapshot["strategy"], env) if snapshot else
            make_strategy(config.strategy, env, config.strategy_options()),
            runtime, run, seeds, shapes, budget, int(config.batch_size),  # type: ignore[arg-type]
            max_stall=config.max_stall, allow_env_change=args.allow_env_change, observer=progress,
            pipeline=config.pipeline is True,
        )
        engine.restore(snapshot)
        extra["evaluation_of"] = engine.cache.get  # the parents' evaluations, for the prompts
        try:
            engine.check_environment(runtime.fingerprint())
        except EnvironmentChanged as exc:
            return _fail(str(exc))
        if args.resume:
            import yaml

            from evokernel.journal import atomic_write

            atomic_write(run.config_path, yaml.safe_dump(cfgmod.dump(config), sort_keys=False))
        with progress:
            try:
                reason = engine.run()
            except EnvironmentChanged as exc:
                return _fail(str(exc))
        _report(engine, run, workload, config, reason)
        if llm_ops or run.llm_outcomes_path.exists():
            _llm_summary(run, llm_ops)
        return 0
    finally:
        runtime.close()


# -- LLM operators -------------------------------------------------------------------------

def _check_operators(config: RunConfig) -> None:
    """One-line errors for an operator mix that cannot work: wrong strategy, unknown rate names."""
    ops = config.operators
    if ops.kind == "builtin":
        return
    if config.strategy not in ("evolutionary", "greedy"):
        raise ConfigError(f"operators.kind {ops.kind!r} needs strategy evolutionary or greedy, "
                          f"not {config.strategy!r}")
    from evokernel.operators.llm import load_presets
    from evokernel.strategies.mixing import known_rates

    try:
        presets = load_presets()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"llm.preset: {str(exc).splitlines()[0]}") from None
    if config.llm.preset not in presets:
        raise ConfigError(f"llm.preset {config.llm.preset!r} is not one of {sorted(presets)}")
    names = known_rates(sorted({*(presets[config.llm.preset] or {}), *config.llm.operators}))
    unknown = sorted(set(ops.rates) - set(names))
    if unknown:
        raise ConfigError(f"operators.rates: unknown operator {unknown[0]!r}; known: {', '.join(names)}")


def _llm_problem(config: RunConfig, run: RunDir | None) -> str | None:
    """Why the LLM operators cannot run (a message saying how to fix it), or None."""
    if config.operators.kind == "builtin":
        return None
    from evokernel.operators.llm import llm_unavailable

    problem = llm_unavailable(config.llm)
    if problem is None and config.llm.mode == "replay":
        folder = config.llm.recordings(None if run is None else run.root)
        if folder is None or not folder.is_dir():
            raise ConfigError(f"--llm replay: no recording at {folder or '(none)'}; point "
                              "llm.recording_dir at a recorded run's llm/ folder")
    return problem


def _llm_operators(config: RunConfig, run: RunDir, workload: Any, shapes: Sequence[str],
                   runtime: Any, extra: dict[str, Any]) -> list[Any]:
    """The LLM operators, and the context they need, into ``extra`` (``StrategyEnv.extra``)."""
    from evokernel.evaluate.result import Evaluation
    from evokernel.llm.prompts import workload_brief
    from evokernel.operators.llm import make_llm_operators

    brief = workload_brief(workload)
    try:
        ops = make_llm_operators(config.llm, run.root, brief=brief)
        agent_shapes = (list(workload.resolve_shapes(config.operators.agent_shapes))
                        if config.operators.agent_shapes else list(shapes))
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None

    def evaluate(candidate: Any, on: Sequence[str]) -> Evaluation:
        """The agent's tools: evaluated by the run's evaluators, journaled, not charged."""
        for _, evaluation in runtime.evaluate([candidate], list(on)):
            return evaluation  # type: ignore[no-any-return]
        raise RuntimeError("the runtime returned no evaluation")

    def journal(record: Any, generation: int, agent_evaluations: dict[str, Evaluation]) -> None:
        run.append_llm_outcome(generation, record.to_json(), agent_evaluations)

    extra.update({"llm_operators": ops, "evaluate": evaluate, "agent_shapes": agent_shapes,
                  "workload_brief": brief, "on_llm_outcome": journal})
    return ops


def _llm_summary(run: RunDir, ops: Sequence[Any]) -> None:
    """Per LLM operator: proposals, children, and how those children were evaluated."""
    lines = run.llm_outcomes()
    status = {r.candidate_id: r.evaluation.status.value for r in run.records()}
    by_op: dict[str, dict[str, int]] = {}
    for line in lines:
        row = by_op.setdefault(line["operator"], {"asked": 0, "children": 0, "passed": 0, "requests": 0})
        row["asked"] += 1
        row["requests"] += len(line.get("requests") or ())
        if line.get("child"):
            row["children"] += 1
            row["passed"] += status.get(line["child"]) == "PASSED"
    parts = [f"{name}: {r['asked']} asked, {r['children']} children, {r['passed']} passed"
             for name, r in sorted(by_op.items())]
    print("LLM operators: " + ("; ".join(parts) or "not asked"))
    if ops:
        budget = ops[0].client.budget.summary()
        print(f"LLM tokens: {budget['total_tokens']} in {budget['calls']} requests"
              f" (est. ${budget['cost_usd']}); outcomes: {run.llm_outcomes_path}")


def _report(engine: Any, run: RunDir, workload: Any, config: RunConfig, reason: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from evokernel.export import export_run

    definition = getattr(getattr(workload, "definition", None), "name", config.workload)
    axes: dict[str, dict[str, int]] = {}
    if hasattr(workload, "axes_of"):
        for sid in getattr(workload, "shapes", {}):
            try:
                axes[sid] = dict(workload.axes_of(sid))
            except Exception:
                break
    paths = export_run(run, definition, config.output.author, axes)
    table = Table(title=f"top candidates ({reason}; {engine.state.spent.evaluations} evaluations)")
    for col in ("#", "candidate", "status", "fitness"):
        table.add_column(col, no_wrap=True)
    table.add_column("name / operator", overflow="fold")
    table.add_column("params changed from the defaults", overflow="fold", ratio=2)
    for i, (cid, ev) in enumerate(engine.ranked()[: config.output.top], start=1):
        cand = engine.candidates.get(cid) or run.load_candidate(cid)
        fit = "-" if ev.fitness is None else f"{ev.fitness:.3f}"
        declared = {**cand.knob_space, **cand.launch_space}
        params = " ".join(
            f"{k}={v}" for k, v in sorted(cand.params.items())
            if k not in declared or v != declared[k].initial
        ) or "(defaults)"
        table.add_row(str(i), cid, ev.status.value, fit, f"{cand.name} / {cand.operator}", params)
    console = Console()
    console.print(table)
    console.print(f"run directory: {run.root}")
    for what, path in paths.items():
        console.print(f"  {what}: {path}")


class _Progress:
    """Live progress on stderr: evaluations / budget, best fitness, last status."""

    def __init__(self, config: RunConfig, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._last = "-"

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]search[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.description}"), console=Console(stderr=True), transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __call__(self, event: Any) -> None:
        if self._progress is None:
            return
        b = event.budget
        if b.evaluations is not None:
            total, done = b.evaluations, event.spent.evaluations
        else:
            total, done = b.device_s, round(event.spent.device_s, 1)
        best = event.best.fitness if event.best is not None else None
        if event.evaluation is not None:
            self._last = event.evaluation.status.value
        shown = "-" if best is None else f"{best:.3f}"
        text = f"gen {event.generation}  best fitness {shown}  last {self._last}"
        self._progress.update(self._task, total=total, completed=done, description=text)


if __name__ == "__main__":
    sys.exit(main())
