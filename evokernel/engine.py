"""The one search loop every strategy runs under.

    seeds -> evaluate -> loop { ask, evaluate (batched through the runtime), tell,
                                journal, snapshot } until the budget is spent

With ``pipeline`` on, generations overlap by one: generation g+1 is asked as soon as
g-1 has been told, and its candidates queue behind g's, so evaluators never wait
for the slowest evaluation of a generation (the barrier a multi-GPU run otherwise
pays at every generation). The strategy then chooses with results one generation
old. Every decision still happens at a fixed point of the sequence of tells, never
at a moment that depends on timing, so a run stays reproducible and resumable: the
snapshot after g also holds g+1's candidates, which a resumed run puts back in the
queue.

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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.journal import RunDir, RunDirError
from evokernel.runtime import Runtime, Work
from evokernel.strategies import Strategy


class EnvironmentChanged(RunDirError):
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
class _OpenGeneration:
    """A generation asked but not yet told (pipelined runs hold at most two)."""

    batch: list[Candidate]
    waiting: set[int]
    fresh: int = 0


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
        pipeline: bool = False,
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
        self.pipeline = pipeline
        self.state = EngineState()
        self.cache: dict[str, Evaluation] = {}
        self.candidates: dict[str, Candidate] = {}
        self._replay: dict[str, Evaluation] = {}
        self._env_checked = False
        self.stop_reason = ""
        self._open: dict[int, _OpenGeneration] = {}
        self._journaled_in: dict[str, int] = {}
        """Generation each restored evaluation was journaled in (pipelined resume)."""
        self._ahead: list[Candidate] = []
        """The next generation's batch, restored from a pipelined snapshot."""

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
            self._ahead = [self.run_dir.load_candidate(cid) for cid in snapshot.get("ahead", [])]
        for record in records:
            target = self.cache if record.seq < upto else self._replay
            target.setdefault(record.candidate_id, record.evaluation)
            self._journaled_in.setdefault(record.candidate_id, record.generation)

    # -- loop ------------------------------------------------------------------------
    def run(self) -> str:
        self.check_environment(self.runtime.fingerprint())
        if self.state.generation < 0:
            self._generation(0, self.seeds)
        if self.pipeline:
            self._run_pipelined()
            self.observer(Event("done", self.state.generation, self.state.spent, self.budget, best=self._best()))
            return self.stop_reason
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
            self.strategy.on_budget(self.budget.left(self.state.spent))
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
        self.strategy.on_generation_end(generation)
        self.state.generation = generation
        self.state.stall = 0 if fresh else self.state.stall + 1
        self._snapshot()
        self.observer(Event("generation", generation, self.state.spent, self.budget, best=self._best()))

    # -- the pipelined loop -------------------------------------------------------------
    def _run_pipelined(self) -> None:
        work: Work = deque()
        if self._ahead:
            self._open_generation(self.state.generation + 1, self._ahead, work)
            self._ahead = []
        self._close_ready()
        self._ask_ahead(work)
        for (generation, i), evaluation in self.runtime.evaluate_stream(work, self.shapes):
            cand = self._open[generation].batch[i]
            self.check_environment(evaluation.environment)
            self.run_dir.append(generation, i, cand, evaluation)
            self._accept(cand, evaluation)
            self._open[generation].waiting.discard(i)
            self._open[generation].fresh += 1
            self.observer(Event("evaluated", generation, self.state.spent, self.budget, cand, evaluation, self._best()))
            self._close_ready()
            self._ask_ahead(work)
        if not self.stop_reason:
            self.stop_reason = "budget spent"

    def _ask_ahead(self, work: Work) -> None:
        """Open generations until two are open, or the budget or the stall says stop."""
        while len(self._open) < 2:
            in_flight = sum(len(g.waiting) for g in self._open.values())
            if self.budget.spent_by(self.state.spent):
                self.stop_reason = self.stop_reason or "budget spent"
                return
            if self.state.stall >= self.max_stall:
                self.stop_reason = f"no new candidate in {self.max_stall} generations"
                return
            n = self.batch_size
            if self.budget.evaluations is not None:
                n = min(n, self.budget.evaluations - self.state.spent.evaluations - in_flight)
            if n <= 0:
                return  # what is in flight spends the rest
            generation = self.state.generation + 1 + len(self._open)
            self.strategy.on_budget(self.budget.left(self.state.spent))
            self._open_generation(generation, self.strategy.ask(n), work)
            self._close_ready()

    def _open_generation(self, generation: int, batch: Sequence[Candidate], work: Work) -> None:
        opened = _OpenGeneration(list(batch), set())
        self._open[generation] = opened
        queued: set[str] = set()
        for i, cand in enumerate(batch):
            self.candidates.setdefault(cand.id, cand)
            if cand.id in self.cache or cand.id in queued or self._in_flight(cand.id):
                # evaluated for this very generation before a stop: it was fresh then
                opened.fresh += cand.id in self.cache and self._journaled_in.get(cand.id) == generation
                continue
            if cand.id in self._replay:  # journaled before a kill: charge it, don't redo it
                self._accept(cand, self._replay.pop(cand.id))
                opened.fresh += 1
                continue
            queued.add(cand.id)
            opened.waiting.add(i)
            work.append(((generation, i), cand))

    def _in_flight(self, candidate_id: str) -> bool:
        return any(g.batch[i].id == candidate_id for g in self._open.values() for i in g.waiting)

    def _close_ready(self) -> None:
        """Tell every oldest generation whose evaluations have all arrived, in order."""
        while (generation := self.state.generation + 1) in self._open:
            opened = self._open[generation]
            if opened.waiting or any(c.id not in self.cache for c in opened.batch):
                return  # a duplicate of a candidate still in flight in the other generation
            del self._open[generation]
            for cand in opened.batch:
                self.strategy.tell(cand, self.cache[cand.id])
            self.strategy.on_generation_end(generation)
            self.state.generation = generation
            self.state.stall = 0 if opened.fresh else self.state.stall + 1
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
                **({"ahead": self._ahead_ids()} if self.pipeline else {}),
            },
        )

    def _ahead_ids(self) -> list[str]:
        """The next generation's batch: asked already, so its ask is in the strategy state."""
        opened = self._open.get(self.state.generation + 1)
        if opened is None:
            return []
        for cand in opened.batch:  # named before it is evaluated: its source must be on disk
            self.run_dir.write_source(cand)
        return [c.id for c in opened.batch]

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
