"""The one search loop every strategy runs under.

    seeds (generation 0) -> loop { ask, evaluate (streamed through the runtime), tell,
                                   journal, snapshot } until the budget is spent

Pipelining is how far ``ask`` may run ahead of ``tell``: with ``lookahead`` L,
generation g is asked as soon as generation g - 1 - L has been told (and never before
the seeds, generation 0, are). L = 0 is the generational barrier: every generation is
told before the next is asked. L = 1 lets the next generation's candidates queue
behind the current ones, so evaluators never wait for a generation's slowest
evaluation; the strategy then chooses with results one generation old.

Every decision happens at a fixed point of the sequence of tells, never at a moment
that depends on timing: after each result, the engine first asks every generation
that is due, then tells the oldest generation if all of its results are in (and, after
that tell, asks again before telling the next). Results are told in the order asked,
generation by generation, whatever order they arrive in. The budget that decides an
ask counts what is committed (evaluations in flight included; device seconds of the
told generations), so it too does not depend on arrival order.

Budget is counted in evaluations or device seconds. A candidate already evaluated
in this run (same id) costs nothing: the cached evaluation is told again. Every
evaluation is journaled the moment it arrives; after each generation is told, the
strategy's and the engine's state are snapshotted, with the batches already asked
for the generations after it. Resuming restores the last snapshot, reopens those
batches, and takes the results journaled after it from the journal instead of
evaluating them again, so an interrupted run continues exactly as an uninterrupted
one would, wherever it was killed.
"""

from __future__ import annotations

import logging
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

logger = logging.getLogger(__name__)


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

    kind: str  # "evaluated" | "generation" | "done"
    generation: int
    spent: Spent
    budget: Budget
    candidate: Candidate | None = None
    evaluation: Evaluation | None = None
    best: Evaluation | None = None


Observer = Callable[[Event], None]


@dataclass
class _OpenGeneration:
    """A generation asked but not yet told."""

    batch: list[Candidate]
    waiting: set[int] = field(default_factory=set)
    fresh: int = 0
    device_s: float = 0.0
    """Device seconds charged for this generation's own evaluations."""


