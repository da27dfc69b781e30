"""A fixed-size pool with DEAP tournament selection: the population of one island."""

from __future__ import annotations

import numpy as np
from deap import tools

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.populations._deap import Individual
from evokernel.populations.base import Entry, State, deap_random, dump_entry, load_entry, register


class TournamentPool:
    """Keeps the ``capacity`` best candidates (ties: the older stays); tournament select."""

    kind = "pool"

    def __init__(self, capacity: int = 16, tournament_size: int = 3) -> None:
        if capacity < 1 or tournament_size < 1:
            raise ValueError("capacity and tournament_size must be >= 1")
        self.capacity = capacity
        self.tournament_size = tournament_size
        self._members: list[Individual] = []  # best first

    def add(self, candidate: Candidate, evaluation: Evaluation) -> bool:
        if any(m.candidate.id == candidate.id for m in self._members):
            return False
        new = Individual(candidate, evaluation)
        key = evaluation.rank_key()
        at = next(
            (i for i, m in enumerate(self._members) if key > m.evaluation.rank_key()),
            len(self._members),
        )
        self._members.insert(at, new)
        del self._members[self.capacity :]
        return new in self._members

    def select(self, k: int, rng: np.random.Generator) -> list[Candidate]:
        if not self._members or k <= 0:
            return []
        size = min(self.tournament_size, len(self._members))
        with deap_random(rng):
            chosen = tools.selTournament(self._members, k, tournsize=size)
        return [ind.candidate for ind in chosen]

    def best(self) -> Entry | None:
        return (self._members[0].candidate, self._members[0].evaluation) if self._members else None

    def top(self, k: int) -> list[Entry]:
        return [(m.candidate, m.evaluation) for m in self._members[:k]]

    def __len__(self) -> int:
        return len(self._members)

    def state(self) -> State:
        return {
            "kind": self.kind,
            "capacity": self.capacity,
            "tournament_size": self.tournament_size,
            "members": [dump_entry(m.candidate, m.evaluation) for m in self._members],
        }

    @classmethod
    def from_state(cls, state: State) -> TournamentPool:
        pool = cls(state["capacity"], state["tournament_size"])
        pool._members = [Individual(*load_entry(e)) for e in state["members"]]
        return pool


register(TournamentPool.kind, TournamentPool.from_state)
