"""The one search loop every strategy runs under.

    seeds -> evaluate -> loop { ask, evaluate (batched through the runtime), tell,
                                journal, snapshot } until the budget is spent

Budget is counted in evaluations or device seconds. A candidate already evaluated
in this run (same id) costs nothing: the cached evaluation is told again. Every
evaluation is journaled the moment it arrives; after each generation, when every
asked candidate has been told, the strategy's and the engine's state are
snapshotted. Resuming restores the last snapshot and replays the journal lines
written after it (the generation that was cut short) without evaluating them
again, so an interrupted run continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.journal import RunDir
from evokernel.runtime import Runtime
from evokernel.strategies import Strategy


class EnvironmentChanged(Exception):
    """A resumed run landed on a different machine, driver or torch than it started on."""


@dataclass(frozen=True)
class Budget:
    evaluations: int | None = None
    device_s: float | None = None

    def __post_init__(self) -> None:
        if self.evaluations is None and self.device_s is None:
            raise ValueError("a budget needs evaluations or device seconds")

    def left(self, spent: Spent) -> float:
        """What is left, in the budget's own unit (evaluations first if both are set)."""
        lefts = []
        if self.evaluations is not None:
            lefts.append(float(self.evaluations - spent.evaluations))
        if self.device_s is not None:
            lefts.append(self.device_s - spent.device_s)
        return max(0.0, min(lefts))

    def spent_by(self, spent: Spent) -> bool:
        if self.evaluations is not None and spent.evaluations >= self.evaluations:
            return True
        return self.device_s is not None and spent.device_s >= self.device_s


@dataclass
class Spent:
    evaluations: int = 0
    device_s: float = 0.0

    def charge(self, evaluation: Evaluation) -> None:
        self.evaluations += 1
        self.device_s += evaluation.device_s


@dataclass
class Event:
    """What the progress display hears about."""

    kind: str  # "evaluated" | "cached" | "generation" | "done"
    generation: int
    spent: Spent
    budget: Budget
    candidate: Candidate | None = None
    evaluation: Evaluation | None = None
    best: Evaluation | None = None


Observer = Callable[[Event], None]


@dataclass
class EngineState:
    generation: int = -1
    """Last generation fully told and snapshotted; -1 before the seeds."""
    spent: Spent = field(default_factory=Spent)
    stall: int = 0


