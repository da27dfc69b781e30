"""The evaluation cascade: build, correctness on fresh inputs, timing, fitness.

``Evaluator`` is the one interface the search engine uses; implementations run
candidates in isolated processes on a GPU or the CPU, or replay recorded results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing

__all__ = ["Evaluation", "Evaluator", "Preparing", "ShapeResult", "Status", "Timing"]


@runtime_checkable
class Evaluator(Protocol):
    """Judges candidates. Never raises for a bad candidate: the status says it."""

    def evaluate(self, candidate: Candidate, shapes: Sequence[str]) -> Evaluation:
        """Evaluate ``candidate`` on the named shapes of its workload."""
        ...

    def close(self) -> None:
        """Release worker processes and devices."""
        ...


@runtime_checkable
class Preparing(Protocol):
    """An evaluator that can start work on candidates before they are evaluated.

    Runtimes call ``prepare`` with a batch before evaluating its members (the
    sandbox compiles CUDA sources ahead); it must return at once and never raise
    for a bad candidate.
    """

    def prepare(self, candidates: Sequence[Candidate]) -> None: ...
