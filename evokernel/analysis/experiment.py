"""One search run built from a resolved config, and many of them in parallel on Ray.

A comparison is many ordinary runs: each (strategy, seed) goes through the same
``Engine`` loop that ``python -m evokernel.search`` uses, with its evaluator in the
same process (a ``LocalRuntime``), writing an ordinary run directory. Runs share
nothing, so running them as separate Ray tasks, in any order, changes no number.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from evokernel.candidate import Candidate
from evokernel.config import RunConfig


class RunSpec(BaseModel):
    """Everything one run needs: its resolved config, seeds and shapes."""

    model_config = ConfigDict(frozen=True)

    config: dict[str, Any]
    seeds: list[Candidate]
    shapes: list[str]

    @property
    def run_config(self) -> RunConfig:
        return RunConfig.model_validate(self.config)


class RunOutcome(BaseModel):
    strategy: str
    seed: int
    run_dir: str
    stop_reason: str
    evaluations: int
    device_s: float
    unseen: int
    """Proposed candidates the replay evaluator had no record of (0 on a full grid)."""
    wall_s: float


def run_one(spec: RunSpec) -> RunOutcome:
    """Run one search to its budget in this process; the run directory must not exist yet."""
    from evokernel.run import build

    started = time.perf_counter()
    config = spec.run_config
    with build(config, seeds=spec.seeds, shapes=spec.shapes) as run:
        reason = run.run()
        run.finish(reason)
        unseen = len(getattr(getattr(run.runtime, "evaluator", None), "unseen", ()))
        spent = run.engine.state.spent
    return RunOutcome(strategy=config.strategy, seed=config.seed, run_dir=str(run.directory.root),
                      stop_reason=reason, evaluations=spent.evaluations, device_s=spent.device_s,
                      unseen=unseen, wall_s=time.perf_counter() - started)


Done = Callable[[RunOutcome], None]


def run_all(specs: Sequence[RunSpec], runtime: str = "ray", parallel: int | None = None,
            on_done: Done | None = None) -> list[RunOutcome]:
    """Every spec, in order of the specs; ``ray``: one task per run, ``parallel`` at a time."""
    notify = on_done or (lambda outcome: None)
    if runtime == "local":
        outcomes = []
        for spec in specs:
            outcomes.append(run_one(spec))
            notify(outcomes[-1])
        return outcomes
    if runtime != "ray":
        raise ValueError(f"unknown runtime {runtime!r}; choose 'ray' or 'local'")
    return _run_on_ray(specs, parallel or os.cpu_count() or 1, notify)


def _run_on_ray(specs: Sequence[RunSpec], parallel: int, notify: Done) -> list[RunOutcome]:
    import ray

    root = str(Path(__file__).resolve().parent.parent)
    started = False
    if not ray.is_initialized():
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        ray.init(address="local", num_cpus=parallel, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, object_store_memory=128 * 2**20,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
        started = True
    try:
        task = ray.remote(run_one).options(num_cpus=1, max_retries=0)
        pending = {task.remote(spec): i for i, spec in enumerate(specs)}
        outcomes: dict[int, RunOutcome] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done[0])
            outcomes[i] = ray.get(done[0])
            notify(outcomes[i])
        return [outcomes[i] for i in range(len(specs))]
    finally:
        if started:
            ray.shutdown()