class Engine:
    def __init__(
        self,
        strategy: Strategy,
        runtime: Runtime,
        run: RunDir,
        seeds: Sequence[Candidate],
        shapes: Sequence[str],
        budget: Budget,
        batch_size: int,
        *,
        max_stall: int = 20,
        allow_env_change: bool = False,
        observer: Observer | None = None,
    ) -> None:
        self.strategy = strategy
        self.runtime = runtime
        self.run_dir = run
        self.seeds = list(seeds)
        self.shapes = list(shapes)
        self.budget = budget
        self.batch_size = batch_size
        self.max_stall = max_stall
        self.allow_env_change = allow_env_change
        self.observer = observer or (lambda event: None)
        self.state = EngineState()
        self.cache: dict[str, Evaluation] = {}
        self.candidates: dict[str, Candidate] = {}
        self._replay: dict[str, Evaluation] = {}
        self._env_checked = False
        self.stop_reason = ""

    # -- resume ----------------------------------------------------------------------
    def restore(self, snapshot: dict[str, Any] | None) -> None:
        """Load the engine's part of a snapshot and rebuild the evaluation cache."""
        records = self.run_dir.records()
        upto = 0
        if snapshot is not None:
            eng = snapshot["engine"]
            self.state = EngineState(
                generation=snapshot["generation"],
                spent=Spent(**snapshot["spent"]),
                stall=eng["stall"],
            )
            upto = snapshot["journal_seq"]
        for record in records:
            target = self.cache if record.seq < upto else self._replay
            target.setdefault(record.candidate_id, record.evaluation)

    # -- loop ------------------------------------------------------------------------
    def run(self) -> str:
        self.check_environment(self.runtime.fingerprint())
        if self.state.generation < 0:
            self._generation(0, self.seeds)
        while True:
            if self.budget.spent_by(self.state.spent):
                self.stop_reason = "budget spent"
                break
            if self.state.stall >= self.max_stall:
                self.stop_reason = f"no new candidate in {self.max_stall} generations"
                break
            n = self.batch_size
            if self.budget.evaluations is not None:
                n = min(n, self.budget.evaluations - self.state.spent.evaluations)
            self.strategy.budget_left = self.budget.left(self.state.spent)
            batch = self.strategy.ask(n)
            self._generation(self.state.generation + 1, batch)
        self.observer(Event("done", self.state.generation, self.state.spent, self.budget, best=self._best()))
        return self.stop_reason

    def _generation(self, generation: int, batch: Sequence[Candidate]) -> None:
        results: list[Evaluation | None] = [None] * len(batch)
        todo: list[int] = []
        fresh = 0
        for i, cand in enumerate(batch):
            self.candidates.setdefault(cand.id, cand)
            if cand.id in self.cache or any(batch[j].id == cand.id for j in todo):
                continue
            if cand.id in self._replay:  # journaled before a kill: charge it, don't redo it
                evaluation = self._replay.pop(cand.id)
                self._accept(cand, evaluation)
                fresh += 1
                continue
            todo.append(i)
        for k, evaluation in self.runtime.evaluate([batch[i] for i in todo], self.shapes):
            i = todo[k]
            self.check_environment(evaluation.environment)
            self.run_dir.append(generation, i, batch[i], evaluation)
            self._accept(batch[i], evaluation)
            fresh += 1
            self.observer(Event("evaluated", generation, self.state.spent, self.budget, batch[i], evaluation, self._best()))
        for i, cand in enumerate(batch):
            results[i] = self.cache[cand.id]
            self.strategy.tell(cand, self.cache[cand.id])
        self.state.generation = generation
        self.state.stall = 0 if fresh else self.state.stall + 1
        self._snapshot()
        self.observer(Event("generation", generation, self.state.spent, self.budget, best=self._best()))

    def _accept(self, candidate: Candidate, evaluation: Evaluation) -> None:
        self.cache[candidate.id] = evaluation
        self.state.spent.charge(evaluation)

    def _snapshot(self) -> None:
        seq = self.run_dir.next_seq
        self.run_dir.write_snapshot(
            self.state.generation,
            {
                "journal_seq": seq,
                "spent": {"evaluations": self.state.spent.evaluations, "device_s": self.state.spent.device_s},
                "engine": {"stall": self.state.stall},
                "strategy": self.strategy.state(),
            },
        )

    def check_environment(self, env: dict[str, str] | None) -> None:
        if self._env_checked or not env:
            return
        stored = self.run_dir.environment
        if stored and stored != env:
            diff = ", ".join(
                f"{k}: {stored.get(k)!r} -> {env.get(k)!r}"
                for k in sorted(set(stored) | set(env))
                if stored.get(k) != env.get(k)
            )
            if not self.allow_env_change:
                raise EnvironmentChanged(
                    f"this run was measured on a different environment ({diff}); "
                    "its fitness values are not comparable. Pass --allow-env-change to continue anyway"
                )
        if stored != env:
            self.run_dir.set_environment(env)
        self._env_checked = True

    # -- results ---------------------------------------------------------------------
    def _best(self) -> Evaluation | None:
        if not self.cache:
            return None
        return max(self.cache.values(), key=lambda e: e.rank_key())

    def ranked(self) -> list[tuple[str, Evaluation]]:
        """Every evaluated candidate id, best first (ties: earlier first)."""
        order = {cid: i for i, cid in enumerate(self.cache)}
        return sorted(self.cache.items(), key=lambda kv: (tuple(-x for x in kv[1].rank_key()), order[kv[0]]))


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
