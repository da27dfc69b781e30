"""The elite archive (hall of fame): the best candidates ever seen, on DEAP's HallOfFame."""

from __future__ import annotations

import numpy as np
from deap import tools

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.populations._deap import Individual
from evokernel.populations.base import Entry, State, dump_entry, load_entry, register


def _same(a: Individual, b: Individual) -> bool:
    return a.candidate.id == b.candidate.id


class EliteArchive:
    """Best ``size`` candidates by rank; selection is uniform over the elites."""

    kind = "archive"

    def __init__(self, size: int = 10) -> None:
        if size < 1:
            raise ValueError("archive size must be >= 1")
        self.size = size
        self._hof = tools.HallOfFame(size, similar=_same)

    def add(self, candidate: Candidate, evaluation: Evaluation) -> bool:
        ind = Individual(candidate, evaluation)
        self._hof.update([ind])
        return any(_same(ind, m) for m in self._hof)

    def select(self, k: int, rng: np.random.Generator) -> list[Candidate]:
        if len(self._hof) == 0 or k <= 0:
            return []
        picks = rng.integers(len(self._hof), size=k)
        return [self._hof[int(i)].candidate for i in picks]

    def best(self) -> Entry | None:
        top = self.top(1)
        return top[0] if top else None

    def top(self, k: int) -> list[Entry]:
        return [(m.candidate, m.evaluation) for m in list(self._hof)[:k]]

    def __len__(self) -> int:
        return len(self._hof)

    def state(self) -> State:
        return {"kind": self.kind, "size": self.size, "members": [dump_entry(*e) for e in self.top(self.size)]}

    @classmethod
    def from_state(cls, state: State) -> EliteArchive:
        archive = cls(state["size"])
        # HallOfFame puts a newcomer before equal-ranked members: insert worst first
        # so that ties come back in their saved order.
        for data in reversed(state["members"]):
            archive._hof.insert(Individual(*load_entry(data)))
        return archive


register(EliteArchive.kind, EliteArchive.from_state)
