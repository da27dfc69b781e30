"""From a config to a ready engine: the one way search, compare, tests and benchmarks build a run.

    config [+ run directory to resume] [+ runtime]  --build()-->  Run (engine, run dir, ...)

``build`` checks the config (strategy, operators, LLM endpoint), loads the workload,
its shapes and seeds, starts the runtime unless one is given, fixes the config's
``auto`` values for this machine, creates (or opens and locks) the run directory,
makes the LLM operators where the config asks for them, builds or restores the
strategy and the engine, and checks the environment. Every problem a user can cause
is a ``ConfigError`` or ``RunDirError`` with a one-line message, raised before
anything is written; whatever ``build`` started is closed again when it fails.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from evokernel import config as cfgmod
from evokernel.candidate import Candidate
from evokernel.cli import command_line
from evokernel.config import ConfigError, RunConfig
from evokernel.engine import Budget, Engine, Observer
from evokernel.evaluate.result import Evaluation
from evokernel.files import atomic_write
from evokernel.finalists import Finals, measure, pick
from evokernel.journal import RunDir, RunDirError
from evokernel.llm.outcomes import OutcomeLog
from evokernel.operators.setup import (
    LLMUnavailable,
    check,
    llm_problem,
    llm_services,
    with_llm_decided,
)
from evokernel.registry import load_object
from evokernel.runtime import Runtime, evaluator_factory, make_runtime
from evokernel.strategies import RunServices, StrategyEnv, strategy_class, strategy_from_state

logger = logging.getLogger(__name__)

RESUMABLE_KEYS = ("budget", "runtime", "output")
"""Config sections a resumed run may change: how much more to spend, where, and how it shows."""
FINALISTS_FILE = "finalists.json"


# -- the config --------------------------------------------------------------------------------

def budget_layer(evaluations: int | None, gpu_seconds: float | None) -> dict[str, Any]:
    """The config layer of a command line's ``--budget`` and ``--gpu-seconds``: device
    seconds alone limit by device time only (no evaluation count)."""
    budget: dict[str, Any] = {}
    if evaluations is not None:
        budget["evaluations"] = evaluations
    if gpu_seconds is not None:
        budget["gpu_seconds"] = gpu_seconds
        if evaluations is None:
            budget["evaluations"] = None
    return {"budget": budget} if budget else {}


def budget_of(config: RunConfig) -> Budget:
    """The engine's budget from a resolved config."""
    evaluations = config.budget.evaluations
    if evaluations == "auto":
        raise ValueError("budget.evaluations is still 'auto': resolve the config first")
    return Budget(evaluations=evaluations, device_s=config.budget.gpu_seconds)


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def resumed_config(run: RunDir, layer: dict[str, Any]) -> RunConfig:
    """The stored config of ``run`` with ``layer`` (resumable keys only) over it."""
    fixed = sorted(set(layer) - set(RESUMABLE_KEYS))
    if fixed:
        raise ConfigError(f"--resume keeps the run's config; cannot change {', '.join(fixed)}")
    try:
        stored = RunConfig.model_validate(run.config())
    except ValidationError as exc:
        raise RunDirError(cfgmod.describe(exc, f"{run.config_path} is not a valid run config")) from None
    return cfgmod.build([("run config", cfgmod.dump(stored)), ("command line", layer)])


def load_workload(config: RunConfig) -> Any:
    try:
        return load_object(config.workload_loader)(config.workload)
    except (ValueError, KeyError) as exc:  # WorkloadError is a ValueError
        raise ConfigError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None


def resolve_shapes(workload: Any, names: str) -> list[str]:
    try:
        shapes = list(workload.resolve_shapes(names))
    except (ValueError, KeyError) as exc:
        raise ConfigError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None
    if not shapes:
        raise ConfigError(f"shape subset {names!r} is empty")
    return shapes


def population_seeds(config: RunConfig, manifest: dict[str, Any]) -> list[Candidate]:
    """The members of the saved population ``config.seeds_from``, as seeds (recorded in
    ``manifest``)."""
    from evokernel.populations.saved import PopulationError, load

    try:
        population = load(str(config.seeds_from))
    except PopulationError as exc:
        raise ConfigError(f"seeds_from: {exc}") from None
    if population.workload != config.workload:
        raise ConfigError(f"seeds_from: {population.path} holds {population.workload} kernels, "
                          f"not {config.workload}")
    manifest["population"] = population.describe()
    return population.seeds()


