"""search_improvement names each side's median evaluation, and a failure stands for all."""

from __future__ import annotations

from benchmarks.search_improvement import median_evaluation
from tests.test_finalists import verdict


def test_the_median_evaluation_is_the_middle_one() -> None:
    rounds = [verdict("a", 5.0), verdict("a", 9.0), verdict("a", 6.0)]
    assert median_evaluation(rounds).fitness == rounds[2].fitness
    assert median_evaluation(rounds[:2]).fitness == rounds[0].fitness  # even: the lower middle


def test_a_failed_round_stands_for_all() -> None:
    rounds = [verdict("a", 5.0), verdict("a", None), verdict("a", 6.0)]
    assert median_evaluation(rounds).fitness is None