@dataclass
class EngineState:
    generation: int = -1
    """Last generation fully told and snapshotted; -1 before the seeds."""
    spent: Spent = field(default_factory=Spent)
    stall: int = 0
    told_device_s: float = 0.0
    """Device seconds of the generations told so far (what a device budget decides on)."""


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
        lookahead: int = 0,
    ) -> None:
        if lookahead < 0:
            raise ValueError("lookahead must be >= 0")
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
        self.lookahead = lookahead
        self.state = EngineState()
        self.cache: dict[str, Evaluation] = {}
        self.candidates: dict[str, Candidate] = {}
        self.stop_reason = ""
        self._replay: dict[str, Evaluation] = {}
        self._order: dict[str, int] = {}
        """Journal sequence number of each evaluated candidate (ties in ``ranked``)."""
        self._env_checked = False
        self._open: dict[int, _OpenGeneration] = {}
        self._journaled_in: dict[str, int] = {}
        """Generation each restored evaluation was journaled in."""
        self._ahead: list[list[Candidate]] = []
        """Batches asked before the restored snapshot was written, oldest first."""

    # -- resume ----------------------------------------------------------------------
    def restore(self, snapshot: dict[str, Any] | None) -> None:
        """Load the engine's part of a snapshot and rebuild the evaluation cache."""
        upto = 0
        if snapshot is not None:
            eng = snapshot["engine"]
            spent = Spent(**snapshot["spent"])
            self.state = EngineState(generation=snapshot["generation"], spent=spent, stall=eng["stall"],
                                     told_device_s=eng.get("told_device_s", spent.device_s))
            upto = snapshot["journal_seq"]
            ahead = snapshot.get("ahead") or []
            if ahead and isinstance(ahead[0], str):  # format of the first pipelined runs: one batch
                ahead = [ahead]
            self._ahead = [[self.run_dir.load_candidate(cid) for cid in batch] for batch in ahead]
        for record in self.run_dir.records():
            target = self.cache if record.seq < upto else self._replay
            target.setdefault(record.candidate_id, record.evaluation)
            self._order.setdefault(record.candidate_id, record.seq)
            self._journaled_in.setdefault(record.candidate_id, record.generation)

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> str:
        """Spend the budget; returns why the run stopped."""
        self.check_environment(self.runtime.fingerprint())
        work: Work = deque()
        if self.state.generation < 0 and not self._ahead:
            self._open_generation(0, self.seeds, work)
        for batch in self._ahead:
            self._open_generation(self.state.generation + 1 + len(self._open), batch, work)
        self._ahead = []
        self._advance(work)
        for (generation, i), evaluation in self.runtime.evaluate_stream(work, self.shapes):
            opened = self._open[generation]
            cand = opened.batch[i]
            self.check_environment(evaluation.environment)
            self._order[cand.id] = self.run_dir.append(generation, i, cand, evaluation)
            self._accept(opened, cand, evaluation)
            opened.waiting.discard(i)
            self.observer(Event("evaluated", generation, self.state.spent, self.budget, cand, evaluation,
                                self._best()))
            self._advance(work)
        self.stop_reason = self.stop_reason or "budget spent"
        self.observer(Event("done", self.state.generation, self.state.spent, self.budget, best=self._best()))
        return self.stop_reason

    def _advance(self, work: Work) -> None:
        """Ask every generation that is due, then tell the oldest if it is complete; repeat."""
        while True:
            while self._ask_due(work):
                pass
            generation = self.state.generation + 1
            opened = self._open.get(generation)
            if opened is None or opened.waiting or any(c.id not in self.cache for c in opened.batch):
                return  # still evaluating (or waiting for a duplicate in flight elsewhere)
            self._tell(generation, opened)

    def _ask_due(self, work: Work) -> bool:
        """Ask the next generation if it is due and the run goes on; True if it was asked."""
        if self.stop_reason or self.state.generation < 0 or len(self._open) > self.lookahead:
            return False
        committed = Spent(self.state.spent.evaluations + self._in_flight(), self.state.told_device_s)
        if self.budget.spent_by(committed):
            self.stop_reason = "budget spent"
            return False
        if self.state.stall >= self.max_stall:
            self.stop_reason = f"no new candidate in {self.max_stall} generations"
            return False
        n = self.batch_size
        if self.budget.evaluations is not None:
            n = min(n, self.budget.evaluations - committed.evaluations)
        generation = self.state.generation + 1 + len(self._open)
        self.strategy.on_budget(self.budget.left(committed))
        self._open_generation(generation, self.strategy.ask(n), work)
        return True

    def _open_generation(self, generation: int, batch: Sequence[Candidate], work: Work) -> None:
        opened = _OpenGeneration(list(batch))
        self._open[generation] = opened
        for i, cand in enumerate(opened.batch):
            self.candidates.setdefault(cand.id, cand)
            if cand.id in self.cache or self._queued(cand.id):
                # evaluated for this very generation before the snapshot: it was fresh then
                opened.fresh += cand.id in self.cache and self._journaled_in.get(cand.id) == generation
                continue
            if cand.id in self._replay:  # journaled after the snapshot: charge it, don't redo it
                self._accept(opened, cand, self._replay.pop(cand.id))
                continue
            opened.waiting.add(i)
            work.append(((generation, i), cand))

    def _queued(self, candidate_id: str) -> bool:
        return any(g.batch[i].id == candidate_id for g in self._open.values() for i in g.waiting)

    def _in_flight(self) -> int:
        return sum(len(g.waiting) for g in self._open.values())

    def _accept(self, opened: _OpenGeneration, candidate: Candidate, evaluation: Evaluation) -> None:
        self.cache[candidate.id] = evaluation
        self.state.spent.charge(evaluation)
        opened.fresh += 1
        opened.device_s += evaluation.device_s

    def _tell(self, generation: int, opened: _OpenGeneration) -> None:
        del self._open[generation]
        for cand in opened.batch:
            self.strategy.tell(cand, self.cache[cand.id])
        self.strategy.on_generation_end(generation)
        self.state.generation = generation
        self.state.stall = 0 if opened.fresh else self.state.stall + 1
        self.state.told_device_s += opened.device_s
        self._snapshot()
        logger.debug("generation %d told: %d candidates, %d new; %d evaluations spent", generation,
                     len(opened.batch), opened.fresh, self.state.spent.evaluations)
        self.observer(Event("generation", generation, self.state.spent, self.budget, best=self._best()))

    def _snapshot(self) -> None:
        ahead = [self._open[g].batch for g in sorted(self._open)]
        for batch in ahead:  # named before they are evaluated: their sources must be on disk
            for cand in batch:
                self.run_dir.write_source(cand)
        self.run_dir.write_snapshot(self.state.generation, {
            "journal_seq": self.run_dir.next_seq,
            "spent": {"evaluations": self.state.spent.evaluations, "device_s": self.state.spent.device_s},
            "engine": {"stall": self.state.stall, "told_device_s": self.state.told_device_s},
            "strategy": self.strategy.state(),
            "ahead": [[c.id for c in batch] for batch in ahead],
        })

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
        """Every evaluated candidate id, best first (ties: journaled earlier first)."""
        return sorted(self.cache.items(),
                      key=lambda kv: (tuple(-x for x in kv[1].rank_key()), self._order.get(kv[0], 0)))


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
