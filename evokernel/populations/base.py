"""The Population protocol and what every implementation shares.

A population decides which evaluated candidates to keep and which to hand out as
parents. Ranking is always ``Evaluation.rank_key()``: a PASSED candidate beats any
failure, then higher fitness wins; SKIPPED and other failures have no fitness.
State is plain JSON (candidates and evaluations as pydantic JSON dumps) so that a
population can be snapshotted atomically and rebuilt in another process.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

import numpy as np

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation

Entry = tuple[Candidate, Evaluation]
State = dict[str, Any]


@runtime_checkable
class Population(Protocol):
    """Holds evaluated candidates; the strategies draw parents from it."""

    def add(self, candidate: Candidate, evaluation: Evaluation) -> bool:
        """Offer a candidate; True if it was kept."""
        ...

    def select(self, k: int, rng: np.random.Generator) -> list[Candidate]:
        """``k`` parents (with repetition), drawn with ``rng`` only."""
        ...

    def best(self) -> Entry | None: ...

    def top(self, k: int) -> list[Entry]:
        """The ``k`` best entries, best first (used for migration and reports)."""
        ...

    def __len__(self) -> int: ...

    def state(self) -> State: ...

    # ``from_state(state) -> Self`` is a classmethod on every implementation.


def dump_entry(candidate: Candidate, evaluation: Evaluation) -> dict[str, Any]:
    return {
        "candidate": candidate.model_dump(mode="json"),
        "evaluation": evaluation.model_dump(mode="json"),
    }


def load_entry(data: dict[str, Any]) -> Entry:
    return (
        Candidate.model_validate(data["candidate"]),
        Evaluation.model_validate(data["evaluation"]),
    )


def better(a: Evaluation, b: Evaluation) -> bool:
    """Strictly better by the one ranking every population uses."""
    return a.rank_key() > b.rank_key()


@contextmanager
def deap_random(rng: np.random.Generator) -> Iterator[None]:
    """Run DEAP tools (which draw from the global ``random``) reproducibly from ``rng``.

    The global state is seeded from ``rng`` and restored afterwards, so DEAP's
    choices depend only on our generator and nothing else in the process changes.
    """
    saved = random.getstate()
    random.seed(int(rng.integers(2**63)))
    try:
        yield
    finally:
        random.setstate(saved)


_REGISTRY: dict[str, Callable[[State], Population]] = {}


def register(kind: str, from_state: Callable[[State], Population]) -> None:
    _REGISTRY[kind] = from_state


def population_from_state(state: State) -> Population:
    """Rebuild any registered population from its ``state()`` (which names its kind)."""
    kind = state.get("kind")
    if kind not in _REGISTRY:
        raise ValueError(f"unknown population kind {kind!r} in snapshot")
    return _REGISTRY[kind](state)