def runtime_for(config: RunConfig) -> Runtime:
    """The runtime the config names, with its evaluator."""
    try:
        factory = evaluator_factory(config.evaluator.factory, config.workload, dict(config.evaluator.options))
    except ValueError as exc:
        raise ConfigError(f"evaluator.factory: {exc}") from None
    if config.runtime.kind == "local":
        return make_runtime("local", factory)
    rt = config.runtime
    return make_runtime("ray", factory, address=rt.address, num_cpus=rt.num_cpus,
                        object_store_mb=rt.object_store_mb,
                        evaluators=None if rt.evaluators == "auto" else rt.evaluators)


def default_run_dir(config: RunConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = config.strategy.rpartition(":")[2]
    return Path("runs") / f"{config.workload}-{name}-s{config.seed}-{stamp}"


# -- the run -----------------------------------------------------------------------------------

@dataclass
class Run:
    """A built run: call :meth:`run`, then :meth:`finish`; :meth:`close` in any case."""

    config: RunConfig
    workload: Any
    shapes: list[str]
    seeds: list[Candidate]
    directory: RunDir
    runtime: Runtime
    engine: Engine
    snapshot: dict[str, Any] | None
    services: RunServices
    owns_runtime: bool = True
    resumed: bool = False
    outputs: dict[str, Path] = field(default_factory=dict)
    finals: Finals | None = None
    """The finalists measured again (:meth:`measure_finalists`), once that has run."""

    def run(self) -> str:
        """Spend the budget; returns why the run stopped."""
        return self.engine.run()

    def measure_finalists(self) -> Finals | None:
        """Measure the run's best ``output.finalists`` candidates and its best seed again
        (``finalists.py``) and write ``finalists.json``; call it after :meth:`run`, before
        :meth:`finish`. None when ``output.finalists`` is 0 or no candidate passed."""
        (self.directory.root / FINALISTS_FILE).unlink(missing_ok=True)  # an earlier finish's
        count = self.config.output.finalists
        seed_ids = {s.id for s in self.seeds}
        chosen = pick(self.engine.ranked(), seed_ids, count) if count else []
        if not chosen:
            return None
        candidates = [(self.engine.candidates.get(cid) or self.directory.load_candidate(cid), fit)
                      for cid, fit in chosen]
        self.finals = measure(self.runtime, candidates, seed_ids, self.shapes, self.config.output.finalist_rounds)
        atomic_write(self.directory.root / FINALISTS_FILE, json.dumps(self.finals.to_json(), indent=1) + "\n")
        return self.finals

    def finish(self, reason: str) -> dict[str, Path]:
        """Write what a stopped run hands on: the exports (``export.export_run``) and
        ``summary.md`` (with the finalists, if :meth:`measure_finalists` ran); returns their
        paths by what they are."""
        from evokernel.analysis.export import export_run
        from evokernel.analysis.summary import write_summary

        definition = getattr(getattr(self.workload, "definition", None), "name", self.config.workload)
        confirmed = self.finals.best if self.finals is not None else None
        self.outputs = export_run(self.directory, definition, self.config.output.author, _axes(self.workload),
                                  best_id=confirmed.candidate_id if confirmed else None,
                                  finalists=self.finals is not None)
        if self.finals is not None:
            self.outputs["finalists"] = self.directory.root / FINALISTS_FILE
        self.outputs["summary"] = write_summary(
            self.engine, self.directory, reason=reason, top=self.config.output.top, shapes=self.shapes,
            outputs=dict(self.outputs), llm=self.llm_report(),
            finals=self.finals.lines() if self.finals is not None else ())
        return self.outputs

    def save_population(self, name: str) -> Path:
        """Save the run's best ``output.top`` candidates that passed (or were skipped) as
        ``populations/<name>`` (see ``populations/saved.py``), less any finalist that failed
        a fresh round; returns its file."""
        from evokernel.populations.saved import check_new, elites, save

        path = check_new(name)
        first: dict[str, Evaluation] = {}
        for record in self.directory.records():
            first.setdefault(record.candidate_id, record.evaluation)
        # a finalist that failed a fresh round (a race that passed once) is not kept
        failed = {f.candidate_id for f in self.finals.finalists if not f.confirmed} if self.finals else set()
        entries = [(self.directory.load_candidate(cid), ev) for cid, ev in first.items() if cid not in failed]
        m = self.directory.manifest
        source = {"run": str(self.directory.root), "strategy": m.get("strategy"), "seed": m.get("seed"),
                  "shapes": list(self.shapes), "evaluations": len(first), "command": command_line()}
        return save(path, elites(entries, self.config.output.top), workload=self.config.workload, source=source)

    def llm_report(self) -> list[str]:
        """Lines on the LLM operators' proposals and tokens (none for a built-in run)."""
        from evokernel.analysis.summary import llm_lines

        return llm_lines(self.directory, self.services.llm_operators)

    def close(self) -> None:
        """Release the run directory and, if the builder started it, the runtime."""
        self.directory.unlock()
        if self.owns_runtime:
            self.runtime.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build(
    config: RunConfig,
    *,
    resume: RunDir | None = None,
    runtime: Runtime | None = None,
    seeds: Sequence[Candidate] | None = None,
    shapes: Sequence[str] | None = None,
    allow_env_change: bool = False,
    observer: Observer | None = None,
    manifest: dict[str, Any] | None = None,
) -> Run:
    """A ready run: new from ``config`` or, with ``resume``, the run in that directory
    (``config`` from :func:`resumed_config`), locked until :meth:`Run.close`. ``seeds``
    and ``shapes`` replace the workload's (a comparison's landscape restricts them);
    ``runtime`` is used as given and left open; ``manifest`` adds keys to a new run's
    ``run.json``."""
    if resume is not None:
        resume.lock()
    rt: Runtime | None = None
    directory = resume
    try:
        config, notice, extra = _decide_llm(config, resume, dict(manifest or {}))
        cuda = cuda_available()
        if resume is None:
            config = config.resolved(cuda, evaluators=None)
        workload = load_workload(config)
        if shapes is None and resume is not None and isinstance(resume.manifest.get("shapes"), list):
            shapes = resume.manifest["shapes"]  # the very shapes it ran on (a comparison gives a list)
        shapes = list(shapes) if shapes is not None else resolve_shapes(workload, config.shapes)
        if resume is not None:
            seeds = [resume.load_candidate(c) for c in resume.seed_ids()]
        elif seeds is None and config.seeds_from:
            seeds = population_seeds(config, extra)
        seeds = list(seeds) if seeds is not None else list(workload.seeds())
        if not seeds:
            raise ConfigError(f"workload {config.workload} has no seed candidates")
        rt = runtime if runtime is not None else runtime_for(config)
        if resume is None:
            config = config.resolved(cuda, evaluators=rt.n_evaluators)
            root = Path(config.run_dir) if config.run_dir else default_run_dir(config)
            config = config.model_copy(update={"run_dir": str(root)})
            head = {"workload": config.workload, "strategy": config.strategy, "seed": config.seed,
                    "seeds": [s.id for s in seeds], "shapes": shapes, **extra}
            directory = RunDir.create(root, cfgmod.dump(config), head, seeds, lock=True)
        assert directory is not None
        run = _assemble(config, workload, shapes, seeds, directory, rt, llm=notice is None,
                        allow_env_change=allow_env_change, observer=observer, resumed=resume is not None)
        run.owns_runtime = runtime is None
        if resume is not None:
            atomic_write(directory.config_path, yaml.safe_dump(cfgmod.dump(config), sort_keys=False))
            logger.info("%s", resume_note(run))
        return run
    except BaseException:
        if directory is not None:
            directory.unlock()
            if resume is None:  # made by this call and never run: nothing in it is worth keeping
                shutil.rmtree(directory.root, ignore_errors=True)
        if rt is not None and runtime is None:
            rt.close()
        raise


def _decide_llm(config: RunConfig, resume: RunDir | None,
                extra: dict[str, Any]) -> tuple[RunConfig, str | None, dict[str, Any]]:
    """The config to run with, the notice to show (None: the LLM operators can run, or
    none are configured) and what a new run's manifest records of it."""
    if resume is None:
        requested = config.operators.kind
        config, notice = with_llm_decided(config)
        if notice:
            extra["operators"] = {"requested": requested, "used": config.operators.kind,
                                  "why": notice.splitlines()[0]}
    else:
        check(config)
        notice = llm_problem(config, resume.root)
        if notice and not config.llm.fallback_to_builtin:
            raise LLMUnavailable(notice)
    if notice:
        logger.warning("%s", notice)
    return config, notice, extra


def _assemble(config: RunConfig, workload: Any, shapes: list[str], seeds: list[Candidate], directory: RunDir,
              runtime: Runtime, *, llm: bool, allow_env_change: bool, observer: Observer | None,
              resumed: bool) -> Run:
    snapshot = directory.latest_snapshot()
    services = RunServices()
    if config.operators.kind != "builtin":
        if resumed:  # the cut-short generations ask again (answered from the recording)
            asked = snapshot["generation"] + _batches_ahead(snapshot) if snapshot else -1
            OutcomeLog(directory.llm_outcomes_path).trim(asked)
        if llm:
            services = llm_services(config, directory, workload, shapes, runtime)
    env = StrategyEnv(seeds=seeds, seed=config.seed, workload=config.workload, host=runtime.host,
                      run_dir=directory.root, services=services)
    if snapshot is not None:
        try:
            strategy = strategy_from_state(snapshot["strategy"], env, config.strategy)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise RunDirError(f"the snapshot of generation {snapshot['generation']} in {directory.root} does not "
                              f"hold a valid {config.strategy} state ({_why(exc)})") from None
    else:
        cls = strategy_class(config.strategy)
        try:
            strategy = cls(env, **{**cls.options_from(config), **config.strategy_options})
        except (TypeError, ValueError) as exc:  # an option the strategy does not take, or a bad value
            raise ConfigError(f"strategy {config.strategy}: {_why(exc)}") from None
    batch = config.batch_size
    assert isinstance(batch, int), "resolve the config first"
    engine = Engine(strategy, runtime, directory, seeds, shapes, budget_of(config), batch,
                    max_stall=config.max_stall, allow_env_change=allow_env_change, observer=observer,
                    lookahead=1 if config.pipeline is True else 0)
    try:
        engine.restore(snapshot)
    except (KeyError, ValueError, TypeError) as exc:
        raise RunDirError(f"the snapshot in {directory.root} is corrupt: {_why(exc)}") from None
    services.evaluation_of = engine.cache.get
    engine.check_environment(runtime.fingerprint())
    return Run(config, workload, shapes, seeds, directory, runtime, engine, snapshot, services,
               resumed=resumed)


def resume_note(run: Run) -> str:
    """What a resumed run continues, and from where."""
    m, engine, budget = run.directory.manifest, run.engine, run.engine.budget
    journaled = run.directory.next_seq
    limits = [f"{budget.evaluations} evaluations" if budget.evaluations is not None else "",
              f"{budget.device_s:g} device seconds" if budget.device_s is not None else ""]
    where = ("from its start (no generation had ended)" if run.snapshot is None else
             f"after generation {run.snapshot['generation']}")
    replayed = journaled - (run.snapshot["journal_seq"] if run.snapshot else 0)
    return (f"resuming {run.directory.root} ({m.get('workload')}, {m.get('strategy')}, seed {m.get('seed')}) "
            f"{where}: {journaled} evaluations journaled, {engine.state.spent.evaluations} spent at that "
            f"snapshot; {replayed} later ones are taken from the journal, not run again; budget "
            f"{' and '.join(x for x in limits if x)}")


def _batches_ahead(snapshot: dict[str, Any]) -> int:
    """How many generations after the snapshot's were already asked when it was written."""
    ahead = snapshot.get("ahead") or []
    return 1 if ahead and isinstance(ahead[0], str) else len(ahead)


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if isinstance(exc, KeyError) or not text else text


def _axes(workload: Any) -> dict[str, dict[str, int]]:
    axes: dict[str, dict[str, int]] = {}
    if hasattr(workload, "axes_of"):
        for sid in getattr(workload, "shapes", {}):
            try:
                axes[sid] = dict(workload.axes_of(sid))
            except Exception:
                break
    return axes
