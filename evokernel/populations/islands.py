"""Islands: several populations evolving apart, with ring migration every N generations.

Each island is any ``Population`` (in the Ray runtime, a proxy to an actor), so
islands can live in different processes. This coordinator stays in the strategy:
it routes each child home to its parent's island and moves migrants around the ring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.populations.base import Entry, Population, State, population_from_state

Host = Callable[[Callable[[], Population]], Population]
"""Turns a population builder into a live population (in-process, or inside an actor)."""


def in_process(build: Callable[[], Population]) -> Population:
    return build()


class Islands:
    """A ring of island populations, also usable as one ``Population``."""

    kind = "islands"

    def __init__(
        self,
        islands: Sequence[Population],
        migration_interval: int = 5,
        migrants: int = 1,
    ) -> None:
        if not islands:
            raise ValueError("need at least one island")
        self.islands = list(islands)
        self.migration_interval = migration_interval
        self.migrants = migrants
        self._home: dict[str, int] = {}
        self._next = 0  # round-robin for candidates with no known home (the seeds)

    def __len__(self) -> int:
        return sum(len(i) for i in self.islands)

    def home_of(self, candidate: Candidate) -> int:
        for cid in (candidate.id, *candidate.parents):
            if cid in self._home:
                return self._home[cid]
        island = self._next % len(self.islands)
        self._next += 1
        return island

    def assign(self, candidate: Candidate, island: int) -> None:
        """Say where a proposed child belongs before it is evaluated."""
        self._home.setdefault(candidate.id, island)

    def add(self, candidate: Candidate, evaluation: Evaluation, island: int | None = None) -> bool:
        where = self.home_of(candidate) if island is None else island
        self._home.setdefault(candidate.id, where)
        return self.islands[where].add(candidate, evaluation)

    def select(self, k: int, rng: np.random.Generator) -> list[Candidate]:
        """``k`` parents spread over the islands (round robin from island 0)."""
        counts = [k // len(self.islands) + (i < k % len(self.islands)) for i in range(len(self.islands))]
        out: list[Candidate] = []
        for i, n in enumerate(counts):
            out.extend(self.select_from(i, n, rng))
        return out

    def select_from(self, island: int, k: int, rng: np.random.Generator) -> list[Candidate]:
        # A child generator keeps the result the same whether the island is local or remote.
        sub = np.random.default_rng(int(rng.integers(2**63)))
        return self.islands[island].select(k, sub)

    def best(self) -> Entry | None:
        bests = [b for i in self.islands if (b := i.best()) is not None]
        if not bests:
            return None
        return max(bests, key=lambda e: e[1].rank_key())

    def top(self, k: int) -> list[Entry]:
        pooled: dict[str, Entry] = {}
        for island in self.islands:
            for c, e in island.top(k):
                pooled.setdefault(c.id, (c, e))
        return sorted(pooled.values(), key=lambda e: e[1].rank_key(), reverse=True)[:k]

    def maybe_migrate(self, generation: int) -> int:
        """Ring migration (island i's best -> island i+1) when the interval says so."""
        if len(self.islands) < 2 or self.migration_interval <= 0 or self.migrants <= 0:
            return 0
        if generation == 0 or generation % self.migration_interval:
            return 0
        outgoing = [island.top(self.migrants) for island in self.islands]
        moved = 0
        for i, migrants in enumerate(outgoing):
            target = self.islands[(i + 1) % len(self.islands)]
            moved += sum(target.add(c, e) for c, e in migrants)
        return moved

    def state(self) -> State:
        return {
            "kind": self.kind,
            "migration_interval": self.migration_interval,
            "migrants": self.migrants,
            "home": dict(self._home),
            "next": self._next,
            "islands": [i.state() for i in self.islands],
        }

    @classmethod
    def from_state(cls, state: State, host: Host = in_process) -> Islands:
        islands = [host(_builder(s)) for s in state["islands"]]
        obj = cls(islands, state["migration_interval"], state["migrants"])
        obj._home = dict(state["home"])
        obj._next = state["next"]
        return obj


def _builder(state: State) -> Callable[[], Population]:
    return lambda: population_from_state(state)
