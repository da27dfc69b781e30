"""A plain DEAP individual: no ``creator`` classes, so it pickles across Ray workers."""

from __future__ import annotations

from deap import base

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation


class RankFitness(base.Fitness):  # type: ignore[misc]
    """Lexicographic (cascade stage, fitness), both maximised: ``Evaluation.rank_key()``."""

    weights = (1.0, 1.0)


class Individual:
    """A candidate with its evaluation, shaped the way DEAP's tools expect."""

    __slots__ = ("candidate", "evaluation", "fitness")

    def __init__(self, candidate: Candidate, evaluation: Evaluation) -> None:
        self.candidate = candidate
        self.evaluation = evaluation
        self.fitness = RankFitness(evaluation.rank_key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Individual) and other.candidate.id == self.candidate.id

    def __hash__(self) -> int:
        return hash(self.candidate.id)

    def __deepcopy__(self, memo: dict[int, object]) -> Individual:
        return Individual(self.candidate, self.evaluation)  # frozen payload: share it
